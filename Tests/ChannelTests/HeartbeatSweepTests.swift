import Foundation
import Scheduling
import TestSupport
import TestWaits
import Testing

@testable import Messaging
import ProtocolCore
import Transport

/// The heartbeat and the idle check of all the connections of a loop on one timer (`LoopSweep`),
/// and a PING answered with this side's own when it is due soon (issue 28: an idle server's CPU).
@Suite(.serialized) struct HeartbeatSweepTests {
    private func samples(_ channel: MessageChannel) -> Int { channel.queue.sync { channel.healthOnLoop().samples } }

    /// Connections with heartbeats join their loop's sweep, both sides of each keep taking
    /// round-trip samples, and closed connections leave the sweep and are freed.
    @Test func connectionsShareTheirLoopsTimerAndLeaveItWhenClosed() async throws {
        try await withDeadline(60) {
            var fast = config("server")
            fast.pingInterval = .milliseconds(100)
            fast.heartbeatTimeout = .seconds(5)
            let server = try TestServer(fast)
            var pairs: [(client: MessageChannel, accepted: MessageChannel)] = []
            for _ in 0..<10 { pairs.append(try await server.connectedPair(fast)) }
            // Every one of the 20 drivers is in its loop's sweep (other tests' connections may be
            // in them too: each driver is checked, not the count).
            var drivers = pairs.flatMap { [$0.client.driver, $0.accepted.driver] }
            func inSweep(_ driver: ConnectionDriver) -> Bool { driver.loop.run { driver.sweepIndex >= 0 } }
            #expect(drivers.allSatisfy(inSweep), "\(drivers.filter { !inSweep($0) }.count) of 20 not in a sweep")
            #expect(drivers.allSatisfy { driver in driver.loop.run { driver.loop.sweep.count } >= 1 })
            // Both sides of every pair take samples (a PING that goes along with a PONG still
            // gets its own PONG).
            // (Woken by each sample, the channels' `healthUpdates`, not polled; in a scope of its
            // own, so that nothing here holds a channel when the test checks it is freed.)
            do {
                let ends = pairs.flatMap { [$0.client, $0.accepted] }
                #expect(try await waitForHeartbeatSamples(3, on: ends, within: .seconds(20)) == 0, "a connection closed")
                #expect(ends.allSatisfy { samples($0) >= 3 })
            }
            let freed = WeakDriver(pairs[0].accepted.driver)
            for (client, _) in pairs { client.close() }
            for (client, accepted) in pairs {
                _ = await client.closed()
                _ = await accepted.closed()
            }
            pairs.removeAll()
            #expect(!drivers.contains(where: inSweep), "a closed connection is still in its loop's sweep")
            drivers.removeAll()
            try await waitUntil("a closed connection freed (the sweep holds none)") { freed.driver == nil }
        }
    }

    /// A PING that arrives when the server's own is due within half an interval is answered with
    /// the PONG and the server's PING in the same write; one that arrives early gets the PONG only.
    /// On a clock the test turns (the server's heartbeat is its loop's sweep on that clock).
    @Test func aPingIsAnsweredWithOnesOwnWhenItIsDueSoon() async throws {
        try await withDeadline(60) {
            let clock = ManualScheduler()
            var serverConfig = config("server")
            serverConfig.scheduler = clock
            serverConfig.pingInterval = .seconds(4)
            serverConfig.heartbeatTimeout = .seconds(30)
            let server = try TestServer(serverConfig)
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let accepted = try await server.nextChannel()
            let helloAck = try await blocking { try raw.readFrame() }
            #expect(helloAck.kind == .helloAck)
            // Right after the hello the server's PING is 4 s away: the PONG comes alone.
            try raw.write(Frame(kind: .ping, sequence: 2))
            let early = try await blocking { try raw.readFrame() }
            #expect(early.kind == .pong && early.reference == 2)
            let sent = accepted.driver.queue.sync { accepted.driver.nextSequence }
            // 2.5 s after the hello it is 1.5 s away (the heartbeat's own window opens at 3.5 s):
            // the PONG and the server's PING, in this order, and nothing else was sent meanwhile.
            clock.advance(by: .milliseconds(2_500))
            #expect(accepted.driver.queue.sync { accepted.driver.nextSequence } == sent)
            try raw.write(Frame(kind: .ping, sequence: 3))
            let pong = try await blocking { try raw.readFrame() }
            // Queued with the PONG, not later by the heartbeat's own timer.
            #expect(accepted.driver.queue.sync { accepted.driver.nextSequence } == sent + 2)
            let ping = try await blocking { try raw.readFrame() }
            #expect(pong.kind == .pong && pong.reference == 3)
            #expect(ping.kind == .ping)
            accepted.close()
        }
    }
}

private final class WeakDriver: @unchecked Sendable {
    weak var driver: ConnectionDriver?
    init(_ driver: ConnectionDriver) { self.driver = driver }
}
