import Foundation
import Testing

@testable import Messaging
import ProtocolCore
import Transport

/// `closed(within:)`: a close bounded by a Dispatch timer on the loop (a client's `close()` waits
/// for its connection this way) instead of a sleeping task raced against the wait.
@Suite struct ClosedWithinTests {
    @Test func anOpenChannelIsReportedOpenAtTheDeadline() async throws {
        try await withDeadline(20, "an open channel's bounded wait") {
            let server = try TestServer(families: [.ipv4])
            let pair = try await server.connectedPair()
            let start = ContinuousClock.now
            let reason = await pair.accepted.closed(within: .milliseconds(150))
            let waited = ContinuousClock.now - start
            #expect(reason == nil, "closed with \(String(describing: reason))")
            #expect(waited >= .milliseconds(150), "gave up after \(waited), before the deadline")
            #expect(await pair.accepted.isOpen)
            pair.client.close()
            _ = await pair.accepted.closed()
        }
    }

    @Test func aChannelThatClosesFirstReportsItsReason() async throws {
        try await withDeadline(20, "a closing channel's bounded wait") {
            let server = try TestServer(families: [.ipv4])
            let pair = try await server.connectedPair()
            let accepted = pair.accepted
            let waiting = Task { await accepted.closed(within: .seconds(10)) }
            pair.client.close()
            #expect(await waiting.value == .goodbye("closing"))
            // Already closed: answered at once, deadline or not.
            #expect(await accepted.closed(within: .zero) == .goodbye("closing"))
        }
    }

    /// The local address is asked of the socket while the channel is open (not stored), and is
    /// nil once it closed (its descriptor may already belong to another connection).
    @Test func theLocalAddressIsTheSocketsWhileOpen() async throws {
        try await withDeadline(20, "addresses of a channel") {
            let server = try TestServer(families: [.ipv4])
            let pair = try await server.connectedPair()
            #expect(pair.accepted.localAddress?.port == server.port)
            #expect(pair.client.remoteAddress?.port == server.port)
            #expect(pair.client.localAddress?.port == pair.accepted.remoteAddress?.port)
            #expect(pair.client.localAddress?.port != nil)
            pair.client.close()
            _ = await pair.accepted.closed()
            _ = await pair.client.closed()
            #expect(pair.accepted.localAddress == nil)
            #expect(pair.accepted.remoteAddress != nil, "the peer's address is kept for the logs after the close")
        }
    }
}
