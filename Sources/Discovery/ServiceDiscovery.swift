import Dispatch
import Locks
import Scheduling
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// DNS-SD service discovery: publish, browse and resolve services, through the Avahi daemon or,
/// where no daemon runs, through an embedded mDNS responder and querier.
///
/// ``DiscoveryBackendChoice/automatic`` (the default) uses Avahi when its daemon answers within
/// ``DiscoveryConfiguration/avahiTimeout`` (1 s) and the embedded stack otherwise; the choice is
/// made once, at creation, and logged. ``activeBackend`` says which one runs.
///
/// With Avahi, one `ServiceDiscovery` holds one connection (an Avahi client) to the daemon over the
/// system D-Bus, driven by Dispatch on one serial queue reserved for Avahi — no helper thread, no
/// polling. It survives what real systems do: when the daemon dies it reconnects
/// (`AVAHI_CLIENT_NO_FAIL`), re-publishes every service under the same name (unless that name now
/// collides) and restarts every browse and resolve; when the system bus itself is gone it retries on
/// a back-off timer. The embedded stack owns UDP port 5353 sockets (shared with other mDNS stacks)
/// on one serial queue, driven by Dispatch sources and timers.
///
/// ```swift
/// let discovery = ServiceDiscovery(logger: logger)
/// let service = try await discovery.publish(name: "Lobby", type: "_chat._tcp", port: 4242, txt: ["v": "1"])
/// for await event in try discovery.browse(type: "_chat._tcp") { print(event) }
/// ```
public final class ServiceDiscovery: Sendable {
    let selector = BackendSelector()
    let logger: Logger
    /// The settings in force (from the caller, or from the environment when none was given).
    public let configuration: DiscoveryConfiguration
    /// Events and daemon state through swift-metrics (nil: no back end bootstrapped).
    let metrics = DiscoveryMetrics.make()
    /// Wide-area DNS-SD beside the link (nil when turned off).
    let wideArea: WideArea?
    /// The clock of ``services(ofType:timeout:until:)``'s timeout (Dispatch's; tests turn a
    /// manual one).
    let scheduler: any Scheduler
    /// Merged browses and wide-area watches until they have ended (not only been stopped: a
    /// stopped one stays until its last task ended), stopped and awaited by ``shutdown()``.
    let wideAreaActivity = Locked<(browses: [Int: MergedBrowse], watches: [Int: Task<Void, Never>], next: Int)>(
        ([:], [:], 0))

    /// Creates the discovery object and starts its backend.
    /// - Parameters:
    ///   - logger: Where discovery logs (backend choice, daemon state changes, collisions, failures).
    ///   - programName: Used in default service names (`"<program> on <host>"`); defaults to the
    ///     executable's name.
    ///   - backend: Avahi, the embedded mDNS stack, or automatic (Avahi when its daemon is
    ///     reachable). With `.automatic`, `LANMSG_DISCOVERY_BACKEND=avahi|embedded` overrides it.
    ///   - configuration: Interfaces, IP version, advertised addresses; nil reads
    ///     ``DiscoveryConfiguration/fromEnvironment(_:)``.
    public init(
        logger: Logger, programName: String? = nil, backend: DiscoveryBackendChoice = .automatic,
        configuration: DiscoveryConfiguration? = nil
    ) {
        let program = programName ?? CommandLine.arguments.first.map { String($0.split(separator: "/").last ?? "") } ?? "app"
        let name = program.isEmpty ? "app" : program
        self.logger = logger
        scheduler = DispatchScheduler()
        var settings = configuration ?? DiscoveryConfiguration()
        if configuration == nil {
            let (fromEnvironment, problems) = DiscoveryConfiguration.fromEnvironment()
            settings = fromEnvironment
            for problem in problems { logger.warning("ignored discovery setting", metadata: ["problem": "\(problem)"]) }
        }
        // LANMSG_WIDE_AREA=off wins over any configuration: no unicast DNS query leaves the process.
        if let value = currentEnvironment()["LANMSG_WIDE_AREA"]?.lowercased(), ["off", "0", "no"].contains(value) {
            settings.wideArea.isEnabled = false
        }
        self.configuration = settings
        if settings.wideArea.isEnabled, settings.wideArea.isActive || settings.wideArea.key != nil {
            let label = settings.hostName.flatMap { $0.isEmpty ? nil : $0 } ?? EmbeddedBackend.hostLabel()
            wideArea = WideArea(configuration: settings, logger: logger, hostLabel: label)
        } else {
            wideArea = nil
        }
        var choice = backend
        if backend == .automatic, let forced = currentEnvironment()["LANMSG_DISCOVERY_BACKEND"], !forced.isEmpty {
            if let parsed = DiscoveryBackendChoice(rawValue: forced) {
                choice = parsed
            } else {
                logger.warning("ignored LANMSG_DISCOVERY_BACKEND", metadata: ["value": "\(forced)", "expected": "avahi, embedded, automatic"])
            }
        }
        let selector = self.selector
        let why = choice == backend ? "chosen by the application" : "LANMSG_DISCOVERY_BACKEND=\(choice)"
        switch choice {
        case .avahi:
            let core = AvahiBackend(logger: logger, programName: name, configuration: settings)
            logger.info("discovery backend: avahi", metadata: ["reason": "\(why)"])
            selector.decide(core, reason: why)
            core.queue.async { core.connect() }
        case .embedded:
            let embedded = EmbeddedBackend(logger: logger, programName: name, configuration: settings)
            logger.info("discovery backend: embedded mDNS", metadata: ["reason": "\(why)"])
            selector.decide(embedded, reason: why)
            embedded.start()
        case .automatic:
            AutomaticChoice.start(logger: logger, programName: name, configuration: settings, selector: selector)
        }
        if let metrics {
            // The daemon state as a gauge; the stream ends when the backend stops.
            let states = daemonStates()
            Task { for await state in states { metrics.daemon(state) } }
        }
    }

    /// A discovery object on `backend` and `wideArea` as given, nothing read from the environment
    /// (tests: a fake link, and a `WideAreaWorld`'s wide area on its manual clock); `scheduler` is
    /// the snapshot's clock (default Dispatch's, even beside a wide area on a manual clock).
    init(
        logger: Logger, configuration: DiscoveryConfiguration, backend: any DiscoveryBackend, wideArea: WideArea?,
        scheduler: (any Scheduler)? = nil
    ) {
        self.logger = logger
        self.configuration = configuration
        self.wideArea = wideArea
        self.scheduler = scheduler ?? DispatchScheduler()
        selector.decide(backend, reason: "given")
    }

    deinit {
        wideArea?.beginShutdown()
        selector.whenDecided { $0.beginShutdown() }
    }

    /// The backend in use; nil while ``DiscoveryBackendChoice/automatic`` is still deciding
    /// (at most ``DiscoveryConfiguration/avahiTimeout`` after creation).
    public var activeBackend: DiscoveryBackendKind? { selector.current?.kind }

    /// The backend in use, waiting for the automatic choice if needed.
    public func backend() async -> DiscoveryBackendKind { await selector.backend().kind }

    /// Why the backend in use was chosen, e.g. "avahi-daemon reachable" (nil while deciding).
    public var backendReason: String? { selector.reason }

    /// Registers a process-wide observer told, once per ``ServiceDiscovery``, which backend was
    /// chosen and why — for programs that print it at start. nil removes it.
    public static func onBackendChosen(_ observer: (@Sendable (DiscoveryBackendKind, _ reason: String) -> Void)?) {
        BackendSelector.observer.withLock { $0 = observer }
    }

    /// The daemon connection's current state. The embedded backend reports `registering` while it
    /// claims its host name and `running` once it has; before a backend is chosen, `connecting`.
    public var daemonState: DaemonState { selector.current?.currentState ?? .connecting }

    /// The host name (e.g. `alpha`) from Avahi or claimed by the embedded stack; until then the
    /// kernel's host name.
    public var hostName: String { selector.current?.currentHostName ?? kernelHostName() }

    /// The daemon connection's states: the current one first, then every change, until shutdown.
    public func daemonStates() -> AsyncStream<DaemonState> {
        if let backend = selector.current { return backend.stateUpdates() }
        let (stream, continuation) = AsyncStream.makeStream(of: DaemonState.self)
        continuation.yield(.connecting)
        let forward = DeferredStop()
        continuation.onTermination = { _ in forward.cancel() }
        selector.whenDecided { backend in
            let task = Task {
                var first = true
                for await state in backend.stateUpdates() {
                    if first, state == .connecting { first = false; continue }  // already said
                    first = false
                    continuation.yield(state)
                }
                continuation.finish()
            }
            forward.set { task.cancel() }
        }
        return stream
    }

    /// Publishes a service.
    ///
    /// Returns once the registration has been handed to the daemon (or queued, while the daemon is
    /// away). Await ``PublishedService/established(timeout:)`` to know it is announced. A name that
    /// collides is replaced by an alternative (`"Name #2"`), reported as ``PublicationEvent/renamed(from:to:)``.
    /// - Parameters:
    ///   - name: The instance name; nil gives `"<program> on <host>"`.
    ///   - type: The service type, e.g. `_bonjour-chat._tcp`.
    ///   - domain: nil for the default domain (`local`).
    ///   - port: The port the service listens on.
    ///   - txt: The TXT record; validated before anything is sent.
    ///   - interface: Publish on every interface or only one.
    ///   - ipVersion: Publish over IPv4, IPv6 or both.
    /// - Throws: ``DiscoveryError`` with code `.invalidTXT` or `.invalidArgument`, or `.shutDown`.
    public func publish(
        name: String? = nil,
        type: String,
        domain: String? = nil,
        port: UInt16,
        txt: TXTRecord = TXTRecord(),
        interface: InterfaceSelection = .any,
        ipVersion: IPVersion = .any
    ) async throws(DiscoveryError) -> PublishedService {
        try txt.validate()
        try Self.validateType(type)
        if let name, name.isEmpty || name.utf8.count > 63 {
            throw DiscoveryError(.invalidArgument, "service name '\(name)' must be 1 to 63 bytes of UTF-8")
        }
        let interfaceIndex = try resolvedInterface(interface)
        let version = try configuration.effectiveVersion(ipVersion)
        let wideAreaDomain = domain.flatMap { Self.isLinkDomain($0) ? nil : WideAreaConfiguration.normalize($0) }
        if domain != nil, !Self.isLinkDomain(domain!), wideAreaDomain == nil {
            throw DiscoveryError(.invalidArgument, "'\(domain!)' is not a domain name")
        }
        if wideAreaDomain != nil, wideArea?.settings.key == nil {
            throw DiscoveryError(
                .invalidArgument,
                "publishing in the unicast domain '\(domain!)' needs a TSIG key (WideAreaConfiguration.key, --wide-area-key, LANMSG_WIDE_AREA_KEY)")
        }
        if wideArea?.settings.key != nil, txt.contains(expiresKey) {
            throw DiscoveryError(
                .invalidTXT, "the TXT key '\(expiresKey)' is reserved: wide-area publishing puts the registration's expiry there")
        }
        // The link always gets the default domain; a unicast domain is for the wide-area side.
        let request = PublishRequest(
            name: name, type: type, domain: nil, port: port, txt: txt, interface: interfaceIndex, ipVersion: version)
        do {
            let published = try await selector.backend().publish(request).get()
            metrics?.count(.published)
            if let wideArea, wideArea.settings.key != nil {
                var wideRequest = request
                wideRequest.domain = wideAreaDomain
                wideArea.register(wideRequest, name: published.name, handle: published)
            }
            return published
        } catch {
            metrics?.count(.publishFailed)
            throw error
        }
    }

    /// Browses for services of one type.
    ///
    /// The browse runs until the sequence's iteration ends (or the task is cancelled). Each service
    /// is reported once however many interfaces and IP versions Avahi sees it on, and removed when
    /// its last sighting goes. When the daemon goes away every known service is reported removed;
    /// the browse restarts by itself when the daemon returns.
    /// - Parameters:
    ///   - type: The service type, e.g. `_bonjour-chat._tcp`.
    ///   - domain: nil for the default domain.
    ///   - interface: Browse every interface or only one.
    ///   - ipVersion: Only sightings over this IP version.
    public func browse(
        type: String, domain: String? = nil, interface: InterfaceSelection = .any, ipVersion: IPVersion = .any
    ) throws(DiscoveryError) -> ServiceBrowser {
        try Self.validateType(type)
        let interfaceIndex = try resolvedInterface(interface)
        let request = BrowseRequest(
            type: type, domain: domain, interface: interfaceIndex, ipVersion: try configuration.effectiveVersion(ipVersion))
        let (stream, continuation) = AsyncStream.makeStream(of: BrowseEvent.self)
        if let wideArea, domain.map({ !Self.isLinkDomain($0) }) ?? wideArea.settings.isActive {
            // The link and the unicast domains in one stream (or one unicast domain alone).
            let unicast = domain.map { WideAreaConfiguration.normalize($0) ?? $0 }
            let linkRequest = BrowseRequest(
                type: type, domain: nil, interface: request.interface, ipVersion: request.ipVersion)
            let id = wideAreaActivity.withLock { activity -> Int in
                activity.next += 1
                return activity.next
            }
            let merged = MergedBrowse(
                type: type, includesLink: unicast == nil, domains: unicast.map { [$0] }, wideArea: wideArea,
                logger: logger, continuation: continuation,
                onStopped: { [weak self] in _ = self?.wideAreaActivity.withLock { $0.browses.removeValue(forKey: id) } })
            wideAreaActivity.withLock { $0.browses[id] = merged }
            continuation.onTermination = { _ in merged.stop() }
            if unicast == nil {
                selector.whenDecided { backend in merged.start(backend: backend, request: linkRequest) }
            } else {
                merged.start(backend: nil, request: linkRequest)
            }
            return ServiceBrowser(stream: stream, metrics: metrics)
        }
        let stop = DeferredStop()
        continuation.onTermination = { _ in stop.cancel() }
        selector.whenDecided { backend in stop.set(backend.startBrowse(request, continuation: continuation)) }
        return ServiceBrowser(stream: stream, metrics: metrics)
    }

    /// Browses for a while and returns the services seen, sorted by name: the snapshot a "list"
    /// command or a "find the one named X" needs.
    ///
    /// Returns when `done` says so (it is asked after every browse event with what is seen and
    /// whether Avahi reported "all for now") or at `timeout`, whichever comes first. The default
    /// `done` browses for the whole `timeout`.
    /// - Throws: ``DiscoveryError`` `.invalidArgument` for a malformed type, `.shutDown`.
    public func services(
        ofType type: String, timeout: Duration,
        until done: @escaping @Sendable (_ seen: [DiscoveredService], _ allForNow: Bool) -> Bool = { _, _ in false }
    ) async throws(DiscoveryError) -> [DiscoveredService] {
        let browser = try browse(type: type)
        let seen = Locked<[ServiceIdentity: DiscoveredService]>([:])
        let sorted: @Sendable () -> [DiscoveredService] = { seen.withLock { Array($0.values) }.sorted { $0.name < $1.name } }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await event in browser {
                    var allForNow = false
                    switch event {
                    case .added(let service): seen.withLock { $0[service.identity] = service }
                    case .removed(let service): _ = seen.withLock { $0.removeValue(forKey: service.identity) }
                    case .updated(let service): seen.withLock { $0[service.identity] = service }
                    case .allForNow: allForNow = true
                    case .failed: break
                    }
                    if done(sorted(), allForNow) { return }
                }
            }
            group.addTask { await self.scheduler.sleep(for: timeout) }
            await group.next()  // the first to finish decides; the other is cancelled
            group.cancelAll()
        }
        return sorted()
    }

    /// Resolves a browsed service: host name, port, TXT and every address with its interface.
    ///
    /// Resolves on every interface and IP version the service was seen on, then collects all A and
    /// AAAA records of its host. Returns as soon as every resolver has answered with both an IPv4 and
    /// an IPv6 address (only the family asked for, with `ipVersion`), else a quarter second after the
    /// first answer, so that the other address family can arrive too.
    /// - Throws: ``DiscoveryError`` with code `.timedOut` when nothing answers within `timeout`;
    ///   `.shutDown` ("resolve of … was cancelled") at once when the calling task is cancelled.
    public func resolve(
        _ service: DiscoveredService, ipVersion: IPVersion = .any, timeout: Duration = .seconds(5)
    ) async throws(DiscoveryError) -> ResolvedService {
        if service.locations.count > 1 || !Self.isLinkDomain(service.identity.domain), wideArea != nil {
            return try await resolveEverywhere(service, ipVersion: ipVersion, timeout: timeout)
        }
        return try await resolve(
            service.identity, sightings: Array(service.seenOn), interface: nil, ipVersion: ipVersion, timeout: timeout)
    }

    /// Resolves a service known by name (no browse needed).
    /// - Throws: ``DiscoveryError`` with code `.timedOut` when nothing answers within `timeout`;
    ///   `.shutDown` ("resolve of … was cancelled") at once when the calling task is cancelled.
    public func resolve(
        _ identity: ServiceIdentity, interface: InterfaceSelection = .any, ipVersion: IPVersion = .any,
        timeout: Duration = .seconds(5)
    ) async throws(DiscoveryError) -> ResolvedService {
        try await resolve(identity, sightings: [], interface: try resolvedInterface(interface), ipVersion: ipVersion, timeout: timeout)
    }

    private func resolve(
        _ identity: ServiceIdentity, sightings: [DiscoveredService.Sighting], interface: Int32?,
        ipVersion: IPVersion, timeout: Duration
    ) async throws(DiscoveryError) -> ResolvedService {
        if let wideArea, !Self.isLinkDomain(identity.domain) {
            do {
                let resolved = try await wideArea.resolve(identity, timeout: timeout).only(try configuration.effectiveVersion(ipVersion))
                metrics?.count(.resolved)
                return resolved
            } catch {
                metrics?.count(.resolveFailed)
                // Cancelled: said as the link's backends say it (its queries were cut short).
                if Task.isCancelled { throw DiscoveryError(.shutDown, "resolve of \(identity) was cancelled") }
                throw error
            }
        }
        let request = ResolveRequest(
            identity: identity, sightings: sightings, interface: interface,
            ipVersion: try configuration.effectiveVersion(ipVersion))
        do {
            let resolved = try await selector.backend().resolve(request, timeout: timeout).get()
            metrics?.count(.resolved)
            return resolved
        } catch {
            metrics?.count(.resolveFailed)
            throw error
        }
    }

    /// Keeps resolving a service and reports every change: TXT updates (which browsers do not
    /// report), address changes, a new port. The first element is the first complete resolution.
    /// Runs until the iteration ends.
    public func watch(
        _ identity: ServiceIdentity, interface: InterfaceSelection = .any, ipVersion: IPVersion = .any
    ) throws(DiscoveryError) -> ServiceWatcher {
        let request = ResolveRequest(
            identity: identity, sightings: [], interface: try resolvedInterface(interface),
            ipVersion: try configuration.effectiveVersion(ipVersion))
        let (stream, continuation) = AsyncStream.makeStream(of: ResolvedService.self, bufferingPolicy: .bufferingNewest(16))
        if let wideArea, !Self.isLinkDomain(identity.domain) {
            // Kept until its task ended (it removes itself then), so that shutdown awaits it even
            // when its consumer stopped first.
            let task = wideAreaActivity.withLock { activity -> Task<Void, Never> in
                activity.next += 1
                let id = activity.next
                let task = watchWideArea(identity, wideArea: wideArea, ipVersion: request.ipVersion, continuation: continuation) {
                    [weak self] in _ = self?.wideAreaActivity.withLock { $0.watches.removeValue(forKey: id) }
                }
                activity.watches[id] = task
                return task
            }
            continuation.onTermination = { _ in task.cancel() }
            return ServiceWatcher(stream: stream)
        }
        let stop = DeferredStop()
        continuation.onTermination = { _ in stop.cancel() }
        selector.whenDecided { backend in stop.set(backend.startWatch(request, continuation: continuation)) }
        return ServiceWatcher(stream: stream)
    }

    /// Unpublishes everything, stops every browse and resolve, and disconnects from the daemon.
    /// Idempotent. Afterwards no Dispatch source or timer of this object is left, and no task of
    /// a wide-area browse or watch runs (each is awaited, not only cancelled).
    public func shutdown() async {
        let (browses, watches) = wideAreaActivity.withLock { activity in
            (Array(activity.browses.values), Array(activity.watches.values))
        }
        for browse in browses { browse.stop() }
        for watch in watches { watch.cancel() }
        for browse in browses { await browse.stopped() }
        for watch in watches { await watch.value }
        await wideArea?.shutdown()
        await selector.backend().shutdown()
    }

    /// Whether `domain` names the link (`local`), not a unicast DNS domain.
    static func isLinkDomain(_ domain: String) -> Bool {
        var text = domain.lowercased()
        while text.hasSuffix(".") { text.removeLast() }
        return text == "local" || text.isEmpty
    }

    /// The interface index asked for, checked against the interface policy.
    private func resolvedInterface(_ interface: InterfaceSelection) throws(DiscoveryError) -> Int32? {
        let index = try interface.resolvedIndex()
        if let index, configuration.interfaces.isRestrictive {
            let name = interfaceName(ofIndex: index) ?? "#\(index)"
            guard configuration.interfaces.permits(name) else {
                throw DiscoveryError(
                    .invalidArgument, "interface \(name) is excluded by the interface policy (\(configuration.interfaces))")
            }
        }
        return index
    }

    /// Avahi only: how long a publication may stay in Avahi's probing phase before it is withdrawn
    /// and registered again (default 5 s; tests shorten it).
    func setProbeStallTimeout(_ timeout: Duration) async {
        guard let core = await selector.backend() as? AvahiBackend else { return }
        await core.perform { core.probeStallTimeout = timeout }
    }

    /// Embedded only: wakeups, live Dispatch sources, engine and cache counters (nil for Avahi).
    var embeddedDiagnostics: EmbeddedDiagnostics? {
        get async {
            guard let embedded = await selector.backend() as? EmbeddedBackend else { return nil }
            return await embedded.readDiagnostics()
        }
    }

    /// Avahi only: counters of the Dispatch poll adapter, for tests: live watches, live timeouts,
    /// wakeups so far (zeros for the embedded backend).
    var pollCounters: (watches: Int, timeouts: Int, wakeups: Int) {
        get async {
            guard let core = await selector.backend() as? AvahiBackend else { return (0, 0, 0) }
            return await core.perform { (core.poll.liveWatches, core.poll.liveTimeouts, core.poll.wakeups) }
        }
    }

    static func validateType(_ type: String) throws(DiscoveryError) {
        let parts = type.split(separator: ".")
        guard parts.count >= 2, parts.allSatisfy({ $0.hasPrefix("_") && $0.count >= 2 }),
            parts.last == "_tcp" || parts.last == "_udp"
        else {
            throw DiscoveryError(
                .invalidArgument, "service type '\(type)' is not of the form _name._tcp or _name._udp")
        }
    }
}

/// The events of one browse; see ``ServiceDiscovery/browse(type:domain:interface:ipVersion:)``.
public struct ServiceBrowser: AsyncSequence, Sendable {
    public typealias Element = BrowseEvent
    let stream: AsyncStream<BrowseEvent>
    let metrics: DiscoveryMetrics?

    /// The browse's iterator (events are counted in discovery's metrics as they are taken).
    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: AsyncStream<BrowseEvent>.Iterator
        let metrics: DiscoveryMetrics?

        public mutating func next() async -> BrowseEvent? {
            let event = await base.next()
            if let event, let metrics { metrics.browsed(event) }
            return event
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(base: stream.makeAsyncIterator(), metrics: metrics) }
}

/// The successive resolutions of a watched service; see ``ServiceDiscovery/watch(_:interface:ipVersion:)``.
public struct ServiceWatcher: AsyncSequence, Sendable {
    public typealias Element = ResolvedService
    let stream: AsyncStream<ResolvedService>
    public func makeAsyncIterator() -> AsyncStream<ResolvedService>.Iterator { stream.makeAsyncIterator() }
}

