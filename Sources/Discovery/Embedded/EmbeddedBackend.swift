import Locks
import Dispatch
import Logging
import MDNSCore
import Scheduling

#if canImport(Glibc)
    import Glibc
#endif

/// The embedded mDNS backend: ``MDNSEngine`` (the protocol, no I/O) driven by Dispatch on one
/// serial queue — a read source per socket (IPv4, IPv6), a read source on a netlink socket for
/// interface changes (both through its ``EmbeddedLinkLayer``), one timer at the engine's next
/// deadline (cancelled when there is none; every timer on its ``Scheduler``). No helper thread, no
/// polling. Given a simulated link layer and a ``ManualScheduler``, several backends run in one
/// process in virtual time.
///
/// Thread-safety: every mutable field is confined to `queue`; `published` is a lock for the values
/// read from outside (state, host name, state observers).
final class EmbeddedBackend: @unchecked Sendable {
    let queue = DispatchQueue(label: "discovery.mdns")
    let logger: Logger
    let programName: String
    let configuration: DiscoveryConfiguration
    let published: Locked<PublishedState>
    /// The sockets, the interface list and the watch on it.
    let linkLayer: any EmbeddedLinkLayer
    /// The clock of the engine and of every timer below.
    let scheduler: any Scheduler

    // queue-confined
    private var engine: MDNSEngine
    private var sockets: [AddressFamily: any EmbeddedPort] = [:]
    private var interfaceWatch: (any EmbeddedInterfaceWatch)?
    private var rescanTimer: ScheduledWork?
    /// At the engine's next deadline: moved, not made anew, as that deadline moves.
    private var timer: (any RearmableTimer)?
    private var timerDeadline: MDNSInstant?
    private var retryTimer: ScheduledWork?
    private var retryDelay: Duration = .milliseconds(250)
    private var joined: Set<LinkID> = []
    private var localAddresses: Set<[UInt8]> = []
    private var publications: [Int: EmbeddedPublication] = [:]
    private var browses: [Int: EmbeddedBrowse] = [:]
    private var resolves: [Int: EmbeddedResolve] = [:]
    private var stopped = false
    private var pumping = false
    /// Timer, socket and netlink wakeups so far (tests: an idle stack must not wake up).
    private(set) var wakeups = 0
    /// Datagrams over 9,000 bytes dropped.
    private(set) var truncated = 0

    init(
        logger: Logger, programName: String, configuration: DiscoveryConfiguration,
        linkLayer: any EmbeddedLinkLayer = SystemLinkLayer(), scheduler: any Scheduler = DispatchScheduler(),
        seed: UInt64? = nil
    ) {
        self.logger = logger
        self.programName = programName
        self.configuration = configuration
        self.linkLayer = linkLayer
        self.scheduler = scheduler
        let label = configuration.hostName.flatMap { $0.isEmpty ? nil : $0 } ?? Self.hostLabel()
        published = Locked(PublishedState(hostName: label))
        var settings = MDNSConfiguration(hostName: label)
        settings.cacheCapacity = configuration.cacheCapacity
        settings.advertisedAddresses = configuration.advertisedAddresses.compactMap { address in
            switch (configuration.ipVersion, address.version) {
            case (.ipv4, .ipv6), (.ipv6, .ipv4): nil
            default: address.bytes
            }
        }
        var system = SystemRandomNumberGenerator()
        engine = MDNSEngine(
            configuration: settings, now: MDNSInstant(nanoseconds: scheduler.now), seed: seed ?? system.next())
    }

    /// The kernel's host name, first label only (`alpha` of `alpha.example.org`).
    static func hostLabel() -> String {
        let full = kernelHostName()
        let label = String(full.prefix { $0 != "." })
        return label.isEmpty ? "host" : label
    }

    /// Now on the scheduler's clock (Dispatch's uptime clock for the real one).
    func now() -> MDNSInstant { MDNSInstant(nanoseconds: scheduler.now) }

    /// Opens the sockets (on the queue) and starts claiming the host name.
    func start() {
        queue.async { [self] in openSockets() }
    }

    // MARK: State

    func setState(_ state: DaemonState) {
        let observers = published.withLock { published -> [AsyncStream<DaemonState>.Continuation] in
            guard published.state != state else { return [] }
            published.state = state
            return Array(published.observers.values)
        }
        for observer in observers {
            observer.yield(state)
            if case .stopped = state { observer.finish() }
        }
    }

    // MARK: Sockets and interfaces

    private func openSockets() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !stopped else { return }
        var families: [AddressFamily] = []
        if configuration.ipVersion != .ipv6 { families.append(.v4) }
        if configuration.ipVersion != .ipv4 { families.append(.v6) }
        var lastError: DiscoveryError?
        for family in families where sockets[family] == nil {
            do {
                sockets[family] = try linkLayer.open(family, queue: queue) { [weak self] in self?.readable(family) }
            } catch {
                logger.warning(
                    "embedded mDNS: cannot open a socket",
                    metadata: ["family": "\(family)", "error": "\(error.message)"])
                lastError = error
            }
        }
        guard !sockets.isEmpty else {
            let failure = DiscoveryError(
                .network, "\(lastError?.message ?? "no socket could be opened"); retrying in \(retryDelay)",
                systemErrno: lastError?.systemErrno)
            setState(.failed(failure))
            scheduleRetry()
            return
        }
        retryDelay = .milliseconds(250)
        if interfaceWatch == nil,
            let watch = linkLayer.watchInterfaces(queue: queue, changed: { [weak self] in self?.interfacesChanged() })
        {
            interfaceWatch = watch
        } else if interfaceWatch == nil {
            logger.notice("embedded mDNS: no netlink socket; interfaces are scanned at start only")
        }
        setState(engine.hostIsEstablished ? .running : .registering)
        rescan()
    }

    private func scheduleRetry() {
        retryTimer?.cancel()
        retryTimer = scheduler.schedule(after: retryDelay, on: queue) { [weak self] in
            guard let self else { return }
            self.retryTimer = nil
            self.openSockets()
        }
        retryDelay = min(retryDelay * 2, .seconds(5))
    }

    /// A netlink notification: rescan shortly after (changes come in bursts).
    private func interfacesChanged() {
        wakeups += 1
        interfaceWatch?.drain()
        guard rescanTimer == nil, !stopped else { return }
        rescanTimer = scheduler.schedule(after: .milliseconds(100), on: queue) { [weak self] in
            guard let self else { return }
            self.rescanTimer = nil
            self.rescan()
        }
    }

    /// Reads the interfaces, joins and leaves the group where they changed, tells the engine.
    private func rescan() {
        guard !stopped else { return }
        let interfaces = linkLayer.interfaces()
        localAddresses = Set(interfaces.flatMap { $0.ipv4 + $0.ipv6 })
        let links = InterfaceInfo.links(from: interfaces, configuration: configuration, families: Set(sockets.keys))
        let wanted = Set(links.map(\.id))
        for link in joined.subtracting(wanted) {
            sockets[link.family]?.leave(interface: link.interfaceIndex)
            joined.remove(link)
        }
        var usable: [MDNSLink] = []
        for link in links {
            if !joined.contains(link.id) {
                if let error = sockets[link.id.family]?.join(interface: link.id.interfaceIndex) {
                    logger.warning(
                        "embedded mDNS: cannot join the multicast group",
                        metadata: ["interface": "\(link.name)", "family": "\(link.id.family)", "error": "\(error)"])
                    continue
                }
                joined.insert(link.id)
            }
            usable.append(link)
        }
        logger.debug(
            "embedded mDNS links",
            metadata: ["links": "\(usable.map { "\($0.name)/\($0.id.family)" }.joined(separator: " "))"])
        engine.setLinks(usable, now: now())
        pump()
    }

    private func readable(_ family: AddressFamily) {
        wakeups += 1
        guard let socket = sockets[family] else { return }
        // At most 64 datagrams per wakeup, so a flood cannot starve the queue's other work.
        for _ in 0..<64 {
            let (datagram, wasTruncated, error) = socket.receive()
            if wasTruncated {
                truncated += 1
                continue
            }
            if let error {
                logger.debug("embedded mDNS: receive failed", metadata: ["error": "\(error)"])
                break
            }
            guard let datagram else { break }
            let source = MDNSSource(
                link: LinkID(interfaceIndex: datagram.interfaceIndex, family: family), address: datagram.address,
                port: datagram.port, isLocal: localAddresses.contains(datagram.address))
            if logger.logLevel <= .trace {
                trace("received", datagram.bytes, link: source.link, peer: "\(datagram.address):\(datagram.port)")
            }
            engine.receive(datagram.bytes, from: source, now: now())
        }
        pump()
    }

    // MARK: Engine output

    /// Sends what the engine queued, handles its events, re-arms the timer. Events may call back
    /// into the engine (a finished resolve stops itself): a nested call only asks the outer loop to
    /// go round again.
    func pump() {
        if pumping { return }
        pumping = true
        defer { pumping = false }
        while true {
            let outputs = engine.drainOutput()
            if outputs.isEmpty { break }
            for output in outputs { perform(output) }
        }
        rearmTimer()
    }

    private func perform(_ output: MDNSOutput) {
        switch output {
        case .send(let packet):
            guard let socket = sockets[packet.link.family] else { return }
            if logger.logLevel <= .trace {
                trace("sending", packet.bytes, link: packet.link, peer: "\(packet.destination)")
            }
            if let error = socket.send(packet.bytes, interface: packet.link.interfaceIndex, to: packet.destination) {
                logger.debug(
                    "embedded mDNS: send failed",
                    metadata: ["link": "\(packet.link)", "error": "\(error)", "bytes": "\(packet.bytes.count)"])
            }
        case .event(let event):
            handle(event)
        }
    }

    private func rearmTimer() {
        guard !stopped, let deadline = engine.nextDeadline() else {
            timer?.cancel()
            timer = nil
            timerDeadline = nil
            return
        }
        if timer != nil, timerDeadline == deadline { return }
        if timer == nil {
            timer = scheduler.makeTimer(on: queue) { [weak self] in self?.timerFired() }
        }
        timerDeadline = deadline
        timer?.arm(at: deadline.nanoseconds)
    }

    private func timerFired() {
        wakeups += 1
        timerDeadline = nil
        engine.advance(now: now())
        pump()
    }

    /// A one-line summary of a packet, at trace level.
    private func trace(_ what: String, _ bytes: [UInt8], link: LinkID, peer: String) {
        guard let message = try? DNSMessage(parsing: bytes) else {
            logger.trace("embedded mDNS: \(what) malformed", metadata: ["link": "\(link)", "peer": "\(peer)"])
            return
        }
        logger.trace(
            "embedded mDNS: \(what) \(message.isResponse ? "response" : "query")",
            metadata: [
                "link": "\(link)", "peer": "\(peer)", "q": "\(message.questions)", "an": "\(message.answers)",
                "ns": "\(message.authorities)", "ar": "\(message.additionals.count)",
            ])
    }

    private func handle(_ event: MDNSEvent) {
        if logger.logLevel <= .debug { logger.debug("embedded mDNS event", metadata: ["event": "\(event)"]) }
        switch event {
        case .hostNameEstablished(let name):
            published.withLock { $0.hostName = name }
            logger.debug("embedded mDNS: host name claimed", metadata: ["host": "\(name).local"])
            setState(.running)
        case .hostNameRenamed(let from, let to):
            published.withLock { $0.hostName = to }
            logger.notice("embedded mDNS: host name collision, renamed", metadata: ["from": "\(from)", "to": "\(to)"])
            setState(.registering)
        case .publicationEstablished(let id, let name):
            publications[id]?.handle.record(.established(name: name))
        case .publicationRenamed(let id, let from, let to):
            guard let publication = publications[id] else { return }
            logger.notice(
                "service name collision, renamed",
                metadata: ["from": "\(from)", "to": "\(to)", "type": "\(publication.handle.type)"])
            publication.handle.record(.renamed(from: from, to: to))
        case .browseAdded(let id, let instance, let link, let isLocal):
            browses[id]?.added(instance: instance, link: link, isLocal: isLocal, isOwn: engine.isOwnInstance(instance))
        case .browseRemoved(let id, let instance, let link):
            browses[id]?.removed(instance: instance, link: link)
        case .browseAllForNow(let id):
            browses[id]?.continuation.yield(.allForNow)
        case .resolveChanged(let id):
            guard let resolve = resolves[id] else { return }
            resolve.changed(engine.resolution(id))
        }
    }

    // MARK: Operations (on the queue)

    static func serviceTypeName(_ type: String) -> DNSName? { DNSName("\(type).local") }

    static func checkDomain(_ domain: String?) -> DiscoveryError? {
        guard let domain, !["local", "local."].contains(domain.lowercased()) else { return nil }
        return DiscoveryError(
            .invalidArgument, "the embedded mDNS stack serves the domain 'local' only, not '\(domain)'")
    }

    static func linkFilter(interface: Int32?, ipVersion: IPVersion) -> LinkFilter {
        LinkFilter(interfaceIndex: interface, family: ipVersion == .ipv4 ? .v4 : ipVersion == .ipv6 ? .v6 : nil)
    }

    private func addPublication(_ request: PublishRequest) -> Result<PublishedService, DiscoveryError> {
        guard !stopped else {
            return .failure(DiscoveryError(.shutDown, "discovery was shut down; create a new ServiceDiscovery"))
        }
        if let error = Self.checkDomain(request.domain) { return .failure(error) }
        guard let type = Self.serviceTypeName(request.type) else {
            return .failure(DiscoveryError(.invalidArgument, "service type '\(request.type)' is not a valid DNS name"))
        }
        let name = request.name ?? "\(programName) on \(currentHostName)"
        let service = MDNSService(
            instance: name, type: type, port: request.port, txt: request.txt.entries.map(\.bytes),
            links: Self.linkFilter(interface: request.interface, ipVersion: request.ipVersion))
        let id = engine.publish(service, now: now())
        let handle = PublishedService(
            owner: self, name: engine.publicationName(id) ?? name, type: request.type, port: request.port,
            txt: request.txt)
        let publication = EmbeddedPublication(id: id, handle: handle)
        handle.backendObject = publication
        publications[id] = publication
        pump()
        return .success(handle)
    }

    private func stop() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !stopped else { return }
        // Goodbyes first, while the sockets are open.
        engine.shutdown(now: now())
        pump()
        stopped = true
        for publication in publications.values { publication.handle.continuation.finish() }
        for browse in browses.values { browse.continuation.finish() }
        for resolve in resolves.values { resolve.stop(error: DiscoveryError(.shutDown, "discovery was shut down")) }
        publications.removeAll()
        browses.removeAll()
        resolves.removeAll()
        for (_, socket) in sockets { socket.close() }
        sockets.removeAll()
        interfaceWatch?.close()
        interfaceWatch = nil
        timer?.cancel()
        for pending in [rescanTimer, retryTimer] { pending?.cancel() }
        timer = nil
        rescanTimer = nil
        retryTimer = nil
        joined.removeAll()
        setState(.stopped)
    }

    /// Counters for tests: wakeups, live Dispatch sources, and the engine's counters.
    var diagnostics: EmbeddedDiagnostics {
        EmbeddedDiagnostics(
            wakeups: wakeups,
            liveSources: sockets.count + (interfaceWatch == nil ? 0 : 1) + (timer == nil ? 0 : 1)
                + (rescanTimer == nil ? 0 : 1) + (retryTimer == nil ? 0 : 1),
            engine: engine.counters, cacheCount: engine.cache.count, cacheEvictions: engine.cache.evictions,
            truncated: truncated, links: engine.links.keys.sorted(), hostName: engine.hostName,
            nextDeadline: engine.nextDeadline().map { $0.milliseconds(since: now()) })
    }

    fileprivate func removeBrowse(_ id: Int) {
        guard let browse = browses.removeValue(forKey: id) else { return }
        engine.stopBrowse(id)
        browse.continuation.finish()
        pump()
    }

    fileprivate func finishResolve(_ id: Int) {
        guard resolves.removeValue(forKey: id) != nil else { return }
        engine.stopResolve(id)
        pump()
    }

    fileprivate func addResolve(_ request: ResolveRequest, mode: EmbeddedResolve.Mode) -> Int? {
        guard !stopped else {
            if case .once(_, let completion) = mode {
                completion(
                    .failure(DiscoveryError(.shutDown, "discovery was shut down; create a new ServiceDiscovery")))
            } else if case .watch(let continuation) = mode {
                continuation.finish()
            }
            return nil
        }
        guard Self.checkDomain(request.identity.domain) == nil, let type = Self.serviceTypeName(request.identity.type),
            let instance = DNSName(instance: request.identity.name, service: type)
        else {
            if case .once(_, let completion) = mode {
                completion(
                    .failure(
                        DiscoveryError(
                            .invalidArgument, "cannot resolve \(request.identity) with the embedded mDNS stack")))
            } else if case .watch(let continuation) = mode {
                continuation.finish()
            }
            return nil
        }
        let id = engine.startResolve(
            instance: instance, links: LinkFilter(interfaceIndex: request.interface), now: now())
        let resolve = EmbeddedResolve(
            backend: self, id: id, identity: request.identity, ipVersion: request.ipVersion, mode: mode)
        resolves[id] = resolve
        resolve.armTimeout()
        pump()  // the first resolveChanged, answered from the cache when possible
        return id
    }
}

/// Counters of the embedded backend, for tests and diagnostics.
struct EmbeddedDiagnostics: Sendable {
    var wakeups: Int
    var liveSources: Int
    var engine: MDNSCounters
    var cacheCount: Int
    var cacheEvictions: Int
    var truncated: Int
    var links: [LinkID]
    var hostName: String
    /// Milliseconds until the engine next needs to run (nil: nothing scheduled).
    var nextDeadline: Int64?
}

// MARK: - DiscoveryBackend

extension EmbeddedBackend: DiscoveryBackend, PublicationOwner {
    var kind: DiscoveryBackendKind { .embedded }
    var currentState: DaemonState { published.withLock { $0.state } }
    var currentHostName: String { published.withLock { $0.hostName } }

    func perform<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: body()) }
        }
    }

    func stateUpdates() -> AsyncStream<DaemonState> {
        let (stream, continuation) = AsyncStream.makeStream(of: DaemonState.self)
        let id = published.withLock { published -> Int in
            published.nextObserver += 1
            published.observers[published.nextObserver] = continuation
            continuation.yield(published.state)
            if case .stopped = published.state { continuation.finish() }
            return published.nextObserver
        }
        continuation.onTermination = { [self] _ in
            _ = published.withLock { $0.observers.removeValue(forKey: id) }
        }
        return stream
    }

    func publish(_ request: PublishRequest) async -> Result<PublishedService, DiscoveryError> {
        await perform { [self] in addPublication(request) }
    }

    func startBrowse(_ request: BrowseRequest, continuation: AsyncStream<BrowseEvent>.Continuation)
        -> @Sendable () -> Void
    {
        let box = Locked<Int?>(nil)
        queue.async { [self] in
            guard !stopped else {
                continuation.finish()
                return
            }
            if let error = Self.checkDomain(request.domain) {
                continuation.yield(.failed(error))
                return
            }
            guard let type = Self.serviceTypeName(request.type) else {
                continuation.yield(
                    .failed(DiscoveryError(.invalidArgument, "service type '\(request.type)' is not a valid DNS name")))
                return
            }
            let id = engine.startBrowse(
                type: type, links: Self.linkFilter(interface: request.interface, ipVersion: request.ipVersion),
                now: now())
            browses[id] = EmbeddedBrowse(type: request.type, continuation: continuation)
            box.withLock { $0 = id }
            pump()
        }
        return { [self] in
            queue.async {
                if let id = box.withLock({ $0 }) { self.removeBrowse(id) }
            }
        }
    }

    /// One-shot and watching resolves running (for tests).
    func resolvesRunning() async -> Int { await perform { [self] in resolves.count } }

    /// Ends at once when the task is cancelled (`.shutDown`, "resolve of … was cancelled").
    func resolve(_ request: ResolveRequest, timeout: Duration) async -> Result<ResolvedService, DiscoveryError> {
        let cancellation = QueueCancellation(queue: queue)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                queue.async { [self] in
                    guard
                        let id = addResolve(
                            request, mode: .once(timeout: timeout, completion: { continuation.resume(returning: $0) }))
                    else { return }
                    cancellation.started { [self] in resolves[id]?.stop(error: nil) }
                }
            }
        } onCancel: {
            cancellation.cancel()
        }
    }

    /// A one-shot resolve registered by a block queued now (a later `perform` finds it started),
    /// answered through `completion` on the queue: what `resolve(_:timeout:)` does, without a task.
    func startResolve(
        _ request: ResolveRequest, timeout: Duration, completion: @escaping @Sendable (Result<ResolvedService, DiscoveryError>) -> Void
    ) {
        queue.async { [self] in _ = addResolve(request, mode: .once(timeout: timeout, completion: completion)) }
    }

    func startWatch(_ request: ResolveRequest, continuation: AsyncStream<ResolvedService>.Continuation)
        -> @Sendable () -> Void
    {
        let box = Locked<Int?>(nil)
        queue.async { [self] in
            let id = addResolve(request, mode: .watch(continuation))
            box.withLock { $0 = id }
        }
        return { [self] in
            queue.async {
                guard let id = box.withLock({ $0 }), let resolve = self.resolves[id] else { return }
                resolve.stop(error: nil)
            }
        }
    }

    func shutdown() async {
        await perform { [self] in stop() }
    }

    func beginShutdown() {
        queue.async { [self] in stop() }
    }

    func updateTXT(_ txt: TXTRecord, of service: PublishedService) -> Result<Void, DiscoveryError> {
        guard let publication = service.backendObject as? EmbeddedPublication, publications[publication.id] != nil
        else {
            return .failure(DiscoveryError(.notPublished, "service '\(service.name)' is no longer published"))
        }
        engine.updateTXT(publication.id, txt: txt.entries.map(\.bytes), now: now())
        service.txtChanged(txt)
        pump()
        return .success(())
    }

    func unpublish(_ service: PublishedService) {
        guard let publication = service.backendObject as? EmbeddedPublication,
            publications.removeValue(forKey: publication.id) != nil
        else { return }
        engine.unpublish(publication.id, now: now())
        service.continuation.finish()
        pump()
    }

    func notEstablishedMessage(_ service: PublishedService, timeout: Duration) -> String {
        let links = engine.links.count
        return "service '\(service.name)' was not established within \(timeout) by the embedded mDNS stack "
            + "(state: \(currentState), \(links) link\(links == 1 ? "" : "s") in use)"
            + (links == 0 ? "; no usable multicast interface (check the interface policy and `ip link`)" : "")
    }

    // Test hooks.
    func readDiagnostics() async -> EmbeddedDiagnostics {
        await perform { [self] in diagnostics }
    }

    fileprivate func resolveFinished(_ id: Int) {
        finishResolve(id)
    }
}

// MARK: - Sessions

/// The embedded side of a publication. Confined to the backend's queue.
final class EmbeddedPublication: @unchecked Sendable {  // immutable
    let id: Int
    let handle: PublishedService

    init(id: Int, handle: PublishedService) {
        self.id = id
        self.handle = handle
    }
}

/// One browse: the de-duplicated view of the engine's per-link sightings. Confined to the backend's queue.
final class EmbeddedBrowse: @unchecked Sendable {  // confined to the backend's queue
    let type: String
    let continuation: AsyncStream<BrowseEvent>.Continuation
    private struct Entry {
        var sightings: Set<DiscoveredService.Sighting>
        var reported: DiscoveredService
    }
    private var entries: [ServiceIdentity: Entry] = [:]

    init(type: String, continuation: AsyncStream<BrowseEvent>.Continuation) {
        self.type = type
        self.continuation = continuation
    }

    static func sighting(_ link: LinkID) -> DiscoveredService.Sighting {
        DiscoveredService.Sighting(interfaceIndex: link.interfaceIndex, ipVersion: link.family == .v4 ? .ipv4 : .ipv6)
    }

    func added(instance: DNSName, link: LinkID, isLocal: Bool, isOwn: Bool) {
        let identity = ServiceIdentity(name: instance.firstLabelText, type: type, domain: "local")
        let sighting = Self.sighting(link)
        if var entry = entries[identity] {
            entry.sightings.insert(sighting)
            entries[identity] = entry
            return
        }
        let service = DiscoveredService(identity: identity, seenOn: [sighting], isLocal: isLocal || isOwn, isOwn: isOwn)
        entries[identity] = Entry(sightings: [sighting], reported: service)
        continuation.yield(.added(service))
    }

    func removed(instance: DNSName, link: LinkID) {
        let identity = ServiceIdentity(name: instance.firstLabelText, type: type, domain: "local")
        guard var entry = entries[identity] else { return }
        entry.sightings.remove(Self.sighting(link))
        if entry.sightings.isEmpty {
            entries.removeValue(forKey: identity)
            continuation.yield(.removed(entry.reported))
        } else {
            entries[identity] = entry
        }
    }
}

/// One resolve (one-shot or watching) over the engine's cache. Confined to the backend's queue.
final class EmbeddedResolve: @unchecked Sendable {  // confined to the backend's queue
    enum Mode {
        case once(timeout: Duration, completion: @Sendable (Result<ResolvedService, DiscoveryError>) -> Void)
        case watch(AsyncStream<ResolvedService>.Continuation)
    }

    unowned let backend: EmbeddedBackend
    let id: Int
    let identity: ServiceIdentity
    let ipVersion: IPVersion
    let mode: Mode
    private var latest: ResolvedService?
    private var complete = false
    private var graceTimer: ScheduledWork?
    private var timeoutTimer: ScheduledWork?
    private var lastYielded: ResolvedService?
    private var done = false

    init(backend: EmbeddedBackend, id: Int, identity: ServiceIdentity, ipVersion: IPVersion, mode: Mode) {
        self.backend = backend
        self.id = id
        self.identity = identity
        self.ipVersion = ipVersion
        self.mode = mode
    }

    func armTimeout() {
        guard case .once(let timeout, _) = mode else { return }
        timeoutTimer = backend.scheduler.schedule(after: timeout, on: backend.queue) { [weak self] in
            guard let self else { return }
            if let latest = self.latest {
                self.finish(.success(latest))
            } else {
                self.finish(
                    .failure(
                        DiscoveryError(
                            .timedOut,
                            "no answer from \(self.identity) within \(timeout); is it still published, and is its host reachable?"
                        )))
            }
        }
    }

    /// New data from the engine's cache.
    func changed(_ resolution: MDNSResolution?) {
        guard !done, let resolution else { return }
        var addresses: [ServiceAddress] = []
        for address in resolution.addresses {
            let ip: IPAddress =
                address.bytes.count == 4
                ? .v4(address.bytes[0], address.bytes[1], address.bytes[2], address.bytes[3]) : .v6(address.bytes)
            guard ipVersion == .any || ip.version == ipVersion else { continue }
            let entry = ServiceAddress(ip: ip, interfaceIndex: address.link.interfaceIndex, port: resolution.port)
            if !addresses.contains(entry) { addresses.append(entry) }
        }
        // Like the Avahi backend: IPv6 first, link-local last within a family, then in order found.
        addresses = addresses.enumerated().sorted { lhs, rhs in
            let l = (lhs.element.ip.version == .ipv6 ? 0 : 1, lhs.element.ip.isLinkLocal ? 1 : 0, lhs.offset)
            let r = (rhs.element.ip.version == .ipv6 ? 0 : 1, rhs.element.ip.isLinkLocal ? 1 : 0, rhs.offset)
            return l < r
        }.map(\.element)
        guard !addresses.isEmpty else { return }
        let service = ResolvedService(
            identity: identity, hostName: resolution.target.description, port: resolution.port,
            txt: TXTRecord(wireEntries: resolution.txt ?? []), addresses: addresses, isLocal: resolution.isLocal)
        latest = service
        let versions = Set(addresses.map(\.ip.version))
        let families =
            ipVersion == .any ? versions.contains(.ipv4) && versions.contains(.ipv6) : versions.contains(ipVersion)
        complete = resolution.txt != nil && families
        switch mode {
        case .once:
            if complete {
                finish(.success(service))
            } else if graceTimer == nil {
                // Wait a quarter second for the TXT record or the other address family.
                graceTimer = backend.scheduler.schedule(after: .milliseconds(250), on: backend.queue) { [weak self] in
                    guard let self, let latest = self.latest else { return }
                    self.finish(.success(latest))
                }
            }
        case .watch(let continuation):
            if service != lastYielded {
                lastYielded = service
                continuation.yield(service)
            }
        }
    }

    private func finish(_ result: Result<ResolvedService, DiscoveryError>) {
        guard !done, case .once(_, let completion) = mode else { return }
        done = true
        cancelTimers()
        completion(result)
        backend.resolveFinished(id)
    }

    private func cancelTimers() {
        graceTimer?.cancel()
        graceTimer = nil
        timeoutTimer?.cancel()
        timeoutTimer = nil
    }

    /// Cancelled (watch ended) or shut down.
    func stop(error: DiscoveryError?) {
        guard !done else { return }
        done = true
        cancelTimers()
        switch mode {
        case .once(_, let completion):
            completion(.failure(error ?? DiscoveryError(.shutDown, "resolve of \(identity) was cancelled")))
        case .watch(let continuation):
            continuation.finish()
        }
        backend.resolveFinished(id)
    }
}
