import ChatKit
import Foundation
@testable import Messaging
@testable import ProtocolCore
import Testing

/// docs/PROTOCOL.md's bonjour-chat example, produced from the code: the hellos come from the hello
/// state machine, every chat payload from ChatKit's ``Room`` (the host's logic, with fixed times)
/// encoded by the library's message codec, the SESSION frames from the session types, and each
/// frame's bytes from ``Frame``. The spec must contain the rendered table and hex lines as they are.
@Suite struct ChatExampleTests {
    static let sessionID = "8c2f0e4a9b1d47e3a6f5c0d9e8b7a612"
    /// The host's token of the session's epoch (random in a real run).
    static let epoch = "51d0c3e97a2b4f86c1e0d7a9b3f5e248"

    /// One side's frames, numbered as that side sends them.
    struct Side {
        var sequence: UInt64 = 0
        mutating func next(_ frame: Frame) -> Frame {
            sequence += 1
            var frame = frame
            frame.sequence = sequence
            return frame
        }
    }

    @Test func theSpecsChatExampleIsWhatTheCodeSends() throws {
        let configuration = ClientConfiguration(peerName: "alice").channel  // what bonjour-chat's client and host use
        let codec = configuration.codecs.sendCodec
        let maxFrame = configuration.connection.maxFrameSize
        var client = Side()
        var host = Side()
        var rows: [SpecRow] = []
        var notes: [Int: String] = [:]
        func row(_ fromClient: Bool, _ frame: Frame) {
            let numbered = fromClient ? client.next(frame) : host.next(frame)
            rows.append(SpecRow(number: rows.count + 1, direction: fromClient ? "C→H" : "H→C", frame: numbered))
        }
        func message<T: Encodable>(_ value: T, _ type: String) throws -> Frame {
            Frame(kind: .message, codecID: codec.id, typeID: type, payload: try codec.encode(value))
        }
        /// The host's messages to the joining member (id 2), as frames; the others' noted.
        func toMember(_ deliveries: [Room.Delivery]) throws {
            for delivery in deliveries {
                switch delivery {
                case .to(2, let value), .everyone(let value): row(false, try hostFrame(value))
                case .everyoneBut(let id, let value) where id != 2: row(false, try hostFrame(value))
                case .everyoneBut(_, let value):
                    notes[rows.count] = "(the other members receive `\(value.typeID)` `\(String(decoding: try hostFrame(value).payload, as: UTF8.self))`)"
                case .to: break
                }
            }
        }
        func hostFrame(_ value: HostMessage) throws -> Frame {
            switch value {
            case .welcome(let welcome): try message(welcome, value.typeID)
            case .history(let history): try message(history, value.typeID)
            case .members(let members): try message(members, value.typeID)
            case .event(let event): try message(event, value.typeID)
            case .bye(let text), .closed(let text): try message(TextPayload(text), value.typeID)
            }
        }

        // Bob hosts Lobby; alice (member 1) is in; one earlier message.
        var room = Room(name: "Lobby", topic: "Friday plans")
        _ = room.handle(.join(nick: "bob"), from: Room.localID, at: 1_718_031_600)
        _ = room.handle(.join(nick: "alice"), from: 1, at: 1_718_031_650)
        _ = room.handle(.say("pizza at 7?"), from: Room.localID, at: 1_718_031_700.5)

        // The hello, with the session offer both programs make (version 1: readable).
        var clientInfo = PeerInfo(version: 1, name: "alice", metadata: [:])
        clientInfo.sessions = true
        var hostInfo = PeerInfo(version: 1, name: "Lobby", metadata: [:])
        hostInfo.sessions = true
        var clientHello = HandshakeStateMachine(role: .client, settings: .init(info: clientInfo, maxFrameSize: maxFrame))
        var hostHello = HandshakeStateMachine(role: .server, settings: .init(info: hostInfo, maxFrameSize: maxFrame))
        let hello = try #require(clientHello.start().frames.first)
        row(true, hello)
        row(false, try #require(hostHello.receive(hello).frames.first))
        // The message session: the client's SESSION first, the host's answer, then the host's first PING.
        row(true, HandshakeStateMachine.jsonFrame(.session, SessionHello(id: Self.sessionID, received: 0, sent: 0)))
        row(false, HandshakeStateMachine.jsonFrame(.session, SessionHello(id: Self.sessionID, received: 0, resumed: false, epoch: Self.epoch, sent: 0)))
        row(false, Frame(kind: .ping))
        row(true, Frame(kind: .pong, reference: rows.last!.frame.sequence))

        // Join, asking for a nick that is taken.
        row(true, try message(JoinRequest(nick: "alice"), ChatType.join))
        try toMember(room.handle(.join(nick: "alice"), from: 2, at: 1_718_031_787.25))
        row(true, .ack(3))  // welcome, history, notice
        // A pasted block of two lines: two lines in the room.
        row(true, try message(TextPayload("hi all\nsee you at 7"), ChatType.say))
        try toMember(room.handle(.say("hi all\nsee you at 7"), from: 2, at: 1_718_031_790.1))
        row(false, .ack(2))  // chat.join, chat.say
        row(true, try message(TextPayload("waves"), ChatType.me))
        try toMember(room.handle(.me("waves"), from: 2, at: 1_718_031_791.3))
        row(true, try message(TextPayload("carol"), ChatType.nick))
        try toMember(room.handle(.nick("carol"), from: 2, at: 1_718_031_795.75))
        row(true, try message(TextPayload("Friday: pizza at 7"), ChatType.topic))
        try toMember(room.handle(.topic("Friday: pizza at 7"), from: 2, at: 1_718_031_799.4))
        // Who is here: a request, answered with a reply.
        var who = try message(TextPayload(), ChatType.members)
        who.expectsReply = true
        row(true, who)
        var members = try message(room.membersInfo, ChatType.members)
        members.reference = rows.last!.frame.sequence
        row(false, members)
        // Leaving: chat.bye, then the host closes the connection.
        row(true, try message(TextPayload("bye"), ChatType.leave))
        try toMember(room.handle(.leave("bye"), from: 2, at: 1_718_031_802))
        row(false, Frame(kind: .goodbye, payload: Array("left the room".utf8)))

        let table = SpecRow.table(rows, notes: notes)
        let spec = try String(contentsOfFile: specPath(), encoding: .utf8)
        #expect(spec.contains(table), "docs/PROTOCOL.md's chat example differs from what the code sends; it should read:\n\(table)")
        for index in [6, 21] {  // chat.join and the chat.members request, in full
            let hex = try rows[index].frame.hex
            #expect(spec.contains(hex), "the spec lacks the hex of row \(index + 1), \(rows[index].frame.typeID):\n\(hex)")
        }
        #expect(rows[21].frame.expectsReply && rows[22].frame.reference == rows[21].frame.sequence)
        // The pasted block became two lines.
        #expect(rows.filter { $0.direction == "H→C" && $0.frame.typeID == ChatType.say }.count == 2)
    }
}
