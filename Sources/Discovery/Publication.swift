import Dispatch
import Locks
import Scheduling

/// A published service. Keep it to keep the service published; call ``unpublish()`` to withdraw it.
///
/// The name can change: when another service on the network has the same name, Avahi picks an
/// alternative (`"Name #2"`) and ``events`` reports ``PublicationEvent/renamed(from:to:)``.
public final class PublishedService: Sendable {
    typealias Machine = PublicationMachine<Waiter, WideAreaRegistration>
    typealias Wait = Machine.Wait

    struct State {
        var machine: Machine
        /// The backend's object for this publication (an Avahi `Publication`, an embedded
        /// `EmbeddedPublication`); set and read on `owner.queue`, held weakly.
        weak var backendObject: AnyObject?
    }

    /// A caller of `established(timeout:)` or `registered(timeout:)`, with the timer that ends its
    /// wait at its deadline (stopped when the publication settles first, or the caller's task is
    /// cancelled).
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

    private let state: Locked<State>
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
        self.state = Locked(State(machine: Machine(name: name, txt: txt)))
        (events, continuation) = AsyncStream.makeStream(of: PublicationEvent.self)
    }

    /// A value read off the machine as it is now (the one door for reads; nothing is copied but
    /// the value).
    private func read<Value>(_ value: (Machine) -> Value) -> Value { state.withLock { value($0.machine) } }

    /// The one door for changes: an input to the machine, under the lock; what it returns is done
    /// by the caller after the lock is released.
    private func change<Result>(_ input: (inout Machine) -> Result) -> Result {
        state.withLock { input(&$0.machine) }
    }

    /// The current name (it changes after a collision).
    public var name: String { read(\.name) }
    /// The current TXT record.
    public var txt: TXTRecord { read(\.txt) }
    /// Whether the service is currently announced on the network.
    public var isEstablished: Bool { read(\.established) }
    /// How many times the registration was withdrawn and repeated because Avahi's probing stalled.
    var stallRetries: Int { read(\.stallRetries) }

    /// The backend announces `txt` now.
    func txtChanged(_ txt: TXTRecord) { change { $0.txtChanged(txt) } }

    /// The backend withdrew and repeated the registration because probing stalled.
    func stallRetried() { change { $0.stallRetried() } }

    /// Waits until the service is announced and returns its (possibly new) name.
    /// - Throws: ``DiscoveryError`` `.timedOut` after `timeout`, or the error that made the
    ///   publication fail; `.shutDown` at once when the calling task is cancelled.
    @discardableResult
    public func established(timeout: Duration = .seconds(10)) async throws(DiscoveryError) -> String {
        try await wait(.established, timeout: timeout) { service in
            DiscoveryError(.timedOut, service.owner.notEstablishedMessage(service, timeout: timeout))
        }.get()
    }

    /// Wide-area: the name registered in each unicast DNS domain so far (empty without wide-area
    /// publishing, or before the first registration).
    public var wideAreaNames: [String: String] {
        read { $0.wideAreaStatus.compactMapValues { try? $0.get() } }
    }

    /// Wide-area: waits until the service is registered in its unicast DNS domain and returns the
    /// name there.
    /// - Throws: the registration's error (``DiscoveryError`` `.updateRefused`, `.keyRejected`,
    ///   `.clockSkew`, `.dnsUnreachable`, …) as soon as it fails, `.timedOut` after `timeout`,
    ///   `.notPublished` when the service is not published in any unicast domain, or `.shutDown`
    ///   at once when the calling task is cancelled.
    @discardableResult
    public func registered(timeout: Duration = .seconds(10)) async throws(DiscoveryError) -> String {
        try await wait(.registered, timeout: timeout) { service in
            DiscoveryError(.timedOut, "'\(service.name)' was not registered in its unicast DNS domain within \(timeout)")
        }.get()
    }

    /// One caller's wait: the outcome at once when the publication has one for `kind`, else when
    /// it records one, or `timedOut` at `timeout` (a timer of the scheduler, on the owner's queue),
    /// or `.shutDown` when the calling task is cancelled — whichever comes first, once.
    private func wait(
        _ kind: Wait, timeout: Duration, timedOut: @escaping @Sendable (PublishedService) -> DiscoveryError
    ) async -> Result<String, DiscoveryError> {
        let id = change { $0.newWaiter() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                // (Cancelled before it waited: the handler found no waiter to end.)
                let now = change { $0.wait(kind, id: id, Waiter(continuation: continuation), cancelled: Task.isCancelled) }
                if let now { return continuation.resume(returning: now) }
                let timer = scheduler.schedule(after: timeout, on: owner.queue) { [weak self] in
                    guard let self else { return }
                    self.end(kind, id, with: .failure(timedOut(self)))
                }
                // Ended already (settled, cancelled) between the two: its timer is not needed.
                if !change({ $0.update(kind, id) { $0.timer = timer } }) { timer.cancel() }
            }
        } onCancel: {
            end(kind, id, with: .failure(read { $0.cancellation(of: kind) }))
        }
    }

    /// Ends one caller's wait, if it still waits.
    private func end(_ kind: Wait, _ id: Int, with outcome: Result<String, DiscoveryError>) {
        change { $0.end(kind, id) }?.resume(returning: outcome)
    }

    /// Registrations of the service in unicast domains, started (`start`: false in tests that
    /// record their outcomes themselves).
    func attachWideArea(_ registrations: [WideAreaRegistration], start: Bool = true) {
        change { $0.attach(registrations) }
        guard start else { return }
        for registration in registrations { registration.start() }
    }

    /// Stops and deletes the wide-area registrations (each bounded by its update timeout).
    func stopWideArea() async {
        let registrations = change { $0.unpublishWideArea() }
        await withTaskGroup(of: Void.self) { group in
            for registration in registrations { group.addTask { await registration.stop() } }
        }
        let (waiters, outcome) = change { $0.wideAreaStopped() }
        for waiter in waiters { waiter.resume(returning: outcome) }
    }

    /// The discovery object went away: stop the wide-area registrations in the background.
    func beginStopWideArea() {
        for registration in change({ $0.detachWideArea() }) { registration.beginStop() }
    }

    /// Replaces the TXT record while the service stays published. Remote resolvers that watch the
    /// service see the change (browsers do not).
    /// - Throws: ``DiscoveryError`` `.invalidTXT` (nothing changed), or `.avahi` when the daemon refused it.
    public func updateTXT(_ txt: TXTRecord) async throws(DiscoveryError) {
        try txt.validate()
        for registration in read(\.wideArea) { registration.updateTXT(txt) }
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

    /// A backend's or a wide-area registration's event: the callers it settles are resumed, then
    /// the app's `events` get it.
    func record(_ event: PublicationEvent) {
        let (waiters, outcome) = change { $0.record(event) }
        if let outcome {
            for waiter in waiters { waiter.resume(returning: outcome) }
        }
        continuation.yield(event)
    }
}
