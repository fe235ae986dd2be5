import Locks
import CAvahiClient
import Dispatch
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// DNS-SD service discovery through the Avahi daemon: publish, browse and resolve services.
///
/// One `ServiceDiscovery` holds one connection (an Avahi client) to the daemon over the system
/// D-Bus, driven by Dispatch on one serial queue reserved for Avahi — no helper thread, no polling.
/// It survives what real systems do: when the daemon dies it reconnects (`AVAHI_CLIENT_NO_FAIL`),
/// re-publishes every service under the same name (unless that name now collides) and restarts every
/// browse and resolve; when the system bus itself is gone it retries on a back-off timer.
///
/// ```swift
/// let discovery = ServiceDiscovery(logger: logger)
/// let service = try await discovery.publish(name: "Lobby", type: "_chat._tcp", port: 4242, txt: ["v": "1"])
/// for await event in try discovery.browse(type: "_chat._tcp") { print(event) }
/// ```
public final class ServiceDiscovery: Sendable {
    let core: DiscoveryCore

    /// Creates the discovery object and starts connecting to the Avahi daemon.
    /// - Parameters:
    ///   - logger: Where discovery logs (daemon state changes, collisions, failures).
    ///   - programName: Used in default service names (`"<program> on <host>"`); defaults to the
    ///     executable's name.
    public init(logger: Logger, programName: String? = nil) {
        let program = programName ?? CommandLine.arguments.first.map { String($0.split(separator: "/").last ?? "") } ?? "app"
        core = DiscoveryCore(logger: logger, programName: program.isEmpty ? "app" : program)
        core.queue.async { [core] in core.connect() }
    }

    deinit {
        core.queue.async { [core] in core.shutdown() }
    }

    /// The daemon connection's current state.
    public var daemonState: DaemonState { core.published.withLock { $0.state } }

    /// The Avahi host name (e.g. `alpha`), once the daemon has been reached; else the kernel's host name.
    public var hostName: String { core.published.withLock { $0.hostName } }

    /// The daemon connection's states: the current one first, then every change, until shutdown.
    public func daemonStates() -> AsyncStream<DaemonState> {
        let (stream, continuation) = AsyncStream.makeStream(of: DaemonState.self)
        let id = core.published.withLock { published -> Int in
            published.nextObserver += 1
            published.observers[published.nextObserver] = continuation
            continuation.yield(published.state)
            if case .stopped = published.state { continuation.finish() }
            return published.nextObserver
        }
        continuation.onTermination = { [core] _ in
            _ = core.published.withLock { $0.observers.removeValue(forKey: id) }
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
        let interfaceIndex = try interface.resolvedIndex()
        let core = self.core
        let result: Result<PublishedService, DiscoveryError> = await core.perform {
            core.addPublication(
                name: name, type: type, domain: domain, port: port, txt: txt,
                interface: interfaceIndex, ipVersion: ipVersion)
        }
        return try result.get()
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
        let interfaceIndex = try interface.resolvedIndex()
        let (stream, continuation) = AsyncStream.makeStream(of: BrowseEvent.self)
        let session = BrowseSession(
            core: core, type: type, domain: domain, interface: interfaceIndex, ipVersion: ipVersion,
            continuation: continuation)
        continuation.onTermination = { [core] _ in core.queue.async { core.removeBrowse(session) } }
        core.queue.async { [core] in core.addBrowse(session) }
        return ServiceBrowser(stream: stream)
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
                    case .allForNow: allForNow = true
                    case .failed: break
                    }
                    if done(sorted(), allForNow) { return }
                }
            }
            group.addTask { try? await Task.sleep(for: timeout) }
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
    /// - Throws: ``DiscoveryError`` with code `.timedOut` when nothing answers within `timeout`.
    public func resolve(
        _ service: DiscoveredService, ipVersion: IPVersion = .any, timeout: Duration = .seconds(5)
    ) async throws(DiscoveryError) -> ResolvedService {
        try await resolve(
            service.identity, sightings: Array(service.seenOn), interface: nil, ipVersion: ipVersion, timeout: timeout)
    }

    /// Resolves a service known by name (no browse needed).
    /// - Throws: ``DiscoveryError`` with code `.timedOut` when nothing answers within `timeout`.
    public func resolve(
        _ identity: ServiceIdentity, interface: InterfaceSelection = .any, ipVersion: IPVersion = .any,
        timeout: Duration = .seconds(5)
    ) async throws(DiscoveryError) -> ResolvedService {
        try await resolve(identity, sightings: [], interface: try interface.resolvedIndex(), ipVersion: ipVersion, timeout: timeout)
    }

    private func resolve(
        _ identity: ServiceIdentity, sightings: [DiscoveredService.Sighting], interface: Int32?,
        ipVersion: IPVersion, timeout: Duration
    ) async throws(DiscoveryError) -> ResolvedService {
        let core = self.core
        let result: Result<ResolvedService, DiscoveryError> = await withCheckedContinuation { continuation in
            core.queue.async {
                let session = ResolveSession(
                    core: core, identity: identity, sightings: sightings, interface: interface,
                    ipVersion: ipVersion, mode: .once(timeout: timeout, completion: { continuation.resume(returning: $0) }))
                core.addResolve(session)
            }
        }
        return try result.get()
    }

    /// Keeps resolving a service and reports every change: TXT updates (which browsers do not
    /// report), address changes, a new port. The first element is the first complete resolution.
    /// Runs until the iteration ends.
    public func watch(
        _ identity: ServiceIdentity, interface: InterfaceSelection = .any, ipVersion: IPVersion = .any
    ) throws(DiscoveryError) -> ServiceWatcher {
        let interfaceIndex = try interface.resolvedIndex()
        let (stream, continuation) = AsyncStream.makeStream(of: ResolvedService.self, bufferingPolicy: .bufferingNewest(16))
        let session = ResolveSession(
            core: core, identity: identity, sightings: [], interface: interfaceIndex, ipVersion: ipVersion,
            mode: .watch(continuation))
        continuation.onTermination = { [core] _ in core.queue.async { core.removeResolve(session) } }
        core.queue.async { [core] in core.addResolve(session) }
        return ServiceWatcher(stream: stream)
    }

    /// Unpublishes everything, stops every browse and resolve, and disconnects from the daemon.
    /// Idempotent. Afterwards no Dispatch source or timer of this object is left.
    public func shutdown() async {
        let core = self.core
        await core.perform { core.shutdown() }
    }

    /// How long a publication may stay in Avahi's probing phase before it is withdrawn and
    /// registered again (default 5 s; tests shorten it).
    func setProbeStallTimeout(_ timeout: Duration) async {
        let core = self.core
        await core.perform { core.probeStallTimeout = timeout }
    }

    /// Counters of the Dispatch poll adapter, for tests: live watches, live timeouts, wakeups so far.
    var pollCounters: (watches: Int, timeouts: Int, wakeups: Int) {
        get async {
            let core = self.core
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
    public func makeAsyncIterator() -> AsyncStream<BrowseEvent>.Iterator { stream.makeAsyncIterator() }
}

/// The successive resolutions of a watched service; see ``ServiceDiscovery/watch(_:interface:ipVersion:)``.
public struct ServiceWatcher: AsyncSequence, Sendable {
    public typealias Element = ResolvedService
    let stream: AsyncStream<ResolvedService>
    public func makeAsyncIterator() -> AsyncStream<ResolvedService>.Iterator { stream.makeAsyncIterator() }
}

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
final class DiscoveryCore: @unchecked Sendable {
    let queue = DispatchQueue(label: "discovery.avahi")
    let logger: Logger
    let programName: String
    let poll: DispatchPoll
    let published: Locked<PublishedState>

    // queue-confined
    private(set) var client: OpaquePointer?
    private var retryTimer: (any DispatchSourceTimer)?
    private var retryDelay: Duration = .milliseconds(250)
    /// How long a publication may probe before it is registered again (see `Publication`).
    var probeStallTimeout: Duration = .seconds(5)
    private var stopped = false
    private var publications: [ObjectIdentifier: Publication] = [:]
    private var browses: [ObjectIdentifier: BrowseSession] = [:]
    private var resolves: [ObjectIdentifier: ResolveSession] = [:]
    /// Sightings of every service seen by any browse, for resolves.
    var sightings: [ServiceIdentity: Set<DiscoveredService.Sighting>] = [:]

    init(logger: Logger, programName: String) {
        self.logger = logger
        self.programName = programName
        self.poll = DispatchPoll(queue: queue)
        self.published = Locked(PublishedState(hostName: Self.kernelHostName()))
    }

    static func kernelHostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        gethostname(&buffer, buffer.count)
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
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
            logger.warning("avahi client creation failed", metadata: ["error": "\(failure.message)"])
            setState(.failed(failure))
            scheduleRetry()
            return
        }
        client = created
    }

    private func scheduleRetry() {
        retryTimer?.cancel()
        let timer = DispatchSource.makeTimerSource(queue: queue)
        let delay = retryDelay
        retryDelay = min(retryDelay * 2, .seconds(5))
        timer.schedule(deadline: .now() + delay.dispatchInterval)
        timer.setEventHandler { [weak self] in
            guard let self else { return }
            self.retryTimer?.cancel()
            self.retryTimer = nil
            self.connect()
        }
        timer.resume()
        retryTimer = timer
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
            setState(.registering)
        case AVAHI_CLIENT_FAILURE:
            let error = avahi_client_errno(client)
            let failure = DiscoveryError(
                .daemonUnavailable, "lost the Avahi daemon: \(avahiMessage(error)); reconnecting", avahiErrorCode: error)
            logger.warning("avahi client failed", metadata: ["error": "\(avahiMessage(error))"])
            setState(.failed(failure))
            // Everything owned by this client dies with it.
            for publication in publications.values { publication.clientLost() }
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
    Unmanaged<DiscoveryCore>.fromOpaque(userdata).takeUnretainedValue().clientStateChanged(client, state)
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
