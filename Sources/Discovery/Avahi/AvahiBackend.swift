import Locks
import CAvahiClient
import Dispatch
import Logging
import Scheduling
#if canImport(Glibc)
import Glibc
#endif

// MARK: - Core

/// State visible outside the queue, under a lock.
struct PublishedState {
    var state: DaemonState = .connecting
    var hostName: String
    var observers: [Int: AsyncStream<DaemonState>.Continuation] = [:]
    var nextObserver = 0
}

/// Everything that talks to libavahi-client. Every mutable field is confined to `queue`
/// (Avahi does no locking); `published` is a lock for the few values read from outside.
final class AvahiBackend: @unchecked Sendable {
    let queue = DispatchQueue(label: "discovery.avahi")
    let logger: Logger
    let programName: String
    let configuration: DiscoveryConfiguration
    let poll: DispatchPoll
    let published: Locked<PublishedState>
    /// The clock of the backend's timers: the connection retry's back-off, a publication's probe
    /// watchdog, a resolve's timeout and grace, the automatic choice's wait for the daemon.
    let scheduler: any Scheduler
    /// Told every state change (queue-confined); the automatic backend choice listens here.
    var stateHook: ((DaemonState) -> Void)?
    /// The automatic choice is probing whether a daemon answers: a failure to reach it is the
    /// choice's to say ("discovery backend: embedded mDNS"), not a warning that it retries — it
    /// does not, the embedded stack takes over (issue 45, 7).
    var probing = false

    // queue-confined
    private(set) var client: OpaquePointer?
    private var retryTimer: ScheduledWork?
    private var retryDelay: Duration = .milliseconds(250)
    /// How long a publication may probe before it is registered again (see `Publication`).
    var probeStallTimeout: Duration = .seconds(5)
    private var stopped = false
    private var publications: [ObjectIdentifier: Publication] = [:]
    private var browses: [ObjectIdentifier: BrowseSession] = [:]
    private var resolves: [ObjectIdentifier: ResolveSession] = [:]
    /// The entry group of the advertised-address host name (see `advertisedHost()`).
    var natGroup: OpaquePointer?
    /// Sightings of every service seen by any browse, for resolves.
    var sightings: [ServiceIdentity: Set<DiscoveredService.Sighting>] = [:]

    init(
        logger: Logger, programName: String, configuration: DiscoveryConfiguration = DiscoveryConfiguration(),
        scheduler: any Scheduler = DispatchScheduler()
    ) {
        self.logger = logger
        self.programName = programName
        self.configuration = configuration
        self.scheduler = scheduler
        self.poll = DispatchPoll(queue: queue)
        self.published = Locked(PublishedState(hostName: kernelHostName()))
    }

    /// Runs `body` on the Avahi queue and returns its result.
    func perform<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: body()) }
        }
    }

    var isRunning: Bool {
        guard let client else { return false }
        return avahi_client_get_state(client) == AVAHI_CLIENT_S_RUNNING
    }

    var hostName: String { published.withLock { $0.hostName } }

    func setState(_ state: DaemonState) {
        // Yield outside the lock: finishing a stream runs its onTermination, which takes the lock.
        let observers = published.withLock { published -> [AsyncStream<DaemonState>.Continuation] in
            guard published.state != state else { return [] }
            published.state = state
            return Array(published.observers.values)
        }
        for observer in observers {
            observer.yield(state)
            if case .stopped = state { observer.finish() }
        }
        stateHook?(state)
    }

    // MARK: Client lifecycle

    func connect() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !stopped, client == nil else { return }
        var error: Int32 = 0
        let userdata = Unmanaged.passUnretained(self).toOpaque()
        let created = avahi_client_new(poll.api, AVAHI_CLIENT_NO_FAIL, clientCallback, userdata, &error)
        guard let created else {
            let failure = DiscoveryError(
                .daemonUnavailable,
                "cannot reach the Avahi daemon: \(avahiMessage(error)); is the system D-Bus running? retrying in \(retryDelay)",
                avahiErrorCode: error)
            if probing {
                logger.debug("avahi client creation failed", metadata: ["error": "\(failure.message)"])
            } else {
                logger.warning("avahi client creation failed", metadata: ["error": "\(failure.message)"])
            }
            setState(.failed(failure))
            scheduleRetry()
            return
        }
        client = created
    }

    private func scheduleRetry() {
        retryTimer?.cancel()
        let delay = retryDelay
        retryDelay = min(retryDelay * 2, .seconds(5))
        retryTimer = scheduler.schedule(after: delay, on: queue) { [weak self] in
            guard let self else { return }
            self.retryTimer = nil
            self.connect()
        }
    }

    func clientStateChanged(_ client: OpaquePointer, _ state: AvahiClientState) {
        self.client = client
        switch state {
        case AVAHI_CLIENT_S_RUNNING:
            retryDelay = .milliseconds(250)
            if let name = avahi_client_get_host_name(client) {
                let hostName = String(cString: name)
                published.withLock { $0.hostName = hostName }
            }
            logger.debug("avahi daemon running", metadata: ["host": "\(hostName)"])
            setState(.running)
            for publication in publications.values { publication.register() }
            for browse in browses.values { browse.start() }
            for resolve in resolves.values { resolve.start() }
        case AVAHI_CLIENT_CONNECTING:
            logger.info("waiting for the avahi daemon")
            setState(.connecting)
        case AVAHI_CLIENT_S_REGISTERING, AVAHI_CLIENT_S_COLLISION:
            // The daemon's host name is (re)registering: our records are withdrawn; re-add on RUNNING.
            for publication in publications.values { publication.reset() }
            if let natGroup {
                avahi_entry_group_free(natGroup)
                self.natGroup = nil
            }
            setState(.registering)
        case AVAHI_CLIENT_FAILURE:
            let error = avahi_client_errno(client)
            let failure = DiscoveryError(
                .daemonUnavailable, "lost the Avahi daemon: \(avahiMessage(error)); reconnecting", avahiErrorCode: error)
            logger.warning("avahi client failed", metadata: ["error": "\(avahiMessage(error))"])
            setState(.failed(failure))
            // Everything owned by this client dies with it.
            for publication in publications.values { publication.clientLost() }
            natGroup = nil  // died with the client
            for browse in browses.values { browse.clientLost() }
            for resolve in resolves.values { resolve.clientLost() }
            sightings.removeAll()
            // Not from inside the client's own callback: free it, then reconnect.
            let dead = UInt(bitPattern: client)
            queue.async { [self] in
                if let current = self.client, UInt(bitPattern: current) == dead {
                    avahi_client_free(current)
                    self.client = nil
                }
                if error == AVAHI_ERR_DISCONNECTED {
                    self.connect()
                } else {
                    self.scheduleRetry()
                }
            }
        default:
            break
        }
    }

    func shutdown() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !stopped else { return }
        stopped = true
        retryTimer?.cancel()
        retryTimer = nil
        for publication in publications.values { publication.stop(reason: nil) }
        for browse in browses.values { browse.stop() }
        for resolve in resolves.values { resolve.stop(error: DiscoveryError(.shutDown, "discovery was shut down")) }
        publications.removeAll()
        browses.removeAll()
        resolves.removeAll()
        if let natGroup {
            avahi_entry_group_free(natGroup)
            self.natGroup = nil
        }
        if let client {
            avahi_client_free(client)
            self.client = nil
        }
        setState(.stopped)
    }

    // MARK: Registries

    func addPublication(
        name: String?, type: String, domain: String?, port: UInt16, txt: TXTRecord, interface: Int32?,
        ipVersion: IPVersion
    ) -> Result<PublishedService, DiscoveryError> {
        guard !stopped else { return .failure(DiscoveryError(.shutDown, "discovery was shut down; create a new ServiceDiscovery")) }
        let chosen = name ?? "\(programName) on \(hostName)"
        let publication = Publication(
            core: self, name: chosen, type: type, domain: domain, port: port, txt: txt, interface: interface,
            ipVersion: ipVersion)
        publications[ObjectIdentifier(publication)] = publication
        if isRunning { publication.register() }
        return .success(publication.handle)
    }

    func removePublication(_ publication: Publication) {
        publications.removeValue(forKey: ObjectIdentifier(publication))
    }

    func addBrowse(_ session: BrowseSession) {
        guard !stopped else { session.stop(); return }
        browses[ObjectIdentifier(session)] = session
        if isRunning { session.start() }
    }

    func removeBrowse(_ session: BrowseSession) {
        guard browses.removeValue(forKey: ObjectIdentifier(session)) != nil else { return }
        session.stop()
    }

    func addResolve(_ session: ResolveSession) {
        guard !stopped else {
            session.stop(error: DiscoveryError(.shutDown, "discovery was shut down; create a new ServiceDiscovery"))
            return
        }
        resolves[ObjectIdentifier(session)] = session
        session.armTimeout()
        if isRunning { session.start() }
    }

    func removeResolve(_ session: ResolveSession) {
        guard resolves.removeValue(forKey: ObjectIdentifier(session)) != nil else { return }
        session.stop(error: nil)
    }

    /// Sightings of the service seen so far by any browse.
    func knownSightings(_ identity: ServiceIdentity) -> Set<DiscoveredService.Sighting> {
        sightings[identity] ?? []
    }
}

private func clientCallback(_ client: OpaquePointer?, _ state: AvahiClientState, _ userdata: UnsafeMutableRawPointer?) {
    guard let client, let userdata else { return }
    Unmanaged<AvahiBackend>.fromOpaque(userdata).takeUnretainedValue().clientStateChanged(client, state)
}

// MARK: - Helpers shared by the sessions

func avahiMessage(_ error: Int32) -> String {
    guard let text = avahi_strerror(error) else { return "error \(error)" }
    return "\(String(cString: text)) (\(error))"
}

let ifUnspec = Int32(AVAHI_IF_UNSPEC)
let protoUnspec = Int32(AVAHI_PROTO_UNSPEC)
let protoInet = Int32(AVAHI_PROTO_INET)
let protoInet6 = Int32(AVAHI_PROTO_INET6)

extension IPVersion {
    var avahiProtocol: Int32 {
        switch self {
        case .any: protoUnspec
        case .ipv4: protoInet
        case .ipv6: protoInet6
        }
    }

    init(avahiProtocol: Int32) {
        self = avahiProtocol == protoInet ? .ipv4 : avahiProtocol == protoInet6 ? .ipv6 : .any
    }
}

extension Duration {
    var dispatchInterval: DispatchTimeInterval {
        .nanoseconds(Int(components.seconds) * 1_000_000_000 + Int(components.attoseconds / 1_000_000_000))
    }
}

// MARK: - Interface policy and advertised addresses

extension AvahiBackend {
    /// `[ifUnspec]` when every interface may be used; else the permitted interfaces' indexes now
    /// (interfaces that appear later are not added to an existing publication).
    func permittedInterfaces() -> [Int32] {
        guard configuration.interfaces.isRestrictive else { return [ifUnspec] }
        var indexes: [Int32] = []
        guard let list = if_nameindex() else { return [] }
        defer { if_freenameindex(list) }
        var entry = list
        while entry.pointee.if_index != 0 {
            if let name = entry.pointee.if_name, configuration.interfaces.permits(String(cString: name)) {
                indexes.append(Int32(entry.pointee.if_index))
            }
            entry += 1
        }
        return indexes.sorted()
    }

    /// Whether a result on this interface (an index of the daemon's network namespace) is kept.
    func permits(interface: Int32) -> Bool {
        guard configuration.interfaces.isRestrictive else { return true }
        guard let name = interfaceName(ofIndex: interface) else { return false }
        return configuration.interfaces.permits(name)
    }

    /// With advertised addresses: the host name services point at (`<host>-nat.local`), published
    /// once per core in its own entry group with those addresses (no reverse records). nil without.
    func advertisedHost() -> String? {
        guard !configuration.advertisedAddresses.isEmpty, let client else { return nil }
        let host = "\(hostName)-nat.local"
        if natGroup == nil {
            guard let group = avahi_entry_group_new(client, natGroupCallback, nil) else { return host }
            for address in configuration.advertisedAddresses {
                if configuration.ipVersion == .ipv4 && address.version == .ipv6 { continue }
                if configuration.ipVersion == .ipv6 && address.version == .ipv4 { continue }
                var parsed = AvahiAddress()
                guard avahi_address_parse(address.description, protoUnspec, &parsed) != nil else { continue }
                for interface in permittedInterfaces() {
                    let result = avahi_entry_group_add_address(
                        group, interface, protoUnspec, AVAHI_PUBLISH_NO_REVERSE, host, &parsed)
                    if result < 0 {
                        logger.error(
                            "cannot publish the advertised address",
                            metadata: ["host": "\(host)", "address": "\(address)", "error": "\(avahiMessage(result))"])
                    }
                }
            }
            avahi_entry_group_commit(group)
            natGroup = group
        }
        return host
    }
}

private func natGroupCallback(_ group: OpaquePointer?, _ state: AvahiEntryGroupState, _ userdata: UnsafeMutableRawPointer?) {}

// MARK: - The Avahi backend

extension AvahiBackend: DiscoveryBackend, PublicationOwner {
    var kind: DiscoveryBackendKind { .avahi }
    var currentState: DaemonState { published.withLock { $0.state } }
    var currentHostName: String { published.withLock { $0.hostName } }

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
        await perform { [self] in
            addPublication(
                name: request.name, type: request.type, domain: request.domain, port: request.port, txt: request.txt,
                interface: request.interface, ipVersion: request.ipVersion)
        }
    }

    func startBrowse(_ request: BrowseRequest, continuation: AsyncStream<BrowseEvent>.Continuation) -> @Sendable () -> Void {
        let session = BrowseSession(
            core: self, type: request.type, domain: request.domain, interface: request.interface,
            ipVersion: request.ipVersion, continuation: continuation)
        queue.async { [self] in addBrowse(session) }
        return { [self] in queue.async { self.removeBrowse(session) } }
    }

    /// One-shot and watching resolves running (for tests).
    func resolvesRunning() async -> Int { await perform { [self] in resolves.count } }

    /// Ends at once when the task is cancelled (`.shutDown`, "resolve of … was cancelled").
    func resolve(_ request: ResolveRequest, timeout: Duration) async -> Result<ResolvedService, DiscoveryError> {
        let cancellation = QueueCancellation(queue: queue)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                queue.async { [self] in
                    let session = ResolveSession(
                        core: self, identity: request.identity, sightings: request.sightings, interface: request.interface,
                        ipVersion: request.ipVersion,
                        mode: .once(timeout: timeout, completion: { continuation.resume(returning: $0) }))
                    addResolve(session)
                    cancellation.started { [self] in removeResolve(session) }
                }
            }
        } onCancel: {
            cancellation.cancel()
        }
    }

    func startWatch(_ request: ResolveRequest, continuation: AsyncStream<ResolvedService>.Continuation) -> @Sendable () -> Void {
        let session = ResolveSession(
            core: self, identity: request.identity, sightings: [], interface: request.interface,
            ipVersion: request.ipVersion, mode: .watch(continuation))
        queue.async { [self] in addResolve(session) }
        return { [self] in queue.async { self.removeResolve(session) } }
    }

    func shutdown() async {
        await perform { [self] in shutdown() }
    }

    func beginShutdown() {
        queue.async { [self] in shutdown() }
    }

    // PublicationOwner

    func updateTXT(_ txt: TXTRecord, of service: PublishedService) -> Result<Void, DiscoveryError> {
        guard let publication = service.backendObject as? Publication else {
            return .failure(DiscoveryError(.notPublished, "service '\(service.name)' is no longer published"))
        }
        return publication.updateTXT(txt)
    }

    func unpublish(_ service: PublishedService) {
        guard let publication = service.backendObject as? Publication else { return }
        publication.stop(reason: nil)
        removePublication(publication)
    }

    func notEstablishedMessage(_ service: PublishedService, timeout: Duration) -> String {
        let daemon = published.withLock { $0.state }
        let registered = (service.backendObject as? Publication).map { $0.group != nil } ?? false
        return "service '\(service.name)' was not established within \(timeout) (daemon connection: \(daemon), "
            + "\(registered ? "registered, still probing" : "not yet registered")); is the Avahi daemon running?"
    }
}

// MARK: - The automatic choice

/// `.automatic`: an Avahi client is started; when it reaches RUNNING or REGISTERING within the
/// configured time, Avahi is the backend. When the system bus is unreachable (the client fails at
/// once) or the daemon does not answer in time, the client is freed and the embedded stack starts.
/// Decided once: a daemon that appears later is not switched to (create a new ServiceDiscovery),
/// and a daemon that goes away later is waited for, as with `.avahi`.
/// Confined to the Avahi core's queue.
final class AutomaticChoice: @unchecked Sendable {  // every field is touched on core.queue only
    let core: AvahiBackend
    let selector: BackendSelector
    let started = DispatchTime.now()
    var timer: ScheduledWork?
    var decided = false

    private init(core: AvahiBackend, selector: BackendSelector) {
        self.core = core
        self.selector = selector
    }

    static func start(logger: Logger, programName: String, configuration: DiscoveryConfiguration, selector: BackendSelector) {
        let core = AvahiBackend(logger: logger, programName: programName, configuration: configuration)
        let choice = AutomaticChoice(core: core, selector: selector)
        core.queue.async {
            core.stateHook = { [choice] state in choice.observe(state) }
            core.probing = true
            choice.timer = core.scheduler.schedule(after: configuration.avahiTimeout, on: core.queue) { [choice] in
                choice.chooseEmbedded(because: "no avahi-daemon answered within \(configuration.avahiTimeout)")
            }
            core.connect()
        }
    }

    private func observe(_ state: DaemonState) {
        guard !decided else { return }
        switch state {
        case .running, .registering:
            finish()
            core.probing = false  // chosen: from now on a lost daemon is a warning again
            let waited = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e6
            core.logger.info(
                "discovery backend: avahi (daemon reachable)", metadata: ["after_ms": "\(Int(waited))"])
            selector.decide(core, reason: "avahi-daemon reachable")
        case .failed:
            chooseEmbedded(because: "avahi-daemon unreachable (no system D-Bus)")
        default:
            break
        }
    }

    private func chooseEmbedded(because reason: String) {
        guard !decided else { return }
        finish()
        let core = self.core
        core.logger.notice("discovery backend: embedded mDNS", metadata: ["reason": "\(reason)"])
        // Not from inside an Avahi callback: free the client afterwards.
        core.queue.async { core.shutdown() }
        let embedded = EmbeddedBackend(logger: core.logger, programName: core.programName, configuration: core.configuration)
        embedded.start()
        selector.decide(embedded, reason: reason)
    }

    private func finish() {
        decided = true
        timer?.cancel()
        timer = nil
        core.stateHook = nil
    }
}
