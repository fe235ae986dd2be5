import Discovery
import ProtocolCore
import Transport

/// How a ``MessageClient`` finds, connects and reconnects.
public struct ClientConfiguration: Sendable {
    /// This side's name in the hello (the server sees it as the peer's name), codecs, frame limit,
    /// connect timeout, heartbeat. Not the name of the service to connect to: that is the target's.
    public var channel: ChannelConfiguration
    /// How long the first connect browses for the service before giving up (or deciding it is
    /// ambiguous), when it does not wait for the server (``waitsForServer``).
    public var browseTimeout: Duration = .seconds(5)
    /// How long one resolve may take.
    public var resolveTimeout: Duration = .seconds(5)
    /// Reconnect automatically when the connection is lost (not after ``MessageClient/close(reason:)``),
    /// with this back-off; also the back-off of ``waitsForServer``.
    public var reconnect: ReconnectPolicy?
    /// On the first connect, wait for the server instead of failing: ``MessageClient/connect(to:configuration:logger:)``
    /// returns at once, browses until the service appears (and connects the moment it does), retries
    /// refused connections with the ``reconnect`` back-off (the default policy when nil), and reports
    /// what it waits for as ``ClientEvent/waiting(_:)``. Like Network.framework's waiting state.
    public var waitsForServer = false
    /// How long `send` and `request` wait for a connection while the client is connecting or
    /// reconnecting, before failing with ``MessagingError/Code-swift.struct/notConnected`` (0: fail at once).
    public var connectionWait: Duration = .seconds(10)
    /// Client events waiting for the app. While the app reads ``MessageClient/events``, a full
    /// buffer pauses reading the connection (back-pressure). While nothing reads them — never, or
    /// no more: full for a second without the app taking one — the newest events are kept and
    /// older unsolicited messages are dropped (counted in ``MessageClient/droppedMessages``), so
    /// replies to requests never wait behind them; back-pressure returns when the app reads again.
    public var eventBufferLimit = 256
    /// Message sessions (with a ``reconnect`` policy only): one-way messages sent with
    /// ``MessageClient/send(_:type:)`` are kept until the server acknowledges them, wait in the
    /// client while it reconnects, and are resent after a reconnect exactly once and in order (the
    /// server does the same for its messages). When the session cannot be resumed (the server
    /// restarted, or its grace period expired) ``ClientEvent/undelivered(_:)`` lists the messages
    /// that may not have arrived. nil: no sessions (a message sent while disconnected fails).
    public var session: SessionConfiguration? = SessionConfiguration()
    /// Servers connected to by name are remembered here with their addresses and proven key; when a
    /// later browse finds nothing within ``browseTimeout``, the remembered addresses are tried,
    /// accepting only the remembered key (encrypted channels only). nil: remember nothing.
    /// Default: ``PeerMemory/standard`` (beside the program's trust store).
    public var peerMemory: PeerMemory? = .standard
    /// A client asking for a service by name whose key it knows (its trust store's entry for the
    /// name, its pinned keys, or ``peerMemory``) looks for that key among every instance of the
    /// type, whatever it is called now: an impostor that took the name first pushes the real
    /// server to "name #2", and the client finds it there by its TXT `fp` and proves it in the
    /// handshake. An instance that presents another key is refused and reported
    /// (``ClientEvent/waiting(_:)`` with code ``MessagingError/Code-swift.struct/untrustedServer``),
    /// and the search goes on — for ``browseTimeout`` after the first refusal (then the refusal is
    /// final: ``ClientEvent/gaveUp(_:)``), or, when this is true, for as long as the client runs
    /// (unattended clients).
    public var keepsLookingForKnownKey = false

    /// - Parameters:
    ///   - peerName: This side's name in the hello (shown to the server), not the service's name.
    ///   - reconnect: Reconnect automatically with this back-off (nil: do not).
    public init(peerName: String, reconnect: ReconnectPolicy? = nil) {
        var channel = ChannelConfiguration(name: peerName)
        channel.codecs = .messagingDefault
        self.channel = channel
        self.reconnect = reconnect
    }

    /// Use ``init(peerName:reconnect:)``: `name` is this side's name in the hello, not the name of
    /// the service to connect to. Released in 1.0 and removed by mistake in a 1.0.x change; back,
    /// deprecated, and working as it did.
    @available(*, deprecated, renamed: "init(peerName:reconnect:)")
    public init(name: String, reconnect: ReconnectPolicy? = nil) { self.init(peerName: name, reconnect: reconnect) }
}

/// Back-off for automatic reconnection (and for waiting for the server): re-browse and re-resolve
/// (the server may come back on a new port), then connect; the delay doubles from `initialDelay` up
/// to `maxDelay`.
public struct ReconnectPolicy: Sendable {
    /// The delay before the first retry.
    public var initialDelay: Duration
    /// The longest delay between retries (the delay doubles up to it).
    public var maxDelay: Duration
    /// Give up after this many failed attempts in a row (nil: never).
    public var maxAttempts: Int?

    /// A policy retrying after 250 ms, then 500 ms, 1 s, … up to `maxDelay`, forever unless
    /// `maxAttempts` is set.
    public init(initialDelay: Duration = .milliseconds(250), maxDelay: Duration = .seconds(5), maxAttempts: Int? = nil) {
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.maxAttempts = maxAttempts
    }
}

/// Something that happened on a ``MessageClient``.
public enum ClientEvent: Sendable, CustomStringConvertible {
    /// Connected (first time or after a reconnect) to this peer.
    case connected(PeerInfo, via: SocketAddress?)
    /// A message arrived.
    case received(IncomingMessage)
    /// A streamed transfer started; consume its chunks or `discard()` it.
    case transfer(IncomingTransfer)
    /// The connection ended, with the reason.
    case disconnected(CloseReason)
    /// Waiting for the server (``ClientConfiguration/waitsForServer``): the error says what for
    /// (the service has not appeared yet, the connection was refused, …); the client keeps trying.
    case waiting(MessagingError)
    /// Trying again after `delay` (attempt counts from 1).
    case reconnecting(attempt: Int, delay: Duration)
    /// Reconnection stopped (attempts exhausted); the client is closed.
    case gaveUp(MessagingError)
    /// The message session continued on the new connection: `resent` messages the server had not
    /// received were sent again (and the server resent what this side had not received).
    case resumed(resent: Int)
    /// Messages sent in a message session that the server never acknowledged, when the session
    /// could not be resumed (the server restarted or forgot it) or ended: they may or may not have
    /// arrived, and are not sent again. Never a silent loss.
    case undelivered([UndeliveredMessage])

    public var description: String {
        switch self {
        case .connected(let peer, let via): "connected to '\(peer.name)'\(via.map { " via \($0)" } ?? "")"
        case .received(let message): "received \(message.typeID) #\(message.sequence)"
        case .transfer(let transfer): "transfer \(transfer.typeID) (\(transfer.totalSize) bytes)"
        case .disconnected(let reason): "disconnected: \(reason)"
        case .waiting(let error): "waiting: \(error.message)"
        case .reconnecting(let attempt, let delay): "reconnecting (attempt \(attempt)) in \(delay)"
        case .gaveUp(let error): "gave up: \(error)"
        case .resumed(let resent): "session resumed (\(resent) messages sent again)"
        case .undelivered(let messages): "\(messages.count) messages not acknowledged: \(messages.map(\.description).joined(separator: ", "))"
        }
    }
}

/// The client's events, in order. One consumer.
public struct ClientEvents: AsyncSequence, Sendable {
    public typealias Element = ClientEvent
    let queue: BoundedQueue<ClientEvent>

    /// Asking it for the next event (or leaving the loop) counts as having handled the message of
    /// the ``ClientEvent/received(_:)`` before (``SessionAcknowledgement/automatic``).
    public struct AsyncIterator: AsyncIteratorProtocol {
        let queue: BoundedQueue<ClientEvent>
        let handling = HandledOnNext()
        public mutating func next() async -> ClientEvent? {
            handling.done()
            let event = try? await queue.next()
            if case .received(let message)? = event { handling.handling(message) }
            return event
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(queue: queue) }
}

/// Where a client connects: a fixed host and port, or a service found by discovery.
public enum ServiceTarget: Sendable, CustomStringConvertible {
    /// A host name or numeric address (IPv6 may carry `%scope`) and a port.
    case host(String, port: UInt16)
    /// A DNS-SD service of `type`, by instance name; nil name: the only one there is. Without a
    /// name the client must see the whole network's answer first (Avahi's "all for now", about a
    /// second on a quiet network) to know the service is the only one; with a name it connects the
    /// moment that service is seen.
    case service(name: String?, type: String, discovery: ServiceDiscovery)

    public var description: String {
        switch self {
        case .host(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .service(let name, let type, _): name.map { "'\($0)' (\(type))" } ?? "the \(type) service"
        }
    }
}
