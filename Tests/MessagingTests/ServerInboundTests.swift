import Foundation
import TestWaits
import Testing

import Locks
@testable import Messaging
@_spi(Programs) import Transport

/// A server's events are its connections' one inbound queue: a channel hands each message from its
/// loop straight into them (no buffer of its own, no task per connection in between), and while
/// the app does not take them the channel stops reading its socket — nothing lost, memory bounded.
@Suite struct ServerInboundTests {
    struct Item: Codable, Sendable {
        var n: Int
        var pad: String
    }

    @Test func anAppThatStopsReadingStopsItsConnectionsAndLosesNothing() async throws {
        let limit = 16
        let count = 4_000
        let (gate, open) = AsyncStream<Void>.makeStream()
        let received = Observed<[Int]>([])
        let harness = try await LoopbackServer(keepEvents: false, configure: { $0.eventBufferLimit = limit }) { _, event in
            guard case .received(_, let message) = event, let item = try? message.decode(Item.self) else { return }
            if item.n == 0 { for await _ in gate { break } }  // the app stops taking events
            received.withLock { $0.append(item.n) }
        }
        let client = try await harness.client("flood")
        let pad = String(repeating: "p", count: 4_000)
        let sent = Locked(0)
        let sendFailure = Locked<String?>(nil)
        let sender = Task {
            do {
                for n in 0..<count {
                    try await client.send(Item(n: n, pad: pad), type: "item")
                    sent.withLock { $0 += 1 }
                }
            } catch {
                sendFailure.withLock { $0 = "\(error)" }
                throw error
            }
        }
        // The app holds message 0; the events fill to their limit — counting the one in the app's
        // hands: when the channel's 16th push came before the app took message 0, the queue
        // stopped the channel at 16 and then held 15 (reading resumes at half), which a wait for
        // 16 waited out for 20 s (twice in CI and the 20-run check, described by this failure
        // message: "sent 1322, at the app 0, events 15") — and the connection stops being read.
        func readingPaused() -> Bool {
            guard let channel = harness.server.connections.first?.channel else { return false }
            return channel.queue.sync { channel.driver.isReadPaused }
        }
        do {
            try await waitUntil("the events at their limit and the connection no longer read") {
                (harness.server.bufferedEvents >= limit - 1 && readingPaused()) || sendFailure.withLock { $0 } != nil
            }
            if let failure = sendFailure.withLock({ $0 }) { throw TestFailure("a send failed: \(failure)") }
        } catch {
            // What the wait saw, so that a failure says where the flood stopped.
            let health = await client.health
            Issue.record(
                """
                \(error): sent \(sent.withLock { $0 }), at the app \(received.withLock { $0.count }), \
                events \(harness.server.bufferedEvents), connections \(harness.server.connections.count), \
                client connected \(client.channel != nil), health \(health.map { "\($0)" } ?? "none")
                """)
            throw error
        }
        // ...and stay there: the connection is not read while the app takes nothing, so what the
        // events hold now is all they get (checked again, with the socket out of the loop's epoll set).
        // What one read took is still delivered after the limit: encrypted, up to five Noise
        // transport messages (the rest of one and four more, `ConnectionDriver.secureReadExtra`),
        // 82 of these 4 kB messages. Messages that came before the server routed the connection
        // wait in the channel's own buffer (its `incomingBufferLimit`, 64, then one read) and
        // join the events at once. (The bound was `limit + 64` until a run read 68 messages past
        // the limit in one turn: 84.) (This was a one-second window sampled every 20 ms.)
        let oneRead = 5 * 65_537 / 4_000 + 1
        let bound = max(limit, ChannelConfiguration(name: "x").incomingBufferLimit) + oneRead
        // Paused is more than a flag: the socket is out of its loop's epoll set, as the kernel lists
        // it, so nothing more is read from it however much the client sends.
        let atPause = harness.server.bufferedEvents
        let serverChannel = try #require(harness.server.connections.first?.channel)
        let (epoll, socket) = serverChannel.queue.sync { (serverChannel.driver.loop.readiness.descriptor, serverChannel.driver.fd.rawValue) }
        #expect(try !epollWatchedDescriptors(epoll).contains(socket), "the connection's socket is still watched for reading")
        #expect(readingPaused(), "reading resumed while the app took none")
        let most = max(atPause, harness.server.bufferedEvents)
        #expect(most <= bound, "the events grew to \(most) (at most \(bound)) while the app took none")
        #expect(sent.withLock { $0 } < count, "every message was sent while the app took none")
        let connection = try #require(harness.server.connections.first)
        // (messages that came before the server registered the connection wait in the channel's
        // buffer until it is routed; nothing ever reads that buffer: no task in between)
        #expect(!connection.channel.messagesWereRead, "a server's channel hands its messages on from its loop")

        open.finish()  // the app reads again: reading resumes, every message arrives once, in order
        try await sender.value
        try await received.wait("every message at the app", timeout: .seconds(60)) { $0.count == count }
        #expect(received.withLock { $0 } == Array(0..<count))
        await client.close()
        await harness.server.stop()
    }

    /// A server's channel hands its transfers to the events from its loop too (no task per
    /// connection waiting for a transfer most never get): those sent at once after connecting —
    /// before the server routed the channel — and those sent later arrive as events, in order,
    /// each with its bytes, and nothing reads the channel's own ``MessageChannel/transfers``.
    @Test func transfersReachTheEventsFromTheLoopInOrder() async throws {
        let bodies = Observed<[String: [UInt8]]>([:])
        let order = Locked<[String]>([])
        let harness = try await LoopbackServer(keepEvents: false, handle: { _, event in
            guard case .transfer(_, let transfer) = event else { return }
            order.withLock { $0.append(transfer.metadata["name"] ?? "?") }
            let bytes = try? await transfer.collect()
            bodies.withLock { $0[transfer.metadata["name"] ?? "?"] = bytes }
        })
        let client = try await harness.client("pusher")
        let channel = try #require(client.channel)
        func push(_ name: String, _ size: Int) async throws {
            let bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ name.count) }
            let transfer = try await channel.startTransfer(type: "file", totalSize: UInt64(size), metadata: ["name": name])
            var offset = 0
            while offset < size {
                let end = min(offset + 10_000, size)
                try await transfer.send(Array(bytes[offset..<end]))
                offset = end
            }
            try await transfer.finish()
        }
        try await push("first", 1)  // at once: possibly before the server installed the route
        try await push("second", 100_000)
        try await bodies.wait("both transfers collected") { $0.count == 2 }
        #expect(order.withLock { $0 } == ["first", "second"])
        #expect(bodies.withLock { $0["first"] } == [UInt8(truncatingIfNeeded: 5)])
        #expect(bodies.withLock { $0["second"] } == (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 6) })
        let connection = try #require(harness.server.connections.first)
        #expect(!connection.channel.transfersWereRead, "a server's channel hands its transfers on from its loop")
        await client.close()
        await harness.server.stop()
    }
}
