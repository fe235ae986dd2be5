import Dispatch
import Locks
import Logging
import MDNSCore
import Scheduling

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
/// The decisions are `RegistrationMachine`'s; this class carries out its actions (DNS lookups and
/// updates, waits) in one owned task and feeds back their answers. A stop is fed to the machine
/// between two actions: an update in flight is never abandoned (its records could land unseen),
/// and the removal runs in the same task, so a caller that is itself being cancelled (a signal
/// handler) still removes the records.
final class WideAreaRegistration: Sendable {
    /// What other threads read and set: the TXT record (the app changes it), the domain found by
    /// the task (when none was configured), the stop request, the task.
    private struct Shared {
        var txt: TXTRecord
        var foundDomain: String?
        var stopRequested = false
        var task: Task<Void, Never>?
    }

    /// What is asked of the registration from outside its task, and by the task between two actions.
    private enum Request {
        case start
        case txt(TXTRecord)
        case stop
        /// From the task: the registration domain it found.
        case found(domain: String)
        /// From the task between two actions: answered with whether a stop was requested.
        case between
    }

    let wideArea: WideArea
    let type: String
    let port: UInt16
    let key: TSIGKey
    let handle: PublishedService
    let logger: Logger
    let initialName: String
    /// The domain given (nil: the network's default registration domain, found by the task).
    let configuredDomain: String?
    private let shared: Locked<Shared>
    /// Its waits (between refreshes, before a retry), on the wide area's clock; a TXT change, an
    /// address change or a stop ends them early.
    private let wakeup: Wakeup
    /// Sees every report as the machine made it (tests: `WideAreaWorld` checks them with their
    /// times); nil in the library.
    let onReport: (@Sendable (RegistrationMachine.Report) -> Void)?

    var dns: UnicastDNS { wideArea.dns }
    /// The messages it sends.
    var updates: RegistrationUpdates {
        RegistrationUpdates(
            type: type, port: port, ttl: configuration.wideArea.recordTTL, lease: configuration.wideArea.lease, domain: domain)
    }
    var configuration: DiscoveryConfiguration { wideArea.configuration }
    /// The domain, or a placeholder while it is not known yet (for messages).
    var domain: String { configuredDomain ?? current.foundDomain ?? "the default registration domain" }

    init(
        wideArea: WideArea, domain: String?, name: String, type: String, port: UInt16, txt: TXTRecord, key: TSIGKey,
        handle: PublishedService, logger: Logger, onReport: (@Sendable (RegistrationMachine.Report) -> Void)? = nil
    ) {
        self.wideArea = wideArea
        self.type = type
        self.port = port
        self.key = key
        self.handle = handle
        self.logger = logger
        self.initialName = name
        self.configuredDomain = domain
        self.shared = Locked(Shared(txt: txt))
        self.wakeup = Wakeup(scheduler: wideArea.scheduler)
        self.onReport = onReport
    }

    /// The shared state as it is now (the one door for reads).
    private var current: Shared { shared.withLock { $0 } }

    /// The one door for changes: returns the task to wait for (a stop) and whether a stop was
    /// requested before (a stop) or now (between two actions).
    @discardableResult
    private func post(_ request: Request) -> (task: Task<Void, Never>?, stopRequested: Bool) {
        shared.withLock { shared in
            switch request {
            case .start:
                if shared.task == nil, !shared.stopRequested { shared.task = Task { await self.run() } }
                return (nil, shared.stopRequested)
            case .txt(let txt):
                shared.txt = txt
                return (nil, shared.stopRequested)
            case .stop:
                defer { shared.stopRequested = true }
                return (shared.task, shared.stopRequested)
            case .found(let domain):
                shared.foundDomain = domain
                return (nil, shared.stopRequested)
            case .between:
                return (nil, shared.stopRequested)
            }
        }
    }

    func start() { post(.start) }

    /// Replaces the TXT record (a refresh with the new one).
    func updateTXT(_ txt: TXTRecord) {
        post(.txt(txt))
        wakeup.signal()
    }

    /// The host's addresses may have changed: refresh now.
    func addressesChanged() { wakeup.signal() }

    /// Stops refreshing and deletes the records (bounded by the update timeout), after the update
    /// in flight if there is one.
    func stop() async {
        let (task, alreadyStopped) = post(.stop)
        guard !alreadyStopped else { return }
        wideArea.forget(self)
        wakeup.signal()
        await task?.value
    }

    /// Stops without waiting (the discovery object went away): the deletion is sent in the background.
    func beginStop() {
        Task { await self.stop() }
    }

    // MARK: The task

    /// Carries out the machine's actions until it finishes.
    private func run() async {
        var machine = RegistrationMachine(name: initialName, lease: configuration.wideArea.lease)
        var actions = machine.apply(.start)
        var stopFed = false
        while true {
            var next: RegistrationMachine.Action?
            for action in actions {
                switch action {
                case .report(let report): say(report, name: machine.name)
                case .finished: next = nil
                default: next = action
                }
            }
            if post(.between).stopRequested, !stopFed {
                stopFed = true
                actions = machine.apply(.stop)
                continue
            }
            guard let next else { return }
            actions = machine.apply(await perform(next))
        }
    }

    private func perform(_ action: RegistrationMachine.Action) async -> RegistrationMachine.Input {
        switch action {
        case .locate:
            do throws(DiscoveryError) {
                return .located(.success(try await locate()))
            } catch {
                return .located(.failure(error))
            }
        case .send, .readEarlier:
            return await updates.answer(action, dns: dns, key: key, txt: current.txt) ?? .woke
        case .wait(let duration):
            _ = await wakeup.wait(duration)
            return .woke
        case .report, .finished:
            return .woke  // not answered actions; never performed
        }
    }

    /// Says what happened: the log, and the publication's events for the app.
    private func say(_ report: RegistrationMachine.Report, name: String) {
        onReport?(report)
        switch report {
        case .registered(let name):
            logger.info(
                "wide-area registration done",
                metadata: ["name": "\(name)", "type": "\(type)", "domain": "\(domain)"])
            handle.record(.registered(name: name, domain: domain))
        case .replacedStale(let name):
            logger.notice("replaced this service's stale wide-area registration", metadata: ["name": "\(name)", "domain": "\(domain)"])
            handle.record(.registered(name: name, domain: domain))
        case .renamed(let from, let to):
            logger.notice("wide-area name taken by another service, renamed", metadata: ["from": "\(from)", "to": "\(to)", "domain": "\(domain)"])
            handle.record(.registrationRenamed(domain: domain, from: from, to: to))
        case .failed(let error, let wait):
            // It says that it tries again, and when (issue 45, 7: it did not, and it does).
            let said = DiscoveryError(
                error.code, error.message + "; trying again in \(wait.components.seconds) s", avahiErrorCode: error.avahiErrorCode,
                systemErrno: error.systemErrno, dnsRcode: error.dnsRcode)
            logger.warning(
                "wide-area registration failed",
                metadata: ["name": "\(name)", "type": "\(type)", "domain": "\(domain)", "error": "\(said.message)"])
            handle.record(.registrationFailed(domain: domain, said))
        case .recordsGone(let name):
            logger.notice("the wide-area records of this service were gone; registering again", metadata: ["name": "\(name)", "domain": "\(domain)"])
            handle.record(.registrationFailed(
                domain: domain, DiscoveryError(.notPublished, "the records of '\(name)' were removed from \(domain); registering again")))
        case .removed(let name):
            logger.info("wide-area registration removed", metadata: ["name": "\(name)", "type": "\(type)", "domain": "\(domain)"])
        case .alreadyGone(let name):
            logger.notice("the wide-area records were already gone or taken over; nothing removed", metadata: ["name": "\(name)", "domain": "\(domain)"])
        case .removalFailed(let name, let error):
            logger.warning(
                "could not remove the wide-area registration; it stays until its expiry or `lanmsg wide-area cleanup`",
                metadata: ["name": "\(name)", "domain": "\(domain)", "error": "\(error.message)"])
        }
    }

    // MARK: Records

    private func locate() async throws(DiscoveryError) -> RegistrationPlan {
        var chosen = configuredDomain ?? current.foundDomain
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
            post(.found(domain: found))
            chosen = found
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
        return RegistrationPlan(zone: zone, servers: servers, host: host, addresses: addresses)
    }
}

extension RegistrationUpdates {
    /// Carries out an update or a read `RegistrationMachine` asked for, through `dns`, and returns
    /// the input that answers it (nil for an action that is neither): the update built, signed with
    /// `key` and sent; the records under a name read and told ours or someone else's (by the `fp` in
    /// `txt`). `WideAreaRegistration` uses it against the network; the unit tests against a server
    /// in memory.
    func answer(_ action: RegistrationMachine.Action, dns: UnicastDNS, key: TSIGKey, txt: TXTRecord) async
        -> RegistrationMachine.Input?
    {
        switch action {
        case .send(let update, let plan):
            var records: RegisteredRecords?
            do throws(DiscoveryError) {
                let built = try build(update, plan: plan, txt: txt, now: dns.clock(), id: DNSClient.randomID())
                records = built.records
                return .answered(
                    .success(try await dns.send(built.message, key: key, servers: built.servers, describing: built.what)),
                    records: records)
            } catch {
                return .answered(.failure(error), records: records)
            }
        case .readEarlier(let name, let plan):
            do throws(DiscoveryError) {
                let (_, instance) = try names(name, zone: plan.zone.name)
                let srv = try await dns.records(instance, DNSType.srv, servers: plan.servers, recursion: false)
                let txtRecords = try await dns.records(instance, DNSType.txt, servers: plan.servers, recursion: false)
                return .earlierRead(
                    .success(Self.earlierRegistration(srv: srv, txt: txtRecords, host: plan.host, fingerprint: txt["fp"])))
            } catch {
                return .earlierRead(.failure(error))
            }
        case .locate, .wait, .report, .finished:
            return nil
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
