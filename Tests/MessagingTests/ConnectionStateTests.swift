import Scheduling
import TestWaits
import Testing

@testable import Messaging

/// A client's connection state has its own stream, apart from its events: an app watches it
/// without reading (or owing reads to) the message stream, and every state says why.
@Suite struct ConnectionStateTests {
    /// A client waiting for a server on `port` (nothing listens yet), its states collected from
    /// `connectionStates` (nothing reads its events), once it said it waits after a refusal.
    func waitingClient(port: UInt16, _ configuration: ClientConfiguration) async throws -> (
        MessageClient, EventLog<MessageClient.ConnectionState>, Task<Void, Never>
    ) {
        var configuration = configuration
        configuration.waitsForServer = true
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: port), configuration: configuration, logger: testLogger())
        let states = EventLog<MessageClient.ConnectionState>()
        let watcher = Task { for await state in client.connectionStates { states.append(state) } }
        try await states.wait("waiting, refused") {
            if case .waiting(let error) = $0 { error.message.contains("refused") } else { false }
        }
        return (client, states, watcher)
    }

    @Test func theStateStreamSaysWhyWhileNothingReadsTheEvents() async throws {
        let port = try freePort()
        let (client, states, watcher) = try await waitingClient(
            port: port,
            ClientConfiguration(
                peerName: "watcher", reconnect: ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .milliseconds(200))))
        var server = try await LoopbackServer(configure: { $0.listener.port = port; $0.listener.families = [.ipv4] })
        try await states.wait("connected") { if case .connected(let peer, _) = $0 { peer.name == "Test" } else { false } }

        // The server goes away: reconnecting after its GOODBYE, each refused attempt counted.
        await server.server.stop()
        try await states.wait("reconnecting after the server's goodbye, refused") {
            if case .reconnecting(after: .goodbye, let attempt, let error?) = $0 {
                attempt >= 1 && error.message.contains("refused")
            } else {
                false
            }
        }
        server = try await LoopbackServer(configure: { $0.listener.port = port; $0.listener.families = [.ipv4] })
        try await states.waitForCount("connected again", 2) { if case .connected = $0 { true } else { false } }

        await client.close()
        await watcher.value  // the stream ends with the close
        guard case .closed(nil)? = states.all.last else {
            Issue.record("the last state is \(String(describing: states.all.last))")
            return
        }
        #expect(client.connectionState.description == "closed")
        await server.server.stop()
    }

    /// The wait between attempts is on the client's clock: after a refused attempt (at most 500 ms
    /// then, whatever the policy's hour), a server that appears meanwhile is not tried until the
    /// clock is turned to the 500th millisecond, and then at once (it was a Dispatch timer only
    /// real time could end).
    @Test func theWaitBetweenAttemptsIsOnTheClientsClock() async throws {
        let port = try freePort()
        let clock = ManualScheduler()
        var configuration = ClientConfiguration(
            peerName: "patient", reconnect: ReconnectPolicy(initialDelay: .seconds(3_600), maxDelay: .seconds(3_600)))
        configuration.channel.scheduler = clock
        let (client, states, watcher) = try await waitingClient(port: port, configuration)
        #expect(await clock.waitForPending(1), "the back-off is not on the client's clock")
        let server = try await LoopbackServer(configure: { $0.listener.port = port; $0.listener.families = [.ipv4] })
        clock.advance(by: .milliseconds(499))
        #expect(clock.pendingCount == 1, "the wait after a refusal ended before 500 ms")
        #expect(!client.connectionState.isConnected)
        // The 500th millisecond ends the wait: the client tries at once and connects. (Not
        // "no timer pending" here: the new connection arms its own deadlines on this clock — the
        // SESSION answer's — as soon as it is made, and a CI run saw one armed before the check.)
        clock.advance(by: .milliseconds(1))
        try await states.wait("connected once the clock reached the retry") { if case .connected = $0 { true } else { false } }
        await client.close()
        await watcher.value
        await server.server.stop()
    }
}
