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
