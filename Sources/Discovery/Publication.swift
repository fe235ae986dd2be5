import Dispatch
import Locks
import Scheduling

/// A published service. Keep it to keep the service published; call ``unpublish()`` to withdraw it.
///
/// The name can change: when another service on the network has the same name, Avahi picks an
/// alternative (`"Name #2"`) and ``events`` reports ``PublicationEvent/renamed(from:to:)``.
public final class PublishedService: Sendable {
    struct State {
        var name: String
        var txt: TXTRecord
        var established = false
        var failure: DiscoveryError?
        /// Callers of `established(timeout:)`, each with the timer that fails it at its deadline
        /// (cancelled when the publication settles first, or the caller's task is cancelled).
        var waiters: [Int: Waiter] = [:]
        var nextWaiter = 0
        /// Re-registrations after stalled probing (for tests and diagnostics).
        var stallRetries = 0
        /// The backend's object for this publication (an Avahi `Publication`, an embedded
        /// `EmbeddedPublication`); set and read on `owner.queue`, held weakly.
        weak var backendObject: AnyObject?
        /// Wide-area registrations of this service, one per domain.
        var wideArea: [WideAreaRegistration] = []
        /// Their outcome so far, by domain: the name registered, or the last failure.
        var wideAreaStatus: [String: Result<String, DiscoveryError>] = [:]
        /// Callers of `registered(timeout:)`.
        var wideAreaWaiters: [Int: Waiter] = [:]
        var wideAreaUnpublished = false
    }

    struct Waiter {
        let continuation: CheckedContinuation<Result<String, DiscoveryError>, Never>
        /// Its deadline; nil for the instant between its registration and its timer's.
        var timer: ScheduledWork?

        /// Resumes the caller and stops its timer.
        func resume(returning outcome: Result<String, DiscoveryError>) {
            timer?.cancel()
            continuation.resume(returning: outcome)
        }
    }

    /// What a caller waits for: the link's announcement or the wide area's registration.
    enum Wait {
        case established, registered
    }

    let state: Locked<State>
    /// The publication's events: established, renamed, suspended, failed; with wide-area
    /// publishing also registered, registrationRenamed and registrationFailed. One consumer.
    public let events: AsyncStream<PublicationEvent>
    let continuation: AsyncStream<PublicationEvent>.Continuation
    /// The service type.
    public let type: String
    /// The port announced.
    public let port: UInt16
    /// The backend's object for this publication (an Avahi `Publication`, an embedded
    /// `EmbeddedPublication`).
    var backendObject: AnyObject? {
        get { state.withLock { $0.backendObject } }
        set { state.withLock { $0.backendObject = newValue } }
    }
    let owner: any PublicationOwner
    /// The clock of the waits' deadlines (tests: a `ManualScheduler`).
    let scheduler: any Scheduler

    init(
        owner: any PublicationOwner, name: String, type: String, port: UInt16, txt: TXTRecord,
        scheduler: any Scheduler = DispatchScheduler()
    ) {
        self.owner = owner
        self.scheduler = scheduler
        self.type = type
        self.port = port
        self.state = Locked(State(name: name, txt: txt))
        (events, continuation) = AsyncStream.makeStream(of: PublicationEvent.self)
    }

    /// The current name (it changes after a collision).
    public var name: String { state.withLock { $0.name } }
    /// The current TXT record.
    public var txt: TXTRecord { state.withLock { $0.txt } }
    /// Whether the service is currently announced on the network.
    public var isEstablished: Bool { state.withLock { $0.established } }
    /// How many times the registration was withdrawn and repeated because Avahi's probing stalled.
    var stallRetries: Int { state.withLock { $0.stallRetries } }

    /// Waits until the service is announced and returns its (possibly new) name.
    /// - Throws: ``DiscoveryError`` `.timedOut` after `timeout`, or the error that made the
    ///   publication fail; `.shutDown` at once when the calling task is cancelled.
    @discardableResult
    public func established(timeout: Duration = .seconds(10)) async throws(DiscoveryError) -> String {
        try await wait(.established, timeout: timeout) { state in
            if state.established { return .success(state.name) }
            return state.failure.map { .failure($0) }
        } timedOut: { service in
            DiscoveryError(.timedOut, service.owner.notEstablishedMessage(service, timeout: timeout))
        }.get()
    }

    /// Wide-area: the name registered in each unicast DNS domain so far (empty without wide-area
    /// publishing, or before the first registration).
    public var wideAreaNames: [String: String] {
        state.withLock { $0.wideAreaStatus.compactMapValues { try? $0.get() } }
    }

    /// Wide-area: waits until the service is registered in its unicast DNS domain and returns the
    /// name there.
    /// - Throws: the registration's error (``DiscoveryError`` `.updateRefused`, `.keyRejected`,
    ///   `.clockSkew`, `.dnsUnreachable`, …) as soon as it fails, `.timedOut` after `timeout`,
    ///   `.notPublished` when the service is not published in any unicast domain, or `.shutDown`
    ///   at once when the calling task is cancelled.
    @discardableResult
    public func registered(timeout: Duration = .seconds(10)) async throws(DiscoveryError) -> String {
        try await wait(.registered, timeout: timeout) { state in
            if let outcome = state.wideAreaStatus.values.first { return outcome }
            guard state.wideArea.isEmpty || state.wideAreaUnpublished else { return nil }
            return .failure(
                DiscoveryError(.notPublished, "'\(state.name)' is not published in a unicast DNS domain (no wide-area key configured)"))
        } timedOut: { service in
            DiscoveryError(.timedOut, "'\(service.name)' was not registered in its unicast DNS domain within \(timeout)")
        }.get()
    }

    /// One caller's wait: the outcome at once when `settled` has one, else when the publication
    /// records it, or `timedOut` at `timeout` (a timer of the scheduler, on the owner's queue), or
    /// `.shutDown` when the calling task is cancelled — whichever comes first, once.
    private func wait(
        _ kind: Wait, timeout: Duration, settled: @escaping @Sendable (inout State) -> Result<String, DiscoveryError>?,
        timedOut: @escaping @Sendable (PublishedService) -> DiscoveryError
    ) async -> Result<String, DiscoveryError> {
        let id = state.withLock { state in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Result<String, DiscoveryError>? in
                    if let outcome = settled(&state) { return outcome }
                    // Cancelled before it waited (the handler found no waiter to end).
                    if Task.isCancelled { return .failure(cancelled(kind, name: state.name)) }
                    state[kind][id] = Waiter(continuation: continuation)
                    return nil
                }
                if let now { return continuation.resume(returning: now) }
                let timer = scheduler.schedule(after: timeout, on: owner.queue) { [weak self] in
                    guard let self else { return }
                    self.end(kind, id, with: .failure(timedOut(self)))
                }
                // Ended already (settled, cancelled) between the two: its timer is not needed.
                let waiting = state.withLock { state in
                    guard state[kind][id] != nil else { return false }
                    state[kind][id]?.timer = timer
                    return true
                }
                if !waiting { timer.cancel() }
            }
        } onCancel: {
            end(kind, id, with: .failure(cancelled(kind, name: name)))
        }
    }

    /// Ends one caller's wait, if it still waits.
    private func end(_ kind: Wait, _ id: Int, with outcome: Result<String, DiscoveryError>) {
        state.withLock { $0[kind].removeValue(forKey: id) }?.resume(returning: outcome)
    }

    private func cancelled(_ kind: Wait, name: String) -> DiscoveryError {
        switch kind {
        case .established: DiscoveryError(.shutDown, "the wait for '\(name)' to be announced was cancelled")
        case .registered: DiscoveryError(.shutDown, "the wait for '\(name)' to be registered in its unicast DNS domain was cancelled")
        }
    }

    func attachWideArea(_ registrations: [WideAreaRegistration]) {
        state.withLock { $0.wideArea += registrations }
        for registration in registrations { registration.start() }
    }

    /// Stops and deletes the wide-area registrations (each bounded by its update timeout).
    func stopWideArea() async {
        let registrations = state.withLock { state -> [WideAreaRegistration] in
            state.wideAreaUnpublished = true
            defer { state.wideArea = [] }
            return state.wideArea
        }
        await withTaskGroup(of: Void.self) { group in
            for registration in registrations { group.addTask { await registration.stop() } }
        }
        let waiters = state.withLock { state -> [Waiter] in
            defer { state.wideAreaWaiters = [:] }
            return Array(state.wideAreaWaiters.values)
        }
        for waiter in waiters { waiter.resume(returning: .failure(DiscoveryError(.notPublished, "the service was unpublished"))) }
    }

    /// The discovery object went away: stop the wide-area registrations in the background.
    func beginStopWideArea() {
        let registrations = state.withLock { state -> [WideAreaRegistration] in
            defer { state.wideArea = [] }
            return state.wideArea
        }
        for registration in registrations { registration.beginStop() }
    }

    private func recordWideArea(_ event: PublicationEvent) {
        let (waiters, outcome) = state.withLock { state -> ([Waiter], Result<String, DiscoveryError>?) in
            let outcome: Result<String, DiscoveryError>
            switch event {
            case .registered(let name, let domain):
                outcome = .success(name)
                state.wideAreaStatus[domain] = outcome
            case .registrationFailed(let domain, let error):
                outcome = .failure(error)
                state.wideAreaStatus[domain] = outcome
            default:
                return ([], nil)
            }
            defer { state.wideAreaWaiters = [:] }
            return (Array(state.wideAreaWaiters.values), outcome)
        }
        guard let outcome else { return }
        for waiter in waiters { waiter.resume(returning: outcome) }
    }

    /// Replaces the TXT record while the service stays published. Remote resolvers that watch the
    /// service see the change (browsers do not).
    /// - Throws: ``DiscoveryError`` `.invalidTXT` (nothing changed), or `.avahi` when the daemon refused it.
    public func updateTXT(_ txt: TXTRecord) async throws(DiscoveryError) {
        try txt.validate()
        for registration in state.withLock({ $0.wideArea }) { registration.updateTXT(txt) }
        let result: Result<Void, DiscoveryError> = await withCheckedContinuation { continuation in
            owner.queue.async { [self] in continuation.resume(returning: owner.updateTXT(txt, of: self)) }
        }
        try result.get()
    }

    /// Withdraws the service from the network (remote browsers see it removed about a second later).
    /// Idempotent.
    public func unpublish() async {
        await stopWideArea()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            owner.queue.async { [self] in
                owner.unpublish(self)
                continuation.resume()
            }
        }
    }

    func record(_ event: PublicationEvent) {
        switch event {
        case .registered, .registrationRenamed, .registrationFailed:
            recordWideArea(event)
            continuation.yield(event)
            return
        default:
            break
        }
        let waiters: [Waiter]
        let result: Result<String, DiscoveryError>?
        (waiters, result) = state.withLock { state in
            switch event {
            case .established(let name):
                state.name = name
                state.established = true
                state.failure = nil
            case .renamed(_, let to):
                state.name = to
                state.established = false
            case .suspended:
                state.established = false
            case .failed(let error):
                state.established = false
                state.failure = error
            case .registered, .registrationRenamed, .registrationFailed:
                break
            }
            let outcome: Result<String, DiscoveryError>? =
                switch event {
                case .established(let name): .success(name)
                case .failed(let error): .failure(error)
                default: nil
                }
            guard outcome != nil else { return ([], nil) }
            let all = Array(state.waiters.values)
            state.waiters.removeAll()
            return (all, outcome)
        }
        if let result {
            for waiter in waiters { waiter.resume(returning: result) }
        }
        continuation.yield(event)
    }
}

extension PublishedService.State {
    /// The callers waiting for `kind`.
    subscript(kind: PublishedService.Wait) -> [Int: PublishedService.Waiter] {
        get {
            switch kind {
            case .established: waiters
            case .registered: wideAreaWaiters
            }
        }
        set {
            switch kind {
            case .established: waiters = newValue
            case .registered: wideAreaWaiters = newValue
            }
        }
    }
}
