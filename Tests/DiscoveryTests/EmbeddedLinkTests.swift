import Dispatch
import Locks
import Logging
import Scheduling
import Testing

@_spi(Programs) @testable import Discovery
@testable import MDNSCore

/// The embedded backends of several hosts on one simulated link, in virtual time (issue 54, 1–2):
/// the real `EmbeddedBackend` — its engine, browses, resolves, timers, socket retries — with its
/// sockets and interface scan replaced (``SimulatedLink``) and its clock a ``ManualScheduler``.
/// What takes 75 minutes on a real link (a vanished host's records running out) takes as long as
/// the work it triggers. The embedded labs (IntegrationTests.Embedded*) stay the proof against real
/// sockets, avahi-daemon and python-zeroconf.
@Suite struct EmbeddedLinkTests {
    static let type = "_sim._tcp"

    @Test func aServicePublishedOnOneHostIsBrowsedAndResolvedOnAnother() async throws {
        let world = EmbeddedWorld()
        let alpha = await world.add(1, hostName: "alpha")
        let bravo = await world.add(2, hostName: "bravo")
        world.run(seconds: 3)
        #expect(alpha.currentState == .running && bravo.currentState == .running, "host names claimed within 3 s")
        #expect(alpha.currentHostName == "alpha" && bravo.currentHostName == "bravo")

        let published = try await world.publish("Kitchen", on: alpha, port: 4242, txt: ["room": "kitchen"])
        var browse = await world.browse(on: bravo)
        world.run(seconds: 3)
        #expect(await browse.take().added == ["Kitchen"])
        #expect(published.name == "Kitchen")

        let answer = await world.resolve("Kitchen", on: bravo, timeout: .seconds(5), running: 1)
        let resolved = try #require(answer, "no answer within a second").get()
        #expect(resolved.port == 4242)
        #expect(resolved.txt["room"] == "kitchen")
        #expect(resolved.hostName == "alpha.local")
        let addresses = Set(resolved.addresses.map(\.ip))
        #expect(addresses == [.v4(10, 0, 0, 1), .v6(SimulatedLink.ipv6(1))], "\(resolved.addresses)")
        #expect(world.link.delivered > 0)
        await world.shutdown()
    }

    /// A goodbye removes a service within a second; a host that vanishes without one (power lost)
    /// keeps its service listed until the PTR record's 75 minutes run out — after the refresh
    /// queries at 80–95 % of them went unanswered — and no longer.
    @Test func aGoodbyeRemovesAtOnceAndAVanishedHostsServiceWhenItsRecordsRunOut() async throws {
        let world = EmbeddedWorld()
        let alpha = await world.add(1, hostName: "alpha")
        let bravo = await world.add(2, hostName: "bravo")
        let charlie = await world.add(3, hostName: "charlie")
        world.run(seconds: 3)
        let kitchen = try await world.publish("Kitchen", on: alpha, port: 1)
        _ = try await world.publish("Hall", on: charlie, port: 2)
        var browse = await world.browse(on: bravo)
        world.run(seconds: 3)
        #expect(await browse.take().added.sorted() == ["Hall", "Kitchen"])

        await alpha.perform { alpha.unpublish(kitchen) }
        world.run(seconds: 2)
        #expect(await browse.take().removed == ["Kitchen"], "the goodbye (TTL 0) removes it within a second")

        world.link.setConnected(3, false)
        let cut = world.seconds
        var removedAfter: Double?
        for _ in 0..<50 where removedAfter == nil {
            world.run(seconds: 100)
            let events = await browse.take()
            #expect(events.added.isEmpty)
            if events.removed == ["Hall"] { removedAfter = world.seconds - cut }
        }
        let after = try #require(removedAfter, "Hall was never removed")
        #expect(after > 3_600 && after <= 4_600, "removed \(after) s after its host vanished (PTR TTL 4,500 s)")
        print("MEASURED embedded, simulated link: a vanished host's service removed within \(Int(after)) s (virtual; PTR TTL 4,500 s)")
        await world.shutdown()
    }

    /// A cable pulled for longer than the records live, then plugged back: the host whose cable
    /// it was drops what it saw there at once (its interface watch, its rescan); the others drop
    /// its service when its records run out; plugged back, it announces itself and asks again at
    /// once — each side sees the other within seconds, not at its next scheduled query.
    @Test func aCablePulledForAnHourAndAHalfAndPluggedBackIsSeenAgainAtOnce() async throws {
        let world = EmbeddedWorld()
        let alpha = await world.add(1, hostName: "alpha")
        let bravo = await world.add(2, hostName: "bravo")
        world.run(seconds: 3)
        _ = try await world.publish("Kitchen", on: alpha, port: 1)
        _ = try await world.publish("Hall", on: bravo, port: 2)
        var seenByAlpha = await world.browse(on: alpha)
        var seenByBravo = await world.browse(on: bravo)
        world.run(seconds: 3)
        #expect(await seenByAlpha.take().added.sorted() == ["Hall", "Kitchen"])
        #expect(await seenByBravo.take().added.sorted() == ["Hall", "Kitchen"])

        world.link.setCarrier(1, false)
        world.run(seconds: 1)
        // (its own service too: it was seen through the link, by its own looped-back announcements)
        #expect(await seenByAlpha.take().removed.sorted() == ["Hall", "Kitchen"], "alpha's link is gone, and what it saw there")
        #expect(await seenByBravo.take().isEmpty)
        world.run(seconds: 5_400)
        #expect(await seenByBravo.take().removed == ["Kitchen"], "Kitchen's records ran out at bravo")
        #expect(await seenByAlpha.take().isEmpty)

        world.link.setCarrier(1, true)
        world.run(seconds: 2)
        #expect(await seenByAlpha.take().added.sorted() == ["Hall", "Kitchen"], "alpha asked again as soon as its link came back")
        #expect(await seenByBravo.take().added == ["Kitchen"], "alpha announced itself as soon as its link came back")
        await world.shutdown()
    }

    @Test func twoHostsClaimingOneHostNameAndOneServiceNameEndWithTwoOfEach() async throws {
        let world = EmbeddedWorld()
        let first = await world.add(1, hostName: "twin")
        let second = await world.add(2, hostName: "twin")
        let observer = await world.add(3, hostName: "observer")
        world.run(seconds: 5)
        #expect(first.currentState == .running && second.currentState == .running)
        let names = [first.currentHostName, second.currentHostName]
        #expect(Set(names).count == 2 && names.contains("twin"), "\(names)")

        let a = try await world.publish("Lobby", on: first, port: 1)
        let b = try await world.publish("Lobby", on: second, port: 2)
        var browse = await world.browse(on: observer)
        world.run(seconds: 5)
        let seen = await browse.take().added.sorted()
        #expect(seen.count == 2 && seen.contains("Lobby"), "\(seen)")
        let finalNames = [a.name, b.name]
        #expect(Set(finalNames) == Set(seen), "each publisher's own name is the one the others see: \(finalNames)")
        await world.shutdown()
    }

    /// Sockets that cannot be opened: the backend says why and tries again after 250 ms, 500 ms,
    /// 1 s… (the fourth try, 1.75 s after the first, succeeds here).
    @Test func socketsThatCannotBeOpenedAreRetriedWithDoublingDelays() async throws {
        let world = EmbeddedWorld()
        world.link.failOpens(1, count: 6)  // both families, three tries
        let alpha = await world.add(1, hostName: "alpha")
        guard case .failed(let error) = alpha.currentState else {
            Issue.record("state \(alpha.currentState) after a failed open")
            return
        }
        #expect(error.message.contains("retrying in 0.25 seconds"), "\(error.message)")
        world.run(milliseconds: 1_749)
        #expect(alpha.currentState != .running && alpha.currentState != .registering, "\(alpha.currentState)")
        world.run(milliseconds: 1)
        #expect(alpha.currentState == .registering, "\(alpha.currentState)")
        world.run(seconds: 2)
        #expect(alpha.currentState == .running)
        await world.shutdown()
    }

    @Test func aResolveNobodyAnswersTimesOutAtItsDeadlineAndNotBefore() async throws {
        let world = EmbeddedWorld()
        let bravo = await world.add(2, hostName: "bravo")
        world.run(seconds: 3)
        let deadline = world.scheduler.now + 5_000_000_000
        let resolving = Task { await bravo.resolve(world.request("Nobody"), timeout: .seconds(5)) }
        #expect(await world.scheduler.waitForPending { $0.contains(deadline) }, "the resolve's timeout was armed")
        world.run(milliseconds: 4_999)
        #expect(await bravo.resolvesRunning() == 1)
        world.run(milliseconds: 1)
        #expect(await bravo.resolvesRunning() == 0)
        // An answer came on the queue while the clock turned; a resolve still running is ended
        // here (said as `.shutDown`) rather than waited for.
        resolving.cancel()
        guard case .failure(let error) = await resolving.value else {
            Issue.record("resolved a service nobody published")
            return
        }
        #expect(error.code == .timedOut, "\(error)")
        await world.shutdown()
    }
}

/// Hosts on one ``SimulatedLink`` with one manual clock.
final class EmbeddedWorld: Sendable {
    let scheduler = ManualScheduler()
    let link: SimulatedLink
    let start: UInt64
    private let backends = Locked<[EmbeddedBackend]>([])
    static let logger = Logger(label: "embedded-world", factory: { _ in SwiftLogNoOpLogHandler() })
    static let marker = DiscoveredService(
        identity: ServiceIdentity(name: "end of what was yielded", type: "_marker._tcp"), seenOn: [], isLocal: false, isOwn: false)

    /// A world on 10.0.0.N and fe80::N, or on `ipv4Network` (/24) without IPv6 (``SimulatedLink``).
    init(ipv4Network: [UInt8] = [10, 0, 0], hasIPv6: Bool = true) {
        link = SimulatedLink(scheduler: scheduler, ipv4Network: ipv4Network, hasIPv6: hasIPv6)
        start = scheduler.now
    }

    /// Seconds of virtual time since the world began.
    var seconds: Double { Double(scheduler.now - start) / 1e9 }

    /// A host with its backend started: its sockets open (or failed) and its first probe armed.
    func add(_ number: UInt8, hostName: String, seed: UInt64? = nil) async -> EmbeddedBackend {
        let backend = EmbeddedBackend(
            logger: Self.logger, programName: "sim", configuration: DiscoveryConfiguration(hostName: hostName),
            linkLayer: link.layer(for: number), scheduler: scheduler, seed: seed ?? UInt64(number))
        backends.withLock { $0.append(backend) }
        backend.start()
        await backend.perform {}
        return backend
    }

    func run(seconds: Int64) { scheduler.advance(by: .seconds(seconds)) }
    func run(milliseconds: Int64) { scheduler.advance(by: .milliseconds(milliseconds)) }

    func publish(_ name: String, on backend: EmbeddedBackend, port: UInt16, txt: TXTRecord = TXTRecord()) async throws -> PublishedService {
        try await backend.publish(
            PublishRequest(name: name, type: EmbeddedLinkTests.type, domain: nil, port: port, txt: txt, interface: nil, ipVersion: .any)
        ).get()
    }

    /// A browse started (on the backend's queue, waited for); its events read with `take()`.
    func browse(on backend: EmbeddedBackend) async -> StreamReader<BrowseEvent> {
        let reader = StreamReader<BrowseEvent>(marker: .removed(Self.marker))
        _ = backend.startBrowse(
            BrowseRequest(type: EmbeddedLinkTests.type, domain: nil, interface: nil, ipVersion: .any), continuation: reader.continuation)
        await backend.perform {}
        return reader
    }

    func request(_ name: String) -> ResolveRequest {
        ResolveRequest(identity: ServiceIdentity(name: name, type: EmbeddedLinkTests.type), sightings: [], interface: nil, ipVersion: .any)
    }

    /// A one-shot resolve started (on the backend's queue, waited for: it may answer at once from
    /// the cache), then the clock turned `running` seconds: its result by then, or nil.
    func resolve(_ name: String, on backend: EmbeddedBackend, timeout: Duration, running: Int64) async
        -> Result<ResolvedService, DiscoveryError>?
    {
        let result = Locked<Result<ResolvedService, DiscoveryError>?>(nil)
        backend.startResolve(request(name), timeout: timeout) { answer in result.withLock { $0 = answer } }
        await backend.perform {}
        run(seconds: running)
        return result.withLock { $0 }
    }

    func shutdown() async {
        for backend in backends.withLock({ $0 }) { await backend.shutdown() }
    }
}

extension [BrowseEvent] {
    var added: [String] { compactMap { if case .added(let service) = $0 { service.name } else { nil } } }
    var removed: [String] { compactMap { if case .removed(let service) = $0 { service.name } else { nil } } }
}
