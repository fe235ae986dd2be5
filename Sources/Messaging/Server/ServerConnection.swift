import Discovery
import Locks
import ProtocolCore
import Transport

/// One client connection of a server. With a message session it outlives the TCP connection: a
/// client that reconnects and resumes its session continues the same `ServerConnection`.
public final class ServerConnection: Sendable, Hashable, CustomStringConvertible {
    /// Unique per server, increasing.
    public let id: UInt64
    /// The channel, for a connection without a session (it never changes); with one, the
    /// session keeps it (``MessageSession/State/serving``: a resume replaces it). No lock of its
    /// own: thousands of idle connections would pay one each.
    private let fixed: MessageChannel?
    /// The message session, when the client opened one.
    let session: MessageSession?
    /// The server's events: the connection is its channel's ``MessageRoute`` (what the channel
    /// receives goes there from its loop), so that routing costs no object of its own.
    let events: BoundedQueue<ServerEvent>
    /// Told when the channel closes. Weak: the server holds its connections. Set once, in init
    /// (a `weak var` because `weak let` needs Swift 6.2; the package supports 6.0).
    nonisolated(unsafe) private weak var server: MessageServer?

    /// - Parameter session: Made serving `channel` (``MessageSession/init(id:configuration:logger:serving:)``).
    init(
        id: UInt64, channel: MessageChannel, session: MessageSession? = nil, events: BoundedQueue<ServerEvent>,
        server: MessageServer?
    ) {
        self.id = id
        self.session = session
        fixed = session == nil ? channel : nil
        self.events = events
        self.server = server
    }

    /// The underlying channel: send, request, reply, stream files. After a resume, the new one.
    /// Its own `send` bypasses the message session: use ``send(_:type:)`` for messages that must
    /// survive a reconnect.
    public var channel: MessageChannel {
        if let fixed { return fixed }
        // A session's connection: set at init, replaced (never cleared) by a resume.
        return session!.servingChannel!
    }

    /// Puts the resumed session's new channel in place; returns the old one. With a session only.
    func replace(with channel: MessageChannel) -> MessageChannel {
        session!.replaceServing(with: channel)!
    }

    /// The peer's hello: name, protocol version, metadata.
    public var peer: PeerInfo { channel.peer }
    /// Where the peer connects from.
    public var remoteAddress: SocketAddress? { channel.remoteAddress }
    /// Whether the client opened a message session (its one-way messages survive reconnects).
    public var hasSession: Bool { session != nil }
    /// One-way messages sent to this connection's session and not yet acknowledged.
    public var unacknowledgedCount: Int { session?.unacknowledgedCount ?? 0 }
    /// Those messages themselves, oldest first (empty without a session): what would be lost if the
    /// session could not be resumed — with a ``SessionStore``, also those kept from before a restart.
    public var unacknowledgedMessages: [UndeliveredMessage] { session?.keptMessages ?? [] }
    /// Where sending to this client stands in its message session (nil without one): right after a
    /// `send` returns, ``SessionProgress/sent`` is that message's number (see ``SessionProgress``).
    public var sendProgress: SessionProgress? { session?.progress }

    /// Waits until the client has acknowledged the one-way messages sent to it so far — or those
    /// through `number`, a ``SessionProgress/sent`` of ``sendProgress`` — across its reconnects and
    /// resumes (an acknowledgement ends the wait, no timer polls).
    /// - Returns: `true` once they are all acknowledged (at once without a message session, which
    ///   keeps nothing). `false` when `timeout` passed or the task was cancelled first (they stay
    ///   kept and go on being sent), or when they cannot be acknowledged any more: the connection
    ///   was closed, or the session started anew and reported one of them undelivered
    ///   (``ServerEvent/undelivered(_:_:)``).
    public func acknowledged(through number: UInt64? = nil, within timeout: Duration) async -> Bool {
        guard let session else { return true }
        return await session.acknowledged(through: number, within: timeout, scheduler: channel.configuration.scheduler)
    }

    /// The connection's health: round-trip time, when the client was last heard from, resumes.
    public var health: ConnectionHealth {
        get async { await channel.health }
    }

    /// Sends a message to this peer. With a message session it is kept until the client
    /// acknowledges it (sent now, or when the client resumes; waits only while the session keeps
    /// its maximum); without one it suspends while the send queue is full.
    public func send<T: Encodable>(_ value: T, type: String) async throws {
        try await route.send(value, type: type, codec: channel.configuration.codecs.sendCodec)
    }

    /// Sends an already encoded payload (through the session, if any).
    func sendEncoded(_ payload: [UInt8], codecID: UInt8, type: String) async throws {
        try await route.send(payload, codecID: codecID, type: type)
    }

    /// Where this connection's one-way messages go: its session when the client opened one, else
    /// its channel (which never changes then).
    private var route: OutboundRoute { session.map(OutboundRoute.session) ?? .channel(channel) }

    /// Replies to a request from this peer (``IncomingMessage/expectsReply``).
    public func reply<T: Encodable>(to message: IncomingMessage, with value: T, type: String) async throws {
        try await channel.reply(to: message, with: value, type: type)
    }

    /// Answers a request from this peer with an error: its `request(...)` throws `error`.
    public func reply(to message: IncomingMessage, error: RemoteError) async throws {
        try await channel.reply(to: message, error: error)
    }

    /// Closes gracefully (queued messages are flushed first); ends its message session: what it
    /// sent and the client never acknowledged is reported (``ServerEvent/undelivered(_:_:)``).
    public func close(reason: String = "closed by server") {
        if let session {
            let lost = session.end(MessagingError(.stopped, "the server closed the connection: \(reason)"))
            if !lost.isEmpty { events.push(.undelivered(self, lost)) }
        }
        channel.close(reason: reason)
    }

    public static func == (lhs: ServerConnection, rhs: ServerConnection) -> Bool { lhs.id == rhs.id }
    public func hash(into hasher: inout Hasher) { hasher.combine(id) }
    public var description: String {
        "#\(id) '\(peer.name)'\(remoteAddress.map { " at \($0)" } ?? "")"
    }
}

extension ServerConnection: MessageRoute {
    func deliver(_ message: IncomingMessage, from channel: MessageChannel) -> Bool {
        events.push(.received(self, message), from: channel)
    }

    func transfer(_ transfer: IncomingTransfer, from channel: MessageChannel) -> Bool {
        events.push(.transfer(self, transfer), from: channel)
    }

    func closed(_ reason: CloseReason, _ channel: MessageChannel) {
        events.forget(channel)  // a channel the full events stopped: not kept after its close
        server?.routeClosed(self, channel, reason: reason)
    }
}
