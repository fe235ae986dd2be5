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

/// A deterministic simulation of one durable session (issue 54, 3 — its session part): a client
/// and a server, each a real ``SessionMachine`` (the server's one per session id it knows) with its
/// real ``SessionJournal`` on a ``SimulatedDisk``, joined by a connection in memory, driven by a
/// seed. The seed picks every step: either app sends a numbered message, a frame in flight
/// arrives, an app handles a delivered message, a store syncs, an acknowledgement deadline passes,
/// the connection is cut (what is in flight is lost) or made again, a process is killed (`kill -9`:
/// the page cache survives) or the power fails (the disk keeps what ``SimulatedDisk/materialize``
/// leaves: nothing unsynced, a prefix, a torn or zero-filled write, a subset; the machine boots
/// again). Durability (process crash or power loss) is the seed's too.
///
/// Each app keeps what it handled in its own durable log, with the message's position (the
/// library's promise: a message delivered again carries the position it had). Checked after every
/// step: a position never names two messages (the session never reuses a number for another
/// message, also after a store lost records); each app's log holds the peer's messages in the order
/// they were sent, each once; ACKs never claim more than was sent; every inbox counts in order
/// (acknowledged ≤ stored ≤ handled ≤ delivered); a store always opens again. At the end (the
/// faults stop, the connection is made and everything in flight settles): both sides' sessions on
/// that connection, nothing left unacknowledged in them, and — once the server's other sessions
/// ended with their grace period — every message whose `send` returned is in the peer's log or
/// was reported undelivered, except, with process-crash durability, those a power loss could take
/// (its promise is the process's crash, not the machine's).
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
        var disk = SimulatedDisk()
        var journal: SessionJournal!
        var boot = 1
        var sessions: [Journal.Key: Machine] = [:]
        /// The client's session; the server's session of the client (the last one opened).
        var current: Journal.Key?
        /// Writes whose sync lets their messages go or their count be acknowledged.
        var pendingSyncs: [(position: UInt64, key: Journal.Key, after: Machine.AfterWrite)] = []
        /// Delivered to the app, not handled yet (lost with the process).
        var toHandle: [(key: Journal.Key, number: UInt64, epoch: UInt64, position: Journal.Key, payload: Int)] = []
        var ackArmed: [Journal.Key] = []
        // The app's durable state.
        var log: [Int] = []
        var positions: [String: Int] = [:]
        var sent = 0
        var promised: [Int] = []
        var reported: Set<Int> = []
        var mayLose: Set<Int> = []
        /// Payloads admitted and waiting for their `send` to return (lost with the process).
        var waiting: Set<Int> = []
        /// The app's waits for acknowledgement (``SessionMachine/waitForAcknowledgement(_:through:_:_:)``,
        /// one after each send, for everything kept then), by id: the payloads each covers (lost
        /// with the process). One that ends acknowledged must find them all in the peer's log.
        var acknowledgementWaits: [Int: Set<Int>] = [:]
        var lastWaitID = 0
        /// A write or sync failure was armed on the disk since the store opened: a store that
        /// refuses a write or a sync without one is a fault.
        var injected = false
        /// The store failed a sync: it takes no more records until the process starts again.
        var storeFailed: Bool { journal?.shared.withLock { $0.failure != nil } ?? false }

        init(name: String, role: Journal.Role) {
            self.name = name
            self.role = role
        }

        /// The payloads this side sends: client 1_000_001…, server 2_000_001….
        var payloadBase: Int { role == .client ? 1_000_000 : 2_000_000 }
    }

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
    let client = Side(name: "client", role: .client)
    let server = Side(name: "server", role: .server)
    var connection: Connection?
    var links = 0
    var outcome = Outcome()
    let logger = Logger(label: "session-simulation", factory: { _ in SwiftLogNoOpLogHandler() })
    static let maxCount = 12
    static let ackEvery: UInt64 = 3

    init(seed: UInt64, steps: Int = 300) {
        self.seed = seed
        self.steps = steps
        random = SeededRandom(seed)
        syncs = Bool.random(using: &random)
    }

    static func run(seed: UInt64, steps: Int = 300) async -> Outcome {
        let simulation = SessionSimulation(seed: seed, steps: steps)
        await simulation.run()
        return simulation.outcome
    }

    func fail(_ text: String) {
        if outcome.failure == nil { outcome.failure = text }
    }

    func count(_ kind: String) { outcome.counts[kind, default: 0] += 1 }

    // MARK: Running

    func run() async {
        outcome.trace.append("seed \(seed): durability \(syncs ? "power-loss" : "process-crash")")
        open(client, fresh: true)
        open(server, fresh: true)
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

    /// One step the seed picks among those possible now.
    func takeStep() async -> String {
        var choices: [(weight: Int, name: String)] = [
            (12, "client sends"), (8, "server sends"), (6, "client handles"), (6, "server handles"),
            (4, "client syncs"), (4, "server syncs"), (3, "client ack deadline"), (3, "server ack deadline"),
            (2, "client killed"), (2, "server killed"), (1, "client power loss"), (1, "server power loss"),
            (1, "both power loss"), (1, "client write fails"), (1, "server write fails"), (1, "client sync fails"),
            (1, "server sync fails"),
        ]
        if let connection {
            choices += [(14, "to server"), (14, "to client"), (3, "cut")]
            if connection.toServer.isEmpty { choices.removeAll { $0.name == "to server" } }
            if connection.toClient.isEmpty { choices.removeAll { $0.name == "to client" } }
        } else {
            choices.append((10, "connect"))
        }
        let total = choices.reduce(0) { $0 + $1.weight }
        var pick = Int.random(in: 0..<total, using: &random)
        var name = choices[0].name
        for choice in choices {
            if pick < choice.weight {
                name = choice.name
                break
            }
            pick -= choice.weight
        }
        return await perform(name)
    }

    /// Without faults: the next thing to settle, in a fixed order; nil when nothing is left.
    func settleStep() async -> String? {
        // A process whose store failed a sync goes on in memory but acknowledges nothing it
        // handles: its operator restarts it (the log said what failed).
        for side in [client, server] where side.storeFailed { return await perform("\(side.name) killed") }
        guard let connection else { return await perform("connect") }
        if !connection.toServer.isEmpty { return await perform("to server") }
        if !connection.toClient.isEmpty { return await perform("to client") }
        for side in [client, server] {
            if !side.toHandle.isEmpty { return await perform("\(side.name) handles") }
            if !side.pendingSyncs.isEmpty { return await perform("\(side.name) syncs") }
            if !side.ackArmed.isEmpty { return await perform("\(side.name) ack deadline") }
        }
        return nil
    }

    func side(_ name: Substring) -> Side { name == "client" ? client : server }

    func perform(_ name: String) async -> String {
        let words = name.split(separator: " ", maxSplits: 1)
        switch name {
        case "connect": return connect()
        case "cut":
            count("cut")
            cut()
            return "cut"
        case "both power loss":
            // Both on one machine (as two processes of one host, or a client and server in one
            // rack losing power together): both stores may lose the same tail.
            return restart(client, powerLoss: true) + ", " + restart(server, powerLoss: true)
        case "to server": return await deliver(toServer: true)
        case "to client": return await deliver(toServer: false)
        default:
            let side = side(words[0])
            switch words[1] {
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
        side.injected = false
        let journal = side.journal!
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
                let machine = Machine(
                    id: .random(), maxCount: Self.maxCount, maxBytes: 1 << 20, stored: true, syncs: syncs, owner: nil,
                    ackEvery: Self.ackEvery)
                do {
                    try journal.append(.session(machine.snapshot))
                } catch {
                    return fail("the client's new session was not stored: \(error.message)")
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
        Machine(restoring: old, maxCount: Self.maxCount, maxBytes: 1 << 20, syncs: syncs, ackEvery: Self.ackEvery)
    }

    /// The process ends (`kill -9`, or the power) and starts again at once.
    func restart(_ side: Side, powerLoss: Bool) -> String {
        count(powerLoss ? "power loss" : "killed")
        if connection != nil { cut() }
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
                if let link, link === connection?.link { cut() }
            }
            if let (link, step) = effects.ack, link === connection?.link {
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
    func store(_ records: [Journal.Record], of side: Side, chain: (key: Journal.Key, generation: UInt32)) -> Result<UInt64, FileError> {
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
        if let count = side.sessions[key]?.takeAck(on: link) { push(Frame.ack(count), from: side) }
    }

    /// Frames `key`'s machine decided go on the connection they were decided for, if it is open.
    func flush(_ side: Side, _ key: Journal.Key) {
        guard side.sessions[key] != nil else { return }
        var batch: [Machine.Outgoing] = []
        let (driver, epoch, _) = side.sessions[key]!.takeOutgoing(&batch)
        guard !batch.isEmpty else { return }
        if let connection, driver === connection.link.sessionDriver {
            for item in batch { push(item.frame, from: side) }
        } else {
            side.sessions[key]!.notTransmitted(batch.compactMap(\.number), driver: driver, epoch: epoch)
        }
    }

    func push(_ frame: Frame, from side: Side) {
        if side === client { connection?.toServer.append(frame) } else { connection?.toClient.append(frame) }
    }

    // MARK: Steps

    func send(_ side: Side) -> String {
        guard let key = side.current, let machine = side.sessions[key], machine.ended == nil else { return "\(side.name) has no session to send on" }
        let payload = side.payloadBase + side.sent + 1
        let frame = Frame(kind: .message, codecID: 1, typeID: "sim", payload: Array(String(payload).utf8))
        let generation = machine.generation
        var effects = Effects()
        let admission: Machine.Admission
        do {
            admission = try side.sessions[key]!.admit(frame, size: try Frame.validatedSize(frame), storeHasRoom: true, tryDirect: { _ in false }, &effects)
        } catch {
            return "\(side.name) send failed: \(error)"
        }
        switch admission {
        case .storing(let number, let epoch):
            side.sent += 1
            side.waiting.insert(payload)
            settle(side, key, effects)
            var waited = Effects()
            side.sessions[key]?.waitForTicket(number, epoch: epoch, generation: generation, payload, &waited)
            settle(side, key, waited)
            waitForAcknowledgement(side, key)
            return "\(side.name) sends \(payload - side.payloadBase) as #\(number)"
        case .kept(let number, _):
            side.sent += 1
            side.promised.append(payload)
            settle(side, key, effects)
            waitForAcknowledgement(side, key)
            return "\(side.name) sends \(payload - side.payloadBase) as #\(number) (no store?)"
        case .waitForRoom, .waitForStore:
            return "\(side.name) waits for room"
        }
    }

    func connect() -> String {
        guard let key = client.current, let machine = client.sessions[key] else { return "no client session" }
        // As `MessageClient`: its store failed, it gave up (until the process restarts).
        if client.storeFailed { return "the client does not connect: its store failed" }
        links += 1
        count("connect")
        connection = Connection(link: SimulatedLink(number: links))
        let hello = client.sessions[key]!.clientHello()
        push(HandshakeStateMachine.jsonFrame(.session, hello), from: client)
        return "connect #\(links) (hello: received \(hello.received), sent \(hello.sent ?? 0), epoch \(machine.epoch))"
    }

    func cut() {
        guard let link = connection?.link else { return }
        connection = nil
        for side in [client, server] {
            for key in Array(side.sessions.keys) {
                var effects = Effects()
                side.sessions[key]!.detach(link, &effects)
                settle(side, key, effects)
            }
            side.ackArmed = []
        }
    }

    func deliver(toServer: Bool) async -> String {
        guard var connection else { return "no connection" }
        let frame = toServer ? connection.toServer.removeFirst() : connection.toClient.removeFirst()
        self.connection = connection
        let link = connection.link
        let receiver = toServer ? server : client
        let direction = toServer ? "to server" : "to client"
        switch frame.kind {
        case .session:
            guard let hello = try? JSONDecoder().decode(SessionHello.self, from: Data(frame.payload)) else {
                fail("a SESSION frame did not decode")
                return direction
            }
            return toServer ? await serverHello(hello, link) : clientAnswer(hello, link)
        case .message:
            guard let key = toServer ? connection.serverKey : client.current, receiver.sessions[key] != nil else {
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
                guard self.connection?.link === link else { return "\(direction): held\(waited), and the connection closed" }
                arrival = receiver.sessions[key]!.received(on: link, onArrival: false, &again)
                settle(receiver, key, again)
                if arrival == .hold { fail("\(receiver.name): the epoch's records were synced, and the message is still held") }
            }
            guard case .deliver(let number, let epoch, let position) = arrival else { return "\(direction): message ignored" }
            receiver.toHandle.append((key, number, epoch, position, payload))
            return "\(direction): \(payload % 1_000_000) delivered as #\(number) of epoch \(epoch)\(waited)"
        case .ack:
            guard let key = toServer ? connection.serverKey : client.current, receiver.sessions[key] != nil,
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
    func serverHello(_ hello: SessionHello, _ link: SimulatedLink) async -> String {
        guard let key = Journal.Key(hex: hello.id) else {
            fail("a hello with a bad id")
            return "to server: hello"
        }
        // As `MessageServer`: a store that failed attaches no session until the process restarts.
        if server.storeFailed {
            cut()
            return "to server: hello, refused: the server's store failed"
        }
        let isNew = server.sessions[key] == nil
        if isNew {
            var machine = Machine(
                id: key, maxCount: Self.maxCount, maxBytes: 1 << 20, stored: true, syncs: syncs, owner: "client", ackEvery: Self.ackEvery)
            var begun = Effects()
            machine.begin(everConnected: true, &begun)
            do {
                let position = try server.journal.append(begun.records)
                if syncs { try await server.journal.synced(position) }
            } catch {
                // As `MessageServer`: the connection closes with the reason; the client tries again.
                if !server.injected { fail("the server could not store a new session: \(error)") }
                cut()
                return "to server: hello, refused: the server's store failed (\(error.message.prefix(40))…)"
            }
            server.sessions[key] = machine
        }
        var effects = Effects()
        let opened = server.sessions[key]!.serverOpen(hello, isNew: isNew, on: link, &effects)
        connection?.serverKey = key
        server.current = key
        var text = "to server: hello (received \(hello.received), sent \(hello.sent ?? 0)): "
        switch opened {
        case .success(.resumed(let resent)): text += "resumed, \(resent) resent"
        case .success(.new(let lost)):
            text += "new session"
            server.reported.formUnion(lost.map(payload))
        case .success(.restarted(let reason, let lost)), .success(.diverged(let reason, let lost)):
            count("server started anew")
            text += "restarted (\(reason.prefix(40))…), \(lost.count) undelivered"
            server.reported.formUnion(lost.map(payload))
        case .failure(let error):
            text += "refused: \(error.message)"
            settle(server, key, effects)
            cut()
            return text
        }
        settle(server, key, effects)
        return text
    }

    /// The client: the server's SESSION answer.
    func clientAnswer(_ reply: SessionHello, _ link: SimulatedLink) -> String {
        guard let key = client.current else { return "to client: answer for no session" }
        // As `MessageSession.clientOpened`: the client's store failed while the SESSION was on its
        // way — no attaching; the client gives up (until the process restarts).
        if client.storeFailed {
            cut()
            return "to client: answer, refused: the client's store failed"
        }
        var effects = Effects()
        let opened = client.sessions[key]!.clientOpened(reply, on: link, &effects)
        let newKey = client.sessions[key]!.id
        if newKey != key {
            client.sessions[newKey] = client.sessions.removeValue(forKey: key)
            client.current = newKey
        }
        var text = "to client: answer (received \(reply.received), resumed \(reply.resumed ?? false)): "
        switch opened {
        case .success(.resumed(let resent)): text += "resumed, \(resent) resent"
        case .success(.new(let lost)), .success(.restarted(_, let lost)):
            text += "new epoch, \(lost.count) undelivered"
            client.reported.formUnion(lost.map(payload))
        case .success(.diverged(let reason, let lost)):
            count("client renewed its session")
            text += "diverged (\(reason.prefix(40))…): renewed, \(lost.count) undelivered"
            client.reported.formUnion(lost.map(payload))
            settle(client, newKey, effects)
            // The connection closes for a protocol error; its GOODBYE ends the old session at the
            // server (the frame goes before the close: it arrives if the server is there).
            endSession(server, key, "the client renewed the session")
            cut()
            return text
        case .failure(let error):
            text += "refused: \(error.message)"
            settle(client, newKey, effects)
            cut()
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

    /// A wait ended: once; when acknowledged, its messages are in the peer's app's log.
    func acknowledgementWaitEnded(_ side: Side, _ waiter: Int, _ acknowledged: Bool) {
        guard let covered = side.acknowledgementWaits.removeValue(forKey: waiter) else {
            return fail("\(side.name): acknowledgement wait \(waiter) ended twice")
        }
        count(acknowledged ? "acknowledgement wait acknowledged" : "acknowledgement wait not acknowledged")
        guard acknowledged else { return }
        let peer = side === client ? server : client
        let missing = covered.subtracting(peer.log)
        if !missing.isEmpty {
            fail("\(side.name): acknowledgement wait \(waiter) ended acknowledged, but \(peer.name)'s app never got \(missing.sorted().prefix(5).map { $0 % 1_000_000 })")
        }
    }

    /// Ends `key`'s session on `side`, not kept in its store: what it kept is reported undelivered.
    func endSession(_ side: Side, _ key: Journal.Key, _ reason: String) {
        guard side.sessions[key] != nil else { return }
        var effects = Effects()
        let (lost, _) = side.sessions[key]!.end(MessagingError(.stopped, reason), keepStored: false, &effects)
        side.reported.formUnion(lost.map(payload))
        settle(side, key, effects)
        side.sessions[key] = nil
        if side.current == key { side.current = nil }
    }

    /// The app handles the first message delivered to it: its own durable log first (with the
    /// message's position), then the library learns it was handled.
    func handle(_ side: Side) -> String {
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
            if let last = side.log.last, item.payload <= last {
                fail("\(side.name): \(item.payload % 1_000_000) arrived after \(last % 1_000_000) under a new position: a duplicate or out of order")
            }
            side.log.append(item.payload)
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

    func ackDeadline(_ side: Side) -> String {
        guard let link = connection?.link else {
            side.ackArmed = []
            return "\(side.name): ack deadline, no connection"
        }
        let armed = side.ackArmed
        side.ackArmed = []
        for key in armed {
            side.sessions[key]?.ackDeadlinePassed(on: link)
            sendAck(side, key, link)
        }
        return "\(side.name) ack deadline (\(armed.count))"
    }

    // MARK: Checking

    func check() {
        for side in [client, server] {
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
        // Settled on one connection: the client's session attached, and the server's of the same id.
        guard let key = client.current, let mine = client.sessions[key], let link = connection?.link else {
            return fail("settled without a client session on a connection")
        }
        if mine.channel !== link || server.sessions[key]?.channel !== link {
            fail("settled, but the client's session and the server's of its id are not both on the connection")
        }
        for side in [client, server] {
            if let key = side.current, let machine = side.sessions[key], machine.outbox.count > 0 {
                fail("\(side.name): \(machine.outbox.count) messages still unacknowledged after everything settled")
            }
        }
        // The server's other sessions (the client renewed or ended them where the server did not
        // hear it: a GOODBYE lost with a cut, an older session ended at the client's restart) end
        // when their grace period passes, as `MessageServer` ends them: what they kept is reported.
        for other in server.sessions.keys where other != key {
            count("server session ended by its grace period")
            endSession(server, other, "its grace period passed")
        }
        for side in [client, server] where !side.acknowledgementWaits.isEmpty {
            fail("\(side.name): \(side.acknowledgementWaits.count) acknowledgement waits never ended after everything settled")
        }
        for (sender, receiver) in [(client, server), (server, client)] {
            let logged = Set(receiver.log)
            let missing = sender.promised.filter { !logged.contains($0) && !sender.reported.contains($0) && !sender.mayLose.contains($0) }
            if !missing.isEmpty {
                fail("\(sender.name): \(missing.count) sent messages neither arrived nor were reported undelivered: \(missing.prefix(5).map { $0 % 1_000_000 })")
            }
        }
    }

    var status: String {
        func describe(_ side: Side) -> String {
            guard let key = side.current, let machine = side.sessions[key] else { return "\(side.name) -" }
            let inbox = machine.inbox
            let attached = machine.channel != nil ? "+" : "-"
            return "\(side.name)\(attached) e\(machine.epoch) out \(machine.outbox.acknowledged)/\(machine.outbox.nextNumber - 1) in \(inbox.acknowledged)/\(inbox.handled)/\(inbox.delivered) log \(side.log.count)"
        }
        let wire = connection.map { "wire \($0.toServer.count)/\($0.toClient.count)" } ?? "no connection"
        return "\(describe(client)) | \(describe(server)) | \(wire)"
    }
}
