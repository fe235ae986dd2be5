import Dispatch
import Locks
import Logging
import MDNSCore

/// This host as the wide-area side sees it: routable addresses and subnets.
enum WideAreaHost {
    /// The addresses to publish: the configured advertised addresses, else those of every permitted
    /// interface that another subnet can reach — never loopback or link-local.
    static func routableAddresses(_ configuration: DiscoveryConfiguration) -> [IPAddress] {
        let wanted: [IPAddress]
        if !configuration.advertisedAddresses.isEmpty {
            wanted = configuration.advertisedAddresses
        } else {
            wanted = InterfaceInfo.scan()
                .filter { $0.isUp && !$0.isLoopback && configuration.interfaces.permits($0.name) }
                .flatMap { interface in
                    interface.ipv4.map { IPAddress.v4($0[0], $0[1], $0[2], $0[3]) } + interface.ipv6.map { IPAddress.v6($0) }
                }
        }
        return wanted.filter { address in
            guard !address.isLoopback, !address.isLinkLocal, !address.isMulticast, !address.isUnspecified else { return false }
            switch configuration.ipVersion {
            case .any: return true
            case .ipv4: return address.version == .ipv4
            case .ipv6: return address.version == .ipv6
            }
        }
    }

    /// The reverse-mapping names of the subnets of this host's routable addresses, where a network
    /// announces its DNS-SD domains (RFC 6763 §11).
    static func subnetNames(_ configuration: DiscoveryConfiguration) -> [DNSName] {
        var names: [DNSName] = []
        for interface in InterfaceInfo.scan() where interface.isUp && !interface.isLoopback {
            guard configuration.interfaces.permits(interface.name) else { continue }
            for bytes in interface.ipv4 + interface.ipv6 {
                let address: IPAddress = bytes.count == 4 ? .v4(bytes[0], bytes[1], bytes[2], bytes[3]) : .v6(bytes)
                guard !address.isLoopback, !address.isLinkLocal else { continue }
                let prefix = interface.prefixLengths[bytes] ?? (bytes.count == 4 ? 24 : 64)
                if let name = DNSName.reverseSubnet(address: bytes, prefixLength: prefix), !names.contains(name) {
                    names.append(name)
                }
            }
        }
        return names
    }
}

extension IPAddress {
    var isMulticast: Bool {
        switch self {
        case .v4(let a, _, _, _): a >= 224 && a < 240
        case .v6(let bytes): bytes[0] == 0xff
        }
    }
    var isUnspecified: Bool { bytes.allSatisfy { $0 == 0 } }
}

/// The TXT key that carries a wide-area registration's expiry (seconds since the epoch), reserved.
let expiresKey = "expires"

/// One service registered in one unicast DNS domain with signed DNS UPDATEs, kept there until
/// stopped: registered atomically (SRV, TXT, the type's PTR and the host's A/AAAA, with a "name must
/// not exist" prerequisite), renamed on a conflict unless the existing records are our own stale
/// ones (same identity: the `fp` TXT key, else the same host), refreshed at half the lease (new
/// `expires`), re-registered when its records vanished and when the host's addresses change,
/// retried with back-off while no server answers. Stop deletes exactly its records: SRV and TXT,
/// and the PTR by its value.
///
/// One owned task runs it; `stop()` cancels that task, waits for it, then deletes.
final class WideAreaRegistration: Sendable {
    struct Registered: Sendable, Equatable {
        var name: String
        var zone: DNSName
        var servers: [DNSServerAddress]
        var srv: ResourceRecord
    }

    private struct State {
        var name: String
        /// The domain registered in: the configured one, else the network's default registration
        /// domain once enumerated.
        var domain: String?
        var txt: TXTRecord
        var registered: Registered?
        /// The records of the last update sent that could have created them, answered or not: what
        /// stop deletes when no answer confirmed them (the delete is conditional on our SRV).
        var attempted: Registered?
        var task: Task<Void, Never>?
        var stopped = false
        /// The last failure reported (the same one is not reported again on every retry).
        var lastFailure: DiscoveryError?
    }

    let wideArea: WideArea
    let type: String
    let port: UInt16
    let key: TSIGKey
    let handle: PublishedService
    let logger: Logger
    private let state: Locked<State>
    private let wakeup = Wakeup()

    var dns: UnicastDNS { wideArea.dns }
    var configuration: DiscoveryConfiguration { wideArea.configuration }
    /// The domain, or a placeholder while it is not known yet (for messages).
    var domain: String { state.withLock { $0.domain } ?? "the default registration domain" }

    init(
        wideArea: WideArea, domain: String?, name: String, type: String, port: UInt16, txt: TXTRecord, key: TSIGKey,
        handle: PublishedService, logger: Logger
    ) {
        self.wideArea = wideArea
        self.type = type
        self.port = port
        self.key = key
        self.handle = handle
        self.logger = logger
        self.state = Locked(State(name: name, domain: domain, txt: txt))
    }

    /// The instance name in the domain now (it changes after a conflict).
    var name: String { state.withLock { $0.name } }
    /// Whether the records are in the zone now.
    var isRegistered: Bool { state.withLock { $0.registered != nil } }

    func start() {
        let task = Task { await self.run() }
        state.withLock { $0.task = task }
    }

    /// Replaces the TXT record (a refresh with the new one).
    func updateTXT(_ txt: TXTRecord) {
        state.withLock { $0.txt = txt }
        wakeup.signal()
    }

    /// The host's addresses may have changed: refresh now.
    func addressesChanged() { wakeup.signal() }

    /// Stops refreshing and deletes the records (bounded by the update timeout). An update in
    /// flight is not cancelled (its records could land unseen): the loop ends after it, then the
    /// deletion runs in a task of its own, so a caller that is itself being cancelled (a signal
    /// handler) still removes the records.
    func stop() async {
        let (task, alreadyStopped) = state.withLock { state -> (Task<Void, Never>?, Bool) in
            defer { state.stopped = true }
            return (state.task, state.stopped)
        }
        guard !alreadyStopped else { return }
        wakeup.signal()
        let removal = Task {
            await task?.value
            self.wideArea.forget(self)
            guard let records = self.state.withLock({ $0.registered ?? $0.attempted }) else { return }
            do throws(DiscoveryError) {
                try await self.delete(records)
                self.state.withLock {
                    $0.registered = nil
                    $0.attempted = nil
                }
                self.logger.info(
                    "wide-area registration removed",
                    metadata: ["name": "\(records.name)", "type": "\(self.type)", "domain": "\(self.domain)"])
            } catch {
                self.logger.warning(
                    "could not remove the wide-area registration; it stays until its expiry or `lanmsg wide-area cleanup`",
                    metadata: ["name": "\(records.name)", "domain": "\(self.domain)", "error": "\(error.message)"])
            }
        }
        await removal.value
    }

    /// Whether stop() was called: the loop ends at its next step.
    private var isStopping: Bool { state.withLock { $0.stopped } }

    /// Stops without waiting (the discovery object went away): the deletion is sent in the background.
    func beginStop() {
        Task { await self.stop() }
    }

    // MARK: The loop

    private func run() async {
        var backoff: Duration = .seconds(1)
        let maxBackoff = min(Duration.seconds(60), configuration.wideArea.lease / 4)
        while !Task.isCancelled && !isStopping {
            let wait: Duration
            do {
                if state.withLock({ $0.registered }) == nil {
                    try await register()
                } else {
                    try await refresh()
                }
                backoff = .seconds(1)
                state.withLock { $0.lastFailure = nil }
                wait = configuration.wideArea.lease / 2
            } catch {
                if Task.isCancelled || isStopping { return }
                switch error.code {
                case .dnsUnreachable, .dnsFailure, .collision:
                    wait = backoff
                    backoff = min(backoff * 2, maxBackoff)
                default:
                    // A refusal (policy, key, clock) does not go away by itself: try again rarely,
                    // in case the administrator fixes it.
                    wait = .seconds(300)
                }
                report(error, retryingIn: wait)
            }
            // Sleep until the next refresh, or until nudged (TXT or address change).
            _ = await wakeup.wait(wait)
            if Task.isCancelled || isStopping { return }
        }
    }

    /// Says a failure once (until another comes or it succeeds), and that it is tried again: the
    /// line says when (issue 45, 7: it did not say that it retries, and it does).
    private func report(_ error: DiscoveryError, retryingIn wait: Duration) {
        let isNew = state.withLock { state -> Bool in
            defer { state.lastFailure = error }
            return state.lastFailure != error
        }
        guard isNew else { return }
        let said = DiscoveryError(
            error.code, error.message + "; trying again in \(wait.components.seconds) s", avahiErrorCode: error.avahiErrorCode,
            systemErrno: error.systemErrno, dnsRcode: error.dnsRcode)
        logger.warning(
            "wide-area registration failed",
            metadata: ["name": "\(name)", "type": "\(type)", "domain": "\(domain)", "error": "\(said.message)"])
        handle.record(.registrationFailed(domain: domain, said))
    }

    // MARK: Records

    private struct Plan {
        var zone: UnicastDNS.Zone
        var servers: [DNSServerAddress]
        var host: DNSName
        var addresses: [IPAddress]
    }

    private func locate() async throws(DiscoveryError) -> Plan {
        var chosen = state.withLock { $0.domain }
        if chosen == nil {
            let announced = await wideArea.domains()
            chosen = announced.registration.first
            if chosen == nil, dns.resolvers().isEmpty {
                throw DiscoveryError(
                    .dnsUnreachable,
                    "no DNS server is configured (\(configuration.wideArea.resolverConfigurationPath) has no nameserver) and no domain was given: nowhere to register")
            }
            if chosen == nil, let unanswered = announced.unanswered {
                throw DiscoveryError(
                    .dnsUnreachable, "cannot learn the domain to register in: \(unanswered)")
            }
            guard let found = chosen else {
                throw DiscoveryError(
                    .dnsFailure,
                    "no wide-area domain to register in: none was given (--wide-area-domain, LANMSG_WIDE_AREA_DOMAIN) and the network announces no registration domain (dr._dns-sd._udp under the search domains of \(configuration.wideArea.resolverConfigurationPath))")
            }
            state.withLock { $0.domain = found }
        }
        let domain = chosen!
        guard let domainName = DNSName(domain) else {
            throw DiscoveryError(.invalidArgument, "'\(domain)' is not a domain name")
        }
        let zone = try await dns.zone(of: domainName)
        let servers = try await dns.updateServers(for: zone)
        // The host name: the key's own name when it lies in the zone (an update policy's `self`
        // rule lets a key change only its own name), else this host's label in the zone.
        let host: DNSName
        if key.dnsName.hasSuffix(zone.name), key.dnsName.labels.count > zone.name.labels.count {
            host = key.dnsName
        } else if let name = DNSName(labels: [Array(wideArea.hostLabel.utf8)] + zone.name.labels) {
            host = name
        } else {
            throw DiscoveryError(.invalidArgument, "the host name '\(wideArea.hostLabel)' does not fit in \(zone.name)")
        }
        let addresses = WideAreaHost.routableAddresses(configuration)
        guard !addresses.isEmpty else {
            throw DiscoveryError(
                .dnsFailure,
                "this host has no routable address to publish in \(domain) (only loopback and link-local); waiting for one")
        }
        return Plan(zone: zone, servers: servers, host: host, addresses: addresses)
    }

    private func names(_ name: String, zone: DNSName) throws(DiscoveryError) -> (service: DNSName, instance: DNSName) {
        guard let typeName = DNSName(type), let service = DNSName(labels: typeName.labels + zone.labels),
            let instance = DNSName(instance: name, service: service)
        else {
            throw DiscoveryError(.invalidArgument, "'\(name)' as \(type) in \(zone) is not a valid DNS name (too long?)")
        }
        return (service, instance)
    }

    private func txtRecord(_ txt: TXTRecord) -> TXTRecord {
        var stamped = txt
        let expires = UnicastDNS.now() + UInt64(configuration.wideArea.lease.components.seconds)
        stamped[expiresKey] = String(expires)
        return stamped
    }

    /// The records of one registration, and the updates that add them.
    private func additions(name: String, plan: Plan, txt: TXTRecord) throws(DiscoveryError) -> (srv: ResourceRecord, updates: [ResourceRecord]) {
        let (service, instance) = try names(name, zone: plan.zone.name)
        let ttl = configuration.wideArea.recordTTL
        let srv = ResourceRecord(name: instance, data: .srv(priority: 0, weight: 0, port: port, target: plan.host), ttl: ttl)
        var updates = [
            srv,
            ResourceRecord(name: instance, data: .txt(txtRecord(txt).wireEntries), ttl: ttl),
            ResourceRecord(name: service, data: .ptr(instance), ttl: ttl),
        ]
        // The host's addresses replace whatever it had (they follow address changes).
        updates.append(.deleteRRset(plan.host, type: DNSType.a))
        updates.append(.deleteRRset(plan.host, type: DNSType.aaaa))
        for address in plan.addresses {
            let data: RecordData = address.version == .ipv4 ? .a(address.bytes) : .aaaa(address.bytes)
            updates.append(ResourceRecord(name: plan.host, data: data, ttl: ttl))
        }
        return (srv, updates)
    }

    private func updateMessage(zone: DNSName, prerequisites: [ResourceRecord], updates: [ResourceRecord]) -> DNSMessage {
        let leaseSeconds = UInt32(clamping: configuration.wideArea.lease.components.seconds)
        return DNSMessage.update(
            id: DNSClient.randomID(), zone: zone, prerequisites: prerequisites, updates: updates,
            additionals: [.opt(options: [.updateLease(seconds: leaseSeconds)])])
    }

    /// A first registration: "name must not exist", renaming on a conflict with someone else,
    /// replacing our own stale records.
    private func register() async throws(DiscoveryError) {
        let plan = try await locate()
        var name = state.withLock { $0.name }
        for _ in 0..<32 {
            if isStopping || Task.isCancelled { throw DiscoveryError(.shutDown, "stopped") }
            let txt = state.withLock { $0.txt }
            let (srv, updates) = try additions(name: name, plan: plan, txt: txt)
            let instance = srv.name
            let message = updateMessage(zone: plan.zone.name, prerequisites: [.nameNotInUse(instance)], updates: updates)
            let attempt = Registered(name: name, zone: plan.zone.name, servers: plan.servers, srv: srv)
            state.withLock { $0.attempted = attempt }
            switch try await dns.send(message, key: key, servers: plan.servers, describing: "'\(name)' in \(domain)") {
            case .done:
                registered(Registered(name: name, zone: plan.zone.name, servers: plan.servers, srv: srv))
                return
            case .prerequisiteFailed(let rcode):
                throw DiscoveryError(.dnsFailure, "the registration of '\(name)' failed its prerequisite (\(DNSRcode.name(rcode)))")
            case .nameExists:
                if let earlier = try await ourEarlierRecords(instance: instance, plan: plan) {
                    // Replace exactly what was read: if it changed meanwhile (cleaned up, taken by
                    // another host), the prerequisite fails and nothing of anyone else's is touched.
                    let replace = updateMessage(
                        zone: plan.zone.name, prerequisites: earlier.map { .rrsetEquals($0) },
                        updates: [.deleteName(instance)] + updates)
                    let outcome = try await dns.send(
                        replace, key: key, servers: plan.servers, describing: "our earlier '\(name)' in \(domain)")
                    if outcome == .done {
                        logger.notice(
                            "replaced this service's stale wide-area registration",
                            metadata: ["name": "\(name)", "domain": "\(domain)"])
                        registered(Registered(name: name, zone: plan.zone.name, servers: plan.servers, srv: srv))
                        return
                    }
                    continue  // it went away meanwhile: register afresh
                }
                let next = alternativeName(for: name, isHost: false)
                logger.notice(
                    "wide-area name taken by another service, renamed",
                    metadata: ["from": "\(name)", "to": "\(next)", "domain": "\(domain)"])
                handle.record(.registrationRenamed(domain: domain, from: name, to: next))
                name = next
                state.withLock { $0.name = next }
            }
        }
        throw DiscoveryError(.collision, "no free name found in \(domain) for '\(name)' after 32 alternatives")
    }

    private func registered(_ registration: Registered) {
        state.withLock { $0.registered = registration }
        logger.info(
            "wide-area registration done",
            metadata: ["name": "\(registration.name)", "type": "\(type)", "domain": "\(domain)",
                "servers": "\(registration.servers.map(\.description).joined(separator: ","))"])
        handle.record(.registered(name: registration.name, domain: domain))
    }

    /// The records under `instance` when they are an earlier registration of this same service
    /// (a restart after a crash): an SRV pointing at our host and, when our TXT has an `fp`, the
    /// same `fp` (the same key — another host with the same key and name is someone else). nil:
    /// someone else's.
    private func ourEarlierRecords(instance: DNSName, plan: Plan) async throws(DiscoveryError) -> [ResourceRecord]? {
        let srv = try await dns.records(instance, DNSType.srv, servers: plan.servers, recursion: false)
        let txt = try await dns.records(instance, DNSType.txt, servers: plan.servers, recursion: false)
        guard !srv.isEmpty, srv.allSatisfy({ record in
            if case .srv(_, _, _, let target) = record.data { return target == plan.host }
            return false
        }) else { return nil }
        if let ourFingerprint = state.withLock({ $0.txt["fp"] }) {
            let theirs = txt.compactMap { record -> String? in
                guard case .txt(let strings) = record.data else { return nil }
                return TXTRecord(wireEntries: strings)["fp"]
            }
            guard theirs == [ourFingerprint] else { return nil }
        }
        return srv + txt
    }

    /// A refresh: the same records with a new expiry and the current addresses, on condition that
    /// our SRV is still there; when it is not (deleted, or the server lost its zone), register again.
    private func refresh() async throws(DiscoveryError) {
        guard let current = state.withLock({ $0.registered }) else { return }
        let plan = try await locate()
        let txt = state.withLock { $0.txt }
        let (srv, updates) = try additions(name: current.name, plan: plan, txt: txt)
        let (_, instance) = try names(current.name, zone: plan.zone.name)
        let message = updateMessage(
            zone: plan.zone.name, prerequisites: [.rrsetEquals(current.srv)],
            updates: [.deleteRRset(instance, type: DNSType.txt), .deleteRRset(instance, type: DNSType.srv)] + updates)
        state.withLock { $0.attempted = Registered(name: current.name, zone: plan.zone.name, servers: plan.servers, srv: srv) }
        switch try await dns.send(message, key: key, servers: plan.servers, describing: "'\(current.name)' in \(domain)") {
        case .done:
            state.withLock { $0.registered = Registered(name: current.name, zone: plan.zone.name, servers: plan.servers, srv: srv) }
            logger.debug("wide-area registration refreshed", metadata: ["name": "\(current.name)", "domain": "\(domain)"])
        case .nameExists, .prerequisiteFailed:
            logger.notice(
                "the wide-area records of this service were gone; registering again",
                metadata: ["name": "\(current.name)", "domain": "\(domain)"])
            state.withLock { $0.registered = nil }
            handle.record(.registrationFailed(domain: domain, DiscoveryError(.notPublished, "the records of '\(current.name)' were removed from \(domain); registering again")))
            try await register()
        }
    }

    /// Deletes exactly this registration's records: the PTR by its value (the set is shared by
    /// every instance of the type), then SRV and TXT by deleting the instance name — on condition
    /// that our SRV is still there (never another host's records that took the name over).
    private func delete(_ registration: Registered) async throws(DiscoveryError) {
        let (service, instance) = try names(registration.name, zone: registration.zone)
        let message = DNSMessage.update(
            id: DNSClient.randomID(), zone: registration.zone, prerequisites: [.rrsetEquals(registration.srv)],
            updates: [
                .deleteRecord(ResourceRecord(name: service, data: .ptr(instance), ttl: 0)),
                .deleteName(instance),
            ])
        let outcome = try await dns.send(
            message, key: key, servers: registration.servers, describing: "the removal of '\(registration.name)' from \(domain)")
        if case .prerequisiteFailed = outcome {
            logger.notice(
                "the wide-area records were already gone or taken over; nothing removed",
                metadata: ["name": "\(registration.name)", "domain": "\(domain)"])
        }
    }
}

extension Task where Success == Never, Failure == Never {
    /// Throws `error` when the current task is cancelled.
    static func checkCancellation(or error: DiscoveryError) throws(DiscoveryError) {
        if Task.isCancelled { throw error }
    }
}

extension TXTRecord {
    /// The record's character-strings as sent (an empty record is one empty string).
    var wireEntries: [[UInt8]] {
        entries.isEmpty ? [[]] : entries.map(\.bytes)
    }
}

/// Sleeps for a while unless signalled first (a pending signal ends the next wait at once) or the
/// task is cancelled.
final class Wakeup: Sendable {
    private struct State {
        var pending = false
        var waiter: (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: any DispatchSourceTimer)?
        var nextID = 0
    }
    private let state = Locked(State())

    func signal() {
        let waiter = state.withLock { state -> (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: any DispatchSourceTimer)? in
            guard let waiter = state.waiter else {
                state.pending = true
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.timer.cancel()
        waiter?.continuation.resume(returning: true)
    }

    /// Waits up to `duration`; true when signalled.
    func wait(_ duration: Duration) async -> Bool {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let timer = DispatchSource.makeTimerSource(queue: .global())
                let resumeNow = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    state.waiter = (id, continuation, timer)
                    return false
                }
                if resumeNow {
                    timer.activate()
                    timer.cancel()
                    continuation.resume(returning: true)
                    return
                }
                timer.setEventHandler { [weak self] in self?.expire(id, signalled: false) }
                timer.schedule(deadline: .now() + duration.dispatchInterval)
                timer.activate()
            }
        } onCancel: {
            expire(id, signalled: false)
        }
    }

    private func expire(_ id: Int, signalled: Bool) {
        let waiter = state.withLock { state -> (id: Int, continuation: CheckedContinuation<Bool, Never>, timer: any DispatchSourceTimer)? in
            guard let waiter = state.waiter, waiter.id == id else { return nil }
            state.waiter = nil
            return waiter
        }
        waiter?.timer.cancel()
        waiter?.continuation.resume(returning: signalled)
    }
}
