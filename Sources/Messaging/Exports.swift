// What users import: `import Messaging` brings the discovery API and the value types of the wire
// protocol (errors, close reasons, peer info, addresses, keys) along — not the wire internals
// (frames, decoder, connection driver, listener), which stay in ProtocolCore and Transport.
@_exported import Discovery
@_exported import ProtocolCore
import Transport

/// The loops connections run on (see ``ChannelConfiguration/loopGroup``).
public typealias LoopGroup = Transport.LoopGroup
/// Frame-level settings of a connection (see ``ChannelConfiguration/connection``).
public typealias ConnectionConfiguration = Transport.ConnectionConfiguration
