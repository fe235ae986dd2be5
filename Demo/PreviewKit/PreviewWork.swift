import Locks
import Scheduling

/// ``PreviewService``'s background work as children of one root task (as `MessageServer`'s
/// `ServerWork`): answering offers, sending results, receiving pushes. Nothing of it is an
/// unstructured task of its own; a push can be cancelled alone (``Job``), and the service's end
/// ends the root.
final class PreviewWork: Sendable {
    typealias Body = @Sendable () async -> Void
    private let jobs: AsyncStream<Body>.Continuation
    private let root: Task<Void, Never>

    init() {
        let (stream, continuation) = AsyncStream.makeStream(of: Body.self)
        jobs = continuation
        root = Task {
            await withDiscardingTaskGroup { group in
                for await job in stream { group.addTask { await job() } }
            }
        }
    }

    deinit { jobs.finish() }

    /// Runs `body` as a child of the root; false (not run) once the work is finished.
    @discardableResult
    func run(_ body: @escaping Body) -> Bool {
        if case .enqueued = jobs.yield(body) { return true }
        return false
    }

    /// Runs `job` as a child of the root, cancellable on its own (``Job/cancel()``).
    @discardableResult
    func run(_ job: Job) -> Bool {
        run { await job.run() }
    }

    /// Takes no more jobs; the root ends when those running end.
    func finish() { jobs.finish() }

    /// Waits until the root ended (after ``finish()``).
    func ended() async { await root.value }

    /// One push's receive: a child of the root that ``cancel()`` cancels — its task is cancelled
    /// (the store deletes what it wrote) — and whose end ``ended()`` waits for.
    final class Job: Sendable {
        private struct State {
            var cancelled = false
            var finished = false
            var cancelWaiter: CheckedContinuation<Void, Never>?
            var endWaiters: [CheckedContinuation<Void, Never>] = []
        }
        private let body: Body
        private let state = Locked(State())

        init(_ body: @escaping Body) { self.body = body }

        /// Runs the body beside a watcher of ``cancel()``: the first to end cancels the other.
        fileprivate func run() async {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await self.body() }
                group.addTask { await self.cancelled() }
                await group.next()
                group.cancelAll()
            }
            let waiters = state.withLock { state in
                state.finished = true
                defer { state.endWaiters = [] }
                return state.endWaiters
            }
            for waiter in waiters { waiter.resume() }
        }

        /// Returns when ``cancel()`` is called, or when the waiting task is cancelled (the body ended).
        private func cancelled() async {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let now = state.withLock { state -> Bool in
                        if state.cancelled || Task.isCancelled { return true }
                        state.cancelWaiter = continuation
                        return false
                    }
                    if now { continuation.resume() }
                }
            } onCancel: {
                state.withLock { state in
                    state.cancelled = true
                    defer { state.cancelWaiter = nil }
                    return state.cancelWaiter
                }?.resume()
            }
        }

        /// Cancels the body (nothing once it ended).
        func cancel() {
            state.withLock { state in
                state.cancelled = true
                defer { state.cancelWaiter = nil }
                return state.cancelWaiter
            }?.resume()
        }

        /// The job will never run (the work was finished before it could): it counts as ended.
        func abandon() {
            let waiters = state.withLock { state in
                state.finished = true
                defer { state.endWaiters = [] }
                return state.endWaiters
            }
            for waiter in waiters { waiter.resume() }
        }

        /// Waits until the job ended (at once if it did, or was abandoned).
        func ended() async {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let done = state.withLock { state -> Bool in
                    if state.finished { return true }
                    state.endWaiters.append(continuation)
                    return false
                }
                if done { continuation.resume() }
            }
        }
    }
}

/// Waits `duration` on `scheduler`'s clock (a timer, not a sleeping task); ends at once when the
/// task is cancelled.
func timerSleep(for duration: Duration, on scheduler: any Scheduler = DispatchScheduler()) async {
    await scheduler.sleep(for: duration)
}
