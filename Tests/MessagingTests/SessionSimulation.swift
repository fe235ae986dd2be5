import Foundation
import Locks
import Logging
import ProtocolCore
import Scheduling
import TestWaits

@testable import Messaging

/// The connection a simulated session runs on (one object per connection; both sides' machines
/// refer to it).
final class SimulatedLink: SessionLink {
    final class Driver: Sendable {}
    let sessionDriver = Driver()
    let peerMaxFrameSize = 1 << 20
    let number: Int
    init(number: Int) { self.number = number }
}

/// A deterministic simulation of durable sessions (issue 54, 3 — its session part): one server and
/// one to three clients, each a real ``SessionMachine`` (the server's one per session id it knows,
/// all in its one store) with its real ``SessionJournal`` on a ``SimulatedDisk``, each client joined
/// to the server by a connection in memory, driven by a seed. The seed picks every step: an app
/// sends a numbered message (the server's to one client's session), a frame in flight arrives, an
/// app handles a delivered message, a store syncs, an acknowledgement deadline passes, a
/// connection is cut (what is in flight is lost) or made again, a connection goes half-open (the
/// client's end closed, the server's not: what the client wrote may still arrive — a late hello
/// too — until the server notices, or until the client resumes on a new connection and the server
/// hands on what the old one's loop took and aborts it), a process is killed (`kill -9`:
/// the page cache survives) or the power fails (the disk keeps what ``SimulatedDisk/materialize``
/// leaves: nothing unsynced, a prefix, a torn or zero-filled write, a subset; the machine boots
/// again) — a client's alone, the server's (all its sessions' records in one file, every
/// connection cut), or both at once. Durability (process crash or power loss) is the seed's too.
///
/// Each app keeps what it handled in its own durable log, with the message's position (the
/// library's promise: a message delivered again carries the position it had). Checked after every
/// step: a position never names two messages (the session never reuses a number for another
/// message, also after a store lost records); each app's log holds each peer's messages in the
/// order they were sent, each once (the server's: each client's in its order); ACKs never claim
/// more than was sent; every inbox counts in order (acknowledged ≤ stored ≤ handled ≤ delivered); a
/// store always opens again; a message once reported undelivered never goes on the wire again, in
/// any later process. A report is the app's only once it took it (``takeReport(_:)``, as its
/// events loop going on): one made and not taken is lost with the process, and the store must
/// make it again (``Side/reportsToTake``). At the end (the faults stop, every client connects and everything in
/// flight settles): each client's session and the server's of its id on that client's connection,
/// nothing left unacknowledged in them, and — once the server's other sessions ended with their
/// grace period — every message whose `send` returned is in its receiver's log or was reported
/// undelivered, except, with process-crash durability, those a power loss could take (its promise
/// is the process's crash, not the machine's).
///
/// Randomness comes from the seed only (the sessions' random ids never decide a step, and are not
/// in the trace): a seed replays event for event.
final class SessionSimulation {
    typealias Machine = SessionMachine<SimulatedLink, Int, Int>
    typealias Effects = Machine.Effects

    struct Outcome: SimulationOutcome {
        var failure: String?
        var trace: [String] = []
        var steps = 0
        /// What the run did, by kind (crashes, power losses, cuts, new epochs, …).
        var counts: [String: Int] = [:]
    }

    /// One side: its disk, store and sessions, and its app.
    final class Side {
        let name: String
        let role: Journal.Role
        /// A client's number (1, 2, 3); the server's is 0.
        let number: Int
        var disk = SimulatedDisk()
        var journal: SessionJournal!
        var boot = 1
        var sessions: [Journal.Key: Machine] = [:]
        /// The client's session.
        var current: Journal.Key?
        /// The server's session of each client (the last one it opened), by the client's number.
        var currentOf: [Int: Journal.Key] = [:]
        /// Writes whose sync lets their messages go or their count be acknowledged.
        var pendingSyncs: [(position: UInt64, key: Journal.Key, after: Machine.AfterWrite)] = []
        /// Delivered to the app, not handled yet (lost with the process).
        var toHandle: [(key: Journal.Key, number: UInt64, epoch: UInt64, position: Journal.Key, payload: Int)] = []
        var ackArmed: [Journal.Key] = []
        // The app's durable state.
        var log: [Int] = []
        var logged: Set<Int> = []
        /// The last payload logged from each sender (its code: ``SessionSimulation/code(_:)``).
        var lastFrom: [Int: Int] = [:]
        var positions: [String: Int] = [:]
        /// The messages sent, by the code of their sender and receiver.
        var sent: [Int: Int] = [:]
        var promised: [Int] = []
        /// What the app wrote down of the reports of undelivered messages it took (durable).
        var reported: Set<Int> = []
        /// Reports made to the app and not taken yet (lost with the process): its session, the
        /// report's id in the store, the messages.
        var reportsToTake: [(key: Journal.Key, id: UInt64, payloads: [Int])] = []
        /// Every message the library ever reported undelivered to this side's app, in any process
        /// (the library's promise: never sent again).
        var everReported: Set<Int> = []
        var mayLose: Set<Int> = []
        /// Payloads admitted and waiting for their `send` to return (lost with the process).
        var waiting: Set<Int> = []
        /// The app's waits for acknowledgement (``SessionMachine/waitForAcknowledgement(_:through:_:_:)``,
        /// one after each send, for everything kept then), by id: the payloads each covers (lost
        /// with the process). One that ends acknowledged must find them all in the receiver's log.
        var acknowledgementWaits: [Int: Set<Int>] = [:]
        var lastWaitID = 0
        /// A write or sync failure was armed on the disk since the store opened: a store that
        /// refuses a write or a sync without one is a fault.
        var injected = false
        /// The store failed a sync: it takes no more records until the process starts again.
        var storeFailed: Bool { journal?.shared.withLock { $0.failure != nil } ?? false }

        init(name: String, role: Journal.Role, number: Int) {
            self.name = name
            self.role = role
            self.number = number
        }
    }

    /// A client's connection to the server.
    struct Connection {
        let link: SimulatedLink
        var toServer: [Frame] = []
        var toClient: [Frame] = []
        /// The server's session on it (once its SESSION arrived).
        var serverKey: Journal.Key?
    }

    let seed: UInt64
    var random: SeededRandom
    let steps: Int
    let syncs: Bool
    let clients: [Side]
    let server = Side(name: "server", role: .server, number: 0)
    var sides: [Side] { clients + [server] }
    /// Each client's connection, by its number.
    var connections: [Int: Connection] = [:]
    /// Connections whose client's end closed while the server's end has not noticed yet (a
    /// half-open connection: a client's link went down, its process closed the socket): the
    /// server's sessions may still be attached to them, what the server writes on them is lost,
    /// and what the client wrote before its end closed may still arrive — until the server notices
    /// (its heartbeat), or the client's session resumes on a new connection (the server aborts the
    /// old one then, after the frames its loop already took).
    var stale: [(client: Int, connection: Connection)] = []
    var links = 0
    var outcome = Outcome()
    let logger = Logger(label: "session-simulation", factory: { _ in SwiftLogNoOpLogHandler() })
    static let maxCount = 12
    static let ackEvery: UInt64 = 3

    /// `clients`: how many clients share the server (1–3; the first is called "client" when
    /// alone, else they are "client1", "client2", …).
    init(seed: UInt64, steps: Int = 300, clients: Int = 1) {
        self.seed = seed
        self.steps = steps
        random = SeededRandom(seed)
        syncs = Bool.random(using: &random)
        self.clients = (1...max(1, clients)).map { Side(name: clients > 1 ? "client\($0)" : "client", role: .client, number: $0) }
    }

    static func run(seed: UInt64, steps: Int = 300, clients: Int = 1) async -> Outcome {
        let simulation = SessionSimulation(seed: seed, steps: steps, clients: clients)
        await simulation.run()
        return simulation.outcome
    }

    func fail(_ text: String) {
        if outcome.failure == nil { outcome.failure = text }
    }

    func count(_ kind: String) { outcome.counts[kind, default: 0] += 1 }

    // MARK: Payloads

    /// A payload names its sender and receiver: `code × 1,000,000 + n`, the n-th message of that
    /// code — a client's code is its number (1–3), the server's to client c is 10 + c.
    static func code(from sender: Side, to client: Int) -> Int { sender.role == .client ? sender.number : 10 + client }

    /// The side whose app must log `payload`.
    func receiver(of payload: Int) -> Side {
        let code = payload / 1_000_000
        return code < 10 ? server : clients[code - 11]
    }

    // MARK: Running

    func run() async {
        outcome.trace.append("seed \(seed): durability \(syncs ? "power-loss" : "process-crash")\(clients.count > 1 ? ", \(clients.count) clients" : "")")
        for side in sides { open(side, fresh: true) }
        for step in 1...steps where outcome.failure == nil {
            let action = await takeStep()
            outcome.steps += 1
            check()
            outcome.trace.append("\(step) \(Self.redacted(action)) | \(status)")
        }
        guard outcome.failure == nil else { return }
        // The faults stop: connect, let everything in flight settle.
        var settled = false
        for step in 1...2_000 where outcome.failure == nil {
            guard let action = await settleStep() else {
                settled = true
                break
            }
            check()
            outcome.trace.append("settle \(step) \(Self.redacted(action)) | \(status)")
        }
        guard outcome.failure == nil else { return }
        if !settled { return fail("nothing settled in 2,000 steps without faults") }
        finalCheck()
    }

    /// The text without the sessions' random ids (reasons name an epoch's first hex digits): the
    /// trace is the seed's alone.
    static func redacted(_ text: String) -> String {
        // (Most steps name no id: no regex for them — building it was a sixth of a run's time.)
        guard text.contains("…") else { return text }
        return text.replacing(/[0-9a-f]{8}…/, with: "…")
    }

    /// What a side can do, and how often the seed picks it.
    static let sideSteps: [(client: Int, server: Int, verb: String)] = [
        (12, 8, "sends"), (6, 6, "handles"), (4, 4, "syncs"), (3, 3, "ack deadline"), (2, 2, "killed"), (1, 1, "power loss"),
        (1, 1, "write fails"), (1, 1, "sync fails"),
    ]

    /// One step the seed picks among those possible now.
    func takeStep() async -> String {
        var choices: [(weight: Int, side: Side, verb: String)] = []
        for side in sides {
            for step in Self.sideSteps { choices.append((side.role == .client ? step.client : step.server, side, step.verb)) }
        }
        for client in clients {
            choices.append((1, client, "power loss with the server"))
            if let connection = connections[client.number] {
                if !connection.toServer.isEmpty { choices.append((14, client, "to server")) }
                if !connection.toClient.isEmpty { choices.append((14, client, "to client")) }
                choices.append((2, client, "cut"))
                choices.append((1, client, "half-open cut"))
            } else {
                choices.append((10, client, "connects"))
            }
            if stale.contains(where: { $0.client == client.number && !$0.connection.toServer.isEmpty }) {
                choices.append((6, client, "stale to server"))
            }
            if stale.contains(where: { $0.client == client.number }) { choices.append((2, client, "server notices")) }
        }
        let total = choices.reduce(0) { $0 + $1.weight }
        var pick = Int.random(in: 0..<total, using: &random)
        var chosen = choices[0]
        for choice in choices {
            if pick < choice.weight {
                chosen = choice
                break
            }
            pick -= choice.weight
        }
        return await perform(chosen.verb, chosen.side)
    }

    /// Without faults: the next thing to settle, in a fixed order; nil when nothing is left.
    func settleStep() async -> String? {
        // A process whose store failed a sync goes on in memory but acknowledges nothing it
        // handles: its operator restarts it (the log said what failed).
        for side in sides where side.storeFailed { return await perform("killed", side) }
        if let first = stale.first { return await perform("server notices", clients[first.client - 1]) }
        for client in clients where connections[client.number] == nil { return await perform("connects", client) }
        for client in clients {
            if connections[client.number]?.toServer.isEmpty == false { return await perform("to server", client) }
            if connections[client.number]?.toClient.isEmpty == false { return await perform("to client", client) }
        }
        for side in sides {
            if !side.toHandle.isEmpty || !side.reportsToTake.isEmpty { return await perform("handles", side) }
            if !side.pendingSyncs.isEmpty { return await perform("syncs", side) }
            if !side.ackArmed.isEmpty { return await perform("ack deadline", side) }
        }
        return nil
    }

    /// `side` does `verb` (the connection's steps are its client's).
    func perform(_ verb: String, _ side: Side) async -> String {
        switch verb {
        case "connects": return connect(side)
        case "cut":
            count("cut")
            cut(side.number)
            return "\(side.name): cut"
        case "half-open cut":
            count("half-open cut")
            halfOpenCut(side.number)
            return "\(side.name): its end closed, the server's open"
        case "stale to server": return await deliverStale(side)
        case "server notices":
            guard let index = pickStale(of: side, withFrames: false) else { return "\(side.name): no half-open connection" }
            count("server noticed a half-open connection")
            let lost = stale[index].connection.toServer.count
            dropStale(index)
            return "the server notices \(side.name)'s half-open connection (\(lost) frames lost)"
        case "power loss with the server":
            // Both on one machine (as two processes of one host, or a client and server in one
            // rack losing power together): both stores may lose the same tail.
            count("both power loss")
            return restart(side, powerLoss: true) + ", " + restart(server, powerLoss: true)
        case "to server": return await deliver(side, toServer: true)
        case "to client": return await deliver(side, toServer: false)
        case "sends": return send(side)
        case "handles": return handle(side)
        case "syncs": return await sync(side)
        case "ack deadline": return ackDeadline(side)
        case "killed": return restart(side, powerLoss: false)
        case "power loss": return restart(side, powerLoss: true)
        case "write fails": return await failNextCall(side, "write") { send(side) }
        case "sync fails": return await failNextCall(side, "sync") { await sync(side) }
        default: return "?"
        }
    }

    // MARK: Stores and processes

    /// Opens `side`'s store (again) and restores its sessions as the library does.
    func open(_ side: Side, fresh: Bool) {
        var store = SessionStore(directory: "/store", durability: syncs ? .powerLoss : .processCrash)
        store.boot = "boot-\(side.boot)"
        do {
            side.journal = try SessionJournal(
                store, role: side.role, identity: "plaintext", logger: logger, fileSystem: side.disk, compactionFloor: 1 << 30,
                scheduler: ManualScheduler())
        } catch {
            return fail("\(side.name)'s store did not open: \(error.message)")
        }
        side.sessions = [:]
        side.current = nil
        side.currentOf = [:]
        side.injected = false
        let journal = side.journal!
        // As `MessageServer.openStore` and `MessageClient.connect`: the reports an earlier process
        // made and its app never took, made again first.
        for report in journal.pendingReports {
            let payloads = report.messages.map { Int(String(decoding: $0.payload, as: UTF8.self)) ?? -1 }
            side.reportsToTake.append((report.key, report.id, payloads))
            if !fresh { count("reports made again after a restart") }
        }
        switch side.role {
        case .client:
            // As `MessageClient.makeSession`: the newest session goes on, older ones end.
            for key in journal.restoredOrder.dropLast() {
                guard let old = journal.restored[key] else { continue }
                side.sessions[key] = restored(old)
                endSession(side, key, "the session store held more than one session")
                count("client ended an older session")
            }
            if let newest = journal.restoredOrder.last, let old = journal.restored[newest] {
                side.sessions[newest] = restored(old)
                side.current = newest
            } else {
                var machine = Machine(
                    id: .random(), maxCount: Self.maxCount, maxBytes: 1 << 20, stored: true, syncs: syncs, owner: nil,
                    ackEvery: Self.ackEvery)
                machine.reportsDurably = true
                do {
                    try journal.append(.session(machine.snapshot))
                } catch {
                    return fail("\(side.name)'s new session was not stored: \(error.message)")
                }
                side.sessions[machine.id] = machine
                side.current = machine.id
            }
        case .server:
            for (key, old) in journal.restored { side.sessions[key] = restored(old) }
        }
        if !fresh, side.sessions.values.contains(where: \.mayHaveLost) { count("store may have lost records") }
    }

    func restored(_ old: Journal.Restored) -> Machine {
        var machine = Machine(restoring: old, maxCount: Self.maxCount, maxBytes: 1 << 20, syncs: syncs, ackEvery: Self.ackEvery)
        machine.reportsDurably = true
        return machine
    }

    /// The process ends (`kill -9`, or the power) and starts again at once.
    func restart(_ side: Side, powerLoss: Bool) -> String {
        count(powerLoss ? "power loss" : "killed")
        // Its connections end: all of the server's; a client's one — half-open when its machine
        // lost power (no FIN or RST leaves it: the server's end stays open until it notices), closed
        // at both ends when its process was killed (its kernel closes the socket).
        for client in clients where side === server || side === client {
            if side === client && powerLoss {
                if connections[client.number] != nil { count("half-open by a client's power loss") }
                halfOpenCut(client.number)
            } else {
                cut(client.number)
            }
        }
        if side === server { while !stale.isEmpty { dropStale(0) } }
        if side === server, Set(server.sessions.values.compactMap(\.owner)).count > 1 {
            count(powerLoss ? "server power loss holding several clients' sessions" : "server killed holding several clients' sessions")
        }
        var how = ""
        if powerLoss {
            let choices: [SimulatedDisk.Image.Choice] = [.nothing, .prefix, .torn, .zeros, .subset]
            let choice = choices[Int.random(in: 0..<choices.count, using: &random)]
            how = " (disk: \(choice))"
            side.disk = carried(side.disk, side.disk.image().materialize(choice, using: &random))
            side.boot += 1
            // Its promise is the process's crash: a power loss may take what a send returned for.
            if !syncs { side.mayLose.formUnion(side.promised) }
        } else {
            side.disk = carried(side.disk, side.disk.image().materialize(.everything, using: &random))
        }
        side.journal = nil
        side.toHandle = []
        side.reportsToTake = []
        side.ackArmed = []
        side.pendingSyncs = []
        side.waiting = []
        side.acknowledgementWaits = [:]
        open(side, fresh: false)
        return "\(side.name) \(powerLoss ? "power loss" : "killed")\(how)"
    }

    /// The lock file is written at the store's opening, long before a power loss here: it stays.
    func carried(_ old: SimulatedDisk, _ new: SimulatedDisk) -> SimulatedDisk {
        new.lockHolder = old.lockHolder
        return new
    }

    // MARK: Effects

    func payload(_ entry: SessionOutbox<Frame>.Entry) -> Int { Int(String(decoding: entry.item.payload, as: UTF8.self)) ?? -1 }

    /// The number of the client whose connection `link` is, if it is open.
    func client(on link: SimulatedLink) -> Int? { connections.first { $0.value.link === link }?.key }

    /// Where a half-open connection is in ``stale``.
    func staleIndex(_ link: SimulatedLink) -> Int? { stale.firstIndex { $0.connection.link === link } }

    /// Whether `side`'s end of `link` is open (the server's end of a half-open connection is).
    func reaches(_ link: SimulatedLink, from side: Side) -> Bool {
        client(on: link) != nil || (side === server && staleIndex(link) != nil)
    }

    /// `link` closes at both ends (as a close or an abort does).
    func close(_ link: SimulatedLink) {
        if let number = client(on: link) { cut(number) } else if let index = staleIndex(link) { dropStale(index) }
    }

    /// Carries out what an input of `key`'s machine on `side` decided, as ``MessageSession`` does:
    /// records to the store (then written, or synced later), senders resumed, the ACK, frames out.
    func settle(_ side: Side, _ key: Journal.Key, _ first: Effects) {
        var queue = [first]
        while !queue.isEmpty {
            let effects = queue.removeFirst()
            if !effects.records.isEmpty {
                let generation = side.sessions[key]?.generation ?? 0
                switch store(effects.records, of: side, chain: (key, generation)) {
                case .success(let position):
                    if let after = effects.afterWrite, side.sessions[key] != nil {
                        var next = Effects()
                        side.sessions[key]!.written(after, &next)
                        if syncs { side.pendingSyncs.append((position, key, after)) }
                        queue.append(next)
                    }
                case .failure(let error):
                    if !side.injected { fail("\(side.name)'s store refused a write: \(error.message)") }
                    count("write refused")
                    if let after = effects.afterWrite, side.sessions[key] != nil {
                        var next = Effects()
                        side.sessions[key]!.writeFailed(after, generation: generation, error: error, &next)
                        queue.append(next)
                    }
                }
            }
            for (waiter, acknowledged) in effects.acknowledgements { acknowledgementWaitEnded(side, waiter, acknowledged) }
            for (sender, error) in effects.senders {
                side.waiting.remove(sender)
                if error == nil { side.promised.append(sender) } else { count("send failed") }
            }
            if let (link, error) = effects.epochNotStored {
                // As `MessageSession`: the store takes no more records, the connection closes.
                count("epoch not stored")
                side.journal.fail(error as? FileError ?? FileError("/store", "\(error)"))
                if let link, reaches(link, from: side) { close(link) }
            }
            if let (link, step) = effects.ack, reaches(link, from: side) {
                switch step {
                case .sendNow: sendAck(side, key, link)
                case .armDeadline: if !side.ackArmed.contains(key) { side.ackArmed.append(key) }
                case .nothing: break
                }
            }
            flush(side, key)
        }
    }

    /// As ``MessageSession`` hands its records to the store: queued with their session's chain
    /// (a failed write fails the rest of its generation), then written.
    func store(_ records: [Journal.Record], of side: Side, chain: (key: Journal.Key, generation: UInt32)?) -> Result<UInt64, FileError> {
        let result = Locked<Result<UInt64, FileError>?>(nil)
        side.journal.enqueue(records, chain: chain) { outcome in result.withLock { $0 = outcome } }
        side.journal.write()
        return result.withLock { $0 } ?? .failure(FileError("/store", "the write did not complete"))
    }

    /// The disk's next `pwrite` or `fdatasync` fails (`EIO`, or `ENOSPC` for a write — the store
    /// retries that once) while `step` runs; one it does not make is not failed later.
    func failNextCall(_ side: Side, _ what: String, _ step: () async -> String) async -> String {
        let errno = what == "write" && Bool.random(using: &random) ? ENOSPC : EIO
        side.disk.failNext = (what == "write" ? "pwrite" : "fdatasync", errno)
        side.injected = true
        let text = await step()
        side.disk.failNext = nil
        count("\(what) fails")
        return "\(side.name)'s next \(what) fails (\(errno == EIO ? "EIO" : "ENOSPC")): \(text)"
    }

    func sendAck(_ side: Side, _ key: Journal.Key, _ link: SimulatedLink) {
        if let count = side.sessions[key]?.takeAck(on: link) { push(Frame.ack(count), from: side, on: link) }
    }

    /// Frames `key`'s machine decided go on the connection they were decided for, if it is open.
    func flush(_ side: Side, _ key: Journal.Key) {
        guard side.sessions[key] != nil else { return }
        var batch: [Machine.Outgoing] = []
        let (driver, epoch, _) = side.sessions[key]!.takeOutgoing(&batch)
        guard !batch.isEmpty else { return }
        for item in batch where item.number != nil {
            let sent = Int(String(decoding: item.frame.payload, as: UTF8.self)) ?? -1
            if side.everReported.contains(sent) {
                fail("\(side.name): \(sent % 1_000_000) goes on the wire again after it was reported undelivered")
            }
        }
        if let connection = connections.values.first(where: { driver === $0.link.sessionDriver }) {
            for item in batch { push(item.frame, from: side, on: connection.link) }
        } else if side === server, stale.contains(where: { driver === $0.connection.link.sessionDriver }) {
            // Written on a half-open connection: the kernel took them, nobody will read them.
        } else {
            side.sessions[key]!.notTransmitted(batch.compactMap(\.number), driver: driver, epoch: epoch)
        }
    }

    /// `frame` goes on `link` (if it is still open) from `side` to the other end.
    func push(_ frame: Frame, from side: Side, on link: SimulatedLink) {
        guard let number = client(on: link) else { return }
        if side === server { connections[number]!.toClient.append(frame) } else { connections[number]!.toServer.append(frame) }
    }

    // MARK: Steps

    /// A client sends on its session; the server on the session of a client the seed picks.
    func send(_ side: Side) -> String {
        var key = side.current
        var to = side.number
        if side === server {
            let reachable = clients.filter { server.currentOf[$0.number] != nil }
            guard !reachable.isEmpty else { return "server has no session to send on" }
            to = reachable[Int.random(in: 0..<reachable.count, using: &random)].number
            key = server.currentOf[to]
        }
        guard let key, let machine = side.sessions[key], machine.ended == nil else { return "\(side.name) has no session to send on" }
        let code = Self.code(from: side, to: to)
        let payload = code * 1_000_000 + side.sent[code, default: 0] + 1
        let frame = Frame(kind: .message, codecID: 1, typeID: "sim", payload: Array(String(payload).utf8))
        let generation = machine.generation
        let named = "\(side.name) sends \(payload % 1_000_000)\(side === server && clients.count > 1 ? " to \(clients[to - 1].name)" : "")"
        var effects = Effects()
        let admission: Machine.Admission
        do {
            admission = try side.sessions[key]!.admit(frame, size: try Frame.validatedSize(frame), storeHasRoom: true, tryDirect: { _ in false }, &effects)
        } catch {
            return "\(side.name) send failed: \(error)"
        }
        switch admission {
        case .storing(let number, let epoch):
            side.sent[code, default: 0] += 1
            side.waiting.insert(payload)
            settle(side, key, effects)
            var waited = Effects()
            side.sessions[key]?.waitForTicket(number, epoch: epoch, generation: generation, payload, &waited)
            settle(side, key, waited)
            waitForAcknowledgement(side, key)
            return "\(named) as #\(number)"
        case .kept(let number, _):
            side.sent[code, default: 0] += 1
            side.promised.append(payload)
            settle(side, key, effects)
            waitForAcknowledgement(side, key)
            return "\(named) as #\(number) (no store?)"
        case .waitForRoom, .waitForStore:
            return "\(side.name) waits for room"
        }
    }

    func connect(_ client: Side) -> String {
        guard let key = client.current, let machine = client.sessions[key] else { return "\(client.name): no session" }
        // As `MessageClient`: its store failed, it gave up (until the process restarts).
        if client.storeFailed { return "\(client.name) does not connect: its store failed" }
        links += 1
        count("connect")
        let link = SimulatedLink(number: links)
        connections[client.number] = Connection(link: link)
        let hello = client.sessions[key]!.clientHello()
        push(HandshakeStateMachine.jsonFrame(.session, hello), from: client, on: link)
        return "\(client.name) connects #\(links) (hello: received \(hello.received), sent \(hello.sent ?? 0), epoch \(machine.epoch))"
    }

    /// Client `number`'s connection ends (if it is open): what is in flight on it is lost.
    func cut(_ number: Int) {
        guard let link = connections.removeValue(forKey: number)?.link else { return }
        for side in [clients[number - 1], server] {
            for key in Array(side.sessions.keys) {
                var effects = Effects()
                side.sessions[key]!.detach(link, &effects)
                settle(side, key, effects)
            }
            // (The server's other connections keep their armed deadlines.)
            side.ackArmed.removeAll { side.sessions[$0]?.channel == nil }
        }
    }

    /// Client `number`'s end of its connection closes; the server's stays open (``stale``): what
    /// the client wrote may still arrive, what the server writes is lost.
    func halfOpenCut(_ number: Int) {
        guard let connection = connections.removeValue(forKey: number) else { return }
        let client = clients[number - 1]
        for key in Array(client.sessions.keys) {
            var effects = Effects()
            client.sessions[key]!.detach(connection.link, &effects)
            settle(client, key, effects)
        }
        client.ackArmed.removeAll { client.sessions[$0]?.channel == nil }
        stale.append((number, Connection(link: connection.link, toServer: connection.toServer, serverKey: connection.serverKey)))
    }

    /// The server's end of a half-open connection closes (its heartbeat noticed, or a resume
    /// aborted it): what was still in flight on it is lost.
    func dropStale(_ index: Int) {
        let link = stale.remove(at: index).connection.link
        for key in Array(server.sessions.keys) {
            var effects = Effects()
            server.sessions[key]!.detach(link, &effects)
            settle(server, key, effects)
        }
        server.ackArmed.removeAll { server.sessions[$0]?.channel == nil }
    }

    /// One of `client`'s half-open connections (the seed picks; each is independent of the others),
    /// with frames in flight if `withFrames`.
    func pickStale(of client: Side, withFrames: Bool) -> Int? {
        let candidates = stale.indices.filter { stale[$0].client == client.number && (!withFrames || !stale[$0].connection.toServer.isEmpty) }
        guard !candidates.isEmpty else { return nil }
        return candidates[Int.random(in: 0..<candidates.count, using: &random)]
    }

    /// The first frame still in flight on a half-open connection of `client` arrives at the server.
    func deliverStale(_ client: Side) async -> String {
        guard let index = pickStale(of: client, withFrames: true) else {
            return "\(client.name): nothing in flight on a half-open connection"
        }
        let frame = stale[index].connection.toServer.removeFirst()
        let connection = stale[index].connection
        count(frame.kind == .session ? "a hello arrived on a half-open connection" : "a frame arrived on a half-open connection")
        return await arrive(frame, on: connection.link, serverKey: connection.serverKey, client, toServer: true, "\(client.name) ⇢ server (half-open)")
    }

    /// The first frame in flight on `client`'s connection one way arrives.
    func deliver(_ client: Side, toServer: Bool) async -> String {
        guard var connection = connections[client.number] else { return "\(client.name): no connection" }
        let frame = toServer ? connection.toServer.removeFirst() : connection.toClient.removeFirst()
        connections[client.number] = connection
        let direction = toServer ? "\(client.name) → server" : "server → \(client.name)"
        return await arrive(frame, on: connection.link, serverKey: connection.serverKey, client, toServer: toServer, direction)
    }

    /// `frame` arrives on `link` (`client`'s connection, or a half-open one of it) at the server or
    /// at the client.
    func arrive(_ frame: Frame, on link: SimulatedLink, serverKey: Journal.Key?, _ client: Side, toServer: Bool, _ direction: String) async -> String {
        let receiver = toServer ? server : client
        switch frame.kind {
        case .session:
            guard let hello = try? JSONDecoder().decode(SessionHello.self, from: Data(frame.payload)) else {
                fail("a SESSION frame did not decode")
                return direction
            }
            return toServer ? await serverHello(hello, link, from: client, direction) : clientAnswer(hello, link, client)
        case .message:
            guard let key = toServer ? serverKey : client.current, receiver.sessions[key] != nil else {
                return "\(direction): message for no session"
            }
            var effects = Effects()
            var arrival = receiver.sessions[key]!.received(on: link, onArrival: false, &effects)
            let payload = Int(String(decoding: frame.payload, as: UTF8.self)) ?? -1
            settle(receiver, key, effects)
            // As the channel: a message of an epoch whose records are not synced yet is held (not
            // counted), with what follows it, until they are — then offered again.
            var waited = ""
            if arrival == .hold {
                waited = " after " + (await sync(receiver))
                var again = Effects()
                guard receiver.sessions[key] != nil else { return "\(direction): held, and its session is gone" }
                guard reaches(link, from: receiver) else { return "\(direction): held\(waited), and the connection closed" }
                arrival = receiver.sessions[key]!.received(on: link, onArrival: false, &again)
                settle(receiver, key, again)
                if arrival == .hold { fail("\(receiver.name): the epoch's records were synced, and the message is still held") }
            }
            guard case .deliver(let number, let epoch, let position) = arrival else { return "\(direction): message ignored" }
            receiver.toHandle.append((key, number, epoch, position, payload))
            return "\(direction): \(payload % 1_000_000) delivered as #\(number) of epoch \(epoch)\(waited)"
        case .ack:
            guard let key = toServer ? serverKey : client.current, receiver.sessions[key] != nil,
                let count = frame.acknowledgedCount
            else { return "\(direction): ACK for no session" }
            var effects = Effects()
            if let violation = receiver.sessions[key]!.acknowledged(count, on: link, &effects) {
                fail("\(receiver.name): \(violation)")
            }
            settle(receiver, key, effects)
            return "\(direction): ACK \(count)"
        default:
            fail("an unexpected frame: \(frame.kind)")
            return direction
        }
    }

    /// The server: a client's SESSION (as `MessageServer` does: a new session's first record is in
    /// the store, synced with power-loss durability, before the answer).
    func serverHello(_ hello: SessionHello, _ link: SimulatedLink, from client: Side, _ direction: String) async -> String {
        guard let key = Journal.Key(hex: hello.id) else {
            fail("a hello with a bad id")
            return "\(direction): hello"
        }
        // As `MessageServer` resuming a session attached to another connection: that one was lost
        // without a sign (or is the newer one, if this hello is a late one from a half-open
        // connection); its loop hands on the frames it took already, then it is aborted.
        var handedOn = ""
        if let old = server.sessions[key]?.channel, old !== link, reaches(old, from: server) {
            count("resumed over a connection lost unnoticed")
            let inFlight = self.client(on: old).map { connections[$0]!.toServer } ?? staleIndex(old).map { stale[$0].connection.toServer } ?? []
            let taken = Int.random(in: 0...inFlight.count, using: &random)
            var arrived: [String] = []
            for frame in inFlight.prefix(taken) where reaches(old, from: server) {
                if let number = self.client(on: old) { connections[number]!.toServer.removeFirst() } else if let index = staleIndex(old) {
                    stale[index].connection.toServer.removeFirst()
                }
                let serverKey = self.client(on: old).flatMap { connections[$0]?.serverKey } ?? staleIndex(old).flatMap { stale[$0].connection.serverKey }
                arrived.append(await arrive(frame, on: old, serverKey: serverKey, client, toServer: true, "(old)"))
            }
            close(old)
            handedOn = " [the old connection aborted after \(taken) of \(inFlight.count) frames in flight: \(arrived.joined(separator: "; "))]"
            guard server.sessions[key] != nil else {
                close(link)
                return "\(direction): hello\(handedOn), and its session ended"
            }
        }
        // As `MessageServer`: a store that failed attaches no session until the process restarts.
        if server.storeFailed {
            close(link)
            return "\(direction): hello\(handedOn), refused: the server's store failed"
        }
        let isNew = server.sessions[key] == nil
        if isNew {
            var machine = Machine(
                id: key, maxCount: Self.maxCount, maxBytes: 1 << 20, stored: true, syncs: syncs, owner: client.name,
                ackEvery: Self.ackEvery)
            machine.reportsDurably = true
            var begun = Effects()
            machine.begin(everConnected: true, &begun)
            do {
                let position = try server.journal.append(begun.records)
                if syncs { try await server.journal.synced(position) }
            } catch {
                // As `MessageServer`: the connection closes with the reason; the client tries again.
                if !server.injected { fail("the server could not store a new session: \(error)") }
                close(link)
                return "\(direction): hello, refused: the server's store failed (\(error.message.prefix(40))…)"
            }
            server.sessions[key] = machine
        }
        var effects = Effects()
        let opened = server.sessions[key]!.serverOpen(hello, isNew: isNew, on: link, &effects)
        if let number = self.client(on: link) { connections[number]?.serverKey = key } else if let index = staleIndex(link) {
            stale[index].connection.serverKey = key
        }
        server.currentOf[client.number] = key
        var text = "\(direction): hello (received \(hello.received), sent \(hello.sent ?? 0))\(handedOn): "
        switch opened {
        case .success(.resumed(let resent)): text += "resumed, \(resent) resent"
        case .success(.new(let lost)):
            text += "new session"
            madeReport(server, key, lost)
        case .success(.restarted(let reason, let lost)), .success(.diverged(let reason, let lost)):
            count("server started anew")
            text += "restarted (\(reason.prefix(40))…), \(lost.count) undelivered"
            madeReport(server, key, lost)
        case .failure(let error):
            text += "refused: \(error.message)"
            settle(server, key, effects)
            close(link)
            return text
        }
        settle(server, key, effects)
        return text
    }

    /// The client: the server's SESSION answer.
    func clientAnswer(_ reply: SessionHello, _ link: SimulatedLink, _ client: Side) -> String {
        let direction = "server → \(client.name)"
        guard let key = client.current else { return "\(direction): answer for no session" }
        // As `MessageSession.clientOpened`: the client's store failed while the SESSION was on its
        // way — no attaching; the client gives up (until the process restarts).
        if client.storeFailed {
            cut(client.number)
            return "\(direction): answer, refused: the client's store failed"
        }
        var effects = Effects()
        let opened = client.sessions[key]!.clientOpened(reply, on: link, &effects)
        let newKey = client.sessions[key]!.id
        let reportID = client.sessions[key]!.takeReport()
        if newKey != key {
            client.sessions[newKey] = client.sessions.removeValue(forKey: key)
            client.current = newKey
        }
        var text = "\(direction): answer (received \(reply.received), resumed \(reply.resumed ?? false)): "
        switch opened {
        case .success(.resumed(let resent)): text += "resumed, \(resent) resent"
        case .success(.new(let lost)), .success(.restarted(_, let lost)):
            text += "new epoch, \(lost.count) undelivered"
            madeReport(client, newKey, lost, id: reportID)
        case .success(.diverged(let reason, let lost)):
            count("client renewed its session")
            text += "diverged (\(reason.prefix(40))…): renewed, \(lost.count) undelivered"
            madeReport(client, newKey, lost, id: reportID)
            settle(client, newKey, effects)
            // The connection closes for a protocol error; its GOODBYE ends the old session at the
            // server (the frame goes before the close: it arrives if the server is there).
            endSession(server, key, "the client renewed the session")
            cut(client.number)
            return text
        case .failure(let error):
            text += "refused: \(error.message)"
            settle(client, newKey, effects)
            cut(client.number)
            return text
        }
        settle(client, newKey, effects)
        return text
    }

    /// The app waits until everything its session keeps now is acknowledged (draws nothing from
    /// the seed: a seed's steps are what they were before the waits).
    func waitForAcknowledgement(_ side: Side, _ key: Journal.Key) {
        guard let machine = side.sessions[key], machine.ended == nil else { return }
        side.lastWaitID += 1
        side.acknowledgementWaits[side.lastWaitID] = Set(machine.outbox.kept.map(payload))
        var effects = Effects()
        side.sessions[key]!.waitForAcknowledgement(UInt64(side.lastWaitID), through: nil, side.lastWaitID, &effects)
        settle(side, key, effects)
    }

    /// A wait ended: once; when acknowledged, its messages are in their receiver's app's log.
    func acknowledgementWaitEnded(_ side: Side, _ waiter: Int, _ acknowledged: Bool) {
        guard let covered = side.acknowledgementWaits.removeValue(forKey: waiter) else {
            return fail("\(side.name): acknowledgement wait \(waiter) ended twice")
        }
        count(acknowledged ? "acknowledgement wait acknowledged" : "acknowledgement wait not acknowledged")
        guard acknowledged else { return }
        let missing = covered.filter { !receiver(of: $0).logged.contains($0) }
        if !missing.isEmpty {
            fail("\(side.name): acknowledgement wait \(waiter) ended acknowledged, but \(receiver(of: missing.min()!).name)'s app never got \(missing.sorted().prefix(5).map { $0 % 1_000_000 })")
        }
    }

    /// Ends `key`'s session on `side`, not kept in its store: what it kept is reported undelivered.
    func endSession(_ side: Side, _ key: Journal.Key, _ reason: String) {
        guard side.sessions[key] != nil else { return }
        var effects = Effects()
        let (lost, _) = side.sessions[key]!.end(MessagingError(.stopped, reason), keepStored: false, &effects)
        madeReport(side, key, lost)
        settle(side, key, effects)
        side.sessions[key] = nil
        if side.current == key { side.current = nil }
        side.currentOf = side.currentOf.filter { $0.value != key }
    }

    /// `lost` were reported undelivered to `side`'s app (nothing when empty): a report it takes
    /// later (``takeReport(_:)``), kept in the store until then — the machine wrote it there, ahead
    /// of the records that drop its messages (`id`: read from the machine already, else now).
    func madeReport(_ side: Side, _ key: Journal.Key, _ lost: [SessionOutbox<Frame>.Entry], id: UInt64? = nil) {
        let id = id ?? side.sessions[key]?.takeReport()
        guard !lost.isEmpty else { return }
        guard let id else { return fail("\(side.name): \(lost.count) messages reported undelivered, and no report in the store") }
        count("reports made")
        side.reportsToTake.append((key, id, lost.map(payload)))
        side.everReported.formUnion(lost.map(payload))
    }

    /// The app takes the first report made to it: writes its messages down (its own durable log),
    /// then the library learns it was taken (as the events loop asking for the next event).
    func takeReport(_ side: Side) -> String {
        let report = side.reportsToTake.removeFirst()
        side.reported.formUnion(report.payloads)
        if !side.storeFailed, case .failure(let error) = store([.reportTaken(report.key, report: report.id)], of: side, chain: nil),
            !side.injected
        {
            fail("\(side.name)'s store refused a report's end: \(error.message)")
        }
        count("reports taken")
        return "\(side.name) takes a report of \(report.payloads.count) undelivered"
    }

    /// The app handles the first event for it: a report of undelivered messages (``takeReport(_:)``),
    /// or a message delivered to it — its own durable log first (with the message's position), then
    /// the library learns it was handled.
    func handle(_ side: Side) -> String {
        if !side.reportsToTake.isEmpty { return takeReport(side) }
        guard !side.toHandle.isEmpty else { return "\(side.name) has nothing to handle" }
        let item = side.toHandle.removeFirst()
        let tag = "\(item.position.hex)#\(item.number)"
        var text = "\(side.name) handles \(item.payload % 1_000_000) (#\(item.number))"
        if let earlier = side.positions[tag] {
            if earlier != item.payload {
                fail("\(side.name): position #\(item.number) of one session named \(earlier % 1_000_000) and then \(item.payload % 1_000_000): a number was reused for another message")
            }
            text += ": seen before (same position), skipped"
        } else {
            let code = item.payload / 1_000_000
            if let last = side.lastFrom[code], item.payload <= last {
                fail("\(side.name): \(item.payload % 1_000_000) arrived after \(last % 1_000_000) under a new position: a duplicate or out of order")
            }
            // Sessions crossed: a message for another app, or (at the server) one that came on the
            // session of another client (its owner, kept in the store with it).
            let owner = side === server ? side.sessions[item.key]?.owner : nil
            if receiver(of: item.payload) !== side || (owner != nil && code < 10 && owner != clients[code - 1].name) {
                fail("\(side.name): got \(item.payload % 1_000_000) from code \(code) on a session of \(owner ?? side.name): sessions crossed")
            }
            side.log.append(item.payload)
            side.logged.insert(item.payload)
            side.lastFrom[code] = item.payload
            side.positions[tag] = item.payload
        }
        var effects = Effects()
        side.sessions[item.key]?.handled(item.number, epoch: item.epoch, &effects)
        settle(side, item.key, effects)
        return text
    }

    func sync(_ side: Side) async -> String {
        let position = side.journal.shared.withLock { $0.written }
        var failure: FileError?
        do {
            try await side.journal.synced(position)
        } catch {
            if !side.injected { fail("\(side.name)'s sync failed: \(error.message)") }
            failure = error
        }
        let due = side.pendingSyncs.filter { $0.position <= position }
        side.pendingSyncs.removeAll { $0.position <= position }
        for item in due {
            var effects = Effects()
            if let failure {
                side.sessions[item.key]?.syncFailed(item.after, error: failure, &effects)
            } else {
                side.sessions[item.key]?.synced(item.after, &effects)
            }
            settle(side, item.key, effects)
        }
        return "\(side.name) syncs (\(due.count) waiting)\(failure == nil ? "" : ": failed")"
    }

    /// The deadline of every armed ACK passes (each on its session's connection, if still open).
    func ackDeadline(_ side: Side) -> String {
        let armed = side.ackArmed
        side.ackArmed = []
        var sent = 0
        for key in armed {
            guard let link = side.sessions[key]?.channel, reaches(link, from: side) else { continue }
            side.sessions[key]!.ackDeadlinePassed(on: link)
            sendAck(side, key, link)
            sent += 1
        }
        return "\(side.name) ack deadline (\(armed.count)\(sent == armed.count ? "" : ", \(armed.count - sent) off their connection"))"
    }

    // MARK: Checking

    func check() {
        for side in sides {
            for machine in side.sessions.values {
                for waiter in machine.acknowledgementWaiters {
                    if waiter.epoch != machine.epoch || machine.ended != nil {
                        fail("\(side.name): an acknowledgement wait of epoch \(waiter.epoch) still waits in epoch \(machine.epoch)\(machine.ended != nil ? " of an ended session" : "")")
                    } else if waiter.through <= machine.outbox.acknowledged {
                        fail("\(side.name): an acknowledgement wait through \(waiter.through) still waits, \(machine.outbox.acknowledged) acknowledged")
                    }
                }
                let inbox = machine.inbox
                if !(inbox.acknowledged <= inbox.stored && inbox.stored <= inbox.handled && inbox.handled <= inbox.delivered) {
                    fail("\(side.name): inbox counts out of order: acknowledged \(inbox.acknowledged), stored \(inbox.stored), handled \(inbox.handled), delivered \(inbox.delivered)")
                }
            }
        }
    }

    func finalCheck() {
        // Settled: each client's session on its connection, and the server's of the same id on it.
        var keys: Set<Journal.Key> = []
        for client in clients {
            guard let key = client.current, let mine = client.sessions[key], let link = connections[client.number]?.link else {
                return fail("settled without \(client.name)'s session on a connection")
            }
            keys.insert(key)
            if mine.channel !== link || server.sessions[key]?.channel !== link {
                fail("settled, but \(client.name)'s session and the server's of its id are not both on its connection")
            }
            let theirs = server.sessions[key]?.outbox.count ?? 0
            for (side, left) in [(client, mine.outbox.count), (server, theirs)] where left > 0 {
                fail("\(side.name): \(left) messages still unacknowledged on \(client.name)'s session after everything settled")
            }
        }
        // The server's other sessions (the client renewed or ended them where the server did not
        // hear it: a GOODBYE lost with a cut, an older session ended at the client's restart) end
        // when their grace period passes, as `MessageServer` ends them: what they kept is reported.
        for other in server.sessions.keys.sorted(by: { $0.hex < $1.hex }) where !keys.contains(other) {
            count("server session ended by its grace period")
            endSession(server, other, "its grace period passed")
        }
        // The apps take what was reported to them last.
        for side in sides { while !side.reportsToTake.isEmpty { _ = takeReport(side) } }
        for side in sides where !side.acknowledgementWaits.isEmpty {
            fail("\(side.name): \(side.acknowledgementWaits.count) acknowledgement waits never ended after everything settled")
        }
        for sender in sides {
            let missing = sender.promised.filter { !receiver(of: $0).logged.contains($0) && !sender.reported.contains($0) && !sender.mayLose.contains($0) }
            if !missing.isEmpty {
                fail("\(sender.name): \(missing.count) sent messages neither arrived nor were reported undelivered: \(missing.prefix(5).map { $0 % 1_000_000 })")
            }
        }
    }

    var status: String {
        func describe(_ side: Side, _ key: Journal.Key?) -> String {
            guard let key, let machine = side.sessions[key] else { return "\(side.name) -" }
            let inbox = machine.inbox
            let attached = machine.channel != nil ? "+" : "-"
            return "\(side.name)\(attached) e\(machine.epoch) out \(machine.outbox.acknowledged)/\(machine.outbox.nextNumber - 1) in \(inbox.acknowledged)/\(inbox.handled)/\(inbox.delivered) log \(side.log.count)"
        }
        return clients.map { client in
            let halfOpen = stale.filter { $0.client == client.number }.count
            let wire = (connections[client.number].map { "wire \($0.toServer.count)/\($0.toClient.count)" } ?? "no connection")
                + (halfOpen > 0 ? " +\(halfOpen) half-open" : "")
            return "\(describe(client, client.current)) | \(describe(server, server.currentOf[client.number])) | \(wire)"
        }.joined(separator: " || ")
    }
}
