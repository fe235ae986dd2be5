import Foundation
import TestSupport
import TestWaits
import Testing

@testable import Messaging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

struct Ping: Codable, Sendable, Equatable { var n: Int }
struct Pong: Codable, Sendable, Equatable {
    var n: Int
    var from: String
}

/// Replies to every "echo" request with a Pong until the channel closes.
func serveEcho(_ channel: MessageChannel) {
    Task {
        for await message in channel.messages where message.typeID == "echo" {
            let ping = try message.decode(Ping.self)
            try await channel.reply(to: message, with: Pong(n: ping.n, from: channel.peer.name), type: "echo.reply")
        }
    }
}

@Suite struct ChannelBehaviorTests {
    @Test func hundredConcurrentClientsDoRequestResponse() async throws {
        try await withDeadline(60) {
            let server = try TestServer()
            Task { for await case .success(let channel) in server.channels { serveEcho(channel) } }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for i in 0..<100 {
                    group.addTask {
                        let address: SocketAddress = i % 2 == 0 ? server.v4 : .ipv6Loopback(port: server.port)
                        let client = try await MessageChannel.connect(
                            to: [address], configuration: config("client-\(i)"), logger: testLogger())
                        for round in 0..<3 {
                            let pong = try await client.request(
                                Ping(n: i * 10 + round), type: "echo", expecting: Pong.self, timeout: .seconds(30))
                            #expect(pong == Pong(n: i * 10 + round, from: "client-\(i)"))
                        }
                        client.close()
                        #expect(await client.closed() == .localClose)
                    }
                }
                try await group.waitForAll()
            }
        }
    }

    @Test func fanOutToFiftyConnections() async throws {
        try await withDeadline(60) {
            let server = try TestServer()
            var clients: [MessageChannel] = []
            var accepted: [MessageChannel] = []
            for i in 0..<50 {
                clients.append(
                    try await MessageChannel.connect(
                        to: [server.v4], configuration: config("c\(i)"), logger: testLogger()))
                accepted.append(try await server.nextChannel())
            }
            for channel in accepted {
                try await channel.send(Chat(text: "broadcast to \(channel.peer.name)"), type: "chat.broadcast")
            }
            for client in clients {
                var iterator = client.messages.makeAsyncIterator()
                let message = try #require(await iterator.next())
                #expect(message.typeID == "chat.broadcast")
                #expect(try message.decode(Chat.self) == Chat(text: "broadcast to \(try #require(client.localName))"))
                client.abort()
            }
        }
    }

    @Test func slowReaderSuspendsTheSenderAndBoundsTheQueue() async throws {
        try await withDeadline(60) {
            var serverConfig = config("server")
            serverConfig.connection.sendHighWaterMark = 256 * 1024
            serverConfig.connection.sendLowWaterMark = 64 * 1024
            serverConfig.pingInterval = nil
            let server = try TestServer(serverConfig)
            let raw = try RawClient(port: server.port, receiveBuffer: 4096)  // never reads
            try raw.hello()
            let channel = try await server.nextChannel()
            let frame = [UInt8](repeating: 7, count: 64 * 1024)
            let sent = Counter()
            let sender = Task {
                for _ in 0..<2048 {  // 128 MiB: far more than socket buffers plus the queue
                    try await channel.sendRaw(frame, type: "bulk")
                    sent.increment()
                }
            }
            // The queue fills up to the high-water mark, then the sender is suspended.
            try await waitUntil("send queue to fill") { channel.queuedBytes > 64 * 1024 }
            let frameSize = 4 + Frame.fixedHeaderSize + 4 + frame.count
            let before = sent.value
            #expect(before < 2048)
            #expect(channel.maxQueuedBytes <= 256 * 1024 + frameSize)
            raw.close()
            let reason = await channel.closed()
            #expect(reason == .reset || reason == .closedByPeer)
            await #expect(throws: TransportError.self) { try await sender.value }
            #expect(channel.maxQueuedBytes <= 256 * 1024 + frameSize)
        }
    }

    @Test func unconsumedMessagesPauseReadingInsteadOfBuffering() async throws {
        try await withDeadline(60) {
            var serverConfig = config("server")
            serverConfig.incomingBufferLimit = 4
            let server = try TestServer(serverConfig)
            let (client, accepted) = try await server.connectedPair()
            let sender = Task {
                for i in 0..<2000 { try await client.send(Ping(n: i), type: "n") }
            }
            try await waitUntil("server to pause reading") {
                accepted.driver.queue.sync { accepted.driver.isReadPaused }
            }
            #expect(accepted.messages.buffer.count <= 4 + 64 * 1024 / 20)
            var next = 0
            for await message in accepted.messages {
                #expect(try message.decode(Ping.self).n == next)
                next += 1
                if next == 2000 { break }
            }
            try await sender.value
            client.abort()
        }
    }

    @Test func gracefulCloseFlushesQueuedFrames() async throws {
        try await withDeadline {
            let server = try TestServer()
            let (client, accepted) = try await server.connectedPair()
            for i in 0..<500 { try await client.send(Ping(n: i), type: "n") }
            client.close(reason: "finished")
            var count = 0
            for await message in accepted.messages {
                #expect(try message.decode(Ping.self).n == count)
                count += 1
            }
            #expect(count == 500)
            #expect(await accepted.closed() == .goodbye("finished"))
        }
    }

    @Test func peerClosingMidFrameGivesTypedReasonAndListenerKeepsServing() async throws {
        try await withDeadline {
            let server = try TestServer()
            let raw = try RawClient(port: server.port)
            try raw.hello()
            let channel = try await server.nextChannel()
            #expect(try raw.readFrame().kind == .helloAck)  // unread input would turn our close into a RST
            let frame = try Frame(kind: .message, typeID: "x", sequence: 2, payload: [UInt8](repeating: 1, count: 100))
                .encoded()
            try raw.write(Array(frame[0..<50]))
            raw.close()
            guard case .protocolError(let text) = await channel.closed() else {
                Issue.record("expected a protocol error")
                return
            }
            #expect(text.contains("middle of a frame"))
            let client = try await MessageChannel.connect(
                to: [server.v4], configuration: config("next"), logger: testLogger())
            #expect(try await server.nextChannel().peer.name == "next")
            client.abort()
        }
    }

    @Test func hugeLengthPrefixClosesWithFrameTooLarge() async throws {
        try await withDeadline {
            let server = try TestServer()
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            try raw.write([0xFF, 0xFF, 0xFF, 0xFF])
            #expect(await channel.closed() == .frameTooLarge(size: 0xFFFF_FFFF, limit: 16 * 1024 * 1024))
        }
    }

    @Test func sequenceGapIsAProtocolError() async throws {
        try await withDeadline {
            let server = try TestServer()
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            try raw.write(Frame(kind: .message, typeID: "x", sequence: 5))
            guard case .protocolError(let text) = await channel.closed() else {
                Issue.record("expected a protocol error")
                return
            }
            #expect(text.contains("sequence"))
        }
    }

    @Test func requestTimesOutWhenTheServerNeverReplies() async throws {
        try await withDeadline {
            let server = try TestServer()
            let (client, accepted) = try await server.connectedPair()
            await #expect {
                _ = try await client.request(
                    Ping(n: 1), type: "ignored", expecting: Pong.self, timeout: .milliseconds(100))
            } throws: { ($0 as? TransportError)?.code == .requestTimedOut }
            // A late reply is dropped (logged), not delivered as a message.
            var serverMessages = accepted.messages.makeAsyncIterator()
            let request = try #require(await serverMessages.next())
            try await accepted.reply(to: request, with: Pong(n: 1, from: "late"), type: "late")
            try await accepted.send(Chat(text: "after"), type: "chat")
            var clientMessages = client.messages.makeAsyncIterator()
            #expect(await clientMessages.next()?.typeID == "chat")
            client.abort()
        }
    }

    @Test func cancellingARequestStopsTheWait() async throws {
        try await withDeadline {
            let server = try TestServer()
            let (client, accepted) = try await server.connectedPair()
            let request = Task {
                try await client.request(Ping(n: 1), type: "slow", expecting: Pong.self, timeout: .seconds(600))
            }
            var serverMessages = accepted.messages.makeAsyncIterator()
            let received = try #require(await serverMessages.next())  // the request is on the wire
            request.cancel()
            await #expect(throws: CancellationError.self) { try await request.value }
            try await accepted.reply(to: received, with: Pong(n: 1, from: "late"), type: "late")  // dropped
            try await accepted.send(Chat(text: "next"), type: "chat")
            var clientMessages = client.messages.makeAsyncIterator()
            #expect(await clientMessages.next()?.typeID == "chat")
            client.abort()
        }
    }

    @Test func unknownTypesAndBadPayloadsReachTheAppAsRawBytes() async throws {
        try await withDeadline {
            let server = try TestServer()
            let (client, accepted) = try await server.connectedPair()
            let (handled, handledContinuation) = AsyncStream.makeStream(of: Chat.self)
            accepted.on(type: "chat", as: Chat.self) { value, _ in handledContinuation.yield(value) }
            try await client.send(Chat(text: "typed"), type: "chat")
            try await client.sendRaw(Array("{not json".utf8), type: "mystery.type")
            let badJSON = Frame(kind: .message, codecID: 1, typeID: "chat", payload: Array("{\"text\": 42}".utf8))
            _ = try await client.driver.send(badJSON)
            try await client.send(Chat(text: "still alive"), type: "chat")

            var handledIterator = handled.makeAsyncIterator()
            #expect(await handledIterator.next() == Chat(text: "typed"))
            var messages = accepted.messages.makeAsyncIterator()
            let unknown = try #require(await messages.next())
            #expect(unknown.typeID == "mystery.type" && unknown.payload == Array("{not json".utf8))
            let undecodable = try #require(await messages.next())
            #expect(undecodable.typeID == "chat" && undecodable.payload == Array("{\"text\": 42}".utf8))
            #expect(
                performing: { _ = try undecodable.decode(Chat.self) },
                throws: { ($0 as? TransportError)?.code == .decodingFailed })
            #expect(await handledIterator.next() == Chat(text: "still alive"))
            client.abort()
        }
    }

    @Test func streamsATenMebibyteFileWithProgress() async throws {
        try await withDeadline(60) {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("transport-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let source = directory.appendingPathComponent("source.bin")
            let target = directory.appendingPathComponent("target.bin")
            var generator = SystemRandomNumberGenerator()
            var data = Data(count: 10 * 1024 * 1024 + 123)
            data.withUnsafeMutableBytes { raw in
                for i in stride(from: 0, to: raw.count - 8, by: 8) {
                    raw.storeBytes(of: generator.next(), toByteOffset: i, as: UInt64.self)
                }
            }
            try data.write(to: source)

            let server = try TestServer()
            let (client, accepted) = try await server.connectedPair()
            let senderProgress = ProgressLog()
            let send = Task {
                try await client.sendFile(
                    at: source.path, type: "file.upload", metadata: ["name": "source.bin"], chunkSize: 64 * 1024,
                    progress: { senderProgress.record($0) })
            }
            var transfers = accepted.transfers.makeAsyncIterator()
            let transfer = try #require(await transfers.next())
            #expect(transfer.typeID == "file.upload" && transfer.metadata == ["name": "source.bin"])
            #expect(transfer.totalSize == UInt64(data.count))
            let receiverProgress = Task {
                var last: TransferProgress?
                for await progress in transfer.progress { last = progress }
                return last
            }
            try await transfer.write(toFile: target.path)
            try await send.value
            #expect(try Data(contentsOf: target) == data)
            let last = try #require(await receiverProgress.value)
            #expect(last.isFinished && last.completedBytes == UInt64(data.count))
            #expect(senderProgress.first?.completedBytes == 0)
            #expect(
                senderProgress.last?.isFinished == true && senderProgress.last?.completedBytes == UInt64(data.count))
            // Memory stayed bounded on the sending side.
            #expect(client.maxQueuedBytes <= client.configuration.connection.sendHighWaterMark + 70 * 1024)
            client.abort()
        }
    }

    @Test func abortedTransferThrowsOnTheReceivingSide() async throws {
        try await withDeadline {
            let server = try TestServer()
            let (client, accepted) = try await server.connectedPair()
            let outgoing = try await client.startTransfer(type: "blob", totalSize: 10)
            try await outgoing.send([1, 2, 3])
            await #expect(throws: TransportError.self) { try await outgoing.finish() }
            var transfers = accepted.transfers.makeAsyncIterator()
            let incoming = try #require(await transfers.next())
            await #expect { _ = try await incoming.collect() } throws: {
                ($0 as? TransportError)?.code == .transferFailed
            }
            // The connection is still usable.
            try await client.send(Chat(text: "ok"), type: "chat")
            var messages = accepted.messages.makeAsyncIterator()
            #expect(await messages.next()?.typeID == "chat")
            client.abort()
        }
    }

    @Test func heartbeatTimeoutClosesASilentPeer() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.pingInterval = .milliseconds(50)
            serverConfig.heartbeatTimeout = .milliseconds(300)
            let server = try TestServer(serverConfig)
            let raw = try RawClient(port: server.port)  // says hello, then never answers pings
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            #expect(await channel.closed() == .heartbeatTimeout)
        }
    }

    @Test func heartbeatKeepsAnIdleButAnsweringPeerOpen() async throws {
        try await withDeadline {
            var fast = config("server")
            fast.pingInterval = .milliseconds(20)
            fast.heartbeatTimeout = .milliseconds(200)
            let server = try TestServer(fast)
            var clientConfig = config("client")
            clientConfig.pingInterval = nil  // only answers the server's pings
            let (client, accepted) = try await server.connectedPair(clientConfig)
            // Wait for enough pings to span several heartbeat timeouts: 40 answered, each a
            // round-trip sample (told by `healthUpdates`, not polled).
            #expect(try await waitForHeartbeatSamples(40, on: [accepted], within: .seconds(20)) == 0, "the connection closed")
            #expect(accepted.driver.queue.sync { accepted.driver.nextSequence } > 40)
            try await client.send(Chat(text: "still here"), type: "chat")
            var messages = accepted.messages.makeAsyncIterator()
            #expect(await messages.next()?.typeID == "chat")
            client.abort()
        }
    }

    @Test func helloTimeoutClosesAMutePeer() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.helloTimeout = .milliseconds(200)
            let server = try TestServer(serverConfig)
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            guard case .failure(let error) = try await server.next() else {
                Issue.record("mute peer was accepted")
                return
            }
            #expect(error.code == .helloFailed)
            guard case .helloFailed = error.closeReason else {
                Issue.record("expected helloFailed close reason, got \(String(describing: error.closeReason))")
                return
            }
        }
    }

    @Test func idleTimeoutClosesAPeerStuckInAFrame() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.pingInterval = nil
            serverConfig.connection.idleTimeout = .milliseconds(200)
            let server = try TestServer(serverConfig)
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            try raw.write([0, 0, 0, 100, 0x10])  // half a frame, then silence
            #expect(await channel.closed() == .idleTimeout)
        }
    }

    @Test func happyEyeballsSkipsADeadAddress() async throws {
        try await withDeadline {
            let server = try TestServer()
            let dead = try deadPort()
            let client = try await MessageChannel.connect(
                to: [.ipv4Loopback(port: server.port), .ipv6Loopback(port: dead)], configuration: config("client"),
                logger: testLogger())
            #expect(client.remoteAddress == .ipv4Loopback(port: server.port))
            client.abort()

            // Both dead: a typed error listing each address.
            await #expect {
                _ = try await MessageChannel.connect(
                    to: [.ipv4Loopback(port: dead), .ipv6Loopback(port: dead)], configuration: config("client"),
                    logger: testLogger())
            } throws: { error in
                let error = error as? TransportError
                return error?.code == .connectFailed && error?.connectFailures.count == 2
                    && error?.connectFailures.map(\.address) == [.ipv6Loopback(port: dead), .ipv4Loopback(port: dead)]
            }
        }
    }

    @Test func happyEyeballsTimesOutOnABlackHole() async throws {
        // A loopback listener that never accepts, with its backlog filled: further connects stay pending.
        try await withDeadline {
            let hole = try ConnectTimerTests.BlackHole()
            defer { withExtendedLifetime(hole) {} }
            let port = hole.port
            do {
                let (fd, _) = try await TCPConnector.connect(
                    to: [.ipv4Loopback(port: port)], timeout: .milliseconds(300), logger: testLogger())
                fd.close()  // the kernel completed it after all; nothing to assert about timing
            } catch let error as TransportError {
                #expect(error.code == .connectTimedOut)
                #expect(error.connectFailures.first?.reason == "timed out")
            }
        }
    }

    @Test func acceptBacksOffOnEMFILE() async throws {
        try await withDeadline {
            let failures = Counter()
            let server = try TestServer(acceptCall: { fd, address, length in
                if failures.value < 3 {
                    failures.increment()
                    errno = EMFILE
                    return -1
                }
                return Listener.systemAccept(fd, address, length)
            })
            let client = try await MessageChannel.connect(
                to: [server.v4], configuration: config("client"), logger: testLogger())
            #expect(try await server.nextChannel().peer.name == "client")
            #expect(server.listener.acceptPauseCount == 3)
            client.abort()
        }
    }
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0  // guarded by lock
    var value: Int { lock.withLock { count } }
    func increment() { lock.withLock { count += 1 } }
}

final class ProgressLog: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [TransferProgress] = []  // guarded by lock
    func record(_ progress: TransferProgress) { lock.withLock { entries.append(progress) } }
    var first: TransferProgress? { lock.withLock { entries.first } }
    var last: TransferProgress? { lock.withLock { entries.last } }
}

extension MessageChannel {
    /// The name this side sent in its hello.
    var localName: String? { configuration.name }
}
