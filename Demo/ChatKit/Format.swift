import Glibc

/// Turns room events into terminal lines: `[14:03:07] <alice> hello`, `[14:03:07] * alice waves`,
/// notices as `[14:03:07] -!- alice joined`. Colour (ANSI) only when asked for.
public struct ChatFormatter: Sendable {
    /// Use ANSI colours.
    public var color: Bool
    /// Show times in UTC instead of local time (tests).
    public var utc: Bool

    public init(color: Bool, utc: Bool = false) {
        self.color = color
        self.utc = utc
    }

    /// `HH:MM:SS` of a time (seconds since 1970).
    public func clock(_ time: Double) -> String {
        var seconds = time_t(time.rounded(.down))
        var parts = tm()
        if utc { gmtime_r(&seconds, &parts) } else { localtime_r(&seconds, &parts) }
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))"
    }

    /// One line for a room event. `me` is the reader's nick (their own lines are bold).
    public func line(_ event: RoomEvent, me: String? = nil) -> String {
        let nick = Room.clean(event.nick)
        let text = Room.clean(event.text)
        switch event.kind {
        case .say:
            return stamp(event.time) + "<" + paint(nick, nickColor(nick, mine: nick == me)) + "> " + text
        case .me:
            return stamp(event.time) + paint("* \(nick) \(text)", "35")
        case .nick:
            return notice("\(nick) is now known as \(text)", at: event.time)
        case .topic:
            return notice(text.isEmpty ? "\(nick) cleared the topic" : "\(nick) set the topic: \(text)", at: event.time)
        case .join:
            return notice("\(nick) joined", at: event.time)
        case .leave:
            return notice(text.isEmpty ? "\(nick) left" : "\(nick) left (\(text))", at: event.time)
        case .notice:
            return notice(text, at: event.time)
        }
    }

    /// A notice line (from the host or from this program): `[14:03:07] -!- text`.
    public func notice(_ text: String, at time: Double) -> String {
        stamp(time) + paint("-!- " + Room.clean(text), "33")
    }

    /// An error line of this program, e.g. a message that could not be sent.
    public func error(_ text: String, at time: Double) -> String {
        stamp(time) + paint("-!- " + Room.clean(text), "1;31")
    }

    /// The prompt of the line editor: `[Lobby] alice> `.
    public func prompt(room: String, nick: String) -> String {
        "[\(Room.clean(room))] \(Room.clean(nick))> "
    }

    private func stamp(_ time: Double) -> String { paint("[\(clock(time))]", "2") + " " }

    private func paint(_ text: String, _ code: String) -> String {
        color ? "\u{1B}[\(code)m\(text)\u{1B}[0m" : text
    }

    private func nickColor(_ nick: String, mine: Bool) -> String {
        if mine { return "1" }
        let palette = ["31", "32", "34", "36", "91", "92", "94", "96"]
        var hash: UInt32 = 5381
        for byte in nick.utf8 { hash = (hash &* 33) &+ UInt32(byte) }
        return palette[Int(hash % UInt32(palette.count))]
    }
}

/// Whether output should be coloured: only on a terminal, never with `NO_COLOR` set.
public func shouldUseColor(isTerminal: Bool, environment: [String: String]) -> Bool {
    isTerminal && environment["NO_COLOR"] == nil && environment["TERM"] != "dumb"
}
