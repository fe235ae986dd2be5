import Discovery
import Locks
import ProtocolCore
import Transport

/// Something that happened on a ``MessageServer``.
public enum ServerEvent: Sendable, CustomStringConvertible {
    /// The service is announced on the network under this name.
    case published(name: String)
    /// The name collided; the service is re-published under `to`.
    case renamed(from: String, to: String)
    /// A client connected and completed the hello.
    case accepted(ServerConnection)
    /// A message arrived.
    case received(ServerConnection, IncomingMessage)
    /// A streamed transfer started; consume its chunks or `discard()` it.
    case transfer(ServerConnection, IncomingTransfer)
    /// A connection ended, with the reason. For a connection with a message session this is the
    /// session's end: the client closed, or did not come back within the grace period.
    case closed(ServerConnection, CloseReason)
    /// A connection with a message session was lost; the session waits for the client to come back
    /// (``resumed(_:resent:)``) until its grace period ends (``closed(_:_:)``). Messages sent to it
    /// meanwhile are kept.
    case interrupted(ServerConnection, CloseReason)
    /// The client came back on a new connection and its session continues: `resent` messages it
    /// had not received were sent again.
    case resumed(ServerConnection, resent: Int)
    /// Messages sent to this connection's session that the client never acknowledged, reported when
    /// the session ends without them (the client did not come back, the app closed the connection,
    /// the client did not read) or starts anew. With a ``SessionStore`` the report stays in the
    /// store until the events loop asks for the next event; a server that stopped or died before
    /// reports it again when it starts, first, on a connection made for the report (its channel
    /// closed, its peer named by the key that opened the session; no other event names it).
    case undelivered(ServerConnection, [UndeliveredMessage])
    /// A connection was refused (connection limit, busy, failed hello or handshake), with the
    /// reason. At most 100 a second are reported, and none while the event queue is full (a flood
    /// would otherwise cost the app a wake-up per attempt); every refusal is counted in the metrics
    /// and summarised in the log (``ServerConfiguration/refusalLogInterval``).
    case refused(remote: SocketAddress?, reason: String)
    /// Wide-area: the service is registered in the unicast DNS domain `domain` under `name` (after
    /// a first registration, a re-registration or a rename there).
    case registered(name: String, domain: String)
    /// Wide-area: registering in `domain` failed; the error says why and what to do. The link
    /// publication is not affected, and the registration is retried.
    case registrationFailed(domain: String, DiscoveryError)

    public var description: String {
        switch self {
        case .published(let name): "published as '\(name)'"
        case .renamed(let from, let to): "renamed '\(from)' → '\(to)'"
        case .accepted(let connection): "accepted \(connection)"
        case .received(let connection, let message): "received \(message.typeID) #\(message.sequence) from \(connection)"
        case .transfer(let connection, let transfer): "transfer \(transfer.typeID) (\(transfer.totalSize) bytes) from \(connection)"
        case .closed(let connection, let reason): "closed \(connection): \(reason)"
        case .interrupted(let connection, let reason): "interrupted \(connection): \(reason); waiting for it to resume"
        case .resumed(let connection, let resent): "resumed \(connection) (\(resent) messages sent again)"
        case .undelivered(let connection, let messages): "\(messages.count) messages to \(connection) not acknowledged"
        case .refused(let remote, let reason): "refused \(remote.map { "\($0)" } ?? "?"): \(reason)"
        case .registered(let name, let domain): "registered as '\(name)' in \(domain)"
        case .registrationFailed(let domain, let error): "registration in \(domain) failed: \(error.message)"
        }
    }
}

/// The server's events, in order. One consumer. When the app does not consume them, the server
/// stops reading from its connections (bounded memory) until it does.
public struct ServerEvents: AsyncSequence, Sendable {
    public typealias Element = ServerEvent
    let queue: BoundedQueue<ServerEvent>

    /// Asking it for the next event counts as having handled the message of the
    /// ``ServerEvent/received(_:_:)`` before (``SessionAcknowledgement/automatic``); leaving the
    /// loop first (`break`, `return`, a throw) does not: that event is handed out again, first, to
    /// the next loop over the events.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let queue: BoundedQueue<ServerEvent>
        let handling: HandledOnNext<ServerEvent>
        public mutating func next() async -> ServerEvent? {
            handling.done()
            let event = try? await queue.next()
            switch event {
            case .received(_, let message)?: handling.handling(event, message)
            case .undelivered(_, let messages)?: handling.handlingReport(event!, messages)
            default: break
            }
            return event
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(queue: queue, handling: HandledOnNext(queue)) }
}
