import Foundation
import Logging
import Messaging
import Testing

/// bonjour-chat where a careful user (or another implementation of its protocol) met its edges
/// (issue 27, items 9, 10, 12–15): the built binary hosting on host "b", members on host "a" — the
/// binary, or a client written here from docs/PROTOCOL.md's chat section.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct ChatEdgeIntegrationTests {
    let chat = Harness.binary("bonjour-chat")
    let logger = Harness.logger("chat-edge")

    struct Text: Codable, Sendable { var text: String }
    struct Join: Codable, Sendable { var nick: String }
    struct Members: Codable, Sendable {
        var room: String
        var topic: String
        var members: [String]
    }
    struct Event: Codable, Sendable {
        var kind: String
        var nick: String
        var text: String
    }

    func roomName(_ base: String) -> String { "\(base)-\(UUID().uuidString.prefix(6))" }

    func hostOnB(_ room: String) async throws -> ChatProcess {
        let host = try ChatProcess(onB: true, [chat, "host", room, "--nick", "hal"])
        try await host.waitForOutput("published on the network as \(room)")
        return host
    }

    /// A member written from the spec: joins `room` (found by discovery) as `nick`.
    func member(_ room: String, nick: String) async throws -> (MessageClient, Collector<ClientEvent>, ServiceDiscovery) {
        let discovery = ServiceDiscovery(logger: logger)
        var configuration = ClientConfiguration(peerName: nick)
        configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        let client = try await MessageClient.connect(
            to: .service(name: room, type: "_bonjour-chat._tcp", discovery: discovery), configuration: configuration,
            logger: logger)
        let events = Collector(client.events)
        try await client.send(Join(nick: nick), type: "chat.join")
        try await events.wait(timeout: .seconds(10), "welcome") { Self.isMessage($0, "chat.welcome") }
        return (client, events, discovery)
    }

    static func isMessage(_ event: ClientEvent, _ type: String) -> Bool {
        if case .received(let message) = event { return message.typeID == type }
        return false
    }

    /// `chat.members` is a request: the host answers with who is here, and a malformed one gets an
    /// error reply (it used to answer with a one-way message, and nothing at all to a bad one).
    @Test func membersIsARequestAnsweredWithAReplyOrAnError() async throws {
        let room = roomName("Who")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let (client, _, discovery) = try await member(room, nick: "asker")
        defer { Task { await discovery.shutdown() } }
        let members = try await client.request(Text(text: ""), type: "chat.members", expecting: Members.self, timeout: .seconds(5))
        #expect(members.room == room && members.members == ["hal", "asker"], "\(members)")
        do {
            _ = try await client.channel!.requestRaw(Array("not json".utf8), type: "chat.members", timeout: .seconds(5))
            Issue.record("a malformed chat.members got a reply")
        } catch let error as RemoteError {
            #expect(error.code == "bad_request", "\(error)")
        }
        await client.close()
    }

    /// A malformed one-way message is answered with a notice (and logged), not ignored in silence.
    @Test func aMalformedMessageGetsANoticeBack() async throws {
        let room = roomName("Garbled")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let (client, events, discovery) = try await member(room, nick: "garbler")
        defer { Task { await discovery.shutdown() } }
        try await client.channel!.sendRaw([0xff, 0xfe], type: "chat.say")
        let (event, _) = try await events.wait(timeout: .seconds(5), "a notice") { Self.isMessage($0, "chat.notice") }
        guard case .received(let message) = event else { return }
        let notice = try message.decode(Event.self)
        #expect(notice.text.contains("chat.say could not be read"), "\(notice.text)")
        await client.close()
    }

    /// The member's side of a malformed message: a notice on its terminal. A host written here (on
    /// loopback, found by --host) sends a welcome, then a chat.say that is not JSON.
    @Test func theMemberShowsANoticeForAMessageItCannotRead() async throws {
        var configuration = ServerConfiguration(serviceType: "_bonjour-chat._tcp", serviceName: "Fake", peerName: "Fake")
        configuration.publish = false
        configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
        try await server.start()
        let port = try #require(server.port)
        let pump = Task {
            for await event in server.events {
                guard case .received(let connection, let message) = event, message.typeID == "chat.join" else { continue }
                try? await connection.send(
                    Members(room: "Fake", topic: "", members: ["zed"]).welcome(nick: "curious"), type: "chat.welcome")
                try? await connection.channel.sendRaw(Array("{{not json".utf8), type: "chat.say")
            }
        }
        defer { pump.cancel() }
        // A data directory of its own: the fake host's key is new every run (trust on first use).
        let data = NSTemporaryDirectory() + "chat-fake-\(UUID().uuidString.prefix(8))"
        let member = try ChatProcess(
            onB: false, ["env", "XDG_DATA_HOME=\(data)", chat, "join", "--host", "127.0.0.1", "--port", "\(port)", "--nick", "curious"])
        defer { member.stop() }
        try await member.waitForOutput("joined Fake")
        let line = try await member.waitForOutput("cannot read")
        #expect(line.contains("chat.say"), "\(line)")
        await server.stop()
    }

    /// A pasted block with CR/LF inside one input line becomes several lines at the host, never glued.
    @Test func aPastedBlockArrivesAsSeveralLines() async throws {
        let room = roomName("Paste")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let member = try ChatProcess(onB: false, [chat, "join", room, "--nick", "paster"])
        defer { member.stop() }
        try await member.waitForOutput("joined")
        try member.send("first part\rsecond part")
        try await host.waitForOutput("<paster> second part")
        #expect(host.text.contains("<paster> first part"), "\(host.text)")
        #expect(!host.text.contains("first partsecond part"), "\(host.text)")
    }

    /// The host closes its room: members say so and exit 0, instead of looking for it to rejoin.
    @Test func aRoomClosedByItsHostEndsTheMemberCleanly() async throws {
        let room = roomName("Closing")
        let host = try await hostOnB(room)
        let member = try ChatProcess(onB: false, [chat, "join", room, "--nick", "stayer"])
        defer { member.stop() }
        try await member.waitForOutput("joined")
        host.deliver(signal: SIGTERM)
        try await member.waitForOutput("the host closed the room \(room)")
        #expect(await member.waitForExit(timeout: .seconds(10)) == 0, "\(member.text)")
        #expect(!member.text.contains("looking for the room to rejoin"), "\(member.text)")
        host.stop()
    }

    /// chat.bye is the end: the host closes the connection after it (it used to stay open).
    @Test func byeClosesTheConnectionOnBothSides() async throws {
        let room = roomName("Bye")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let (client, events, discovery) = try await member(room, nick: "leaver")
        defer { Task { await discovery.shutdown() } }
        try await client.send(Text(text: "bye now"), type: "chat.leave")
        try await events.wait(timeout: .seconds(5), "chat.bye") { Self.isMessage($0, "chat.bye") }
        let (event, _) = try await events.wait(timeout: .seconds(5), "disconnected") {
            if case .disconnected = $0 { true } else { false }
        }
        guard case .disconnected(let reason) = event else { return }
        #expect(reason == .goodbye("left the room"), "\(reason)")
        try await host.waitForOutput("leaver left")
        await client.close()
    }

    /// The member's side of its connection destroyed while no reset can reach the host (`ss -K`
    /// with the link down): when the member comes back on a new connection, the host says the old
    /// one dropped, then that the member is back (it used to say only "is back": the old connection
    /// stayed half-open, unnoticed, until the resume replaced it).
    @Test func aConnectionKilledOnTheMembersSideIsNoticedByTheHost() async throws {
        let room = roomName("Killed")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let hosting = try await host.waitForOutput("on port ")
        let port = try #require(hosting.components(separatedBy: "on port ").last?.prefix { $0.isNumber })
        let member = try ChatProcess(onB: false, [chat, "join", room, "--nick", "ghost"])
        defer { member.stop() }
        try await host.waitForOutput("ghost joined")
        try Harness.control("link-down", host: "a")
        var linkUp = false
        defer { if !linkUp { try? Harness.control("link-up", host: "a") } }
        // Every connection to the room's port, IPv4 or IPv6 (Happy Eyeballs may have picked either).
        let result = try Harness.run(["ss", "-K", "dport", "=", ":\(port)"])
        #expect(result.output.contains(":\(port)"), "ss killed nothing: \(result.output)")
        try await member.waitForOutput("lost the connection to the host of \(room)")
        try Harness.control("link-up", host: "a")
        linkUp = true
        let back = ContinuousClock.now
        try await host.waitForOutput("ghost is back", timeout: .seconds(15))
        let lines = host.lines
        let dropped = try #require(lines.firstIndex { $0.contains("ghost's connection dropped") }, "\(host.text)")
        let returned = try #require(lines.firstIndex { $0.contains("ghost is back") })
        #expect(dropped < returned, "\(host.text)")
        Harness.measured("chat: link back → the host says the member's old connection dropped and it is back", ContinuousClock.now - back)
        try member.send("still here")
        try await host.waitForOutput("<ghost> still here")
    }
}

extension ChatEdgeIntegrationTests.Members {
    struct Welcome: Codable, Sendable {
        var room: String
        var nick: String
        var requested: String
        var topic: String
        var members: [String]
    }
    func welcome(nick: String) -> Welcome {
        Welcome(room: room, nick: nick, requested: nick, topic: topic, members: members + [nick])
    }
}
