import ProtocolCore

/// A ``MessageServer``'s state: its lifecycle, its registry, its handshake admission and its
/// refusal counts, and the decisions that take more than one of them (admitting a connection).
/// The server holds it under its one lock and changes it only through
/// ``MessageServer/withState(_:)``: the server does the I/O, this decides.
///
/// Generic over the listener, the publication, the background work and the connection, like the
/// machines it holds, so that its tests need neither sockets nor discovery.
struct ServerState<Listener, Publication, Work, Connection: AnyObject, Owner: Equatable> {
    /// Where the server is in its life, and what exists in each phase (its listener, its
    /// publication, its one root task).
    var lifecycle = ServerLifecycle<Listener, Publication, Work>()
    /// Its connections: places held in handshakes, open ones, sessions, ends to report.
    var registry = ServerRegistry<Connection, Owner>()
    /// Which connections may start their handshake (``ServerConfiguration/maxPendingHandshakes``
    /// and the rates).
    var admission: HandshakeAdmission
    /// The session store while the server runs (``SessionConfiguration/store``).
    var store: SessionJournal?
    /// The `stop()` calls that came in while another stop ran: resumed when it returns.
    var stopWaiters: [CheckedContinuation<Void, Never>] = []
    /// The sessions the store held at the start that no client has resumed yet, by session id.
    private(set) var restored: [String: Journal.Restored] = [:]
    /// The grace period's end took the unclaimed sessions (``takeUnclaimed()``): none is given back after it.
    private var unclaimedTaken = false
    /// This second (uptime) and the refused events reported in it.
    private var refusedEvents = PerSecondCount()
    /// Refused connections since the start (tests).
    private(set) var refusals = 0

    init(admission: HandshakeAdmission) { self.admission = admission }

    /// A flooding source's block: where, for how long, and why (its refusals in one second, and
    /// whether it was on probation, blocked not long ago).
    struct Block {
        let listener: Listener
        let duration: Duration
        let count: Int
        let again: Bool
    }

    /// What to do with a connection just accepted.
    enum Admission {
        /// Its handshake may start, as a child of `work`; it holds a place (``ServerRegistry/reserve()``)
        /// and a handshake slot until ``handshakeSucceeded(_:)`` or ``handshakeAbandoned(_:)``.
        case admitted(Work)
        /// `limit` connections: refuse it busy (issue 43, 8: it was a bare close).
        case full
        /// Not running (stopping, or not started): close it.
        case notRunning
        /// Over a handshake bound: refuse it busy (the reason, the retry in milliseconds), and block
        /// its source when it floods.
        case busy(String, Int, Block?)
    }

    /// A connection from `source` was accepted at `now` (uptime nanoseconds): decides it before any
    /// handshake work. A handshake costs the server key agreements, so only so many run at once and
    /// start per second, in all and from one source. `blockBase` is
    /// ``ServerConfiguration/floodBlockDuration`` in nanoseconds.
    mutating func admit(
        _ source: HandshakeAdmission.Source, limit: Int, now: UInt64, blockBase: UInt64
    ) -> Admission {
        guard let (listener, work) = lifecycle.running else { return .notRunning }
        guard registry.hasRoom(under: limit) else { return .full }
        switch admission.admit(source, now: now) {
        case .busy(let why, let retry, false): return .busy(why, retry, nil)
        case .busy(let why, let retry, true):
            // Blocked in the same step that found it flooding: the base duration, doubled (up to 32
            // times) each time it floods again within twice its last block after the block ended,
            // so a flood that never stops reaches the server for a fraction of a second in minutes,
            // not every 10 s (``HandshakeAdmission/block(_:now:base:)``).
            let again = admission.isOnProbation(source, now: now)
            let count = admission.blockThreshold(for: source, now: now) ?? 0
            let nanoseconds = admission.block(source, now: now, base: blockBase)
            let block = Block(listener: listener, duration: .nanoseconds(Int64(clamping: nanoseconds)), count: count, again: again)
            return .busy(why, retry, block)
        case .admitted:
            registry.reserve()
            return .admitted(work)
        }
    }

    /// The handshake of a connection admitted from `source` completed: its slot is free; its place
    /// stays held until it registers.
    mutating func handshakeSucceeded(_ source: HandshakeAdmission.Source) { admission.ended(source) }

    /// A connection admitted from `source` ends before its handshake completed (it failed, or the
    /// server stopped before it began): its handshake's and its connection's places are free.
    mutating func handshakeAbandoned(_ source: HandshakeAdmission.Source) {
        admission.ended(source)
        registry.released()
    }

    /// A connection holding a place completed its handshake (and session exchange, naming
    /// `session`, opened by `owner`'s key): registered (``ServerRegistry/register(session:owner:make:)``),
    /// or nil when the server no longer runs (its place is released; the caller closes it).
    mutating func register(
        session: String?, owner: Owner?, make: (UInt64) -> Connection
    ) -> ServerRegistry<Connection, Owner>.Registration? {
        guard lifecycle.isRunning else {
            registry.released()
            return nil
        }
        return registry.register(session: session, owner: owner, make: make)
    }

    // MARK: The session store

    /// The store opened at the start, with the sessions it holds (by session id).
    mutating func opened(_ journal: SessionJournal) {
        store = journal
        restored = Dictionary(uniqueKeysWithValues: journal.restored.map { ($0.key.hex, $0.value) })
    }

    /// The store, taken for closing (the server stopped, or did not start).
    mutating func closedStore() -> SessionJournal? {
        defer {
            store = nil
            restored = [:]
        }
        return store
    }

    /// What the store kept under a session id from before a restart.
    enum RestoredSession {
        case none
        /// Another key opened it: refused, with the reason.
        case refused(String)
        case restored(Journal.Restored)
    }

    /// The session the store kept under `id` from before a restart, taken for the connection that
    /// resumes it, opened by the key whose full fingerprint is `owner`. A session another key (or
    /// none) opened is refused, and stays for its own.
    mutating func takeRestored(_ id: String, owner: String?) -> RestoredSession {
        guard let found = restored[id] else { return .none }
        guard found.snapshot.owner == owner else { return .refused("session \(id.prefix(8))… belongs to another identity key") }
        restored[id] = nil
        return .restored(found)
    }

    /// The grace period since the start passed: the sessions from before the restart that no client
    /// resumed, taken to end.
    mutating func takeUnclaimed() -> (SessionJournal?, [Journal.Restored]) {
        defer {
            restored = [:]
            unclaimedTaken = true
        }
        return (store, Array(restored.values))
    }

    /// A session taken for a connection that closed before the session attached to it (unchanged):
    /// the store's again, for its client's next connection. True when it is kept — given back, or
    /// left in the store's file for the next start when the server stopped meanwhile; false when
    /// the grace period's end already took the unclaimed ones (it ends as they did).
    mutating func returnRestored(_ found: Journal.Restored) -> Bool {
        guard store != nil else { return true }
        guard !unclaimedTaken else { return false }
        restored[found.snapshot.key.hex] = found
        return true
    }

    /// A connection was refused at `now`: counted; returns how many this second had, this one
    /// included (the server reports only so many as events).
    mutating func refused(now: UInt64) -> Int {
        refusals += 1
        return refusedEvents.add(now: now)
    }
}
