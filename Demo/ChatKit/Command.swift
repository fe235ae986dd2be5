/// A line the user typed.
public enum ChatCommand: Sendable, Equatable {
    /// A chat message (lines not starting with `/`; `//text` sends `/text`).
    case say(String)
    /// `/me ACTION`.
    case me(String)
    /// `/nick NEW`.
    case nick(String)
    /// `/topic TEXT` sets it; `/topic` alone shows it (nil).
    case topic(String?)
    /// `/who` (also `/names`).
    case who
    /// `/rooms`.
    case rooms
    /// `/help` (also `/?`).
    case help
    /// `/fingerprint`: this side's key and, when joined, the host's key and comparison code.
    case fingerprint
    /// `/trust [forget ROOM]`: the hosts this chat remembers (trust on first use), or forget one.
    case trust(String?)
    /// `/quit [MESSAGE]` (also `/exit`, `/leave`).
    case quit(String)
    /// An empty line.
    case empty
    /// A command with a missing argument; the text is its usage.
    case usage(String)
    /// An unknown `/command`.
    case unknown(String)

    /// Parses one input line.
    public static func parse(_ line: String) -> ChatCommand {
        let trimmed = line.trimmingWhitespace()
        if trimmed.isEmpty { return .empty }
        guard trimmed.hasPrefix("/") else { return .say(String(trimmed)) }
        if trimmed.hasPrefix("//") { return .say(String(trimmed.dropFirst())) }
        let body = trimmed.dropFirst()
        let name = body.prefix { !$0.isWhitespace }.lowercased()
        let argument = String(body.dropFirst(name.count).trimmingWhitespace())
        switch name {
        case "me": return argument.isEmpty ? .usage("/me ACTION") : .me(argument)
        case "nick": return argument.isEmpty ? .usage("/nick NEW") : .nick(argument)
        case "topic": return .topic(argument.isEmpty ? nil : argument)
        case "who", "names": return .who
        case "rooms", "list": return .rooms
        case "help", "?": return .help
        case "fingerprint", "fp": return .fingerprint
        case "trust":
            if argument.isEmpty { return .trust(nil) }
            guard argument.hasPrefix("forget ") else { return .usage("/trust [forget ROOM]") }
            return .trust(String(argument.dropFirst("forget ".count).trimmingWhitespace()))
        case "quit", "exit", "leave", "part": return .quit(argument)
        default: return .unknown(name)
        }
    }

    /// What `/help` prints, one line each.
    public static let helpLines = [
        "commands:",
        "  /who            who is in the room",
        "  /nick NEW       change your nick",
        "  /me ACTION      say what you do (* alice waves)",
        "  /topic [TEXT]   show or set the topic",
        "  /rooms          list the rooms on the network",
        "  /fingerprint    your key, and the host's key and comparison code",
        "  /trust          the hosts you trust; /trust forget ROOM forgets one",
        "  /help           this help",
        "  /quit [MSG]     leave (Ctrl-C too)",
        "  //text          send a line that starts with /",
    ]

    /// What to tell the user about a command the chat does not know or that misses its argument.
    public var complaint: String? {
        switch self {
        case .usage(let usage): "usage: \(usage)"
        case .unknown(let name): "unknown command /\(name); /help lists the commands (//text sends a line starting with /)"
        default: nil
        }
    }
}
