import Dispatch
import Locks

/// The package's one source of time for its timers: what time it is, work to run after a delay
/// (cancellable), and a sleep — so that every timer owner takes time as a dependency, and a test
/// turns it by hand (``ManualScheduler``) instead of waiting for it.
///
/// Not API (no 1.x promise): the package's timer owners take one, `DispatchScheduler` unless a test
/// gives them a ``ManualScheduler``.
public protocol Scheduler: Sendable {
    /// Now, in nanoseconds of this scheduler's clock (Dispatch's uptime clock for the real one).
    var now: UInt64 { get }

    /// Runs `work` once, `delay` from now, on `queue` (nil: on no queue in particular — a global
    /// queue, or the thread that turns a manual clock), unless the returned handle is cancelled
    /// first. A negative delay is no delay; one beyond ten years counts as ten years.
    @discardableResult
    func schedule(after delay: Duration, on queue: DispatchQueue?, _ work: @escaping @Sendable () -> Void) -> ScheduledWork

    /// A random number in `range` for a timer's jitter (a poll interval spread over 80–100 %): the
    /// system's generator, or a seeded one of a simulation (``ManualScheduler/init(start:seed:)``),
    /// so that a seed fixes when every jittered timer fires.
    func random(in range: ClosedRange<Double>) -> Double
}

extension Scheduler {
    /// The system's generator.
    public func random(in range: ClosedRange<Double>) -> Double { Double.random(in: range) }

    /// `schedule(after:on:_:)` on no queue in particular.
    @discardableResult
    public func schedule(after delay: Duration, _ work: @escaping @Sendable () -> Void) -> ScheduledWork {
        schedule(after: delay, on: nil, work)
    }

    /// Runs `work` once at `deadline` on this scheduler's clock (nanoseconds, as ``now``), on
    /// `queue`; a deadline already past runs at once.
    @discardableResult
    public func schedule(at deadline: UInt64, on queue: DispatchQueue?, _ work: @escaping @Sendable () -> Void) -> ScheduledWork {
        schedule(after: .nanoseconds(Int64(clamping: deadline &- min(deadline, now))), on: queue, work)
    }

    /// Waits `duration` on this scheduler's clock, or until the task is cancelled (then at once).
    /// A timer, not a sleeping task: no thread is held by the wait.
    public func sleep(for duration: Duration) async {
        _ = await Wakeup(scheduler: self).wait(duration)
    }
}

/// Work a ``Scheduler`` will run, until it runs or is cancelled. Cancelling lets go of the work
/// (and what it captured) at once, not when its time comes; after it ran, cancelling does nothing.
public final class ScheduledWork: Sendable {
    private let work: Locked<(@Sendable () -> Void)?>
    /// Told when a cancellation took the work (a scheduler that keeps count of what is pending).
    private let onCancel: (@Sendable () -> Void)?

    /// Work to run through ``run()``: for the schedulers.
    public init(_ work: @escaping @Sendable () -> Void) {
        self.work = Locked(work)
        self.onCancel = nil
    }

    /// Work to run through ``run()``, for a scheduler that keeps count of what is pending:
    /// `onCancel` runs after a ``cancel()`` that took the work (not one after it ran), outside the
    /// work's lock.
    public init(_ work: @escaping @Sendable () -> Void, onCancel: (@Sendable () -> Void)?) {
        self.work = Locked(work)
        self.onCancel = onCancel
    }

    /// Cancels the work: it will not run (nothing if it ran or is running).
    public func cancel() {
        var taken = work.withLock { work in
            defer { work = nil }
            return work
        }
        // Released here, outside the lock (what it captured may cancel again as it goes) and
        // before the scheduler is told: a wait for "no timer left" finds it gone.
        let tookIt = taken != nil
        taken = nil
        if tookIt { onCancel?() }
    }

    /// Whether it is still to run (neither run nor cancelled).
    public var isPending: Bool { work.withLock { $0 != nil } }

    /// Runs the work unless it was cancelled or ran already (at most once, whoever calls).
    public func run() {
        let work = work.withLock { work in
            defer { work = nil }
            return work
        }
        work?()
    }
}

/// Real time: Dispatch's uptime clock and `asyncAfter` (one Dispatch timer for them all; no timer
/// source per work, so a timer per send of a broadcast to thousands of connections stays cheap).
public struct DispatchScheduler: Scheduler {
    public init() {}

    public var now: UInt64 { DispatchTime.now().uptimeNanoseconds }

    @discardableResult
    public func schedule(after delay: Duration, on queue: DispatchQueue?, _ work: @escaping @Sendable () -> Void) -> ScheduledWork {
        let scheduled = ScheduledWork(work)
        (queue ?? .global()).asyncAfter(deadline: DispatchTime(uptimeNanoseconds: now &+ delay.schedulerNanoseconds)) {
            scheduled.run()
        }
        return scheduled
    }
}

extension Duration {
    /// Whole nanoseconds, negative ones as 0 and more than ten years as ten years (the timers'
    /// reading of a duration).
    public var schedulerNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0 else { return 0 }
        let capped = min(seconds, 10 * 365 * 86_400)
        return UInt64(capped) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
    }
}
