// session-chaos: one side of the chaos test of durable sessions (SessionChaosIntegrationTests,
// Tests/chaos/session-chaos.sh). A collector (server) and a sensor (client), each with a session
// store, each optionally streaming numbered values to the other; each receiving side writes what it
// gets to its file, then lets the library acknowledge it — the app of the issue, without the 250
// lines it had to write itself. The test kills them with SIGKILL at random points and checks the
// files.
//
//   session-chaos server|client --port P --dir DIR [--send] [--durability crash|power] [--recover] [--boot ID]
//
// DIR holds the store (DIR/store), the identity (DIR/identity) and its logs:
//   received.log     "<session> <number> <value>" per message taken, in order (the app's effect)
//   intents.log      one value per line, written before its `send` (where a restarted sender goes on)
//   sent.log         "<value> <session> <epoch> <number> <acknowledged>" per line, written once `send`
//                    returned (the message is in the store), with where the session's sending stood
//                    then (number "-" when the epoch changed during the send; the acknowledged count
//                    for reading a failed run); "# start <pid>" as each process starts
//   undelivered.log  what the library reported as never acknowledged (must stay empty, unless --recover)
//   duplicates.log   with --recover: values that arrived again and were dropped by the app
//   owed.log         with --recover: what the sender owes (below)
//   program.log      the log, and what the app saw (events, skipped positions), with times and pids
// Exactly once to the app (the recipe of MessageSessions.md): a message whose position (session,
// number) the file has already is skipped — it came again because the process died between
// writing it and acknowledging it.
//
// --recover: the recipe for stores that may lose records (MessageSessions.md, "When the store lost
// records"; the test cuts the stores between kills): the receiver also skips a value it has (an
// idempotency key, as an order id); the sender sends again what was reported undelivered (the
// library keeps a report in the store until the events loop asked for the next event, and makes
// it again after a restart: a kill before the app wrote it down loses nothing) and, when it starts,
// what its own log says it sent and the store no longer knows (`sendProgress`).
//
// --boot ID: the boot of the machine the store takes itself to run in (the test gives a side whose
// store it cut as a power loss would a new one, as the restart after a power loss is a new boot).
//
// Signals: SIGUSR1 stops sending; once everything sent is acknowledged the program prints DRAINED.
// SIGTERM ends it. It prints READY once it listens (server) or has started (client).
import Dispatch
import Foundation
import Locks
import Logging
import Messaging

#if canImport(Glibc)
    import Glibc
#endif

struct Options {
    var role = ""
    var port: UInt16 = 0
    var directory = ""
    var send = false
    var durability = SessionStore.Durability.processCrash
    var recover = false
    var boot: String?

    init(_ arguments: [String]) {
        var rest = arguments.dropFirst()
        role = rest.popFirst() ?? ""
        while let argument = rest.popFirst() {
            switch argument {
            case "--port": port = UInt16(rest.popFirst() ?? "") ?? 0
            case "--dir": directory = rest.popFirst() ?? ""
            case "--send": send = true
            case "--durability": durability = rest.popFirst() == "power" ? .powerLoss : .processCrash
            case "--recover": recover = true
            case "--boot": boot = rest.popFirst()
            default: fail("unknown argument \(argument)")
            }
        }
        guard role == "server" || role == "client", port != 0, !directory.isEmpty else {
            fail("usage: session-chaos server|client --port P --dir DIR [--send] [--durability crash|power] [--recover] [--boot ID]")
        }
    }
}

/// A line on standard output, at once (the test waits for it).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("session-chaos: \(message)\n".utf8))
    exit(2)
}

/// The connections made so far (the server's accepted, the client's connected): a sender with
/// nothing to send on waits for the next one, woken by it — not on a timer.
final class Connections: Sendable {
    private let state = Locked<(count: Int, waiters: [(after: Int, CheckedContinuation<Void, Never>)])>((0, []))

    var count: Int { state.withLock { $0.count } }

    /// One more connection: every sender waiting for one past the count it saw goes on.
    func made() {
        let woken = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.count += 1
            let count = state.count
            let due = state.waiters.filter { $0.after < count }.map(\.1)
            state.waiters.removeAll { $0.after < count }
            return due
        }
        for waiter in woken { waiter.resume() }
    }

    /// Returns once a connection after the `seen`-th was made (at once if one was). Unbounded: the
    /// test's harness bounds the run, and a process that ends does not wait for it.
    func next(after seen: Int) async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.count > seen { return true }
                state.waiters.append((seen, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }
}

/// An append-only log file written with `write(2)`: in the operating system when it returns.
final class LogFile: Sendable {
    let path: String
    private let fd: Int32

    init(_ path: String) {
        self.path = path
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        if fd < 0 { fail("cannot open \(path)") }
    }

    func append(_ line: String) {
        let bytes = Array((line + "\n").utf8)
        if write(fd, bytes, bytes.count) != bytes.count { fail("cannot write \(path)") }
    }

    var lines: [Substring] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n")
    }
}

struct Value: Codable, Sendable { var v: Int }

/// The log also goes to DIR/program.log, appended with the time and the process id: a failed run
/// kept (`LANMSG_CHAOS_KEEP=1`) has the log of every process of each side beside its files, where
/// standard output and error go with the process.
struct FileLogHandler: LogHandler {
    let file: LogFile
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .info
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(event: LogEvent) {
        let fields = (event.metadata ?? [:]).merging(metadata) { new, _ in new }.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        file.append(stamped("\(event.level) \(event.message)" + (fields.isEmpty ? "" : " " + fields.joined(separator: " "))))
    }
}

let options = Options(CommandLine.arguments)
try? FileManager.default.createDirectory(atPath: options.directory, withIntermediateDirectories: true)
let programLog = LogFile(options.directory + "/program.log")
/// `line` after the time (seconds since the epoch, to the microsecond) and the process id.
func stamped(_ line: String) -> String {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return "\(now.tv_sec).\(String(format: "%06ld", now.tv_nsec / 1000)) \(getpid()) \(line)"
}

/// A line in DIR/program.log whatever the log level: what the app saw (events, skips, the start).
func note(_ line: String) { programLog.append(stamped(line)) }
note("start: \(CommandLine.arguments.dropFirst().joined(separator: " "))")
let logger = {
    var logger = Logger(label: "session-chaos-\(options.role)") {
        MultiplexLogHandler([StreamLogHandler.standardError(label: $0), FileLogHandler(file: programLog)])
    }
    // (Notices by default: the library says so when it makes a report again after a restart,
    // which the test counts.)
    logger.logLevel = ProcessInfo.processInfo.environment["CHAOS_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .notice
    return logger
}()
let received = LogFile(options.directory + "/received.log")
let sent = LogFile(options.directory + "/sent.log")
// Each process's lines after a line of its own (for reading a failed run: a (session, epoch) pair
// can come back after the store lost records, the epoch being counted from what the store kept).
sent.append("# start \(getpid())")
let undelivered = LogFile(options.directory + "/undelivered.log")
let intents = LogFile(options.directory + "/intents.log")
let duplicates = LogFile(options.directory + "/duplicates.log")
/// --recover: "+v" when a value is owed (reported undelivered, or lost by the store), "-v" once its
/// `send` returned again: what is owed survives a kill too. A value is owed while its last line is
/// "+v": one send that returned pays every debt written before it.
let owedLog = LogFile(options.directory + "/owed.log")

// The recipe: the last position taken per session, from the file (the app's own durable state);
// with --recover also the values taken.
let lastTaken = Locked<[String: UInt64]>([:])
let valuesTaken = Locked<Set<Int>>([])
for line in received.lines {
    let fields = line.split(separator: " ")
    guard fields.count == 3, let number = UInt64(fields[1]), let value = Int(fields[2]) else { continue }
    lastTaken.withLock { $0[String(fields[0])] = number }
    valuesTaken.withLock { _ = $0.insert(value) }
}
let stopSending = Locked(false)
/// --recover: values to send again before new ones (reported undelivered, or lost by the store),
/// starting with what an earlier process owed and did not send.
let owed: Locked<[Int]> = {
    // Not a count of "+" against "-": a value owed twice (reported twice before it went again) and
    // sent once is paid, and a count would keep it owed; sent twice after that (it was in the list
    // twice), its count went below zero and swallowed the next debt — a value reported undelivered
    // later was never sent again (a loss the chaos test found, 1 run in 12 of its stores-cut phase).
    var last: [Int: (owed: Bool, line: Int)] = [:]
    for (index, line) in owedLog.lines.enumerated() {
        guard let value = Int(line.dropFirst()) else { continue }
        last[value] = (line.hasPrefix("+"), index)
    }
    return Locked(last.filter { $0.value.owed }.sorted { $0.value.line < $1.value.line }.map(\.key))
}()

/// A value is owed: written down, then queued.
func owe(_ values: [Int]) {
    // Written and queued under the list's lock: the log's order is the list's (see `paid`). A value
    // in the list is owed in the log already (its last line is "+v"): not twice.
    owed.withLock { list in
        var queued = Set(list)
        for value in values where queued.insert(value).inserted {
            owedLog.append("+\(value)")
            list.append(value)
        }
    }
}

/// An owed value's `send` returned again: "-v", unless a report owes it again by now (then it stays
/// owed in the log as in the list, and is sent once more: a duplicate the receiver drops, where the
/// "-v" could have paid a debt of a send after it).
func paid(_ value: Int) {
    owed.withLock { list in
        if !list.contains(value) { owedLog.append("-\(value)") }
    }
}

/// Takes a received message: its effect (a line in the file) unless its position is taken already.
func take(_ message: IncomingMessage) {
    guard let position = message.sessionPosition, let value = try? message.decode(Value.self) else {
        return received.append("NOT-A-SESSION-MESSAGE")
    }
    let done = lastTaken.withLock { taken -> Bool in
        if let last = taken[position.session], position.number <= last { return true }
        taken[position.session] = position.number
        return false
    }
    if done {  // came again after a crash between its effect and its acknowledgement
        return note("skipped \(position.session) \(position.number) \(value.v): its position was taken")
    }
    if options.recover, !valuesTaken.withLock({ $0.insert(value.v).inserted }) {
        return duplicates.append("\(value.v)")  // sent again by a sender whose store lost it: had already
    }
    received.append("\(position.session) \(position.number) \(value.v)")
}

/// Like a real app, it is sometimes busy: every 100th value costs it 30 ms, while more wait in the
/// events queue (a kill then finds some arrived and not handled).
func work(_ message: IncomingMessage) async {
    if let value = try? message.decode(Value.self), value.v % 100 == 0 { try? await Task.sleep(for: .milliseconds(30)) }
}

/// The next value to send: after the last one the app began to send (written down before `send`),
/// and after any still kept in the store. The value a kill interrupted is not sent again: its
/// `send` never returned, so it may or may not have gone — sent again, it could arrive twice
/// (under a new number) if it had been delivered and acknowledged before the app wrote down that
/// `send` returned. (Only values whose `send` returned are owed to the receiver.)
func firstValue(kept: [UndeliveredMessage]) -> Int {
    let begun = intents.lines.last.flatMap { Int($0) } ?? 0
    let inStore = kept.compactMap { try? $0.decode(Value.self).v }.max() ?? 0
    return max(begun, inStore) + 1
}

/// A line of sent.log: the value, then where the session's sending stood once its `send` returned.
struct SentEntry {
    var value: Int
    var session: Substring
    var epoch: UInt64
    /// The session's `sent` count then: the value's number in that epoch (`UInt64.max`: the epoch
    /// changed while it was sent, so its number is unknown).
    var number: UInt64
}

func readSentEntries() -> [SentEntry] {
    sent.lines.compactMap { line in
        if line.hasPrefix("# start") { return nil }
        let fields = line.split(separator: " ")
        guard fields.count == 5, let value = Int(fields[0]), let epoch = UInt64(fields[2]) else {
            return nil
        }
        return SentEntry(
            value: value, session: fields[1], epoch: epoch, number: UInt64(fields[3]) ?? .max)
    }
}

/// --recover, when the sender starts: what its log says it sent and its store no longer knows —
/// every value after the last one the store still knows (same session and epoch, a number it has
/// reached), unless the store keeps it. (What an earlier epoch reported undelivered is not owed
/// here: the library keeps a report until the events loop went on, and makes it again at the
/// start — `report(_:)` owes it then.)
func lostByTheStore(progress: SessionProgress?, kept: [UndeliveredMessage]) -> [Int] {
    guard let progress else { return [] }
    let entries = readSentEntries()
    let known = entries.lastIndex { $0.session == progress.session && $0.epoch == progress.epoch && $0.number <= progress.sent }
    let keptValues = Set(kept.compactMap { try? $0.decode(Value.self).v })
    return entries[(known.map { $0 + 1 } ?? 0)...].map(\.value).filter { !keptValues.contains($0) }
}

/// Sends values until SIGUSR1, a few hundred a second (with --recover, what is owed first); then
/// returns once everything sent is acknowledged — woken by the acknowledgement
/// (`acknowledged(within:)`: false, and waited for again, when a report made the sender owe more,
/// the connection it waited on was replaced, or a second passed).
func stream(
    _ send: @escaping @Sendable (Value) async throws -> Void, kept: @escaping @Sendable () -> [UndeliveredMessage],
    progress: @escaping @Sendable () -> SessionProgress?, acknowledged: @escaping @Sendable (Duration) async -> Bool,
    connections: Connections
) async {
    note("sending: progress \(progress().map { "\($0.session) \($0.epoch) \($0.sent)" } ?? "none"), \(kept().count) kept, \(owed.withLock { $0.count }) owed")
    if options.recover {
        let lost = lostByTheStore(progress: progress(), kept: kept())
        note("lost by the store: \(lost.count) \(lost.prefix(3))…\(lost.suffix(3))")
        if !lost.isEmpty { logger.warning("the store lost \(lost.count) values this side had sent: sending them again") }
        owe(lost)
    }
    var value = firstValue(kept: kept())
    // Paced by the sends, not by the values: a value goes up only with new ones, and while owed
    // values were sent again it stood still — on a multiple of 20, every one of them waited 10 ms
    // (~90 a second: a drain of thousands owed outlasted the test's wait).
    var sends = 0
    while true {
        let again = owed.withLock { $0.isEmpty ? nil : $0.removeFirst() }
        if again == nil, stopSending.withLock({ $0 }) {
            // Stopped: done once everything is acknowledged and nothing is owed (a report may
            // still come and owe more).
            if kept().isEmpty { break }
            let waited = ContinuousClock.now
            let seen = connections.count
            let done = await acknowledged(.seconds(1))
            if !(done && kept().isEmpty), ContinuousClock.now - waited < .milliseconds(20) {
                // Ended at once with messages kept: the connection closed and the next one not
                // made yet (it replaces the one waited on) — waited for.
                await connections.next(after: seen)
            }
            continue
        }
        let next = again ?? value
        if again == nil { intents.append("\(next)") }
        let seen = connections.count
        let before = progress()
        do {
            try await send(Value(v: next))
        } catch {
            // No connection to send on (the server's closed): the next one made, the value goes on it.
            logger.warning("send \(next) failed: \(error)")
            if let again { owed.withLock { $0.insert(again, at: 0) } }
            await connections.next(after: seen)
            continue
        }
        // The value's number is `sent` after it, unless the session started anew meanwhile (then
        // "-": whether it went in the old epoch or the new is not known).
        let after = progress()
        let same = before?.session == after?.session && before?.epoch == after?.epoch
        let where_ = after.map { "\($0.session) \($0.epoch) \(same ? "\($0.sent)" : "-") \($0.acknowledged)" } ?? "- 0 - 0"
        sent.append("\(next) \(where_)")
        if again == nil { value += 1 } else { paid(next) }
        sends += 1
        if sends % 20 == 0 { try? await Task.sleep(for: .milliseconds(10)) }
    }
}

/// What the library reported as never acknowledged: written down; with --recover, sent again.
func report(_ lost: [UndeliveredMessage]) {
    for message in lost {
        let value = (try? message.decode(Value.self).v) ?? -1
        undelivered.append("\(message.number) \(value)")
        if options.recover, value >= 0 { owe([value]) }
    }
}

let identity: Identity
do {
    identity = try Identity.loadOrCreate(at: options.directory + "/identity")
} catch {
    fail("identity: \(error)")
}
var session = SessionConfiguration()
session.store = SessionStore(directory: options.directory + "/store", durability: options.durability)
session.store?.boot = options.boot
session.gracePeriod = .seconds(120)

let usr1 = DispatchSource.makeSignalSource(signal: SIGUSR1, queue: .global())
signal(SIGUSR1, SIG_IGN)
// (@Sendable: a handler made in top-level code would be the main actor's, and Dispatch runs it elsewhere.)
let stopOnUSR1: @Sendable () -> Void = { stopSending.withLock { $0 = true } }
usr1.setEventHandler(handler: stopOnUSR1)
usr1.resume()
let term = DispatchSource.makeSignalSource(signal: SIGTERM, queue: .global())
signal(SIGTERM, SIG_IGN)

if options.role == "server" {
    var configuration = ServerConfiguration(serviceType: "_chaos._tcp", serviceName: "collector")
    configuration.publish = false
    configuration.listener.port = options.port
    configuration.listener.loopbackOnly = true
    configuration.listener.families = [.ipv4]
    configuration.channel.security = .encrypted(identity: identity, trust: .anyKey)
    configuration.session = session
    let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
    do {
        try await server.start()
    } catch {
        fail("start: \(error)")
    }
    let stopOnTERM: @Sendable () -> Void = { Task { await server.stop() } }
    term.setEventHandler(handler: stopOnTERM)
    term.resume()
    say("READY \(options.port)")
    let current = Locked<ServerConnection?>(nil)
    let streaming = Locked(false)
    let connections = Connections()
    for await event in server.events {
        if case .received = event {} else { note("event: \(event)") }
        switch event {
        case .received(_, let message):
            take(message)
            await work(message)
        case .accepted(let connection):
            current.withLock { $0 = connection }
            connections.made()
            let first = streaming.withLock { started -> Bool in
                defer { started = true }
                return !started
            }
            guard options.send, first else { continue }
            Task {
                await stream({ value in
                    guard let connection = current.withLock({ $0 }) else { throw CancellationError() }
                    try await connection.send(value, type: "value")
                }, kept: { current.withLock { $0 }?.unacknowledgedMessages ?? [] }, progress: { current.withLock { $0 }?.sendProgress },
                    acknowledged: { await current.withLock { $0 }?.acknowledged(within: $0) ?? false }, connections: connections)
                say("DRAINED")
            }
        case .resumed(let connection, _):
            // A resume is not an accept: the session goes on over a new socket, and a sender
            // waiting for the next connection must be woken by it too.
            current.withLock { $0 = connection }
            connections.made()
        case .undelivered(_, let lost):
            report(lost)
        default:
            break
        }
    }
} else {
    var configuration = ClientConfiguration(
        peerName: "sensor", reconnect: ReconnectPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(100)))
    configuration.channel.security = .encrypted(identity: identity, trust: .anyKey)
    configuration.waitsForServer = true
    configuration.peerMemory = nil
    configuration.session = session
    let client: MessageClient
    do {
        client = try await MessageClient.connect(to: .host("127.0.0.1", port: options.port), configuration: configuration, logger: logger)
    } catch {
        fail("connect: \(error)")
    }
    let closeOnTERM: @Sendable () -> Void = { Task { await client.close() } }
    term.setEventHandler(handler: closeOnTERM)
    term.resume()
    say("READY")
    let connections = Connections()
    if case .connected = client.connectionState { connections.made() }
    if options.send {
        Task {
            await stream(
                { try await client.send($0, type: "value") }, kept: { client.unacknowledgedMessages }, progress: { client.sendProgress },
                acknowledged: { await client.acknowledged(within: $0) }, connections: connections)
            say("DRAINED")
        }
    }
    for await event in client.events {
        if case .received = event {} else { note("event: \(event)") }
        switch event {
        case .received(let message):
            take(message)
            await work(message)
        case .connected:
            connections.made()
        case .undelivered(let lost):
            report(lost)
        default: break
        }
    }
}
