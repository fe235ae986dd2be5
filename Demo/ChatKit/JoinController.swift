/// A member's side of a chat, without I/O: what `bonjour-chat join` does with each thing that
/// happens — the connection's events, the host's messages, typed lines, its timers — as a list of
/// ``Effect``s for the program to carry out in order. Like ``Room`` for the host.
///
/// It keeps what the member typed while not in the room (``pending``, sent in order once the host
/// welcomes it again or the session resumes), whether it is leaving, and which rejoin deadline is
/// the current one. The program sends, closes, shows and starts timers; the results of sends come
/// back through ``sent(_:)`` and ``leaveSent(_:)``.
public struct JoinController: Sendable {
    /// What happened.
    public enum Input: Sendable, Equatable {
        /// Connected to the host; `resumed`: the message session continued (nothing lost).
        case connected(resumed: Bool, via: String?)
        /// A message from the host.
        case received(HostMessage)
        /// The connection was lost.
        case disconnected(reason: String)
        /// Messages the host never confirmed (the session ended).
        case undelivered([ParticipantRequest])
        /// The client stopped trying to reconnect.
        case gaveUp(String)
        /// The rejoin deadline started by ``Effect/startRejoinTimer(_:after:)`` with this number
        /// passed; `unacknowledged`: what the client still holds unconfirmed.
        case rejoinDeadline(Int, unacknowledged: [ParticipantRequest])
        /// A line typed (or pasted: several lines) or piped in.
        case line(String)
        /// Standard input ended (Ctrl-D, or the end of a script).
        case endOfInput
        /// SIGINT or SIGTERM.
        case interrupt
        /// The host did not confirm the leave in time (``Effect/startByeTimer``).
        case byeTimeout
    }

    /// What the program does, in order.
    public enum Effect: Sendable, Equatable {
        /// Lines for the terminal.
        case show([String])
        /// The prompt changed (nick or room).
        case prompt(String)
        /// Sends these in order, stops at the first that fails, and reports how many went
        /// through ``sent(_:)``.
        case send([ParticipantRequest])
        /// Sends `chat.join` with this nick; a failure needs no report (the next connection joins).
        case join(nick: String)
        /// Sends `chat.leave` with this reason and reports whether it went through ``leaveSent(_:)``.
        case leave(String)
        /// Says which key the host proved (first connection, or a new host).
        case describeHost
        /// Asks the host who is here (`chat.members`) and feeds the answer back as
        /// ``Input/received(_:)``.
        case askWho
        case listRooms
        case showHelp
        case showFingerprints
        case showTrust(forget: String?)
        /// Calls ``Input/rejoinDeadline(_:unacknowledged:)`` with this number after this long.
        case startRejoinTimer(Int, after: Double)
        /// Calls ``Input/byeTimeout`` after ``byeTimeout`` seconds.
        case startByeTimer
        /// Closes the client.
        case close
        /// The program ends.
        case exit(Outcome)
    }

    public enum Outcome: Sendable, Equatable {
        /// Left the room, or the room closed.
        case left
        /// Lost the connection and could not (or was not to) rejoin.
        case connectionLost
    }

    /// The member's view of the room (nick, topic, members, joined).
    public private(set) var me: Participant
    /// Typed requests not yet handed to the client, oldest first.
    public private(set) var pending: [ParticipantRequest] = []
    /// `chat.leave` went out: the next loss or `chat.bye` ends the program.
    public private(set) var leaving = false
    /// How long to look for the room after losing it (0: do not).
    public let rejoinTimeout: Double
    /// Ctrl-D leaves at once on a terminal; a script's end leaves once what it sent went out.
    public let interactive: Bool
    /// The most typed requests kept while not in the room.
    public static let pendingLimit = 500
    /// Seconds to wait for the host's `chat.bye` after `chat.leave`.
    public static let byeTimeout = 3.0

    private var everConnected = false
    private var inputDone = false
    /// Counts connections and losses: a rejoin deadline counts only if nothing happened since.
    private var generation = 0
    /// How many of ``pending`` the last ``Effect/send(_:)`` carries (0: none under way).
    private var sending = 0

    public init(nick: String, room: String, formatter: ChatFormatter, rejoinTimeout: Double, interactive: Bool) {
        me = Participant(nick: nick, room: room, formatter: formatter)
        self.rejoinTimeout = rejoinTimeout
        self.interactive = interactive
    }

    public mutating func handle(_ input: Input, at now: Double) -> [Effect] {
        switch input {
        case .connected(let resumed, let via):
            if everConnected && resumed {
                // The message session continued: still a member, and whatever was sent or
                // received meanwhile arrives once, in order.
                me.sessionResumed()
                generation += 1
                return [notice("back in \(me.room)\(via.map { " via \($0)" } ?? ""); nothing was lost", now)] + flush()
            }
            var effects: [Effect] = []
            if everConnected { effects.append(notice("found the room again\(via.map { " at \($0)" } ?? ""); rejoining", now)) }
            everConnected = true
            return effects + [.describeHost, .join(nick: me.nick)]

        case .received(let message):
            var effects: [Effect] = [.show(me.receive(message, at: now)), .prompt(me.prompt)]
            switch message {
            case .closed:
                // The room is gone for good: nothing to rejoin.
                return effects + notSent(pending, now) + [.close, .exit(.left)]
            case .welcome:
                generation += 1
                let flushing = flush()
                effects += flushing
                // Nothing to send: a script that ended while away leaves now (else after the send).
                if flushing.isEmpty { effects += leaveIfScriptDone() }
                return effects
            case .bye:
                return effects + [.close, .exit(.left)]
            case .history, .members, .event:
                return effects
            }

        case .disconnected(let reason):
            me.connectionLost()
            if leaving { return [.close, .exit(.left)] }
            guard rejoinTimeout > 0 else {
                return [problem("lost the connection to the host of \(me.room) (\(reason))", now), .close, .exit(.connectionLost)]
            }
            generation += 1
            return [
                problem(
                    "lost the connection to the host of \(me.room) (\(reason)); "
                        + "looking for the room to rejoin for \(formatSeconds(rejoinTimeout))", now),
                .startRejoinTimer(generation, after: rejoinTimeout),
            ]

        case .undelivered(let lost):
            return notSent(lost, now)

        case .gaveUp(let message):
            return [problem("gave up rejoining: \(message)", now)] + notSent(pending, now) + [.exit(.connectionLost)]

        case .rejoinDeadline(let which, let unacknowledged):
            guard which == generation, !me.joined else { return [] }
            return [problem("could not rejoin \(me.room) within \(formatSeconds(rejoinTimeout)); giving up", now)]
                + notSent(unacknowledged + pending, now) + [.close, .exit(.connectionLost)]

        case .line(let typed):
            var effects: [Effect] = []
            // A pasted block is several lines (CR, LF, CRLF): each is its own message or command.
            for line in Room.lines(of: typed) {
                guard !leaving else { break }
                effects += command(ChatCommand.parse(line), now)
            }
            return effects

        case .endOfInput:
            inputDone = true
            guard !leaving else { return [] }
            if interactive { return leave("") }
            return leaveIfScriptDone()

        case .interrupt:
            if leaving { return [.exit(.left)] }
            return leave("")

        case .byeTimeout:
            return [.close, .exit(.left)]
        }
    }

    /// `count` of the requests of the last ``Effect/send(_:)`` went out (the rest failed: they stay
    /// for the next welcome).
    public mutating func sent(_ count: Int) -> [Effect] {
        let allWent = count == sending
        pending.removeFirst(min(count, pending.count))
        sending = 0
        if pending.isEmpty { return leaveIfScriptDone() }
        // Lines typed (or pasted) meanwhile go next, unless the connection just failed.
        return allWent ? flush() : []
    }

    /// Whether the `chat.leave` of ``Effect/leave(_:)`` went out.
    public mutating func leaveSent(_ ok: Bool) -> [Effect] {
        ok ? [.startByeTimer] : [.close, .exit(.left)]
    }

    private mutating func command(_ command: ChatCommand, _ now: Double) -> [Effect] {
        switch command {
        case .say(let text): return submit(.say(text), now)
        case .me(let text): return submit(.me(text), now)
        case .nick(let new): return submit(.nick(new), now)
        case .topic(let text?): return submit(.topic(text), now)
        case .topic(nil):
            return [notice(me.topic.isEmpty ? "no topic; set one with /topic TEXT" : "topic: \(me.topic)", now)]
        case .who:
            guard me.joined else { return [notice("not in the room right now (\(me.room)); /who works once rejoined", now)] }
            return [.askWho]
        case .rooms: return [.listRooms]
        case .help: return [.showHelp]
        case .fingerprint: return [.showFingerprints]
        case .trust(let room): return [.showTrust(forget: room)]
        case .quit(let reason): return leave(reason)
        case .usage, .unknown: return command.complaint.map { [problem($0, now)] } ?? []
        case .empty: return []
        }
    }

    /// Sends now when in the room with nothing older waiting; else keeps it (up to a limit).
    private mutating func submit(_ request: ParticipantRequest, _ now: Double) -> [Effect] {
        let waiting = !me.joined || !pending.isEmpty
        if waiting && pending.count >= Self.pendingLimit {
            return [problem("not connected and too much waiting to be sent; dropped", now)]
        }
        pending.append(request)
        return waiting ? [] : flush()
    }

    /// What waits goes out, once in the room.
    private mutating func flush() -> [Effect] {
        guard me.joined, !pending.isEmpty, sending == 0 else { return [] }
        sending = pending.count
        return [.send(pending)]
    }

    private mutating func leave(_ reason: String) -> [Effect] {
        guard me.joined else { return [.close, .exit(.left)] }
        leaving = true
        return [.leave(reason)]
    }

    /// A script's input ended: it leaves once in the room with everything it typed sent.
    private mutating func leaveIfScriptDone() -> [Effect] {
        guard inputDone, !leaving, me.joined, pending.isEmpty else { return [] }
        return leave("")
    }

    /// Says which typed lines never reached the host (the room is gone, or the host restarted).
    private func notSent(_ requests: [ParticipantRequest], _ now: Double) -> [Effect] {
        let lines = requests.compactMap { request -> String? in
            switch request {
            case .say(let text): text
            case .me(let text): "/me \(text)"
            case .nick(let nick): "/nick \(nick)"
            case .topic(let topic): "/topic \(topic)"
            case .join, .members, .leave: nil
            }
        }
        guard !lines.isEmpty else { return [] }
        return [
            problem(
                "\(lines.count) line\(lines.count == 1 ? " was" : "s were") not delivered to \(me.room) "
                    + "(the host never confirmed them): " + lines.map { "\"\($0)\"" }.joined(separator: ", "), now)
        ]
    }

    private func notice(_ text: String, _ now: Double) -> Effect { .show([me.formatter.notice(text, at: now)]) }
    private func problem(_ text: String, _ now: Double) -> Effect { .show([me.formatter.error(text, at: now)]) }
}

/// `2 s`, `0.5 s`.
public func formatSeconds(_ seconds: Double) -> String {
    seconds == seconds.rounded() ? "\(Int(seconds)) s" : "\(seconds) s"
}
