import Foundation
import Logging
import Testing

@testable import Messaging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Scheduling
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// A logger for tests: silent unless TRANSPORT_TEST_LOG is set (to a level name, e.g. "debug").
func testLogger(_ label: String = "test") -> Logger {
    var logger = Logger(label: label, factory: { StreamLogHandler.standardError(label: $0) })
    if let level = ProcessInfo.processInfo.environment["TRANSPORT_TEST_LOG"], let parsed = Logger.Level(rawValue: level)
    {
        logger.logLevel = parsed
    } else {
        logger.logLevel = .critical
    }
    return logger
}

struct TestTimeout: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out waiting for \(what)" }
}

/// Resumes a continuation once; the first result wins.
final class Once<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var continuation: CheckedContinuation<T, any Error>?  // guarded by lock
    init(_ continuation: CheckedContinuation<T, any Error>) { self.continuation = continuation }
    func resume(_ result: Result<T, any Error>) {
        let c: CheckedContinuation<T, any Error>? = lock.withLock {
            defer { continuation = nil }
            return continuation
        }
        c?.resume(with: result)
    }
}

/// Runs `body`, failing with TestTimeout after `seconds` (a deadline, not a condition).
func withDeadline<T: Sendable>(
    _ seconds: Double = 20, _ what: String = "operation", _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let once = Once(continuation)
        let work = Task {
            do { once.resume(.success(try await body())) } catch { once.resume(.failure(error)) }
        }
        // The deadline is a Dispatch timer (no task sleeping beside every test), cancelled when
        // the body ends.
        let deadline = DispatchWorkItem {
            work.cancel()
            once.resume(.failure(TestTimeout(what: what)))
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + seconds, execute: deadline)
        Task {
            _ = await work.result
            deadline.cancel()
        }
    }
}


/// A version-1 (plaintext) configuration: most channel tests check the frame layer with raw
/// clients writing plaintext frames; the encrypted channel has its own suite (SecureChannelTests).
func config(_ name: String) -> ChannelConfiguration {
    var configuration = ChannelConfiguration(name: name)
    configuration.security = .plaintext
    configuration.helloTimeout = .seconds(10)
    return configuration
}

/// A loopback listener whose accepted sockets become channels (or errors) on `channels`.
final class TestServer: Sendable {
    let listener: Listener
    let channels: AsyncStream<Result<MessageChannel, TransportError>>

    init(
        _ configuration: ChannelConfiguration = config("server"), families: Set<SocketAddress.Family> = [.ipv4, .ipv6],
        acceptCall: @escaping Listener.AcceptCall = Listener.systemAccept, scheduler: any Scheduler = DispatchScheduler()
    ) throws {
        var listenerConfiguration = Listener.Configuration()
        listenerConfiguration.loopbackOnly = true
        listenerConfiguration.families = families
        let (stream, continuation) = AsyncStream.makeStream(of: Result<MessageChannel, TransportError>.self)
        channels = stream
        let logger = testLogger("server")
        listener = try Listener(configuration: listenerConfiguration, logger: logger, acceptCall: acceptCall, scheduler: scheduler) { socket in
            Task {
                do {
                    continuation.yield(
                        .success(try await MessageChannel.accept(socket, configuration: configuration, logger: logger)))
                } catch let error as TransportError {
                    continuation.yield(.failure(error))
                } catch {
                    continuation.yield(.failure(TransportError(.helloFailed, "\(error)")))
                }
            }
        }
    }

    var port: UInt16 { listener.port }
    var v4: SocketAddress { .ipv4Loopback(port: port) }

    func next() async throws -> Result<MessageChannel, TransportError> {
        var iterator = channels.makeAsyncIterator()
        guard let result = await iterator.next() else { throw TestTimeout(what: "server channel") }
        return result
    }

    func nextChannel() async throws -> MessageChannel { try await next().get() }

    /// Connects a client channel over IPv4 and returns it with the server's side of it.
    func connectedPair(
        _ clientConfiguration: ChannelConfiguration = config("client")
    ) async throws -> (client: MessageChannel, accepted: MessageChannel) {
        let client = try await MessageChannel.connect(
            to: [v4], configuration: clientConfiguration, logger: testLogger())
        return (client, try await nextChannel())
    }

    deinit { listener.stop() }
}

/// A blocking raw TCP client for feeding hand-made bytes to a server.
final class RawClient: @unchecked Sendable {
    let fd: Int32

    init(port: UInt16, receiveBuffer: Int32? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        if var size = receiveBuffer {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        let address = SocketAddress.ipv4Loopback(port: port)
        _ = try address.withSockAddr { (sa, len) throws(TransportError) in
            try syscallValue("connect") { Glibc.connect(fd, sa, len) }
        }
    }

    func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = try bytes.withUnsafeBytes { (raw) throws(TransportError) -> Int in
                try syscallValue("send") {
                    send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                }
            }
            offset += n
        }
    }

    func write(_ frame: Frame) throws { try write(try frame.encoded()) }

    func hello(name: String = "raw", version: Int = WireProtocol.version) throws {
        let payload = try FoundationJSONCodec().encode(PeerInfo(version: version, name: name))
        try write(Frame(kind: .hello, codecID: 1, sequence: 1, payload: payload))
    }

    /// Blocks until one complete frame arrived (sequence numbers are not checked).
    func readFrame() throws -> Frame {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            if let frame = try decoder.next() { return frame }
            let n = recv(fd, &buffer, buffer.count, 0)
            guard n > 0 else { throw TransportError(.connectionClosed, "raw client: connection closed (\(n))") }
            decoder.append(contentsOf: buffer[0..<n])
        }
    }

    private var decoder = FrameDecoder(checkSequence: false)

    func close() { Glibc.close(fd) }
}

/// A port on 127.0.0.1 with nothing listening (bound once, then closed).
func deadPort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    let address = SocketAddress.ipv4Loopback(port: 0)
    _ = try address.withSockAddr { (sa, len) throws(TransportError) in try syscallValue("bind") { bind(fd, sa, len) } }
    return SocketOps.localAddress(FileDescriptor(fd))!.port
}

/// Runs a blocking call (raw socket reads) on a Dispatch thread, off Swift's cooperative pool, so a
/// blocked test cannot starve the server it is talking to (2 cores: the pool has 2 threads).
func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(with: Result { try body() }) }
    }
}
