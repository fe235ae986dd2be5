import Synchronization
import ProtocolCore
import Scheduling
import Transport

/// Settings of a ``MessageChannel``.
public struct ChannelConfiguration: Sendable {
    // The values live in one immutable, shared object (see SharedValues): every channel accepted
    // with the same configuration shares it instead of holding ~300 bytes of its own.
    struct Values: Sendable {
        var name: String
        var metadata: [String: String] = [:]
        var codecs: CodecRegistry = CodecRegistry()
        var connection: ConnectionConfiguration = ConnectionConfiguration()
        var protocolVersion: Int = WireProtocol.version
        var loopGroup: LoopGroup = .shared
        var helloTimeout: Duration = .seconds(10)
        var pingInterval: Duration? = .seconds(5)
        var heartbeatTimeout: Duration = .seconds(15)
        var connectTimeout: Duration = .seconds(10)
        var connectAttemptDelay: Duration = .milliseconds(250)
        var incomingBufferLimit: Int = 64
        var transferChunkBufferLimit: Int = 16
        var helloValidator: (@Sendable (PeerInfo) -> String?)? = nil
        var preSharedKey: PreSharedKey? = nil
        var security: ChannelSecurity = .standard
        var expectedPeerName: String? = nil
        var offersSessions = false
        var heartbeatPacer: HeartbeatPacer? = nil
        var metrics: MessagingMetrics? = nil
    }

    private var storage: SharedValues<Values>

    /// Where channels made with this configuration are counted (nil: nowhere); set by the server
    /// or client that makes them, for its traffic counters too.
    package var metrics: MessagingMetrics? {
        get { storage.box.values.metrics }
        set {
            storage.update {
                $0.metrics = newValue
                $0.connection.metrics = newValue?.transport
            }
        }
    }

    /// Counts channels made with this configuration through swift-metrics' current back end, with
    /// `role` as the `role` dimension (the metrics of the README's "Metrics" section). For channels
    /// made directly with ``MessageChannel/connect(to:configuration:logger:)`` or
    /// ``MessageChannel/accept(_:configuration:logger:)``: ``MessageServer`` and ``MessageClient``
    /// count theirs without being asked. Does nothing while no back end is bootstrapped.
    public mutating func enableMetrics(role: String) {
        metrics = MessagingMetrics.make(role: role)
    }

    /// This side's name, sent in HELLO.
    public var name: String {
        get { storage.box.values.name }
        set { storage.update { $0.name = newValue } }
    }

    /// App metadata sent in HELLO.
    public var metadata: [String: String] {
        get { storage.box.values.metadata }
        set { storage.update { $0.metadata = newValue } }
    }

    /// Codecs: the one used to send, plus any others accepted on receive.
    public var codecs: CodecRegistry {
        get { storage.box.values.codecs }
        set { storage.update { $0.codecs = newValue } }
    }

    /// Frame-level settings (max frame size, send-queue water marks, idle timeout).
    public var connection: ConnectionConfiguration {
        get { storage.box.values.connection }
        set { storage.update { $0.connection = newValue } }
    }

    /// The clock of the timers of the channels, and of the server or client, made with this
    /// configuration (Dispatch's; tests turn a `ManualScheduler`). Kept in `connection` (its
    /// `ConnectionDriver.closed(within:)` reads it there): setting `connection` afterwards
    /// sets it back to the connection's.
    package var scheduler: any Scheduler {
        get { storage.box.values.connection.scheduler }
        set { storage.update { $0.connection.scheduler = newValue } }
    }

    /// The protocol version this side speaks (tests change it to check the refusal).
    package var protocolVersion: Int {
        get { storage.box.values.protocolVersion }
        set { storage.update { $0.protocolVersion = newValue } }
    }

    /// The loops the channel's connection runs on (default: `LoopGroup.shared`, one per core).
    public var loopGroup: LoopGroup {
        get { storage.box.values.loopGroup }
        set { storage.update { $0.loopGroup = newValue } }
    }

    /// Close the connection when the hello exchange — HELLO, HELLO_ACK and, with a pre-shared key,
    /// AUTH and AUTH_OK — does not complete within this time.
    public var helloTimeout: Duration {
        get { storage.box.values.helloTimeout }
        set { storage.update { $0.helloTimeout = newValue } }
    }

    /// Send a PING this often (nil: no heartbeat).
    public var pingInterval: Duration? {
        get { storage.box.values.pingInterval }
        set { storage.update { $0.pingInterval = newValue } }
    }

    /// Close with `CloseReason.heartbeatTimeout` when nothing arrived from the peer for this long
    /// (checked every ``pingInterval``).
    public var heartbeatTimeout: Duration {
        get { storage.box.values.heartbeatTimeout }
        set { storage.update { $0.heartbeatTimeout = newValue } }
    }

    /// Overall timeout of an outbound connect (all addresses).
    public var connectTimeout: Duration {
        get { storage.box.values.connectTimeout }
        set { storage.update { $0.connectTimeout = newValue } }
    }

    /// Delay between Happy Eyeballs attempts (RFC 8305 recommends 250 ms).
    public var connectAttemptDelay: Duration {
        get { storage.box.values.connectAttemptDelay }
        set { storage.update { $0.connectAttemptDelay = newValue } }
    }

    /// How many unconsumed messages (and transfers) are buffered before reading pauses. (A
    /// ``MessageServer``'s connections hand their messages straight to its events instead:
    /// ``ServerConfiguration/eventBufferLimit`` bounds those.)
    public var incomingBufferLimit: Int {
        get { storage.box.values.incomingBufferLimit }
        set { storage.update { $0.incomingBufferLimit = newValue } }
    }

    /// How many unconsumed chunks per incoming transfer are buffered before reading pauses.
    public var transferChunkBufferLimit: Int {
        get { storage.box.values.transferChunkBufferLimit }
        set { storage.update { $0.transferChunkBufferLimit = newValue } }
    }

    /// Server side: return a non-nil refusal message to refuse a peer after its HELLO.
    public var helloValidator: (@Sendable (PeerInfo) -> String?)? {
        get { storage.box.values.helloValidator }
        set { storage.update { $0.helloValidator = newValue } }
    }

    /// A pre-shared key. When set, the hello includes a mutual HMAC-SHA256 challenge-response with
    /// fresh nonces from both sides (the key never travels): a server accepts only clients proving
    /// the same key, and a client accepts only a server proving it. See docs/PROTOCOL.md.
    public var preSharedKey: PreSharedKey? {
        get { storage.box.values.preSharedKey }
        set { storage.update { $0.preSharedKey = newValue } }
    }

    /// How the connection is protected. Default ``ChannelSecurity/standard``: protocol version 2
    /// (Noise handshake, every byte encrypted and authenticated) with this program's persistent
    /// identity and trust on first use. ``ChannelSecurity/encrypted(identity:trust:)`` chooses the
    /// identity and policy; ``ChannelSecurity/plaintext`` speaks version 1, and only to peers
    /// configured the same way (an encrypted side never falls back).
    public var security: ChannelSecurity {
        get { storage.box.values.security }
        set { storage.update { $0.security = newValue } }
    }

    /// The name the client meant to reach (a service instance name): what trust on first use
    /// remembers the server's key under, rather than the name the server gives itself (which an
    /// impostor could change to look like a first contact).
    var expectedPeerName: String? {
        get { storage.box.values.expectedPeerName }
        set { storage.update { $0.expectedPeerName = newValue } }
    }

    /// Whether the hello offers message sessions (a ``MessageServer`` accepts them, a
    /// ``MessageClient`` with sessions opens one).
    /// A server's pace under load (``ServerConfiguration/heartbeatsPerSecond``): its connections
    /// ping at it and ask their peers for it in their PONGs. nil: no pacing of our own.
    var heartbeatPacer: HeartbeatPacer? {
        get { storage.box.values.heartbeatPacer }
        set { storage.update { $0.heartbeatPacer = newValue } }
    }

    var offersSessions: Bool {
        get { storage.box.values.offersSessions }
        set { storage.update { $0.offersSessions = newValue } }
    }

    /// Creates a configuration with this side's name.
    public init(name: String) { storage = SharedValues(Values(name: name)) }

    var peerInfo: PeerInfo { peerInfo(version: protocolVersion) }

    /// The hello's public part for protocol `version`, with the session offer.
    func peerInfo(version: Int) -> PeerInfo {
        var info = PeerInfo(version: version, name: name, metadata: metadata)
        info.sessions = offersSessions
        return info
    }

    /// This side's part of the hello exchange.
    func handshakeSettings() -> HandshakeStateMachine.Settings {
        HandshakeStateMachine.Settings(
            info: peerInfo, maxFrameSize: connection.maxFrameSize, preSharedKey: preSharedKey,
            validator: helloValidator)
    }
}

extension ChannelConfiguration {
    /// The frame limit announced as `max_frame` must be one a peer accepts (1,024 … 2^32 − 1).
    package func checkFrameLimit() throws(TransportError) {
        let limit = connection.maxFrameSize
        guard limit >= HelloPayload.minMaxFrame, limit <= HelloPayload.maxMaxFrame else {
            throw TransportError(
                .invalidArgument,
                "maxFrameSize \(limit) is outside \(HelloPayload.minMaxFrame)…\(HelloPayload.maxMaxFrame) bytes: peers refuse a hello "
                    + "announcing it (docs/PROTOCOL.md, \"Hello\")")
        }
    }
}

/// The heartbeat pace of a server under load, read by its connections: 0, or the nanoseconds
/// between pings that keep all of them together near ``ServerConfiguration/heartbeatsPerSecond``
/// (``Heartbeat/pace(connections:perSecond:interval:)``). Any context.
final class HeartbeatPacer: Sendable {
    private let nanoseconds = Atomic<UInt64>(0)
    private let perSecond: Int
    private let interval: UInt64

    init(perSecond: Int, interval: UInt64) {
        self.perSecond = perSecond
        self.interval = interval
    }

    /// The current pace (0: none, the configured interval holds).
    var pace: UInt64 { nanoseconds.load(ordering: .relaxed) }

    /// The server now holds `connections`.
    func update(connections: Int) {
        nanoseconds.store(Heartbeat.pace(connections: connections, perSecond: perSecond, interval: interval), ordering: .relaxed)
    }
}
