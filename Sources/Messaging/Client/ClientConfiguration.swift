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
