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

/// The coarse deadlines of one connection — the heartbeat and the idle check, seconds apart and
/// tolerant of a little earliness — kept apart from ``Deadlines`` so that a loop serves them for
/// all its connections with one timer (`LoopSweep` in Transport): each deadline carries a *slack*,
/// how much earlier it may be handled, and the loop handles every connection whose window opened
/// when its timer fires. Connections handled together re-arm together, so an idle server's
/// heartbeats come in a few batches per interval instead of one wakeup per connection.
/// Times are uptime nanoseconds; the core never reads a clock.
package struct CoarseDeadlines: Sendable, Equatable {
    private var heartbeat: UInt64 = 0
    private var heartbeatSlack: UInt32 = 0
    private var idleSlack: UInt32 = 0
    private var idleCheck: UInt64 = 0

    /// The longest slack kept: a second (in nanoseconds, it fits 32 bits).
    package static let maxSlack: UInt64 = 1_000_000_000

    package init() {}

    /// Whether `kind` is kept here rather than in ``Deadlines``.
    package static func holds(_ kind: Deadlines.Kind) -> Bool { kind == .heartbeat || kind == .idleCheck }

    /// Sets (nil: clears) the deadline of `kind` (``Deadlines/Kind/heartbeat`` or
    /// ``Deadlines/Kind/idleCheck``), which may be handled up to `slack` nanoseconds early
    /// (at most ``maxSlack``).
    package mutating func set(_ kind: Deadlines.Kind, at time: UInt64?, slack: UInt64) {
        let at = time.map { max($0, 1) } ?? 0
        let early = UInt32(min(slack, Self.maxSlack))
        switch kind {
        case .heartbeat: (heartbeat, heartbeatSlack) = (at, early)
        case .idleCheck: (idleCheck, idleSlack) = (at, early)
        default: preconditionFailure("\(kind) is not a coarse deadline")
        }
    }

    /// The deadline of `kind`, if set.
    package subscript(kind: Deadlines.Kind) -> UInt64? {
        let value = kind == .heartbeat ? heartbeat : kind == .idleCheck ? idleCheck : 0
        return value == 0 ? nil : value
    }

    /// The earliest deadline (when the loop's timer must fire at the latest), if any.
    package var earliest: UInt64? {
        switch (heartbeat, idleCheck) {
        case (0, 0): nil
        case (0, let idle): idle
        case (let beat, 0): beat
        case (let beat, let idle): min(beat, idle)
        }
    }

    /// Whether a deadline's window is open at `now` (its time minus its slack has come).
    package func isDue(now: UInt64) -> Bool {
        (heartbeat != 0 && heartbeat &- UInt64(heartbeatSlack) <= now)
            || (idleCheck != 0 && idleCheck &- UInt64(idleSlack) <= now)
    }

    /// Clears and returns the deadlines whose window is open at `now`, idle check first.
    package mutating func expire(now: UInt64) -> [Deadlines.Kind] {
        var due: [Deadlines.Kind] = []
        if idleCheck != 0 && idleCheck &- UInt64(idleSlack) <= now {
            idleCheck = 0
            due.append(.idleCheck)
        }
        if heartbeat != 0 && heartbeat &- UInt64(heartbeatSlack) <= now {
            heartbeat = 0
            due.append(.heartbeat)
        }
        return due
    }

    /// Clears both.
    package mutating func clearAll() { self = CoarseDeadlines() }
}
