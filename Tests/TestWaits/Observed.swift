import Dispatch
import Locks

/// A value that tells its waiters when it changes: a test waits (with a deadline) for a condition
/// on it and is woken by each change, not by a poll. The lock is the package's `Locked` (a pthread
/// mutex ThreadSanitizer sees), so the TSan stage checks the tests' own sharing too.
///
/// `Observed<Int>` with nothing but a count of changes serves as a signal for a condition that lives
/// elsewhere (a file a child process writes, a process's exit): see
/// ``waitUntil(_:timeout:wokenBy:_:)``.
package final class Observed<Value: Sendable>: Sendable {
    private struct State {
        var value: Value
        /// Bumped by every change; a waiter sleeps until it moves past what it saw.
        var generation = 0
        /// Waiters for the next change, by id; each is resumed once (a change, or its deadline).
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter = 0
    }

    private let state: Locked<State>

    package init(_ value: Value) { state = Locked(State(value: value)) }

    /// The value now.
    package var value: Value { state.withLock { $0.value } }

    /// Reads under the lock (without copying what `body` does not need).
    package func read<R>(_ body: (Value) -> R) -> R { state.withLock { body($0.value) } }

    /// Changes the value and wakes every waiter (after the lock is released).
    @discardableResult
    package func update<R>(_ body: (inout Value) -> R) -> R {
        let (result, waiters) = state.withLock { state in
            let result = body(&state.value)
            state.generation += 1
            defer { state.waiters = [:] }
            return (result, Array(state.waiters.values))
        }
        for waiter in waiters { waiter.resume() }
        return result
    }

    /// ``update(_:)`` under the name a `Locked` has, so a test's shared value becomes observable by
    /// changing its declaration only: every call wakes the waiters (a read too; they check again).
    @discardableResult
    package func withLock<R>(_ body: (inout Value) -> R) -> R { update(body) }

    /// Waits until `predicate` holds for the value — checked now and after every change — and
    /// returns the value it held for; throws ``WaitTimedOut`` (with the last value) when `timeout`
    /// of real time passes first, or when the task is cancelled. `predicate` sees a copy, taken
    /// under the lock and checked outside it (it may read this `Observed` again).
    @discardableResult
    package func wait(
        _ what: String, timeout: Duration = .seconds(20), until predicate: (Value) -> Bool
    ) async throws -> Value {
        try await waitLoop(what, timeout) {
            let (value, generation) = state.withLock { ($0.value, $0.generation) }
            return (predicate(value) ? value : nil, generation)  // the copy ends here, not held while waiting
        }
    }

    /// ``wait(_:timeout:until:)`` with `predicate` run under the lock: a large value (a log of
    /// 10,000 events) is neither copied per check nor copied again by a change that comes while a
    /// check holds it. `predicate` must not touch this `Observed`; it may keep state between its
    /// calls (to look only at what is new).
    @discardableResult
    package func waitCheckingUnderLock(
        _ what: String, timeout: Duration = .seconds(20), until predicate: (Value) -> Bool
    ) async throws -> Value {
        try await waitLoop(what, timeout) {
            state.withLock { state in (predicate(state.value) ? state.value : nil, state.generation) }
        }
    }

    /// Runs `check` (the value if the condition holds, and the generation it looked at) now and at
    /// each change until it gives a value, the deadline passes or the task is cancelled.
    private func waitLoop(_ what: String, _ timeout: Duration, _ check: () -> (Value?, Int)) async throws -> Value {
        let deadline = ContinuousClock.now + timeout
        while true {
            let (held, generation) = check()
            if let held { return held }
            let left = deadline - ContinuousClock.now
            guard left > .zero, !Task.isCancelled else {
                throw WaitTimedOut(description: "not \(what) within \(timeout)\(Task.isCancelled ? " (cancelled)" : ""); last: \(value)")
            }
            await changed(after: generation, within: left)
        }
    }

    /// The number of changes so far (what ``changed(after:within:)`` compares with).
    package var generation: Int { state.withLock { $0.generation } }

    /// Returns once the value changed after `generation`, when `limit` (real time) has passed, or
    /// when the task is cancelled.
    package func changed(after generation: Int, within limit: Duration) async {
        let id = state.withLock { state in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state in
                    guard state.generation == generation, !Task.isCancelled else { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if now { return continuation.resume() }
                let (seconds, attoseconds) = limit.components
                let nanoseconds = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
                DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(nanoseconds)) { [state] in
                    state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
                }
            }
        } onCancel: { [state] in
            // (a waiter not registered yet sees the cancellation under the lock above)
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }
}

extension Observed where Value == Int {
    /// A signal: counts the changes of something a test waits on through ``waitUntil(_:timeout:wokenBy:_:)``.
    package convenience init() { self.init(0) }

    /// Tells the waiters that what they wait on may have changed.
    package func signal() { update { $0 += 1 } }
}

/// Waits until `condition` holds, checking it now and each time `signal` changes — never on a
/// timer; throws ``WaitTimedOut`` when `timeout` passes first. For a condition the test cannot hold
/// in an ``Observed`` itself (a file a child process writes, told by inotify; a process's exit).
package func waitUntil(
    _ what: String, timeout: Duration = .seconds(20), wokenBy signal: Observed<Int>, _ condition: () async -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while true {
        let generation = signal.generation  // read before the check: a change during it is not missed
        if await condition() { return }
        let left = deadline - ContinuousClock.now
        guard left > .zero, !Task.isCancelled else {
            throw WaitTimedOut(description: "not \(what) within \(timeout)\(Task.isCancelled ? " (cancelled)" : "")")
        }
        await signal.changed(after: generation, within: left)
    }
}
