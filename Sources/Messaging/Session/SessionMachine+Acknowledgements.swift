import ProtocolCore

/// The session machine's acknowledgements from the peer, drains, and a connection's end.
extension SessionMachine {
    // MARK: Acknowledgements from the peer

    /// The peer acknowledged `count` messages on `link`. Returns an error text for a violation.
    mutating func acknowledged(_ count: UInt64, on link: Link, _ effects: inout Effects) -> String? {
        guard channel === link else { return nil }
        guard let released = outbox.acknowledge(through: count) else {
            return "ACK of \(count) messages, but only \(outbox.nextNumber - 1) were sent"
        }
        if released > 0 {
            wakeRoomWaiters(&effects)
            // Never waited for: a released record lost in a crash only makes the restarted side
            // resend what the peer says it has (it drops them).
            if stored { effects.records.append(.released(id, epoch: storeEpoch, through: count)) }
        }
        wakeDrainsIfDue(&effects)
        return nil
    }

    // MARK: Draining

    /// Whether a drain wait is over: nothing is kept, or the connection or the session is gone.
    var drainIsDue: Bool { outbox.count == 0 || channel == nil || ended != nil }

    /// A drain caller waits (resumed at once when it is due).
    mutating func drain(_ waiter: Drain, _ effects: inout Effects) {
        if drainIsDue { effects.drains.append(waiter) } else { drainWaiters.append(waiter) }
    }

    mutating func wakeDrainsIfDue(_ effects: inout Effects) {
        guard drainIsDue else { return }
        effects.drains += drainWaiters
        drainWaiters = []
    }

    /// The connection closed: keep everything for the next one.
    mutating func detach(_ link: Link, _ effects: inout Effects) {
        guard channel === link else { return }
        phase = .detached
        wakeDrainsIfDue(&effects)
    }

    /// A server's session: puts a resumed session's new channel in place; returns the old one.
    mutating func replaceServing(with link: Link) -> Link? {
        defer { serving = link }
        return serving
    }
}
