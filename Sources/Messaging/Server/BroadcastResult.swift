import Discovery
import Locks
import ProtocolCore
import Transport

/// The outcome of a broadcast for one connection.
public struct BroadcastResult: Sendable {
    /// The connection.
    public let connection: ServerConnection
    /// Why sending to it failed (nil: the message was queued for it).
    public let error: (any Error)?
    /// Whether the message was queued for this connection.
    public var succeeded: Bool { error == nil }
}
