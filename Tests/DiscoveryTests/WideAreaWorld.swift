import Dispatch
import Locks
import Logging
import Scheduling
import Synchronization

@testable import Discovery
@testable import MDNSCore

/// Hosts that register and browse in one zone of a `FakeDNSServer`, on a manual clock, in the
/// style of `FakeNetwork` — with the real drivers: each host's `WideAreaRegistration` and each
/// browser's `WideAreaBrowse` run their own tasks and waits (issue 54, 2: until then this world
/// carried out their machines' actions with a copy of their loops). Only the socket is the server
/// in memory, and time moves when the world turns the clock: one timer at a time, and what it set
/// off settles — every driver waits on the clock again — before the next. So a run is the same
/// every time, and a seeded clock makes `WideAreaSimulation`'s runs replayable.
///
/// A host can crash (its link goes silent: nothing it sends arrives, its records are left behind)
/// or stop (it deletes them); a stopped host can start again.
final class WideAreaWorld: @unchecked Sendable {  // (driven by one test task at a time)
    /// A host's path to the server; silenced, nothing it sends arrives (a crashed host, as the
    /// server sees it).
    final class Link: DNSExchanging {
        let server: FakeDNSServer
        let silenced = Atomic<Bool>(false)

        init(server: FakeDNSServer) { self.server = server }

        func exchange(_ bytes: [UInt8], id: UInt16, servers: [DNSServerAddress], timeout: Duration, tcp: Bool) async
            -> Result<DNSReply, DNSExchangeError>
        {
            guard !silenced.load(ordering: .relaxed) else {
                return .failure(DNSExchangeError(servers: servers, reason: "no answer within \(timeout)"))
            }
            return await server.exchange(bytes, id: id, servers: servers, timeout: timeout, tcp: tcp)
        }
    }

    final class Host {
        let label: String
        let instance: String
        let key: TSIGKey
        let wideArea: WideArea
        let link: Link
        var txt: TXTRecord
        var registration: WideAreaRegistration?
        var handle: PublishedService?
        /// Every report of its registrations, with the server's time (seconds since the epoch).
        let said = Locked<[(at: UInt64, report: RegistrationMachine.Report)]>([])

        init(label: String, instance: String, key: TSIGKey, wideArea: WideArea, link: Link, txt: TXTRecord) {
            (self.label, self.instance, self.key, self.wideArea, self.link, self.txt) = (label, instance, key, wideArea, link, txt)
        }

        var reports: [(at: UInt64, report: RegistrationMachine.Report)] { said.withLock { $0 } }
        var isRunning: Bool { registration != nil }
        /// The name its publication says it registered (nil: not registered, or failed).
        var registeredName: String? {
            handle?.wideAreaNames[WideAreaWorld.zoneName]
        }
    }

    final class Browser {
        let browse: WideAreaBrowse
        let task: Task<Void, Never>
        /// What it said, with the server's time.
        let events: Locked<[(at: UInt64, event: WideAreaBrowseEvent)]>
        let failures: Locked<[(at: UInt64, error: DiscoveryError)]>
        /// What it shows now, by name.
        let shown: Locked<[String: WideAreaInstance]>

        init(
            browse: WideAreaBrowse, task: Task<Void, Never>, events: Locked<[(at: UInt64, event: WideAreaBrowseEvent)]>,
            failures: Locked<[(at: UInt64, error: DiscoveryError)]>, shown: Locked<[String: WideAreaInstance]>
        ) {
            (self.browse, self.task, self.events, self.failures, self.shown) = (browse, task, events, failures, shown)
        }
    }

    /// A `MergedBrowse` of the zone (the library's browse of a unicast domain: its own
    /// `WideAreaBrowse` and `MergeMachine`), and what its event stream says, read by a task.
    final class Merged: Sendable {
        let browse: MergedBrowse
        let consumer: Task<Void, Never>
        /// The names it shows now.
        let shown: Locked<Set<String>>
        /// A tick after each event the consumer took (one waiter at a time reads them).
        let changes: AsyncStream<Void>

        init(browse: MergedBrowse, consumer: Task<Void, Never>, shown: Locked<Set<String>>, changes: AsyncStream<Void>) {
            (self.browse, self.consumer, self.shown, self.changes) = (browse, consumer, shown, changes)
        }
    }

    /// The publication's owner (a backend): nothing to do for a wide-area-only publication.
    final class NoBackend: PublicationOwner {
        let queue = DispatchQueue(label: "no-backend")
        func updateTXT(_ txt: TXTRecord, of service: PublishedService) -> Result<Void, DiscoveryError> { .success(()) }
        func unpublish(_ service: PublishedService) {}
        func notEstablishedMessage(_ service: PublishedService, timeout: Duration) -> String { "" }
    }

    /// A world without a seed is one fixed run: jitter at its top (a poll every 10 s, not 8–10 s),
    /// and of the timers due at one instant the last scheduled fires first.
    struct NoJitter: RandomNumberGenerator, Sendable {
        mutating func next() -> UInt64 { .max }
    }

    struct Broken: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    static let zoneName = "lab.home.arpa"
    static let type = "_chat._tcp"
    static let clockStart: UInt64 = 1_000_000_000
    static let serverStart: UInt64 = 1_800_000_000
    let server: FakeDNSServer
    let settings: WideAreaConfiguration
    let clock: ManualScheduler
    let logger: Logger
    private(set) var hosts: [Host] = []
    private(set) var browsers: [Browser] = []
    private(set) var merged: [Merged] = []
    /// Timers fired so far.
    private(set) var timersFired = 0
    /// Called with the deadline of each timer fired (the simulation's trace).
    var onTimer: ((UInt64) -> Void)?

    /// - Parameters:
    ///   - knownHosts: The host names whose keys the server knows (a key is named after its host).
    ///   - policy: The server's update policy (key name, changed name).
    ///   - clock: A seeded one for a simulation; else no jitter, fixed order.
    init(
        knownHosts: [String] = ["hosta", "hostb", "hostc"], lease: Duration = .seconds(100),
        policy: @escaping @Sendable (DNSName, DNSName) -> Bool = { _, _ in true },
        clock: ManualScheduler = ManualScheduler(start: WideAreaWorld.clockStart, choosingWith: NoJitter())
    ) {
        server = FakeDNSServer(zone: Self.zoneName, keys: knownHosts.map { Self.key(for: $0) }, now: Self.serverStart, policy: policy)
        settings = WideAreaConfiguration(domains: [Self.zoneName], servers: [server.address], pollInterval: .seconds(10), lease: lease)
        self.clock = clock
        var logger = Logger(label: "wide-area-world")
        logger.logLevel = .critical
        self.logger = logger
    }

    /// The key of `host` (named `host.lab.home.arpa`, a secret of its own).
    static func key(for host: String, secret: UInt8 = 7) -> TSIGKey {
        try! TSIGKey(name: "\(host).\(zoneName)", secret: [UInt8](repeating: secret, count: 32) + Array(host.utf8))
    }

    var milliseconds: UInt64 { server.state.withLock { $0.milliseconds } }
    var seconds: UInt64 { milliseconds / 1_000 }

    /// A wide area of its own for a host (its label, its address), reaching the server through `link`.
    func wideArea(label: String, index: Int, link: any DNSExchanging) -> WideArea {
        var configuration = DiscoveryConfiguration(advertisedAddresses: [.v4(10, 81, 1, UInt8(10 + index))])
        configuration.wideArea = settings
        let server = self.server
        let dns = UnicastDNS(settings: settings, logger: logger, exchanger: link, clock: { server.now })
        return WideArea(configuration: configuration, logger: logger, hostLabel: label, dns: dns, scheduler: clock, watchesAddresses: false)
    }

    // MARK: Hosts

    /// A host that starts registering `instance` now (and has, when this returns); its index.
    @discardableResult
    func addHost(
        _ label: String, instance: String = "Lobby", key: TSIGKey? = nil, fingerprint: String? = nil, start: Bool = true
    ) async throws -> Int {
        let link = Link(server: server)
        var txt = TXTRecord()
        txt["fp"] = fingerprint ?? "\(label)-fp"
        hosts.append(
            Host(
                label: label, instance: instance, key: key ?? Self.key(for: label),
                wideArea: wideArea(label: label, index: hosts.count, link: link), link: link, txt: txt))
        if start { try await self.start(hosts.count - 1) }
        return hosts.count - 1
    }

    /// Starts a host that is not running: a new registration (and publication) of its instance.
    func start(_ index: Int) async throws {
        launch(index)
        try await settle("after \(hosts[index].label) started")
    }

    /// Starts several hosts at the same instant, their tasks racing, and settles once.
    func startTogether(_ indices: [Int]) async throws {
        for index in indices { launch(index) }
        try await settle("after \(indices.map { hosts[$0].label }) started together")
    }

    private func launch(_ index: Int) {
        let host = hosts[index]
        precondition(!host.isRunning, "\(host.label) runs already")
        let handle = PublishedService(owner: NoBackend(), name: host.instance, type: Self.type, port: 4242, txt: host.txt)
        let (server, said) = (self.server, host.said)
        let registration = WideAreaRegistration(
            wideArea: host.wideArea, domain: Self.zoneName, name: host.instance, type: Self.type, port: 4242, txt: host.txt,
            key: host.key, handle: handle, logger: logger, onReport: { report in said.withLock { $0.append((server.now, report)) } })
        host.handle = handle
        host.registration = registration
        host.wideArea.track(registration)  // told of address changes, as `WideArea.register` does
        registration.start()
    }

    /// The host crashes: from now on nothing it sends arrives (its task goes on, unheard).
    func crash(_ index: Int) { hosts[index].link.silenced.store(true, ordering: .relaxed) }

    /// The host is stopped (its records deleted, as `stop()` does), and has when this returns.
    func stop(_ index: Int) async throws {
        await hosts[index].registration?.stop()
        hosts[index].registration = nil
        hosts[index].handle = nil
        try checkWaits("after \(hosts[index].label) stopped")
    }

    /// A new TXT for a running host (a refresh at once), settled.
    func updateTXT(_ index: Int, _ txt: TXTRecord) async throws {
        hosts[index].txt = txt
        guard let registration = hosts[index].registration else { return }
        registration.updateTXT(txt)
        try await settle("after \(hosts[index].label)'s TXT change")
    }

    /// A host's reports, without their times.
    func reports(_ index: Int) -> [RegistrationMachine.Report] { hosts[index].reports.map(\.report) }

    // MARK: Browsers

    /// A browser of the zone's chat services (its own wide area), started now and settled.
    @discardableResult
    func addBrowser() async throws -> Int {
        let area = wideArea(label: "observer\(browsers.count)", index: 100 + browsers.count, link: server)
        let server = self.server
        let events = Locked<[(at: UInt64, event: WideAreaBrowseEvent)]>([])
        let failures = Locked<[(at: UInt64, error: DiscoveryError)]>([])
        let shown = Locked<[String: WideAreaInstance]>([:])
        let browse = WideAreaBrowse(
            wideArea: area, domain: Self.zoneName, type: Self.type,
            onPollFailed: { error in failures.withLock { $0.append((server.now, error)) } }
        ) { event in
            events.withLock { $0.append((server.now, event)) }
            switch event {
            case .added(let instance): shown.withLock { $0[instance.identity.name] = instance }
            case .removed(let instance): shown.withLock { $0[instance.identity.name] = nil }
            case .allForNow: break
            }
        }
        browsers.append(Browser(browse: browse, task: browse.start(), events: events, failures: failures, shown: shown))
        try await settle("after a browser started")
        return browsers.count - 1
    }

    /// A merged browse of the zone, as `ServiceDiscovery.browse(type:domain:)` starts one for a
    /// unicast domain, started now and settled.
    @discardableResult
    func addMergedBrowser() async throws -> Int {
        let area = wideArea(label: "merged\(merged.count)", index: 200 + merged.count, link: server)
        let (stream, continuation) = AsyncStream.makeStream(of: BrowseEvent.self)
        let browse = MergedBrowse(
            type: Self.type, includesLink: false, domains: [Self.zoneName], wideArea: area, logger: logger, continuation: continuation)
        let shown = Locked<Set<String>>([])
        let (changes, tick) = AsyncStream.makeStream(of: Void.self)
        let consumer = Task {
            for await event in stream {
                switch event {
                case .added(let service), .updated(let service): _ = shown.withLock { $0.insert(service.identity.name) }
                case .removed(let service): _ = shown.withLock { $0.remove(service.identity.name) }
                case .allForNow, .failed: break
                }
                tick.yield()
            }
            tick.finish()
        }
        browse.start(backend: nil, request: BrowseRequest(type: Self.type, domain: Self.zoneName, interface: nil, ipVersion: .any))
        merged.append(Merged(browse: browse, consumer: consumer, shown: shown, changes: changes))
        try await settle("after a merged browser started")
        return merged.count - 1
    }

    /// A merged browse of the link (through `backend`) and the zone, not started, and its events:
    /// for a test that drives it itself.
    func mergedBrowse(link backend: any DiscoveryBackend) -> (MergedBrowse, AsyncStream<BrowseEvent>) {
        let (stream, continuation) = AsyncStream.makeStream(of: BrowseEvent.self)
        let browse = MergedBrowse(
            type: Self.type, includesLink: true, domains: [Self.zoneName], wideArea: wideArea(label: "linked", index: 100, link: server),
            logger: logger, continuation: continuation)
        return (browse, stream)
    }

    /// Waits (real time, bounded) until a merged browser shows `names`: its events cross a queue
    /// and a stream after its browse's, so they are waited for, not read at once. Once per merged
    /// browser when it times out (the cancelled wait ends its tick stream).
    func mergedShows(_ index: Int, _ names: Set<String>, within timeout: Duration = .seconds(10)) async -> Bool {
        let one = merged[index]
        if one.shown.withLock({ $0 }) == names { return true }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                for await _ in one.changes where one.shown.withLock({ $0 }) == names { return true }
                return false
            }
            group.addTask {
                await DispatchScheduler().sleep(for: timeout)  // the deadline (real time; ends when cancelled)
                return false
            }
            let shows = await group.next() ?? false
            group.cancelAll()
            return shows
        }
    }

    /// The names a browser shows now.
    func visible(_ index: Int) -> Set<String> { Set(browsers[index].shown.withLock { $0.keys }) }

    /// When a browser said `name` was added (or removed), the first time after `since`.
    func when(_ index: Int, added: Bool, _ name: String, since: UInt64 = 0) -> UInt64? {
        browsers[index].events.withLock { $0 }.first { event in
            guard event.at >= since else { return false }
            switch event.event {
            case .added(let instance): return added && instance.identity.name == name
            case .removed(let instance): return !added && instance.identity.name == name
            case .allForNow: return false
            }
        }?.at
    }

    // MARK: Time

    /// Turns the clock `seconds` forward, one timer at a time (the server's clock with it: leases
    /// end on the way), each followed by what it set off.
    func run(for seconds: UInt64) async throws {
        let target = clock.now + seconds * 1_000_000_000
        while let deadline = clock.nextDeadline, deadline <= target {
            server.advance(to: serverMilliseconds(at: deadline))
            clock.runNext(through: deadline)
            timersFired += 1
            onTimer?(deadline)
            try await settle("after a timer at \(secondsSinceStart(deadline)) s")
        }
        server.advance(to: serverMilliseconds(at: target))
        clock.advance(to: target)
    }

    /// Stops every host and browser; no timer may be left.
    func shutdown() async throws {
        for index in hosts.indices where hosts[index].isRunning { try await stop(index) }
        for browser in browsers {
            browser.task.cancel()
            await browser.task.value
        }
        browsers = []
        for one in merged {
            await one.browse.stopped()  // its domain browse's task ended, not only cancelled
            await one.consumer.value  // the stream ended at the stop
        }
        merged = []
        guard clock.pendingCount == 0 else { throw Broken("\(clock.pendingCount) timers left after everything stopped") }
    }

    /// The timers the drivers wait on: one per running registration (a crashed host's too), one
    /// per browser and one per merged browser (its domain's browse).
    var expectedWaits: Int { hosts.filter(\.isRunning).count + browsers.count + merged.count }

    /// Waits (real time, bounded) until every driver waits on the clock again, and checks that
    /// none waits twice.
    func settle(_ when: String) async throws {
        guard await clock.waitForPending(expectedWaits, within: .seconds(10)) else {
            throw Broken("\(when): \(clock.pendingCount) timers pending, \(expectedWaits) expected — a driver never waited on the clock again")
        }
        try checkWaits(when)
    }

    func checkWaits(_ when: String) throws {
        let pending = clock.pendingDeadlines
        guard pending.count == expectedWaits else {
            let at = pending.map { secondsSinceStart($0) }.joined(separator: ", ")
            throw Broken("\(when): \(pending.count) timers pending (due at \(at) s), \(expectedWaits) expected (a leaked or a missing wait)")
        }
    }

    func secondsSinceStart(_ nanoseconds: UInt64) -> String {
        String(format: "%.3f", Double(nanoseconds &- Self.clockStart) / 1e9)
    }

    private func serverMilliseconds(at nanoseconds: UInt64) -> UInt64 {
        Self.serverStart * 1_000 + (nanoseconds &- Self.clockStart) / 1_000_000
    }

    // MARK: The zone

    /// The chat instances in the zone now (the PTR set's targets' first labels).
    var instancesInZone: Set<String> { Set(zone.keys) }

    /// The instances in the zone: name → the hosts its SRV records point at, and its TXT `fp`s.
    var zone: [String: (targets: Set<String>, fps: Set<String>)] {
        let service = DNSName("\(Self.type).\(Self.zoneName)")!
        var result: [String: (targets: Set<String>, fps: Set<String>)] = [:]
        for record in server.records(service, DNSType.ptr) {
            guard case .ptr(let target) = record.data, let label = target.labels.first else { continue }
            var targets = Set<String>()
            var fps = Set<String>()
            for srv in server.records(target, DNSType.srv) {
                if case .srv(_, _, _, let host) = srv.data, let first = host.labels.first { targets.insert(String(decoding: first, as: UTF8.self)) }
            }
            for txt in server.records(target, DNSType.txt) {
                if case .txt(let strings) = txt.data, let fp = TXTRecord(wireEntries: strings)["fp"] { fps.insert(fp) }
            }
            result[String(decoding: label, as: UTF8.self)] = (targets, fps)
        }
        return result
    }
}
