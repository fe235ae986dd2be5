import Foundation
import TestWaits
import Testing

import Locks
@testable import Messaging
import ProtocolCore
import TestSupport

/// Many idle encrypted connections on one server with heartbeats running (issue 28), in a short
/// form (the full one, 19,000 connections with its figures, is `Benchmarks/idle.sh`): they all stay
/// up through heartbeat rounds, a broadcast reaches every one, and stop() closes them all with
/// GOODBYE within its grace period.
@Suite(.serialized) struct ManyIdleConnectionsTests {
    @Test func fourHundredIdleConnectionsStayUpGetABroadcastAndAGoodbye() async throws {
        let count = 400
        var configuration = ServerConfiguration(serviceType: "_test._tcp", serviceName: "Idle")
        configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        configuration.publish = false
        configuration.listener.loopbackOnly = true
        configuration.listener.families = [.ipv4]
        configuration.maxHandshakesPerSecondPerAddress = nil  // all from 127.0.0.1
        configuration.eventBufferLimit = 10_000
        // Heartbeats every 500 ms each way, dead after 5 s: several rounds within the test. (Every
        // 100 ms, 400 connections were 16,000 encrypted frames a second: in a debug build on a CI
        // machine busy building, the loops fell behind and the test took a minute.)
        configuration.channel.pingInterval = .milliseconds(500)
        configuration.channel.heartbeatTimeout = .seconds(5)
        configuration.heartbeatsPerSecond = nil  // the default would pace 400 connections to 2.7 s (HeartbeatPacingTests)
        let server = MessageServer(configuration: configuration, discovery: nil, logger: testLogger())
        try await server.start()
        let port = try #require(server.port)
        let events = EventLog<ServerEvent>()
        let pump = Task { for await event in server.events { events.append(event) } }

        var client = ChannelConfiguration(name: "idle")
        client.security = configuration.channel.security
        client.pingInterval = .milliseconds(500)
        client.heartbeatTimeout = .seconds(5)
        let clientConfiguration = client
        let received = Observed(0)
        let connectStart = ContinuousClock.now
        let channels = try await withThrowingTaskGroup(of: [MessageChannel].self) { group in
            for worker in 0..<8 {
                group.addTask {
                    var mine: [MessageChannel] = []
                    for _ in stride(from: worker, to: count, by: 8) {
                        let channel = try await MessageChannel.connect(
                            to: [.ipv4Loopback(port: port)], configuration: clientConfiguration, logger: testLogger())
                        channel.on(type: "news", as: String.self) { _, _ in received.withLock { $0 += 1 } }
                        mine.append(channel)
                    }
                    return mine
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
        #expect(channels.count == count)
        try await events.waitForCount("\(count) connections accepted", count, timeout: .seconds(20)) {
            if case .accepted = $0 { true } else { false }
        }
        #expect(server.connections.count == count)  // (a connection is reported once registered)
        print("MEASURED \(count) idle encrypted connections: connected in \(ContinuousClock.now - connectStart)")

        // Six heartbeat rounds (about 3 s), counted, not waited out: both ends of every connection
        // take six round-trip samples (a PONG each), told by their `healthUpdates`; nobody is
        // dropped meanwhile, nobody falls silent. (It was a 3-s window checked every 200 ms.) An
        // end whose updates ended — closed — is counted, and fails the test at once.
        let ends = server.connections.map(\.channel) + channels
        #expect(ends.count == 2 * count)
        let closed = try await waitForHeartbeatSamples(6, on: ends, within: .seconds(60))
        #expect(closed == 0, "\(closed) connections closed during the heartbeat rounds")
        #expect(server.connections.count == count)
        #expect(events.count { if case .closed = $0 { true } else { false } } == 0)
        let silent = await withTaskGroup(of: Bool.self) { group in
            for connection in server.connections { group.addTask { await connection.health.sinceLastHeard >= .seconds(2) } }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(silent == 0)

        let results = await server.broadcast("hello, everyone", type: "news")
        #expect(results.count == count && results.allSatisfy(\.succeeded))
        try await received.wait("the broadcast at every client") { $0 == count }

        let stopStart = ContinuousClock.now
        await server.stop()
        let stopTook = ContinuousClock.now - stopStart
        let reasons = await withTaskGroup(of: CloseReason.self) { group in
            for channel in channels { group.addTask { await channel.closed() } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        let goodbyes = reasons.filter { if case .goodbye = $0 { true } else { false } }.count
        #expect(goodbyes == count, "\(count - goodbyes) closed otherwise: \(reasons.first { if case .goodbye = $0 { false } else { true } }.map { "\($0)" } ?? "")")
        #expect(stopTook < configuration.stopGracePeriod, "stop() took \(stopTook)")
        pump.cancel()
        print("MEASURED \(count) idle encrypted connections: stop() closed them all with GOODBYE in \(stopTook)")
    }
}

/// A server lets go of its closed connections (the soak found one kept by a cycle: a connection
/// holding its channel, the channel holding the connection through the hand-off of its transfers).
@Suite struct ClosedConnectionsAreFreedTests {
    @Test func aClosedConnectionsChannelIsFreed() async throws {
        final class Weak: @unchecked Sendable {  // set once, before it is read
            weak var channel: MessageChannel?
        }
        let harness = try await LoopbackServer(security: .encrypted(identity: .ephemeral(), trust: .anyKey))
        let serverSide = Weak()
        let client = try await harness.client("leaving")
        do {  // (the event holds the connection: not beyond this block)
            let accepted = try await harness.events.wait("accepted") { if case .accepted = $0 { true } else { false } }
            if case .accepted(let connection) = accepted { serverSide.channel = connection.channel }
        }
        #expect(serverSide.channel != nil)
        await client.close()
        try await harness.events.wait("closed") { if case .closed = $0 { true } else { false } }
        harness.events.clear()  // the events hold the connection too
        try await waitUntil("the closed channel freed", timeout: .seconds(5)) { serverSide.channel == nil }
        await harness.server.stop()
    }

    /// The same with a message session that ends (the client closes: GOODBYE ends it): the session
    /// serves its channel and the channel knows its session — neither may keep the other alive.
    @Test func anEndedSessionsChannelAndSessionAreFreed() async throws {
        final class Weak: @unchecked Sendable {  // set once, before it is read
            weak var channel: MessageChannel?
            weak var session: MessageSession?
        }
        let harness = try await LoopbackServer(security: .encrypted(identity: .ephemeral(), trust: .anyKey))
        let serverSide = Weak()
        let client = try await harness.client("leaving") {
            $0.reconnect = ReconnectPolicy(initialDelay: .milliseconds(10), maxDelay: .milliseconds(50))
        }
        do {  // (the event holds the connection: not beyond this block)
            let accepted = try await harness.events.wait("accepted") { if case .accepted = $0 { true } else { false } }
            if case .accepted(let connection) = accepted {
                serverSide.channel = connection.channel
                serverSide.session = connection.session
            }
        }
        #expect(serverSide.channel != nil)
        #expect(serverSide.session != nil, "the client opened a session")
        await client.close()
        try await harness.events.wait("closed") { if case .closed = $0 { true } else { false } }
        harness.events.clear()  // the events hold the connection too
        try await waitUntil("the ended session's channel freed", timeout: .seconds(5)) { serverSide.channel == nil }
        try await waitUntil("the ended session freed", timeout: .seconds(5)) { serverSide.session == nil }
        await harness.server.stop()
    }
}
