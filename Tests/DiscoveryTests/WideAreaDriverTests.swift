import Dispatch
import Locks
import Logging
import Scheduling
import Testing

@testable import Discovery
@testable import MDNSCore

/// The real `WideAreaRegistration` — its own task, its own waits — against the DNS server in
/// memory, on a manual clock: what `WideAreaWorld` checks with a copy of its loop, here with the
/// driver itself (issue 54, 2). A minute of leases is a turn of the clock.
@Suite struct WideAreaDriverTests {
    /// A zone on a server in memory, a manual clock, and a registration of "Lobby" by each host
    /// (its own wide area: its host name, address and key), not started.
    struct Lab {
        let server: FakeDNSServer
        let clock = ManualScheduler()
        let wideAreas: [WideArea]
        let registrations: [WideAreaRegistration]
        let handles: [PublishedService]
        var wideArea: WideArea { wideAreas[0] }
        var registration: WideAreaRegistration { registrations[0] }
        var handle: PublishedService { handles[0] }

        init(hosts: [String] = ["hosta"]) {
            let logger = Logger(label: "wide-area-driver")
            let server = FakeDNSServer(zone: WideAreaWorld.zoneName, keys: hosts.map { WideAreaWorld.key(for: $0) }, now: 1_800_000_000)
            self.server = server
            let settings = WideAreaConfiguration(
                domains: [WideAreaWorld.zoneName], servers: [server.address], pollInterval: .seconds(10), lease: .seconds(100))
            var wideAreas: [WideArea] = []
            var registrations: [WideAreaRegistration] = []
            var handles: [PublishedService] = []
            for (index, host) in hosts.enumerated() {
                var configuration = DiscoveryConfiguration(advertisedAddresses: [.v4(10, 81, 1, UInt8(10 + index))])
                configuration.wideArea = settings
                let dns = UnicastDNS(settings: settings, logger: logger, exchanger: server, clock: { server.now })
                let wideArea = WideArea(configuration: configuration, logger: logger, hostLabel: host, dns: dns, scheduler: clock)
                var txt = TXTRecord()
                txt["fp"] = "\(host)-fp"
                let handle = PublishedService(owner: WideAreaWorld.NoBackend(), name: "Lobby", type: WideAreaWorld.type, port: 4242, txt: txt)
                wideAreas.append(wideArea)
                handles.append(handle)
                registrations.append(
                    WideAreaRegistration(
                        wideArea: wideArea, domain: WideAreaWorld.zoneName, name: "Lobby", type: WideAreaWorld.type, port: 4242,
                        txt: txt, key: WideAreaWorld.key(for: host), handle: handle, logger: logger))
            }
            (self.wideAreas, self.registrations, self.handles) = (wideAreas, registrations, handles)
        }

        /// The name each host's publication says it registered.
        var registeredNames: [String?] {
            handles.map { handle in handle.state.withLock { try? $0.wideAreaStatus[WideAreaWorld.zoneName]?.get() } }
        }

        /// Moves the server's clock and the registration's together.
        func turn(seconds: UInt64) {
            server.advance(to: server.state.withLock { $0.milliseconds } + seconds * 1_000)
            clock.advance(by: .seconds(Int64(seconds)))
        }

        /// Waits (real time, bounded) until the registration — and the browse, when there is one —
        /// waits on its clock again: whatever they do after a turn is done.
        func settled(drivers: Int = 1) async -> Bool { await clock.waitForPending(drivers) }

        var instances: Set<String> {
            let service = DNSName("\(WideAreaWorld.type).\(WideAreaWorld.zoneName)")!
            return Set(server.records(service, DNSType.ptr).compactMap { record -> String? in
                guard case .ptr(let target) = record.data, let label = target.labels.first else { return nil }
                return String(decoding: label, as: UTF8.self)
            })
        }

        var updateCount: Int { server.state.withLock { $0.updates.count } }
    }

    /// Registered, refreshed at half the lease (not a second sooner), registered again when its
    /// records vanished from the zone, and removed on stop — the driver's own task and waits.
    @Test func theRealRegistrationRefreshesAtHalfTheLeaseComesBackAndRemovesItsRecords() async throws {
        let lab = Lab()
        lab.registration.start()
        #expect(await lab.settled(), "the registration never waited on its clock")
        #expect(lab.instances == ["Lobby"] && lab.updateCount == 1)
        #expect(lab.registeredNames == ["Lobby"])

        lab.turn(seconds: 49)
        #expect(lab.updateCount == 1, "refreshed before half the lease")
        lab.turn(seconds: 1)
        #expect(await lab.settled())
        #expect(lab.updateCount == 2, "not refreshed at half the lease")

        // Someone deletes its records (an administrator, a cleanup): at the next refresh it
        // registers again.
        lab.server.state.withLock { state in state.records.removeAll { $0.record.name != lab.server.primary } }
        #expect(lab.instances.isEmpty)
        lab.turn(seconds: 50)
        #expect(await lab.settled())
        #expect(lab.instances == ["Lobby"], "not registered again after its records vanished")

        await lab.registration.stop()
        #expect(lab.instances.isEmpty, "stop left its records")
        #expect(lab.clock.pendingCount == 0, "a wait outlived the stop")
    }

    /// The real browse driver beside the real registration, both on the clock: the instance is
    /// seen at the browse's first poll, and its removal at the first poll after the stop — the
    /// poll interval (10 s, jittered to 8–10 s) turned by hand.
    @Test func theRealBrowseSeesTheRegistrationAndItsRemovalWithinAPoll() async throws {
        let lab = Lab()
        lab.registration.start()
        #expect(await lab.settled())
        let events = Locked<[String]>([])
        let browse = WideAreaBrowse(wideArea: lab.wideArea, domain: WideAreaWorld.zoneName, type: WideAreaWorld.type) { event in
            switch event {
            case .added(let instance): events.withLock { $0.append("added \(instance.identity.name)") }
            case .removed(let instance): events.withLock { $0.append("removed \(instance.identity.name)") }
            case .allForNow: events.withLock { $0.append("all for now") }
            }
        }
        let task = browse.start()
        #expect(await lab.settled(drivers: 2), "the browse never waited on its clock")
        #expect(events.withLock { $0 } == ["added Lobby", "all for now"])

        await lab.registration.stop()
        #expect(lab.instances.isEmpty)
        lab.turn(seconds: 7)
        #expect(events.withLock { $0 }.count == 2, "polled before 80 % of its interval")
        lab.turn(seconds: 3)
        #expect(await lab.settled())
        #expect(events.withLock { $0 } == ["added Lobby", "all for now", "removed Lobby"])
        task.cancel()
        await task.value
        #expect(lab.clock.pendingCount == 0, "the browse's wait outlived its cancellation")
    }

    /// Two real hosts register one name at the same moment (their tasks race): one keeps it, the
    /// other is renamed "Lobby #2" and says so; both are refreshed for three leases' worth of turns
    /// (the server drops a record whose lease ends), and both removed on stop.
    @Test func twoRealHostsWithOneNameEndWithTwoNamesAndKeepThem() async throws {
        let lab = Lab(hosts: ["hosta", "hostb"])
        for registration in lab.registrations { registration.start() }
        #expect(await lab.settled(drivers: 2), "the two registrations never both waited on the clock")
        #expect(lab.instances == ["Lobby", "Lobby #2"])
        #expect(Set(lab.registeredNames.compactMap { $0 }) == ["Lobby", "Lobby #2"], "\(lab.registeredNames)")
        for _ in 0..<6 {
            lab.turn(seconds: 50)
            #expect(await lab.settled(drivers: 2))
        }
        #expect(lab.instances == ["Lobby", "Lobby #2"], "a registration was not kept through 300 s of 100 s leases")
        for registration in lab.registrations { await registration.stop() }
        #expect(lab.instances.isEmpty && lab.clock.pendingCount == 0)
    }
}
