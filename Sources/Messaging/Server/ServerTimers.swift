import Dispatch
import Locks
import Transport

/// The server's timers: a lost session's grace period, the grace period of the sessions restored
/// from the store, and `stop()`'s deadline for the connections still closing.
///
/// Owned by the server: `stop()` cancels every one (``cancelAll()``), and a cancelled timer lets
/// go of its work at once, so no timer outlives the server, acts on a stopped one, or keeps it in
/// memory. (They were Dispatch work items on the global queue: one held a dropped server for a
/// whole grace period, and a lost session's could end it while `stop()` kept it in the store.)
/// The work runs on a global queue, outside every lock; it takes the server `weak`ly.
final class ServerTimers: Sendable {
    /// One armed timer.
    struct Token: Hashable, Sendable {
        fileprivate let number: UInt64
    }

    private struct Armed {
        var next: UInt64 = 0
        var sources: [UInt64: any DispatchSourceTimer] = [:]
        /// ``cancelAll()`` was called (the server stops): grace periods are no longer armed.
        var closed = false
    }

    private let armed = Locked(Armed())

    /// The timers armed and not yet fired or cancelled (tests).
    var count: Int { armed.withLock { $0.sources.count } }

    /// Runs `work` once, `delay` from now, unless cancelled first — and unless ``cancelAll()`` was
    /// called before, when `whileStopping` is false: a grace period that a connection's close
    /// arms while `stop()` runs is not armed at all (`stop()` ends or keeps every session itself).
    @discardableResult
    func schedule(after delay: Duration, whileStopping: Bool = false, _ work: @escaping @Sendable () -> Void) -> Token {
        let source = DispatchSource.makeTimerSource(queue: .global())
        let token = armed.withLock { armed -> Token? in
            if armed.closed && !whileStopping { return nil }
            armed.next += 1
            armed.sources[armed.next] = source
            return Token(number: armed.next)
        }
        guard let token else {
            source.activate()  // (an inactive source must not be released: activated, then cancelled)
            source.cancel()
            return Token(number: 0)  // (a token that cancels nothing)
        }
        source.setEventHandler { [weak self] in
            // Fired: it is forgotten first, so a cancel racing with it finds nothing to cancel.
            guard let self, let fired = self.armed.withLock({ $0.sources.removeValue(forKey: token.number) }) else {
                return
            }
            fired.cancel()
            work()
        }
        source.schedule(deadline: dispatchDeadline(after: delay), leeway: .milliseconds(10))
        source.activate()
        return token
    }

    /// Cancels the timer of `token` (nothing if it fired already).
    func cancel(_ token: Token) {
        armed.withLock { $0.sources.removeValue(forKey: token.number) }?.cancel()
    }

    /// Cancels every timer; from now on only `stop()`'s own are armed (`whileStopping`).
    func cancelAll() {
        let sources = armed.withLock { armed in
            armed.closed = true
            defer { armed.sources = [:] }
            return Array(armed.sources.values)
        }
        for source in sources { source.cancel() }
    }
}
