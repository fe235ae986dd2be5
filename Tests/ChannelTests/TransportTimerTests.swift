import Foundation
import TestWaits
import Testing

@testable import Messaging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Scheduling
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// The listener's two timers on a manual clock (issue 54, 1): the accept back-off after EMFILE —
/// 10 ms, doubling — and the expiry of a blocked source.
/// Real sockets on loopback; only the clock is virtual.
@Suite struct ListenerTimerTests {
    @Test func theAcceptBackOffDoublesOnTheListenersClockAndAnAcceptEndsIt() async throws {
        let clock = ManualScheduler()
        let failures = Counter()
        let server = try TestServer(
            acceptCall: { fd, address, length in
                if failures.value < 3 {
                    failures.increment()
                    errno = EMFILE
                    return -1
                }
                return Listener.systemAccept(fd, address, length)
            }, scheduler: clock)
        defer { server.listener.stop() }
        let port = server.v4
        let connecting = Task { () -> Result<MessageChannel, any Error> in
            do { return .success(try await MessageChannel.connect(to: [port], configuration: config("client"), logger: testLogger())) } catch { return .failure(error) }
        }
        // Each failed accept pauses accepting until a timer of the listener's clock: 10, 20, 40 ms.
        for (index, pause) in [10, 20, 40].enumerated() {
            let due = clock.now + UInt64(pause) * 1_000_000
            let armed = await clock.waitForPending { $0 == [due] }
            try #require(armed, "pause \(index + 1): no timer due in \(pause) ms: \(clock.pendingDeadlines) (now \(clock.now))")
            #expect(server.listener.acceptPauseCount == index + 1)
            clock.advance(by: .milliseconds(pause - 1))
            #expect(server.listener.acceptPauseCount == index + 1, "accepting resumed before its pause ended")
            clock.advance(by: .milliseconds(1))
        }
        let client = try await value(of: connecting, "the connect").get()
        #expect(try await server.nextChannel().peer.name == "client")
        #expect(server.listener.acceptPauseCount == 3)
        #expect(clock.pendingCount == 0, "a back-off timer was left: \(clock.pendingDeadlines)")
        client.abort()
    }

    @Test func aBlockedSourceIsLetGoWhenItsTimeOnTheListenersClockHasCome() async throws {
        let clock = ManualScheduler()
        let server = try TestServer(scheduler: clock)
        defer { server.listener.stop() }
        let a = HandshakeAdmission.Source.ipv4(UInt32(0x7F00_0002).bigEndian)
        let b = HandshakeAdmission.Source.ipv4(UInt32(0x7F00_0003).bigEndian)
        let start = clock.now
        server.listener.block(a, for: .seconds(30))
        server.listener.block(b, for: .seconds(60))
        #expect(Set(server.listener.blockedSources) == [a, b])
        // One timer, for the first expiry.
        #expect(clock.pendingDeadlines == [start + 30_000_000_000])
        clock.advance(by: .seconds(30) - .milliseconds(1))
        #expect(Set(server.listener.blockedSources) == [a, b], "a was let go early")
        clock.advance(by: .milliseconds(1))
        #expect(server.listener.blockedSources == [b])
        #expect(clock.pendingDeadlines == [start + 60_000_000_000], "the next expiry's timer")
        clock.advance(by: .seconds(30))
        #expect(server.listener.blockedSources.isEmpty)
        #expect(clock.pendingCount == 0)
    }
}

/// Happy Eyeballs on a manual clock (issue 54, 1): the next address is tried at the attempt delay,
/// the race ends at its timeout, and a cancelled race leaves no timer. Real loopback sockets; the
/// address that never answers is a listener whose backlog is full (its connects stay in SYN_SENT).
@Suite struct ConnectTimerTests {
    /// A loopback port whose connects never complete.
    final class BlackHole {
        let fd: Int32
        let port: UInt16
        private var fillers: [Int32] = []

        init() throws {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            _ = try SocketAddress.ipv4Loopback(port: 0).withSockAddr { (sa, len) throws(TransportError) in
                try syscallValue("bind") { bind(fd, sa, len) }
            }
            listen(fd, 0)  // never accepts: once the backlog is full, connects hang
            let port = SocketOps.localAddress(FileDescriptor(fd))!.port
            (self.fd, self.port) = (fd, port)
            for _ in 0..<8 {
                let filler = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
                _ = try? SocketAddress.ipv4Loopback(port: port).withSockAddr { (sa, len) throws(TransportError) in
                    Glibc.connect(filler, sa, len)
                }
                fillers.append(filler)
            }
        }

        deinit {
            for filler in fillers { close(filler) }
            close(fd)
        }
    }

    typealias Connected = Result<(fd: FileDescriptor, address: SocketAddress), any Error>

    static func connecting(_ addresses: [SocketAddress], clock: ManualScheduler, timeout: Duration = .seconds(10)) -> Task<Connected, Never> {
        Task {
            do {
                return .success(
                    try await TCPConnector.connect(
                        to: addresses, attemptDelay: .milliseconds(250), timeout: timeout, scheduler: clock, logger: testLogger()))
            } catch {
                return .failure(error)
            }
        }
    }

    @Test func theNextAddressIsTriedAtTheAttemptDelayOfTheClock() async throws {
        let clock = ManualScheduler()
        let hole = try BlackHole()
        let server = try TestServer(families: [.ipv4])
        defer { server.listener.stop() }
        let start = clock.now
        let race = Self.connecting([.ipv4Loopback(port: hole.port), server.v4], clock: clock)
        // The timeout and the next attempt's timer; the first attempt hangs meanwhile.
        try #require(await clock.waitForPending(2), "\(clock.pendingDeadlines)")
        #expect(clock.pendingDeadlines == [start + 250_000_000, start + 10_000_000_000])
        clock.advance(by: .milliseconds(249))
        #expect(clock.pendingDeadlines.first == start + 250_000_000, "the second address was tried before the attempt delay")
        clock.advance(by: .milliseconds(1))
        let (fd, address) = try await value(of: race, "the race").get()
        fd.close()
        #expect(address == server.v4, "the second address won")
        #expect(clock.pendingCount == 0, "a timer of the race was left: \(clock.pendingDeadlines)")
    }

    @Test func aRaceNobodyAnswersEndsAtItsTimeoutOnTheClock() async throws {
        let clock = ManualScheduler()
        let hole = try BlackHole()
        let race = Self.connecting([.ipv4Loopback(port: hole.port)], clock: clock, timeout: .seconds(10))
        try #require(await clock.waitForPending(2))
        clock.advance(by: .seconds(10) - .milliseconds(1))
        clock.advance(by: .milliseconds(1))
        guard case .failure(let failure) = try await value(of: race, "the race") else { Issue.record("connected to a black hole"); return }
        guard let error = failure as? TransportError else { Issue.record("not a TransportError: \(failure)"); return }
        #expect(error.code == .connectTimedOut, "\(error)")
        #expect(error.connectFailures.map(\.reason) == ["timed out"])
        #expect(clock.pendingCount == 0)
    }

    @Test func aCancelledRaceLeavesNoTimer() async throws {
        let clock = ManualScheduler()
        let hole = try BlackHole()
        let race = Self.connecting([.ipv4Loopback(port: hole.port)], clock: clock)
        try #require(await clock.waitForPending(2))
        race.cancel()
        guard case .failure(let failure) = try await value(of: race, "the race") else { Issue.record("connected to a black hole"); return }
        #expect(failure is CancellationError, "\(failure)")
        #expect(clock.pendingCount == 0, "the timeout's timer was left: \(clock.pendingDeadlines)")
    }
}
