import Dispatch
import Locks

// Timers for Discovery's drivers and Messaging's client (`package`): Dispatch timers, never a
// sleeping task (a cancelled wait ends at once, and no task of the cooperative pool is held by a wait).

/// Sleeps for a while unless signalled first (a pending signal ends the next wait at once) or the
/// task is cancelled.
package final class Wakeup: Sendable {
    private struct State {
        var pending = false
        var waiter: (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: any DispatchSourceTimer)?
        var nextID = 0
    }
    private let state = Locked(State())

    package init() {}

    package func signal() {
        let waiter = state.withLock { state -> (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: any DispatchSourceTimer)? in
            guard let waiter = state.waiter else {
                state.pending = true
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.timer.cancel()
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
                let timer = DispatchSource.makeTimerSource(queue: .global())
                let resumeNow = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    state.waiter = (id, continuation, timer)
                    return false
                }
                if resumeNow {
                    timer.activate()
                    timer.cancel()
                    continuation.resume(returning: true)
                    return
                }
                timer.setEventHandler { [weak self] in self?.expire(id, signalled: false) }
                timer.schedule(deadline: .now() + duration.dispatchInterval)
                timer.activate()
            }
        } onCancel: {
            expire(id, signalled: false)
        }
    }

    private func expire(_ id: Int, signalled: Bool) {
        let waiter = state.withLock { state -> (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: any DispatchSourceTimer)? in
            guard let waiter = state.waiter, waiter.id == id else { return nil }
            state.waiter = nil
            return waiter
        }
        waiter?.timer.cancel()
        waiter?.continuation.resume(returning: signalled)
    }
}

extension Wakeup {
    /// Waits `duration` on a Dispatch timer, or until the task is cancelled.
    package static func sleep(for duration: Duration) async {
        _ = await Wakeup().wait(duration)
    }
}

/// `operation`'s result, or `onTimeout()` when it has not finished within `timeout` (a Dispatch
/// timer; the operation is then cancelled, and awaited: it must end on cancellation).
func withDeadline<T: Sendable>(
    _ timeout: Duration, onTimeout: @escaping @Sendable () -> T, operation: @escaping @Sendable () async -> T
) async -> T {
    await withTaskGroup(of: T?.self) { group in
        group.addTask { await operation() }
        group.addTask {
            await Wakeup.sleep(for: timeout)
            return Task.isCancelled ? nil : onTimeout()
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first ?? onTimeout()
    }
}
