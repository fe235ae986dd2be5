import Messaging

/// The room protocol: Codable messages on the library's channels, each with a stable type id.
///
/// Participant → host: `chat.join` (``JoinRequest``), `chat.say` / `chat.me` / `chat.nick` / `chat.topic`
/// / `chat.leave` (``TextPayload``), `chat.members` (a request, empty ``TextPayload``: "who is here?";
/// the reply is `chat.members` ``MembersInfo``, or an error reply).
///
/// Host → participant: `chat.welcome` (``Welcome``), `chat.history` (``History``), `chat.members`
/// (``MembersInfo``, the reply), `chat.bye` (``TextPayload``: your leave was processed; the host then
/// closes the connection), `chat.closed` (``TextPayload``: the host closed the room) and one
/// ``RoomEvent`` per room event under its own type id (`chat.say`, `chat.me`, `chat.nick`,
/// `chat.topic`, `chat.join`, `chat.leave`, `chat.notice`).
public enum ChatType {
    public static let join = "chat.join"
    public static let say = "chat.say"
    public static let me = "chat.me"
    public static let nick = "chat.nick"
    public static let topic = "chat.topic"
    public static let leave = "chat.leave"
    public static let notice = "chat.notice"
    public static let members = "chat.members"
    public static let history = "chat.history"
    public static let welcome = "chat.welcome"
    public static let bye = "chat.bye"
    public static let closed = "chat.closed"
}

/// The codes of the host's error replies (to `chat.members`, the one request).
public enum ChatErrorCode {
    /// The request's payload could not be read.
    public static let badRequest = "bad_request"
    /// Join first (`chat.join`).
    public static let notJoined = "not_joined"
    /// A request of a type this host does not know.
    public static let unknownType = "unknown_type"
}

/// The DNS-SD service type of rooms.
public let chatServiceType = "_bonjour-chat._tcp"

/// `chat.join`: the nick a participant asks for.
public struct JoinRequest: Codable, Sendable, Equatable {
    public var nick: String
    public init(nick: String) { self.nick = nick }
}

/// A one-string payload (`chat.say`, `chat.me`, `chat.nick`, `chat.topic`, `chat.leave`, `chat.bye`).
public struct TextPayload: Codable, Sendable, Equatable {
    public var text: String
    public init(_ text: String = "") { self.text = text }
}

/// Something that happened in a room, as every participant sees it (and as history keeps it).
public struct RoomEvent: Codable, Sendable, Equatable {
    public enum Kind: String, Codable, Sendable {
        /// `nick` said `text`.
        case say
        /// `nick` did `text` (`/me`).
        case me
        /// `nick` is now known as `text`.
        case nick
        /// `nick` set the topic to `text`.
        case topic
        /// `nick` joined.
        case join
        /// `nick` left; `text` is the reason (may be empty).
        case leave
        /// A notice from the host (`text`); `nick` is empty.
        case notice
    }

    public var kind: Kind
    /// Seconds since 1970 (host clock).
    public var time: Double
    public var nick: String
    public var text: String

    public init(_ kind: Kind, time: Double, nick: String = "", text: String = "") {
        self.kind = kind
        self.time = time
        self.nick = nick
        self.text = text
    }

    /// The type id this event travels under.
    public var typeID: String {
        switch kind {
        case .say: ChatType.say
        case .me: ChatType.me
        case .nick: ChatType.nick
        case .topic: ChatType.topic
        case .join: ChatType.join
        case .leave: ChatType.leave
        case .notice: ChatType.notice
        }
    }
}

/// `chat.welcome`: you are in. `nick` is the nick you got (`requested` is what you asked for).
public struct Welcome: Codable, Sendable, Equatable {
    public var room: String
    public var nick: String
    public var requested: String
    public var topic: String
    public var members: [String]

    public init(room: String, nick: String, requested: String, topic: String, members: [String]) {
        self.room = room
        self.nick = nick
        self.requested = requested
        self.topic = topic
        self.members = members
    }

    /// True when the host renamed the participant because the nick was taken.
    public var renamed: Bool { nick != requested }
}

/// `chat.members`: who is in the room, in joining order.
public struct MembersInfo: Codable, Sendable, Equatable {
    public var room: String
    public var topic: String
    public var members: [String]

    public init(room: String, topic: String, members: [String]) {
        self.room = room
        self.topic = topic
        self.members = members
    }
}

/// `chat.history`: the last messages before you joined, oldest first.
public struct History: Codable, Sendable, Equatable {
    public var events: [RoomEvent]
    public init(events: [RoomEvent]) { self.events = events }
}

/// What the host sends a participant.
public enum HostMessage: Sendable, Equatable {
    case welcome(Welcome)
    case history(History)
    case members(MembersInfo)
    case event(RoomEvent)
    case bye(String)
    /// The host closed the room (members leave; there is nothing to rejoin).
    case closed(String)

    /// The type id it travels under.
    public var typeID: String {
        switch self {
        case .welcome: ChatType.welcome
        case .history: ChatType.history
        case .members: ChatType.members
        case .event(let event): event.typeID
        case .bye: ChatType.bye
        case .closed: ChatType.closed
        }
    }

    /// Decodes a message from the host; nil for a type id this version does not know.
    public static func decode(_ message: IncomingMessage) throws -> HostMessage? {
        switch message.typeID {
        case ChatType.welcome: return .welcome(try message.decode(Welcome.self))
        case ChatType.history: return .history(try message.decode(History.self))
        case ChatType.members: return .members(try message.decode(MembersInfo.self))
        case ChatType.bye: return .bye(try message.decode(TextPayload.self).text)
        case ChatType.closed: return .closed(try message.decode(TextPayload.self).text)
        case ChatType.say, ChatType.me, ChatType.nick, ChatType.topic, ChatType.join, ChatType.leave, ChatType.notice:
            return .event(try message.decode(RoomEvent.self))
        default: return nil
        }
    }
}

/// What a participant asks of the host.
public enum ParticipantRequest: Sendable, Equatable {
    case join(nick: String)
    case say(String)
    case me(String)
    case nick(String)
    case topic(String)
    case members
    case leave(String)

    /// The type id it travels under.
    public var typeID: String {
        switch self {
        case .join: ChatType.join
        case .say: ChatType.say
        case .me: ChatType.me
        case .nick: ChatType.nick
        case .topic: ChatType.topic
        case .members: ChatType.members
        case .leave: ChatType.leave
        }
    }

    /// Decodes a message from a participant; nil for a type id this version does not know.
    public static func decode(_ message: IncomingMessage) throws -> ParticipantRequest? {
        try decode(typeID: message.typeID, text: { try message.decode(TextPayload.self).text }) {
            try message.decode(JoinRequest.self).nick
        }
    }

    /// Decodes a request the session reported undelivered.
    public static func decode(_ message: UndeliveredMessage) throws -> ParticipantRequest? {
        try decode(typeID: message.typeID, text: { try message.decode(TextPayload.self).text }) {
            try message.decode(JoinRequest.self).nick
        }
    }

    /// The request of `typeID`, its payload read by `text` (a ``TextPayload``) or `nick` (a join).
    private static func decode(
        typeID: String, text: () throws -> String, nick: () throws -> String
    ) throws -> ParticipantRequest? {
        switch typeID {
        case ChatType.join: return .join(nick: try nick())
        case ChatType.say: return .say(try text())
        case ChatType.me: return .me(try text())
        case ChatType.nick: return .nick(try text())
        case ChatType.topic: return .topic(try text())
        case ChatType.members:
            _ = try text()  // an empty text, read anyway: a malformed request is told so
            return .members
        case ChatType.leave: return .leave(try text())
        default: return nil
        }
    }
}

extension MessageClient {
    /// Sends a participant request under its type id.
    public func send(_ request: ParticipantRequest) async throws {
        switch request {
        case .join(let nick): try await send(JoinRequest(nick: nick), type: request.typeID)
        case .say(let text), .me(let text), .nick(let text), .topic(let text), .leave(let text):
            try await send(TextPayload(text), type: request.typeID)
        case .members: try await send(TextPayload(), type: request.typeID)
        }
    }
}

extension ServerConnection {
    /// Sends a host message under its type id.
    public func send(_ message: HostMessage) async throws {
        switch message {
        case .welcome(let value): try await send(value, type: message.typeID)
        case .history(let value): try await send(value, type: message.typeID)
        case .members(let value): try await send(value, type: message.typeID)
        case .event(let value): try await send(value, type: message.typeID)
        case .bye(let text), .closed(let text): try await send(TextPayload(text), type: message.typeID)
        }
    }
}

extension MessageServer {
    /// Sends a host message to several connections (a room's members) with one encoding, through
    /// ``MessageServer/broadcast(_:type:to:timeout:)``: a member whose queue stays full for
    /// `timeout` (it stopped reading) is dropped rather than stalling the room.
    @discardableResult
    public func broadcast(_ message: HostMessage, to connections: [ServerConnection], timeout: Duration) async -> [BroadcastResult] {
        switch message {
        case .welcome(let value): await broadcast(value, type: message.typeID, to: connections, timeout: timeout)
        case .history(let value): await broadcast(value, type: message.typeID, to: connections, timeout: timeout)
        case .members(let value): await broadcast(value, type: message.typeID, to: connections, timeout: timeout)
        case .event(let value): await broadcast(value, type: message.typeID, to: connections, timeout: timeout)
        case .bye(let text), .closed(let text):
            await broadcast(TextPayload(text), type: message.typeID, to: connections, timeout: timeout)
        }
    }
}
