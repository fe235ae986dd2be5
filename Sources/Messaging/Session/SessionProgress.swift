/// Where one side's sending stands in its message session (``MessageClient/sendProgress``,
/// ``ServerConnection/sendProgress``).
///
/// Read right after a `send` returns (with one sending task), ``sent`` is that message's number:
/// an app that writes down what it sent with its progress learns after a restart how far the
/// session store got — a store that lost its last records (a power loss with
/// ``SessionStore/Durability/processCrash``, a file cut or restored from a backup) knows fewer
/// messages than the app sent, and the app sends those again (<doc:MessageSessions>, "When the
/// store lost records").
public struct SessionProgress: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The session's id (32 hex digits). A client's session that could not continue as its server
    /// knew it starts over under a new one.
    public let session: String
    /// How many times this side's numbering started over in the session (0 at first): the numbers
    /// of one epoch are not those of another.
    public let epoch: UInt64
    /// The number the last message sent in this epoch got (1, 2, …; 0 before the first).
    public let sent: UInt64
    /// The peer acknowledged every message of this epoch up to this number.
    public let acknowledged: UInt64

    public init(session: String, epoch: UInt64, sent: UInt64, acknowledged: UInt64) {
        self.session = session
        self.epoch = epoch
        self.sent = sent
        self.acknowledged = acknowledged
    }

    public var description: String { "\(session.prefix(8))… epoch \(epoch): sent \(sent), acknowledged \(acknowledged)" }
}
