import Foundation
import Logging
import MDNSCore
import Messaging
import Scheduling
import TestWaits
import Testing

@_spi(Programs) @testable import Discovery

/// The whole library under a seed's faults (issue 54, 3): the one-clock world of
/// ``OneClockWorldTests`` — real embedded mDNS backends on a ``SimulatedLink``, a real
/// `MessageServer` with its session store on disk, real `MessageClient`s that find it by name, all
/// timers on one `ManualScheduler` — driven by a seed. The seed picks every step: a client sends a
/// few numbered messages, the server's app sends a few to a client it has a connection to, time passes (10 ms to 2 s), a connection is cut without GOODBYE (the
/// client's end or the server's: what is in flight is lost), the server stops and a new one starts
/// on the same store, a newcomer finds the server by name, the client host's cable is pulled from
/// the mDNS link or plugged in again.
///
/// Checked after every step, on what the server's app got (the recipe of "Exactly once to the
/// app": a message whose position the app already handled is skipped): each client's messages in
/// the order sent, each once, never more than were sent; a message that came again carries the
/// position it had, and came again only at a new server (a dropped connection repeats nothing; a
/// stopped server may leave the one its app was handling); nothing reported undelivered and no
/// client gave up; each client's app got the server's messages in the order sent, none twice (its
/// inbox lives on across its reconnects and the server's restarts). At the end (the cable in, the
/// server running): every message acknowledged, the app's messages from each client exactly
/// 1…sent, and every message of the server's whose `send` returned at its client.
///
/// What replays: the seed's steps (the trace holds only them, and `aSeedReplaysItsSteps` checks
/// two runs give the same). What does not: the sockets are real TCP on loopback and the tasks are
/// Swift's, so how much was in flight when a cut or a stop came is the machine's — the run's
/// observations (the repeats, the cuts that found a connection) are reported beside the trace,
/// not in it. `LANMSG_SEEDED_WORLD_SEEDS` (default 2: about 5 s) from
/// `LANMSG_SEEDED_WORLD_FIRST_SEED`; one seed with its trace: `LANMSG_SEEDED_WORLD_SEED=n`. The
/// long run: `LANMSG_SEEDED_WORLD_SEEDS=200 .build/debug/swift-lan-messagingPackageTests.xctest
/// --testing-library swift-testing --filter SeededWorldTests/everySeed`.
@Suite struct SeededWorldTests {
    @Test func everySeedLosesAndRepeatsNothing() async {
        let chosen = SimulationSeeds("LANMSG_SEEDED_WORLD", default: 2)
        let result = await chosen.runEach(filter: "SeededWorldTests/everySeed", tail: 40) { await SeededWorld.run(seed: $0) }
        guard let totals = result.totals else {
            Issue.record(Comment(rawValue: result.failure ?? ""))
            return
        }
        print(totals.measured("seeded world"))
        // A long run proves something only if its seeds reached each kind of step.
        let kinds = chosen.seeds.count >= 50
            ? ["send", "server sends", "time", "client's end cut", "server's end cut", "server stopped", "server started", "sent and cut", "newcomer", "cable"]
            : ["send", "time"]
        for kind in kinds {
            #expect(totals.counts[kind, default: 0] > 0, "no seed reached '\(kind)'")
        }
    }

    /// One seed run twice takes the same steps, line for line — and another seed other ones.
    @Test func aSeedReplaysItsSteps() async {
        let first = await SeededWorld.run(seed: 54, steps: 8)
        let second = await SeededWorld.run(seed: 54, steps: 8)
        let other = await SeededWorld.run(seed: 55, steps: 8)
        #expect(first.failure == nil && second.failure == nil && other.failure == nil, "\(first.failure ?? second.failure ?? other.failure ?? "")")
        #expect(first.trace.count >= 8)
        let same = first.trace == second.trace  // (not in the expectation: it would print both traces)
        #expect(same, "seed 54 ran two ways:\n\(first.trace.joined(separator: "\n"))\n---\n\(second.trace.joined(separator: "\n"))")
        #expect(first.trace != other.trace)
    }
}

/// One seeded run of the world (see ``SeededWorldTests``).
struct SeededWorld: SimulationOutcome {
    var failure: String?
    var trace: [String] = []
    var steps = 0
    var counts: [String: Int] = [:]
    /// What the run saw that the seed does not fix (the machine's interleaving): shown with a failure.
    var observed: [String] = []

    struct Valued: Codable, Sendable {
        var client: Int
        var n: Int
    }

    /// What a server's app got, in order, from every server the run started.
    struct Arrival: Sendable {
        var client: Int
        var n: Int
        var position: SessionPosition?
        var server: Int
    }

    final class Client: Sendable {
        let index: Int
        let name: String
        let client: MessageClient
        /// What the library reported: undelivered messages, a give-up.
        let reports = Observed<[String]>([])
        /// The numbers of the server's messages the client's app got, in order.
        let got = Observed<[Int]>([])
        private let reader: Task<Void, Never>

        init(index: Int, name: String, client: MessageClient) {
            self.index = index
            self.name = name
            self.client = client
            let (reports, got) = (self.reports, self.got)
            reader = Task {
                for await event in client.events {
                    switch event {
                    case .received(let message):
                        if let value = try? message.decode(Valued.self) { got.update { $0.append(value.n) } }
                    case .undelivered(let messages): reports.update { $0.append("undelivered \(messages.count)") }
                    case .gaveUp(let error): reports.update { $0.append("gave up: \(error)") }
                    default: break
                    }
                }
            }
        }

        func stopReading() { reader.cancel() }
    }

    final class Server: Sendable {
        let server: MessageServer
        private let reader: Task<Void, Never>

        init(_ server: MessageServer, incarnation: Int, arrivals: Observed<[Arrival]>) {
            self.server = server
            reader = Task {
                for await event in server.events {
                    guard case .received(_, let message) = event, let value = try? message.decode(Valued.self) else { continue }
                    arrivals.update {
                        $0.append(Arrival(client: value.client, n: value.n, position: message.sessionPosition, server: incarnation))
                    }
                }
            }
        }

        func stopReading() { reader.cancel() }
    }

    static func run(seed: UInt64, steps stepCount: Int = 30) async -> SeededWorld {
        var run = SeededWorld()
        var random = SplitMix64(seed: seed)
        let ledger = await LedgerWorld()
        let world = ledger.world
        let directory = NSTemporaryDirectory() + "seeded-world-\(seed)-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let identity = Identity.ephemeral()
        let arrivals = Observed<[Arrival]>([])
        var servers: [Server] = []
        var running: Server?
        var clients: [Client] = []
        var sent: [Int] = []
        // The server's messages to each client: numbers tried (a `send` that threw may or may not
        // have gone), and those whose `send` returned (owed to the client).
        var serverTried: [Int] = []
        var serverOwed: [Set<Int>] = []
        var cablePlugged = true

        func note(_ kind: String, _ line: String) {
            run.trace.append("\(run.steps): \(line)")
            run.counts[kind, default: 0] += 1
        }
        func startServer() async throws {
            let server = Server(
                OneClockWorldTests.makeServer(directory: directory, identity: identity, discovery: ledger.serverDiscovery, clock: world.scheduler),
                incarnation: servers.count + 1, arrivals: arrivals)
            servers.append(server)
            try await world.turning("server \(servers.count) started") { try await server.server.start() }
            running = server
        }
        func send(_ count: Int, from which: Int) async throws {
            for _ in 0..<count {
                sent[which] += 1
                try await clients[which].client.send(Valued(client: which, n: sent[which]), type: "n")
            }
        }
        func addClient() async throws {
            let index = clients.count
            let name = "till-\(index)"
            clients.append(Client(index: index, name: name, client: try await ledger.connectClient(name)))
            sent.append(0)
            serverTried.append(0)
            serverOwed.append([])
        }

        do {
            try await startServer()
            try await addClient()
            note("start", "server 1 started; till-0 found it by name")
            while run.steps < stepCount {
                run.steps += 1
                let roll = Int.random(in: 0..<100, using: &random)
                switch roll {
                case 0..<35:
                    let which = Int.random(in: 0..<clients.count, using: &random)
                    let count = Int.random(in: 1...8, using: &random)
                    try await send(count, from: which)
                    note("send", "till-\(which) sends \(count) (up to \(sent[which]))")
                case 35..<60:
                    let milliseconds = 10 * Int64.random(in: 1...200, using: &random)
                    try await world.turning("time passes", limit: .milliseconds(milliseconds + 20)) {
                        await world.scheduler.sleep(for: .milliseconds(milliseconds))
                    }
                    note("time", "\(milliseconds) ms pass")
                case 60..<66:
                    // The server's app sends to one of the connections it has (which ones it has
                    // is the machine's: the trace holds the pick).
                    let pick = Int.random(in: 0..<4, using: &random)
                    let count = Int.random(in: 1...6, using: &random)
                    let connections = (running?.server.connections ?? []).filter(\.hasSession)
                    if !connections.isEmpty {
                        let connection = connections[pick % connections.count]
                        if let which = clients.firstIndex(where: { $0.name == connection.peer.name }) {
                            var returned = 0
                            for _ in 0..<count {
                                serverTried[which] += 1
                                do {
                                    try await connection.send(Valued(client: which, n: serverTried[which]), type: "n")
                                    serverOwed[which].insert(serverTried[which])
                                    returned += 1
                                } catch {
                                    break
                                }
                            }
                            run.observed.append("\(run.steps): the server sent \(returned) of \(count) to till-\(which)")
                        }
                    } else {
                        run.observed.append("\(run.steps): the server had no connection to send on")
                    }
                    note("server sends", "the server sends \(count) on a connection (\(pick))")
                case 66..<70:
                    let which = Int.random(in: 0..<clients.count, using: &random)
                    let channel = clients[which].client.channel
                    channel?.abort()
                    run.observed.append("\(run.steps): till-\(which)'s end cut: \(channel == nil ? "no connection" : "cut")")
                    note("client's end cut", "till-\(which)'s end of its connection cut")
                case 70..<75:
                    let pick = Int.random(in: 0..<4, using: &random)
                    let connections = running?.server.connections ?? []
                    if !connections.isEmpty { connections[pick % connections.count].channel.abort() }
                    run.observed.append("\(run.steps): server's end cut: \(connections.count) connections")
                    note("server's end cut", "the server's end of a connection cut (\(pick))")
                case 75..<82:
                    if let server = running {
                        try await world.turning("server \(servers.count) stopped") { await server.server.stop() }
                        running = nil
                        note("server stopped", "server \(servers.count) stopped")
                    } else {
                        try await startServer()
                        note("server started", "server \(servers.count) started on the store")
                    }
                case 82..<92:
                    if running == nil {
                        try await startServer()
                        note("server started", "server \(servers.count) started on the store")
                    } else {
                        // Sent and cut at once: what was in flight is lost on the way.
                        let which = Int.random(in: 0..<clients.count, using: &random)
                        let count = Int.random(in: 1...8, using: &random)
                        try await send(count, from: which)
                        clients[which].client.channel?.abort()
                        note("sent and cut", "till-\(which) sends \(count) (up to \(sent[which])) and its end is cut at once")
                    }
                case 92..<96:
                    if clients.count < 3, running != nil, cablePlugged {
                        try await addClient()
                        note("newcomer", "till-\(clients.count - 1) found the server by name")
                    } else {
                        note("idle", "no newcomer (\(clients.count) clients, server \(running == nil ? "stopped" : "running"), cable \(cablePlugged ? "in" : "out"))")
                    }
                default:
                    cablePlugged.toggle()
                    world.link.setCarrier(2, cablePlugged)
                    note("cable", "the clients' host's cable \(cablePlugged ? "plugged in" : "pulled")")
                }
                if let broken = check(arrivals.value, sent: sent, clients: clients, final: false)
                    ?? checkDown(clients, tried: serverTried, owed: serverOwed, final: false)
                {
                    run.failure = "after step \(run.steps): \(broken)"
                    break
                }
            }
            if run.failure == nil {
                // The end: the cable in, a server running, every message acknowledged.
                if !cablePlugged { world.link.setCarrier(2, true) }
                if running == nil { try await startServer() }
                for client in clients {
                    let acknowledged = try await world.turning("till-\(client.index)'s messages acknowledged", limit: .seconds(180)) {
                        await client.client.acknowledged(within: .seconds(170))
                    }
                    if !acknowledged, run.failure == nil {
                        let got = check(arrivals.value, sent: sent, clients: clients, final: true) ?? "the app got every message"
                        run.failure = "till-\(client.index): \(client.client.unacknowledgedCount) of \(sent[client.index]) not acknowledged at the end (\(got))"
                    }
                }
                for client in clients where run.failure == nil {
                    let owed = serverOwed[client.index]
                    do {
                        try await world.turning("till-\(client.index) got the server's messages", limit: .seconds(180)) {
                            try await client.got.wait("till-\(client.index) got the server's messages", timeout: .seconds(60)) {
                                owed.isSubset(of: Set($0))
                            }
                        }
                    } catch {
                        run.failure = "till-\(client.index): not every message of the server's arrived at the end: \(error)"
                    }
                }
                if run.failure == nil, let broken = check(arrivals.value, sent: sent, clients: clients, final: true)
                    ?? checkDown(clients, tried: serverTried, owed: serverOwed, final: true)
                {
                    run.failure = "at the end: \(broken)"
                }
                if run.failure == nil { note("end", "every message acknowledged: \(sent.map(String.init).joined(separator: ", ")) sent") }
                run.observed.append("the server's messages owed to each client: \(serverOwed.map(\.count)), tried: \(serverTried)")
            }
        } catch {
            run.failure = "after step \(run.steps): \(error)"
        }
        let repeats = arrivals.value.count - Set(arrivals.value.map { "\($0.client) \($0.n)" }).count
        run.observed.append("\(servers.count) servers, \(arrivals.value.count) arrivals, \(repeats) came again")
        run.counts["came again", default: 0] += repeats
        if let failure = run.failure {
            run.failure = failure + "\nobserved (the machine's, not the seed's):\n" + run.observed.joined(separator: "\n")
        }
        // Tear down: everything the run started stops, whatever happened.
        let everyClient = clients
        _ = try? await world.turning("the clients closed", limit: .seconds(30)) {
            for client in everyClient { await client.client.close() }
        }
        if let server = running { _ = try? await world.turning("the last server stopped", limit: .seconds(30)) { await server.server.stop() } }
        for client in clients { client.stopReading() }
        for server in servers { server.stopReading() }
        await ledger.shutdown()
        return run
    }

    /// The first broken promise in what the clients' apps got from the servers (nil: none): each
    /// client's in the order tried, each once — the client's inbox lives on across its reconnects
    /// and the server's restarts, so nothing comes again — never one not tried. `final`: every one
    /// whose `send` returned arrived.
    static func checkDown(_ clients: [Client], tried: [Int], owed: [Set<Int>], final: Bool) -> String? {
        for client in clients {
            let got = client.got.value
            for (index, n) in got.enumerated() {
                guard n >= 1, n <= tried[client.index] else { return "till-\(client.index) got the server's #\(n), never sent (\(tried[client.index]) tried)" }
                if index > 0, n <= got[index - 1] {
                    return "till-\(client.index) got the server's #\(n) after #\(got[index - 1]) (again, or out of order): \(got)"
                }
            }
            if final {
                let missing = owed[client.index].subtracting(got)
                if !missing.isEmpty { return "till-\(client.index) never got the server's \(missing.sorted())" }
            }
        }
        return nil
    }

    /// The first broken promise in what the servers' apps got (nil: none). `final`: also every
    /// message sent arrived.
    static func check(_ arrivals: [Arrival], sent: [Int], clients: [Client], final: Bool) -> String? {
        var handled: [String: UInt64] = [:]  // the app's recipe: the last number handled per session
        var firstSeen: [String: Arrival] = [:]  // client and n → its first arrival
        var kept = Array(repeating: 0, count: sent.count)  // what the recipe kept, per client
        for arrival in arrivals {
            guard arrival.client < sent.count, arrival.n >= 1, arrival.n <= sent[arrival.client] else {
                return "an arrival never sent: till-\(arrival.client) #\(arrival.n) (\(sent) sent)"
            }
            guard let position = arrival.position else { return "till-\(arrival.client) #\(arrival.n) arrived without a session position" }
            let key = "\(arrival.client) \(arrival.n)"
            if let first = firstSeen[key] {
                guard first.position == position else {
                    return "till-\(arrival.client) #\(arrival.n) came again under another position: \(first.position.map(String.init(describing:)) ?? "-") then \(position)"
                }
                guard first.server != arrival.server else {
                    return "till-\(arrival.client) #\(arrival.n) came twice to server \(arrival.server) (a dropped connection repeats nothing)"
                }
            } else {
                firstSeen[key] = arrival
            }
            if let done = handled[position.session], position.number <= done { continue }  // came again: skipped
            handled[position.session] = position.number
            guard arrival.n == kept[arrival.client] + 1 else {
                return "till-\(arrival.client): #\(arrival.n) after #\(kept[arrival.client]) (out of order, or one lost)"
            }
            kept[arrival.client] = arrival.n
        }
        for client in clients where !client.reports.value.isEmpty {
            return "till-\(client.index): the library reported \(client.reports.value)"
        }
        if final {
            for (index, count) in sent.enumerated() where kept[index] != count {
                return "till-\(index): the app has 1…\(kept[index]) of 1…\(count)"
            }
        }
        return nil
    }
}
