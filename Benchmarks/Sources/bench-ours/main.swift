// W1-W6 with our library: Transport's Listener + MessageChannel.accept / MessageChannel.connect;
// W7 with Messaging's top floor: MessageServer and MessageClient, one-way messages in a session;
// W8 the same with session stores: --w8-mode memory|crash|power, --w8-senders K concurrent senders
// of 100-byte messages (both sides keep their sessions in a store under --store DIR); W8R a server
// restarted with 100,000 unacknowledged messages in its store (Benchmarks/run.sh drives the phases).
//   bench-ours fsync --dir D                                        this disk's fsync (RESULT FSYNC)
//
//   bench-ours server W1..W7 [--codec fast|foundation]     prints "READY <port>", then a RESULT line
//   bench-ours client W1..W7 --port P [--codec ...]        prints a RESULT line
//   bench-ours cipher                                               the transport's AEAD alone (RESULT CIPHER)
//   (W1 client: --w1-batch N sends N samples per send(contentsOf:) call; default 1, one send each;
//    --w1-client loop|pool: the sending task prefers the channel's loop executor (default) or not)
//
// The codec is the messaging layer's default, `FastJSONCodec` (implementation "ours"), or
// `FoundationJSONCodec(sortedKeys: false)` (--codec foundation, implementation "ours+foundation": the
// same Foundation JSON as the NIO peer, so the difference is the transport). Both are codec id 1 and
// put the same kind of JSON on the wire. Raw bytes (W3) use codec 0, no JSON.
import BenchCommon
import BenchMessaging
import Foundation
import Logging
import Messaging
import Metrics
import Prometheus
@_spi(Benchmarks) import Transport

/// A counter shared between a channel's queue (handlers) and the main task.
final class Counter: @unchecked Sendable {
    // Guarded by lock.
    private let lock = NSLock()
    private var value = 0
    func add(_ n: Int = 1) -> Int { lock.withLock { value += n; return value } }
    var current: Int { lock.withLock { value } }
}

let options = Options()
guard options.words.count >= 2 || ["cipher", "fsync", "x25519"].contains(options.words.first ?? "") else {
    fail("usage: bench-ours server|client W1..W7 [--port P] [--codec foundation|fast] | bench-ours cipher | bench-ours fsync | bench-ours x25519")
}
let role = options.words[0]
let workload = options.words.count > 1 ? options.words[1] : "CIPHER"
let codecName = options.string("codec", "fast")
// --security plaintext (protocol version 1, the figures before encryption) or encrypted
// (version 2: Noise XX handshake with ephemeral keys, every frame sealed; implementation "+noise").
let security = options.string("security", "plaintext")
let impl =
    (codecName == "fast" ? "ours" : "ours+foundation") + (options.int("w1-batch", 1) > 1 ? "+batch" : "")
    + (security == "encrypted" ? "+noise" : "") + (options.string("metrics", "off") == "on" ? "+metrics" : "")
armWatchdog(seconds: options.int("timeout", 120))
// --metrics on: every channel counts into a Prometheus registry (swift-prometheus), as a server or
// client bootstrapped with a back end would (implementation "+metrics").
let withMetrics = options.string("metrics", "off") == "on"
if withMetrics { MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: PrometheusCollectorRegistry())) }

let logger: Logger = {
    var logger = Logger(label: "bench")
    logger.logLevel = .error
    return logger
}()

func configuration(_ name: String) -> ChannelConfiguration {
    var c = ChannelConfiguration(name: name)
    // Foundation without key sorting: the same work as the NIO peer's plain JSONEncoder.
    c.codecs = codecName == "fast" ? .messagingDefault : CodecRegistry(sendCodec: FoundationJSONCodec(sortedKeys: false))
    c.pingInterval = nil  // no heartbeat traffic in measurements (W5: idle means idle)
    c.heartbeatTimeout = .seconds(3600)
    c.helloTimeout = .seconds(60)
    c.security = security == "encrypted" ? .encrypted(identity: .ephemeral(), trust: .anyKey) : .plaintext
    if withMetrics { c.enableMetrics(role: name) }
    return c
}


/// Starts a loopback listener; every accepted socket becomes a channel passed to `handle` (in a task).
func listen(_ handle: @escaping @Sendable (MessageChannel) async -> Void) throws -> Listener {
    var lc = Listener.Configuration()
    lc.loopbackOnly = true
    lc.families = [.ipv4]
    lc.backlog = 4096
    let config = configuration("server")
    return try Listener(configuration: lc, logger: logger) { socket in
        Task {
            do {
                let channel = try await MessageChannel.accept(socket, configuration: config, logger: logger)
                await handle(channel)
            } catch {
                fail("accept: \(error)")
            }
        }
    }
}

func connect(_ port: UInt16) async throws -> MessageChannel {
    try await MessageChannel.connect(
        to: [SocketAddress.ipv4Loopback(port: port)], configuration: configuration("client"), logger: logger)
}

// MARK: Servers

func runServer() async throws {
    let done = AsyncStream<Void>.makeStream()
    let listener: Listener
    switch workload {
    case "W1":
        listener = try listen { channel in
            let count = Counter()
            channel.on(type: "s", as: Sample.self) { _, _ in _ = count.add() }
            for await message in channel.messages {
                if message.typeID == "s" {
                    // Arrived before the handler above was installed (on(type:) installs it async).
                    guard (try? message.decode(Sample.self)) != nil else { fail("W1: undecodable") }
                    _ = count.add()
                    continue
                }
                try? await channel.sendRaw(Array(String(count.current).utf8), type: "count")
                break
            }
            _ = await channel.closed()
            done.continuation.finish()
        }
    case "W2":
        let w2Closed = Counter()
        // Default: the reply is sent inline from an on(type:) handler with trySend (no task hop);
        // --w2-server stream: the messages AsyncSequence and `await reply(to:)` in a task.
        let inline = options.string("w2-server", "handler") == "handler"
        listener = try listen { channel in
            if inline {
                channel.on(type: "s", as: Sample.self) { sample, message in
                    guard (try? channel.trySend(sample, type: "s", replyTo: message.sequence)) == true else {
                        fail("W2: the send queue of a ping-pong cannot be full")
                    }
                }
            }
            // (also the samples that arrive before on(type:) has installed the handler: the client
            // sends them with `send`, not `request`, so they are answered as the handler does —
            // `reply(to:)` refuses a one-way message, and the run used to hang when the first
            // sample beat the handler's installation)
            for await message in channel.messages {
                guard let sample = try? message.decode(Sample.self) else { fail("W2: undecodable") }
                guard (try? channel.trySend(sample, type: "s", replyTo: message.sequence)) == true else {
                    fail("W2: the send queue of a ping-pong cannot be full")
                }
            }
            // (every connection of the run closed: BENCH_W2_CONNECTIONS of them)
            if w2Closed.add() == Workload.w2Connections { done.continuation.finish() }
        }
    case "W3":
        // Default: an on(type:) handler, which runs on the channel's queue as each message arrives
        // (like the NIO peer's channelRead), so one payload array at a time is alive;
        // --w3-server stream: the messages AsyncSequence in a task.
        let inline = options.string("w3-server", "handler") == "handler"
        listener = try listen { channel in
            let bytes = Counter()
            let count = Counter()
            @Sendable func received(_ payload: [UInt8]) {
                _ = bytes.add(payload.count)
                if count.add() == Workload.w3Messages {
                    Task { try? await channel.sendRaw(Array(String(bytes.current).utf8), type: "done") }
                }
            }
            if inline { channel.on(type: "b", as: [UInt8].self) { payload, _ in received(payload) } }
            // (also the messages that arrive before on(type:) has installed the handler)
            for await message in channel.messages { received(message.payload) }
            done.continuation.finish()
        }
    case "W6":
        // Request/reply: the server answers each request from an on(type:) handler (trySend, or an
        // async reply when the send queue is full).
        listener = try listen { channel in
            @Sendable func answer(_ sample: Sample, _ message: IncomingMessage) {
                if (try? channel.trySend(sample, type: "r", replyTo: message.sequence)) != true {
                    Task { try? await channel.reply(to: message, with: sample, type: "r") }
                }
            }
            channel.on(type: "q", as: Sample.self) { sample, message in answer(sample, message) }
            // (requests that arrived before the handler was installed)
            for await message in channel.messages {
                guard let sample = try? message.decode(Sample.self) else { fail("W6: undecodable") }
                answer(sample, message)
            }
            done.continuation.finish()
        }
    case "W7", "W8":
        // Messaging's top floor: a MessageServer (not a bare channel) whose client sends one-way
        // messages in its message session (each numbered, kept until the server acknowledges it,
        // delivered through the server's events). The NIO peer has no session: its anchor is W1,
        // the same messages on a bare connection. W8: the same with 100-byte readings ("r"), the
        // sessions kept in a store (--w8-mode crash or power) or not (memory).
        let server = try await topFloorServer { $0.session?.store = w8Store("server") }
        guard let port = server.port else { fail("\(workload): no port") }
        emit("READY \(port)")
        var count = 0
        for await event in server.events {
            guard case .received(let connection, let message) = event else { continue }
            if message.typeID == "s" {
                guard (try? message.decode(Sample.self)) != nil else { fail("W7: undecodable") }
                count += 1
            } else if message.typeID == "r" {
                count += 1
            } else if message.typeID == "end" {
                try await connection.send(count, type: "count")
            }
        }
        return
    case "W8R":
        // --w8r-phase fill: sends 100,000 readings to the first client, whose app acknowledges none,
        // prints FILLED, and waits to be killed. --w8r-phase resume: the server restarted on the
        // same store and port; prints READY once it listens (its store read).
        let started = ContinuousClock.now
        let server = try await topFloorServer {
            $0.listener.port = UInt16(options.int("fixed-port", 0))
            $0.session?.maxUnacknowledgedMessages = 200_000
            $0.session?.maxUnacknowledgedBytes = 256 << 20
            $0.session?.store = w8Store("server")
        }
        emit("READY \(server.port ?? 0) open_ms=\(fmt(seconds(since: started) * 1000, 1))")
        let fill = options.string("w8r-phase", "fill") == "fill"
        for await event in server.events {
            guard fill, case .accepted(let connection) = event else { continue }
            let n = options.int("messages", 100_000)
            for i in 0..<n { try await connection.send(Reading(i), type: "r") }
            emit("FILLED \(n) unacknowledged=\(connection.unacknowledgedCount)")
        }
        return
    case "W4":
        let clients = options.int("clients", Workload.w4Clients)
        let joined = AsyncStream<MessageChannel>.makeStream()
        listener = try listen { channel in joined.continuation.yield(channel) }
        emit("READY \(listener.port)")
        var channels: [MessageChannel] = []
        for await channel in joined.stream {
            channels.append(channel)
            if channels.count == clients { break }
        }
        let acks = Counter()
        let allAcked = AsyncStream<Void>.makeStream()
        for channel in channels {
            channel.on(type: "ack", as: Int.self) { _, _ in
                if acks.add() == clients { allAcked.continuation.finish() }
            }
        }
        let start = ContinuousClock.now
        for i in 0..<Workload.w4Messages {
            let (codec, payload) = try channels[0].encodeForSending(Sample.make(i), type: "s")
            for channel in channels { try await channel.sendEncoded(payload, codecID: codec, type: "s") }
        }
        for await _ in allAcked.stream {}
        let elapsed = seconds(since: start)
        let delivered = Double(clients * Workload.w4Messages)
        result("W4", impl, ["msgs_per_s": fmt(delivered / elapsed, 0), "seconds": fmt(elapsed, 3)])
        for channel in channels { channel.close() }
        listener.stop()
        return
    case "W5":
        let target = options.int("connections", Workload.w5Connections)
        let established = Counter()
        let all = AsyncStream<Void>.makeStream()
        let holder = ChannelHolder()
        // Warm-up (the NIO peer does the same): one connection to ourselves, opened and closed, so
        // that code run for the first time (pages of the binary and libraries, counted in VmRSS) is
        // not counted as growth per connection. Then the baseline.
        // (--w5-warmup 0: no warm-up, the method of the runs before it.)
        if options.int("w5-warmup", 1) > 0 {
            let warm = try listen { channel in channel.close() }
            _ = await (try await connect(warm.port)).closed()
            warm.stop()
        }
        try await Task.sleep(for: .milliseconds(200))
        let before = residentBytes()
        let heapBefore = heapInUse()
        let freeBefore = heapFree()
        let threadsBefore = processStatus("Threads")
        listener = try listen { channel in
            holder.keep(channel)
            if established.add() == target { all.continuation.finish() }
        }
        emit("READY \(listener.port)")
        for await _ in all.stream {}
        try await Task.sleep(for: .seconds(1))  // let every handshake's leftovers settle
        let after = residentBytes()
        let heapAfter = heapInUse()
        let freeAfter = heapFree()
        let threadsAfter = processStatus("Threads")
        let per = Double(after - before) / Double(target)
        result(
            "W5", impl,
            [
                "bytes_per_conn": fmt(per, 0), "heap_per_conn": fmt(Double(heapAfter - heapBefore) / Double(target), 0),
                "malloc_free_per_conn": fmt(Double(freeAfter - freeBefore) / Double(target), 0),
                "threads": "\(threadsBefore)->\(threadsAfter)",
                "rss_before": "\(before)", "rss_after": "\(after)", "connections": "\(target)",
            ])
        holder.closeAll()
        listener.stop()
        return
    default:
        fail("unknown workload \(workload)")
    }
    emit("READY \(listener.port)")
    for await _ in done.stream {}
    listener.stop()
}

final class ChannelHolder: @unchecked Sendable {
    // Guarded by lock.
    private let lock = NSLock()
    private var channels: [MessageChannel] = []
    func keep(_ channel: MessageChannel) { lock.withLock { channels.append(channel) } }
    func closeAll() { for channel in lock.withLock({ channels }) { channel.abort() } }
}

// MARK: Clients

func runClient() async throws {
    let port = UInt16(options.int("port", 0))
    switch workload {
    case "W1":
        let n = options.int("messages", Workload.w1Messages)
        let channel = try await connect(port)
        var iterator = channel.messages.makeAsyncIterator()
        let start = ContinuousClock.now
        let batch = options.int("w1-batch", 1)
        if batch > 1 {
            // send(contentsOf:): encode `batch` samples, hand them over together (like the NIO
            // peer's flush every 64 writes).
            var i = 0
            while i < n {
                let end = min(i + batch, n)
                try await channel.send(contentsOf: (i..<end).lazy.map(Sample.make), type: "s")
                i = end
            }
        } else if options.string("w1-client", "loop") == "loop" {
            // Default: the sending task prefers the channel's loop executor, so its frames need no
            // hand-off to another thread (like the NIO peer's client, which encodes and writes on the
            // channel's event loop). --w1-client pool: the task stays on the cooperative pool.
            try await withTaskExecutorPreference(channel.taskExecutor) {
                for i in 0..<n { try await channel.send(Sample.make(i), type: "s") }
            }
        } else {
            for i in 0..<n { try await channel.send(Sample.make(i), type: "s") }
        }
        try await channel.sendRaw([], type: "end")
        let reply = await iterator.next()
        let text = String(decoding: reply?.payload ?? [], as: UTF8.self)
        guard Int(text) == n else { fail("W1: the server counted '\(text)', not \(n) messages") }
        let elapsed = seconds(since: start)
        result("W1", impl, ["msgs_per_s": fmt(Double(n) / elapsed, 0), "seconds": fmt(elapsed, 3)])
        channel.close()
    case "W7":
        let n = options.int("messages", Workload.w1Messages)
        var cc = ClientConfiguration(peerName: "bench", reconnect: ReconnectPolicy())  // a session needs one
        cc.channel = configuration("client")
        cc.peerMemory = nil
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: port), configuration: cc, logger: logger)
        // --w7-client pool (default: the sending task on the cooperative pool) or loop (it prefers
        // the client's loop, `client.channel?.taskExecutor`, as MessageClient's documentation shows).
        let onLoop = options.string("w7-client", "pool") == "loop"
        let start = ContinuousClock.now
        if onLoop, let executor = client.channel?.taskExecutor {
            try await withTaskExecutorPreference(executor) {
                for i in 0..<n { try await client.send(Sample.make(i), type: "s") }
            }
        } else {
            for i in 0..<n { try await client.send(Sample.make(i), type: "s") }
        }
        let counted = await serverCount(client)
        guard counted == n else { fail("W7: the server counted \(counted.map(String.init) ?? "nothing"), not \(n) messages") }
        let elapsed = seconds(since: start)
        result("W7", impl + (onLoop ? "+loop" : ""), ["msgs_per_s": fmt(Double(n) / elapsed, 0), "seconds": fmt(elapsed, 3)])
        await client.close()
    case "W8":
        let n = options.int("messages", 200_000)
        let senders = options.int("w8-senders", 64)
        let batch = options.int("w8-batch", 1)
        var cc = ClientConfiguration(peerName: "bench", reconnect: ReconnectPolicy())
        cc.channel = configuration("client")
        cc.peerMemory = nil
        cc.session?.store = w8Store("client")
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: port), configuration: cc, logger: logger)
        let latency = LatencyHistogram()
        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for sender in 0..<senders {
                group.addTask {
                    var i = sender
                    while i < n {
                        let sent = DispatchTime.now().uptimeNanoseconds
                        if batch > 1 {
                            // --w8-batch B: send(contentsOf:) B readings at a time (one sync each batch).
                            let readings = stride(from: i, to: min(n, i + batch * senders), by: senders).map { Reading($0) }
                            try await client.send(contentsOf: readings, type: "r")
                            i += batch * senders
                        } else {
                            try await client.send(Reading(i), type: "r")
                            i += senders
                        }
                        latency.record(nanoseconds: DispatchTime.now().uptimeNanoseconds - sent)
                    }
                }
            }
            try await group.waitForAll()
        }
        let counted = await serverCount(client)
        guard counted == n else { fail("W8: the server counted \(counted.map(String.init) ?? "nothing"), not \(n) messages") }
        let elapsed = seconds(since: start)
        let (p50, p99, _) = latency.summary()
        result(
            "W8", impl + "+" + options.string("w8-mode", "memory") + "+s\(senders)" + (batch > 1 ? "+batch\(batch)" : ""),
            [
                "msgs_per_s": fmt(Double(n) / elapsed, 0), "send_p50_us": fmt(p50, 1), "send_p99_us": fmt(p99, 1),
                "senders": "\(senders)", "seconds": fmt(elapsed, 3), "per": batch > 1 ? "batch" : "message",
            ])
        await client.close()
    case "W8R":
        // Takes the server's 100,000 readings without acknowledging one (manual), then waits for
        // the restarted server to resume the session: prints RESUMED with the wall clock.
        let n = options.int("messages", 100_000)
        var cc = ClientConfiguration(
            peerName: "bench", reconnect: ReconnectPolicy(initialDelay: .milliseconds(5), maxDelay: .milliseconds(20)))
        cc.channel = configuration("client")
        cc.peerMemory = nil
        cc.session?.acknowledgement = .manual
        let client = try await MessageClient.connect(to: .host("127.0.0.1", port: port), configuration: cc, logger: logger)
        var received = 0
        for await event in client.events {
            switch event {
            case .received: 
                received += 1
                if received == n { emit("RECEIVED \(n)") }
            case .resumed(let resent):
                var now = timespec()
                clock_gettime(CLOCK_REALTIME, &now)
                emit("RESUMED \(Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)) resent=\(resent)")
                exit(0)
            default: break
            }
        }
    case "W2" where options.string("w2-client", "handler") == "handler":
        // Default, like the NIO peer's client (next request sent from channelRead): the reply is
        // handled by an on(type:) handler on the channel's queue, which sends the next request
        // with trySend. --w2-client stream: an async loop over `messages` with `await send`.
        let total = options.int("messages", Workload.w2RoundTrips)
        let connections = Workload.w2Connections
        guard connections > 1 else {
            let channel = try await connect(port)
            let latencies = try await handlerRoundTrips(channel, until: .count(total))
            let s = latencySummary(latencies)
            result("W2", impl, ["p50_us": fmt(s.p50), "p99_us": fmt(s.p99), "max_us": fmt(s.max)])
            channel.close()
            break
        }
        // BENCH_W2_CONNECTIONS: every connection made first, then all of them at once, one round
        // trip in flight each; the percentiles of every round trip after each one's warm-up.
        let each = max(1, total / connections)
        var channels: [MessageChannel] = []
        for _ in 0..<connections { channels.append(try await connect(port)) }
        let go = AsyncStream<Void>.makeStream()
        let gate = Task { for await _ in go.stream {} }  // ends once every round-trip task was added
        let start = ContinuousClock.now
        let latencies = try await withThrowingTaskGroup(of: [UInt64].self) { group in
            for channel in channels {
                group.addTask {
                    await gate.value
                    return try await handlerRoundTrips(channel, until: .count(each))
                }
            }
            go.continuation.finish()
            var all: [UInt64] = []
            all.reserveCapacity(each * connections)
            for try await some in group { all += some }
            return all
        }
        resultW2(impl, latencies, connections: connections, each: each, seconds: seconds(since: start))
        for channel in channels { channel.close() }
    case "W2":
        guard Workload.w2Connections == 1 else { fail("W2: --w2-client stream runs one connection (BENCH_W2_CONNECTIONS=1)") }
        let n = options.int("messages", Workload.w2RoundTrips)
        let channel = try await connect(port)
        var iterator = channel.messages.makeAsyncIterator()
        var latencies = [UInt64]()
        latencies.reserveCapacity(n)
        let sample = Sample.make(42)
        for i in 0..<(Workload.w2Warmup + n) {
            let t0 = nowNanos()
            try await channel.send(sample, type: "s")
            guard let reply = await iterator.next(), let back = try? reply.decode(Sample.self), back == sample else {
                fail("W2: bad reply")
            }
            if i >= Workload.w2Warmup { latencies.append(nowNanos() - t0) }
        }
        let s = latencySummary(latencies)
        result("W2", impl, ["p50_us": fmt(s.p50), "p99_us": fmt(s.p99), "max_us": fmt(s.max)])
        channel.close()
    case "W3":
        let channel = try await connect(port)
        var iterator = channel.messages.makeAsyncIterator()
        let chunk = [UInt8](repeating: 0x5a, count: Workload.w3MessageSize)
        let start = ContinuousClock.now
        for _ in 0..<Workload.w3Messages { try await channel.sendRaw(chunk, type: "b") }
        guard let reply = await iterator.next(),
            Int(String(decoding: reply.payload, as: UTF8.self)) == Workload.w3Messages * Workload.w3MessageSize
        else { fail("W3: the server did not receive every byte") }
        let elapsed = seconds(since: start)
        let mib = Double(Workload.w3Messages * Workload.w3MessageSize) / Double(1 << 20)
        result("W3", impl, ["mib_per_s": fmt(mib / elapsed, 0), "seconds": fmt(elapsed, 3), "msgs_per_s": fmt(Double(Workload.w3Messages) / elapsed, 0)])
        channel.close()
    case "W4":
        let clients = options.int("clients", Workload.w4Clients)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<clients {
                group.addTask {
                    let channel = try await connect(port)
                    let got = Counter()
                    let finished = AsyncStream<Void>.makeStream()
                    channel.on(type: "s", as: Sample.self) { _, _ in
                        if got.add() == Workload.w4Messages { finished.continuation.finish() }
                    }
                    // Samples that arrive before the handler is installed (on(type:) installs it async).
                    let early = Task {
                        for await message in channel.messages where message.typeID == "s" {
                            guard (try? message.decode(Sample.self)) != nil else { fail("W4: undecodable") }
                            if got.add() == Workload.w4Messages { finished.continuation.finish() }
                        }
                    }
                    for await _ in finished.stream {}
                    early.cancel()
                    try await channel.send(Workload.w4Messages, type: "ack")
                    _ = await channel.closed()
                }
            }
            try await group.waitForAll()
        }
    case "W6":
        // 1,000,000 request(...) calls, 100 outstanding (100 tasks, each awaiting its reply before
        // the next); latency per call; client RSS after 100k calls and after all of them.
        // --w6-client pool (default: tasks on the cooperative pool, like the NIO client's) or loop
        // (the tasks prefer the channel's loop executor: no thread hop per call).
        let n = options.int("requests", Workload.w6Requests)
        let window = options.int("outstanding", Workload.w6Outstanding)
        let channel = try await connect(port)
        let sample = Sample.make(42)
        let completed = Counter()
        let checkpoint = Counter()
        let onLoop = options.string("w6-client", "pool") == "loop"
        let histogram = LatencyHistogram()
        let rssBefore = residentBytes()
        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<window {
                group.addTask {
                    @Sendable func run() async throws {
                        var i = worker
                        while i < n {
                            let t0 = nowNanos()
                            let reply = try await channel.request(sample, type: "q", expecting: Sample.self)
                            histogram.record(nanoseconds: nowNanos() - t0)
                            guard reply == sample else { fail("W6: bad reply") }
                            if completed.add() == Workload.w6Checkpoint { _ = checkpoint.add(residentBytes()) }
                            i += window
                        }
                    }
                    if onLoop { try await withTaskExecutorPreference(channel.taskExecutor) { try await run() } } else {
                        try await run()
                    }
                }
            }
            try await group.waitForAll()
        }
        let elapsed = seconds(since: start)
        let rssEnd = residentBytes()
        guard histogram.count == n else { fail("W6: \(histogram.count) of \(n) replies") }
        let s = histogram.summary()
        result(
            "W6", impl + (onLoop ? "+loop" : ""),
            [
                "requests_per_s": fmt(Double(n) / elapsed, 0), "p50_us": fmt(s.p50), "p99_us": fmt(s.p99),
                "rss_start": "\(rssBefore)", "rss_100k": "\(checkpoint.current)", "rss_end": "\(rssEnd)",
                "seconds": fmt(elapsed, 3),
            ])
        channel.close()
    case "W5":
        let target = options.int("connections", Workload.w5Connections)
        let holder = ChannelHolder()
        // First, 200 connections one at a time: the latency of connect + hello (v1) or connect +
        // Noise handshake + verdict (v2), p50 and p99 in microseconds.
        var latencies: [Double] = []
        for _ in 0..<200 {
            let start = ContinuousClock.now
            let channel = try await connect(port)
            latencies.append((ContinuousClock.now - start) / .microseconds(1))
            holder.keep(channel)
        }
        latencies.sort()
        FileHandle.standardError.write(
            Data(
                ("CONNECT \(impl) p50_us=\(fmt(latencies[100], 0)) p99_us=\(fmt(latencies[197], 0)) "
                    + "(connect + handshake, one at a time)\n").utf8))
        let parallel = 32
        let connectStart = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<parallel {
                group.addTask {
                    var i = 200 + worker
                    while i < target {
                        holder.keep(try await connect(port))
                        i += parallel
                    }
                }
            }
            try await group.waitForAll()
        }
        let connectSeconds = (ContinuousClock.now - connectStart) / .seconds(1)
        // Connections (TCP + hello, or TCP + Noise handshake) per second, 32 at a time: the
        // handshake's cost. Reported on stderr beside the server's RESULT line.
        FileHandle.standardError.write(
            Data("HANDSHAKES \(impl) connections_per_s=\(fmt(Double(target - 200) / connectSeconds, 0))\n".utf8))
        emit("CONNECTED \(target)")
        // Hold them until the server (or the runner) ends the run.
        try await Task.sleep(for: .seconds(options.int("hold", 60)))
    default:
        fail("unknown workload \(workload)")
    }
}

/// W7, W8, W8R: a started MessageServer on IPv4 loopback, unpublished, with the benchmark's
/// channel settings and what `configure` adds.
func topFloorServer(_ configure: (inout ServerConfiguration) -> Void) async throws -> MessageServer {
    var sc = ServerConfiguration(serviceType: "_bench._tcp", serviceName: "bench")
    sc.publish = false
    sc.listener.loopbackOnly = true
    sc.listener.families = [.ipv4]
    sc.channel = configuration("server")
    configure(&sc)
    let server = MessageServer(configuration: sc, discovery: nil, logger: logger)
    try await server.start()
    return server
}

/// W7, W8: sends the end marker and returns the count the server answers with.
func serverCount(_ client: MessageClient) async -> Int? {
    guard (try? await client.send(0, type: "end")) != nil else { return nil }
    for await event in client.events {
        if case .received(let message) = event, message.typeID == "count" { return try? message.decode(Int.self) }
    }
    return nil
}

/// A reading of W8: 100 bytes of JSON (`{"id":…,"pad":"…"}`).
struct Reading: Codable, Sendable {
    var id: Int
    var pad: String
    init(_ id: Int) {
        self.id = id
        pad = Reading.pads[min(Reading.pads.count - 1, String(id).count)]
    }

    /// The padding for each width of the id, made once (not per message: that cost the client
    /// 12 % of its time in perf).
    static let pads = (0...20).map { String(repeating: "x", count: max(0, 100 - 16 - $0)) }
}

/// W8's session store for `role` (nil for --w8-mode memory): --store DIR/role.
func w8Store(_ role: String) -> SessionStore? {
    let mode = options.string("w8-mode", "memory")
    guard mode != "memory" || workload == "W8R" else { return nil }
    let directory = options.string("store", NSTemporaryDirectory() + "bench-w8-\(getpid())") + "/" + role
    return SessionStore(directory: directory, durability: mode == "power" ? .powerLoss : .processCrash)
}

/// `bench-ours fsync --dir D`: this disk's sync, as the store meets it: 300 appends of 4 KiB, each
/// followed by `fdatasync` (RESULT FSYNC, microseconds).
func runFsync() {
    let path = options.string("dir", NSTemporaryDirectory()) + "/fsync-probe-\(getpid())"
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0o600)
    guard fd >= 0 else { fail("fsync: cannot open \(path)") }
    defer {
        close(fd)
        unlink(path)
    }
    let block = [UInt8](repeating: 0x5A, count: 4096)
    var samples: [UInt64] = []
    for _ in 0..<300 {
        guard write(fd, block, block.count) == block.count else { fail("fsync: write failed") }
        let start = DispatchTime.now().uptimeNanoseconds
        guard fdatasync(fd) == 0 else { fail("fsync: fdatasync failed") }
        samples.append(DispatchTime.now().uptimeNanoseconds - start)
    }
    let (p50, p99, max) = latencySummary(samples)
    result("FSYNC", "disk", ["p50_us": fmt(p50, 0), "p99_us": fmt(p99, 0), "max_us": fmt(max, 0)])
}

/// `bench-ours cipher CIPHER`: the transport's AEAD alone, one core (the cipher-limit row): 64 KiB
/// messages (the bulk path's size) and 100-byte ones (a small message's), sealed, then opened.
func runCipher() {
    let bulk = _CipherBenchmark.measure(size: 65_519, count: 4_000)  // about 250 MiB
    let small = _CipherBenchmark.measure(size: 100, count: 400_000)
    let mib = Double(65_519 * 4_000) / Double(1 << 20)
    let seal = mib / (Double(bulk.sealNanoseconds) / 1e9)
    let open = mib / (Double(bulk.openNanoseconds) / 1e9)
    result(
        "CIPHER", "ours+noise",
        [
            "seal_mib_per_s": fmt(seal, 0), "open_mib_per_s": fmt(open, 0),
            // One side seals and the other opens, each on its own core: the slower one bounds a stream.
            "mib_per_s": fmt(min(seal, open), 0),
            "seal_100_ns": fmt(Double(small.sealNanoseconds) / 400_000, 0),
            "open_100_ns": fmt(Double(small.openNanoseconds) / 400_000, 0),
        ])
}

do {
    if role == "cipher" { runCipher(); exit(0) }
    if role == "fsync" { runFsync(); exit(0) }
    if role == "x25519" { runX25519Floor(); exit(0) }
    if role == "solo" && workload == "W8C" { try await runCompaction(); exit(0) }
    if role == "server" { try await runServer() } else { try await runClient() }
} catch {
    fail("\(role) \(workload): \(error)")
}
exit(0)
