import Dispatch
import MDNSCore
import Scheduling
import SystemCalls

#if canImport(Glibc)
    import Glibc
#endif

/// A reply from a unicast DNS server.
struct DNSReply: Sendable {
    /// The reply with its TSIG record (if any) split off.
    let signed: SignedDNSMessage
    /// Who answered.
    let server: DNSServerAddress
    /// Whether it came over TCP (after a truncated UDP reply, or a TCP-only exchange).
    let overTCP: Bool

    var message: DNSMessage { signed.message }
    var rcode: UInt16 { signed.message.extendedRcode }
}

/// Why an exchange produced no reply.
struct DNSExchangeError: Error, Sendable, CustomStringConvertible {
    let servers: [DNSServerAddress]
    let reason: String
    var description: String {
        servers.isEmpty
            ? reason : "\(reason) (asked \(servers.map(\.description).joined(separator: ", ")))"
    }
}

/// Sends a DNS message and returns the first reply with its ID: ``DNSClient`` over the network,
/// or a test's DNS server in memory (`FakeDNSServer`: the wide-area machines with the real message
/// building, signing and reply checking, on a fake clock).
protocol DNSExchanging: Sendable {
    func exchange(_ bytes: [UInt8], id: UInt16, servers: [DNSServerAddress], timeout: Duration, tcp: Bool) async
        -> Result<DNSReply, DNSExchangeError>
}

/// Sends DNS messages to unicast DNS servers: UDP first, each attempt on its own connected,
/// nonblocking socket (a fresh source port; the kernel drops datagrams from other addresses), read
/// by a Dispatch source; retransmitted to the next server after a back-off; over TCP when the reply
/// is truncated. Everything runs on one serial queue; `exchange` is the async entry point.
final class DNSClient: DNSExchanging {
    let queue: DispatchQueue
    /// The clock of the retransmissions and the exchanges' deadlines (the wide area's; tests: a
    /// `ManualScheduler`).
    let scheduler: any Scheduler

    init(queue: DispatchQueue = DispatchQueue(label: "discovery.unicast-dns"), scheduler: any Scheduler = DispatchScheduler()) {
        self.queue = queue
        self.scheduler = scheduler
    }

    /// Sends `bytes` (an encoded message with ID `id`) and returns the first reply with that ID.
    /// - Parameters:
    ///   - servers: Asked in turn (a retransmission goes to the next one).
    ///   - timeout: For the whole exchange, TCP included.
    ///   - tcp: Use TCP from the start (zone-sized answers).
    func exchange(
        _ bytes: [UInt8], id: UInt16, servers: [DNSServerAddress], timeout: Duration, tcp: Bool = false
    ) async -> Result<DNSReply, DNSExchangeError> {
        guard !servers.isEmpty else {
            return .failure(DNSExchangeError(servers: [], reason: "no DNS server is configured"))
        }
        let operation = DNSExchangeOperation(
            queue: queue, scheduler: scheduler, request: bytes, id: id, servers: servers, timeout: timeout, tcpOnly: tcp)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                queue.async { operation.start(continuation) }
            }
        } onCancel: {
            queue.async { operation.finish(.failure(DNSExchangeError(servers: servers, reason: "cancelled"))) }
        }
    }

    /// A random message ID (RFC 5452: unpredictable IDs and ports against spoofed answers).
    static func randomID() -> UInt16 { UInt16.random(in: 0...UInt16.max) }
}

/// One exchange; confined to the client's queue.
private final class DNSExchangeOperation: @unchecked Sendable {  // confined to `queue`
    let queue: DispatchQueue
    let scheduler: any Scheduler
    let request: [UInt8]
    let id: UInt16
    let servers: [DNSServerAddress]
    let timeout: Duration
    let tcpOnly: Bool
    private var continuation: CheckedContinuation<Result<DNSReply, DNSExchangeError>, Never>?
    private var finished = false
    private var udpSockets: [(fd: Int32, source: any DispatchSourceRead, server: DNSServerAddress)] = []
    private var tcp: (fd: Int32, read: any DispatchSourceRead, write: any DispatchSourceWrite, server: DNSServerAddress)?
    private var tcpOutput: [UInt8] = []
    private var tcpInput: [UInt8] = []
    private var writeSuspended = true
    private var deadline: ScheduledWork?
    private var retransmit: ScheduledWork?
    private var attempt = 0
    private var failedServers: Set<DNSServerAddress> = []
    private var lastError: String?

    /// Retransmission intervals (RFC 1536 style back-off), bounded by the exchange's timeout.
    static let intervals: [Duration] = [.milliseconds(700), .milliseconds(1400), .milliseconds(2800), .seconds(4)]

    init(
        queue: DispatchQueue, scheduler: any Scheduler, request: [UInt8], id: UInt16, servers: [DNSServerAddress],
        timeout: Duration, tcpOnly: Bool
    ) {
        self.queue = queue
        self.scheduler = scheduler
        self.request = request
        self.id = id
        self.servers = servers
        self.timeout = timeout
        self.tcpOnly = tcpOnly
    }

    func start(_ continuation: CheckedContinuation<Result<DNSReply, DNSExchangeError>, Never>) {
        guard !finished else {
            continuation.resume(returning: .failure(DNSExchangeError(servers: servers, reason: "cancelled")))
            return
        }
        self.continuation = continuation
        deadline = scheduler.schedule(after: timeout, on: queue) { [self] in
            finish(.failure(DNSExchangeError(
                servers: servers, reason: "no answer within \(timeout)\(lastError.map { " (\($0))" } ?? "")")))
        }
        if tcpOnly {
            startTCP(servers[0])
        } else {
            sendNextUDP()
        }
    }

    func finish(_ result: Result<DNSReply, DNSExchangeError>) {
        guard !finished else { return }
        finished = true
        deadline?.cancel()
        retransmit?.cancel()
        for socket in udpSockets { socket.source.cancel() }
        udpSockets.removeAll()
        closeTCP()
        continuation?.resume(returning: result)
        continuation = nil
    }

    // MARK: UDP

    private func sendNextUDP() {
        guard !finished else { return }
        let candidates = servers.filter { !failedServers.contains($0) }
        guard !candidates.isEmpty else {
            finish(.failure(DNSExchangeError(servers: servers, reason: lastError ?? "every server failed")))
            return
        }
        let server = candidates[attempt % candidates.count]
        let interval = Self.intervals[min(attempt, Self.intervals.count - 1)]
        attempt += 1
        do {
            let fd = try openSocket(to: server, type: SOCK_DGRAM)
            let sent = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent < 0 {
                let code = errno
                close(fd)
                serverFailed(server, "sending to \(server): \(String(cString: strerror(code)))")
                return
            }
            let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
            source.setEventHandler { [weak self] in self?.udpReadable(fd: fd, server: server) }
            source.setCancelHandler { close(fd) }
            source.resume()
            udpSockets.append((fd, source, server))
        } catch {
            serverFailed(server, error.reason)
            return
        }
        retransmit?.cancel()
        retransmit = scheduler.schedule(after: interval, on: queue) { [weak self] in self?.sendNextUDP() }
    }

    private func serverFailed(_ server: DNSServerAddress, _ reason: String) {
        lastError = reason
        failedServers.insert(server)
        if let index = udpSockets.firstIndex(where: { $0.server == server }) {
            udpSockets[index].source.cancel()
            udpSockets.remove(at: index)
        }
        if failedServers.count == Set(servers).count {
            finish(.failure(DNSExchangeError(servers: servers, reason: reason)))
        } else if udpSockets.isEmpty {
            sendNextUDP()
        }
    }

    private func udpReadable(fd: Int32, server: DNSServerAddress) {
        guard !finished else { return }
        var buffer = [UInt8](repeating: 0, count: 65536)
        for _ in 0..<16 {
            let count: Int
            switch retryingInterrupts({ buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) } }) {
            case .success(let received): count = received
            case .failure(let error) where error.wouldBlock: return
            case .failure(let error):
                // ECONNREFUSED and friends: an ICMP error for this server.
                serverFailed(server, "\(server): \(error)")
                return
            }
            let bytes = Array(buffer[0..<count])
            guard bytes.count >= 12, UInt16(bytes[0]) << 8 | UInt16(bytes[1]) == id, bytes[2] & 0x80 != 0 else {
                continue  // not the reply to this request: ignore
            }
            if bytes[2] & 0x02 != 0 {  // TC: the whole answer needs TCP
                for socket in udpSockets { socket.source.cancel() }
                udpSockets.removeAll()
                retransmit?.cancel()
                startTCP(server)
                return
            }
            deliver(bytes, from: server, overTCP: false)
            return
        }
    }

    private func deliver(_ bytes: [UInt8], from server: DNSServerAddress, overTCP: Bool) {
        do {
            let signed = try SignedDNSMessage(parsing: bytes)
            finish(.success(DNSReply(signed: signed, server: server, overTCP: overTCP)))
        } catch {
            lastError = "a malformed reply from \(server) (\(error))"
            if overTCP { finish(.failure(DNSExchangeError(servers: servers, reason: lastError!))) }
        }
    }

    // MARK: TCP

    private func startTCP(_ server: DNSServerAddress) {
        do {
            let fd = try openSocket(to: server, type: SOCK_STREAM, connecting: true)
            let read = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
            let write = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: queue)
            tcpOutput = DNSTCPFraming.frame(request)
            read.setEventHandler { [weak self] in self?.tcpReadable() }
            write.setEventHandler { [weak self] in self?.tcpWritable() }
            // The descriptor is closed once both sources are cancelled.
            let closer = DescriptorCloser(fd: fd, sources: 2)
            read.setCancelHandler { closer.release() }
            write.setCancelHandler { closer.release() }
            tcp = (fd, read, write, server)
            read.resume()
            write.resume()
            writeSuspended = false
        } catch {
            finish(.failure(DNSExchangeError(servers: [server], reason: "TCP to \(server): \(error.reason)")))
        }
    }

    private func tcpWritable() {
        guard let tcp, !finished else { return }
        while !tcpOutput.isEmpty {
            let count: Int
            switch retryingInterrupts({ tcpOutput.withUnsafeBytes { send(tcp.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }) {
            case .success(let sent): count = sent
            case .failure(let error) where error.wouldBlock: return
            case .failure(let error):
                finish(.failure(DNSExchangeError(servers: [tcp.server], reason: "TCP to \(tcp.server): \(error)")))
                return
            }
            tcpOutput.removeFirst(count)
        }
        if !writeSuspended {
            tcp.write.suspend()
            writeSuspended = true
        }
    }

    private func tcpReadable() {
        guard let tcp, !finished else { return }
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count: Int
            switch retryingInterrupts({ buffer.withUnsafeMutableBytes { recv(tcp.fd, $0.baseAddress, $0.count, 0) } }) {
            case .success(let received): count = received
            case .failure(let error) where error.wouldBlock: return
            case .failure(let error):
                finish(.failure(DNSExchangeError(servers: [tcp.server], reason: "TCP from \(tcp.server): \(error)")))
                return
            }
            if count == 0 {
                finish(.failure(DNSExchangeError(servers: [tcp.server], reason: "\(tcp.server) closed the TCP connection without a reply")))
                return
            }
            tcpInput += buffer[0..<count]
            while let (message, consumed) = DNSTCPFraming.nextMessage(in: tcpInput) {
                tcpInput.removeFirst(consumed)
                if message.count >= 12, UInt16(message[0]) << 8 | UInt16(message[1]) == id {
                    deliver(message, from: tcp.server, overTCP: true)
                    return
                }
            }
        }
    }

    private func closeTCP() {
        guard let tcp else { return }
        if writeSuspended { tcp.write.resume() }  // a suspended source must be resumed to be cancelled
        writeSuspended = false
        tcp.write.cancel()
        tcp.read.cancel()
        self.tcp = nil
    }

    // MARK: Sockets

    private struct SocketFailure: Error { let reason: String }

    /// A nonblocking socket connected (or connecting, for TCP) to `server`.
    private func openSocket(to server: DNSServerAddress, type: __socket_type, connecting: Bool = false) throws(SocketFailure) -> Int32 {
        let family = server.address.version == .ipv4 ? AF_INET : AF_INET6
        let fd = socket(family, Int32(type.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SocketFailure(reason: "socket(): \(String(cString: strerror(errno)))") }
        var storage = sockaddr_storage()
        let length = server.fill(&storage)
        let result = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, length) }
        }
        if result != 0 && !(connecting && errno == EINPROGRESS) {
            let code = errno
            close(fd)
            throw SocketFailure(reason: "connect to \(server): \(String(cString: strerror(code)))")
        }
        return fd
    }
}

/// Closes a descriptor once every Dispatch source on it was cancelled.
private final class DescriptorCloser: @unchecked Sendable {  // used on one serial queue
    let fd: Int32
    var remaining: Int
    init(fd: Int32, sources: Int) {
        self.fd = fd
        self.remaining = sources
    }
    func release() {
        remaining -= 1
        if remaining == 0 { close(fd) }
    }
}

extension DNSServerAddress {
    /// Writes the socket address; returns its length.
    func fill(_ storage: inout sockaddr_storage) -> socklen_t {
        let bytes = address.bytes
        if bytes.count == 4 {
            withUnsafeMutableBytes(of: &storage) { raw in
                let pointer = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in.self)
                pointer.pointee.sin_family = sa_family_t(AF_INET)
                pointer.pointee.sin_port = port.bigEndian
                withUnsafeMutableBytes(of: &pointer.pointee.sin_addr) { $0.copyBytes(from: bytes) }
            }
            return socklen_t(MemoryLayout<sockaddr_in>.size)
        }
        withUnsafeMutableBytes(of: &storage) { raw in
            let pointer = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in6.self)
            pointer.pointee.sin6_family = sa_family_t(AF_INET6)
            pointer.pointee.sin6_port = port.bigEndian
            withUnsafeMutableBytes(of: &pointer.pointee.sin6_addr) { $0.copyBytes(from: bytes) }
        }
        return socklen_t(MemoryLayout<sockaddr_in6>.size)
    }
}
