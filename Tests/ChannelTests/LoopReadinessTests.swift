import Foundation
import Testing

@testable import Messaging
@testable import ProtocolCore
@testable import Transport

/// A loop's connections are read when its one epoll set says so (`LoopReadiness`), not through a
/// Dispatch read source each. These tests use a private group of one loop, so every connection in
/// them shares that loop's set and its counts are theirs alone.
@Suite(.serialized) struct LoopReadinessTests {
    /// A server and a client configuration on a private group of one loop: that loop, the
    /// listening server and what its clients connect with.
    static func oneLoop() throws -> (loop: Loop, server: TestServer, client: ChannelConfiguration, group: LoopGroup) {
        let group = LoopGroup(loopCount: 1, label: "test.readiness")
        var server = config("server")
        server.loopGroup = group
        var client = config("client")
        client.loopGroup = group
        return (group.loops[0], try TestServer(server, families: [.ipv4]), client, group)
    }

    /// More sockets readable at once than one turn serves (three turns' worth): every one is read,
    /// and every slot is given back when the connections close.
    @Test func everyReadableConnectionIsReadAndEverySlotFreed() async throws {
        try await withDeadline(60, "192 connections read at once") {
            let (loop, server, clientConfiguration, group) = try Self.oneLoop()
            defer { withExtendedLifetime(group) {} }
            let count = 3 * Int(LoopReadiness.batch)
            var pairs: [(client: MessageChannel, accepted: MessageChannel)] = []
            for _ in 0..<count { pairs.append(try await server.connectedPair(clientConfiguration)) }
            #expect(loop.run { loop.readiness.count } == 2 * count)

            // Sent while the loop is busy with this block: the accepted sockets become readable
            // together and are found in the same turns (a few of up to 64 each, not one per
            // connection: the batching is the point of the set).
            let clients = pairs.map(\.client)
            let turnsBefore = loop.run { loop.readiness.turns }
            loop.run {
                for (index, client) in clients.enumerated() { _ = try? client.trySend(index, type: "n") }
            }
            for (index, pair) in pairs.enumerated() {
                var iterator = pair.accepted.messages.makeAsyncIterator()
                let message = try #require(await iterator.next())
                #expect(try message.decode(Int.self) == index)
            }
            let turns = loop.run { loop.readiness.turns } - turnsBefore
            #expect(turns <= UInt64(count / 2), "\(turns) turns to read \(count) connections")

            for pair in pairs { pair.client.close() }
            for pair in pairs {
                _ = await pair.accepted.closed()
                _ = await pair.client.closed()
            }
            try await waitUntil("every slot given back") { loop.run { loop.readiness.count } == 0 }
        }
    }

    /// A connection whose reading is paused leaves the set: when its peer hangs up meanwhile, the
    /// set does not report the socket over and over (a level-triggered set would spin the loop);
    /// once reading resumes, the end of file is read and the connection closes.
    @Test func aPausedSocketIsNotReportedUntilReadingResumes() async throws {
        try await withDeadline(30, "a paused socket whose peer left") {
            let (loop, server, clientConfiguration, group) = try Self.oneLoop()
            defer { withExtendedLifetime(group) {} }
            let pair = try await server.connectedPair(clientConfiguration)
            let driver = pair.accepted.driver
            loop.run { driver.pauseReading() }
            pair.client.abort()
            _ = await pair.client.closed()

            // An observation window, not a wait for a condition: a socket reported on every turn
            // makes thousands of turns in it.
            let before = loop.run { loop.readiness.turns }
            try await Task.sleep(for: .milliseconds(200))
            let turns = loop.run { loop.readiness.turns } - before
            #expect(turns < 10, "the set was read \(turns) times in 200 ms with one paused socket")
            #expect(loop.run { driver.isOpen })

            loop.run { driver.resumeReading() }
            let reason = await pair.accepted.closed()
            #expect(reason == .closedByPeer || reason == .reset, "closed with \(reason)")
            try await waitUntil("the slot given back") { loop.run { loop.readiness.count } == 0 }
        }
    }
}
