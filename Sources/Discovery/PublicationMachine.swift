/// A publication without its lock, continuations or timers (issue 54, 4): its name and TXT record,
/// whether it is announced on the link, its wide-area registrations and their outcomes, and the
/// callers waiting for either. Each input is one method; what it leaves its carrier
/// (``PublishedService``) to do — callers to resume and with what, registrations to start or stop —
/// is its result, done by the carrier after it released its lock. The deadline of a wait is the
/// carrier's timer, kept in the waiter.
///
/// Generic over the waiter and the registration so that its tests need neither tasks nor DNS. Not
/// thread-safe: the carrier holds it under its lock.
struct PublicationMachine<Waiter, Registration> {
    /// What a caller waits for: the link's announcement or the wide area's registration.
    enum Wait: Hashable, Sendable {
        case established, registered
    }

    typealias Outcome = Result<String, DiscoveryError>

    /// The current name (it changes after a collision).
    private(set) var name: String
    private(set) var txt: TXTRecord
    /// Announced on the link now.
    private(set) var established = false
    /// Why the publication on the link failed (nil once it is announced again).
    private(set) var failure: DiscoveryError?
    /// Re-registrations after stalled probing (for tests and diagnostics).
    private(set) var stallRetries = 0
    /// The wide-area registrations, one per domain (empty once unpublished).
    private(set) var wideArea: [Registration] = []
    /// Their outcome so far, by domain: the name registered, or the last failure.
    private(set) var wideAreaStatus: [String: Outcome] = [:]
    private(set) var wideAreaUnpublished = false
    private var waiters: [Wait: [Int: Waiter]] = [:]
    private var nextWaiter = 0

    init(name: String, txt: TXTRecord) {
        self.name = name
        self.txt = txt
    }

    // MARK: Waits

    /// The outcome a caller waiting for `kind` gets at once, if there is one.
    func settled(_ kind: Wait) -> Outcome? {
        switch kind {
        case .established:
            if established { return .success(name) }
            return failure.map { .failure($0) }
        case .registered:
            if let outcome = wideAreaStatus.values.first { return outcome }
            guard wideArea.isEmpty || wideAreaUnpublished else { return nil }
            return .failure(
                DiscoveryError(.notPublished, "'\(name)' is not published in a unicast DNS domain (no wide-area key configured)"))
        }
    }

    /// A number for a caller about to wait.
    mutating func newWaiter() -> Int {
        nextWaiter += 1
        return nextWaiter
    }

    /// A caller starts waiting for `kind`: its outcome now (settled, or its task `cancelled`
    /// already), or nil when it waits as `id` until ``record(_:)``, ``end(_:_:)`` or
    /// ``wideAreaStopped()`` hands it back.
    mutating func wait(_ kind: Wait, id: Int, _ waiter: Waiter, cancelled: Bool) -> Outcome? {
        if let outcome = settled(kind) { return outcome }
        if cancelled { return .failure(cancellation(of: kind)) }
        waiters[kind, default: [:]][id] = waiter
        return nil
    }

    /// Changes a waiting caller (the carrier sets its timer); false when it waits no more.
    mutating func update(_ kind: Wait, _ id: Int, _ body: (inout Waiter) -> Void) -> Bool {
        guard var waiter = waiters[kind]?[id] else { return false }
        body(&waiter)
        waiters[kind]?[id] = waiter
        return true
    }

    /// Ends one caller's wait (its deadline, its cancellation): the waiter, if it still waited.
    mutating func end(_ kind: Wait, _ id: Int) -> Waiter? {
        waiters[kind]?.removeValue(forKey: id)
    }

    /// What a cancelled wait for `kind` says.
    func cancellation(of kind: Wait) -> DiscoveryError {
        switch kind {
        case .established: DiscoveryError(.shutDown, "the wait for '\(name)' to be announced was cancelled")
        case .registered: DiscoveryError(.shutDown, "the wait for '\(name)' to be registered in its unicast DNS domain was cancelled")
        }
    }

    // MARK: Events

    /// A backend's or a registration's event: the callers it ends (every one waiting for what it
    /// settles) and their outcome.
    mutating func record(_ event: PublicationEvent) -> (waiters: [Waiter], outcome: Outcome?) {
        let settles: (Wait, Outcome)?
        switch event {
        case .established(let name):
            self.name = name
            established = true
            failure = nil
            settles = (.established, .success(name))
        case .renamed(_, let to):
            name = to
            established = false
            settles = nil
        case .suspended:
            established = false
            settles = nil
        case .failed(let error):
            established = false
            failure = error
            settles = (.established, .failure(error))
        case .registered(let name, let domain):
            wideAreaStatus[domain] = .success(name)
            settles = (.registered, .success(name))
        case .registrationFailed(let domain, let error):
            wideAreaStatus[domain] = .failure(error)
            settles = (.registered, .failure(error))
        case .registrationRenamed:
            settles = nil
        }
        guard let (kind, outcome) = settles else { return ([], nil) }
        return (takeWaiters(kind), outcome)
    }

    /// The TXT record the backend now announces.
    mutating func txtChanged(_ txt: TXTRecord) {
        self.txt = txt
    }

    /// The backend withdrew and repeated the registration because probing stalled.
    mutating func stallRetried() {
        stallRetries += 1
    }

    // MARK: Wide area

    /// Registrations of the service in unicast domains (the carrier starts them).
    mutating func attach(_ registrations: [Registration]) {
        wideArea += registrations
    }

    /// The service is unpublished: the registrations to stop and wait for. From now on a wait for
    /// a registration says `.notPublished`.
    mutating func unpublishWideArea() -> [Registration] {
        wideAreaUnpublished = true
        defer { wideArea = [] }
        return wideArea
    }

    /// The registrations stopped: the callers still waiting for one, to be told it was unpublished.
    mutating func wideAreaStopped() -> (waiters: [Waiter], outcome: Outcome) {
        (takeWaiters(.registered), .failure(DiscoveryError(.notPublished, "the service was unpublished")))
    }

    /// The discovery object went away: the registrations to stop in the background.
    mutating func detachWideArea() -> [Registration] {
        defer { wideArea = [] }
        return wideArea
    }

    private mutating func takeWaiters(_ kind: Wait) -> [Waiter] {
        defer { waiters[kind] = nil }
        return waiters[kind].map { Array($0.values) } ?? []
    }
}
