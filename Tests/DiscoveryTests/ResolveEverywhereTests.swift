import Dispatch
import Logging
import Scheduling
import Synchronization
import TestWaits
import Testing

@testable import Discovery

/// `ServiceDiscovery.resolve` of a service in several places (the link and a unicast domain), and
/// of one in a unicast domain, in virtual time (issue 54): the places' resolves run at once, the
/// wait ends when every place answered or half a second after the first answer or at the deadline,
/// and a cancelled resolve ends at once with `.shutDown` on every path. The zone is a
/// `WideAreaWorld`'s (the real `WideArea` on the fake DNS server, on the world's manual clock); the
/// link is a backend whose resolve answers when the test releases it, or ends when cancelled.
@Suite struct ResolveEverywhereTests {
    /// A link whose resolve waits until ``release()`` (then answers with `address`) or until its
    /// task is cancelled — then it fails with an error of its own, not the real backends'
    /// `.shutDown`, so that a test tells the call's own report of a cancellation from the link's.
    /// One resolve at a time.
    final class HeldLink: StubLink {
        let address: IPAddress
        let resolving = Observed(0)  // resolves running now, as a wait can see it change
        private let (releases, releaser) = AsyncStream.makeStream(of: Void.self)

        init(address: IPAddress) { self.address = address }

        func release() { releaser.yield() }

        func resolve(_ request: ResolveRequest, timeout: Duration) async -> Result<ResolvedService, DiscoveryError> {
            resolving.update { $0 += 1 }
            defer { resolving.update { $0 -= 1 } }
            var next = releases.makeAsyncIterator()
            guard await next.next() != nil, !Task.isCancelled else {  // nil: the task was cancelled
                return .failure(DiscoveryError(.timedOut, "the held link's resolve was stopped"))
            }
            return .success(
                ResolvedService(
                    identity: request.identity, hostName: "held.local", port: 4242, txt: TXTRecord(),
                    addresses: [ServiceAddress(ip: address, interfaceIndex: 2, port: 4242)], isLocal: false))
        }
    }

    /// A path to a DNS server that never answers: each exchange waits until its task is cancelled.
    struct SilentServer: DNSExchanging {
        func exchange(_ bytes: [UInt8], id: UInt16, servers: [DNSServerAddress], timeout: Duration, tcp: Bool) async
            -> Result<DNSReply, DNSExchangeError>
        {
            let (never, _) = AsyncStream.makeStream(of: Void.self)
            for await _ in never {}  // ends when cancelled
            return .failure(DNSExchangeError(servers: servers, reason: "cancelled"))
        }
    }

    static let linkAddress = IPAddress.v4(192, 0, 2, 7)
    /// Where the world's first host registers (its advertised address).
    static let zoneAddress = IPAddress.v4(10, 81, 1, 10)

    /// A discovery object on `link` and on a wide area of the world's (through `dns`, default the
    /// world's server).
    static func discovery(_ world: WideAreaWorld, link: HeldLink, dns: (any DNSExchanging)? = nil) -> ServiceDiscovery {
        var configuration = DiscoveryConfiguration()
        configuration.wideArea = world.settings
        let area = world.wideArea(label: "resolver", index: 50, link: dns ?? world.server)
        return ServiceDiscovery(logger: world.logger, configuration: configuration, backend: link, wideArea: area)
    }

    /// "Lobby" as a merged browse shows it: on the link and in the world's zone.
    static var lobbyInTwoPlaces: DiscoveredService {
        let link = ServiceIdentity(name: "Lobby", type: WideAreaWorld.type)
        let zone = ServiceIdentity(name: "Lobby", type: WideAreaWorld.type, domain: WideAreaWorld.zoneName)
        return DiscoveredService(identity: link, seenOn: [], isLocal: false, isOwn: false, locations: [link, zone])
    }

    typealias Outcome = Result<ResolvedService, DiscoveryError>

    /// Set when a resolve's call returned.
    final class Ended: Sendable {
        private let flag = Atomic<Bool>(false)
        var isSet: Bool { flag.load(ordering: .sequentiallyConsistent) }
        func set() { flag.store(true, ordering: .sequentiallyConsistent) }
    }

    static func resolving(_ discovery: ServiceDiscovery, _ service: DiscoveredService, ended: Ended) -> Task<Outcome, Never> {
        Task {
            defer { ended.set() }
            do throws(DiscoveryError) {
                return .success(try await discovery.resolve(service, timeout: .seconds(5)))
            } catch {
                return .failure(error)
            }
        }
    }

    @Test func aServiceInTwoPlacesIsResolvedHalfASecondAfterTheFirstPlaceAnswered() async throws {
        let world = WideAreaWorld()
        try await world.addHost("hosta")  // registers Lobby in the zone, then waits on the clock (1 timer)
        let link = HeldLink(address: Self.linkAddress)
        let discovery = Self.discovery(world, link: link)
        let start = world.clock.now
        let ended = Ended()
        let resolve = Self.resolving(discovery, Self.lobbyInTwoPlaces, ended: ended)
        // The zone answers at once (the server is in memory), the link not: the grace is armed.
        let grace = start + 500_000_000
        let armed = await world.clock.waitForPending { $0.contains(grace) }
        try #require(armed, "no timer half a second after the zone's answer: \(world.clock.pendingDeadlines)")
        // The link's resolve runs in a child task of its own, which may start after the zone answered.
        try await link.resolving.wait("the link resolving", timeout: .seconds(10)) { $0 == 1 }
        world.clock.advance(by: .milliseconds(499))
        #expect(!ended.isSet, "the resolve ended before its grace")
        world.clock.advance(by: .milliseconds(1))
        let resolved = try await resolve.value.get()
        #expect(resolved.addresses.map(\.ip) == [Self.zoneAddress], "only the zone answered in time")
        #expect(resolved.port == 4242)
        // The link's resolve was cancelled and awaited; the deadline's timer is gone.
        #expect(link.resolving.value == 0, "the link's resolve outlived the call")
        #expect(world.clock.pendingCount == world.expectedWaits, "timers left: \(world.clock.pendingDeadlines)")
        try await world.shutdown()
    }

    @Test func everyPlaceAnsweringEndsTheWaitAtOnceTheLinksAddressesFirst() async throws {
        let world = WideAreaWorld()
        try await world.addHost("hosta")
        let link = HeldLink(address: Self.linkAddress)
        let discovery = Self.discovery(world, link: link)
        let start = world.clock.now
        let ended = Ended()
        let resolve = Self.resolving(discovery, Self.lobbyInTwoPlaces, ended: ended)
        let armed = await world.clock.waitForPending { $0.contains(start + 500_000_000) }
        try #require(armed, "the zone never answered: \(world.clock.pendingDeadlines)")
        link.release()  // the link answers within the grace: the wait ends without the clock
        let resolved = try await resolve.value.get()
        #expect(resolved.addresses.map(\.ip) == [Self.linkAddress, Self.zoneAddress], "the link's first, then the zone's")
        #expect(resolved.addresses.first?.interfaceIndex == 2, "the link's address keeps its interface")
        #expect(world.clock.now == start, "the clock moved")
        #expect(world.clock.pendingCount == world.expectedWaits, "the deadline or the grace was left: \(world.clock.pendingDeadlines)")
        try await world.shutdown()
    }

    @Test func nothingAnsweringEndsAtTheDeadlineWithTimedOut() async throws {
        let world = WideAreaWorld()  // no host: the zone has no Lobby, and its server never answers
        let link = HeldLink(address: Self.linkAddress)
        let discovery = Self.discovery(world, link: link, dns: SilentServer())
        let ended = Ended()
        let resolve = Self.resolving(discovery, Self.lobbyInTwoPlaces, ended: ended)
        // The call's deadline and the zone's own (its chain of queries), both 5 s.
        let armed = await world.clock.waitForPending(2)
        try #require(armed, "the deadlines were never armed: \(world.clock.pendingDeadlines)")
        world.clock.advance(by: .milliseconds(4_999))
        #expect(!ended.isSet, "the resolve ended before its deadline")
        world.clock.advance(by: .milliseconds(1))
        guard case .failure(let error) = await resolve.value else { Issue.record("resolved with nothing answering"); return }
        #expect(error.code == .timedOut, "\(error)")
        #expect(link.resolving.value == 0, "the link's resolve outlived the call")
        #expect(world.clock.pendingCount == 0, "timers left: \(world.clock.pendingDeadlines)")
    }

    @Test func aCancelledResolveInTwoPlacesSaysShutDown() async throws {
        let world = WideAreaWorld()  // the zone answers at once that it has no Lobby; the link is held
        let link = HeldLink(address: Self.linkAddress)
        let discovery = Self.discovery(world, link: link)
        let ended = Ended()
        let resolve = Self.resolving(discovery, Self.lobbyInTwoPlaces, ended: ended)
        let armed = await world.clock.waitForPending(1)  // the call's deadline
        try #require(armed)
        resolve.cancel()
        guard case .failure(let error) = try await value(of: resolve, "the cancelled resolve") else { Issue.record("resolved after its cancellation"); return }
        #expect(error.code == .shutDown && error.message.contains("was cancelled"), "\(error)")
        #expect(link.resolving.value == 0, "the link's resolve outlived the call")
        #expect(world.clock.pendingCount == 0, "timers left: \(world.clock.pendingDeadlines)")
    }

    @Test func aCancelledResolveInAUnicastDomainSaysShutDown() async throws {
        let world = WideAreaWorld()
        let discovery = Self.discovery(world, link: HeldLink(address: Self.linkAddress), dns: SilentServer())
        let zone = ServiceIdentity(name: "Lobby", type: WideAreaWorld.type, domain: WideAreaWorld.zoneName)
        // By name (the wide area alone) and as a browse found it (through resolve-everywhere).
        let byName = Task { () -> Outcome in
            do throws(DiscoveryError) { return .success(try await discovery.resolve(zone, timeout: .seconds(5))) } catch { return .failure(error) }
        }
        let found = DiscoveredService(identity: zone, seenOn: [], isLocal: false, isOwn: false)
        let ended = Ended()
        let browsed = Self.resolving(discovery, found, ended: ended)
        // The by-name resolve's deadline; the browsed one's deadline and its zone's.
        let armed = await world.clock.waitForPending(3)
        try #require(armed, "\(world.clock.pendingDeadlines)")
        byName.cancel()
        browsed.cancel()
        for outcome in [try await value(of: byName, "the cancelled resolve by name"), try await value(of: browsed, "the cancelled resolve")] {
            guard case .failure(let error) = outcome else { Issue.record("resolved after its cancellation"); continue }
            #expect(error.code == .shutDown && error.message.contains("was cancelled"), "\(error)")
        }
        #expect(world.clock.pendingCount == 0, "timers left: \(world.clock.pendingDeadlines)")
    }
}
