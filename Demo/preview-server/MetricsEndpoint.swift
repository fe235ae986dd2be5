import Dispatch
import Glibc
import Logging
import Prometheus
import ProtocolCore
import ServiceLifecycle
import SystemCalls

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
        guard fd >= 0 else { throw EndpointError("metrics endpoint: socket failed: \(errnoString(errno))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &socketAddress) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard bound else {
            let reason = errnoString(errno)
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

    /// Reads the request head, writes the answer (a write source waits for room when the socket
    /// is full: nothing here blocks the queue), closes. 5 seconds for all of it.
    private func serve(_ fd: Int32) {
        var request: [UInt8] = []
        var response: [UInt8] = []
        var offset = 0
        let reader = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        var writer: (any DispatchSourceWrite)?
        let timer = DispatchSource.makeTimerSource(queue: queue)
        var finished = false
        // The descriptor is closed once every source on it is cancelled (cancel handlers run on
        // this serial queue). Cancelling also releases the handlers, and their hold on the sources.
        var open = 1
        let closeWhenLast = {
            open -= 1
            if open == 0 { close(fd) }
        }
        let finish = {
            guard !finished else { return }
            finished = true
            timer.cancel()
            reader.cancel()
            writer?.cancel()
        }
        // Writes what the socket takes; true when all of the response is out (or the peer is gone).
        let writeSome = { [logger] () -> Bool in
            while offset < response.count {
                switch retryingInterrupts({ response.withUnsafeBytes { send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) } }) {
                case .success(let written) where written > 0: offset += written
                case .failure(let error) where error.wouldBlock: return false
                case .success: return true  // nothing taken: the peer is gone
                case .failure(let error):
                    logger.debug("metrics client went away: \(error)")
                    return true
                }
            }
            return true
        }
        reader.setCancelHandler { closeWhenLast() }
        timer.schedule(deadline: .now() + 5)
        timer.setEventHandler { finish() }
        reader.setEventHandler { [weak self] in
            guard response.isEmpty else { return }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count: Int
            switch retryingInterrupts({ read(fd, &buffer, buffer.count) }) {
            case .success(let read): count = read
            case .failure(let error) where error.wouldBlock: return
            case .failure: count = 0
            }
            guard count > 0 else { return finish() }
            request += buffer[0..<count]
            guard let self, let head = Self.head(of: request) else {
                if request.count > 8192 { finish() }
                return
            }
            response = self.response(to: head)
            if writeSome() { return finish() }
            let source = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: self.queue)
            open += 1
            source.setCancelHandler { closeWhenLast() }
            source.setEventHandler { if writeSome() { finish() } }
            writer = source
            source.resume()
        }
        timer.resume()
        reader.resume()
    }

    /// The request line once the head is complete (ends with an empty line).
    static func head(of bytes: [UInt8]) -> String? {
        let text = String(decoding: bytes, as: UTF8.self)
        guard text.contains("\r\n\r\n") || text.contains("\n\n") else { return nil }
        return String(text.split(separator: "\n", maxSplits: 1).first ?? "").trimmingCharacters(in: "\r")
    }

    /// The whole HTTP response to `requestLine`.
    private func response(to requestLine: String) -> [UInt8] {
        let parts = requestLine.split(separator: " ")
        let status: String
        let body: [UInt8]
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
        return Array(head.utf8) + body
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
