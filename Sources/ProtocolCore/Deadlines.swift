/// The fine deadlines of one connection (handshake, request, ack), so that one timer serves them
/// all: the driver arms a single timer for ``earliest`` and, when it fires, asks which deadlines
/// ``expire(now:)``. The coarse ones are ``CoarseDeadlines``, served by the loop. Times are
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

    /// The kinds kept here; the others (idle check, linger, heartbeat) are ``CoarseDeadlines``.
    package static let kinds: [Kind] = [.handshake, .request, .ack]

    // One field per kind, 0 = unset.
    private var handshake: UInt64 = 0
    private var request: UInt64 = 0
    private var ack: UInt64 = 0

    package init() {}

    /// The deadline of `kind`, one of ``kinds`` (a coarse kind reads nil and must not be set).
    package subscript(kind: Kind) -> UInt64? {
        get {
            let value =
                switch kind {
                case .handshake: handshake
                case .request: request
                case .ack: ack
                case .idleCheck, .linger, .heartbeat: UInt64(0)
                }
            return value == 0 ? nil : value
        }
        set {
            let value = max(newValue ?? 0, newValue == nil ? 0 : 1)
            switch kind {
            case .handshake: handshake = value
            case .request: request = value
            case .ack: ack = value
            case .idleCheck, .linger, .heartbeat: preconditionFailure("\(kind) is a coarse deadline (CoarseDeadlines)")
            }
        }
    }

    /// The earliest deadline set, if any.
    package var earliest: UInt64? {
        Self.kinds.compactMap { self[$0] }.min()
    }

    /// Clears and returns the deadlines that are due at `now`, in ``kinds`` order.
    package mutating func expire(now: UInt64) -> [Kind] {
        var due: [Kind] = []
        for kind in Self.kinds {
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

/// The coarse deadlines of one connection — the heartbeat, the idle check and the linger after a
/// close, seconds apart and tolerant of a little earliness — kept apart from ``Deadlines`` so that
/// a loop serves them for all its connections with one timer (`LoopSweep` in Transport): each
/// deadline carries a *slack*, how much earlier it may be handled, and the loop handles every
/// connection whose window opened when its timer fires. Connections handled together re-arm
/// together, so an idle server's heartbeats come in a few batches per interval instead of one
/// wakeup per connection, and a server closing 19,000 connections makes no timer for each.
/// Times are uptime nanoseconds; the core never reads a clock.
package struct CoarseDeadlines: Sendable, Equatable {
    // Deadlines (0: unset) and their slack in milliseconds, in ``kinds`` order: 32 bytes.
    private var idleAt: UInt64 = 0
    private var lingerAt: UInt64 = 0
    private var heartbeatAt: UInt64 = 0
    private var idleSlack: UInt16 = 0
    private var lingerSlack: UInt16 = 0
    private var heartbeatSlack: UInt16 = 0

    /// The kinds kept here, in the order they are handled.
    package static let kinds: [Deadlines.Kind] = [.idleCheck, .linger, .heartbeat]

    /// The longest slack kept: a second.
    package static let maxSlack: UInt64 = 1_000_000_000

    package init() {}

    /// Whether `kind` is kept here rather than in ``Deadlines``.
    package static func holds(_ kind: Deadlines.Kind) -> Bool { kinds.contains(kind) }

    private static func index(_ kind: Deadlines.Kind) -> Int {
        switch kind {
        case .idleCheck: 0
        case .linger: 1
        case .heartbeat: 2
        default: preconditionFailure("\(kind) is not a coarse deadline")
        }
    }

    private func time(_ index: Int) -> UInt64 { index == 0 ? idleAt : index == 1 ? lingerAt : heartbeatAt }

    private func opens(_ index: Int) -> UInt64 {
        let slack = UInt64(index == 0 ? idleSlack : index == 1 ? lingerSlack : heartbeatSlack) * 1_000_000
        return time(index) &- slack
    }

    private mutating func store(_ index: Int, _ time: UInt64, _ slack: UInt16) {
        switch index {
        case 0: (idleAt, idleSlack) = (time, slack)
        case 1: (lingerAt, lingerSlack) = (time, slack)
        default: (heartbeatAt, heartbeatSlack) = (time, slack)
        }
    }

    /// Sets (nil: clears) the deadline of `kind` (one of ``kinds``), which may be handled up to
    /// `slack` nanoseconds early (at most ``maxSlack``; kept in whole milliseconds).
    package mutating func set(_ kind: Deadlines.Kind, at time: UInt64?, slack: UInt64) {
        store(Self.index(kind), time.map { max($0, 1) } ?? 0, UInt16(min(slack, Self.maxSlack) / 1_000_000))
    }

    /// The deadline of `kind`, if set.
    package subscript(kind: Deadlines.Kind) -> UInt64? {
        guard Self.holds(kind) else { return nil }
        let value = time(Self.index(kind))
        return value == 0 ? nil : value
    }

    /// The earliest deadline (when the loop's timer must fire at the latest), if any.
    package var earliest: UInt64? {
        (0..<3).lazy.map { time($0) }.filter { $0 != 0 }.min()
    }

    /// Whether a deadline's window is open at `now` (its time minus its slack has come).
    package func isDue(now: UInt64) -> Bool {
        (0..<3).contains { time($0) != 0 && opens($0) <= now }
    }

    /// Clears and returns the deadlines whose window is open at `now`, in ``kinds`` order.
    package mutating func expire(now: UInt64) -> [Deadlines.Kind] {
        var due: [Deadlines.Kind] = []
        for index in 0..<3 where time(index) != 0 && opens(index) <= now {
            store(index, 0, 0)
            due.append(Self.kinds[index])
        }
        return due
    }

    /// Clears them all.
    package mutating func clearAll() { self = CoarseDeadlines() }
}
