import ProtocolCore

/// A ``MessageClient``'s lifecycle without I/O: connecting, connected, reconnecting, closed; the
/// callers waiting for a connection; the back-off between attempts; and the ``MessageClient/ConnectionState``
/// an app observes. Each input returns what the client must do (resume these waiters, report this
/// event, retry after this delay, give up); the client carries it out — it connects, sleeps and
/// resumes, this decides. Like the driver's `ConnectionLifecycle` one floor below.
///
/// Generic over the channel and the waiter so that its tests need neither sockets nor tasks.
/// Not thread-safe: the client holds it under its lock.
struct ClientLifecycle<Channel: AnyObject, Waiter> {
    enum Phase {
        /// Connecting for the first time (the first attempt, or waiting for the server).
        case connecting
        /// Connected on this channel.
        case connected(Channel)
        /// Connecting again after the connection ended for `reason`.
        case reconnecting(after: CloseReason)
        /// The connection ended and nothing reconnects (no reconnect policy).
        case disconnected(CloseReason)
        /// Closed by the app (nil) or given up (the error says why). Final.
        case closed(MessagingError?)
    }

    private(set) var phase: Phase = .connecting
    /// What the app observes (``MessageClient/connectionState``); set by every transition.
    private(set) var state: MessageClient.ConnectionState = .connecting
    /// Bumped by every change of ``state``, so the client can tell its watchers once per change.
    private(set) var stateVersion: UInt64 = 0
    /// The last reason a connect attempt failed (said when a waiter gives up); cleared on connect.
    private(set) var lastFailure: String?
    /// Whether the current connection resumed the message session of an earlier one.
    private(set) var resumed = false
    /// Whether a connect loop runs (set by ``startLoop()``, cleared when it ends).
    private(set) var loopRunning = false
    private var waiters: [UInt64: Waiter] = [:]
    private var nextWaiter: UInt64 = 0
    /// Failed attempts of the running loop, and its next back-off.
    private var attempts = 0
    private var delay: Duration

    let policy: ReconnectPolicy
    /// Whether a lost connection is reconnected (a reconnect policy is configured).
    let reconnects: Bool
    /// Where the client connects, for messages.
    let target: String

    /// - Parameters:
    ///   - policy: The reconnect policy (nil: do not reconnect; a waiting first connect then
    ///     backs off with the default policy).
    ///   - target: Where the client connects, as said in messages.
    init(policy: ReconnectPolicy?, target: String) {
        self.target = target
        self.policy = policy ?? ReconnectPolicy()
        self.reconnects = policy != nil
        self.delay = self.policy.initialDelay
    }

    var isClosed: Bool { if case .closed = phase { true } else { false } }
    var channel: Channel? { if case .connected(let channel) = phase { channel } else { nil } }

    private mutating func set(_ newState: MessageClient.ConnectionState) {
        state = newState
        stateVersion &+= 1
    }

    // MARK: Connecting

    /// A connect loop starts (waiting for the server, or reconnecting after a lost connection).
    /// False when the client is closed: then no loop runs.
    mutating func startLoop() -> Bool {
        guard !isClosed else { return false }
        loopRunning = true
        attempts = 0
        delay = policy.initialDelay
        return true
    }

    /// What a failed attempt leads to.
    enum AfterFailure {
        /// The client was closed meanwhile: stop quietly.
        case stop
        /// Report the failure (as reconnecting, or as waiting for the server) with its attempt
        /// number, wait `after`, try again.
        case retry(after: Duration, reconnecting: Bool, attempt: Int)
        /// Give up for good with this error (``giveUp(_:)`` next).
        case giveUp(MessagingError)
    }

    /// The longest wait after an attempt every address of which refused the connection: the host
    /// answered and nothing listens — a server restarting, back in a moment (issue 53, 7: the
    /// doubling back-off made a client find its restarted server seconds late).
    static var refusedRetryCap: Duration { .milliseconds(500) }

    /// A connect attempt failed with `error`; `retryAfter` is the server's own hint (a busy
    /// server's REFUSE), never undercut. `refused`: every address refused the connection (the
    /// wait is then at most ``refusedRetryCap``).
    mutating func attemptFailed(_ error: MessagingError, retryAfter: Duration?, refused: Bool = false) -> AfterFailure {
        guard !isClosed else { return .stop }
        lastFailure = error.message
        attempts += 1
        if error.code == .untrustedServer || error.code == .sessionStoreUnusable {
            // Final: a key this client does not trust stays untrusted however often it is met,
            // and a session store that failed takes no more records in this process.
            return .giveUp(error)
        }
        if let max = policy.maxAttempts, attempts >= max {
            return .giveUp(
                MessagingError(
                    .connectFailed, "gave up connecting to \(target) after \(max) attempts: \(error.message)", underlying: error))
        }
        var wait = Swift.max(delay, retryAfter ?? .zero)
        if refused { wait = Swift.min(wait, Self.refusedRetryCap) }
        delay = Swift.min(delay * 2, policy.maxDelay)
        switch phase {
        case .reconnecting(let reason):
            set(.reconnecting(after: reason, attempt: attempts, lastError: error))
            return .retry(after: wait, reconnecting: true, attempt: attempts)
        default:
            set(.waiting(error))
            return .retry(after: wait, reconnecting: false, attempt: attempts)
        }
    }

    /// The first connect is waiting for the server (discovery has not seen it yet).
    mutating func waiting(_ reason: MessagingError) {
        guard case .connecting = phase else { return }
        set(.waiting(reason))
    }

    /// What an established connection leads to.
    enum AfterConnect {
        /// Closed meanwhile: close the new channel.
        case closeIt
        /// Connected: report it and resume these waiters with the channel.
        case connected([Waiter])
    }

    /// A connection (and its session, `resumed` or not) is established.
    mutating func established(_ channel: Channel, peer: PeerInfo, via address: SocketAddress?, resumed: Bool) -> AfterConnect {
        guard !isClosed else { return .closeIt }
        phase = .connected(channel)
        self.resumed = resumed
        lastFailure = nil
        loopRunning = false
        set(.connected(peer, via: address))
        defer { waiters = [:] }
        return .connected(Array(waiters.values))
    }

    /// What the end of a connection leads to.
    enum AfterClose: Equatable {
        /// The app closed the client (or it gave up): nothing more.
        case nothing
        /// Reconnect (start a connect loop).
        case reconnect
        /// No reconnect policy: the client's events end.
        case finish
    }

    /// `channel` closed for `reason`.
    mutating func channelClosed(_ channel: Channel, reason: CloseReason) -> AfterClose {
        guard !isClosed else { return .nothing }
        guard case .connected(let current) = phase, current === channel else { return .nothing }
        if reconnects {
            phase = .reconnecting(after: reason)
            set(.reconnecting(after: reason, attempt: 0, lastError: nil))
            return .reconnect
        }
        phase = .disconnected(reason)
        set(.disconnected(reason))
        return .finish
    }

    // MARK: Closing

    /// The app closes the client: every waiter fails; returns them and the channel to close.
    mutating func close() -> (channel: Channel?, waiters: [Waiter]) {
        let channel = self.channel
        if !isClosed {
            phase = .closed(nil)
            set(.closed(nil))
        }
        loopRunning = false
        defer { waiters = [:] }
        return (channel, Array(waiters.values))
    }

    /// Stops connecting for good with `error`: returns the waiters to fail with it — nil when the
    /// app closed the client since the failed attempt said to give up (its `close()` failed them;
    /// the state stays `closed(nil)`, and nothing of the give-up is reported).
    mutating func giveUp(_ error: MessagingError) -> [Waiter]? {
        guard !isClosed else { return nil }
        phase = .closed(error)
        lastFailure = error.message
        loopRunning = false
        set(.closed(error))
        defer { waiters = [:] }
        return Array(waiters.values)
    }

    // MARK: Waiting for a connection

    /// What a caller that needs a connection gets now.
    enum Ready {
        case channel(Channel)
        case failure(MessagingError)
        /// Wait (up to the caller's limit): call ``addWaiter(_:)``.
        case wait
    }

    /// A caller needs the connection and would wait `wait` for one.
    func ready(waiting wait: Duration) -> Ready {
        switch phase {
        case .connected(let channel): return .channel(channel)
        case .closed(let error?): return .failure(error)
        case .closed(nil): return .failure(MessagingError(.stopped, "the client is closed"))
        case .disconnected, .connecting, .reconnecting:
            let willConnect = loopRunning || reconnects
            if !willConnect || wait <= .zero {
                return .failure(MessagingError(.notConnected, "not connected to \(target)"))
            }
            return .wait
        }
    }

    /// Registers a waiter, unless a channel came or the client closed meanwhile; its id is for
    /// ``waiterTimedOut(_:)``.
    mutating func addWaiter(_ waiter: Waiter) -> (id: UInt64, now: Ready) {
        switch phase {
        case .connected(let channel): return (0, .channel(channel))
        case .closed(let error): return (0, .failure(error ?? MessagingError(.stopped, "the client is closed")))
        case .disconnected where !loopRunning && !reconnects:
            return (0, .failure(MessagingError(.notConnected, "not connected to \(target)")))
        default:
            nextWaiter += 1
            waiters[nextWaiter] = waiter
            return (nextWaiter, .wait)
        }
    }

    /// The waiter `id` waited its limit: returns it (nil when it was resumed already) to fail
    /// with ``timedOut(_:)``.
    mutating func waiterTimedOut(_ id: UInt64) -> Waiter? { waiters.removeValue(forKey: id) }

    /// The error of a caller that waited `wait` for a connection in vain.
    func timedOut(_ wait: Duration) -> MessagingError {
        MessagingError(
            .notConnected,
            "no connection to \(target) within \(wait)\(lastFailure.map { " (last attempt: \($0))" } ?? "")")
    }
}
