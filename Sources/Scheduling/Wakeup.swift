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
                let resumeNow = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    state.waiter = (id, continuation, nil)
                    return false
                }
                if resumeNow { return continuation.resume(returning: true) }
                // Armed after the waiter is registered (it cannot fire before); kept with it unless
                // the wait already ended, then cancelled.
                let timer = scheduler.schedule(after: duration) { [weak self] in self?.expire(id, signalled: false) }
                let ended = state.withLock { state -> Bool in
                    guard state.waiter?.id == id else { return true }
                    state.waiter?.timer = timer
                    return false
                }
                if ended { timer.cancel() }
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
