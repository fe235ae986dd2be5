import Scheduling

// Discovery's deadlines: a wait is a scheduler's timer (`Wakeup`, `Scheduler.sleep`, in
// Scheduling), never a sleeping task.

/// `operation`'s result, or `onTimeout()` when it has not finished within `timeout` (a timer of
/// `scheduler`: the wide area's clock, a manual one in tests; the operation is then cancelled, and
/// awaited: it must end on cancellation).
func withDeadline<T: Sendable>(
    _ timeout: Duration, on scheduler: any Scheduler, onTimeout: @escaping @Sendable () -> T,
    operation: @escaping @Sendable () async -> T
) async -> T {
    await withTaskGroup(of: T?.self) { group in
        group.addTask { await operation() }
        group.addTask {
            await scheduler.sleep(for: timeout)
            return Task.isCancelled ? nil : onTimeout()
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first ?? onTimeout()
    }
}
