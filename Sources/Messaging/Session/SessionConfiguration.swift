import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// How long and how much a message session keeps.
public struct SessionConfiguration: Sendable {
    /// Most one-way messages kept until the peer acknowledges them; a sender beyond it waits
    /// (back-pressure, nothing is dropped).
    public var maxUnacknowledgedMessages = 4096
    /// Most bytes of payload kept until acknowledged.
    public var maxUnacknowledgedBytes = 8 << 20
    /// Server: how long a session whose connection was lost is kept for the client to resume it.
    public var gracePeriod: Duration = .seconds(60)
    /// How long after a message is handled the receiver acknowledges it at the latest (it also
    /// acknowledges every 32 handled messages at once).
    public var ackDelay: Duration = .milliseconds(20)
    /// Keep the sessions on disk, so that a restarted server or client continues them
    /// (``SessionStore``; nil: in memory only, the default).
    public var store: SessionStore?
    /// When a received session message counts as handled, and so may be acknowledged to its
    /// sender (who then forgets it): ``SessionAcknowledgement/automatic`` by default — when the
    /// loop iteration over the events, or the handler, that got it is done.
    public var acknowledgement: SessionAcknowledgement = .automatic

    public init() {}
}
