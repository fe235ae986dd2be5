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
            wakeAcknowledgementWaiters(&effects)
        }
        wakeDrainsIfDue(&effects)
        return nil
    }

    // MARK: Waiting for acknowledgements

    /// A caller waits until the peer acknowledged this epoch's messages up to `through` (nil: all
    /// numbered so far; a number beyond them: those) — completed at once when they are, and with
    /// `false` at once after the session ended.
    mutating func waitForAcknowledgement(_ waiterID: UInt64, through: UInt64?, _ waiter: Drain, _ effects: inout Effects) {
        let sent = outbox.nextNumber - 1
        let through = min(through ?? sent, sent)
        if ended != nil {
            // (Its outbox is emptied: what it kept was reported undelivered, not acknowledged.)
            effects.acknowledgements.append((waiter, false))
        } else if outbox.acknowledged >= through {
            effects.acknowledgements.append((waiter, true))
        } else {
            acknowledgementWaiters.append(AcknowledgementWaiter(id: waiterID, epoch: epoch, through: through, waiter: waiter))
        }
    }

    /// A waiter's deadline passed or its task was cancelled: it ends, not acknowledged (if it still waits).
    mutating func cancelAcknowledgementWait(_ waiterID: UInt64, _ effects: inout Effects) {
        guard let index = acknowledgementWaiters.firstIndex(where: { $0.id == waiterID }) else { return }
        effects.acknowledgements.append((acknowledgementWaiters.remove(at: index).waiter, false))
    }

    /// Completes the waiters whose messages are all acknowledged; with `false` every one when the
    /// session ended (what it kept is reported undelivered), and those of an older epoch (their
    /// messages were reported undelivered when it started anew: ``startAnew(renewing:_:)``).
    mutating func wakeAcknowledgementWaiters(_ effects: inout Effects) {
        guard !acknowledgementWaiters.isEmpty else { return }
        let over = ended != nil
        acknowledgementWaiters.removeAll { waiter in
            if over || waiter.epoch != epoch {
                effects.acknowledgements.append((waiter.waiter, false))
                return true
            }
            guard outbox.acknowledged >= waiter.through else { return false }
            effects.acknowledgements.append((waiter.waiter, true))
            return true
        }
    }

    /// The session starts anew: its transmitted messages are reported undelivered, the others
    /// (`unsent`, old numbers in order) are renumbered from 1. A waiter for any of the lost ones
    /// ends (not acknowledged, when ``wakeAcknowledgementWaiters(_:)`` runs next); one whose
    /// messages were all acknowledged or never sent waits for the kept ones under their new numbers.
    mutating func acknowledgementWaitersRenumbered(lost: [SessionOutbox<Frame>.Entry], unsent: [UInt64], from previous: UInt64) {
        guard !acknowledgementWaiters.isEmpty else { return }
        let firstLost = lost.map(\.number).min()
        for index in acknowledgementWaiters.indices where acknowledgementWaiters[index].epoch == previous {
            let through = acknowledgementWaiters[index].through
            if let firstLost, firstLost <= through { continue }
            acknowledgementWaiters[index].through = UInt64(unsent.prefix { $0 <= through }.count)
            acknowledgementWaiters[index].epoch = epoch
        }
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
