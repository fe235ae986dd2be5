import Dispatch
import Glibc
import Logging
import Prometheus
import ProtocolCore
import ServiceLifecycle
import SystemCalls
import Transport

/// `--metrics-port`: the swift-metrics figures (the library's and the daemon's) in Prometheus' text
/// format at `GET /metrics`, on a local address only (127.0.0.1 by default): a scrape endpoint,
/// not a web server. Transport's ``Listener`` accepts (one address, nonblocking sockets, the
/// back-off on EMFILE); Dispatch sources serve each connection: a client gets 5 seconds and 8 KiB
/// for its request, then the answer, then the connection is closed.
final class MetricsEndpoint: Service, Sendable {
    private let listener: Listener
    /// The bound address and port (the port asked for, or the kernel's choice for 0).
    let address: SocketAddress

    init(registry: PrometheusCollectorRegistry, address: String, port: UInt16, logger: Logger) throws {
        let socketAddress: SocketAddress
        do {
            socketAddress = try SocketAddress(ipAddress: address, port: port)
        } catch {
            throw EndpointError("--metrics-address must be an IP address, e.g. 127.0.0.1 or ::1 (got '\(address)')")
        }
        var configuration = Listener.Configuration()
        configuration.address = socketAddress
        configuration.backlog = 16
        let responder = MetricsResponder(registry: registry, logger: logger)
        do {
            listener = try Listener(configuration: configuration, logger: logger) { socket in
                guard let fd = socket.take() else { return }
                responder.serve(fd.rawValue)
            }
        } catch {
            throw EndpointError("metrics endpoint: cannot listen on \(socketAddress): \(error.message); choose another --metrics-port")
        }
        self.address = listener.boundAddresses.first ?? socketAddress
    }

    func run() async throws {
        // Until shutdown (SIGTERM/SIGINT through the service group), then stop listening.
        try? await gracefulShutdown()
        listener.stop()
    }
}

/// Answers scrapes, one connection at a time per call, on its own queue.
/// Sendable: only constants; each connection's state lives in the handlers of its sources on `queue`.
private final class MetricsResponder: Sendable {
    private let registry: PrometheusCollectorRegistry
    private let logger: Logger
    private let queue = DispatchQueue(label: "preview-server.metrics")

    init(registry: PrometheusCollectorRegistry, logger: Logger) {
        self.registry = registry
        self.logger = logger
    }

    /// Serves one accepted connection (its descriptor is this responder's from now on).
    func serve(_ fd: Int32) { queue.async { self.start(fd) } }

    /// Reads the request head, writes the answer (a write source waits for room when the socket
    /// is full: nothing here blocks the queue), closes. 5 seconds for all of it.
    private func start(_ fd: Int32) {
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
