import Locks
import Scheduling

/// The server's timers: a lost session's grace period, the grace period of the sessions restored
/// from the store, and `stop()`'s deadline for the connections still closing.
///
/// Owned by the server: `stop()` cancels every one (``cancelAll()``), and a cancelled timer lets
/// go of its work at once, so no timer outlives the server, acts on a stopped one, or keeps it in
/// memory. (They were Dispatch work items on the global queue: one held a dropped server for a
/// whole grace period, and a lost session's could end it while `stop()` kept it in the store.)
/// The work runs on the scheduler's thread (a global queue), outside every lock; it takes the server
/// `weak`ly. The clock is the server's scheduler (`ChannelConfiguration.scheduler`): tests turn a
/// manual one through an hour's grace period in no time.
final class ServerTimers: Sendable {
    /// One armed timer.
    struct Token: Hashable, Sendable {
        fileprivate let number: UInt64
    }

    private struct Armed {
        var next: UInt64 = 0
        /// Each armed timer's work (nil for the moment between its arming and its scheduling).
        var works: [UInt64: ScheduledWork?] = [:]
        /// ``cancelAll()`` was called (the server stops): grace periods are no longer armed.
        var closed = false
    }

    private let armed = Locked(Armed())
    private let scheduler: any Scheduler

    init(scheduler: any Scheduler = DispatchScheduler()) {
        self.scheduler = scheduler
    }

    /// The timers armed and not yet fired or cancelled (tests).
    var count: Int { armed.withLock { $0.works.count } }

    /// Runs `work` once, `delay` from now, unless cancelled first — and unless ``cancelAll()`` was
    /// called before, when `whileStopping` is false: a grace period that a connection's close
    /// arms while `stop()` runs is not armed at all (`stop()` ends or keeps every session itself).
    @discardableResult
    func schedule(after delay: Duration, whileStopping: Bool = false, _ work: @escaping @Sendable () -> Void) -> Token {
        let token = armed.withLock { armed -> Token? in
            if armed.closed && !whileStopping { return nil }
            armed.next += 1
            armed.works[armed.next] = .some(nil)  // armed before scheduled: a zero delay may fire at once
            return Token(number: armed.next)
        }
        guard let token else { return Token(number: 0) }  // (a token that cancels nothing)
        let scheduled = scheduler.schedule(after: delay) { [weak self] in
            // Fired: it is forgotten first, so a cancel racing with it finds nothing to cancel.
            guard let self, self.armed.withLock({ $0.works.removeValue(forKey: token.number) }) != nil else { return }
            work()
        }
        // Kept unless it fired already (a zero delay) or was cancelled meanwhile (then cancelled
        // here too: cancelling what fired does nothing).
        let keep = armed.withLock { armed -> Bool in
            guard armed.works[token.number] != nil else { return false }
            armed.works[token.number] = scheduled
            return true
        }
        if !keep { scheduled.cancel() }
        return token
    }

    /// Cancels the timer of `token` (nothing if it fired already).
    func cancel(_ token: Token) {
        armed.withLock { $0.works.removeValue(forKey: token.number) }??.cancel()
    }

    /// Cancels every timer; from now on only `stop()`'s own are armed (`whileStopping`).
    func cancelAll() {
        let works = armed.withLock { armed in
            armed.closed = true
            defer { armed.works = [:] }
            return Array(armed.works.values)
        }
        for work in works { work?.cancel() }
    }
}
