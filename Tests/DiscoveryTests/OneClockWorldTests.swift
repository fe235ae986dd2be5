import Foundation
import Locks
import Logging
import Messaging
import Scheduling
import TestWaits
import Testing

@_spi(Programs) @testable import Discovery

/// The library's layers on one virtual clock (issue 54, 3): two hosts' real embedded mDNS
/// backends on a simulated link (``SimulatedLink``), a real `MessageServer` publishing through one
/// of them with its session store on disk, and a real `MessageClient` finding it by name through
/// the other — discovery's probes, queries and record lifetimes, the transport's deadlines, the
/// sessions' acknowledgement delays, the server's stop and the client's reconnection timers all on
/// one `ManualScheduler`. The messages go over real TCP on loopback: the simulated link's hosts are
/// 127.0.0.1 and 127.0.0.2, with no IPv6 address, so no connection can leave the machine.
///
/// The clock is turned 10 ms at a time, with up to 2 ms of real time after each step for the real
/// work a step set off (a connection, a handshake, a task): the sockets keep pace with the timers,
/// and a minute of the world takes about 12 seconds at most. Not a seeded simulation: the real
/// sockets and tasks interleave as the machine runs them (the seeded ones are the machines' own:
/// `EmbeddedLinkSimulationTests`, `SessionSimulationTests`, `ClientSimulationTests`,
/// `WideAreaSimulationTests`). The namespace labs (IntegrationTests) stay the proof on real links.
@Suite struct OneClockWorldTests {
    struct Numbered: Codable, Sendable { var n: Int }
    static let type = "_ledger._tcp"
    /// The hello and SESSION exchange's limit, on the world's clock: 60 s, not the default 10 s.
    /// The clock runs up to five times faster than real time here, so that a stall of the machine
    /// is not a timeout. With 10 s, once in about 420 runs beside a compiler, the client's resume
    /// of the restarted server's session came back as a new session (`resumedSession` false) —
    /// most likely a timeout there ended the session the store kept. The two ways a read of the
    /// code found are mended, each with its own test: `SpecDecisionTests.aClientWhoseSessionIsNotAnsweredClosesWithoutGoodbye`
    /// and `aRestoredSessionStaysWhenItsFirstResumeClosesBeforeItAttaches`.
    /// (`LANMSG_WORLD_HELLO_SECONDS=10` runs it at the default, for a loop that looks for more.)
    static let helloTimeout = Duration.seconds(
        Int64(ProcessInfo.processInfo.environment["LANMSG_WORLD_HELLO_SECONDS"].flatMap { Int64($0) } ?? 60))
    /// Silent, or on standard error at debug level with `LANMSG_WORLD_LOG=1` (a failing run's story).
    static let logger = Logger(
        label: "one-clock-world",
        factory: { label in
            guard ProcessInfo.processInfo.environment["LANMSG_WORLD_LOG"] == "1" else { return SwiftLogNoOpLogHandler() }
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .debug
            return handler
        })

    /// A server found by name, stopped and started again on its session store: the client keeps
    /// what it sends meanwhile, finds the new server, and every message arrives once, in order —
    /// the first ten at the first server, the fifty sent while it was away at the second. A
    /// newcomer then finds the second server by name through discovery alone.
    @Test func aClientFindsItsServerByNameAndLosesNothingAcrossTheServersRestart() async throws {
        let ledger = await LedgerWorld()
        let (world, clock, serverDiscovery) = (ledger.world, ledger.world.scheduler, ledger.serverDiscovery)
        let directory = NSTemporaryDirectory() + "one-clock-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let identity = Identity.ephemeral()  // the server's key, the same after its restart
        let startedAt = ContinuousClock.now
        let virtualStart = clock.now

        // The first server: published through the server host's backend, its sessions on disk.
        let first = ServerProbe(Self.makeServer(directory: directory, identity: identity, discovery: serverDiscovery, clock: clock))
        try await world.turning("the first server started") { try await first.server.start() }
        try await world.turning("the first server published") { try await first.log.wait("published") { $0.published } }
        let port = try #require(first.server.port)

        // The client, on the other host, asks for the server by name.
        let client = try await ledger.connectClient("till")
        let clientEvents = Observed<[String]>([])
        let clientReader = Task {
            for await event in client.events {
                let line = "\(String(format: "%.3f", Double(clock.now - virtualStart) / 1e9)) s: \(event)"
                clientEvents.update { $0.append(line) }
            }
        }
        for n in 1...10 { try await client.send(Numbered(n: n), type: "n") }
        let firstAcknowledged = try await world.turning("the first ten acknowledged") { await client.acknowledged(within: Duration.seconds(30)) }
        #expect(firstAcknowledged)
        #expect(first.log.value.received == Array(1...10))

        // The server stops; the client keeps what it sends while the server is away.
        try await world.turning("the first server stopped") { await first.server.stop() }
        for n in 11...60 { try await client.send(Numbered(n: n), type: "n") }
        #expect(client.unacknowledgedCount == 50)

        // A new server on the same store: the same port, published again (probed anew); the client
        // comes back (its last address, or discovery) and its session continues.
        let second = ServerProbe(Self.makeServer(directory: directory, identity: identity, discovery: serverDiscovery, clock: clock))
        try await world.turning("the second server started") { try await second.server.start() }
        #expect(second.server.port == port, "a server with a session store listens on the port it had")
        let allAcknowledged = try await world.turning("the fifty acknowledged by the second server") {
            await client.acknowledged(within: Duration.seconds(60))
        }
        #expect(allAcknowledged)
        #expect(second.log.value.received == Array(11...60), "each once, in order: \(second.log.value.received)")
        #expect(first.log.value.received == Array(1...10))
        #expect(client.resumedSession, "the client's events: \(clientEvents.value); the second server's: \(second.log.value)")
        #expect(second.log.value.resumed == 1)
        try await world.turning("the second server published") { try await second.log.wait("published") { $0.published } }

        // A newcomer finds the restarted server by name: through discovery only (it has no last address).
        let newcomer = try await ledger.connectClient("newcomer")
        try await newcomer.send(Numbered(n: 1_000), type: "n")
        let newcomerAcknowledged = try await world.turning("the newcomer's message acknowledged") {
            await newcomer.acknowledged(within: Duration.seconds(30))
        }
        #expect(newcomerAcknowledged)
        #expect(second.log.value.received == Array(11...60) + [1_000])

        let virtual = Double(clock.now - virtualStart) / 1e9
        let real = ContinuousClock.now - startedAt
        print("MEASURED one-clock world: found by name, restarted on its store, 61 messages once each: \(String(format: "%.1f", virtual)) s virtual in \(real) real")
        try await world.turning("the clients closed") {
            await client.close()
            await newcomer.close()
        }
        try await world.turning("the second server stopped") { await second.server.stop() }
        clientReader.cancel()
        first.stopReading()
        second.stopReading()
        await ledger.shutdown()
    }

    /// A server without a session store stopped and started again: on a new port, under the same
    /// name. The client's last address is refused, and it follows the server through discovery —
    /// the goodbye of the old announcement, the probe and announcement of the new one, a resolve —
    /// to the new port. The stop's GOODBYE ended the session; what the client sent while no
    /// server ran was never transmitted, and goes on the new session, each message once.
    @Test func aClientFollowsItsServerToANewPortThroughDiscovery() async throws {
        let ledger = await LedgerWorld()
        let world = ledger.world
        let identity = Identity.ephemeral()
        let first = ServerProbe(Self.makeServer(directory: nil, identity: identity, discovery: ledger.serverDiscovery, clock: world.scheduler))
        try await world.turning("the first server started") { try await first.server.start() }
        let firstPort = try #require(first.server.port)
        let client = try await ledger.connectClient("till")
        for n in 1...5 { try await client.send(Numbered(n: n), type: "n") }
        #expect(try await world.turning("the first five acknowledged") { await client.acknowledged(within: Duration.seconds(30)) })

        try await world.turning("the first server stopped") { await first.server.stop() }
        for n in 6...25 { try await client.send(Numbered(n: n), type: "n") }
        let second = ServerProbe(Self.makeServer(directory: nil, identity: identity, discovery: ledger.serverDiscovery, clock: world.scheduler))
        try await world.turning("the second server started") { try await second.server.start() }
        let secondPort = try #require(second.server.port)
        let followed = try await world.turning("the twenty acknowledged by the server on its new port") {
            await client.acknowledged(within: Duration.seconds(60))
        }
        #expect(followed)
        #expect(secondPort != firstPort, "the kernel gave the same port again: the last address, not discovery, may have found it")
        #expect(client.channel?.remoteAddress?.port == secondPort)
        #expect(first.log.value.received == Array(1...5))
        #expect(second.log.value.received == Array(6...25), "each once, in order: \(second.log.value.received)")
        #expect(!client.resumedSession, "a new server without a store: a new session")
        try await world.turning("the client closed") { await client.close() }
        try await world.turning("the second server stopped") { await second.server.stop() }
        first.stopReading()
        second.stopReading()
        await ledger.shutdown()
    }

    /// A server publishing "Ledger" on the world's clock; its sessions kept in `directory` (nil: none).
    static func makeServer(directory: String?, identity: Identity, discovery: ServiceDiscovery, clock: ManualScheduler) -> MessageServer {
        var configuration = ServerConfiguration(serviceType: type, serviceName: "Ledger")
        configuration.channel.scheduler = clock
        configuration.channel.helloTimeout = helloTimeout
        configuration.channel.security = .encrypted(identity: identity, trust: .anyKey)
        configuration.session?.store = directory.map { SessionStore(directory: $0) }
        return MessageServer(configuration: configuration, discovery: discovery, logger: logger)
    }
}

/// The world of these tests: the simulated link on 127.0.0.N, the server's host (1) and the
/// client's (2) with their names claimed, and a `ServiceDiscovery` on each host's backend.
struct LedgerWorld {
    let world = EmbeddedWorld(ipv4Network: [127, 0, 0], hasIPv6: false)
    let serverDiscovery: ServiceDiscovery
    let clientDiscovery: ServiceDiscovery

    init() async {
        let clock = world.scheduler
        let serverHost = await world.add(1, hostName: "ledger-host")
        let clientHost = await world.add(2, hostName: "till-host")
        world.run(seconds: 3)  // the host names claimed
        serverDiscovery = ServiceDiscovery(
            logger: OneClockWorldTests.logger, configuration: DiscoveryConfiguration(), backend: serverHost, wideArea: nil,
            scheduler: clock)
        // (IPv4 only besides: the simulated hosts have no IPv6 address to resolve to anyway.)
        clientDiscovery = ServiceDiscovery(
            logger: OneClockWorldTests.logger, configuration: DiscoveryConfiguration(ipVersion: .ipv4), backend: clientHost,
            wideArea: nil, scheduler: clock)
    }

    /// A client on the client's host, connected to "Ledger" by name (the clock turned until it is).
    func connectClient(_ name: String) async throws -> MessageClient {
        var configuration = ClientConfiguration(peerName: name, reconnect: ReconnectPolicy())
        configuration.channel.scheduler = world.scheduler
        configuration.channel.helloTimeout = OneClockWorldTests.helloTimeout
        configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        configuration.peerMemory = nil
        let settings = configuration
        let discovery = clientDiscovery
        return try await world.turning("\(name) connected by name") {
            try await MessageClient.connect(
                to: .service(name: "Ledger", type: OneClockWorldTests.type, discovery: discovery), configuration: settings,
                logger: OneClockWorldTests.logger)
        }
    }

    func shutdown() async {
        await clientDiscovery.shutdown()
        await serverDiscovery.shutdown()
        await world.shutdown()
    }
}

/// A server and what its events said, read as they come.
final class ServerProbe: Sendable {
    struct Log: Sendable {
        var published = false
        var received: [Int] = []
        var resumed = 0
    }
    let server: MessageServer
    let log = Observed(Log())
    private let reader: Task<Void, Never>

    init(_ server: MessageServer) {
        self.server = server
        let log = self.log
        reader = Task {
            for await event in server.events {
                switch event {
                case .published: log.update { $0.published = true }
                case .received(_, let message):
                    if let value = try? message.decode(OneClockWorldTests.Numbered.self) { log.update { $0.received.append(value.n) } }
                case .resumed: log.update { $0.resumed += 1 }
                default: break
                }
            }
        }
    }

    func stopReading() { reader.cancel() }
}

extension EmbeddedWorld {
    /// Runs `body` while turning the clock 10 ms at a time — at most `limit` of virtual time — with
    /// up to 2 ms of real time after each step for the real work it set off (what `body` awaits
    /// may need the timers, and the timers' work the sockets, in turn). Returns what `body`
    /// returned, or throws what it threw; throws ``TurnedTooLong`` when `limit` passed first.
    @discardableResult
    func turning<T: Sendable>(
        _ what: String, limit: Duration = .seconds(120), _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let outcome = Observed<Result<T, any Error>?>(nil)
        let task = Task {
            let result: Result<T, any Error>
            do { result = .success(try await body()) } catch { result = .failure(error) }
            outcome.update { $0 = result }
        }
        var turned = Duration.zero
        while true {
            if let done = try? await outcome.wait(what, timeout: .milliseconds(2), until: { $0.map { _ in true } ?? false }) {
                return try done.get()
            }
            guard turned < limit else {
                task.cancel()
                throw TurnedTooLong(description: "not \(what) within \(limit) of virtual time")
            }
            scheduler.advance(by: .milliseconds(10))
            turned += .milliseconds(10)
        }
    }
}

struct TurnedTooLong: Error, CustomStringConvertible {
    let description: String
}
