import Locks
import Testing

@testable import Discovery
@testable import MDNSCore

/// The real `WideAreaRegistration` and `WideAreaBrowse` — their own tasks, their own waits — on a
/// manual clock, turned by the second around the moments that matter (`WideAreaWorld`; issue 54,
/// 2). A minute of leases is a turn of the clock.
@Suite struct WideAreaDriverTests {
    /// The updates the server answered so far.
    static func updateCount(_ world: WideAreaWorld) -> Int { world.server.state.withLock { $0.updates.count } }

    /// Registered, refreshed at half the lease (not a second sooner), registered again when its
    /// records vanished from the zone, and removed on stop with no wait left behind.
    @Test func theRealRegistrationRefreshesAtHalfTheLeaseComesBackAndRemovesItsRecords() async throws {
        let world = WideAreaWorld()
        let host = try await world.addHost("hosta")
        #expect(world.instancesInZone == ["Lobby"] && Self.updateCount(world) == 1)
        #expect(world.hosts[host].registeredName == "Lobby")

        try await world.run(for: 49)
        #expect(Self.updateCount(world) == 1, "refreshed before half the lease")
        try await world.run(for: 1)
        #expect(Self.updateCount(world) == 2, "not refreshed at half the lease")

        // Someone deletes its records (an administrator, a cleanup): at the next refresh it
        // registers again.
        world.server.state.withLock { state in state.records.removeAll { $0.record.name != world.server.primary } }
        #expect(world.instancesInZone.isEmpty)
        try await world.run(for: 50)
        #expect(world.instancesInZone == ["Lobby"], "not registered again after its records vanished")

        try await world.stop(host)
        #expect(world.instancesInZone.isEmpty, "stop left its records")
        #expect(world.clock.pendingCount == 0, "a wait outlived the stop")
    }

    /// The real browse beside the real registration: the instance is seen at the browse's first
    /// poll, and its removal at the first poll after the stop — the poll interval (10 s) turned by
    /// hand — and cancelling the browse leaves no wait.
    @Test func theRealBrowseSeesTheRegistrationAndItsRemovalWithinAPoll() async throws {
        let world = WideAreaWorld()
        let host = try await world.addHost("hosta")
        let browser = try await world.addBrowser()
        func said() -> [String] {
            world.browsers[browser].events.withLock { $0 }.map { event in
                switch event.event {
                case .added(let instance): "added \(instance.identity.name)"
                case .removed(let instance): "removed \(instance.identity.name)"
                case .allForNow: "all for now"
                }
            }
        }
        #expect(said() == ["added Lobby", "all for now"])

        try await world.stop(host)
        #expect(world.instancesInZone.isEmpty)
        try await world.run(for: 7)
        #expect(said().count == 2, "polled before its interval")
        try await world.run(for: 3)
        #expect(said() == ["added Lobby", "all for now", "removed Lobby"])
        try await world.shutdown()  // throws when a wait outlived the browse's cancellation
    }

    /// Two real hosts register one name at the same instant (their tasks race): one keeps it, the
    /// other is renamed "Lobby #2" and says so; both are refreshed for three leases' worth of turns
    /// (the server drops a record whose lease ends), and both removed on stop.
    @Test func twoRealHostsWithOneNameEndWithTwoNamesAndKeepThem() async throws {
        let world = WideAreaWorld()
        let a = try await world.addHost("hosta", start: false)
        let b = try await world.addHost("hostb", start: false)
        try await world.startTogether([a, b])
        #expect(world.instancesInZone == ["Lobby", "Lobby #2"])
        let names = [a, b].map { world.hosts[$0].registeredName }
        #expect(Set(names.compactMap { $0 }) == ["Lobby", "Lobby #2"], "\(names)")
        try await world.run(for: 300)
        #expect(world.instancesInZone == ["Lobby", "Lobby #2"], "a registration was not kept through 300 s of 100 s leases")
        try await world.shutdown()
        #expect(world.instancesInZone.isEmpty)
    }

    /// A burst of address changes (netlink says each): the registrations are told once, half a
    /// second after the last change — a refresh at once, not at half the lease — and the wide
    /// area's shutdown stops a debounce still pending.
    @Test func aBurstOfAddressChangesRefreshesTheRegistrationOnceHalfASecondAfterTheLast() async throws {
        let world = WideAreaWorld()
        let host = try await world.addHost("hosta")
        let area = world.hosts[host].wideArea
        #expect(Self.updateCount(world) == 1)
        // Three changes 200 ms apart: one debounce at a time, each replacing the one before.
        for change in 0..<3 {
            if change > 0 { world.clock.advance(by: .milliseconds(200)) }
            area.addressesMayHaveChanged()
            #expect(world.clock.pendingCount == world.expectedWaits + 1, "after change \(change): \(world.clock.pendingDeadlines)")
        }
        let due = world.clock.now + 500_000_000
        #expect(world.clock.pendingDeadlines.contains(due), "\(world.clock.pendingDeadlines)")
        world.clock.advance(by: .milliseconds(499))
        #expect(world.clock.pendingCount == world.expectedWaits + 1, "the debounce fired early")
        #expect(Self.updateCount(world) == 1, "refreshed before the burst was over")
        world.clock.advance(by: .milliseconds(1))
        try await world.settle("after the debounce")
        #expect(Self.updateCount(world) == 2, "the registration was not refreshed after the addresses changed")
        #expect(world.instancesInZone == ["Lobby"])

        // A change, then the wide area stops before its debounce: nothing is left on the clock.
        area.addressesMayHaveChanged()
        #expect(world.clock.pendingCount == world.expectedWaits + 1)
        await area.shutdown()
        #expect(world.clock.pendingCount == 0, "timers left after the shutdown: \(world.clock.pendingDeadlines)")
        #expect(world.instancesInZone.isEmpty, "the shutdown left the registration's records")
        // A change netlink reported as the watch stopped arms nothing.
        area.addressesMayHaveChanged()
        #expect(world.clock.pendingCount == 0, "a debounce armed after the shutdown: \(world.clock.pendingDeadlines)")
        try await world.shutdown()
    }
}
