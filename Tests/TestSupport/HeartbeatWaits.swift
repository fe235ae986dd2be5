import Messaging
import TestWaits

/// Waits until every channel of `ends` has taken `samples` round-trip samples (a PONG each) —
/// woken by each one's ``MessageChannel/healthUpdates``, not polled — and returns how many ended
/// (closed) before they got there. Throws ``WaitTimedOut`` when `timeout` of real time passes first.
/// A late subscription costs at most one heartbeat: the count only grows.
package func waitForHeartbeatSamples(_ samples: Int, on ends: [MessageChannel], within timeout: Duration) async throws -> Int {
    let watching = Task {
        await withTaskGroup(of: Bool.self) { group in
            for end in ends {
                group.addTask {
                    for await health in end.healthUpdates where health.samples >= samples { return false }
                    return !Task.isCancelled  // its updates ended: the channel closed
                }
            }
            return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
    }
    defer { watching.cancel() }
    return try await value(of: watching, "\(samples) round-trip samples on each of \(ends.count) channels", within: timeout)
}
