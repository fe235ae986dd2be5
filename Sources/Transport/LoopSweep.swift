import Dispatch
import ProtocolCore
import Scheduling

/// One timer for the coarse deadlines (heartbeat, idle check, linger) of all the connections of a loop.
///
/// A timer per connection costs a Dispatch timer source (a few hundred bytes) and a wakeup of the
/// loop for every connection at every deadline: 19,000 idle connections pinging every 5 s woke
/// the process 3,800 times a second, and Dispatch's timer bookkeeping alone took 30 % of the
/// server's CPU. Here the loop keeps its connections with a coarse deadline in an array and arms
/// one timer for the earliest; when it fires, every connection whose window is open (its deadline
/// minus its slack, ``CoarseDeadlines``) is handled in the same wakeup, and those re-arm together.
/// Confined to the loop's queue.
///
/// On Dispatch's uptime clock and a timer source; a loop keeps another sweep for the connections
/// on each virtual clock a test gave them (``Loop/sweep(for:)``), whose timer is that clock's work.
package final class LoopSweep: @unchecked Sendable {
    private let queue: DispatchQueue
    /// nil: Dispatch's clock and `timer`.
    private let clock: (any Scheduler)?
    private var members: [ConnectionDriver] = []
    /// The clock's (one Dispatch timer source for Dispatch's), made at the first arming.
    private var timer: (any RearmableTimer)?
    /// When the timer fires (ns on the sweep's clock); 0 when it is not armed.
    private var armed: UInt64 = 0

    init(queue: DispatchQueue, clock: (any Scheduler)? = nil) {
        self.queue = queue
        self.clock = clock
    }

    private var now: UInt64 { clock?.now ?? uptimeNanoseconds() }

    /// Connections with a coarse deadline on this loop. On the loop.
    package var count: Int { members.count }

    /// `driver`'s coarse deadlines changed: keeps it a member while it has one and the timer armed
    /// early enough. On the loop.
    func update(_ driver: ConnectionDriver) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard let due = driver.coarseDeadlines.earliest else { return remove(driver) }
        if driver.sweepIndex < 0 {
            driver.sweepIndex = Int32(members.count)
            members.append(driver)
        }
        if armed == 0 || due < armed { arm(due) }
    }

    /// Forgets `driver` (it closed, or has no coarse deadline left). On the loop.
    func remove(_ driver: ConnectionDriver) {
        let index = Int(driver.sweepIndex)
        guard index >= 0 else { return }
        driver.sweepIndex = -1
        let last = members.removeLast()
        if index < members.count {
            members[index] = last
            last.sweepIndex = Int32(index)
        }
        if members.isEmpty {
            // No member: no timer (an idle process holds none).
            timer?.cancel()
            timer = nil
            armed = 0
        }
    }

    private func arm(_ time: UInt64) {
        let timer: any RearmableTimer
        if let existing = self.timer {
            timer = existing
        } else {
            // Weak: one side table per loop, and a manual clock's work may outlive a test's loop.
            // No leeway: the connections' slack (``CoarseDeadlines``) is the sweep's coalescing.
            timer = (clock ?? DispatchScheduler()).makeTimer(on: queue, leeway: .zero) { [weak self] in self?.fire() }
            self.timer = timer
        }
        armed = time
        timer.arm(at: time)
    }

    private func fire() {
        armed = 0
        let now = self.now
        // Collected first: handling one may close it or others (they leave the array).
        let due = members.filter { $0.coarseDeadlines.isDue(now: now) }
        for driver in due { driver.sweepFired(now: now) }
        var next = UInt64.max
        for driver in members {
            if let time = driver.coarseDeadlines.earliest, time < next { next = time }
        }
        if next != .max && (armed == 0 || next < armed) { arm(next) }
    }
}
