/// A participant's view of a room (the client side, also used for the host's own user): turns the
/// host's messages into lines and keeps the nick, topic and members current. No I/O.
public struct Participant: Sendable {
    /// The nick asked for, then the nick the host gave.
    public private(set) var nick: String
    public private(set) var room: String
    public private(set) var topic = ""
    public private(set) var members: [String] = []
    /// A welcome arrived (reset by ``connectionLost()``).
    public private(set) var joined = false
    /// The host confirmed our leave.
    public private(set) var saidBye = false
    /// The newest event time seen, so a rejoin does not replay history already shown.
    public private(set) var lastSeen: Double = 0
    public var formatter: ChatFormatter

    public init(nick: String, room: String, formatter: ChatFormatter) {
        self.nick = nick
        self.room = room
        self.formatter = formatter
    }

    /// The prompt for the line editor.
    public var prompt: String { formatter.prompt(room: room, nick: nick) }

    /// The connection is gone; a rejoin will follow.
    public mutating func connectionLost() { joined = false }

    /// The connection came back and the message session resumed: still a member, nothing lost.
    public mutating func sessionResumed() { if !members.isEmpty || lastSeen > 0 { joined = true } }

    /// Asks for another nick on the next (re)join.
    public mutating func request(nick: String) { self.nick = nick }

    /// Applies a message from the host; returns the lines to show.
    public mutating func receive(_ message: HostMessage, at now: Double) -> [String] {
        switch message {
        case .welcome(let welcome):
            let rejoin = !members.isEmpty || lastSeen > 0
            joined = true
            nick = welcome.nick
            room = welcome.room
            topic = welcome.topic
            members = welcome.members
            var text = "\(rejoin ? "rejoined" : "you joined") \(welcome.room) as \(welcome.nick)"
            if !welcome.topic.isEmpty { text += " — topic: \(welcome.topic)" }
            text += " — \(Self.describe(members: welcome.members))"
            return [formatter.notice(text, at: now)]
        case .history(let history):
            let fresh = history.events.filter { $0.time > lastSeen }
            guard !fresh.isEmpty else { return [] }
            lastSeen = max(lastSeen, fresh.map(\.time).max() ?? 0)
            return [formatter.notice("last \(fresh.count) message\(fresh.count == 1 ? "" : "s"):", at: now)]
                + fresh.map { formatter.line($0, me: nick) }
        case .members(let info):
            topic = info.topic
            members = info.members
            var text = "\(Self.describe(members: info.members)) in \(info.room)"
            if !info.topic.isEmpty { text += " — topic: \(info.topic)" }
            return [formatter.notice(text, at: now)]
        case .event(let event):
            lastSeen = max(lastSeen, event.time)
            switch event.kind {
            case .nick:
                if event.nick == nick { nick = event.text }
                if let index = members.firstIndex(of: event.nick) { members[index] = event.text }
            case .topic: topic = event.text
            case .join: if !members.contains(event.nick) { members.append(event.nick) }
            case .leave: members.removeAll { $0 == event.nick }
            case .say, .me, .notice: break
            }
            return [formatter.line(event, me: nick)]
        case .bye:
            saidBye = true
            return []
        case .closed(let text):
            joined = false
            return [formatter.notice(text.isEmpty ? "the host closed the room \(room)" : text, at: now)]
        }
    }

    /// `3 here: alice, bob, carol`.
    public static func describe(members: [String]) -> String {
        members.isEmpty ? "nobody here" : "\(members.count) here: \(members.joined(separator: ", "))"
    }
}
