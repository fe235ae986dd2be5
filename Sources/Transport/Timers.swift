import Synchronization

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
