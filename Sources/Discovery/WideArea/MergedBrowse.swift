import Dispatch
import Logging
import Scheduling

/// One browse across the link and unicast DNS domains, in one event stream: `MergeMachine`'s
/// decisions carried out on one serial queue.
///
/// Every input — the link's events, a resolve's answer, the domains found, a domain browse's
/// events, a timer — is queued and applied in order; the machine's actions are carried out on the
/// same queue: events reported in the order decided, the link browse, a resolve per link service
/// (bounded to a second), a `WideAreaBrowse` per domain, and timers (on the wide area's clock,
/// Dispatch's without one) for the grace after the link's "all for now" and the next enumeration
/// of the domains.
///
/// The queue is the only guard (no lock): every stored property below `queue` is read and written
/// on it alone. Every task the browse starts is counted until it ends, so a stop can be awaited:
/// ``stopped()`` returns once the browse stopped and every task it started (cancelled at the stop)
/// has ended — a resolve that ignores its cancellation is waited for, within its second.
final class MergedBrowse: @unchecked Sendable {
    /// The machine and the handles of what its actions started (cancelled at stop).
    private struct Driver {
        var machine: MergeMachine
        var backend: (any DiscoveryBackend)?
        var request: BrowseRequest?
        var linkTask: Task<Void, Never>?
        var resolves: [Int: Task<Void, Never>] = [:]
        var enumeration: Task<Void, Never>?
        var browses: [String: Task<Void, Never>] = [:]
        var refreshTimer: ScheduledWork?
        var graceTimer: ScheduledWork?
        /// Tasks started and not ended yet (cancelled ones included).
        var running = 0
        /// The stream was finished: nothing more starts.
        var finished = false
        /// What waits for the stop and the last task's end (``stopped()``).
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
        /// `onStopped` was called.
        var stopReported = false
    }

    let type: String
    let wideArea: WideArea?
    let continuation: AsyncStream<BrowseEvent>.Continuation
    let logger: Logger
    private let queue = DispatchQueue(label: "lanmsg.discovery.merged-browse")
    private let linkStop = DeferredStop()
    /// Called once on the queue when the browse has stopped and its last task ended.
    private let onStopped: @Sendable () -> Void
    /// On `queue` only.
    private var driver: Driver

    /// - Parameters:
    ///   - includesLink: Browse the link (mDNS through the backend).
    ///   - domains: The unicast domains to browse; nil: the configured and announced ones.
    init(
        type: String, includesLink: Bool, domains: [String]?, wideArea: WideArea?, logger: Logger,
        continuation: AsyncStream<BrowseEvent>.Continuation, onStopped: @escaping @Sendable () -> Void = {}
    ) {
        self.type = type
        self.wideArea = wideArea
        self.logger = logger
        self.continuation = continuation
        self.onStopped = onStopped
        let retry = wideArea.map { max(.seconds(5), $0.settings.pollInterval * 3) } ?? .seconds(5)
        self.driver = Driver(
            machine: MergeMachine(includesLink: includesLink, hasWideArea: wideArea != nil, fixedDomains: domains, domainRetry: retry))
    }

    /// Starts the link browse through `backend` (when included) and the domain browses; nothing
    /// when the browse was already stopped (its consumer went away before the backend was chosen).
    func start(backend: (any DiscoveryBackend)?, request: BrowseRequest) {
        queue.async { self.handle(.start(linkAvailable: backend != nil), backend: backend, request: request) }
    }

    func stop() {
        queue.async { self.handle(.stop) }
    }

    /// Stops the browse (if it was not already) and returns once every task it started has ended:
    /// afterwards nothing of it runs or calls the backend, and no timer of it is left.
    func stopped() async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            queue.async {
                self.handle(.stop)
                if self.driver.finished && self.driver.running == 0 {
                    waiter.resume()
                } else {
                    self.driver.stopWaiters.append(waiter)
                }
            }
        }
    }

    private func feed(_ input: MergeMachine.Input) {
        queue.async { self.handle(input) }
    }

    /// What an action leaves to be done after the machine decided: every call out of this object.
    private enum Effect {
        case report(BrowseEvent)
        case startLink(any DiscoveryBackend, BrowseRequest, AsyncStream<BrowseEvent>.Continuation)
        case cancel(Task<Void, Never>)
        case cancelTimer(ScheduledWork)
        case finish
    }

    /// The one door: applies `input` and carries out the actions (on the queue).
    private func handle(_ input: MergeMachine.Input, backend: (any DiscoveryBackend)? = nil, request: BrowseRequest? = nil) {
        dispatchPrecondition(condition: .onQueue(queue))
        // First the machine and the handles change; every call out of this object (the stream,
        // the backend, a task) is made after, still on the queue, in order.
        if let backend { driver.backend = backend }
        if let request { driver.request = request }
        let effects = driver.machine.apply(input).flatMap { carryOut($0) }
        for effect in effects {
            switch effect {
            case .report(let event): continuation.yield(event)
            case .startLink(let backend, let request, let events): linkStop.set(backend.startBrowse(request, continuation: events))
            case .cancel(let task): task.cancel()
            case .cancelTimer(let timer): timer.cancel()
            case .finish:
                linkStop.cancel()
                continuation.finish()
                driver.finished = true
                endIfStopped()
            }
        }
    }

    /// Starts `body` as a task counted until it ends (then, after a stop, the last one's end
    /// completes the stop).
    private func spawn(_ body: @escaping @Sendable () async -> Void) -> Task<Void, Never> {
        dispatchPrecondition(condition: .onQueue(queue))
        driver.running += 1
        return Task {
            await body()
            self.queue.async {
                self.driver.running -= 1
                self.endIfStopped()
            }
        }
    }

    /// After the stop, once no task runs: wakes what waits for the stop, once.
    private func endIfStopped() {
        guard driver.finished, driver.running == 0 else { return }
        let waiters = driver.stopWaiters
        driver.stopWaiters = []
        for waiter in waiters { waiter.resume() }
        if !driver.stopReported {
            driver.stopReported = true
            onStopped()
        }
    }

    /// Starts what `action` asks for and keeps its handle; returns the calls out, made after.
    private func carryOut(_ action: MergeMachine.Action) -> [Effect] {
        switch action {
        case .report(let event):
            return [.report(event)]
        case .startLink:
            guard let backend = driver.backend, let request = driver.request else { return [] }
            let (events, continuation) = AsyncStream.makeStream(of: BrowseEvent.self)
            driver.linkTask = spawn { for await event in events { self.feed(.link(event)) } }
            return [.startLink(backend, request, continuation)]
        case .resolve(let service, let generation):
            guard let backend = driver.backend, let request = driver.request else { return [] }
            // Read its fp and port without holding up the other events.
            driver.resolves[generation] = spawn {
                let resolved = await backend.resolve(
                    ResolveRequest(
                        identity: service.identity, sightings: Array(service.seenOn), interface: request.interface,
                        ipVersion: request.ipVersion),
                    timeout: .seconds(1))
                let found = try? resolved.get()
                self.feed(.resolved(service, generation: generation, mergeKey: MergeMachine.mergeKey(fingerprint: found?.txt["fp"], port: found?.port)))
            }
            return []
        case .cancelResolve(let generation):
            return driver.resolves.removeValue(forKey: generation).map { [.cancel($0)] } ?? []
        case .enumerateDomains:
            guard let wideArea else { return [] }
            driver.enumeration = spawn {
                let found = await wideArea.domains()
                if Task.isCancelled { return }
                self.feed(.domains(found.browse, unanswered: found.unanswered != nil))
            }
            return []
        case .armDomainRefresh(let delay):
            return replace(&driver.refreshTimer, with: timer(after: delay) { self.feed(.domainsDue) })
        case .startDomain(let domain):
            guard let wideArea else { return [] }
            let browse = WideAreaBrowse(wideArea: wideArea, domain: domain, type: type) { [weak self] event in
                self?.feed(.domain(domain, event))
            }
            driver.browses[domain] = spawn { await browse.run() }
            return []
        case .stopDomain(let domain):
            return driver.browses.removeValue(forKey: domain).map { [.cancel($0)] } ?? []
        case .armGrace(let delay):
            return replace(&driver.graceTimer, with: timer(after: delay) { self.feed(.graceOver) })
        case .stopAll:
            let tasks = [driver.linkTask, driver.enumeration].compactMap { $0 } + driver.resolves.values + driver.browses.values
            let timers = [driver.refreshTimer, driver.graceTimer].compactMap { $0 }
            driver.linkTask = nil
            driver.enumeration = nil
            driver.resolves = [:]
            driver.browses = [:]
            driver.refreshTimer = nil
            driver.graceTimer = nil
            driver.backend = nil
            return tasks.map { .cancel($0) } + timers.map { .cancelTimer($0) } + [.finish]
        }
    }

    /// Keeps `new` in `slot`; the timer it replaces is cancelled after (a call out).
    private func replace(_ slot: inout ScheduledWork?, with new: ScheduledWork) -> [Effect] {
        let old = slot
        slot = new
        return old.map { [.cancelTimer($0)] } ?? []
    }

    /// A one-shot timer on the queue, on the wide area's clock (Dispatch's without one).
    private func timer(after delay: Duration, _ fire: @escaping @Sendable () -> Void) -> ScheduledWork {
        (wideArea?.scheduler ?? DispatchScheduler()).schedule(after: delay, on: queue, fire)
    }
}
