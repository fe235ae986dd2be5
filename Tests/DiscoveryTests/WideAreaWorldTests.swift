import Testing

@testable import Discovery
@testable import MDNSCore

/// Wide-area registration and browsing against a DNS server in memory, on a manual clock (issue 46,
/// 1): hours of leases, crashes and outages in milliseconds, with the real drivers — their tasks,
/// their waits, their message building, signing and answer checking (`WideAreaWorld`; issue 54, 2). The BIND lab (WideAreaIntegrationTests) stays
/// the proof against a real server; these check the paths it cannot wait for.
@Suite struct WideAreaWorldTests {
    /// Registered once, then refreshed at half the lease: after 1,000 s (ten leases) the records
    /// are still there — the server drops a record whose lease ends — with a fresh `expires`.
    @Test func aRegistrationIsRefreshedAtHalfTheLeaseAndOutlivesManyLeases() async throws {
        let world = WideAreaWorld()
        let host = try await world.addHost("hosta")
        try await world.run(for: 1_000)
        #expect(world.reports(host) == [.registered(name: "Lobby")])
        #expect(world.instancesInZone == ["Lobby"])
        let updates = world.server.state.withLock { $0.updates }
        let start = try #require(updates.first?.at)
        // (a turn runs what is due at its end: the refresh at 1,000 s too)
        #expect(updates.map { $0.at - start } == Array(stride(from: 0, through: 1_000, by: 50)), "registered at 0 s, refreshed every 50 s")
        #expect(updates.allSatisfy { $0.rcode == DNSRcode.noError })
        let instance = DNSName(instance: "Lobby", service: DNSName("_chat._tcp.lab.home.arpa")!)!
        let txt = try #require(world.server.records(instance, DNSType.txt).first)
        guard case .txt(let strings) = txt.data else { return }
        let expires = try #require(TXTRecord(wireEntries: strings)["expires"].flatMap { UInt64($0) })
        #expect(expires > world.seconds && expires <= world.seconds + 100)
        #expect(world.server.records(DNSName("hosta.lab.home.arpa")!, DNSType.a).count == 1)
    }

    /// Two hosts register the same name at the same moment: the second is renamed, both are in
    /// the zone, and a browser shows both.
    @Test func twoHostsWithOneNameEndWithTwoNames() async throws {
        let world = WideAreaWorld()
        let browser = try await world.addBrowser()
        let a = try await world.addHost("hosta")
        let b = try await world.addHost("hostb")
        try await world.run(for: 30)
        #expect(world.reports(a) == [.registered(name: "Lobby")])
        #expect(world.reports(b) == [.renamed(from: "Lobby", to: "Lobby #2"), .registered(name: "Lobby #2")])
        #expect(world.instancesInZone == ["Lobby", "Lobby #2"])
        #expect(world.visible(browser) == ["Lobby", "Lobby #2"])
    }

    /// A host that crashes leaves its records; a server that honours the Update Lease drops them
    /// when it ends, the serial changes, and a browser removes the instance at its next poll. The
    /// name is free again: another host takes it without a rename.
    @Test func aCrashedHostsRecordsEndWithTheirLeaseAndTheNameIsFreeAgain() async throws {
        let world = WideAreaWorld()
        let browser = try await world.addBrowser()
        let a = try await world.addHost("hosta")
        try await world.run(for: 20)
        #expect(world.visible(browser) == ["Lobby"])
        let lastRefresh = world.server.state.withLock { $0.updates.last!.at }
        world.crash(a)
        try await world.run(for: 200)
        #expect(world.instancesInZone.isEmpty)
        let removed = try #require(world.when(browser, added: false, "Lobby"))
        // The lease ran from the last update; the browser saw the change within one poll.
        #expect(removed >= lastRefresh + 100 && removed <= lastRefresh + 100 + 10, "removed at \(removed), last refresh \(lastRefresh)")
        let b = try await world.addHost("hostb")
        try await world.run(for: 10)
        #expect(world.reports(b) == [.registered(name: "Lobby")])
        #expect(world.visible(browser) == ["Lobby"])
    }

    /// BIND keeps records whatever the lease: a crashed host's records stay, and the browser hides
    /// the instance once the `expires` its TXT carries has passed, within one poll.
    @Test func withoutLeasesABrowserHidesAnInstanceWhoseExpiryPassed() async throws {
        let world = WideAreaWorld()
        world.server.state.withLock { $0.honorsLeases = false }
        let browser = try await world.addBrowser()
        let a = try await world.addHost("hosta")
        try await world.run(for: 20)
        #expect(world.visible(browser) == ["Lobby"])
        let crashedAt = world.seconds
        world.crash(a)
        try await world.run(for: 200)
        #expect(world.instancesInZone == ["Lobby"], "the ghost stays in the zone")
        #expect(world.visible(browser).isEmpty)
        let removed = try #require(world.when(browser, added: false, "Lobby"))
        #expect(removed > crashedAt + 50 && removed <= crashedAt + 100 + 10, "hidden at \(removed), crashed at \(crashedAt)")
    }

    /// A host restarted after a crash finds its own records (same host, same `fp`) under its name
    /// and replaces them: no rename, one SRV.
    @Test func aRestartedHostReplacesItsOwnStaleRecords() async throws {
        let world = WideAreaWorld()
        let first = try await world.addHost("hosta")
        try await world.run(for: 5)
        world.crash(first)
        let second = try await world.addHost("hosta")
        try await world.run(for: 5)
        #expect(world.reports(second) == [.replacedStale(name: "Lobby")])
        let instance = DNSName(instance: "Lobby", service: DNSName("_chat._tcp.lab.home.arpa")!)!
        #expect(world.server.records(instance, DNSType.srv).count == 1)
        #expect(world.instancesInZone == ["Lobby"])
        // Another host with the same name is someone else: renamed.
        let other = try await world.addHost("hostb")
        try await world.run(for: 5)
        #expect(world.reports(other).first == .renamed(from: "Lobby", to: "Lobby #2"))
    }

    /// The server does not answer for the first 40 s: the registration retries after 1, 2, 4, 8
    /// and 16 s, then every quarter of the lease, says the failure once, and registers once the
    /// server is back; a browser keeps polling and shows it then.
    @Test func aServerDownAtTheStartIsRetriedWithBackOffAndRegistersOnceBack() async throws {
        let world = WideAreaWorld()
        world.server.state.withLock { $0.down = true }
        let browser = try await world.addBrowser()
        let host = try await world.addHost("hosta")
        try await world.run(for: 40)
        world.server.state.withLock { $0.down = false }
        try await world.run(for: 30)
        let reports = world.hosts[host].reports
        guard case .failed(let error, _) = reports.first?.report else {
            Issue.record("no failure said: \(reports)")
            return
        }
        #expect(error.code == .dnsUnreachable)
        #expect(reports.count == 2, "the failure said once: \(reports)")
        // Tried at 0, 1, 3, 7, 15, 31 s (all down), then 25 s later: 56 s.
        #expect(reports.last?.report == .registered(name: "Lobby") && reports.last?.at == 1_800_000_056)
        #expect(!world.browsers[browser].failures.withLock { $0 }.isEmpty, "the browser's polls did not fail while the server was down")
        #expect(world.visible(browser) == ["Lobby"])
    }

    /// A key the server does not know: BADKEY, said as `keyRejected` with what to do, and tried
    /// again only after 300 s; nothing is in the zone.
    @Test func aKeyTheServerDoesNotKnowIsSaidAndTriedAgainRarely() async throws {
        let world = WideAreaWorld(knownHosts: ["hostb"])
        let host = try await world.addHost("hosta")
        try await world.run(for: 299)
        let reports = world.reports(host)
        guard case .failed(let error, let retry)? = reports.first, reports.count == 1 else {
            Issue.record("expected one failure: \(reports)")
            return
        }
        #expect(error.code == .keyRejected && error.message.contains("BADKEY") && retry == .seconds(300))
        #expect(world.server.state.withLock { $0.updates.map(\.tsigError) } == [DNSRcode.badKey])
        #expect(world.instancesInZone.isEmpty)
        try await world.run(for: 2)
        #expect(world.server.state.withLock { $0.updates.count } == 2, "tried again at 300 s")
    }

    /// A secret that does not match the server's: BADSIG, `keyRejected`.
    @Test func aWrongSecretIsBadSig() async throws {
        let world = WideAreaWorld()
        let host = try await world.addHost("hosta", key: WideAreaWorld.key(for: "hosta", secret: 9))
        try await world.run(for: 5)
        guard case .failed(let error, _)? = world.reports(host).first else {
            Issue.record("no failure: \(world.reports(host))")
            return
        }
        #expect(error.code == .keyRejected && error.message.contains("BADSIG"))
    }

    /// An update policy that does not grant the key the service's names: REFUSED, said as
    /// `updateRefused` with the policy to ask for.
    @Test func aPolicyThatDeniesTheNamesIsUpdateRefused() async throws {
        let world = WideAreaWorld(policy: { key, name in name == key })  // `self` only: its own host name
        let host = try await world.addHost("hosta")
        try await world.run(for: 5)
        guard case .failed(let error, let retry)? = world.reports(host).first else {
            Issue.record("no failure: \(world.reports(host))")
            return
        }
        #expect(error.code == .updateRefused && error.message.contains("update-policy") && retry == .seconds(300))
        #expect(world.instancesInZone.isEmpty)
    }

    /// Stopping deletes exactly the host's records: the other host's instance and the shared PTR
    /// set's other member stay, and a browser removes only the stopped one.
    @Test func stopRemovesExactlyItsOwnRecords() async throws {
        let world = WideAreaWorld()
        let browser = try await world.addBrowser()
        let a = try await world.addHost("hosta", instance: "Alpha")
        _ = try await world.addHost("hostb", instance: "Beta")
        try await world.run(for: 20)
        #expect(world.visible(browser) == ["Alpha", "Beta"])
        try await world.stop(a)
        #expect(world.reports(a).last == .removed(name: "Alpha"))
        #expect(world.instancesInZone == ["Beta"])
        try await world.run(for: 11)
        #expect(world.visible(browser) == ["Beta"])
    }

    /// An unchanged zone costs a browser one SOA query per poll; a change, the PTR set and the new
    /// instance's TXT and SRV.
    @Test func anUnchangedZoneCostsOneQueryPerPoll() async throws {
        let world = WideAreaWorld()
        try await world.addBrowser()
        try await world.run(for: 5)
        let service = DNSName("_chat._tcp.lab.home.arpa")!
        func asked() -> (soa: Int, ptr: Int, other: Int) {
            let queries = world.server.state.withLock { $0.queries }
            let zone = DNSName(WideAreaWorld.zoneName)!
            let soa = queries.filter { $0.name == zone && $0.type == DNSType.soa }.count
            let ptr = queries.filter { $0.name == service && $0.type == DNSType.ptr }.count
            let instances = queries.filter { $0.name.parent == service }.count
            return (soa, ptr, instances)
        }
        let start = asked()
        try await world.run(for: 100)  // ten polls, nothing changes
        let quiet = asked()
        #expect(quiet.ptr == start.ptr && quiet.other == start.other)
        #expect(quiet.soa - start.soa == 10, "each poll: the zone's serial (where the zone is, is kept)")
        // A registration changes the serial: the next poll reads the PTR set and the newcomer.
        try await world.addHost("hosta")
        try await world.run(for: 10)
        let changed = asked()
        #expect(changed.ptr == quiet.ptr + 1 && changed.other == quiet.other + 2)
    }
}
