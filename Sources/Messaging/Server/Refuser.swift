import Locks
import Logging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// Refuses accepted connections before any handshake work (docs/PROTOCOL.md, "Busy"): a version-1
/// REFUSE frame in the clear, then a close. A version-1 client reads it as the answer to its hello;
/// a version-2 client reads its first two bytes, zero, as the length of message 2, which is never
/// empty, and then the frame.
///
/// A refusal normally lingers: what the client sends is read and dropped, and the connection is
/// closed when the client closes or after `linger` — closing with unread input resets the
/// connection, and a REFUSE still in flight (a lost segment to resend) would be lost with it. A
/// lingering refusal costs a connection driver on a loop, though, and under a flood thousands a
/// second took more than a core (measured: 143 % at 5,000 attempts a second). So at most
/// ``lingeringPerSecond`` refusals a second linger, and at most ``maxLingering`` at once; the rest
/// are written and closed at once on the accepting thread (what the client already sent is read
/// first, so the close is a normal end of file unless it sends more afterwards; on a LAN the
/// REFUSE arrives before any reset).
final class Refuser: Sendable {
    /// Refusals lingering at once, and started per second; more are closed at once.
    static let maxLingering = 256
    static let lingeringPerSecond = 64

    private let configuration: ChannelConfiguration
    private let logger: Logger
    private let linger: Duration
    private struct Lingering {
        var count = 0
        /// Lingering refusals started this second.
        var started = PerSecondCount()
    }
    private let lingering = Locked(Lingering())

    init(configuration: ChannelConfiguration, logger: Logger, linger: Duration = .seconds(2)) {
        self.configuration = configuration
        self.logger = logger
        self.linger = linger
    }

    /// Refusals lingering now (tests).
    var lingeringCount: Int { lingering.withLock { $0.count } }

    func refuse(_ socket: AcceptedSocket, with refusal: Refusal) {
        guard let fd = socket.take(), let bytes = try? refusal.frameBeforeHandshake.encoded() else {
            socket.close()
            return
        }
        let now = configuration.scheduler.now  // the server's clock
        let lingers = lingering.withLock { state -> Bool in
            guard state.count < Self.maxLingering, state.started.current(now: now) < Self.lingeringPerSecond else {
                return false
            }
            state.count += 1
            state.started.add(now: now)
            return true
        }
        guard lingers else {
            Self.refuseAtOnce(fd, bytes)
            return
        }
        let driver = ConnectionDriver(
            fd: fd, loop: configuration.loopGroup.next(), configuration: configuration.connection, logger: logger)
        let handler = RefusingHandler(driver) { [lingering] in lingering.withLock { $0.count -= 1 } }
        let deadline = linger.nanoseconds
        driver.queue.async {
            driver.startRaw(handler: handler)
            driver.setDeadline(.handshake, at: driver.now &+ deadline)
            driver.sendRaw(bytes)
            driver.closeGracefully(reason: .helloFailed(refusal.message))
        }
    }

    /// Reads what the client already sent, writes the frame (a REFUSE is far smaller than a fresh
    /// socket's send buffer), closes.
    private static func refuseAtOnce(_ fd: FileDescriptor, _ bytes: [UInt8]) {
        defer { fd.close() }
        // What the client sent is read (a few reads, never waiting) so that the close sends FIN
        // rather than RST; a failure anywhere just ends the refusal early: the socket closes anyway.
        do {
            try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 512) { buffer in
                for _ in 0..<4 {
                    let read = try syscall("recv", nonblocking: true) {
                        recv(fd.rawValue, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT))
                    }
                    guard case .processed(let count) = read, count > 0 else { break }
                }
            }
            _ = try bytes.withUnsafeBytes { raw in
                try syscall("send", nonblocking: true) {
                    send(fd.rawValue, raw.baseAddress, raw.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                }
            }
        } catch {}
    }
}

/// A connection refused before its handshake: drops what the client sends, ends it at the deadline.
/// It keeps its connection alive until the connection closes (nothing else holds a refused one).
/// `@unchecked Sendable`: `driver` and `closed` are confined to the connection's loop.
private final class RefusingHandler: ConnectionHandler, @unchecked Sendable {
    private var driver: ConnectionDriver?
    private var closed: (@Sendable () -> Void)?
    init(_ driver: ConnectionDriver, closed: @escaping @Sendable () -> Void) {
        self.driver = driver
        self.closed = closed
    }
    func connection(_ connection: ConnectionDriver, received frame: Frame) {}
    func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) {
        connection.tearDown(.helloFailed("refused before the handshake"))
    }
    func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
        driver = nil
        closed?()
        closed = nil
    }
}
