import Logging
import MDNSCore
import Scheduling

/// An instance found in a unicast domain, with its TXT record (the browser reads it to hide expired
/// instances and to tell who published it).
struct WideAreaInstance: Sendable, Hashable {
    var identity: ServiceIdentity
    var txt: TXTRecord
    /// The `expires` TXT value (seconds since the epoch), when the publisher set one.
    var expires: UInt64?
    /// The SRV record's port (nil when it has none): with `fp`, what tells that two places hold
    /// the same service.
    var port: UInt16?

    func isExpired(now: UInt64) -> Bool { expires.map { $0 < now } ?? false }

    /// The same service as `other` as an app sees it: name, port and TXT (whose `fp` names the
    /// owner's key) — all but the `expires` value, which every refresh moves.
    func isSameService(as other: WideAreaInstance) -> Bool {
        var mine = txt
        var theirs = other.txt
        mine.remove(expiresKey)
        theirs.remove(expiresKey)
        return identity == other.identity && port == other.port && mine == theirs
    }
}

/// What a unicast browse reports.
enum WideAreaBrowseEvent: Sendable {
    case added(WideAreaInstance)
    case removed(WideAreaInstance)
    /// The first poll is done (also when the domain turned out empty or missing, or unreachable).
    case allForNow
}

/// Browses one service type in one unicast DNS domain. BIND has neither DNS Push (RFC 8765) nor
/// long-lived queries, so it polls: the zone's SOA serial every poll interval (jittered to 80–100 %),
/// and the type's PTR set only when the serial changed (TCP when the set does not fit a datagram).
/// New instances' TXT records are read (32 at a time); an instance whose `expires` passed is hidden
/// (its TXT is read again when the serial changes, and when its expiry passes if it was visible).
/// A domain that is missing or empty is "all for now" with nothing in it; a server that does not
/// answer keeps what was seen and is asked again at the next poll.
final class WideAreaBrowse: Sendable {
    let wideArea: WideArea
    let domain: String
    let type: String
    let onEvent: @Sendable (WideAreaBrowseEvent) -> Void
    /// Sees every failed poll (tests); nil in the library, which logs the first of a kind.
    let onPollFailed: (@Sendable (DiscoveryError) -> Void)?

    init(
        wideArea: WideArea, domain: String, type: String, onPollFailed: (@Sendable (DiscoveryError) -> Void)? = nil,
        onEvent: @escaping @Sendable (WideAreaBrowseEvent) -> Void
    ) {
        self.wideArea = wideArea
        self.domain = domain
        self.type = type
        self.onPollFailed = onPollFailed
        self.onEvent = onEvent
    }

    /// Starts browsing; cancelling the task stops it.
    func start() -> Task<Void, Never> {
        Task { await self.run() }
    }

    private var logger: Logger { wideArea.logger }

    /// Carries out `UnicastBrowseMachine`'s actions until the browse is stopped (cancelled).
    func run() async {
        guard let reader = UnicastBrowseReader(dns: wideArea.dns, domain: domain, type: type) else {
            onEvent(.allForNow)
            return
        }
        let domainName = reader.domainName
        var machine = UnicastBrowseMachine()
        let timer = Wakeup(scheduler: wideArea.scheduler)
        var actions = machine.apply(.start)
        while !Task.isCancelled {
            var input: UnicastBrowseMachine.Input?
            for action in actions {
                switch action {
                case .added(let instance): onEvent(.added(instance))
                case .removed(let instance): onEvent(.removed(instance))
                case .allForNow: onEvent(.allForNow)
                case .pollFailed(let error, let firstTime):
                    onPollFailed?(error)
                    if firstTime {
                        // A missing domain is an empty one; other problems are logged once until they change.
                        logger.debug(
                            "wide-area browse poll failed", metadata: ["domain": "\(domain)", "type": "\(type)", "error": "\(error.message)"])
                    }
                    wideArea.forgetZone(of: domainName)
                case .askSerial, .readNames, .readInstances:
                    input = await reader.answer(action, now: wideArea.dns.clock) {
                        () async throws(DiscoveryError) -> [DNSServerAddress] in try await self.wideArea.zone(of: domainName).servers
                    }
                case .wait:
                    // A timer of the wide area's clock, not a sleeping task; cancelling the browse ends it at once.
                    let interval = wideArea.settings.pollInterval
                    _ = await timer.wait(interval * wideArea.scheduler.random(in: 0.8...1.0))
                    input = .woke
                }
            }
            guard let input, !Task.isCancelled else { return }
            actions = machine.apply(input)
        }
    }
}

/// The reads of one unicast browse (one service type in one domain) — the zone's serial, the
/// type's PTR set, instances' TXT and SRV — answered as `UnicastBrowseMachine` takes them.
/// `WideAreaBrowse` uses it against the network; the unit tests against a server in memory.
struct UnicastBrowseReader: Sendable {
    let dns: UnicastDNS
    let domain: String
    let type: String
    let domainName: DNSName
    let service: DNSName

    /// nil when the domain or the type is not a valid DNS name.
    init?(dns: UnicastDNS, domain: String, type: String) {
        guard let domainName = DNSName(domain), let typeName = DNSName(type),
            let service = DNSName(labels: typeName.labels + domainName.labels)
        else { return nil }
        (self.dns, self.domain, self.type, self.domainName, self.service) = (dns, domain, type, domainName, service)
    }

    /// Carries out a read `UnicastBrowseMachine` asked for and returns the input that answers it
    /// (nil for an action that is not a read). `servers`: where the zone is (asked for the serial);
    /// `now`: the time the serial's answer carries (seconds since the epoch, for expiries).
    func answer(
        _ action: UnicastBrowseMachine.Action, now: () -> UInt64,
        servers: () async throws(DiscoveryError) -> [DNSServerAddress]
    ) async -> UnicastBrowseMachine.Input? {
        switch action {
        case .askSerial:
            do throws(DiscoveryError) {
                let servers = try await servers()
                let serial = try await serial(servers: servers)
                return .serial(.success(.init(serial: serial, servers: servers)), now: now())
            } catch {
                return .serial(.failure(error), now: now())
            }
        case .readNames(let servers):
            do throws(DiscoveryError) {
                return .names(.success(try await instanceNames(servers: servers)))
            } catch {
                return .names(.failure(error))
            }
        case .readInstances(let names, let servers):
            let (found, failed) = await readInstances(names, servers: servers)
            return .read(.init(found: found, failed: failed))
        case .added, .removed, .allForNow, .pollFailed, .wait:
            return nil
        }
    }

    /// The zone's serial, asked of `servers`.
    func serial(servers: [DNSServerAddress]) async throws(DiscoveryError) -> UInt32 {
        try await dns.zone(of: domainName, servers: servers).serial
    }

    /// The instance names (first labels) of the type's PTR set.
    func instanceNames(servers: [DNSServerAddress]) async throws(DiscoveryError) -> Set<String> {
        let records = try await dns.records(service, DNSType.ptr, servers: servers, recursion: false)
        var names: Set<String> = []
        for record in records {
            guard case .ptr(let target) = record.data, target.parent == service, let label = target.labels.first else { continue }
            names.insert(String(decoding: label, as: UTF8.self))
        }
        return names
    }

    /// Reads the TXT and SRV records of `names`, at most 32 instances in flight. Instances without
    /// a TXT record are left out; those whose query got no answer are returned in `failed`.
    func readInstances(_ names: [String], servers: [DNSServerAddress]) async
        -> (found: [String: WideAreaInstance], failed: Set<String>)
    {
        enum Read: Sendable {
            case found(WideAreaInstance)
            case missing
            case failed
        }
        var result: [String: WideAreaInstance] = [:]
        var failed: Set<String> = []
        var pending = names[...]
        await withTaskGroup(of: (String, Read).self) { group in
            func add(_ name: String) {
                group.addTask {
                    guard let instance = DNSName(instance: name, service: service) else { return (name, .missing) }
                    let records: [ResourceRecord]
                    do throws(DiscoveryError) {
                        records = try await dns.records(instance, DNSType.txt, servers: servers, recursion: false)
                    } catch {
                        return (name, .failed)
                    }
                    // No TXT (a PTR left behind, or deleted meanwhile): not an instance to show.
                    guard !records.isEmpty else { return (name, .missing) }
                    let srv = (try? await dns.records(instance, DNSType.srv, servers: servers, recursion: false)) ?? []
                    let strings: [[UInt8]]
                    if case .txt(let values)? = records.first?.data { strings = values } else { strings = [] }
                    let txt = TXTRecord(wireEntries: strings)
                    var port: UInt16?
                    if case .srv(_, _, let value, _)? = srv.first?.data { port = value }
                    let identity = ServiceIdentity(name: name, type: type, domain: domain)
                    return (name, .found(WideAreaInstance(identity: identity, txt: txt, expires: txt[expiresKey].flatMap { UInt64($0) }, port: port)))
                }
            }
            for _ in 0..<32 {
                guard let name = pending.popFirst() else { break }
                add(name)
            }
            for await (name, read) in group {
                switch read {
                case .found(let instance): result[name] = instance
                case .failed: failed.insert(name)
                case .missing: break
                }
                if let next = pending.popFirst() { add(next) }
            }
        }
        return (result, failed)
    }
}
