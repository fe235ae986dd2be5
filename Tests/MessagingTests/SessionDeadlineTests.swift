import TestWaits
import Testing

import Locks

@testable import Messaging

/// A client that offers a message session in its hello owes the server its SESSION frame within
/// the hello timeout: a timer on the connection's loop ends the wait, tells the client why and
/// closes the connection, and the server refuses it (no task waits per connection meanwhile).
@Suite struct SessionDeadlineTests {
    @Test func aClientThatOffersASessionButNeverSendsItIsToldAndClosed() async throws {
        let harness = try await LoopbackServer(configure: { $0.channel.helloTimeout = .milliseconds(300) })
        var configuration = ChannelConfiguration(name: "mute")
        configuration.security = harness.security
        configuration.offersSessions = true  // ...and then never sends SESSION
        let channel = try await MessageChannel.connect(
            to: [.ipv4Loopback(port: harness.port)], configuration: configuration, logger: testLogger())
        let start = ContinuousClock.now
        let closed = Observed<(CloseReason, Duration)?>(nil)
        Task {
            let reason = await channel.closed()
            closed.withLock { $0 = (reason, ContinuousClock.now - start) }
        }
        try await closed.wait("the server closed the connection", timeout: .seconds(5)) { $0 != nil }
        let (reason, waited) = try #require(closed.withLock { $0 })
        guard case .goodbye(let text) = reason else {
            Issue.record("closed without saying why: \(reason)")
            return
        }
        #expect(text.contains("the client offered a session but sent no SESSION frame within 0.3 seconds"), "\(text)")
        #expect(waited >= .milliseconds(250), "closed after \(waited), before the hello timeout")
        try await harness.events.wait("the refusal") {
            if case .refused(_, let why) = $0 { why.contains("session exchange failed") } else { false }
        }
        #expect(harness.server.connections.isEmpty)
        await harness.server.stop()
    }
}
