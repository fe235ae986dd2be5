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

    /// A timer on `queue` that is moved, not made anew, each time it is armed: for an owner whose
    /// one deadline moves often (the mDNS engine's next deadline moves with most packets; a
    /// connection's handshake, request and acknowledgement deadlines). Dispatch's is one timer
    /// source rescheduled in place, allowed to fire up to `leeway` late (which lets the system
    /// coalesce wake-ups); a manual clock's cancels and schedules again, and fires on time.
    func makeTimer(on queue: DispatchQueue, leeway: Duration, _ handler: @escaping @Sendable () -> Void) -> any RearmableTimer

    /// A random number in `range` for a timer's jitter (a poll interval spread over 80–100 %): the
    /// system's generator, or a seeded one of a simulation (``ManualScheduler/init(start:seed:)``),
    /// so that a seed fixes when every jittered timer fires.
    func random(in range: ClosedRange<Double>) -> Double
}

extension Scheduler {
    /// Cancels and schedules again on this scheduler (what a manual clock needs: every arming is a
    /// work it can run or count); `leeway` is Dispatch's only.
    public func makeTimer(on queue: DispatchQueue, leeway: Duration, _ handler: @escaping @Sendable () -> Void) -> any RearmableTimer {
        ScheduledTimer(scheduler: self, queue: queue, handler: handler)
    }

    /// ``makeTimer(on:leeway:_:)`` with a leeway of 2 ms.
    public func makeTimer(on queue: DispatchQueue, _ handler: @escaping @Sendable () -> Void) -> any RearmableTimer {
        makeTimer(on: queue, leeway: .milliseconds(2), handler)
    }

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

/// Real time: Dispatch's uptime clock and `asyncAfter`. (libdispatch makes a one-shot timer source
/// per `asyncAfter`, cheap to make and gone once it fired; a cancelled work's stays until its
/// deadline and then runs nothing. An owner whose deadline moves often takes a ``makeTimer(on:_:)``
/// instead: one timer source, moved in place.)
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

    /// One Dispatch timer source, rescheduled in place.
    public func makeTimer(on queue: DispatchQueue, leeway: Duration, _ handler: @escaping @Sendable () -> Void) -> any RearmableTimer {
        DispatchRearmableTimer(queue: queue, leeway: leeway, handler: handler)
    }
}

/// A timer armed again and again at a moving deadline, firing once per arming (unless moved or
/// cancelled first), on the queue it was made for.
public protocol RearmableTimer: AnyObject, Sendable {
    /// Fires once at `deadline` (nanoseconds of its scheduler's clock; one already past fires at
    /// once), instead of any deadline it was armed at before.
    func arm(at deadline: UInt64)

    /// Never fires again (arming it afterwards does nothing).
    func cancel()
}

/// ``DispatchScheduler``'s: one timer source, resumed once, rescheduled in place, cancelled once.
private final class DispatchRearmableTimer: RearmableTimer, @unchecked Sendable {  // a Dispatch source is thread-safe
    private let source: any DispatchSourceTimer
    private let leeway: DispatchTimeInterval

    init(queue: DispatchQueue, leeway: Duration, handler: @escaping @Sendable () -> Void) {
        source = DispatchSource.makeTimerSource(queue: queue)
        source.setEventHandler(handler: handler)
        source.resume()
        self.leeway = .nanoseconds(Int(clamping: leeway.schedulerNanoseconds))
    }

    func arm(at deadline: UInt64) {
        source.schedule(deadline: DispatchTime(uptimeNanoseconds: deadline), leeway: leeway)
    }

    func cancel() { source.cancel() }
}

/// Any other scheduler's: each arming cancels the work of the one before and schedules anew.
private final class ScheduledTimer: RearmableTimer, Sendable {
    private let scheduler: any Scheduler
    private let queue: DispatchQueue
    private let handler: @Sendable () -> Void
    /// The armed work; nil once cancelled for good.
    private let state = Locked<(work: ScheduledWork?, cancelled: Bool)>((nil, false))

    init(scheduler: any Scheduler, queue: DispatchQueue, handler: @escaping @Sendable () -> Void) {
        self.scheduler = scheduler
        self.queue = queue
        self.handler = handler
    }

    func arm(at deadline: UInt64) {
        guard !state.withLock({ $0.cancelled }) else { return }
        let work = scheduler.schedule(at: deadline, on: queue, handler)
        let previous = state.withLock { state -> ScheduledWork? in
            guard !state.cancelled else { return work }
            defer { state.work = work }
            return state.work
        }
        previous?.cancel()
    }

    func cancel() {
        let previous = state.withLock { state -> ScheduledWork? in
            state.cancelled = true
            defer { state.work = nil }
            return state.work
        }
        previous?.cancel()
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
