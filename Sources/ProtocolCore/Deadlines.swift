/// The deadlines of one connection, so that one timer serves them all: the driver arms a single
/// timer for ``earliest`` and, when it fires, asks which deadlines ``expire(now:)``. Times are
/// uptime nanoseconds; the core never reads a clock.
package struct Deadlines: Sendable, Equatable {
    /// What a deadline is for.
    package enum Kind: Int, Sendable, CaseIterable {
        /// The hello exchange must complete by then.
        case handshake
        /// Check that a complete frame arrived recently (idle timeout).
        case idleCheck
        /// After shutting down our side: stop waiting for the peer's end of file.
        case linger
        /// Send a ping, or close a silent peer.
        case heartbeat
        /// The earliest request timeout.
        case request
        /// Acknowledge the session messages received since the last ACK.
        case ack
    }

    // One field per kind, 0 = unset: no allocation for an idle connection.
    private var handshake: UInt64 = 0
    private var idleCheck: UInt64 = 0
    private var linger: UInt64 = 0
    private var heartbeat: UInt64 = 0
    private var request: UInt64 = 0
    private var ack: UInt64 = 0

    package init() {}

    package subscript(kind: Kind) -> UInt64? {
        get {
            let value =
                switch kind {
                case .handshake: handshake
                case .idleCheck: idleCheck
                case .linger: linger
                case .heartbeat: heartbeat
                case .request: request
                case .ack: ack
                }
            return value == 0 ? nil : value
        }
        set {
            let value = max(newValue ?? 0, newValue == nil ? 0 : 1)
            switch kind {
            case .handshake: handshake = value
            case .idleCheck: idleCheck = value
            case .linger: linger = value
            case .heartbeat: heartbeat = value
            case .request: request = value
            case .ack: ack = value
            }
        }
    }

    /// The earliest deadline set, if any.
    package var earliest: UInt64? {
        Kind.allCases.compactMap { self[$0] }.min()
    }

    /// Clears and returns the deadlines that are due at `now`, in ``Kind`` order.
    package mutating func expire(now: UInt64) -> [Kind] {
        var due: [Kind] = []
        for kind in Kind.allCases {
            if let at = self[kind], at <= now {
                self[kind] = nil
                due.append(kind)
            }
        }
        return due
    }

    /// Clears every deadline.
    package mutating func clearAll() { self = Deadlines() }
}
