// Issue 28 (under siege): the roles of Benchmarks/flood.sh, with our Messaging layer as an app uses
// it (a MessageServer, not the bare channels of bench-ours).
//
//   bench-siege server [--rate-per-address N|off] [--rate N|off] [--block-after N|off] [--block-seconds S]
//       prints "READY <port>"; answers
//       requests of type "s" with the same sample (from an on(type:) handler, as W2's server);
//       logs to stderr at its default level (notice), as a deployed server would
//   bench-siege w2 --port P --seconds S      round trips one after another for S seconds on one
//       encrypted connection (connected first); prints RESULT W2 with p50/p99/max
//   bench-siege legit --port P --count N     one new encrypted connection a second, N times; a
//       busy refusal is retried after the server's hint until 2 s have passed; prints each
//       connect's time and RESULT LEGIT (succeeded within 2 s, p50, max)
//   bench-siege idle-server / idle-clients   many idle encrypted connections (Benchmarks/idle.sh)
//   bench-siege soak-server / soak-clients   an hour of churn (Benchmarks/soak.sh)
import BenchCommon
import BenchMessaging
import Foundation
import Logging
import Messaging

let options = Options()
guard let role = options.words.first else { fail("usage: bench-siege server|w2|legit [options]") }
armWatchdog(seconds: options.int("timeout", 120))
let security = ChannelSecurity.encrypted(identity: .ephemeral(), trust: .anyKey)

func channelConfiguration(_ name: String) -> ChannelConfiguration {
    var c = ChannelConfiguration(name: name)
    c.security = security
    return c
}

/// A server on 127.0.0.1 only, not published, encrypted: every role's starting point.
func loopbackServer(_ name: String) -> ServerConfiguration {
    var configuration = ServerConfiguration(serviceType: "_siege._tcp", serviceName: name)
    configuration.publish = false
    configuration.listener.loopbackOnly = true
    configuration.listener.families = [.ipv4]
    configuration.channel.security = security
    return configuration
}

func limit(_ key: String, _ fallback: Int?) -> Int? {
    guard let value = options.values[key] else { return fallback }
    return value == "off" ? nil : Int(value)
}

func runServer() async throws {
    var logger = Logger(label: "siege-server")
    logger.logLevel = .notice
    var configuration = loopbackServer("siege")
    configuration.maxConnections = 100_000
    let defaults = ServerConfiguration(serviceType: "_x._tcp")
    configuration.maxHandshakesPerSecondPerAddress = limit("rate-per-address", defaults.maxHandshakesPerSecondPerAddress)
    configuration.maxHandshakesPerSecond = limit("rate", defaults.maxHandshakesPerSecond)
    configuration.floodBlockThreshold = limit("block-after", defaults.floodBlockThreshold)
    configuration.floodBlockDuration = .seconds(options.int("block-seconds", 10))
    let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
    try await server.start()
    guard let port = server.port else { fail("no port") }
    emit("READY \(port)")
    for await event in server.events {
        switch event {
        case .accepted(let connection):
            let channel = connection.channel
            channel.on(type: "s", as: Sample.self) { sample, message in
                _ = try? channel.trySend(sample, type: "s", replyTo: message.sequence)
            }
        case .received(let connection, let message):  // (arrived before the handler was installed)
            if let sample = try? message.decode(Sample.self) {
                _ = try? connection.channel.trySend(sample, type: "s", replyTo: message.sequence)
            }
        default:
            break
        }
    }
}

func connect(_ port: UInt16, ping: Bool = true) async throws -> MessageChannel {
    var logger = Logger(label: "siege-client")
    logger.logLevel = .error
    var configuration = channelConfiguration("client")
    if !ping { configuration.pingInterval = nil }
    return try await MessageChannel.connect(
        to: [SocketAddress.ipv4Loopback(port: port)], configuration: configuration, logger: logger)
}

/// Round trips for `seconds`, each request sent when the previous reply arrived (W2's handler
/// client: the next request goes out from the reply's handler).
func runW2(_ port: UInt16) async throws {
    let seconds = Double(options.int("seconds", 10))
    let channel = try await connect(port)
    let latencies = try await handlerRoundTrips(channel, until: .seconds(seconds))
    let s = latencySummary(latencies)
    result(
        "W2", options.string("label", "ours+noise"),
        ["p50_us": fmt(s.p50), "p99_us": fmt(s.p99), "max_us": fmt(s.max), "round_trips": "\(latencies.count)"])
    channel.close()
}

/// One connection a second; a busy refusal is retried after the server's hint, within 2 s.
func runLegit(_ port: UInt16) async throws {
    let count = options.int("count", 10)
    var times: [Double] = []
    var failures: [String] = []
    var busyRetries = 0
    for i in 0..<count {
        let started = ContinuousClock.now
        var connected = false
        var lastError = ""
        while ContinuousClock.now - started < .seconds(2) {
            do {
                let channel = try await connect(port)
                channel.close()
                connected = true
                break
            } catch let error as TransportError where error.code == .serverBusy {
                busyRetries += 1
                lastError = error.message
                try await Task.sleep(for: error.retryAfter ?? .milliseconds(100))
            } catch {
                lastError = "\(error)"
                break
            }
        }
        let ms = (ContinuousClock.now - started) / .milliseconds(1)
        if connected && ms <= 2_000 {
            times.append(ms)
        } else {
            failures.append(lastError)
        }
        FileHandle.standardError.write(Data("LEGIT \(i) \(connected ? "connected" : "failed") ms=\(fmt(ms)) \(lastError)\n".utf8))
        try await Task.sleep(until: started + .seconds(1))
    }
    times.sort()
    result(
        "LEGIT", options.string("label", "ours+noise"),
        [
            "succeeded": "\(times.count)", "of": "\(count)",
            "p50_ms": times.isEmpty ? "-" : fmt(times[times.count / 2]), "max_ms": times.last.map { fmt($0) } ?? "-",
            "busy_retries": "\(busyRetries)",
        ])
    if let failure = failures.first { FileHandle.standardError.write(Data("LEGIT first failure: \(failure)\n".utf8)) }
}

// MARK: Many idle connections (issue 28, item 3)

/// `bench-siege idle-server --connections N [--idle-seconds S]`: a MessageServer with heartbeats
/// as configured by default (ping every 5 s on both sides). Waits for N connections (reports the
/// time from the first accept to the last), then RSS per connection above the empty server, its
/// CPU while they idle for S seconds, a broadcast to all of them (the clients report when they got
/// it), and how long stop() takes to close them all with GOODBYE.
func runIdleServer() async throws {
    let target = options.int("connections", 19_000)
    let idleSeconds = options.int("idle-seconds", 60)
    var logger = Logger(label: "siege-idle")
    logger.logLevel = .notice
    var configuration = loopbackServer("idle")
    configuration.listener.backlog = 4096
    configuration.maxConnections = target + 100
    // Every client comes from 127.0.0.1 (a test harness, as the setting's documentation says).
    configuration.maxHandshakesPerSecondPerAddress = nil
    configuration.maxHandshakesPerSecond = nil
    configuration.maxPendingHandshakesPerAddress = 512
    configuration.eventBufferLimit = 100_000
    // (for finding where the cost is: --ping off, the server without heartbeats; --sessions off)
    if options.string("ping", "on") == "off" { configuration.channel.pingInterval = nil }
    if options.string("sessions", "on") == "off" { configuration.session = nil }
    // --heartbeats N|off: the server's heartbeat budget (ServerConfiguration.heartbeatsPerSecond; off: no pacing)
    configuration.heartbeatsPerSecond = limit("heartbeats", configuration.heartbeatsPerSecond)
    let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
    try await server.start()
    guard let port = server.port else { fail("no port") }
    try await Task.sleep(for: .milliseconds(500))
    let emptyRSS = residentBytes()
    let emptyHeap = heapInUse()
    emit("READY \(port)")
    var accepted = 0
    var first: ContinuousClock.Instant?
    var events = server.events.makeAsyncIterator()
    while accepted < target {
        guard let event = await events.next() else { fail("events ended") }
        if case .accepted = event {
            if first == nil { first = .now }
            accepted += 1
        }
    }
    let acceptSeconds = seconds(since: first!)
    // Drain events in the background (nothing more is expected but closes).
    let drain = Task { while await events.next() != nil {} }
    try await Task.sleep(for: .seconds(3))  // handshakes' leftovers settle
    let rss = residentBytes()
    // The heap in use besides RSS: what the connections hold, without what malloc keeps of the
    // handshakes' freed memory.
    let heap = heapInUse()
    emit(
        "RESULT IDLE19K accept connections=\(target) accept_all_s=\(fmt(acceptSeconds, 2)) rss_empty_kib=\(emptyRSS / 1024) "
            + "rss_kib=\(rss / 1024) bytes_per_conn=\(fmt(Double(rss - emptyRSS) / Double(target), 0)) "
            + "heap_bytes_per_conn=\(fmt(Double(heap - emptyHeap) / Double(target), 0)) threads=\(processStatus("Threads"))")
    let cpu0 = cpuSeconds()
    let t0 = ContinuousClock.now
    try await Task.sleep(for: .seconds(idleSeconds))
    let cpu = (cpuSeconds() - cpu0) / seconds(since: t0)
    emit(
        "RESULT IDLE19K idle seconds=\(idleSeconds) cpu_percent=\(fmt(cpu * 100, 2)) connections=\(server.connections.count) "
            + "rss_kib=\(residentBytes() / 1024)")
    emit("BROADCAST_AT \(nowNanos())")
    let broadcastStart = ContinuousClock.now
    let results = await server.broadcast(Sample.make(7), type: "b")
    emit(
        "RESULT IDLE19K broadcast queued_s=\(fmt(seconds(since: broadcastStart), 3)) sent=\(results.filter(\.succeeded).count) "
            + "failed=\(results.filter { !$0.succeeded }.count)")
    try await Task.sleep(for: .seconds(5))  // the clients report when the last one got it
    let stopStart = ContinuousClock.now
    emit("STOP_AT \(nowNanos())")
    await server.stop()
    emit("RESULT IDLE19K stop stop_s=\(fmt(seconds(since: stopStart), 3)) left=\(server.connections.count)")
    drain.cancel()
}

/// This process's CPU time (user + system), seconds.
func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// `bench-siege idle-clients --port P --count N`: N encrypted connections (32 connecting at once),
/// default heartbeats; prints when the broadcast reached the last of them and how they closed.
func runIdleClients(_ port: UInt16) async throws {
    let count = options.int("count", 9_500)
    final class Tally: @unchecked Sendable {  // guarded by lock
        let lock = NSLock()
        var received = 0
        var lastReceived: UInt64 = 0
        var closed = 0
        var goodbyes = 0
        var lastClosed: UInt64 = 0
        var channels: [MessageChannel] = []
    }
    let tally = Tally()
    try await withThrowingTaskGroup(of: Void.self) { group in
        for worker in 0..<32 {
            group.addTask {
                var i = worker
                while i < count {
                    let channel = try await connect(port, ping: options.string("ping", "on") == "on")
                    channel.on(type: "b", as: Sample.self) { _, _ in
                        let now = nowNanos()
                        tally.lock.withLock {
                            tally.received += 1
                            tally.lastReceived = max(tally.lastReceived, now)
                        }
                    }
                    tally.lock.withLock { tally.channels.append(channel) }
                    Task {
                        let reason = await channel.closed()
                        let now = nowNanos()
                        tally.lock.withLock {
                            tally.closed += 1
                            if case .goodbye = reason { tally.goodbyes += 1 }
                            tally.lastClosed = max(tally.lastClosed, now)
                        }
                    }
                    i += 32
                }
            }
        }
        try await group.waitForAll()
    }
    emit("CONNECTED \(count)")
    let deadline = ContinuousClock.now + .seconds(options.int("hold", 300))
    while ContinuousClock.now < deadline {
        let closed = tally.lock.withLock { tally.closed }
        if closed == count { break }
        try await Task.sleep(for: .milliseconds(100))
    }
    tally.lock.withLock {
        emit(
            "CLIENTS count=\(count) broadcast_received=\(tally.received) last_received_ns=\(tally.lastReceived) "
                + "closed=\(tally.closed) goodbyes=\(tally.goodbyes) last_closed_ns=\(tally.lastClosed)")
    }
}

// MARK: Soak (issue 28, item 4)

/// A numbered one-way message of a session client (the server checks each arrives once, in order).
struct Numbered: Codable, Sendable {
    var client: Int
    var n: Int
}

struct SoakError: Error, CustomStringConvertible {
    let text: String
    var description: String { text }
}

/// Open file descriptors of this process.
func openDescriptors() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

/// `bench-siege soak-server --minutes M`: a MessageServer (encrypted, sessions) under the soak's
/// churn. Answers requests "s"; checks the session clients' numbered messages (once each, in
/// order); broadcasts every 10 s; prints a SOAK line every minute (fds, RSS, connections, threads)
/// and at the end the messages received, duplicated and missing.
func runSoakServer() async throws {
    let minutes = options.int("minutes", 60)
    var logger = Logger(label: "siege-soak")
    logger.logLevel = .warning
    var configuration = loopbackServer("soak")
    configuration.maxHandshakesPerSecondPerAddress = nil  // every client is 127.0.0.1
    let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
    try await server.start()
    guard let port = server.port else { fail("no port") }
    emit("READY \(port)")
    final class Check: @unchecked Sendable {  // guarded by lock
        let lock = NSLock()
        var next: [Int: Int] = [:]  // client -> next expected number
        var received = 0
        var duplicates = 0
        var gaps = 0
    }
    let check = Check()
    let events = Task {
        for await event in server.events {
            switch event {
            case .accepted(let connection):
                let channel = connection.channel
                channel.on(type: "s", as: Sample.self) { sample, message in
                    _ = try? channel.trySend(sample, type: "s", replyTo: message.sequence)
                }
            case .resumed(let connection, _):
                let channel = connection.channel
                channel.on(type: "s", as: Sample.self) { sample, message in
                    _ = try? channel.trySend(sample, type: "s", replyTo: message.sequence)
                }
            case .received(let connection, let message):
                if message.typeID == "n", let numbered = try? message.decode(Numbered.self) {
                    check.lock.withLock {
                        check.received += 1
                        let expected = check.next[numbered.client, default: 0]
                        if numbered.n < expected { check.duplicates += 1 }
                        if numbered.n > expected { check.gaps += numbered.n - expected }
                        check.next[numbered.client] = max(expected, numbered.n + 1)
                    }
                } else if let sample = try? message.decode(Sample.self) {
                    _ = try? connection.channel.trySend(sample, type: "s", replyTo: message.sequence)
                }
            default:
                break
            }
        }
    }
    let start = ContinuousClock.now
    var minute = 0
    while minute < minutes {
        for _ in 0..<6 {
            try await Task.sleep(for: .seconds(10))
            _ = await server.broadcast(Sample.make(1), type: "b")
        }
        minute += 1
        let (received, duplicates, gaps) = check.lock.withLock { (check.received, check.duplicates, check.gaps) }
        emit(
            "SOAK minute=\(minute) fds=\(openDescriptors()) rss_kib=\(residentBytes() / 1024) connections=\(server.connections.count) "
                + "threads=\(processStatus("Threads")) received=\(received) duplicates=\(duplicates) gaps=\(gaps) "
                + "elapsed_s=\(fmt(seconds(since: start), 0))")
    }
    // The clients stop first (the runner waits for them): what they sent has arrived by now.
    try await Task.sleep(for: .seconds(options.int("drain", 20)))
    let (received, duplicates, gaps) = check.lock.withLock { (check.received, check.duplicates, check.gaps) }
    let lastByClient = check.lock.withLock { check.next }
    emit("SOAKEND received=\(received) duplicates=\(duplicates) gaps=\(gaps) clients=\(lastByClient.count) next=\(lastByClient.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ","))")
    events.cancel()
    await server.stop()
}

/// `bench-siege soak-clients --port P --minutes M`: the churn. 20 session clients send a numbered
/// one-way message every 100 ms each and have their connection killed every 30 s (the session
/// resumes); 4 workers connect, make a request and close, over and over (about 20 connections a
/// second); one connection makes requests as fast as it can (it rekeys every 65,536 messages).
/// Prints what each session client sent.
func runSoakClients(_ port: UInt16) async throws {
    let minutes = options.int("minutes", 60)
    let end = ContinuousClock.now + .seconds(minutes * 60)
    let logger: Logger = {
        var logger = Logger(label: "siege-soak-client")
        logger.logLevel = .error
        return logger
    }()
    final class Totals: @unchecked Sendable {  // guarded by lock
        let lock = NSLock()
        var sent: [Int: Int] = [:]
        var churned = 0
        var requests = 0
        var kills = 0
        var failures: [String] = []
    }
    let totals = Totals()
    try await withThrowingTaskGroup(of: Void.self) { group in
        for id in 0..<20 {
            group.addTask {
                var configuration = ClientConfiguration(peerName: "soak-\(id)")
                configuration.channel.security = security
                configuration.reconnect = ReconnectPolicy(initialDelay: .milliseconds(50), maxDelay: .seconds(1), maxAttempts: nil)
                configuration.peerMemory = nil
                let client = try await MessageClient.connect(
                    to: .host("127.0.0.1", port: port), configuration: configuration, logger: logger)
                let drain = Task { for await _ in client.events {} }
                var n = 0
                var nextKill = ContinuousClock.now + .seconds(30) + .milliseconds(1_500 * id)
                while ContinuousClock.now < end {
                    try await client.send(Numbered(client: id, n: n), type: "n")
                    n += 1
                    totals.lock.withLock { totals.sent[id] = n }
                    if ContinuousClock.now >= nextKill {
                        client.channel?.abort()  // a lost connection: the session resumes
                        totals.lock.withLock { totals.kills += 1 }
                        nextKill = ContinuousClock.now + .seconds(30)
                    }
                    try await Task.sleep(for: .milliseconds(100))
                }
                // Everything sent is acknowledged before closing (exactly once: nothing lost).
                let settle = ContinuousClock.now + .seconds(15)
                while client.unacknowledgedCount > 0, ContinuousClock.now < settle { try await Task.sleep(for: .milliseconds(50)) }
                await client.close()
                drain.cancel()
            }
        }
        for _ in 0..<4 {
            group.addTask {
                while ContinuousClock.now < end {
                    let started = ContinuousClock.now
                    do {
                        let channel = try await connect(port)
                        let reply: Sample = try await channel.request(Sample.make(2), type: "s", expecting: Sample.self)
                        guard reply == Sample.make(2) else { throw SoakError(text: "a wrong reply") }
                        channel.close()
                        totals.lock.withLock { totals.churned += 1 }
                    } catch {
                        totals.lock.withLock { if totals.failures.count < 10 { totals.failures.append("churn: \(error)") } }
                    }
                    try await Task.sleep(until: started + .milliseconds(200))
                }
            }
        }
        group.addTask {
            let channel = try await connect(port)
            // The broadcasts reach this connection too: consumed, or after 64 of them (11 minutes)
            // the channel stops reading and its next reply waits unread (the first hour-long run
            // lost this requester so, at 1.6 million requests).
            channel.on(type: "b", as: Sample.self) { _, _ in }
            let sample = Sample.make(3)
            let started = ContinuousClock.now
            do {
                while ContinuousClock.now < end {
                    for _ in 0..<1_000 { _ = try await channel.request(sample, type: "s", expecting: Sample.self) }
                    totals.lock.withLock { totals.requests += 1_000 }
                }
            } catch {
                // Reported at once (the group would only rethrow it at the end of the run).
                let minute = Int(seconds(since: started) / 60)
                emit("SOAKFAILURE flat-out requester, minute \(minute): \(error)")
            }
            channel.close()
        }
        try await group.waitForAll()
    }
    totals.lock.withLock {
        emit(
            "SOAKCLIENTS sent=\(totals.sent.values.reduce(0, +)) kills=\(totals.kills) churned=\(totals.churned) requests=\(totals.requests) "
                + "next=\(totals.sent.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ","))")
        for failure in totals.failures { emit("SOAKFAILURE \(failure)") }
    }
}

do {
    switch role {
    case "soak-server": try await runSoakServer()
    case "soak-clients": try await runSoakClients(UInt16(options.int("port", 0)))
    case "idle-server": try await runIdleServer()
    case "idle-clients": try await runIdleClients(UInt16(options.int("port", 0)))
    case "server": try await runServer()
    case "w2": try await runW2(UInt16(options.int("port", 0)))
    case "legit": try await runLegit(UInt16(options.int("port", 0)))
    default: fail("unknown role \(role)")
    }
} catch {
    fail("\(role): \(error)")
}
exit(0)
