/// A participant's id in a room: the server connection id, or ``Room/localID`` for the host's own user.
public typealias MemberID = UInt64

/// The host's room: members, topic, history. No I/O — every method returns the messages to deliver,
/// and the caller sends them (``Delivery``).
public struct Room: Sendable {
    /// How many messages a late joiner gets replayed.
    public static let historyLimit = 50
    /// The member id of the person at the host's own terminal.
    public static let localID: MemberID = 0
    /// Longest nick, in characters.
    public static let maxNickLength = 32
    /// Longest topic, in UTF-8 bytes (it travels in a TXT entry, at most 255 bytes with its key).
    public static let maxTopicBytes = 200
    /// Longest chat line, in characters.
    public static let maxTextLength = 2000

    /// Who gets a message.
    public enum Delivery: Sendable, Equatable {
        case to(MemberID, HostMessage)
        case everyone(HostMessage)
        case everyoneBut(MemberID, HostMessage)
    }

    public struct Member: Sendable, Equatable {
        public let id: MemberID
        public var nick: String
    }

    /// The room's name (the published service name).
    public var name: String
    public private(set) var topic: String
    /// Members in joining order.
    public private(set) var members: [Member] = []
    /// The last ``historyLimit`` messages (`say` and `me`), oldest first.
    public private(set) var history: [RoomEvent] = []

    public init(name: String, topic: String = "") {
        self.name = name
        self.topic = Room.clampTopic(Room.clean(topic))
    }

    /// Nicks in joining order.
    public var nicks: [String] { members.map(\.nick) }

    /// The TXT record entries that describe the room: topic and member count.
    public var txt: [String: String] { ["topic": topic, "members": String(members.count)] }

    /// Who is here, as `chat.members` says it.
    public var membersInfo: MembersInfo { MembersInfo(room: name, topic: topic, members: nicks) }

    /// The nick of a member, if present.
    public func nick(of id: MemberID) -> String? { members.first { $0.id == id }?.nick }

    /// Handles one request of a member (or of a connection that has not joined yet).
    public mutating func handle(_ request: ParticipantRequest, from id: MemberID, at time: Double) -> [Delivery] {
        if case .join(let nick) = request { return join(id, requested: nick, at: time) }
        guard let index = members.firstIndex(where: { $0.id == id }) else {
            return [.to(id, .event(RoomEvent(.notice, time: time, text: "join the room first")))]
        }
        let nick = members[index].nick
        switch request {
        case .join:
            return []
        case .say(let raw), .me(let raw):
            // Several lines in one message (a paste) are several messages: never glued together.
            let kind: RoomEvent.Kind = if case .say = request { .say } else { .me }
            var out: [Delivery] = []
            for line in Room.lines(of: raw) {
                let text = Room.clean(line, limit: Room.maxTextLength)
                guard !text.isEmpty else { continue }
                let event = RoomEvent(kind, time: time, nick: nick, text: text)
                remember(event)
                out.append(.everyone(.event(event)))
            }
            return out
        case .nick(let raw):
            if let refusal = Room.nickRefusal(raw, current: nick) {
                return [.to(id, .event(RoomEvent(.notice, time: time, text: refusal)))]
            }
            let new = Room.sanitizeNick(raw)!
            if new == nick { return [] }
            if members.contains(where: { $0.id != id && $0.nick.lowercased() == new.lowercased() }) {
                return [
                    .to(
                        id,
                        .event(
                            RoomEvent(
                                .notice, time: time,
                                text: "the nick \(new) is taken by someone else in the room; you are still \(nick)")))
                ]
            }
            members[index].nick = new
            return [.everyone(.event(RoomEvent(.nick, time: time, nick: nick, text: new)))]
        case .topic(let raw):
            topic = Room.clampTopic(Room.clean(Room.lines(of: raw).joined(separator: " ")))
            return [.everyone(.event(RoomEvent(.topic, time: time, nick: nick, text: topic)))]
        case .members:
            return [.to(id, .members(membersInfo))]
        case .leave(let reason):
            members.remove(at: index)
            return [
                .everyoneBut(
                    id, .event(RoomEvent(.leave, time: time, nick: nick, text: Room.clean(reason, limit: 200)))),
                .to(id, .bye("see you")),
            ]
        }
    }

    /// A member's connection ended without a leave.
    public mutating func disconnected(_ id: MemberID, at time: Double) -> [Delivery] {
        guard let index = members.firstIndex(where: { $0.id == id }) else { return [] }
        let nick = members.remove(at: index).nick
        return [.everyone(.event(RoomEvent(.leave, time: time, nick: nick, text: "connection lost")))]
    }

    private mutating func join(_ id: MemberID, requested raw: String, at time: Double) -> [Delivery] {
        if let existing = nick(of: id) {
            return [
                .to(
                    id, .welcome(Welcome(room: name, nick: existing, requested: existing, topic: topic, members: nicks))
                )
            ]
        }
        let requested = Room.sanitizeNick(raw) ?? "guest"
        let nick = Room.uniqueNick(requested, taken: nicks)
        members.append(Member(id: id, nick: nick))
        var out: [Delivery] = [
            .to(id, .welcome(Welcome(room: name, nick: nick, requested: requested, topic: topic, members: nicks)))
        ]
        if !history.isEmpty { out.append(.to(id, .history(History(events: history)))) }
        if nick != requested {
            out.append(
                .to(
                    id,
                    .event(
                        RoomEvent(
                            .notice, time: time,
                            text: "the nick \(requested) is taken; you are \(nick) (change it with /nick)"))))
        }
        out.append(.everyoneBut(id, .event(RoomEvent(.join, time: time, nick: nick))))
        return out
    }

    private mutating func remember(_ event: RoomEvent) {
        history.append(event)
        if history.count > Room.historyLimit { history.removeFirst(history.count - Room.historyLimit) }
    }

    /// `nick`, or `nick_2`, `nick_3`, … — the first that no one has (compared case-insensitively).
    public static func uniqueNick(_ requested: String, taken: [String]) -> String {
        let lowered = Set(taken.map { $0.lowercased() })
        if !lowered.contains(requested.lowercased()) { return requested }
        var suffix = 2
        while true {
            let tail = "_\(suffix)"
            let candidate = String(requested.prefix(maxNickLength - tail.count)) + tail
            if !lowered.contains(candidate.lowercased()) { return candidate }
            suffix += 1
        }
    }

    /// The answer to `/nick raw` when it cannot be a nick: which nick, why, and what was kept.
    public static func nickRefusal(_ raw: String, current: String) -> String? {
        let shown = clean(raw, limit: 60)
        guard sanitizeNick(raw) != nil else {
            return "'\(shown)' cannot be a nick: nothing is left once spaces and control characters are removed "
                + "(a nick is 1 to \(maxNickLength) characters); you are still \(current)"
        }
        let cleaned = clean(raw).trimmingWhitespace()
        if cleaned.count > maxNickLength {
            return "'\(shown)' cannot be a nick: it has \(cleaned.count) characters, at most \(maxNickLength) are allowed; "
                + "you are still \(current)"
        }
        return nil
    }

    /// The lines of a text: split at CR, LF and CRLF (a pasted block), each as it was typed.
    public static func lines(of text: String) -> [String] {
        text.split(omittingEmptySubsequences: false, whereSeparator: { $0 == "\n" || $0 == "\r" || $0 == "\r\n" })
            .map(String.init)
    }

    /// A usable nick from what someone typed: control characters dropped, spaces become `_`,
    /// at most ``maxNickLength`` characters; nil when nothing is left.
    public static func sanitizeNick(_ raw: String) -> String? {
        let cleaned = clean(raw).trimmingWhitespace().map { $0.isWhitespace ? "_" : $0 }
        let nick = String(String(cleaned).prefix(maxNickLength))
        return nick.isEmpty ? nil : nick
    }

    /// Text without control characters (no terminal escapes travel through a room), at most `limit` characters.
    public static func clean(_ text: String, limit: Int = 10_000) -> String {
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            if scalar == "\t" {
                out.append(" ")
                continue
            }
            // Controls (C0, DEL, C1) and the bidirectional formatting characters — embeddings,
            // overrides, isolates and the marks ALM, LRM, RLM, as preview's file names — plus the
            // invisible operators U+2060–U+2064.
            if scalar.properties.generalCategory == .control
                || scalar.properties.generalCategory == .format && scalar.value >= 0x202A && scalar.value <= 0x2069
                || [0x061C, 0x200E, 0x200F].contains(scalar.value)
            {
                continue
            }
            out.append(scalar)
        }
        return String(String(out).prefix(limit))
    }

    static func clampTopic(_ topic: String) -> String {
        var result = topic
        while result.utf8.count > maxTopicBytes { result.removeLast() }
        return result
    }
}

extension StringProtocol {
    func trimmingWhitespace() -> Substring {
        let s = self[...]
        guard let first = s.firstIndex(where: { !$0.isWhitespace }) else { return "" }
        let last = s.lastIndex(where: { !$0.isWhitespace })!
        return Substring(s[first...last])
    }
}
