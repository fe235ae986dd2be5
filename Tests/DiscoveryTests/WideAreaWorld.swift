import Locks
import Logging

@testable import Discovery
@testable import MDNSCore

/// Hosts that register and browse in one zone of a `FakeDNSServer`, on a fake clock, in the style
/// of `FakeNetwork`: each host's `RegistrationMachine` and each browser's `UnicastBrowseMachine`
/// have their actions carried out the way `WideAreaRegistration` and `WideAreaBrowse` carry them
/// out — with the same code: the zone and update server found by `UnicastDNS`, the messages built
/// by `RegistrationUpdates`, signed and their answers checked by `UnicastDNS.send`, the browse reads
/// by `UnicastBrowseReader` — only the socket is the server in memory and a wait moves the clock.
/// A host can crash (it just stops, its records left behind) or stop (it deletes them).
final class WideAreaWorld {
    struct Host {
        var machine: RegistrationMachine
        let updates: RegistrationUpdates
        let key: TSIGKey
        let name: DNSName
        var txt: TXTRecord
        /// When its wait ends (milliseconds); nil while it has an action to carry out.
        var wakeAt: UInt64?
        var next: RegistrationMachine.Action?
        var reports: [(at: UInt64, report: RegistrationMachine.Report)] = []
        var crashed = false
        var finished = false

        func isDue(at now: UInt64) -> Bool {
            next != nil && !crashed && !finished && wakeAt.map { $0 <= now } ?? true
        }
    }

    struct Browser {
        var machine = UnicastBrowseMachine()
        let reader: UnicastBrowseReader
        var wakeAt: UInt64?
        var next: UnicastBrowseMachine.Action?
        var events: [(at: UInt64, action: UnicastBrowseMachine.Action)] = []
        /// Where the zone is, and when that was learnt (WideArea keeps it for 15 minutes).
        var zone: (servers: [DNSServerAddress], at: UInt64)?

        func isDue(at now: UInt64) -> Bool { next != nil && wakeAt.map { $0 <= now } ?? true }
    }

    static let zoneName = "lab.home.arpa"
    static let type = "_chat._tcp"
    let server: FakeDNSServer
    let dns: UnicastDNS
    let settings: WideAreaConfiguration
    private(set) var hosts: [Host] = []
    private(set) var browsers: [Browser] = []

    /// - Parameters:
    ///   - keys: The host names whose keys the server knows (a key is named after its host).
    ///   - policy: The server's update policy (key name, changed name).
    init(
        knownHosts: [String] = ["hosta", "hostb", "hostc"], lease: Duration = .seconds(100),
        policy: @escaping @Sendable (DNSName, DNSName) -> Bool = { _, _ in true }
    ) {
        let now: UInt64 = 1_800_000_000
        server = FakeDNSServer(
            zone: Self.zoneName, keys: knownHosts.map { Self.key(for: $0) }, now: now, policy: policy)
        settings = WideAreaConfiguration(
            domains: [Self.zoneName], servers: [server.address], pollInterval: .seconds(10), lease: lease)
        let server = self.server
        dns = UnicastDNS(settings: settings, logger: .init(label: "wide-area-world"), exchanger: server, clock: { server.now })
    }

    /// The key of `host` (named `host.lab.home.arpa`, a secret of its own).
    static func key(for host: String, secret: UInt8 = 7) -> TSIGKey {
        try! TSIGKey(name: "\(host).\(zoneName)", secret: [UInt8](repeating: secret, count: 32) + Array(host.utf8))
    }

    var milliseconds: UInt64 { server.state.withLock { $0.milliseconds } }
    var seconds: UInt64 { milliseconds / 1_000 }

    // MARK: Hosts

    /// A host that starts registering `instance` now; returns its index.
    @discardableResult
    func addHost(_ host: String, instance: String = "Lobby", key: TSIGKey? = nil, fingerprint: String? = nil) -> Int {
        var machine = RegistrationMachine(name: instance, lease: settings.lease)
        let actions = machine.apply(.start)
        var txt = TXTRecord()
        txt["fp"] = fingerprint ?? "\(host)-fp"
        hosts.append(
            Host(
                machine: machine,
                updates: RegistrationUpdates(
                    type: Self.type, port: 4242, ttl: settings.recordTTL, lease: settings.lease, domain: Self.zoneName),
                key: key ?? Self.key(for: host), name: DNSName("\(host).\(Self.zoneName)")!, txt: txt))
        take(actions, host: hosts.count - 1)
        return hosts.count - 1
    }

    /// The host stops as a process that crashes does: nothing more is sent.
    func crash(_ index: Int) { hosts[index].crashed = true }

    /// The host is stopped (its records deleted, as `stop()` does); runs until it finished.
    func stop(_ index: Int) async {
        precondition(hosts[index].next == nil || hosts[index].wakeAt != nil, "a stop is fed between two actions")
        hosts[index].wakeAt = nil
        take(hosts[index].machine.apply(.stop), host: index)
        for _ in 0..<16 where !hosts[index].finished { await step(host: index) }
    }

    private func take(_ actions: [RegistrationMachine.Action], host index: Int) {
        hosts[index].next = nil
        for action in actions {
            switch action {
            case .report(let report): hosts[index].reports.append((seconds, report))
            case .finished: hosts[index].finished = true
            case .wait(let duration):
                hosts[index].wakeAt = milliseconds + UInt64(duration.components.seconds) * 1_000
                    + UInt64(duration.components.attoseconds / 1_000_000_000_000_000)
                hosts[index].next = action
            default: hosts[index].next = action
            }
        }
    }

    private func step(host index: Int) async {
        guard let action = hosts[index].next, !hosts[index].crashed, !hosts[index].finished else { return }
        let host = hosts[index]
        let input: RegistrationMachine.Input
        switch action {
        case .locate:
            do throws(DiscoveryError) {
                let zone = try await dns.zone(of: DNSName(Self.zoneName)!)
                let servers = try await dns.updateServers(for: zone)
                input = .located(.success(RegistrationPlan(zone: zone, servers: servers, host: host.name, addresses: [.v4(10, 81, 1, UInt8(10 + index))])))
            } catch {
                input = .located(.failure(error))
            }
        case .send, .readEarlier:
            guard let answer = await host.updates.answer(action, dns: dns, key: host.key, txt: host.txt) else { return }
            input = answer
        case .wait:
            guard let wakeAt = hosts[index].wakeAt, wakeAt <= milliseconds else { return }
            hosts[index].wakeAt = nil
            input = .woke
        case .report, .finished:
            return
        }
        take(hosts[index].machine.apply(input), host: index)
    }

    // MARK: Browsers

    /// A browser of the zone's chat services, starting now.
    @discardableResult
    func addBrowser() -> Int {
        var browser = Browser(reader: UnicastBrowseReader(dns: dns, domain: Self.zoneName, type: Self.type)!)
        let actions = browser.machine.apply(.start)
        browsers.append(browser)
        take(actions, browser: browsers.count - 1)
        return browsers.count - 1
    }

    private func take(_ actions: [UnicastBrowseMachine.Action], browser index: Int) {
        browsers[index].next = nil
        for action in actions {
            switch action {
            case .added, .removed, .allForNow, .pollFailed: browsers[index].events.append((seconds, action))
            case .wait:
                browsers[index].wakeAt = milliseconds + UInt64(settings.pollInterval.components.seconds) * 1_000
                browsers[index].next = action
            default: browsers[index].next = action
            }
        }
    }

    private func step(browser index: Int) async {
        guard let action = browsers[index].next else { return }
        let reader = browsers[index].reader
        let input: UnicastBrowseMachine.Input
        if case .wait = action {
            guard let wakeAt = browsers[index].wakeAt, wakeAt <= milliseconds else { return }
            browsers[index].wakeAt = nil
            input = .woke
        } else {
            let (dns, server, now) = (self.dns, self.server, self.milliseconds)
            // Where the zone is: kept for 15 minutes, as WideArea does, and asked again after a failure.
            let known = browsers[index].zone.flatMap { now - $0.at < 900_000 ? $0.servers : nil }
            let found = Locked<[DNSServerAddress]?>(nil)
            guard let answer = await reader.answer(action, now: { server.now }, servers: {
                () async throws(DiscoveryError) -> [DNSServerAddress] in
                if let known { return known }
                let servers = await dns.authoritativeServers(of: try await dns.zone(of: reader.domainName))
                found.withLock { $0 = servers }
                return servers
            }) else { return }
            if let servers = found.withLock({ $0 }) { browsers[index].zone = (servers, now) }
            if case .serial(.failure, _) = answer { browsers[index].zone = nil }
            input = answer
        }
        take(browsers[index].machine.apply(input), browser: index)
    }

    /// The names a browser shows now.
    func visible(_ index: Int) -> Set<String> { Set(browsers[index].machine.visible.keys) }

    /// When a browser said `name` was added (or removed), the first time after `since`.
    func when(_ index: Int, added: Bool, _ name: String, since: UInt64 = 0) -> UInt64? {
        browsers[index].events.first { event in
            guard event.at >= since else { return false }
            switch event.action {
            case .added(let instance): return added && instance.identity.name == name
            case .removed(let instance): return !added && instance.identity.name == name
            default: return false
            }
        }?.at
    }

    // MARK: Time

    /// Runs everyone until `seconds` more have passed: carries out every action that is due, then
    /// moves the clock to the next wake (the server's leases end on the way). Bounded.
    func run(for duration: UInt64) async {
        let end = milliseconds + duration * 1_000
        for _ in 0..<100_000 {
            // Every action that is due, one per host and browser a round (round robin: two hosts
            // that start together locate, then send their updates, together).
            for _ in 0..<1_000 {
                var progressed = false
                for index in hosts.indices where hosts[index].isDue(at: milliseconds) {
                    await step(host: index)
                    progressed = true
                }
                for index in browsers.indices where browsers[index].isDue(at: milliseconds) {
                    await step(browser: index)
                    progressed = true
                }
                if !progressed { break }
            }
            let wakes = hosts.filter { !$0.crashed && !$0.finished }.compactMap(\.wakeAt) + browsers.compactMap(\.wakeAt)
            let next = min(wakes.min() ?? end, end)
            if next >= end {
                server.advance(to: end)
                return
            }
            server.advance(to: next)
        }
    }

    /// The chat instances in the zone now (the PTR set's targets' first labels).
    var instancesInZone: Set<String> {
        let service = DNSName("\(Self.type).\(Self.zoneName)")!
        return Set(server.records(service, DNSType.ptr).compactMap { record -> String? in
            guard case .ptr(let target) = record.data, let label = target.labels.first else { return nil }
            return String(decoding: label, as: UTF8.self)
        })
    }

    /// A host's reports, without their times.
    func reports(_ index: Int) -> [RegistrationMachine.Report] { hosts[index].reports.map(\.report) }
}
