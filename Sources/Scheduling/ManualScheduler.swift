import Dispatch
import Locks

/// Time that moves only when told to (``advance(by:)``): the timers of the code under test run when
/// the test turns the clock past them, in the order of their deadlines (then of their scheduling),
/// each on its queue, and ``advance(by:)`` returns when they ran. A grace period of an hour takes as
/// long as the work it triggers.
///
/// The anchor is NIO's `EmbeddedEventLoop.advanceTime(by:)`; unlike it, the work keeps its queue
/// (a channel's loop), so the code under test runs where it runs in production.
public final class ManualScheduler: Scheduler {
    private struct Entry {
        var deadline: UInt64
        var order: UInt64
        var queue: DispatchQueue?
        var work: ScheduledWork
    }

    private struct Watcher {
        /// Reached when it says so of the pending works' deadlines (earliest first).
        var condition: @Sendable (_ deadlines: [UInt64]) -> Bool
        var continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var now: UInt64
        /// A seeded run's generator: jitter, and which of the works due at one instant goes first.
        var generator: SeededChoices?
        var nextOrder: UInt64 = 0
        var entries: [Entry] = []
        var watchers: [UInt64: Watcher] = [:]
        var nextWatcher: UInt64 = 0

        var pending: Int { entries.reduce(0) { $0 + ($1.work.isPending ? 1 : 0) } }
        /// The pending works' deadlines, earliest first.
        var deadlines: [UInt64] { entries.filter(\.work.isPending).map(\.deadline).sorted() }
    }

    private let state: Locked<State>

    /// A clock at `start` nanoseconds (not 0: the package reads 0 as "no deadline" in places).
    public init(start: UInt64 = 1_000_000_000) {
        state = Locked(State(now: start))
    }

    /// A clock for a simulation: `generator` (seeded: MDNSCore's `SplitMix64`) fixes the jitter
    /// of its timers (``random(in:)``) and which of the works due at the same instant
    /// ``runNext(through:)`` runs first — so that one seed is one run, event for event.
    public init(start: UInt64 = 1_000_000_000, choosingWith generator: some RandomNumberGenerator & Sendable) {
        state = Locked(State(now: start, generator: SeededChoices(base: generator)))
    }

    /// From the seed's generator when there is one (else the system's).
    public func random(in range: ClosedRange<Double>) -> Double {
        state.withLock { state in
            guard var generator = state.generator else { return Double.random(in: range) }
            defer { state.generator = generator }
            return Double.random(in: range, using: &generator)
        }
    }

    public var now: UInt64 { state.withLock { $0.now } }

    @discardableResult
    public func schedule(after delay: Duration, on queue: DispatchQueue?, _ work: @escaping @Sendable () -> Void) -> ScheduledWork {
        let scheduled = ScheduledWork(work, onCancel: { [weak self] in self?.pendingChanged() })
        let woken = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.nextOrder += 1
            state.entries.append(Entry(deadline: state.now &+ delay.schedulerNanoseconds, order: state.nextOrder, queue: queue, work: scheduled))
            return Self.due(&state)
        }
        for continuation in woken { continuation.resume(returning: true) }
        return scheduled
    }

    /// A work ran or was cancelled: the watchers whose condition holds now are woken (a wait for
    /// no timer left is woken by the cancellation that left none, not polled).
    private func pendingChanged() {
        let woken = state.withLock { Self.due(&$0) }
        for continuation in woken { continuation.resume(returning: true) }
    }

    /// The work scheduled and neither run nor cancelled.
    public var pendingCount: Int { state.withLock { $0.pending } }

    /// The deadlines of the pending works, earliest first (what a failing simulation prints).
    public var pendingDeadlines: [UInt64] {
        state.withLock { $0.deadlines }
    }

    /// When the earliest pending work is due (nil: none is).
    public var nextDeadline: UInt64? {
        state.withLock { state in state.entries.filter(\.work.isPending).map(\.deadline).min() }
    }

    /// Moves the clock `duration` forward, running every work that comes due on the way, earliest
    /// first, each on its queue (waited for); work that those schedule within the window runs too.
    /// Call it from none of the queues the work runs on.
    public func advance(by duration: Duration) {
        let target = state.withLock { $0.now &+ duration.schedulerNanoseconds }
        advance(to: target)
    }

    /// Works run in a row at one instant, the clock not moving, before ``advance(to:)`` calls it a
    /// livelock: a timer that re-arms itself with no delay would otherwise hang the test (and CI)
    /// for good. A guard, not a proof: timers that move the clock by a nanosecond each time, or
    /// alternate between two past deadlines, are not caught.
    public static let worksPerInstantLimit = 100_000

    /// Moves the clock to `target` (nanoseconds; an earlier one leaves it where it is), as
    /// ``advance(by:)``. Stops the process with a message naming the instant if more than
    /// ``worksPerInstantLimit`` works run there (a timer that re-arms itself with no delay).
    public func advance(to target: UInt64) {
        var instant = UInt64.max
        var worksAtInstant = 0
        while let entry = state.withLock({ state -> Entry? in
            state.entries.removeAll { !$0.work.isPending }
            guard let index = state.entries.indices.filter({ state.entries[$0].deadline <= target })
                .min(by: { (state.entries[$0].deadline, state.entries[$0].order) < (state.entries[$1].deadline, state.entries[$1].order) })
            else { return nil }
            let entry = state.entries.remove(at: index)
            state.now = max(state.now, entry.deadline)
            return entry
        }) {
            if entry.deadline == instant {
                worksAtInstant += 1
                if worksAtInstant > Self.worksPerInstantLimit {
                    fatalError(
                        "ManualScheduler.advance: \(Self.worksPerInstantLimit) works ran at \(instant) ns without the clock moving; a timer re-arms itself with no delay (a livelock in the code under test)"
                    )
                }
            } else {
                instant = entry.deadline
                worksAtInstant = 1
            }
            if let queue = entry.queue {
                queue.sync { entry.work.run() }
            } else {
                entry.work.run()
            }
            pendingChanged()
        }
        state.withLock { $0.now = max($0.now, target) }
    }

    /// Runs one work: the earliest pending one due by `target` (nanoseconds) — of several due at
    /// that instant, the one the seed picks (without a seed, the first scheduled) — on its queue,
    /// waited for, with the clock at its deadline. False when none is due by `target` (the clock
    /// stays). A simulation's step: one event, then whatever it set off settles, then the next.
    @discardableResult
    public func runNext(through target: UInt64) -> Bool {
        let next = state.withLock { state -> Entry? in
            state.entries.removeAll { !$0.work.isPending }
            guard let earliest = state.entries.map(\.deadline).min(), earliest <= target else { return nil }
            let due = state.entries.indices.filter { state.entries[$0].deadline == earliest }  // in scheduling order
            var pick = 0
            if var generator = state.generator {
                pick = Int.random(in: 0..<due.count, using: &generator)
                state.generator = generator
            }
            let entry = state.entries.remove(at: due[pick])
            state.now = max(state.now, entry.deadline)
            return entry
        }
        guard let entry = next else { return false }
        if let queue = entry.queue {
            queue.sync { entry.work.run() }
        } else {
            entry.work.run()
        }
        pendingChanged()
        return true
    }

    /// Waits until at least `count` works are pending — the code under test armed its timers — and
    /// returns true; false when that has not happened within `timeout` of real time. Woken by the
    /// scheduling itself, not a poll.
    public func waitForPending(_ count: Int, within timeout: Duration = .seconds(10)) async -> Bool {
        await waitForPending(within: timeout) { $0.count >= count }
    }

    /// Waits until `condition` holds of the pending works' deadlines (nanoseconds, earliest first)
    /// — e.g. a timer due at a given instant was armed — and returns true; false when it has not
    /// within `timeout` of real time. Checked now and at each scheduling, not polled.
    public func waitForPending(
        within timeout: Duration = .seconds(10), where condition: @escaping @Sendable (_ deadlines: [UInt64]) -> Bool
    ) async -> Bool {
        let id = state.withLock { state -> UInt64 in
            state.nextWatcher += 1
            return state.nextWatcher
        }
        let real = DispatchScheduler()
        return await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Bool in
                if condition(state.deadlines) { return true }
                state.watchers[id] = Watcher(condition: condition, continuation: continuation)
                return false
            }
            if ready { return continuation.resume(returning: true) }
            real.schedule(after: timeout) { [weak self] in
                let watcher = self?.state.withLock { $0.watchers.removeValue(forKey: id) }
                watcher?.continuation.resume(returning: false)
            }
        }
    }

    /// The watchers whose condition is reached, removed.
    private static func due(_ state: inout State) -> [CheckedContinuation<Bool, Never>] {
        guard !state.watchers.isEmpty else { return [] }
        let deadlines = state.deadlines
        let ready = state.watchers.filter { $0.value.condition(deadlines) }
        for id in ready.keys { state.watchers[id] = nil }
        return ready.values.map(\.continuation)
    }
}

/// The generator a simulation's clock was given (any seeded one).
private struct SeededChoices: RandomNumberGenerator {
    var base: any RandomNumberGenerator & Sendable
    mutating func next() -> UInt64 { base.next() }
}
