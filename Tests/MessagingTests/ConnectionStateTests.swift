import TestWaits
import Testing

@testable import Messaging

/// A client's connection state has its own stream, apart from its events: an app watches it
/// without reading (or owing reads to) the message stream, and every state says why.
@Suite struct ConnectionStateTests {
    @Test func theStateStreamSaysWhyWhileNothingReadsTheEvents() async throws {
        let port = try freePort()
        var configuration = ClientConfiguration(
            peerName: "watcher", reconnect: ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .milliseconds(200)))
        configuration.waitsForServer = true
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: port), configuration: configuration, logger: testLogger())
        // Nothing reads client.events in this test.
        let states = EventLog<MessageClient.ConnectionState>()
        let watcher = Task { for await state in client.connectionStates { states.append(state) } }
        try await states.wait("waiting, refused") {
            if case .waiting(let error) = $0 { error.message.contains("refused") } else { false }
        }
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
        try await waitUntil("connected again") { client.connectionState.isConnected }

        await client.close()
        await watcher.value  // the stream ends with the close
        guard case .closed(nil)? = states.all.last else {
            Issue.record("the last state is \(String(describing: states.all.last))")
            return
        }
        #expect(client.connectionState.description == "closed")
        await server.server.stop()
    }
}
