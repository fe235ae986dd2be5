import Dispatch
import Glibc
import Logging
import Prometheus
import ServiceLifecycle

/// `--metrics-port`: the swift-metrics figures (the library's and the daemon's) in Prometheus' text
/// format at `GET /metrics`, on a local address only (127.0.0.1 by default): a scrape endpoint,
/// not a web server. Dispatch sources on nonblocking sockets; a client gets 5 seconds and 8 KiB
/// for its request, then the answer, then the connection is closed.
final class MetricsEndpoint: Service, @unchecked Sendable {
    private let registry: PrometheusCollectorRegistry
    private let logger: Logger
    private let queue = DispatchQueue(label: "preview-server.metrics")
    private let listenFD: Int32
    private var acceptSource: (any DispatchSourceRead)?
    /// The bound port (the one asked for, or the kernel's choice for 0).
    let port: UInt16

    init(registry: PrometheusCollectorRegistry, address: String, port: UInt16, logger: Logger) throws {
        self.registry = registry
        self.logger = logger
        var socketAddress = sockaddr_in()
        socketAddress.sin_family = sa_family_t(AF_INET)
        socketAddress.sin_port = port.bigEndian
        guard inet_pton(AF_INET, address, &socketAddress.sin_addr) == 1 else {
            throw EndpointError("--metrics-address must be an IPv4 address, e.g. 127.0.0.1 (got '\(address)')")
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw EndpointError("metrics endpoint: socket failed: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &socketAddress) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard bound else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw EndpointError("metrics endpoint: cannot listen on \(address):\(port): \(reason); choose another --metrics-port")
        }
        listenFD = fd
        self.port = UInt16(bigEndian: socketAddress.sin_port)
    }

    func run() async throws {
        queue.sync {
            let source = DispatchSource.makeReadSource(fileDescriptor: listenFD, queue: queue)
            source.setEventHandler { [weak self] in self?.acceptAll() }
            source.setCancelHandler { [listenFD] in close(listenFD) }
            acceptSource = source
            source.resume()
        }
        // Until shutdown (SIGTERM/SIGINT through the service group), then stop listening.
        try? await gracefulShutdown()
        queue.sync {
            acceptSource?.cancel()
            acceptSource = nil
        }
    }

    private func acceptAll() {
        for _ in 0..<64 {
            let fd = accept(listenFD, nil, nil)
            guard fd >= 0 else { return }
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            serve(fd)
        }
    }

    /// Reads the request head, answers it, closes.
    private func serve(_ fd: Int32) {
        var request: [UInt8] = []
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        let timer = DispatchSource.makeTimerSource(queue: queue)
        var finished = false
        // Cancelling both releases their handlers, and with them this closure's hold on them.
        let finish = {
            guard !finished else { return }
            finished = true
            timer.cancel()
            source.cancel()
        }
        source.setCancelHandler { close(fd) }
        timer.schedule(deadline: .now() + 5)
        timer.setEventHandler { finish() }
        source.setEventHandler { [weak self] in
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = read(fd, &buffer, buffer.count)
            if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
            guard count > 0 else { return finish() }
            request += buffer[0..<count]
            guard let self, let head = Self.head(of: request) else {
                if request.count > 8192 { finish() }
                return
            }
            self.respond(to: head, on: fd)
            finish()
        }
        timer.resume()
        source.resume()
    }

    /// The request line once the head is complete (ends with an empty line).
    static func head(of bytes: [UInt8]) -> String? {
        let text = String(decoding: bytes, as: UTF8.self)
        guard text.contains("\r\n\r\n") || text.contains("\n\n") else { return nil }
        return String(text.split(separator: "\n", maxSplits: 1).first ?? "").trimmingCharacters(in: "\r")
    }

    private func respond(to requestLine: String, on fd: Int32) {
        let parts = requestLine.split(separator: " ")
        let status: String
        var body: [UInt8]
        var type = "text/plain; charset=utf-8"
        if parts.count >= 2, parts[0] == "GET", parts[1] == "/metrics" || parts[1].hasPrefix("/metrics?") {
            status = "200 OK"
            body = registry.emitToBuffer()
            type = "text/plain; version=0.0.4; charset=utf-8"
        } else if parts.count >= 2, parts[0] == "GET" {
            status = "404 Not Found"
            body = Array("preview-server serves its metrics at /metrics only\n".utf8)
        } else {
            status = "405 Method Not Allowed"
            body = Array("only GET /metrics\n".utf8)
        }
        let head = "HTTP/1.1 \(status)\r\nContent-Type: \(type)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n"
        body = Array(head.utf8) + body
        // A scrape is small (a few KiB): written here, waiting for room at most 5 s in all.
        var offset = 0
        let deadline = DispatchTime.now() + 5
        while offset < body.count && DispatchTime.now() < deadline {
            let written = body.withUnsafeBytes { send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if written > 0 {
                offset += written
            } else if written < 0 && (errno == EAGAIN || errno == EINTR) {
                var poller = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                _ = poll(&poller, 1, 100)
            } else {
                logger.debug("metrics client went away: \(String(cString: strerror(errno)))")
                return
            }
        }
    }
}

struct EndpointError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension String {
    fileprivate func trimmingCharacters(in character: Character) -> String {
        var text = Substring(self)
        while text.last == character { text = text.dropLast() }
        return String(text)
    }
}
