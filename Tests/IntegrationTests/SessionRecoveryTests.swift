import Foundation
import Logging
import Messaging
import TestWaits
import Testing

/// Issue 53, 7: a client whose server was killed (`kill -9`) and started again on its session store
/// finds it at once, with the default settings: the server listens on the port it had (kept in its
/// store), and the client tries the lost connection's address again every 250–500 ms between
/// discovery's rounds (which see the restarted server only after Avahi's probing, about a second). Real
/// avahi-daemon on both hosts; the server is lanmsg-echo on host b, the client this process on host
/// a, asking for the server by name.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct SessionRecoveryTests {
    struct Numbered: Codable, Sendable { var n: Int }
    struct Stats: Codable, Sendable { var received: Int; var duplicates: Int; var outOfOrder: Int; var next: Int }

    @Test func aClientFindsItsRestartedServerAtOnce() async throws {
        let directory = NSTemporaryDirectory() + "recovery-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let type = "_itest-rec._tcp"
        let arguments = [
            Harness.binary("lanmsg-echo"), "--name", "Ledger", "--type", type, "--identity", directory + "/server-identity",
            "--session-store", directory + "/server-sessions",
        ]
        var server = try Harness.spawn(onB: true, arguments)
        try await server.waitForOutput("published as")
        let firstPort = Self.port(in: server.text)
        let logger = Harness.logger("till")
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        // The defaults, but a trust store, a peer memory and a session window of this test's own.
        var configuration = ClientConfiguration(peerName: "till", reconnect: ReconnectPolicy())
        configuration.channel.security = .encrypted(
            identity: .ephemeral(), trust: .trustOnFirstUse(TrustStore(path: directory + "/known_peers")))
        configuration.peerMemory = PeerMemory.shared(path: directory + "/known_addresses")
        configuration.session?.maxUnacknowledgedMessages = 20_000
        configuration.session?.maxUnacknowledgedBytes = 64 << 20
        let client = try await MessageClient.connect(
            to: .service(name: "Ledger", type: type, discovery: discovery), configuration: configuration, logger: logger)
        for n in 0..<10 { try await client.send(Numbered(n: n), type: "seq") }
        try #require(await client.acknowledged(within: .seconds(20)), "the first 10 acknowledged")

        kill(server.pid, SIGKILL)
        _ = server.wait(timeout: .seconds(10))
        // 10,000 orders while the ledger is away: kept by the client.
        for n in 10..<10_010 { try await client.send(Numbered(n: n), type: "seq") }
        #expect(client.unacknowledgedCount == 10_000)
        let firstKept = try #require(client.sendProgress).sent - 9_999

        let restarted = ContinuousClock.now
        server = try Harness.spawn(onB: true, arguments)
        defer { server.stop() }
        try #require(await client.acknowledged(through: firstKept, within: .seconds(30)), "the first kept message acknowledged")
        let first = ContinuousClock.now - restarted
        try await server.waitForOutput("listening on port")
        #expect(firstPort != nil && Self.port(in: server.text) == firstPort, "a server with a session store listens on the port it had")
        try #require(await client.acknowledged(within: .seconds(60)), "all acknowledged")
        let all = ContinuousClock.now - restarted
        // The restarted ledger counted the 10,000 once each, in order: its counts start with its
        // process at 0, so the first, 10, is its one jump.
        let stats = try await client.request("stats", type: "seq.stats", expecting: Stats.self)
        #expect(stats.received == 10_000 && stats.duplicates == 0 && stats.outOfOrder == 1 && stats.next == 10_010, "\(stats)")
        #expect(client.resumedSession)
        Harness.measured("recovery: restart of the server to the first of 10,000 kept messages acknowledged", first)
        Harness.measured("recovery: restart of the server to all 10,000 acknowledged", all)
        await client.close()
    }

    /// The port of lanmsg-echo's "listening on port N" line.
    static func port(in output: String) -> Int? {
        output.split(separator: "\n").first { $0.hasPrefix("listening on port ") }.flatMap { Int($0.dropFirst(18)) }
    }
}
