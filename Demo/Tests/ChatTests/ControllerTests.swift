import ChatKit
import Testing

/// `bonjour-chat join`'s decisions, without a network or a terminal.
@Suite struct JoinControllerTests {
    let formatter = ChatFormatter(color: false, utc: true)
    let welcome = HostMessage.welcome(Welcome(room: "Lobby", nick: "ann", requested: "ann", topic: "", members: ["host", "ann"]))

    func controller(rejoin: Double = 10, interactive: Bool = true) -> JoinController {
        JoinController(nick: "ann", room: "Lobby", formatter: formatter, rejoinTimeout: rejoin, interactive: interactive)
    }

    /// The lines among the effects.
    func lines(_ effects: [JoinController.Effect]) -> [String] {
        effects.flatMap { effect -> [String] in if case .show(let lines) = effect { lines } else { [] } }
    }

    /// Connected and welcomed.
    func joined(rejoin: Double = 10, interactive: Bool = true) -> JoinController {
        var join = controller(rejoin: rejoin, interactive: interactive)
        #expect(join.handle(.connected(resumed: false, via: nil), at: 1) == [.describeHost, .join(nick: "ann")])
        _ = join.handle(.received(welcome), at: 2)
        #expect(join.me.joined)
        return join
    }

    @Test func linesTypedAwayWaitAndGoOutInOrderOnceWelcomed() {
        var join = controller()
        _ = join.handle(.connected(resumed: false, via: nil), at: 1)
        #expect(join.handle(.line("one\ntwo"), at: 1).isEmpty)  // not welcomed yet: kept
        #expect(join.pending == [.say("one"), .say("two")])
        let effects = join.handle(.received(welcome), at: 2)
        #expect(effects.last == .send([.say("one"), .say("two")]))
        // One went through before the connection failed: the other waits for the next welcome.
        #expect(join.sent(1).isEmpty)
        #expect(join.pending == [.say("two")])
        // A new line does not overtake it.
        #expect(join.handle(.line("three"), at: 3).isEmpty)
        #expect(join.pending == [.say("two"), .say("three")])
    }

    @Test func aLineInTheRoomIsSentAtOnce() {
        var join = joined()
        #expect(join.handle(.line("/me waves"), at: 3) == [.send([.me("waves")])])
        #expect(join.sent(1).isEmpty)
        #expect(join.pending.isEmpty)
    }

    @Test func aPastedBlockGoesOutLineByLineInOrder() {
        var join = joined()
        #expect(join.handle(.line("first\rsecond\r\nthird"), at: 3) == [.send([.say("first")])])
        // The rest follows once the first went (not at the next welcome).
        #expect(join.sent(1) == [.send([.say("second"), .say("third")])])
        #expect(join.sent(2).isEmpty)
        #expect(join.pending.isEmpty)
    }

    @Test func keepsAtMostTheLimitWhileAway() {
        var join = controller()
        for index in 0..<JoinController.pendingLimit { _ = join.handle(.line("line \(index)"), at: 1) }
        let effects = join.handle(.line("one too many"), at: 1)
        #expect(lines(effects) == ["[00:00:01] -!- not connected and too much waiting to be sent; dropped"])
        #expect(join.pending.count == JoinController.pendingLimit)
    }

    @Test func aLostConnectionStartsTheRejoinDeadlineAndOnlyTheLatestCounts() {
        var join = joined(rejoin: 2.5)
        let lost = join.handle(.disconnected(reason: "reset"), at: 5)
        #expect(!join.me.joined)
        guard case .startRejoinTimer(let first, after: 2.5) = lost.last else {
            Issue.record("no rejoin timer: \(lost)")
            return
        }
        #expect(lines(lost) == ["[00:00:05] -!- lost the connection to the host of Lobby (reset); looking for the room to rejoin for 2.5 s"])
        // Back and lost again: the first deadline is stale.
        _ = join.handle(.connected(resumed: false, via: "10.0.0.2"), at: 6)
        _ = join.handle(.line("meanwhile"), at: 6)
        let again = join.handle(.disconnected(reason: "reset"), at: 7)
        #expect(join.handle(.rejoinDeadline(first, unacknowledged: []), at: 8).isEmpty)
        guard case .startRejoinTimer(let second, _) = again.last else {
            Issue.record("no second timer: \(again)")
            return
        }
        let deadline = join.handle(.rejoinDeadline(second, unacknowledged: [.say("in flight")]), at: 9)
        #expect(deadline.suffix(2) == [.close, .exit(.connectionLost)])
        #expect(
            lines(deadline) == [
                "[00:00:09] -!- could not rejoin Lobby within 2.5 s; giving up",
                "[00:00:09] -!- 2 lines were not delivered to Lobby (the host never confirmed them): \"in flight\", \"meanwhile\"",
            ])
    }

    @Test func withoutRejoiningALossEndsTheProgram() {
        var join = joined(rejoin: 0)
        #expect(join.handle(.disconnected(reason: "reset"), at: 5).suffix(2) == [.close, .exit(.connectionLost)])
    }

    @Test func aResumedSessionKeepsTheMemberInTheRoom() {
        var join = joined()
        _ = join.handle(.disconnected(reason: "reset"), at: 5)
        _ = join.handle(.line("while away"), at: 5)
        let back = join.handle(.connected(resumed: true, via: "eth1"), at: 6)
        #expect(join.me.joined)
        #expect(lines(back) == ["[00:00:06] -!- back in Lobby via eth1; nothing was lost"])
        #expect(back.last == .send([.say("while away")]))
        #expect(!back.contains(.join(nick: "ann")))  // no second chat.join
    }

    @Test func quittingSendsLeaveAndTheByeOrItsTimeoutEnds() {
        var join = joined()
        #expect(join.handle(.line("/quit lunch"), at: 3) == [.leave("lunch")])
        #expect(join.leaving)
        #expect(join.handle(.line("ignored"), at: 3).isEmpty)
        #expect(join.leaveSent(true) == [.startByeTimer])
        #expect(join.handle(.received(.bye("bye")), at: 4).suffix(2) == [.close, .exit(.left)])
        var other = joined()
        _ = other.handle(.interrupt, at: 3)
        #expect(other.leaveSent(true) == [.startByeTimer])
        #expect(other.handle(.byeTimeout, at: 6) == [.close, .exit(.left)])
        // A leave that cannot be sent ends at once.
        var third = joined()
        _ = third.handle(.line("/quit"), at: 3)
        #expect(third.leaveSent(false) == [.close, .exit(.left)])
    }

    @Test func quittingBeforeJoiningJustEnds() {
        var join = controller()
        #expect(join.handle(.line("/quit"), at: 1) == [.close, .exit(.left)])
    }

    @Test func aScriptLeavesOnceWhatItTypedWentOut() {
        var join = controller(interactive: false)
        _ = join.handle(.connected(resumed: false, via: nil), at: 1)
        _ = join.handle(.line("hello"), at: 1)
        #expect(join.handle(.endOfInput, at: 1).isEmpty)  // not in the room yet
        let welcomed = join.handle(.received(welcome), at: 2)
        #expect(welcomed.last == .send([.say("hello")]))
        #expect(join.sent(1) == [.leave("")])
        // Interactive: Ctrl-D leaves at once.
        var typed = joined()
        #expect(typed.handle(.endOfInput, at: 3) == [.leave("")])
    }

    @Test func aClosedRoomReportsWhatNeverArrived() {
        var join = joined()
        _ = join.handle(.disconnected(reason: "reset"), at: 3)
        _ = join.handle(.line("late"), at: 3)
        let closed = join.handle(.received(.closed("")), at: 4)
        #expect(closed.suffix(2) == [.close, .exit(.left)])
        #expect(lines(closed).last == "[00:00:04] -!- 1 line was not delivered to Lobby (the host never confirmed them): \"late\"")
    }

    @Test func commandsThatNeedTheRoomSaySo() {
        var join = controller()
        #expect(lines(join.handle(.line("/who"), at: 1)) == ["[00:00:01] -!- not in the room right now (Lobby); /who works once rejoined"])
        var inside = joined()
        #expect(inside.handle(.line("/who"), at: 3) == [.askWho])
        #expect(inside.handle(.line("/rooms\n/help\n/fingerprint\n/trust forget Lobby"), at: 3)
            == [.listRooms, .showHelp, .showFingerprints, .showTrust(forget: "Lobby")])
        #expect(lines(inside.handle(.line("/bogus"), at: 3)).first?.contains("unknown command /bogus") == true)
    }

    @Test func aGaveUpClientEndsWithWhatWasPending() {
        var join = controller()
        _ = join.handle(.line("never"), at: 1)
        let effects = join.handle(.gaveUp("no route"), at: 2)
        #expect(effects.last == .exit(.connectionLost))
        #expect(lines(effects).count == 2)
    }
}

/// `bonjour-chat host`'s decisions, without a network or a terminal.
@Suite struct HostControllerTests {
    let formatter = ChatFormatter(color: false, utc: true)

    func host(interactive: Bool = true) -> HostController {
        let host = HostController(room: "Lobby", topic: "plans", nick: "hal", formatter: formatter, interactive: interactive, at: 1)
        let first = host.opening
        #expect(host.txt == ["topic": "plans", "members": "1"])
        #expect(first.contains { if case .show = $0 { true } else { false } })
        #expect(!first.contains { if case .send = $0 { true } else { false } })  // nobody else here
        return host
    }

    @Test func aMembersJoinIsWelcomedToldToTheOthersAndRepublished() {
        var host = host()
        let ann = host.handle(.request(.join(nick: "ann"), from: 7, expectsReply: false), at: 2)
        #expect(
            ann.contains(
                .send(.welcome(Welcome(room: "Lobby", nick: "ann", requested: "ann", topic: "plans", members: ["hal", "ann"])), to: [7])))
        #expect(ann.contains(.show(["[00:00:02] -!- ann joined"])))  // the host's own view
        #expect(ann.last == .updateTXT(["topic": "plans", "members": "2"]))
        let bob = host.handle(.request(.join(nick: "bob"), from: 8, expectsReply: false), at: 3)
        #expect(bob.contains(.send(.event(RoomEvent(.join, time: 3, nick: "bob")), to: [7])))
        // A line: everyone (the sender sees it confirmed), and the host's terminal.
        let said = host.handle(.request(.say("hi"), from: 7, expectsReply: false), at: 4)
        #expect(said.contains(.send(.event(RoomEvent(.say, time: 4, nick: "ann", text: "hi")), to: [7, 8])))
        #expect(!said.contains { if case .updateTXT = $0 { true } else { false } })  // nothing changed
    }

    @Test func membersIsAnsweredOnlyForMembers() {
        var host = host()
        #expect(
            host.handle(.request(.members, from: 9, expectsReply: true), at: 2)
                == [.replyError(code: ChatErrorCode.notJoined, message: "join the room first (chat.join)")])
        _ = host.handle(.request(.join(nick: "ann"), from: 9, expectsReply: false), at: 2)
        #expect(
            host.handle(.request(.members, from: 9, expectsReply: true), at: 3)
                == [.replyMembers(MembersInfo(room: "Lobby", topic: "plans", members: ["hal", "ann"]))])
    }

    @Test func unreadableMessagesAreAnsweredToTheirSender() {
        var host = host()
        #expect(
            host.handle(.unknownMessage(type: "chat.future", expectsReply: true), at: 2)
                == [.replyError(code: ChatErrorCode.unknownType, message: "this host does not know 'chat.future'")])
        #expect(host.handle(.unknownMessage(type: "chat.future", expectsReply: false), at: 2).isEmpty)
        #expect(
            host.handle(.malformed(type: "chat.say", error: "bad JSON", from: 3, expectsReply: false), at: 2)
                == [.send(.event(RoomEvent(.notice, time: 2, text: "your chat.say could not be read by the host: bad JSON")), to: [3])])
    }

    @Test func aLeaveDisconnectsTheMemberAndAClosedConnectionLeavesTheRoom() {
        var host = host()
        _ = host.handle(.request(.join(nick: "ann"), from: 7, expectsReply: false), at: 2)
        _ = host.handle(.request(.join(nick: "bob"), from: 8, expectsReply: false), at: 2)
        let left = host.handle(.request(.leave("lunch"), from: 7, expectsReply: false), at: 3)
        #expect(left.contains(.disconnect(7, reason: "left the room")))
        #expect(left.last == .updateTXT(["topic": "plans", "members": "2"]))
        let closed = host.handle(.closed(8), at: 4)
        #expect(closed.contains(.show(["[00:00:04] -!- bob left (connection lost)"])))
        #expect(host.room.nicks == ["hal"])
        // A dropped connection of a member that is gone says nothing.
        #expect(host.handle(.interrupted(8, reason: "reset"), at: 5).isEmpty)
    }

    @Test func quittingTellsTheMembersTheRoomClosed() {
        var host = host()
        _ = host.handle(.request(.join(nick: "ann"), from: 7, expectsReply: false), at: 2)
        let closing = host.handle(.line("/quit"), at: 5)
        #expect(closing.last == .exit)
        #expect(closing.contains(.send(.closed("the host closed the room Lobby"), to: [7])))
        // In a script, the end of input leaves the room open; at a terminal it closes it.
        var scripted = self.host(interactive: false)
        #expect(scripted.handle(.endOfInput, at: 3).isEmpty)
        var typed = self.host()
        #expect(typed.handle(.endOfInput, at: 3).last == .exit)
    }

    @Test func aRenameIsShownAndUsedForTheRoomsName() {
        var host = host()
        #expect(
            host.handle(.renamed(from: "Lobby", to: "Lobby (2)"), at: 2)
                == [.show(["[00:00:02] -!- a room named Lobby exists already; this one is published as Lobby (2)"])])
        #expect(host.room.name == "Lobby (2)")
        _ = host.handle(.line("/topic lunch"), at: 3)
        #expect(host.room.membersInfo.room == "Lobby (2)")
    }
}
