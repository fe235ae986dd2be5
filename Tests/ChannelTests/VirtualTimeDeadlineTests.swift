import Foundation
import Scheduling
import TestWaits
import Testing

@testable import Messaging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// A connection's deadlines on a clock the test turns (issue 54, 2): the heartbeat, the idle check
/// and the linger (its loop's sweep), the hello and request deadlines (its own timer) — at the
/// library's real defaults, to the millisecond, in milliseconds of real time. The sockets are real
/// (loopback); only the time is virtual. Real-time versions with short timeouts stay in
/// ChannelBehaviorTests: they run Dispatch's timer sources, these the scheduler's.
@Suite(.serialized) struct VirtualTimeDeadlineTests {
    private static let millisecond = Duration.milliseconds(1)

    /// A configuration on `clock`, with the library's defaults otherwise (plaintext, as
    /// `config(_:)`: the raw clients speak version 1).
    private func config(_ name: String, _ clock: ManualScheduler) -> ChannelConfiguration {
        var configuration = ChannelConfiguration(name: name)
        configuration.security = .plaintext
        configuration.scheduler = clock
        return configuration
    }

    private func isClosed(_ channel: MessageChannel) -> Bool { channel.driver.queue.sync { channel.driver.isClosed } }

    /// Whether the raw client's socket saw the server's end of file (or a reset) after whatever
    /// bytes are waiting (read and dropped): asked without blocking — loopback delivers a close
    /// before the closing call returns.
    private func sawEndOfFile(_ raw: RawClient) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = recv(raw.fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if n > 0 { continue }
            return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)
        }
    }

    /// A peer that says hello and then nothing: pinged every 5 s, closed at the first heartbeat
    /// more than 15 s after it was last heard — 20 s — and not a millisecond before.
    @Test func aSilentPeerIsPingedEveryIntervalAndClosedAtTheFirstBeatPastTheTimeout() async throws {
        try await withDeadline(30) {
            let clock = ManualScheduler()
            let server = try TestServer(config("server", clock))
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            #expect(try await blocking { try raw.readFrame() }.kind == .helloAck)
            #expect(channel.configuration.pingInterval == .seconds(5) && channel.configuration.heartbeatTimeout == .seconds(15))
            let sent = channel.driver.queue.sync { channel.driver.nextSequence }
            for beat in 1...3 {
                clock.advance(by: .seconds(5) - (beat == 1 ? Self.millisecond : .zero))
                if beat == 1 {
                    // 4.999 s: nothing sent yet (the PING is queued by the timer's own work).
                    #expect(channel.driver.queue.sync { channel.driver.nextSequence } == sent)
                    clock.advance(by: Self.millisecond)
                }
                let ping = try await blocking { try raw.readFrame() }
                #expect(ping.kind == .ping, "beat \(beat) at \(beat * 5) s")
            }
            clock.advance(by: .seconds(5) - Self.millisecond)  // 19.999 s
            #expect(!isClosed(channel), "closed before the fourth beat")
            clock.advance(by: Self.millisecond)  // 20 s: silent for more than 15 s
            #expect(isClosed(channel))
            #expect(await channel.closed() == .heartbeatTimeout)
            #expect(sawEndOfFile(raw))
        }
    }

    /// A peer stuck in the middle of a frame (a slowloris) is closed when the idle timeout passes
    /// (the server's default, 30 s), to the millisecond.
    @Test func aPeerStuckInAFrameIsClosedWhenTheIdleTimeoutPasses() async throws {
        try await withDeadline(30) {
            let clock = ManualScheduler()
            var configuration = config("server", clock)
            configuration.pingInterval = nil
            configuration.connection.idleTimeout = .seconds(30)
            let server = try TestServer(configuration)
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            #expect(try await blocking { try raw.readFrame() }.kind == .helloAck)
            try raw.write([0, 0, 0, 100, 0x10])  // half a frame, then silence
            clock.advance(by: .seconds(30) - Self.millisecond)
            #expect(!isClosed(channel) && !sawEndOfFile(raw))
            clock.advance(by: Self.millisecond)
            #expect(await channel.closed() == .idleTimeout)
            #expect(sawEndOfFile(raw))
        }
    }

    /// A connection that never says hello is refused when the hello timeout passes (10 s here),
    /// not before.
    @Test func aMutePeerIsRefusedWhenTheHelloTimeoutPasses() async throws {
        try await withDeadline(30) {
            let clock = ManualScheduler()
            var configuration = config("server", clock)
            configuration.helloTimeout = .seconds(10)
            let server = try TestServer(configuration)
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            // The accepted socket's hello deadline is its one timer on the clock.
            #expect(await clock.waitForPending(1), "the hello deadline was never armed")
            clock.advance(by: .seconds(10) - Self.millisecond)
            #expect(!sawEndOfFile(raw))
            clock.advance(by: Self.millisecond)
            guard case .failure(let error) = try await server.next() else {
                Issue.record("a mute peer was accepted")
                return
            }
            #expect(error.code == .helloFailed)
            #expect(sawEndOfFile(raw))
        }
    }

    /// A request's timeout on the clock: at 29.999 s of its 30 s the reply still counts; a request
    /// nobody answers fails with `requestTimedOut` when its 30 s pass, saying how long it waited.
    @Test func aRequestTimesOutWhenItsTimeoutPassesAndNotBefore() async throws {
        try await withDeadline(30) {
            let clock = ManualScheduler()
            // No heartbeat: turning the clock 30 s at once, with no frame crossing meanwhile,
            // would time out both sides' heartbeats first.
            var serverConfiguration = config("server", clock), clientConfiguration = config("client", clock)
            serverConfiguration.pingInterval = nil
            clientConfiguration.pingInterval = nil
            let server = try TestServer(serverConfiguration)
            let (client, accepted) = try await server.connectedPair(clientConfiguration)
            var requests = accepted.messages.makeAsyncIterator()
            let answered = Task {
                try await client.request(Ping(n: 1), type: "ping", expecting: Pong.self, timeout: .seconds(30))
            }
            let first = try #require(await requests.next())
            clock.advance(by: .seconds(30) - Self.millisecond)
            try await accepted.reply(to: first, with: Pong(n: 1, from: "in time"), type: "pong")
            #expect(try await answered.value.from == "in time")

            let unanswered = Task {
                try await client.request(Ping(n: 2), type: "ping", expecting: Pong.self, timeout: .seconds(30))
            }
            _ = try #require(await requests.next())  // received, never answered
            clock.advance(by: .seconds(30) - Self.millisecond)
            clock.advance(by: Self.millisecond)
            do {
                _ = try await unanswered.value
                Issue.record("an unanswered request returned")
            } catch let error as TransportError {
                #expect(error.code == .requestTimedOut)
                #expect(error.message.contains("within 30.0 seconds"), "\(error.message)")
            }
            client.abort()
        }
    }

    /// A graceful close waits for the peer's end of file for the close linger (2 s by default),
    /// then closes anyway.
    @Test func aGracefulCloseGivesUpOnASilentPeerAfterTheLinger() async throws {
        try await withDeadline(30) {
            let clock = ManualScheduler()
            var configuration = config("server", clock)
            configuration.pingInterval = nil
            let server = try TestServer(configuration)
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            #expect(channel.configuration.connection.closeLinger == .seconds(2))
            channel.close()
            // The GOODBYE and the end of our writing arrive; the raw peer never closes its side.
            try await waitUntil("the linger armed") {
                channel.driver.queue.sync { channel.driver.coarseDeadlines[.linger] } != nil
            }
            clock.advance(by: .seconds(2) - Self.millisecond)
            #expect(!isClosed(channel))
            clock.advance(by: Self.millisecond)
            #expect(isClosed(channel))
        }
    }
}
