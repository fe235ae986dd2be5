import Discovery
import ProtocolCore
import Transport

/// Something that happened on a ``MessageClient``.
public enum ClientEvent: Sendable, CustomStringConvertible {
    /// Connected (first time or after a reconnect) to this peer.
    case connected(PeerInfo, via: SocketAddress?)
    /// A message arrived.
    case received(IncomingMessage)
    /// A streamed transfer started; consume its chunks or `discard()` it.
    case transfer(IncomingTransfer)
    /// The connection ended, with the reason.
    case disconnected(CloseReason)
    /// Waiting for the server (``ClientConfiguration/waitsForServer``): the error says what for
    /// (the service has not appeared yet, the connection was refused, …); the client keeps trying.
    case waiting(MessagingError)
    /// Trying again after `delay` (attempt counts from 1).
    case reconnecting(attempt: Int, delay: Duration)
    /// Reconnection stopped (attempts exhausted); the client is closed.
    case gaveUp(MessagingError)
    /// The message session continued on the new connection: `resent` messages the server had not
    /// received were sent again (and the server resent what this side had not received).
    case resumed(resent: Int)
    /// Messages sent in a message session that the server never acknowledged, when the session
    /// could not be resumed (the server restarted or forgot it) or ended: they may or may not have
    /// arrived, and are not sent again. Never a silent loss: with a ``SessionStore`` the report
    /// stays in the store until the events loop asks for the next event, and a client made again
    /// on the store before that reports it again, first.
    case undelivered([UndeliveredMessage])

    public var description: String {
        switch self {
        case .connected(let peer, let via): "connected to '\(peer.name)'\(via.map { " via \($0)" } ?? "")"
        case .received(let message): "received \(message.typeID) #\(message.sequence)"
        case .transfer(let transfer): "transfer \(transfer.typeID) (\(transfer.totalSize) bytes)"
        case .disconnected(let reason): "disconnected: \(reason)"
        case .waiting(let error): "waiting: \(error.message)"
        case .reconnecting(let attempt, let delay): "reconnecting (attempt \(attempt)) in \(delay)"
        case .gaveUp(let error): "gave up: \(error)"
        case .resumed(let resent): "session resumed (\(resent) messages sent again)"
        case .undelivered(let messages): "\(messages.count) messages not acknowledged: \(messages.map(\.description).joined(separator: ", "))"
        }
    }
}

/// The client's events, in order. One consumer.
public struct ClientEvents: AsyncSequence, Sendable {
    public typealias Element = ClientEvent
    let queue: BoundedQueue<ClientEvent>

    /// Asking it for the next event counts as having handled the message of the
    /// ``ClientEvent/received(_:)`` before (``SessionAcknowledgement/automatic``); leaving the loop
    /// first (`break`, `return`, a throw) does not: that event is handed out again, first, to the
    /// next loop over the events.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let queue: BoundedQueue<ClientEvent>
        let handling: HandledOnNext<ClientEvent>
        public mutating func next() async -> ClientEvent? {
            handling.done()
            let event = try? await queue.next()
            switch event {
            case .received(let message)?: handling.handling(event, message)
            case .undelivered(let messages)?: handling.handlingReport(event!, messages)
            default: break
            }
            return event
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(queue: queue, handling: HandledOnNext(queue)) }
}
