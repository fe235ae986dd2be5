import ProtocolCore

extension MessageClient {
    /// Where a client's connection stands, with the reason for the last transition — watched
    /// with ``MessageClient/connectionStates`` apart from ``MessageClient/events``, so an app can
    /// show it without owing reads to the message stream.
    public enum ConnectionState: Sendable, CustomStringConvertible {
        /// The first connect is under way (resolving, connecting, hello).
        case connecting
        /// Waiting for the server (``ClientConfiguration/waitsForServer``): why — the service has
        /// not appeared yet, the connection was refused, … The client keeps trying.
        case waiting(MessagingError)
        /// Connected to this peer.
        case connected(PeerInfo, via: SocketAddress?)
        /// The connection ended for `after`; reconnecting. `attempt` counts the failed attempts
        /// since (0: the first is under way), `lastError` says why the last one failed.
        case reconnecting(after: CloseReason, attempt: Int, lastError: MessagingError?)
        /// The connection ended and the client does not reconnect (no reconnect policy).
        case disconnected(CloseReason)
        /// Closed: by the app (nil), or the client gave up — the error says why (attempts
        /// exhausted, or a server key this client does not trust).
        case closed(MessagingError?)

        public var description: String {
            switch self {
            case .connecting: "connecting"
            case .waiting(let error): "waiting: \(error.message)"
            case .connected(let peer, let via): "connected to '\(peer.name)'\(via.map { " via \($0)" } ?? "")"
            case .reconnecting(let reason, let attempt, let error):
                "reconnecting after \(reason)"
                    + (attempt > 0 ? " (\(attempt) failed attempts\(error.map { ", last: \($0.message)" } ?? ""))" : "")
            case .disconnected(let reason): "disconnected: \(reason)"
            case .closed(nil): "closed"
            case .closed(let error?): "gave up: \(error.message)"
            }
        }

        /// Whether the client is connected.
        public var isConnected: Bool { if case .connected = self { true } else { false } }

        /// Whether the state stream ends here (closed, or disconnected without reconnecting): no
        /// change follows but the app's close, which turns `disconnected` into `closed(nil)`.
        var isFinal: Bool {
            switch self {
            case .closed, .disconnected: true
            default: false
            }
        }
    }
}
