import Foundation
import TestWaits
import Testing

import Discovery
import Locks
@testable import Messaging
@_spi(Programs) import ProtocolCore
import Scheduling

/// A publisher whose publication's withdrawal waits for the test: a `stop()` holds there, the
/// server already stopping, its listener, connections, handshakes and timers still running.
final class StopHeldPublisher: ServicePublisher, @unchecked Sendable {  // immutable
    let gate = AcknowledgementTests.Gate()

    final class Publication: ServicePublication, @unchecked Sendable {  // immutable
        let events: AsyncStream<PublicationEvent>
        let continuation: AsyncStream<PublicationEvent>.Continuation
        let name = "held"
        let gate: AcknowledgementTests.Gate
        init(gate: AcknowledgementTests.Gate) {
            self.gate = gate
            (events, continuation) = AsyncStream.makeStream()
        }
        func updateTXT(_ txt: TXTRecord) async throws(DiscoveryError) {}
        func unpublish() async {
            try? await gate.pass()
            continuation.finish()
        }
    }

    func publishService(name: String?, type: String, port: UInt16, txt: TXTRecord) async throws(DiscoveryError)
        -> any ServicePublication
    {
        Publication(gate: gate)
    }
}

/// With a session store, `stop()` keeps every session in it for the next server — also one whose
/// connection, send deadline or resume meets the stop half way (issue 54: found by the seeded
/// world, and by a read of every path a stop can cross). Each test holds the stop in its first
/// step (the publication's withdrawal), where the server is already stopping and all else runs.
@Suite struct StopKeepsSessionsTests {
    typealias Numbered = SessionTests.Numbered

    /// A broadcast's send waits for room (the client acknowledges nothing) when the stop begins,
    /// and its deadline passes before the stop reaches the session: the connection is dropped and
    /// the session stays in the store — nothing reported undelivered, the next server knows it.
    /// (The deadline ended the session there, and reported its messages.)
    @Test(.timeLimit(.minutes(1))) func aSendDeadlinePassingAsTheServerStopsKeepsTheSession() async throws {
        let store = DurableSessionTests.store("deadline-at-stop")
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        let stored = try DurableSessionTests.storedServer(store)
        let configure: @Sendable (inout ServerConfiguration) -> Void = {
            stored(&$0)
            $0.session?.maxUnacknowledgedMessages = 2
        }
        let clock = ManualScheduler()
        let held = StopHeldPublisher()
        let first = try await LoopbackServer(publisher: held, configure: {
            configure(&$0)
            $0.channel.scheduler = clock
        })
        let (channel, connection) = try await DurableSessionTests.leaverInSession(first)
        defer { channel.abort() }
        for n in 1...2 { try await connection.send(Numbered(n: n), type: "n") }  // the room is full
        let start = clock.now
        let broadcast = Task { await first.server.broadcast(Numbered(n: 3), type: "n", to: [connection], timeout: .seconds(5)) }
        try await waitUntil("the send's deadline armed") { clock.pendingDeadlines.contains(start + 5_000_000_000) }
        let stopping = Task { await first.server.stop() }
        try await waitUntil("the stop began") { first.server.withState { $0.lifecycle.isStopping } }
        clock.advance(by: .seconds(5))  // the deadline passes (its work runs before this returns)
        held.gate.open()
        await stopping.value
        let results = await broadcast.value
        #expect(results.count == 1 && results.first?.error != nil, "the send did not fail: \(results)")
        #expect(first.events.count { if case .undelivered = $0 { true } else { false } } == 0, "reported: \(first.events.all)")

        let second = try await LoopbackServer(configure: configure)
        #expect(!second.server.withState { $0.restored.isEmpty }, "the next server does not know the session")
        await second.server.stop()
    }

    /// The client ends its session (GOODBYE) while the server stops: the session ends — what the
    /// server had sent it and it never acknowledged is reported, and the next server does not hold
    /// it for a client that will not come back. (The stop kept it.)
    @Test(.timeLimit(.minutes(1))) func aSessionItsClientEndsAsTheServerStopsEnds() async throws {
        let store = DurableSessionTests.store("goodbye-at-stop")
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        let configure = try DurableSessionTests.storedServer(store)
        let held = StopHeldPublisher()
        let first = try await LoopbackServer(publisher: held, configure: configure)
        let (channel, connection) = try await DurableSessionTests.leaverInSession(first)
        for n in 1...3 { try await connection.send(Numbered(n: n), type: "n") }
        let serving = connection.channel
        let stopping = Task { await first.server.stop() }
        try await waitUntil("the stop began") { first.server.withState { $0.lifecycle.isStopping } }
        channel.close(reason: "done")
        let reason = await serving.closed()
        #expect({ if case .goodbye = reason { true } else { false } }(), "closed for \(reason)")
        held.gate.open()
        await stopping.value
        let report = try await first.events.wait("undelivered") { if case .undelivered = $0 { true } else { false } }
        if case .undelivered(_, let lost) = report { #expect(try lost.map { try $0.decode(Numbered.self).n } == [1, 2, 3]) }

        let second = try await LoopbackServer(configure: configure)
        #expect(second.server.withState { $0.restored.isEmpty }, "the next server holds a session its client ended")
        await second.server.stop()
    }

    /// A client's SESSION arrives after the stop began (its handshake was under way): the server
    /// closes the connection without GOODBYE, which would end that session at the client — one the
    /// store keeps for the next server. (It said GOODBYE.)
    @Test(.timeLimit(.minutes(1))) func aResumeArrivingAsTheServerStopsGetsNoGoodbye() async throws {
        let store = DurableSessionTests.store("resume-at-stop")
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        let held = StopHeldPublisher()
        let harness = try await LoopbackServer(security: .plaintext, publisher: held, configure: { $0.session?.store = store })
        let peer = try HostilePeer(port: harness.port)
        let spec = SpecDecisionTests()
        spec.hello(peer)
        let (greeting, _) = await offThePool { peer.readFrames { $0.contains { $0.kind == .helloAck } } }
        #expect(greeting.contains { $0.kind == .helloAck }, "no HELLO_ACK from the server: \(greeting.map(\.kind))")
        // The server waits for this peer's SESSION now.
        let stopping = Task { await harness.server.stop() }
        try await waitUntil("the stop began") { harness.server.withState { $0.lifecycle.isStopping } }
        spec.session(peer, received: 0)
        let (frames, closed) = await offThePool { peer.readFrames(for: 10) { _ in false } }
        #expect(closed, "the server did not close the connection")
        #expect(!frames.contains { $0.kind == .goodbye }, "the server said GOODBYE: \(frames.map(\.kind))")
        peer.endWriting()
        held.gate.open()
        await stopping.value
    }

    /// The app closes a client with a store while its reconnect waits for the server's answer,
    /// with messages the server has not acknowledged: the session stays in both stores. The
    /// connection that comes through after the close is closed without GOODBYE, so the server keeps
    /// the session too, and the next client on the store resends the messages to the next server —
    /// nothing reported undelivered. (Its GOODBYE ended the session at the server, and the next
    /// client was told the messages may not have arrived.)
    @Test(.timeLimit(.minutes(1))) func aClientClosedWhileItsResumeIsAnsweredKeepsTheSessionAtTheServer() async throws {
        let store = DurableSessionTests.store("server-of-a-closing-client")
        let clientStore = DurableSessionTests.store("closing-client")
        defer {
            try? FileManager.default.removeItem(atPath: store.directory)
            try? FileManager.default.removeItem(atPath: clientStore.directory)
        }
        let configure = try DurableSessionTests.storedServer(store)
        let configureClient: @Sendable (inout ClientConfiguration) -> Void = {
            SessionTests.fastReconnect(&$0)
            $0.session?.store = clientStore
        }
        // The first server's app handles nothing: the client's messages stay unacknowledged.
        let busy = AcknowledgementTests.Gate()
        let first = try await LoopbackServer(configure: configure, handle: { _, event in
            if case .received = event { try? await busy.pass() }
        })
        let client = try await first.client("closer", configure: configureClient)
        for n in 1...3 { try await client.send(Numbered(n: n), type: "n") }
        // (the app's loop is held at the first: the session's count says what arrived)
        try await waitUntil("all three arrived") { first.server.connections.first?.session?.inbox.delivered == 3 }
        await first.server.stop()
        busy.open()

        // The next server holds its answer to the client's resume until the client was closed.
        let entered = Observed(false)
        let answer = AcknowledgementTests.Gate()
        let second = try await LoopbackServer(
            prepare: .init { server in
                server.beforeRestoredSessionAttaches.withLock {
                    $0 = { _ in
                        entered.update { $0 = true }
                        try? await answer.pass()
                    }
                }
            },
            configure: configure)
        try await entered.wait("the client's resume reached the next server") { $0 }
        #expect(client.unacknowledgedCount == 3)
        await client.close()
        answer.open()
        let ended = try await second.events.wait("the connection's end") {
            switch $0 {
            case .interrupted, .closed: true
            default: false
            }
        }
        if case .closed(_, let reason) = ended { Issue.record("the session ended at the server: \(reason)") }
        await second.server.stop()

        let third = try await LoopbackServer(configure: configure)
        #expect(!third.server.withState { $0.restored.isEmpty }, "the next server does not know the session")
        let again = try await third.client("closer", configure: configureClient)
        #expect(await again.acknowledged(within: .seconds(20)), "the messages kept were not acknowledged")
        try await third.events.waitForCount("the three again", 3) { if case .received = $0 { true } else { false } }
        await again.close()
        await third.server.stop()
    }
}
