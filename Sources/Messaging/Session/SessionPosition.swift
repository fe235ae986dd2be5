import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// Where a received session message stands in its session: store it with the message's effect,
/// and skip a message whose position you already have, to see each message exactly once across
/// crashes (<doc:MessageSessions>, "Exactly once").
public struct SessionPosition: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The session, as this side knows it: 32 hex digits, random, never used for another session.
    /// It stays the same across reconnects (and across restarts with a ``SessionStore``); when a
    /// session starts over (the peer did not know it any more), a new one begins.
    public let session: String
    /// The message's number in the session: 1, 2, 3, … in order, without gaps.
    public let number: UInt64

    public init(session: String, number: UInt64) {
        self.session = session
        self.number = number
    }

    public var description: String { "\(session.prefix(8))…#\(number)" }
}

/// What a delivered session message carries to acknowledge it (``IncomingMessage/acknowledge()``).
struct SessionMessageToken: Sendable {
    let session: MessageSession
    let epoch: UInt64
    let position: SessionPosition

    /// Its session acknowledges when the code that got the message is done with it.
    var isAutomatic: Bool { session.configuration.acknowledgement == .automatic }

    /// The app handled the message (`automatic`: its loop iteration or handler is done, which
    /// counts only with ``SessionAcknowledgement/automatic``).
    func handled(automatic: Bool) {
        if automatic && session.configuration.acknowledgement != .automatic { return }
        session.handled(position.number, epoch: epoch)
    }
}
