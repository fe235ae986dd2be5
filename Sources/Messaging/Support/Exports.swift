// What users import: `import Messaging` brings what an app names — the server, the client, their
// configurations and events, and the few discovery and wire value types that appear in their
// signatures (below) — and nothing else. The rest of the discovery API (browsing, resolving,
// wide-area administration) is `import Discovery`; the wire internals (frames, decoder,
// connection driver, listener) stay in ProtocolCore and Transport.
import Discovery
import ProtocolCore
import Transport

/// The loops connections run on (see ``ChannelConfiguration/loopGroup``).
public typealias LoopGroup = Transport.LoopGroup
/// Frame-level settings of a connection (see ``ChannelConfiguration/connection``).
public typealias ConnectionConfiguration = Transport.ConnectionConfiguration

/// DNS-SD through Avahi or the embedded stack: what ``MessageServer`` publishes with and a
/// ``ServiceTarget/service(name:type:discovery:)`` browses with. Browsing and resolving
/// yourself: `import Discovery`.
public typealias ServiceDiscovery = Discovery.ServiceDiscovery
/// How a ``ServiceDiscovery`` works: interfaces, IP versions, wide-area domains.
public typealias DiscoveryConfiguration = Discovery.DiscoveryConfiguration
/// Which network interfaces discovery uses (``DiscoveryConfiguration``).
public typealias InterfacePolicy = Discovery.InterfacePolicy
/// A DNS-SD TXT record (``ServerConfiguration/txt``, ``MessageServer/updateTXT(_:)``).
public typealias TXTRecord = Discovery.TXTRecord
/// Why discovery failed (the `underlying` error of a ``MessagingError``).
public typealias DiscoveryError = Discovery.DiscoveryError
/// Why a connection or a wire operation failed.
public typealias TransportError = ProtocolCore.TransportError
/// Why a connection closed.
public typealias CloseReason = ProtocolCore.CloseReason
/// What a peer said about itself in the hello exchange.
public typealias PeerInfo = ProtocolCore.PeerInfo
/// An IPv4 or IPv6 socket address.
public typealias SocketAddress = ProtocolCore.SocketAddress
/// A key shared by every peer of a deployment (``ChannelConfiguration/preSharedKey``).
public typealias PreSharedKey = ProtocolCore.PreSharedKey
/// Where and how a server listens (``ServerConfiguration/listener``): port, loopback only, one
/// address, families, backlog.
public typealias ListenerConfiguration = Transport.Listener.Configuration
/// A connection a listener accepted, before its handshake (``MessageChannel/accept(_:configuration:logger:)``).
public typealias AcceptedSocket = Transport.AcceptedSocket
/// A service found by browsing (``MessageClient/find(name:type:discovery:timeout:notFoundYet:)``).
/// Resolving it yourself: `import Discovery`.
public typealias DiscoveredService = Discovery.DiscoveredService
