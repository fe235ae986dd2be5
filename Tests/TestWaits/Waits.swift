/// The tests' one wait for a condition (issue 46, 4: it was written four times, in three test
/// targets): polls `condition` every 5 ms until it holds, or throws when `timeout` passes — a
/// deadline on a condition, never a sleep standing in for one. No dependencies: every test target
/// can use it, Transport's and Discovery's too.
package func waitUntil(_ what: String, timeout: Duration = .seconds(20), _ condition: () async -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while !(await condition()) {
        guard ContinuousClock.now < deadline else { throw WaitTimedOut(description: "not \(what) within \(timeout)") }
        try await Task.sleep(for: .milliseconds(5))
    }
}

/// ``waitUntil(_:timeout:_:)`` with the deadline in seconds.
package func waitUntil(_ what: String, seconds: Double, _ condition: () async -> Bool) async throws {
    try await waitUntil(what, timeout: .milliseconds(Int(seconds * 1_000)), condition)
}

/// A wait that ran out: what was waited for, and how long.
package struct WaitTimedOut: Error, CustomStringConvertible {
    package let description: String
}
