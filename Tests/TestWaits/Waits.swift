/// The tests' one poll for a condition (issue 46, 4: it was written four times, in three test
/// targets; issue 54: four more copies in the integration tests, merged here): checks `condition`
/// every `interval` (5 ms) until it holds, or throws when `timeout` passes — a deadline on a
/// condition, never a sleep standing in for one. For a condition on state that cannot tell its
/// changes (a library's counters, an external server); a value the test owns is an ``Observed``
/// and is waited for with ``Observed/wait(_:timeout:until:)``, woken by its changes.
package func waitUntil(
    _ what: String, timeout: Duration = .seconds(20), every interval: Duration = .milliseconds(5),
    _ condition: () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while !(try await condition()) {
        guard ContinuousClock.now < deadline else { throw WaitTimedOut(description: "not \(what) within \(timeout)") }
        try await Task.sleep(for: interval)
    }
}

/// ``waitUntil(_:timeout:_:)`` with the deadline in seconds.
package func waitUntil(_ what: String, seconds: Double, _ condition: () async throws -> Bool) async throws {
    try await waitUntil(what, timeout: .milliseconds(Int(seconds * 1_000)), condition)
}

/// A wait that ran out: what was waited for, and how long.
package struct WaitTimedOut: Error, CustomStringConvertible {
    package let description: String
}

/// `task`'s value, or a `WaitTimedOut` when it has not ended within `timeout` of real time — for
/// a test whose failure would otherwise be a wait that never ends (the task is left running).
package func value<T: Sendable>(of task: Task<T, Never>, _ what: String, within timeout: Duration = .seconds(10)) async throws -> T {
    let ended = Observed(false)
    Task {
        _ = await task.value
        ended.update { $0 = true }
    }
    do {
        try await ended.wait(what, timeout: timeout) { $0 }  // woken by the end, not polled
    } catch {
        throw WaitTimedOut(description: "\(what) did not end within \(timeout)")
    }
    return await task.value
}
