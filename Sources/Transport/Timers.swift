import Dispatch
import Synchronization

/// The Dispatch time `duration` from now, for timers on a connection's loop or on a global queue
/// (the package's timers are Dispatch timers, not sleeping tasks). Durations beyond ten years
/// count as ten years; negative ones as now.
package func dispatchDeadline(after duration: Duration) -> DispatchTime {
    let (seconds, attoseconds) = duration.components
    guard seconds >= 0 else { return .now() }
    let capped = min(seconds, 10 * 365 * 86_400)
    let nanoseconds = UInt64(capped) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
    return DispatchTime(uptimeNanoseconds: DispatchTime.now().uptimeNanoseconds + nanoseconds)
}

/// Which came first, an operation's end or its deadline's timer: decided once, by whichever
/// claims it (an atomic compare-and-exchange), so that a timer firing as the operation finishes
/// cannot both report a timeout and let the result through.
package final class RaceOutcome: Sendable {
    private let state = Atomic<UInt8>(0)  // 0: open, 1: finished, 2: expired

    package init() {}

    /// The operation finished: true unless the deadline came first.
    package func finish() -> Bool {
        state.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged
    }

    /// The deadline came: true unless the operation finished first.
    package func expire() -> Bool {
        state.compareExchange(expected: 0, desired: 2, ordering: .acquiringAndReleasing).exchanged
    }
}
