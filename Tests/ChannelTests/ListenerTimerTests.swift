import Foundation
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
        let connecting = Task { try await MessageChannel.connect(to: [port], configuration: config("client"), logger: testLogger()) }
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
        let client = try await connecting.value
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
