import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// When the receiver of a session message tells its sender that the message is handled (the
/// sender then forgets it). Until then the sender keeps it, and resends it after a reconnect.
///
/// Only what the app has handled is acknowledged, so a message that sat in the events queue when
/// the process died was never acknowledged: the sender still has it. Whether it then reaches the
/// app again depends on the side that died keeping its session (``SessionStore``); see
/// <doc:MessageSessions>.
public struct SessionAcknowledgement: Sendable, Hashable, CustomStringConvertible {
    private enum Kind: Sendable, Hashable { case automatic, manual, onArrival }
    private let kind: Kind

    /// A message is handled when the code that got it is done with it: the next call of the events
    /// iterator's `next()` (the `for await` loop's next iteration) after ``ServerEvent/received(_:_:)``
    /// or ``ClientEvent/received(_:)``; the return of an ``MessageChannel/on(type:as:_:)`` handler.
    /// A loop that ends before asking for more — `break`, `return`, a throw — has not handled the
    /// message it was on: it is handed out again, first, to the next loop over the same events
    /// (call ``IncomingMessage/acknowledge()`` before leaving when it was handled).
    /// ``IncomingMessage/acknowledge()`` says so earlier.
    public static let automatic = SessionAcknowledgement(kind: .automatic)
    /// Only ``IncomingMessage/acknowledge()`` says a message is handled (in any order; what is
    /// acknowledged is everything up to the first one not yet acknowledged). For an app that
    /// hands messages on to other tasks, or stores their effect before it acknowledges.
    public static let manual = SessionAcknowledgement(kind: .manual)
    /// A message counts as handled when it arrives in the library, before the app has seen it (the
    /// behaviour of 1.0): a message still queued for the app when the process dies is lost. So is
    /// a report of undelivered messages: it is made once, from memory, and not kept in the store.
    public static let onArrival = SessionAcknowledgement(kind: .onArrival)

    public var description: String { "\(kind)" }
}
