import Locks

// The one wait of the package's drivers (Discovery's wide-area registration and browse) and of
// `Scheduler.sleep`: a scheduler's timer, never a sleeping task (a cancelled wait ends at once,
// and no task of the cooperative pool is held by a wait).

/// Sleeps for a while unless signalled first (a pending signal ends the next wait at once) or the
/// task is cancelled.
package final class Wakeup: Sendable {
    private struct State {
        var pending = false
        var waiter: (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: ScheduledWork?)?
        var nextID = 0
    }
    private let state = Locked(State())
    private let scheduler: any Scheduler

    package init(scheduler: any Scheduler = DispatchScheduler()) {
        self.scheduler = scheduler
    }

    package func signal() {
        let waiter = state.withLock { state -> (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: ScheduledWork?)? in
            guard let waiter = state.waiter else {
                state.pending = true
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.timer?.cancel()
        waiter?.continuation.resume(returning: true)
    }

    /// Waits up to `duration`; true when signalled.
    package func wait(_ duration: Duration) async -> Bool {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                // The timer is armed in the same critical section that registers the waiter: it
                // cannot fire before (its expiry takes this lock), and a signal always finds it with
                // the waiter and cancels it. (Armed after the section, a signal in between left it
                // pending until the section after it cancelled it: a simulation counting the timers
                // saw a driver waiting that was already working — issue 54, seed 2335.)
                let resumeNow = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    let timer = scheduler.schedule(after: duration) { [weak self] in self?.expire(id, signalled: false) }
                    state.waiter = (id, continuation, timer)
                    return false
                }
                if resumeNow { continuation.resume(returning: true) }
            }
        } onCancel: {
            expire(id, signalled: false)
        }
    }

    private func expire(_ id: Int, signalled: Bool) {
        let waiter = state.withLock { state -> (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: ScheduledWork?)? in
            guard let waiter = state.waiter, waiter.id == id else { return nil }
            state.waiter = nil
            return waiter
        }
        waiter?.timer?.cancel()
        waiter?.continuation.resume(returning: signalled)
    }
}
