import Discovery
import Locks
import ProtocolCore
import Transport

/// Settings of a ``MessageServer``: what it publishes (type, name, TXT), how it listens, the channel
/// settings every accepted connection gets (``channel``: codecs, timeouts, security) and its limits.
public struct ServerConfiguration: Sendable {
    /// The DNS-SD service type, e.g. `_bonjour-chat._tcp`.
    public var serviceType: String
    /// The DNS-SD instance name; nil gives `"<program> on <host>"`.
    public var serviceName: String?
    /// TXT entries to publish; the server adds `proto=<wire protocol version>`.
    public var txt: TXTRecord = TXTRecord()
    /// Publish through discovery (needs a `ServiceDiscovery`); false listens only.
    public var publish = true
    /// Port and families (default: one kernel-assigned port for IPv4 and IPv6).
    public var listener = Listener.Configuration()
    /// Name in the hello, codecs, frame limit, timeouts and heartbeat of every connection.
    public var channel: ChannelConfiguration
    /// Connections beyond this are refused at once (closed before the hello).
    public var maxConnections = 1024
    /// Message sessions for clients that open one (a ``MessageClient`` with a reconnect policy does):
    /// a client whose connection is lost keeps its ``ServerConnection`` for the grace period; when it
    /// reconnects, the connection continues (``ServerEvent/resumed(_:resent:)``), and one-way
    /// messages in both directions arrive exactly once, in order. Messages sent to the connection
    /// meanwhile wait for it. nil: no sessions.
    public var session: SessionConfiguration? = SessionConfiguration()
    /// Server events waiting for the app: the one inbound queue of the server's connections (each
    /// hands its messages from its loop straight into it). A connection that delivers into it at
    /// this limit stops being read until the app has drained it to half.
    public var eventBufferLimit = 256
    /// How long ``MessageServer/stop()`` lets connections flush and say goodbye before aborting them.
    public var stopGracePeriod: Duration = .seconds(5)
    /// Connections still in their handshake at once (accepted, the hello or the Noise handshake not
    /// finished); more are refused at once with REFUSE `busy` before any key agreement
    /// (docs/PROTOCOL.md, "Busy"; ``ServerEvent/refused(remote:reason:)``, metric reason `busy`). A
    /// version-2 handshake costs the server three X25519 operations: this bound keeps a flood of
    /// handshake attempts from taking the loops that serve established connections.
    public var maxPendingHandshakes = 512
    /// The same bound for one source address (IPv4 or IPv6 address, any port), so that one host
    /// cannot hold every handshake slot.
    public var maxPendingHandshakesPerAddress = 128
    /// Handshakes started per second, in all; more are refused at once with REFUSE `busy` and a
    /// retry hint, before any key agreement. Up to this many may start in one burst. nil: no bound.
    /// (A handshake costs this server about 0.3 ms of one core: the default bounds a flood from
    /// many addresses to about half a core.)
    public var maxHandshakesPerSecond: Int? = 2_048
    /// The same bound for one source: an IPv4 address, or an IPv6 /64 (one host usually owns a
    /// whole /64). A flood from one host is then refused cheaply while other hosts connect as
    /// usual. Raise it for a server that many clients reach through one address (a NAT, a test
    /// harness opening thousands of connections from loopback). nil: no bound.
    public var maxHandshakesPerSecondPerAddress: Int? = 256
    /// A source (address, or IPv6 /64) refused this many times within one second is flooding the
    /// server: for ``floodBlockDuration`` its connection attempts are dropped by the kernel (a
    /// socket filter on the listener, Linux) before they become connections, so the flood costs
    /// this server next to nothing; its connects time out meanwhile. A client that honours the
    /// retry hint makes about ten attempts a second. A source blocked before is on probation until
    /// it has been quiet for twice its last block after it ended: blocked again at a sixteenth of
    /// this, and given no burst of handshakes when its block ends. nil: never block.
    public var floodBlockThreshold: Int? = 1_024
    /// How long a flooding source stays blocked (``floodBlockThreshold``) the first time. A source
    /// that floods again soon after (within twice its last block) is blocked twice as long, up to
    /// 32 times this.
    public var floodBlockDuration: Duration = .seconds(10)
    /// Heartbeat exchanges a second this server aims for in all. With more connections than this
    /// times the channels' `pingInterval` (750 at the defaults), it pings them less often and
    /// asks them in its PONGs to do the same (docs/PROTOCOL.md, "Heartbeat pacing"): at 19,000
    /// connections every 127 s, a silent peer closed after 6.3 minutes, where 5 s and 15 s would
    /// take half a core of an idle server (150 keeps 19,000 idle connections under 2 % of a core;
    /// raise it to notice vanished peers sooner at that scale). nil: every connection at the
    /// configured interval.
    public var heartbeatsPerSecond: Int? = 150
    /// Refused connections and failed handshakes are logged as a summary: in each interval of this
    /// length, the first of each reason in full, then one line with the counts by reason and source.
    /// (Every one is still a ``ServerEvent/refused(remote:reason:)`` event and counted in the metrics.)
    public var refusalLogInterval: Duration = .seconds(10)

    /// - Parameters:
    ///   - serviceType: The DNS-SD service type, e.g. `_bonjour-chat._tcp`.
    ///   - serviceName: The instance name; nil gives `"<program> on <host>"`.
    ///   - peerName: This server's name in the hello (defaults to the service name or type).
    public init(serviceType: String, serviceName: String? = nil, peerName: String? = nil) {
        self.serviceType = serviceType
        self.serviceName = serviceName
        var channel = ChannelConfiguration(name: peerName ?? serviceName ?? serviceType)
        // A peer that sends no complete frame for 30 s (healthy peers ping every 5 s) is dropped:
        // half-sent frames cannot pin a connection forever.
        channel.connection.idleTimeout = .seconds(30)
        channel.codecs = .messagingDefault
        self.channel = channel
    }
}

/// Something that happened on a ``MessageServer``.
public enum ServerEvent: Sendable, CustomStringConvertible {
    /// The service is announced on the network under this name.
    case published(name: String)
    /// The name collided; the service is re-published under `to`.
    case renamed(from: String, to: String)
    /// A client connected and completed the hello.
    case accepted(ServerConnection)
    /// A message arrived.
    case received(ServerConnection, IncomingMessage)
    /// A streamed transfer started; consume its chunks or `discard()` it.
    case transfer(ServerConnection, IncomingTransfer)
    /// A connection ended, with the reason. For a connection with a message session this is the
    /// session's end: the client closed, or did not come back within the grace period.
    case closed(ServerConnection, CloseReason)
    /// A connection with a message session was lost; the session waits for the client to come back
    /// (``resumed(_:resent:)``) until its grace period ends (``closed(_:_:)``). Messages sent to it
    /// meanwhile are kept.
    case interrupted(ServerConnection, CloseReason)
    /// The client came back on a new connection and its session continues: `resent` messages it
    /// had not received were sent again.
    case resumed(ServerConnection, resent: Int)
    /// Messages sent to this connection's session that the client never acknowledged, reported when
    /// the session ends without them (the client did not come back, or the server stops).
    case undelivered(ServerConnection, [UndeliveredMessage])
    /// A connection was refused (connection limit, busy, failed hello or handshake), with the
    /// reason. At most 100 a second are reported, and none while the event queue is full (a flood
    /// would otherwise cost the app a wake-up per attempt); every refusal is counted in the metrics
    /// and summarised in the log (``ServerConfiguration/refusalLogInterval``).
    case refused(remote: SocketAddress?, reason: String)
    /// Wide-area: the service is registered in the unicast DNS domain `domain` under `name` (after
    /// a first registration, a re-registration or a rename there).
    case registered(name: String, domain: String)
    /// Wide-area: registering in `domain` failed; the error says why and what to do. The link
    /// publication is not affected, and the registration is retried.
    case registrationFailed(domain: String, DiscoveryError)

    public var description: String {
        switch self {
        case .published(let name): "published as '\(name)'"
        case .renamed(let from, let to): "renamed '\(from)' → '\(to)'"
        case .accepted(let connection): "accepted \(connection)"
        case .received(let connection, let message): "received \(message.typeID) #\(message.sequence) from \(connection)"
        case .transfer(let connection, let transfer): "transfer \(transfer.typeID) (\(transfer.totalSize) bytes) from \(connection)"
        case .closed(let connection, let reason): "closed \(connection): \(reason)"
        case .interrupted(let connection, let reason): "interrupted \(connection): \(reason); waiting for it to resume"
        case .resumed(let connection, let resent): "resumed \(connection) (\(resent) messages sent again)"
        case .undelivered(let connection, let messages): "\(messages.count) messages to \(connection) not acknowledged"
        case .refused(let remote, let reason): "refused \(remote.map { "\($0)" } ?? "?"): \(reason)"
        case .registered(let name, let domain): "registered as '\(name)' in \(domain)"
        case .registrationFailed(let domain, let error): "registration in \(domain) failed: \(error.message)"
        }
    }
}

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
        return session!.state.withLock { $0.serving! }
    }

    /// Puts the resumed session's new channel in place; returns the old one. With a session only.
    func replace(with channel: MessageChannel) -> MessageChannel {
        session!.state.withLock { state in
            defer { state.serving = channel }
            return state.serving!
        }
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

    /// The connection's health: round-trip time, when the client was last heard from, resumes.
    public var health: ConnectionHealth {
        get async { await channel.health }
    }

    /// Sends a message to this peer. With a message session it is kept until the client
    /// acknowledges it (sent now, or when the client resumes; waits only while the session keeps
    /// its maximum); without one it suspends while the send queue is full.
    public func send<T: Encodable>(_ value: T, type: String) async throws {
        if let session {
            let (codec, payload) = try channel.encodeForSending(value, type: type)
            try await session.send(Frame(kind: .message, codecID: codec, typeID: type, payload: payload))
        } else {
            try await channel.send(value, type: type)
        }
    }

    /// Sends an already encoded payload (through the session, if any).
    func sendEncoded(_ payload: [UInt8], codecID: UInt8, type: String) async throws {
        if let session {
            try await session.send(Frame(kind: .message, codecID: codecID, typeID: type, payload: payload))
        } else {
            try await channel.sendEncoded(payload, codecID: codecID, type: type)
        }
    }

    /// Replies to a request from this peer (``IncomingMessage/expectsReply``).
    public func reply<T: Encodable>(to message: IncomingMessage, with value: T, type: String) async throws {
        try await channel.reply(to: message, with: value, type: type)
    }

    /// Answers a request from this peer with an error: its `request(...)` throws `error`.
    public func reply(to message: IncomingMessage, error: RemoteError) async throws {
        try await channel.reply(to: message, error: error)
    }

    /// Closes gracefully (queued messages are flushed first); ends its message session.
    public func close(reason: String = "closed by server") {
        if let session { _ = session.end(MessagingError(.stopped, "the server closed the connection: \(reason)")) }
        channel.close(reason: reason)
    }

    public static func == (lhs: ServerConnection, rhs: ServerConnection) -> Bool { lhs.id == rhs.id }
    public func hash(into hasher: inout Hasher) { hasher.combine(id) }
    public var description: String {
        "#\(id) '\(peer.name)'\(remoteAddress.map { " at \($0)" } ?? "")"
    }
}

/// The outcome of a broadcast for one connection.
public struct BroadcastResult: Sendable {
    /// The connection.
    public let connection: ServerConnection
    /// Why sending to it failed (nil: the message was queued for it).
    public let error: (any Error)?
    /// Whether the message was queued for this connection.
    public var succeeded: Bool { error == nil }
}

/// The server's events, in order. One consumer. When the app does not consume them, the server
/// stops reading from its connections (bounded memory) until it does.
public struct ServerEvents: AsyncSequence, Sendable {
    public typealias Element = ServerEvent
    let queue: BoundedQueue<ServerEvent>

    /// Asking it for the next event (or leaving the loop) counts as having handled the message of
    /// the ``ServerEvent/received(_:_:)`` before (``SessionAcknowledgement/automatic``).
    public struct AsyncIterator: AsyncIteratorProtocol {
        let queue: BoundedQueue<ServerEvent>
        let handling = HandledOnNext()
        public mutating func next() async -> ServerEvent? {
            handling.done()
            let event = try? await queue.next()
            if case .received(_, let message)? = event { handling.handling(message) }
            return event
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(queue: queue) }
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
