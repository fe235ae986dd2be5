import Foundation
import Messaging
import Testing

/// Server on host "b" (the lanmsg-echo binary), client here on host "a", across the veth link.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct MessagingIntegrationTests {
    let logger = Harness.logger("messaging-test")

    func startEcho(name: String, type: String) async throws -> Background {
        let server = try Harness.spawn(onB: true, [Harness.binary("lanmsg-echo"), "--name", name, "--type", type])
        try await server.waitForOutput("published as \(name)")
        return server
    }

    /// SIGTERM to lanmsg-echo: its client is told (GOODBYE "server stopping"), not dropped, and
    /// the program exits 0 — a session client included.
    @Test func echoSaysGoodbyeToItsClientsOnSIGTERM() async throws {
        let type = "_itest-bye._tcp"
        let server = try Harness.spawn(onB: true, [Harness.binary("lanmsg-echo"), "--name", "Bye Echo", "--type", type])
        defer { server.stop() }
        try await server.waitForOutput("published as Bye Echo")
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        var configuration = ClientConfiguration(peerName: "bye", reconnect: ReconnectPolicy(initialDelay: .seconds(30), maxAttempts: 1))
        configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        let client = try await MessageClient.connect(
            to: .service(name: "Bye Echo", type: type, discovery: discovery), configuration: configuration, logger: logger)
        let events = Collector(client.events)
        try await events.wait(timeout: .seconds(10), "connected") { if case .connected = $0 { true } else { false } }
        kill(server.pid, SIGTERM)
        let (event, _) = try await events.wait(timeout: .seconds(10), "disconnected") {
            if case .disconnected = $0 { true } else { false }
        }
        guard case .disconnected(let reason) = event else { return }
        #expect(reason == .goodbye("server stopping"), "\(reason)")
        #expect(server.wait(timeout: .seconds(10)) == 0, "\(server.text)")
        await client.close()
    }

    @Test func serverFoundByBrowsingAndReachedOverIPv4AndIPv6LinkLocal() async throws {
        let type = "_itest-echo._tcp"
        let server = try await startEcho(name: "Echo B", type: type)
        defer { server.stop() }
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        let found = try await MessageClient.find(name: "Echo B", type: type, discovery: discovery, timeout: .seconds(10))
        let resolved = try await discovery.resolve(found)
        #expect(resolved.txt["proto"] == "2")  // encrypted by default
        #expect(resolved.txt["fp"]?.count == 19)  // the short fingerprint: a hint, the handshake proves the key
        let v4 = try #require(resolved.addresses.first { $0.ip.version == .ipv4 })
        let v6 = try #require(resolved.addresses.first { $0.ip.version == .ipv6 && $0.ip.isLinkLocal })
        for address in [v4, v6] {
            let socketAddress = try SocketAddress(ipAddress: address.ip.description, port: address.port, scopeID: address.scopeID)
            let start = ContinuousClock.now
            let channel = try await MessageChannel.connect(
                to: [socketAddress], configuration: ChannelConfiguration(name: "itest"), logger: logger)
            Harness.measured("connect + hello over \(address.ip.version) across the link", ContinuousClock.now - start)
            #expect(channel.remoteAddress?.family == (address.ip.version == .ipv4 ? .ipv4 : .ipv6))
            let reply = try await channel.requestRaw(Array("ping \(address)".utf8), type: "echo")
            #expect(reply.payload == Array("ping \(address)".utf8))
            channel.close()
            _ = await channel.closed()
        }
        // And by name, through the client (happy eyeballs over every address).
        let client = try await MessageClient.connect(
            to: .service(name: "Echo B", type: type, discovery: discovery), configuration: .init(peerName: "itest"),
            logger: logger)
        let count = try await client.request("stats", type: "echo.stats", expecting: Int.self)
        #expect(count >= 3)
        await client.close()
    }

    @Test func clientReconnectsWhenTheServerRestartsOnANewPort() async throws {
        let type = "_itest-phoenix._tcp"
        var server = try await startEcho(name: "Phoenix Echo", type: type)
        let firstPort = server.text.split(separator: "\n").first { $0.hasPrefix("listening on port") }
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        var configuration = ClientConfiguration(peerName: "itest", reconnect: ReconnectPolicy(initialDelay: .milliseconds(100), maxDelay: .seconds(1), maxAttempts: 60))
        configuration.channel.pingInterval = .seconds(1)
        configuration.channel.heartbeatTimeout = .seconds(3)
        let client = try await MessageClient.connect(
            to: .service(name: "Phoenix Echo", type: type, discovery: discovery), configuration: configuration, logger: logger)
        let events = Collector(client.events)
        try await events.wait(timeout: .seconds(5), "connected") { if case .connected = $0 { true } else { false } }
        kill(server.pid, SIGKILL)
        _ = server.wait(timeout: .seconds(5))
        let killedAt = ContinuousClock.now
        let (_, lost) = try await events.wait(timeout: .seconds(10), "disconnected") { if case .disconnected = $0 { true } else { false } }
        Harness.measured("server SIGKILLed → client notices", ContinuousClock.now - killedAt)
        server = try await startEcho(name: "Phoenix Echo", type: type)
        defer { server.stop() }
        let secondPort = server.text.split(separator: "\n").first { $0.hasPrefix("listening on port") }
        #expect(firstPort != secondPort)
        let restartedAt = ContinuousClock.now
        // (After the disconnect, not after a count taken now: the client may have connected to the
        // restarted echo before this line — it browses and connects as soon as the service appears.)
        try await events.wait(from: lost + 1, timeout: .seconds(30), "connected again") { if case .connected = $0 { true } else { false } }
        Harness.measured("server back on a new port → client reconnected", ContinuousClock.now - restartedAt)
        let reply = try await client.channel!.requestRaw(Array("again".utf8), type: "echo")
        #expect(reply.payload == Array("again".utf8))
        await client.close()
    }

    /// A client started before its server (waitsForServer) says it waits, and connects the moment
    /// the service appears — by name, and without a name (the only one there is).
    @Test(arguments: ["Late Echo", nil] as [String?])
    func clientStartedBeforeItsServerConnectsWhenTheServiceAppears(name: String?) async throws {
        let type = name == nil ? "_itest-lone._tcp" : "_itest-late._tcp"
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        var configuration = ClientConfiguration(
            peerName: "early", reconnect: ReconnectPolicy(initialDelay: .milliseconds(100), maxDelay: .seconds(1)))
        configuration.waitsForServer = true
        let client = try await MessageClient.connect(
            to: .service(name: name, type: type, discovery: discovery), configuration: configuration, logger: logger)
        let events = Collector(client.events)
        try await events.wait(timeout: .seconds(10), "waiting for the service") {
            if case .waiting(let error) = $0 { error.message.contains("to appear") } else { false }
        }
        let server = try await startEcho(name: name ?? "Lone Echo", type: type)
        defer { server.stop() }
        let publishedAt = ContinuousClock.now
        try await events.wait(timeout: .seconds(10), "connected") { if case .connected = $0 { true } else { false } }
        let delay = ContinuousClock.now - publishedAt
        Harness.measured("service published → waiting client connected (\(name == nil ? "no name" : "by name"))", delay)
        #expect(delay < .seconds(1), "the client connects within a second of the service appearing")
        let reply = try await client.request("stats", type: "echo.stats", expecting: Int.self)
        #expect(reply >= 1)
        await client.close()
    }
}
