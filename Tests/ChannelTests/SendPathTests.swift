import Foundation
import Testing

@testable import Messaging
import ProtocolCore
import Transport

/// The send fast path (direct writes, the inbox, trySend) keeps frames in order and numbered.
@Suite struct SendPathTests {
    /// A handler answers inline with trySend (no task); replies carry reply-to and arrive in order.
    @Test func handlerRepliesInlineWithTrySend() async throws {
        try await withDeadline {
            let server = try TestServer(config("server"))
            let (client, accepted) = try await server.connectedPair()
            accepted.on(type: "ping", as: Int.self) { value, message in
                // Runs on the channel's queue.
                #expect((try? accepted.trySend(value + 1, type: "pong", replyTo: message.sequence)) == true)
            }
            var replies = client.messages.makeAsyncIterator()
            for i in 0..<200 {
                try await client.send(i, type: "ping")
                let reply = try #require(await replies.next())
                #expect(reply.typeID == "pong" && reply.replyTo != nil)
                #expect(try reply.decode(Int.self) == i + 1)
            }
            client.close()
            _ = await accepted.closed()
        }
    }

    /// Batches (`send(contentsOf:type:)`) mixed with single sends, with a send queue small enough
    /// that some batches take the one-by-one slow path: everything arrives, in order (the
    /// receiver's sequence check would close the connection on any misnumbering).
    @Test func batchesAndSingleSendsArriveInOrder() async throws {
        try await withDeadline {
            let server = try TestServer(config("server"))
            var clientConfig = config("client")
            clientConfig.connection.sendHighWaterMark = 4 * 1024
            clientConfig.connection.sendLowWaterMark = 1024
            let (client, accepted) = try await server.connectedPair(clientConfig)
            var expected: [Int] = []
            var next = 0
            for round in 0..<40 {
                let batch = Array(next..<next + 1 + round * 7)  // 1 to 274 messages
                next += batch.count
                expected += batch
                try await client.send(contentsOf: batch, type: "n")
                try await client.send(next, type: "n")
                expected.append(next)
                next += 1
            }
            var received: [Int] = []
            var iterator = accepted.messages.makeAsyncIterator()
            while received.count < expected.count, let message = await iterator.next() {
                received.append(try message.decode(Int.self))
            }
            #expect(received == expected)
            client.close()
        }
    }

    /// A batch with a value that cannot be encoded sends nothing: the next message is the first
    /// the peer sees.
    @Test func batchThatCannotBeEncodedSendsNothing() async throws {
        struct Picky: Encodable {
            let value: Int
            func encode(to encoder: any Encoder) throws {
                if value == 3 { throw EncodingError.invalidValue(value, .init(codingPath: [], debugDescription: "no 3")) }
                var container = encoder.singleValueContainer()
                try container.encode(value)
            }
        }
        try await withDeadline {
            let server = try TestServer(config("server"))
            let (client, accepted) = try await server.connectedPair()
            do {
                try await client.send(contentsOf: (1...5).map(Picky.init), type: "n")
                Issue.record("a batch with an unencodable value was sent")
            } catch let error as TransportError {
                #expect(error.code == .encodingFailed)
            }
            try await client.send(42, type: "n")
            var iterator = accepted.messages.makeAsyncIterator()
            let first = try #require(await iterator.next())
            #expect(try first.decode(Int.self) == 42)
            client.close()
        }
    }

    /// Connection queues share a few loop queues. A handler of one connection that installs a
    /// handler on, and reads the queue size of, another connection on the same loop must not
    /// deadlock (a plain `queue.sync` onto a queue of the loop that is running would).
    @Test func handlerCanConfigureAnotherConnectionOfItsLoop() async throws {
        try await withDeadline {
            let server = try TestServer(config("server"))
            var clients: [MessageChannel] = []
            var accepted: [MessageChannel] = []
            for index in 0...LoopGroup.shared.count {  // one more than there are loops
                clients.append(try await MessageChannel.connect(
                    to: [server.v4], configuration: config("c\(index)"), logger: testLogger()))
                accepted.append(try await server.nextChannel())
            }
            // Two accepted channels on the same loop (pigeonhole).
            var pair: (MessageChannel, MessageChannel)?
            for a in accepted.indices {
                for b in accepted.indices where b > a && accepted[a].driver.loop === accepted[b].driver.loop {
                    pair = (accepted[a], accepted[b])
                }
            }
            let (first, second) = try #require(pair)
            first.on(type: "configure", as: Int.self) { value, _ in
                // On first's queue, i.e. on the loop second's queue also targets.
                second.on(type: "echo", as: Int.self) { echoed, message in
                    _ = try? second.trySend(echoed, type: "echoed", replyTo: message.sequence)
                }
                _ = second.queuedBytes
                _ = try? first.trySend(value, type: "configured")
            }
            let firstClient = clients[try #require(accepted.firstIndex { $0 === first })]
            let secondClient = clients[try #require(accepted.firstIndex { $0 === second })]
            try await firstClient.send(1, type: "configure")
            var firstReplies = firstClient.messages.makeAsyncIterator()
            #expect(await firstReplies.next()?.typeID == "configured")
            try await secondClient.send(42, type: "echo")
            var secondReplies = secondClient.messages.makeAsyncIterator()
            let echoed = try #require(await secondReplies.next())
            #expect(echoed.typeID == "echoed")
            #expect(try echoed.decode(Int.self) == 42)
            for client in clients { client.close() }
        }
    }

    /// Many concurrent senders (fast path, inbox, slow path past the high-water mark) mixed with
    /// requests: the receiver's sequence check would close the connection on any reordering.
    @Test func concurrentSendersKeepSequenceNumbersInWireOrder() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.connection.sendHighWaterMark = 8 * 1024
            serverConfig.connection.sendLowWaterMark = 2 * 1024
            let server = try TestServer(serverConfig)
            var clientConfig = config("client")
            clientConfig.connection.sendHighWaterMark = 8 * 1024
            clientConfig.connection.sendLowWaterMark = 2 * 1024
            let (client, accepted) = try await server.connectedPair(clientConfig)
            let senders = 8
            let perSender = 500
            try await withThrowingTaskGroup(of: Void.self) { group in
                for sender in 0..<senders {
                    group.addTask {
                        for i in 0..<perSender {
                            let size = i % 50 == 0 ? 40_000 : 100  // some payloads take the in-place path
                            let bytes = [UInt8](repeating: UInt8(sender), count: size)
                            if i % 3 == 0, (try? client.trySend(bytes, type: "t")) == true {
                                continue
                            }
                            try await client.sendRaw([UInt8](repeating: UInt8(sender), count: size), type: "s\(sender)")
                        }
                    }
                }
                group.addTask {
                    var count = 0
                    for await _ in accepted.messages {
                        count += 1
                        if count == senders * perSender { break }
                    }
                    #expect(count == senders * perSender)
                }
                try await group.waitForAll()
            }
            #expect(accepted.driver.loop.run { !accepted.driver.isClosed })
            client.close()
        }
    }
}
