import ChatKit
import Testing

@Suite struct RoomTests {
    func messages(_ deliveries: [Room.Delivery], to id: MemberID, members: [MemberID]) -> [HostMessage] {
        deliveries.compactMap { delivery in
            switch delivery {
            case .to(let target, let message): target == id ? message : nil
            case .everyone(let message): members.contains(id) ? message : nil
            case .everyoneBut(let other, let message): other != id && members.contains(id) ? message : nil
            }
        }
    }

    @Test func joinWelcomesAndTellsTheOthers() {
        var room = Room(name: "Lobby", topic: "plans")
        _ = room.handle(.join(nick: "alice"), from: 1, at: 10)
        let out = room.handle(.join(nick: "bob"), from: 2, at: 11)
        #expect(
            out.contains(
                .to(
                    2,
                    .welcome(
                        Welcome(
                            room: "Lobby", nick: "bob", requested: "bob", topic: "plans", members: ["alice", "bob"])))))
        #expect(out.contains(.everyoneBut(2, .event(RoomEvent(.join, time: 11, nick: "bob")))))
        #expect(room.txt == ["topic": "plans", "members": "2"])
    }

    @Test func duplicateNickIsRenamedAndTold() {
        var room = Room(name: "Lobby")
        _ = room.handle(.join(nick: "sam"), from: 1, at: 1)
        let out = room.handle(.join(nick: "SAM"), from: 2, at: 2)
        guard case .to(2, .welcome(let welcome)) = out.first else {
            Issue.record("no welcome first: \(out)")
            return
        }
        #expect(welcome.nick == "SAM_2" && welcome.requested == "SAM" && welcome.renamed)
        #expect(
            out.contains {
                if case .to(2, .event(let event)) = $0 {
                    event.kind == .notice && event.text.contains("taken") && event.text.contains("SAM_2")
                } else {
                    false
                }
            })
        let third = room.handle(.join(nick: "sam"), from: 3, at: 3)
        guard case .to(3, .welcome(let again)) = third.first else { return }
        #expect(again.nick == "sam_3")
        #expect(room.nicks == ["sam", "SAM_2", "sam_3"])
    }

    @Test(arguments: [
        ("alice", [String](), "alice"),
        ("alice", ["alice"], "alice_2"),
        ("alice", ["alice", "alice_2", "ALICE_3"], "alice_4"),
        (
            String(repeating: "x", count: 32), [String(repeating: "x", count: 32)],
            String(repeating: "x", count: 30) + "_2"
        ),
    ])
    func uniqueNick(requested: String, taken: [String], expected: String) {
        #expect(Room.uniqueNick(requested, taken: taken) == expected)
    }

    @Test func nickSanitizing() {
        #expect(Room.sanitizeNick("  bob smith ") == "bob_smith")
        #expect(Room.sanitizeNick("\u{1B}[31mred") == "[31mred")
        #expect(Room.sanitizeNick("   ") == nil)
        #expect(Room.sanitizeNick(String(repeating: "n", count: 50))?.count == Room.maxNickLength)
    }

    @Test func nickChangeToTakenNickIsRefused() {
        var room = Room(name: "Lobby")
        _ = room.handle(.join(nick: "alice"), from: 1, at: 1)
        _ = room.handle(.join(nick: "bob"), from: 2, at: 2)
        let refused = room.handle(.nick("Alice"), from: 2, at: 3)
        #expect(refused.count == 1)
        if case .to(2, .event(let event)) = refused.first {
            #expect(event.kind == .notice)
        } else {
            Issue.record("\(refused)")
        }
        let changed = room.handle(.nick("robert"), from: 2, at: 4)
        #expect(changed == [.everyone(.event(RoomEvent(.nick, time: 4, nick: "bob", text: "robert")))])
        #expect(room.nicks == ["alice", "robert"])
    }

    @Test func historyKeepsTheLast50MessagesAndLateJoinersGetThem() {
        var room = Room(name: "Lobby")
        _ = room.handle(.join(nick: "alice"), from: 1, at: 0)
        for index in 1...60 { _ = room.handle(.say("line \(index)"), from: 1, at: Double(index)) }
        _ = room.handle(.me("waves"), from: 1, at: 61)
        #expect(room.history.count == Room.historyLimit)
        #expect(room.history.first?.text == "line 12")
        #expect(room.history.last == RoomEvent(.me, time: 61, nick: "alice", text: "waves"))
        let out = room.handle(.join(nick: "late"), from: 2, at: 62)
        #expect(out.contains(.to(2, .history(History(events: room.history)))))
    }

    @Test func leaveAndDisconnectAreNoticed() {
        var room = Room(name: "Lobby")
        _ = room.handle(.join(nick: "alice"), from: 1, at: 0)
        _ = room.handle(.join(nick: "bob"), from: 2, at: 0)
        let left = room.handle(.leave(""), from: 2, at: 5)
        #expect(left == [.everyoneBut(2, .event(RoomEvent(.leave, time: 5, nick: "bob"))), .to(2, .bye("see you"))])
        let lost = room.disconnected(1, at: 6)
        #expect(lost == [.everyone(.event(RoomEvent(.leave, time: 6, nick: "alice", text: "connection lost")))])
        #expect(room.disconnected(1, at: 7).isEmpty)
        #expect(room.txt["members"] == "0")
    }

    @Test func requestsBeforeJoiningAreRefused() {
        var room = Room(name: "Lobby")
        let out = room.handle(.say("hi"), from: 9, at: 0)
        #expect(out.count == 1)
        #expect(room.history.isEmpty)
    }

    @Test func topicIsCleanedClampedAndInTXT() {
        var room = Room(name: "Lobby")
        _ = room.handle(.join(nick: "alice"), from: 1, at: 0)
        _ = room.handle(.topic("new\u{1B}[2J topic " + String(repeating: "é", count: 200)), from: 1, at: 1)
        #expect(!room.topic.contains("\u{1B}"))
        #expect(room.topic.utf8.count <= Room.maxTopicBytes)
        #expect(room.txt["topic"] == room.topic)
        let who = room.handle(.members, from: 1, at: 2)
        #expect(who == [.to(1, .members(MembersInfo(room: "Lobby", topic: room.topic, members: ["alice"])))])
    }
}

@Suite struct FormattingTests {
    let plain = ChatFormatter(color: false, utc: true)
    // 2023-11-14 14:03:07 UTC
    let time = 1_699_970_587.4

    @Test func lines() {
        #expect(plain.line(RoomEvent(.say, time: time, nick: "alice", text: "hello")) == "[14:03:07] <alice> hello")
        #expect(plain.line(RoomEvent(.me, time: time, nick: "alice", text: "waves")) == "[14:03:07] * alice waves")
        #expect(plain.line(RoomEvent(.join, time: time, nick: "alice")) == "[14:03:07] -!- alice joined")
        #expect(plain.line(RoomEvent(.leave, time: time, nick: "bob")) == "[14:03:07] -!- bob left")
        #expect(
            plain.line(RoomEvent(.leave, time: time, nick: "bob", text: "connection lost"))
                == "[14:03:07] -!- bob left (connection lost)")
        #expect(
            plain.line(RoomEvent(.nick, time: time, nick: "bob", text: "rob"))
                == "[14:03:07] -!- bob is now known as rob")
        #expect(
            plain.line(RoomEvent(.topic, time: time, nick: "bob", text: "news"))
                == "[14:03:07] -!- bob set the topic: news")
        #expect(plain.line(RoomEvent(.notice, time: time, text: "hi")) == "[14:03:07] -!- hi")
    }

    @Test func escapesNeverReachTheTerminal() {
        let line = plain.line(RoomEvent(.say, time: time, nick: "eve\u{1B}[2J", text: "x\u{1B}]0;pwned\u{07}y\r"))
        #expect(!line.unicodeScalars.contains { $0.value < 0x20 })
    }

    @Test func colourOnlyWhenAsked() {
        let colored = ChatFormatter(color: true, utc: true)
        #expect(colored.line(RoomEvent(.say, time: time, nick: "alice", text: "hello")).contains("\u{1B}["))
        #expect(!plain.notice("x", at: time).contains("\u{1B}"))
        #expect(shouldUseColor(isTerminal: true, environment: [:]))
        #expect(!shouldUseColor(isTerminal: false, environment: [:]))
        #expect(!shouldUseColor(isTerminal: true, environment: ["NO_COLOR": "1"]))
        #expect(!shouldUseColor(isTerminal: true, environment: ["NO_COLOR": ""]))
    }

    @Test func participantFollowsTheRoom() {
        var me = Participant(nick: "bob", room: "?", formatter: plain)
        let welcome = me.receive(
            .welcome(Welcome(room: "Lobby", nick: "bob_2", requested: "bob", topic: "t", members: ["bob", "bob_2"])),
            at: time)
        #expect(welcome == ["[14:03:07] -!- you joined Lobby as bob_2 — topic: t — 2 here: bob, bob_2"])
        #expect(me.joined && me.nick == "bob_2" && me.prompt == "[Lobby] bob_2> ")
        let history = me.receive(
            .history(History(events: [RoomEvent(.say, time: time - 60, nick: "bob", text: "earlier")])), at: time)
        #expect(history == ["[14:03:07] -!- last 1 message:", "[14:02:07] <bob> earlier"])
        _ = me.receive(.event(RoomEvent(.nick, time: time, nick: "bob_2", text: "robert")), at: time)
        #expect(me.nick == "robert" && me.members == ["bob", "robert"])
        _ = me.receive(.event(RoomEvent(.leave, time: time, nick: "bob")), at: time)
        #expect(me.members == ["robert"])
        // A rejoin does not replay history already shown.
        me.connectionLost()
        #expect(!me.joined)
        let rejoin = me.receive(
            .welcome(Welcome(room: "Lobby", nick: "robert", requested: "robert", topic: "t", members: ["robert"])),
            at: time + 5)
        #expect(rejoin.first?.contains("rejoined Lobby") == true)
        #expect(
            me.receive(
                .history(History(events: [RoomEvent(.say, time: time - 60, nick: "bob", text: "earlier")])),
                at: time + 5
            ).isEmpty)
    }
}

@Suite struct CommandTests {
    @Test(arguments: [
        ("hello", ChatCommand.say("hello")),
        ("  hello there  ", .say("hello there")),
        ("", .empty),
        ("   ", .empty),
        ("//etc/passwd", .say("/etc/passwd")),
        ("/me waves", .me("waves")),
        ("/me", .usage("/me ACTION")),
        ("/nick  bob ", .nick("bob")),
        ("/nick", .usage("/nick NEW")),
        ("/topic", .topic(nil)),
        ("/topic Friday plans", .topic("Friday plans")),
        ("/who", .who),
        ("/WHO", .who),
        ("/names", .who),
        ("/rooms", .rooms),
        ("/help", .help),
        ("/quit", .quit("")),
        ("/quit bye all", .quit("bye all")),
        ("/frobnicate x", .unknown("frobnicate")),
    ])
    func parse(line: String, expected: ChatCommand) {
        #expect(ChatCommand.parse(line) == expected)
    }
}

@Suite struct LineEditorTests {
    @Test func typingEditingAndSubmitting() {
        var editor = LineEditor()
        _ = editor.feed(Array("helo".utf8))
        _ = editor.feed([0x1B, UInt8(ascii: "["), UInt8(ascii: "D")])  // ←
        _ = editor.feed(Array("l".utf8))
        #expect(editor.text == "hello" && editor.cursor == 4)
        _ = editor.feed([0x05])  // Ctrl-E
        _ = editor.feed(Array(" wörld".utf8))
        #expect(editor.text == "hello wörld")
        _ = editor.feed([0x7F])
        #expect(editor.text == "hello wörl")
        _ = editor.feed([0x17])  // Ctrl-W
        #expect(editor.text == "hello ")
        #expect(editor.feed([0x0D]) == [.submit("hello ")])
        #expect(editor.text.isEmpty && editor.cursor == 0)
    }

    @Test func controlKeys() {
        var editor = LineEditor()
        #expect(editor.feed([0x04]) == [.endOfInput])
        _ = editor.feed(Array("abc".utf8))
        #expect(editor.feed([0x04]).isEmpty)  // Ctrl-D with text at the end: nothing to delete
        _ = editor.feed([0x01])
        _ = editor.feed([0x1B, UInt8(ascii: "["), UInt8(ascii: "3"), UInt8(ascii: "~")])  // Delete
        #expect(editor.text == "bc")
        _ = editor.feed([0x05, 0x15])
        #expect(editor.text.isEmpty)
        #expect(editor.feed([0x03]) == [.interrupt])
    }

    @Test func printAboveKeepsTheTypedLine() {
        var editor = LineEditor()
        _ = editor.feed(Array("hello wor".utf8))
        let out = editor.printAbove("[14:00:00] <bob> hi", prompt: "> ")
        #expect(out == "\r\u{1B}[2K[14:00:00] <bob> hi\r\n\r\u{1B}[2K> hello wor")
        _ = editor.feed([0x1B, UInt8(ascii: "["), UInt8(ascii: "D")])
        #expect(editor.render(prompt: "> ").hasSuffix("hello wor\u{1B}[1D"))
    }

    @Test func aLongLineScrollsSidewaysInsteadOfWrapping() {
        var editor = LineEditor()
        _ = editor.feed(Array(String(repeating: "a", count: 50).utf8) + Array(String(repeating: "b", count: 50).utf8))
        let out = editor.render(prompt: "> ", width: 40)
        let shown = out.replacingOccurrences(of: "\r\u{1B}[2K> ", with: "")
        #expect(shown.count == 37 && shown.allSatisfy { $0 == "b" }, "\(out.debugDescription)")
        _ = editor.feed([0x01])  // Home: the start is shown
        let home = editor.render(prompt: "> ", width: 40)
        #expect(
            home.hasPrefix("\r\u{1B}[2K> " + String(repeating: "a", count: 37)) && home.hasSuffix("\u{1B}[37D"),
            "\(home.debugDescription)")
    }
}

/// What a careful user met in the first hour (issue 27, items 11 and 12), at the room's level.
@Suite struct RoomEdgeTests {
    static func notices(_ deliveries: [Room.Delivery]) -> [String] {
        deliveries.compactMap { delivery in
            if case .to(_, .event(let event)) = delivery, event.kind == .notice { return event.text }
            return nil
        }
    }

    /// A refused nick says which nick, why, and which nick is kept.
    @Test func aRefusedNickSaysWhichWhyAndWhatWasKept() {
        var room = Room(name: "Lobby")
        _ = room.handle(.join(nick: "alice"), from: 1, at: 1)
        _ = room.handle(.join(nick: "bob"), from: 2, at: 2)
        let empty = Self.notices(room.handle(.nick(" \u{07} "), from: 1, at: 3))
        #expect(empty.count == 1)
        #expect(empty.first?.contains("cannot be a nick") == true, "\(empty)")
        #expect(empty.first?.contains("you are still alice") == true, "\(empty)")
        #expect(empty.first?.contains("no spaces") == false, "spaces are allowed (they become _): \(empty)")
        let long = String(repeating: "x", count: 40)
        let tooLong = Self.notices(room.handle(.nick(long), from: 1, at: 4))
        #expect(tooLong.first?.contains("'\(long)'") == true && tooLong.first?.contains("40 characters") == true, "\(tooLong)")
        #expect(tooLong.first?.contains("you are still alice") == true)
        #expect(room.nick(of: 1) == "alice")  // not silently cut to 32 characters
        let taken = Self.notices(room.handle(.nick("BOB"), from: 1, at: 5))
        #expect(taken.first?.contains("BOB") == true && taken.first?.contains("you are still alice") == true, "\(taken)")
        // Spaces are allowed: they become underscores.
        _ = room.handle(.nick("alice smith"), from: 1, at: 6)
        #expect(room.nick(of: 1) == "alice_smith")
    }

    /// A pasted block is several messages, never words glued together.
    @Test func severalLinesInOneMessageAreSeveralMessages() {
        var room = Room(name: "Lobby")
        _ = room.handle(.join(nick: "alice"), from: 1, at: 1)
        let out = room.handle(.say("first line\r\nsecond line\rthird\n\nfourth"), from: 1, at: 2)
        let texts: [String] = out.compactMap { delivery in
            if case .everyone(.event(let event)) = delivery, event.kind == .say { return event.text }
            return nil
        }
        #expect(texts == ["first line", "second line", "third", "fourth"])
        #expect(room.history.map(\.text) == texts)
        // A topic with a line break becomes one line, with a space where the break was.
        _ = room.handle(.topic("Friday\nplans"), from: 1, at: 3)
        #expect(room.topic == "Friday plans")
        #expect(Room.lines(of: "a\r\nb") == ["a", "b"])
    }

    /// Every bidirectional formatting character is removed, the marks ALM, LRM and RLM included
    /// (as in preview's file names; they used to pass).
    @Test func bidirectionalControlsAreRemoved() {
        for scalar: UInt32 in [0x061C, 0x200E, 0x200F, 0x202A, 0x202E, 0x2066, 0x2069] {
            let text = "a" + String(Character(Unicode.Scalar(scalar)!)) + "b"
            #expect(Room.clean(text) == "ab", "U+\(String(scalar, radix: 16))")
        }
        #expect(Room.clean("\u{200D}") == "\u{200D}")  // a joiner (emoji sequences) stays
    }

    /// The closing message ends a member's stay: a notice, and not joined any more.
    @Test func aClosedRoomIsAnnouncedToTheParticipant() {
        var me = Participant(nick: "alice", room: "Lobby", formatter: ChatFormatter(color: false))
        _ = me.receive(.welcome(Welcome(room: "Lobby", nick: "alice", requested: "alice", topic: "", members: ["alice"])), at: 1)
        let lines = me.receive(.closed("the host closed the room Lobby"), at: 2)
        #expect(lines.count == 1 && lines[0].contains("the host closed the room Lobby"))
        #expect(!me.joined)
    }
}
