/// A ``MessageServer``'s lifecycle without I/O: idle, starting (the listener opened, the service
/// being published), running, stopping, stopped — and what exists in each. `start()` awaits between
/// its steps and `stop()` may come in at any of them: each input says whether the caller may go on,
/// or what it must undo or stop. The server listens, publishes and closes; this decides. Like
/// ``ClientLifecycle`` beside it and the driver's `ConnectionLifecycle` one floor below.
///
/// Generic over the listener, the publication and the server's background work so that its tests
/// need neither sockets nor discovery. Not thread-safe: the server holds it under its lock.
struct ServerLifecycle<Listener, Publication, Work> {
    enum Phase {
        case idle
        /// `start()` runs: the listener once it is open.
        case starting(Listener?)
        /// Listening; published when a publisher was given; the background work accepts children.
        case running(Listener, Publication?, Work)
        /// `stop()` runs.
        case stopping
        /// Final.
        case stopped
    }

    private(set) var phase: Phase = .idle

    /// `start()` was called: whether it may go on (only once, from idle).
    mutating func startRequested() -> Bool {
        guard case .idle = phase else { return false }
        phase = .starting(nil)
        return true
    }

    /// A step of `start()` failed: the server is stopped (unless a `stop()` already took over).
    mutating func startFailed() {
        if case .starting = phase { phase = .stopped }
    }

    /// The listener is open: whether `start()` goes on. False when `stop()` came in meanwhile —
    /// the caller closes the listener it holds, nobody else knows it.
    mutating func listening(_ listener: Listener) -> Bool {
        guard case .starting = phase else { return false }
        phase = .starting(listener)
        return true
    }

    /// Published (or nothing to publish): running. False when `stop()` came in during the publish —
    /// the caller ends the work, unpublishes and closes the listener.
    mutating func started(_ listener: Listener, _ publication: Publication?, _ work: Work) -> Bool {
        guard case .starting = phase else { return false }
        phase = .running(listener, publication, work)
        return true
    }

    enum StopAction {
        /// Another `stop()` is under way: it ends the events.
        case none
        /// Never started, or stopped already: end the events (again; that is idempotent).
        case finishEvents
        /// Stop what exists: close the listener, unpublish, end the work's intake; then close
        /// the connections and call ``stopped()``.
        case stop(Listener?, Publication?, Work?)
    }

    /// `stop()` was called.
    mutating func stopRequested() -> StopAction {
        switch phase {
        case .idle:
            phase = .stopped
            return .finishEvents
        case .stopped:
            return .finishEvents
        case .stopping:
            return .none
        case .starting(let listener):
            // start() sees this at its next step and undoes what it did after (it may still
            // create a publication this stop never sees).
            phase = .stopping
            return .stop(listener, nil, nil)
        case .running(let listener, let publication, let work):
            phase = .stopping
            return .stop(listener, publication, work)
        }
    }

    /// `stop()` closed everything.
    mutating func stopped() { phase = .stopped }

    /// The listener while there is one (starting or running).
    var listener: Listener? {
        switch phase {
        case .starting(let listener): listener
        case .running(let listener, _, _): listener
        case .idle, .stopping, .stopped: nil
        }
    }

    /// The publication while running.
    var publication: Publication? {
        if case .running(_, let publication, _) = phase { publication } else { nil }
    }

    /// What a running server's accepted connection needs; nil when not running.
    var running: (listener: Listener, work: Work)? {
        if case .running(let listener, _, let work) = phase { (listener, work) } else { nil }
    }

    var isRunning: Bool { running != nil }
    var isStopping: Bool { if case .stopping = phase { true } else { false } }
    var isStopped: Bool { if case .stopped = phase { true } else { false } }
}
