import Foundation
import Logging
import TestWaits
import Testing

import Locks
@testable import Messaging

/// What a newcomer's first app (a key-value board) ran into, each checked on loopback.
@Suite struct NewcomerTests {
    struct KV: Codable, Sendable, Equatable {
        var key: String
        var value: String?
    }

    /// A client that only makes requests and never reads its events, while the server broadcasts to
    /// it: every one of 3,000 requests gets its reply (it used to stall after ~320, its replies
    /// stuck behind unread broadcasts; 10,000 took 39 s of CI's unit stage for no more than that),
    /// and the dropped broadcasts are counted, not silent.
    @Test func requestsNeverStallBehindUnreadEvents() async throws {
        let board = Locked<[String: String]>([:])
        let harness = try await LoopbackServer(handle: { server, event in
            guard case .received(let connection, let message) = event, message.typeID == "kv.set" else { return }
            guard let kv = try? message.decode(KV.self) else { return }
            board.withLock { $0[kv.key] = kv.value }
            try? await connection.reply(to: message, with: kv, type: "kv.ok")
            _ = await server.broadcast(kv, type: "kv.changed")  // to the requester too: it never reads them
        })
        let client = try await harness.client("requester")
        for i in 0..<3_000 {
            let answer = try await client.request(KV(key: "k\(i % 50)", value: "\(i)"), type: "kv.set", expecting: KV.self)
            #expect(answer.value == "\(i)")
        }
        #expect(board.withLock { $0.count } == 50)
        #expect(client.droppedMessages >= 3_000 - 256 - 1)
        // The newest events are still there for an app that starts reading late.
        var events = client.events.makeAsyncIterator()
        var kept = 0
        while let event = await events.next() {
            if case .received(let message) = event, message.typeID == "kv.changed" { kept += 1 }
            if kept == 200 { break }
        }
        #expect(kept == 200)
        await client.close()
        await harness.server.stop()
    }

    /// The receiver sees whether a reply is expected; an error reply travels back as RemoteError;
    /// replying to a one-way message is refused at the replier.
    @Test func requestReplySemantics() async throws {
        let seen = Locked<[(String, Bool)]>([])
        let replyToOneWay = Observed<(any Error)?>(nil)
        let harness = try await LoopbackServer(handle: { _, event in
            guard case .received(let connection, let message) = event else { return }
            seen.withLock { $0.append((message.typeID, message.expectsReply)) }
            switch message.typeID {
            case "kv.get":
                try? await connection.reply(to: message, error: RemoteError(code: "not_found", message: "no key 'x'"))
            case "kv.note":
                do {
                    try await connection.reply(to: message, with: KV(key: "x"), type: "kv.ok")
                } catch {
                    replyToOneWay.withLock { $0 = error }
                }
            default:
                break
            }
        })
        let client = try await harness.client("semantics")
        await #expect {
            _ = try await client.request(KV(key: "x"), type: "kv.get", expecting: KV.self)
        } throws: { error in
            (error as? RemoteError) == RemoteError(code: "not_found", message: "no key 'x'")
        }
        try await client.send(KV(key: "x"), type: "kv.note")
        try await harness.events.wait("the note") { if case .received(_, let m) = $0 { m.typeID == "kv.note" } else { false } }
        try await replyToOneWay.wait("the reply to a one-way message refused", timeout: .seconds(10)) { $0 != nil }
        let refusal = try #require(replyToOneWay.withLock { $0 } as? TransportError)
        #expect(refusal.code == .invalidArgument && refusal.message.contains("send()"))
        #expect(seen.withLock { $0.map(\.1) } == [true, false])
        await client.close()
        await harness.server.stop()
    }

    /// `broadcast(_:type:except:)` skips the named connections.
    @Test func broadcastExceptSkipsTheSender() async throws {
        let harness = try await LoopbackServer()
        let alice = try await harness.client("alice")
        let bob = try await harness.client("bob")
        try await harness.events.waitForCount("2 accepted", 2) { if case .accepted = $0 { true } else { false } }
        let aliceConnection = try #require(harness.server.connections.first { $0.peer.name == "alice" })
        let results = await harness.server.broadcast(KV(key: "k"), type: "kv.changed", except: [aliceConnection])
        #expect(results.map(\.connection.peer.name) == ["bob"])
        #expect(await Self.nextMessageType(of: bob) == "kv.changed")
        await alice.close()
        await bob.close()
        await harness.server.stop()
    }

    /// The type of the next message a client receives (nil when its events end first).
    static func nextMessageType(of client: MessageClient) async -> String? {
        for await event in client.events {
            if case .received(let message) = event { return message.typeID }
        }
        return nil
    }

    /// `broadcast(_:type:to:)` sends to the connections given — a room's members — once each, and
    /// to no one else.
    @Test func broadcastToSendsToTheGivenConnectionsOnly() async throws {
        let harness = try await LoopbackServer()
        let alice = try await harness.client("alice")
        let bob = try await harness.client("bob")
        let carol = try await harness.client("carol")
        try await harness.events.waitForCount("3 accepted", 3) { if case .accepted = $0 { true } else { false } }
        let members = harness.server.connections.filter { $0.peer.name != "bob" }
        let results = await harness.server.broadcast(KV(key: "k"), type: "kv.room", to: members + members.prefix(1))
        #expect(results.map(\.connection.peer.name).sorted() == ["alice", "carol"], "each member once, bob not at all")
        #expect(results.allSatisfy { $0.error == nil })
        // Bob's next message is the one sent to him alone after the room's: he never got the room's.
        let bobConnection = try #require(harness.server.connections.first { $0.peer.name == "bob" })
        _ = await harness.server.broadcast(KV(key: "k"), type: "kv.bob", to: [bobConnection])
        #expect(await Self.nextMessageType(of: bob) == "kv.bob")
        for client in [alice, carol] { #expect(await Self.nextMessageType(of: client) == "kv.room") }
        await alice.close()
        await bob.close()
        await carol.close()
        await harness.server.stop()
    }

    /// Three clients watch the server; `stop()` reports `.closed` for every one of them, and each
    /// client sees its `.disconnected`.
    @Test func stopReportsClosedForEveryWatcher() async throws {
        let harness = try await LoopbackServer()
        var clients: [MessageClient] = []
        var logs: [EventLog<ClientEvent>] = []
        var pumps: [Task<Void, Never>] = []
        for name in ["w1", "w2", "w3"] {
            let client = try await harness.client(name)
            let log = EventLog<ClientEvent>()
            pumps.append(Task { for await event in client.events { log.append(event) } })
            clients.append(client)
            logs.append(log)
        }
        try await harness.events.waitForCount("3 accepted", 3) { if case .accepted = $0 { true } else { false } }
        await harness.server.stop()
        await harness.pump.value  // the server's events ended: everything it reported is in the log
        let closed = harness.events.all.compactMap { event -> String? in
            if case .closed(let connection, _) = event { return connection.peer.name }
            return nil
        }
        #expect(closed.sorted() == ["w1", "w2", "w3"])
        for log in logs {
            try await log.wait("disconnected") { if case .disconnected = $0 { true } else { false } }
        }
        for client in clients { await client.close() }
        for pump in pumps { pump.cancel() }
    }

    /// A client started before its server (by address) waits, says so, and connects when the server
    /// comes; a request made meanwhile waits for the connection instead of failing.
    @Test func aClientWaitsForItsServer() async throws {
        let port = try freePort()
        var configuration = ClientConfiguration(
            peerName: "early", reconnect: ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .milliseconds(200)))
        configuration.waitsForServer = true
        configuration.connectionWait = .seconds(20)
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: port), configuration: configuration, logger: testLogger())
        let log = EventLog<ClientEvent>()
        let pump = Task { for await event in client.events { log.append(event) } }
        try await log.wait("waiting") { if case .waiting(let error) = $0 { error.message.contains("refused") } else { false } }
        let early = Task { try await client.request(KV(key: "k"), type: "kv.echo", expecting: KV.self, timeout: .seconds(20)) }
        let server = try await LoopbackServer(
            configure: { $0.listener.port = port; $0.listener.families = [.ipv4] },
            handle: { _, event in
                if case .received(let connection, let message) = event {
                    try? await connection.reply(to: message, with: try! message.decode(KV.self), type: "kv.echo")
                }
            })
        #expect(try await early.value == KV(key: "k"))
        try await log.wait("connected") { if case .connected = $0 { true } else { false } }
        pump.cancel()
        await client.close()
        await server.server.stop()
    }

    /// Without a server and without waiting, a send says what is wrong at once; without a message
    /// session a send while not connected fails after the connection wait, with the reason; with
    /// one (the default with a reconnect policy) it is kept for the server.
    @Test func sendWithoutConnectionSaysNotConnected() async throws {
        let port = try freePort()
        await #expect {
            _ = try await MessageClient.connect(
                to: .host("127.0.0.1", port: port), configuration: .init(peerName: "x"), logger: testLogger())
        } throws: { ($0 as? MessagingError)?.code == .connectFailed }
        var configuration = ClientConfiguration(peerName: "y", reconnect: ReconnectPolicy(maxAttempts: 1000))
        configuration.waitsForServer = true
        configuration.connectionWait = .milliseconds(300)
        configuration.session = nil
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: port), configuration: configuration, logger: testLogger())
        await #expect {
            try await client.send(KV(key: "k"), type: "kv.note")
        } throws: { error in
            let error = error as? MessagingError
            return error?.code == .notConnected && error?.message.contains("refused") == true
        }
        await client.close()
        configuration.session = SessionConfiguration()
        let keeping = try await MessageClient.connect(
            to: .host("127.0.0.1", port: port), configuration: configuration, logger: testLogger())
        try await keeping.send(KV(key: "k"), type: "kv.note")
        #expect(keeping.unacknowledgedCount == 1)
        #expect(keeping.unacknowledgedMessages.first?.wasTransmitted == false)
        let events = EventLog<ClientEvent>()
        let pump = Task { for await event in keeping.events { events.append(event) } }
        await keeping.close()
        // Closed before any server came: the message is reported, not dropped silently.
        let report = try await events.wait("undelivered") { if case .undelivered = $0 { true } else { false } }
        if case .undelivered(let lost) = report { #expect(try lost.map { try $0.decode(KV.self) } == [KV(key: "k")]) }
        pump.cancel()
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on (bound once by the kernel, then released).
func freePort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
        }
    }
    guard bound else { throw TestFailure("cannot bind a port") }
    return UInt16(bigEndian: address.sin_port)
}
