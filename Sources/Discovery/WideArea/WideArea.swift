import Dispatch
import Locks
import Logging
import MDNSCore
import Scheduling

/// The wide-area side of one ``ServiceDiscovery``: unicast DNS-SD beside the link's mDNS. Holds the
/// DNS client, the domains the network announces, the registrations (told when the host's addresses
/// change) and a cache of where each zone's data is.
final class WideArea: Sendable {
    let dns: UnicastDNS
    let configuration: DiscoveryConfiguration
    let logger: Logger
    let hostLabel: String
    /// The clock of the registrations' waits and of the address changes' debounce (Dispatch's;
    /// tests turn a manual one).
    let scheduler: any Scheduler
    /// Whether the first registration starts the netlink watch of the host's addresses (tests of
    /// the debounce call ``addressesMayHaveChanged()`` themselves).
    private let watchesAddresses: Bool

    private struct State {
        var domains: (value: AnnouncedDomains, at: UInt64)?
        var registrations: [ObjectIdentifier: WideAreaRegistration] = [:]
        var zones: [DNSName: (zone: UnicastDNS.Zone, servers: [DNSServerAddress], at: UInt64)] = [:]
        var monitor: NetlinkMonitor?
        var monitorSource: (any DispatchSourceRead)?
        var debounce: ScheduledWork?
        var stopped = false
    }

    private let state = Locked(State())

    /// What changes the state, applied in one place (`change`).
    private enum Change {
        /// Remember the domains found (nil: forget them, the network may have changed).
        case domains(AnnouncedDomains?)
        /// Remember where a zone's data is (nil: forget it after a failure).
        case zone(DNSName, (zone: UnicastDNS.Zone, servers: [DNSServerAddress], at: UInt64)?)
        /// A registration to tell of address changes; the first starts the netlink watch.
        case add(WideAreaRegistration)
        case remove(WideAreaRegistration)
        /// A burst of address changes: this timer acts after the last one (answers the one it replaces).
        case debounce(ScheduledWork)
        /// The addresses changed: forget the domains (answers the registrations to tell).
        case addressesChanged
        /// Stop watching (answers the registrations, the sources to cancel).
        case stop
    }

    /// The state as it is now (the one door for reads).
    private var current: State { state.withLock { $0 } }

    /// What a change leaves to the caller, outside the lock: registrations to tell, a Dispatch
    /// source and timers to cancel.
    private struct Leftovers {
        var registrations: [WideAreaRegistration] = []
        var sources: [any DispatchSourceProtocol] = []
        var timers: [ScheduledWork] = []
    }

    /// The one door for changes; returns what the change leaves to the caller.
    @discardableResult
    private func change(_ change: Change) -> Leftovers {
        state.withLock { state in
            switch change {
            case .domains(let value):
                state.domains = value.map { ($0, scheduler.now) }
            case .zone(let name, let entry):
                state.zones[name] = entry
            case .add(let registration):
                state.registrations[ObjectIdentifier(registration)] = registration
                if watchesAddresses, state.monitor == nil, !state.stopped { startMonitor(&state) }
            case .remove(let registration):
                state.registrations.removeValue(forKey: ObjectIdentifier(registration))
            case .debounce(let timer):
                guard !state.stopped else { return Leftovers(timers: [timer]) }
                defer { state.debounce = timer }
                return Leftovers(timers: state.debounce.map { [$0] } ?? [])
            case .addressesChanged:
                state.domains = nil  // subnets may have changed too
                return Leftovers(registrations: Array(state.registrations.values))
            case .stop:
                state.stopped = true
                defer {
                    state.monitorSource = nil
                    state.monitor = nil
                    state.debounce = nil
                }
                return Leftovers(
                    registrations: Array(state.registrations.values), sources: state.monitorSource.map { [$0] } ?? [],
                    timers: state.debounce.map { [$0] } ?? [])
            }
            return Leftovers()
        }
    }

    /// - Parameters:
    ///   - dns: The DNS client (tests: one on a server in memory and its clock).
    ///   - scheduler: The clock of the registrations' waits and of the debounce (tests: a
    ///     `ManualScheduler`).
    ///   - watchesAddresses: Whether the first registration starts the netlink watch.
    init(
        configuration: DiscoveryConfiguration, logger: Logger, hostLabel: String, dns: UnicastDNS? = nil,
        scheduler: any Scheduler = DispatchScheduler(), watchesAddresses: Bool = true
    ) {
        self.watchesAddresses = watchesAddresses
        self.configuration = configuration
        self.logger = logger
        self.hostLabel = hostLabel
        self.dns = dns ?? UnicastDNS(settings: configuration.wideArea, logger: logger, client: DNSClient(scheduler: scheduler))
        self.scheduler = scheduler
    }

    var settings: WideAreaConfiguration { configuration.wideArea }

    // MARK: Domains (RFC 6763 §11)

    /// Browse and registration domains: the configured ones first, then those the network announces.
    struct AnnouncedDomains: Sendable, Equatable {
        var browse: [String] = []
        var registration: [String] = []
        /// Some enumeration query got no answer (the list may be incomplete; not cached).
        var unanswered: String?
    }

    /// The domains to use, enumerated at most every `maxAge` (15 minutes: announced domains change
    /// with the network's configuration, rarely; asked again after interface changes).
    func domains(maxAge: Duration = .seconds(900)) async -> AnnouncedDomains {
        if let cached = current.domains, scheduler.now &- cached.at < maxAge.schedulerNanoseconds { return cached.value }
        var result = AnnouncedDomains(browse: settings.domains, registration: settings.domains)
        if settings.enumeratesDomains {
            let announced = await enumerate()
            for domain in announced.browse where !result.browse.contains(domain) { result.browse.append(domain) }
            for domain in announced.registration where !result.registration.contains(domain) { result.registration.append(domain) }
            result.unanswered = announced.unanswered
        }
        let value = result
        // A list made while the DNS server did not answer is asked again next time.
        if value.unanswered == nil { change(.domains(value)) }
        return result
    }

    /// Asks `b`, `db`, `lb` (browse) and `r`, `dr` (registration) `._dns-sd._udp` under each search
    /// domain and each subnet's reverse-mapping name, all at once.
    private func enumerate() async -> AnnouncedDomains {
        var bases = dns.searchDomains()
        for name in WideAreaHost.subnetNames(configuration) where !bases.contains(name) { bases.append(name) }
        guard !bases.isEmpty, !dns.resolvers().isEmpty else { return AnnouncedDomains() }
        let prefixes = ["db", "b", "lb", "dr", "r"]
        let answers = await withTaskGroup(of: (Int, Int, [String], String?).self) { group in
            for (baseIndex, base) in bases.enumerated() {
                for (prefixIndex, prefix) in prefixes.enumerated() {
                    guard let name = base.prepending("\(prefix)._dns-sd._udp") else { continue }
                    group.addTask {
                        let records: [ResourceRecord]
                        do throws(DiscoveryError) {
                            records = try await self.dns.records(name, DNSType.ptr)
                        } catch {
                            return (baseIndex, prefixIndex, [], error.code == .dnsUnreachable ? error.message : nil)
                        }
                        let domains = records.compactMap { record -> String? in
                            guard case .ptr(let target) = record.data, !target.labels.isEmpty else { return nil }
                            return WideAreaConfiguration.normalize(target.description)
                        }
                        return (baseIndex, prefixIndex, domains, nil)
                    }
                }
            }
            var all: [(Int, Int, [String], String?)] = []
            for await answer in group { all.append(answer) }
            return all.sorted { ($0.0, $0.1) < ($1.0, $1.1) }
        }
        var result = AnnouncedDomains()
        // Named after a registration query (dr, r) when one went unanswered: the registration
        // reports it, and naming `db` there sent administrators to the wrong record (issue 45, 7).
        result.unanswered = answers.first { $0.1 >= 3 && $0.3 != nil }?.3 ?? answers.compactMap { $0.3 }.first
        for (_, prefixIndex, domains, _) in answers {
            for domain in domains where domain != "local" {
                if prefixIndex < 3 {
                    if !result.browse.contains(domain) { result.browse.append(domain) }
                } else if !result.registration.contains(domain) {
                    result.registration.append(domain)
                }
            }
        }
        logger.debug(
            "wide-area domains",
            metadata: [
                "bases": "\(bases.map(\.description).joined(separator: " "))",
                "browse": "\(result.browse.joined(separator: " "))",
                "registration": "\(result.registration.joined(separator: " "))",
            ])
        return result
    }

    // MARK: Zones

    /// The zone holding `name` and the servers that have its data (cached for 15 minutes, and
    /// forgotten after a failure: the browser asks again after any poll that went wrong).
    func zone(of name: DNSName) async throws(DiscoveryError) -> (zone: UnicastDNS.Zone, servers: [DNSServerAddress]) {
        if let cached = current.zones[name], scheduler.now &- cached.at < Duration.seconds(900).schedulerNanoseconds {
            return (cached.zone, cached.servers)
        }
        let zone = try await dns.zone(of: name)
        // The primary first (no cache between us and the data), the resolvers after it: a hidden or
        // unreachable primary still leaves the zone readable through them.
        var servers = await dns.authoritativeServers(of: zone)
        for resolver in dns.resolvers() where !servers.contains(resolver) { servers.append(resolver) }
        change(.zone(name, (zone, servers, scheduler.now)))
        return (zone, servers)
    }

    func forgetZone(of name: DNSName) {
        change(.zone(name, nil))
    }

    // MARK: Registrations

    /// Registers `handle`'s service in the configured or announced registration domain.
    func register(_ request: PublishRequest, name: String, handle: PublishedService) {
        guard let key = settings.key else { return }
        let registration = WideAreaRegistration(
            wideArea: self, domain: request.domain ?? settings.domains.first, name: name, type: request.type,
            port: request.port, txt: request.txt, key: key, handle: handle, logger: logger)
        track(registration)
        handle.attachWideArea([registration])
    }

    /// Tells `registration` of address changes from now on (the first starts the netlink watch).
    func track(_ registration: WideAreaRegistration) {
        change(.add(registration))
    }

    func forget(_ registration: WideAreaRegistration) {
        change(.remove(registration))
    }

    /// Watches the host's addresses (netlink) and refreshes the registrations when they change
    /// (from `change`, under the lock: the source is made and resumed, nothing calls out).
    private func startMonitor(_ state: inout State) {
        guard let monitor = NetlinkMonitor() else { return }
        let source = DispatchSource.makeReadSource(fileDescriptor: monitor.fd, queue: dns.client.queue)
        source.setEventHandler { [weak self] in
            monitor.drain()
            self?.addressesMayHaveChanged()
        }
        source.setCancelHandler { monitor.close() }
        source.resume()
        state.monitor = monitor
        state.monitorSource = source
    }

    /// Netlink said the addresses changed. Changes come in bursts: the registrations are told (and
    /// the announced domains forgotten) half a second after the last one, on the scheduler's clock.
    func addressesMayHaveChanged() {
        let timer = scheduler.schedule(after: .milliseconds(500), on: dns.client.queue) { [weak self] in
            guard let self else { return }
            for registration in self.change(.addressesChanged).registrations { registration.addressesChanged() }
        }
        for previous in change(.debounce(timer)).timers { previous.cancel() }
    }

    /// Deletes every registration's records (each bounded by the update timeout), then stops watching.
    func shutdown() async {
        let registrations = Array(current.registrations.values)
        await withTaskGroup(of: Void.self) { group in
            for registration in registrations { group.addTask { await registration.stop() } }
        }
        stopMonitor()
    }

    /// The discovery object went away: deletions are sent in the background.
    func beginShutdown() {
        for registration in current.registrations.values { registration.beginStop() }
        stopMonitor()
    }

    private func stopMonitor() {
        let leftovers = change(.stop)
        for source in leftovers.sources { source.cancel() }
        for timer in leftovers.timers { timer.cancel() }
    }

    // MARK: Resolving

    /// Resolves an instance in a unicast domain: SRV, TXT, then the target's A and AAAA, asked of
    /// the zone's own servers (no cache between us and the data).
    func resolve(_ identity: ServiceIdentity, timeout: Duration) async throws(DiscoveryError) -> ResolvedService {
        // The chain is several queries; the whole of it is bounded by `timeout` (the queries in
        // flight are cancelled at the deadline).
        let result = await withDeadline(timeout, on: scheduler) { () -> Result<ResolvedService, DiscoveryError> in
            .failure(DiscoveryError(.timedOut, "no complete answer for \(identity) within \(timeout)"))
        } operation: {
            do throws(DiscoveryError) {
                return .success(try await self.resolveChain(identity))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    private func resolveChain(_ identity: ServiceIdentity) async throws(DiscoveryError) -> ResolvedService {
        guard let domainName = DNSName(identity.domain), let typeName = DNSName(identity.type),
            let service = DNSName(labels: typeName.labels + domainName.labels),
            let instance = DNSName(instance: identity.name, service: service)
        else {
            throw DiscoveryError(.invalidArgument, "\(identity) is not a valid DNS name")
        }
        let (_, servers) = try await zone(of: domainName)
        let srv = try await dns.records(instance, DNSType.srv, servers: servers, recursion: false)
        let txt = (try? await dns.records(instance, DNSType.txt, servers: servers, recursion: false)) ?? []
        guard let first = srv.first, case .srv(_, _, let port, let target) = first.data else {
            throw DiscoveryError(.notPublished, "\(identity) has no SRV record in \(identity.domain): it is no longer registered")
        }
        var ips = await dns.addresses(of: target, servers: servers, recursion: false)
        if ips.isEmpty { ips = await dns.addresses(of: target) }
        guard !ips.isEmpty else {
            throw DiscoveryError(
                .notPublished, "\(identity) points at \(target), which has no address (A or AAAA) in the DNS")
        }
        let strings: [[UInt8]]
        if case .txt(let values)? = txt.first?.data { strings = values } else { strings = [] }
        var record = TXTRecord(wireEntries: strings)
        record.remove(expiresKey)
        let own = Set(WideAreaHost.routableAddresses(configuration))
        return ResolvedService(
            identity: identity, hostName: target.description, port: port, txt: record,
            addresses: ips.map { ServiceAddress(ip: $0, interfaceIndex: 0, port: port) },
            isLocal: ips.contains { own.contains($0) })
    }
}
