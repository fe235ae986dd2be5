// W1-W5 with the SwiftNIO peer: NIOPosix sockets, NIOExtras LengthFieldBasedFrameDecoder /
// LengthFieldPrepender (4-byte big-endian length), Foundation JSONEncoder / JSONDecoder.
//
//   bench-nio server W1|W2|W3|W4|W5      prints "READY <port>", then (W4, W5) a RESULT line
//   bench-nio client W1|W2|W3|W4|W5 --port P
//   --tls CERT.pem,KEY.pem (both sides): TLS 1.3 (swift-nio-ssl, BoringSSL) under the framing,
//   implementation "nio+tls"; the client does not verify the self-signed certificate.
//
// Written the way a careful NIO user would: one event loop per core, encoding and writing on the
// channel's event loop, flush per batch (not per message), writes stop while the channel is not
// writable (water marks 256 KiB / 1 MiB, the same as our send queue) and resume on
// channelWritabilityChanged; reads flush in channelReadComplete.
//
// Each frame body starts with one kind byte, then the JSON (or raw) payload.
import BenchCommon
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOExtras
import NIOPosix
import NIOSSL

enum Kind {
    static let sample: UInt8 = 1
    static let end: UInt8 = 2
    static let count: UInt8 = 3
    static let bulk: UInt8 = 4
    static let done: UInt8 = 5
    static let ack: UInt8 = 6
    static let request: UInt8 = 7
    static let reply: UInt8 = 8
}

let options = Options()
guard options.words.count >= 2 else { fail("usage: bench-nio server|client W1..W5 [--port P]") }
let role = options.words[0]
let workload = options.words[1]
let tlsFiles = options.string("tls", "")
let impl = tlsFiles.isEmpty ? "nio" : "nio+tls"
/// The TLS context of `--tls` (nil: plaintext).
let tlsContext: NIOSSLContext? = {
    guard !tlsFiles.isEmpty else { return nil }
    let parts = tlsFiles.split(separator: ",").map(String.init)
    guard parts.count == 2 else { fail("--tls CERT.pem,KEY.pem") }
    do {
        var configuration: TLSConfiguration
        if options.words[0] == "server" {
            configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: try NIOSSLCertificate.fromPEMFile(parts[0]).map { .certificate($0) },
                privateKey: .privateKey(try NIOSSLPrivateKey(file: parts[1], format: .pem)))
        } else {
            configuration = TLSConfiguration.makeClientConfiguration()
            configuration.certificateVerification = .none
        }
        configuration.minimumTLSVersion = .tlsv13
        return try NIOSSLContext(configuration: configuration)
    } catch {
        fail("TLS setup: \(error)")
    }
}()
armWatchdog(seconds: options.int("timeout", 120))

let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
let waterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 256 * 1024, high: 1024 * 1024)

func frame(_ allocator: ByteBufferAllocator, kind: UInt8, _ bytes: some Sequence<UInt8>) -> ByteBuffer {
    var buffer = allocator.buffer(capacity: 128)
    buffer.writeInteger(kind)
    buffer.writeBytes(bytes)
    return buffer
}

// Handlers are created on (and confined to) their channel's event loop.
@Sendable func addFraming(
    _ channel: any Channel, server: Bool = false, make: @escaping () -> any ChannelHandler
) -> EventLoopFuture<Void> {
    channel.eventLoop.makeCompletedFuture {
        if let tlsContext {
            let tls: any ChannelHandler =
                server
                ? NIOSSLServerHandler(context: tlsContext)
                : try NIOSSLClientHandler(context: tlsContext, serverHostname: nil)
            try channel.pipeline.syncOperations.addHandler(tls)
        }
        try channel.pipeline.syncOperations.addHandlers([
            ByteToMessageHandler(LengthFieldBasedFrameDecoder(lengthFieldBitLength: .fourBytes)),
            LengthFieldPrepender(lengthFieldBitLength: .fourBytes),
            make(),
        ])
    }
}

// MARK: Server handlers

final class W1Server: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let decoder = JSONDecoder()
    var count = 0

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        switch buffer.readInteger(as: UInt8.self) {
        case Kind.sample:
            guard (try? decoder.decode(Sample.self, from: Data(buffer.readableBytesView))) != nil else {
                fail("W1: undecodable sample")
            }
            count += 1
        case Kind.end:
            context.writeAndFlush(
                wrapOutboundOut(frame(context.channel.allocator, kind: Kind.count, String(count).utf8)), promise: nil)
        default: fail("W1: unexpected frame")
        }
    }
}

final class W2Server: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let decoder = JSONDecoder()
    let encoder = JSONEncoder()

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        _ = buffer.readInteger(as: UInt8.self)
        guard let sample = try? decoder.decode(Sample.self, from: Data(buffer.readableBytesView)),
            let json = try? encoder.encode(sample)
        else { fail("W2: codec") }
        context.write(wrapOutboundOut(frame(context.channel.allocator, kind: Kind.sample, json)), promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) { context.flush() }
}

final class W3Server: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    var bytes = 0
    var count = 0

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard buffer.readInteger(as: UInt8.self) == Kind.bulk else { fail("W3: unexpected frame") }
        bytes += buffer.readableBytes
        count += 1
        if count == Workload.w3Messages {
            context.writeAndFlush(
                wrapOutboundOut(frame(context.channel.allocator, kind: Kind.done, String(bytes).utf8)), promise: nil)
        }
    }
}

/// W4: counts acks from clients.
final class W4Server: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let acks: NIOLockedValueBox<Int>
    let clients: Int
    let allAcked: EventLoopPromise<Void>
    init(acks: NIOLockedValueBox<Int>, clients: Int, allAcked: EventLoopPromise<Void>) {
        self.acks = acks
        self.clients = clients
        self.allAcked = allAcked
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard buffer.readInteger(as: UInt8.self) == Kind.ack else { fail("W4: unexpected frame") }
        if acks.withLockedValue({ $0 += 1; return $0 }) == clients { allAcked.succeed() }
    }
}

/// W6: answers each request (kind, 8-byte id, JSON sample) with a reply carrying the same id.
final class W6Server: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let decoder = JSONDecoder()
    let encoder = JSONEncoder()

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard buffer.readInteger(as: UInt8.self) == Kind.request, let id = buffer.readInteger(as: UInt64.self),
            let sample = try? decoder.decode(Sample.self, from: Data(buffer.readableBytesView)),
            let json = try? encoder.encode(sample)
        else { fail("W6: bad request") }
        var out = context.channel.allocator.buffer(capacity: 16 + json.count)
        out.writeInteger(Kind.reply)
        out.writeInteger(id)
        out.writeBytes(json)
        context.write(wrapOutboundOut(out), promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) { context.flush() }
}

/// W6 client side: request ids and their promises, on the channel's event loop.
final class W6Client: ChannelInboundHandler, @unchecked Sendable {
    // Confined to the channel's event loop.
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let decoder = JSONDecoder()
    let encoder = JSONEncoder()
    var pending: [UInt64: EventLoopPromise<Sample>] = [:]
    var nextID: UInt64 = 0
    var context: ChannelHandlerContext?

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    /// On the event loop: sends a request and returns the future reply.
    func request(_ sample: Sample) -> EventLoopFuture<Sample> {
        guard let context, let json = try? encoder.encode(sample) else { fail("W6: no context") }
        nextID += 1
        let promise = context.eventLoop.makePromise(of: Sample.self)
        pending[nextID] = promise
        var out = context.channel.allocator.buffer(capacity: 16 + json.count)
        out.writeInteger(Kind.request)
        out.writeInteger(nextID)
        out.writeBytes(json)
        context.writeAndFlush(wrapOutboundOut(out), promise: nil)
        return promise.futureResult
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard buffer.readInteger(as: UInt8.self) == Kind.reply, let id = buffer.readInteger(as: UInt64.self),
            let promise = pending.removeValue(forKey: id),
            let sample = try? decoder.decode(Sample.self, from: Data(buffer.readableBytesView))
        else { fail("W6: bad reply") }
        promise.succeed(sample)
    }
}

final class Idle: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}

// MARK: Client handlers

/// W1: encodes and writes samples on the event loop while the channel is writable, flushing every 64.
final class W1Client: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let n: Int
    let done: EventLoopPromise<Double>
    let encoder = JSONEncoder()
    var sent = 0
    var start: ContinuousClock.Instant?
    init(n: Int, done: EventLoopPromise<Double>) {
        self.n = n
        self.done = done
    }

    func channelActive(context: ChannelHandlerContext) {
        start = .now
        pump(context)
        context.fireChannelActive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { pump(context) }
        context.fireChannelWritabilityChanged()
    }

    func pump(_ context: ChannelHandlerContext) {
        guard sent < n else { return }
        while context.channel.isWritable && sent < n {
            guard let json = try? encoder.encode(Sample.make(sent)) else { fail("W1: encode") }
            context.write(wrapOutboundOut(frame(context.channel.allocator, kind: Kind.sample, json)), promise: nil)
            sent += 1
            if sent % 64 == 0 { context.flush() }
        }
        if sent == n {
            context.write(wrapOutboundOut(frame(context.channel.allocator, kind: Kind.end, [])), promise: nil)
        }
        context.flush()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard buffer.readInteger(as: UInt8.self) == Kind.count,
            Int(String(decoding: buffer.readableBytesView, as: UTF8.self)) == n
        else { fail("W1: the server did not count \(n) messages") }
        done.succeed(seconds(since: start!))
    }
}

/// W2: one sample in flight; the reply is decoded and checked.
final class W2Client: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let n: Int
    let done: EventLoopPromise<[UInt64]>
    let encoder = JSONEncoder()
    let decoder = JSONDecoder()
    let sample = Sample.make(42)
    /// When to send the first request (BENCH_W2_CONNECTIONS: once every connection is made).
    let start: EventLoopFuture<Void>?
    var latencies: [UInt64] = []
    var i = 0
    var t0: UInt64 = 0
    init(n: Int, done: EventLoopPromise<[UInt64]>, start: EventLoopFuture<Void>? = nil) {
        self.n = n
        self.done = done
        self.start = start
        latencies.reserveCapacity(n)
    }

    func channelActive(context: ChannelHandlerContext) {
        if let start {
            let bound = NIOLoopBound((handler: self, context: context), eventLoop: context.eventLoop)
            start.hop(to: context.eventLoop).whenSuccess { bound.value.handler.send(bound.value.context) }
        } else {
            send(context)
        }
        context.fireChannelActive()
    }

    func send(_ context: ChannelHandlerContext) {
        t0 = nowNanos()
        guard let json = try? encoder.encode(sample) else { fail("W2: encode") }
        context.writeAndFlush(wrapOutboundOut(frame(context.channel.allocator, kind: Kind.sample, json)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        _ = buffer.readInteger(as: UInt8.self)
        guard let back = try? decoder.decode(Sample.self, from: Data(buffer.readableBytesView)), back == sample else {
            fail("W2: bad reply")
        }
        if i >= Workload.w2Warmup { latencies.append(nowNanos() - t0) }
        i += 1
        if i == Workload.w2Warmup + n {
            done.succeed(latencies)
        } else {
            send(context)
        }
    }
}

/// W3: writes 1 MiB raw messages (one shared buffer, no copies) while writable.
final class W3Client: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let done: EventLoopPromise<Double>
    var sent = 0
    var start: ContinuousClock.Instant?
    var chunk: ByteBuffer?
    init(done: EventLoopPromise<Double>) { self.done = done }

    func channelActive(context: ChannelHandlerContext) {
        var buffer = context.channel.allocator.buffer(capacity: Workload.w3MessageSize + 1)
        buffer.writeInteger(Kind.bulk)
        buffer.writeRepeatingByte(0x5a, count: Workload.w3MessageSize)
        chunk = buffer
        start = .now
        pump(context)
        context.fireChannelActive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { pump(context) }
        context.fireChannelWritabilityChanged()
    }

    func pump(_ context: ChannelHandlerContext) {
        while context.channel.isWritable && sent < Workload.w3Messages {
            context.write(wrapOutboundOut(chunk!), promise: nil)
            sent += 1
            context.flush()
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        guard buffer.readInteger(as: UInt8.self) == Kind.done,
            Int(String(decoding: buffer.readableBytesView, as: UTF8.self))
                == Workload.w3Messages * Workload.w3MessageSize
        else { fail("W3: the server did not receive every byte") }
        done.succeed(seconds(since: start!))
    }
}

/// W4: decodes every broadcast sample; acks after the last one.
final class W4Client: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let decoder = JSONDecoder()
    let done: EventLoopPromise<Void>
    var count = 0
    init(done: EventLoopPromise<Void>) { self.done = done }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        _ = buffer.readInteger(as: UInt8.self)
        guard (try? decoder.decode(Sample.self, from: Data(buffer.readableBytesView))) != nil else {
            fail("W4: undecodable sample")
        }
        count += 1
        if count == Workload.w4Messages {
            context.writeAndFlush(wrapOutboundOut(frame(context.channel.allocator, kind: Kind.ack, [])), promise: nil)
            done.succeed()
        }
    }
}

// MARK: Bootstraps

func serve(
    connected: (@Sendable (any Channel) -> Void)? = nil, make: @escaping @Sendable () -> any ChannelHandler
) throws -> any Channel {
    try ServerBootstrap(group: group)
        .serverChannelOption(.backlog, value: 4096)
        .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
        .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
        .childChannelOption(.writeBufferWaterMark, value: waterMark)
        .childChannelInitializer { channel in
            connected?(channel)
            return addFraming(channel, server: true, make: make)
        }
        .bind(host: "127.0.0.1", port: 0).wait()
}

func connect(_ port: Int, make: @escaping @Sendable (any Channel) -> any ChannelHandler) -> EventLoopFuture<any Channel> {
    ClientBootstrap(group: group)
        .channelOption(.socketOption(.tcp_nodelay), value: 1)
        .channelOption(.writeBufferWaterMark, value: waterMark)
        .channelInitializer { channel in addFraming(channel, make: { make(channel) }) }
        .connect(host: "127.0.0.1", port: port)
}

func runServer() throws {
    switch workload {
    case "W1", "W2", "W3", "W6":
        let server = try serve {
            switch workload {
            case "W1": W1Server()
            case "W2": W2Server()
            case "W6": W6Server()
            default: W3Server()
            }
        }
        emit("READY \(server.localAddress!.port!)")
        // Runs until the client is done and the runner stops this process.
        try server.closeFuture.wait()
    case "W4":
        let clients = options.int("clients", Workload.w4Clients)
        let channels = NIOLockedValueBox<[any Channel]>([])
        let acks = NIOLockedValueBox(0)
        let allJoined = group.next().makePromise(of: Void.self)
        let allAcked = group.next().makePromise(of: Void.self)
        let server = try serve(connected: { channel in
            let n = channels.withLockedValue { $0.append(channel); return $0.count }
            if n == clients { allJoined.succeed() }
        }) { W4Server(acks: acks, clients: clients, allAcked: allAcked) }
        emit("READY \(server.localAddress!.port!)")
        try allJoined.futureResult.wait()
        let all = channels.withLockedValue { $0 }
        // Every channel must be active (handlers added) before broadcasting.
        for channel in all { _ = try channel.pipeline.handler(type: W4Server.self).map { _ in () }.wait() }
        let encoder = JSONEncoder()
        let allocator = ByteBufferAllocator()
        let batchSize = 256
        var previous: [EventLoopFuture<Void>] = []
        let start = ContinuousClock.now
        var i = 0
        while i < Workload.w4Messages {
            // Encode each message once; every channel gets the same buffers (no copies).
            var batch: [ByteBuffer] = []
            batch.reserveCapacity(batchSize)
            for j in i..<min(i + batchSize, Workload.w4Messages) {
                guard let json = try? encoder.encode(Sample.make(j)) else { fail("W4: encode") }
                batch.append(frame(allocator, kind: Kind.sample, json))
            }
            i += batch.count
            // Back-pressure: at most two batches in flight per channel.
            for future in previous { try future.wait() }
            let frozen = batch
            previous = all.map { channel in
                channel.eventLoop.flatSubmit {
                    var last: EventLoopFuture<Void>?
                    for buffer in frozen { last = channel.write(buffer) }
                    channel.flush()
                    return last!
                }
            }
        }
        try allAcked.futureResult.wait()
        let elapsed = seconds(since: start)
        let delivered = Double(clients * Workload.w4Messages)
        result("W4", impl, ["msgs_per_s": fmt(delivered / elapsed, 0), "seconds": fmt(elapsed, 3)])
        for channel in all { channel.close(promise: nil) }
    case "W5":
        let target = options.int("connections", Workload.w5Connections)
        let established = NIOLockedValueBox(0)
        let all = group.next().makePromise(of: Void.self)
        // Warm-up (ours does the same): one connection to ourselves, opened and closed, so that code
        // run for the first time is not counted as growth per connection. Then the baseline.
        // (--w5-warmup 0: no warm-up, the method of the runs before it.)
        if options.int("w5-warmup", 1) > 0 {
            let warm = try serve(connected: { channel in channel.close(promise: nil) }) { Idle() }
            let client = try connect(warm.localAddress!.port!) { _ in Idle() }.wait()
            try client.closeFuture.wait()
            try warm.close().wait()
        }
        Thread.sleep(forTimeInterval: 0.2)
        let before = residentBytes()
        let heapBefore = heapInUse()
        let freeBefore = heapFree()
        let threadsBefore = processStatus("Threads")
        let server = try serve(connected: { _ in
            if established.withLockedValue({ $0 += 1; return $0 }) == target { all.succeed() }
        }) { Idle() }
        emit("READY \(server.localAddress!.port!)")
        try all.futureResult.wait()
        Thread.sleep(forTimeInterval: 1)
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
    default:
        fail("unknown workload \(workload)")
    }
}

func runClient() throws {
    let port = options.int("port", 0)
    switch workload {
    case "W1":
        let n = options.int("messages", Workload.w1Messages)
        let done = group.next().makePromise(of: Double.self)
        let channel = try connect(port) { _ in W1Client(n: n, done: done) }.wait()
        let elapsed = try done.futureResult.wait()
        result("W1", impl, ["msgs_per_s": fmt(Double(n) / elapsed, 0), "seconds": fmt(elapsed, 3)])
        try channel.close().wait()
    case "W2" where Workload.w2Connections > 1:
        // BENCH_W2_CONNECTIONS: every connection made first, then all of them at once, one round
        // trip in flight each (as ours).
        let connections = Workload.w2Connections
        let each = max(1, options.int("messages", Workload.w2RoundTrips) / connections)
        let go = group.next().makePromise(of: Void.self)
        var channels: [any Channel] = []
        var results: [EventLoopFuture<[UInt64]>] = []
        for _ in 0..<connections {
            let done = group.next().makePromise(of: [UInt64].self)
            channels.append(try connect(port) { _ in W2Client(n: each, done: done, start: go.futureResult) }.wait())
            results.append(done.futureResult)
        }
        let start = ContinuousClock.now
        go.succeed()
        var latencies: [UInt64] = []
        latencies.reserveCapacity(each * connections)
        for future in results { latencies += try future.wait() }
        resultW2(impl, latencies, connections: connections, each: each, seconds: seconds(since: start))
        for channel in channels { try channel.close().wait() }
    case "W2":
        let n = options.int("messages", Workload.w2RoundTrips)
        let done = group.next().makePromise(of: [UInt64].self)
        let channel = try connect(port) { _ in W2Client(n: n, done: done) }.wait()
        let s = latencySummary(try done.futureResult.wait())
        result("W2", impl, ["p50_us": fmt(s.p50), "p99_us": fmt(s.p99), "max_us": fmt(s.max)])
        try channel.close().wait()
    case "W3":
        let done = group.next().makePromise(of: Double.self)
        let channel = try connect(port) { _ in W3Client(done: done) }.wait()
        let elapsed = try done.futureResult.wait()
        let mib = Double(Workload.w3Messages * Workload.w3MessageSize) / Double(1 << 20)
        result("W3", impl, ["mib_per_s": fmt(mib / elapsed, 0), "seconds": fmt(elapsed, 3), "msgs_per_s": fmt(Double(Workload.w3Messages) / elapsed, 0)])
        try channel.close().wait()
    case "W4":
        let clients = options.int("clients", Workload.w4Clients)
        var futures: [EventLoopFuture<Void>] = []
        var channels: [any Channel] = []
        for _ in 0..<clients {
            let done = group.next().makePromise(of: Void.self)
            channels.append(try connect(port) { _ in W4Client(done: done) }.wait())
            futures.append(done.futureResult)
        }
        for future in futures { try future.wait() }
        for channel in channels { try? channel.close().wait() }
    case "W6":
        // The same shape as ours: 100 Swift tasks, each awaiting its reply (an EventLoopFuture)
        // before sending the next request; latency per call; client RSS after 100k and at the end.
        let n = options.int("requests", Workload.w6Requests)
        let window = options.int("outstanding", Workload.w6Outstanding)
        let handler = W6Client()
        let channel = try connect(port) { _ in handler }.wait()
        let sample = Sample.make(42)
        let completed = NIOLockedValueBox(0)
        let checkpoint = NIOLockedValueBox(0)
        let histogram = LatencyHistogram()
        let rssBefore = residentBytes()
        let start = ContinuousClock.now
        let finished = DispatchSemaphore(value: 0)
        Task {
            await withTaskGroup(of: Void.self) { group in
                for worker in 0..<window {
                    group.addTask {
                        var i = worker
                        while i < n {
                            let t0 = nowNanos()
                            guard let reply = try? await channel.eventLoop.flatSubmit({ handler.request(sample) }).get(),
                                reply == sample
                            else { fail("W6: bad reply") }
                            histogram.record(nanoseconds: nowNanos() - t0)
                            if completed.withLockedValue({ $0 += 1; return $0 }) == Workload.w6Checkpoint {
                                checkpoint.withLockedValue { $0 = residentBytes() }
                            }
                            i += window
                        }
                    }
                }
            }
            finished.signal()
        }
        finished.wait()
        let elapsed = seconds(since: start)
        let rssEnd = residentBytes()
        guard histogram.count == n else { fail("W6: \(histogram.count) of \(n) replies") }
        let s = histogram.summary()
        result(
            "W6", impl,
            [
                "requests_per_s": fmt(Double(n) / elapsed, 0), "p50_us": fmt(s.p50), "p99_us": fmt(s.p99),
                "rss_start": "\(rssBefore)", "rss_100k": "\(checkpoint.withLockedValue { $0 })", "rss_end": "\(rssEnd)",
                "seconds": fmt(elapsed, 3),
            ])
        try channel.close().wait()
    case "W5":
        let target = options.int("connections", Workload.w5Connections)
        var channels: [any Channel] = []
        channels.reserveCapacity(target)
        var i = 0
        while i < target {
            let batch = (i..<min(i + 32, target)).map { _ in connect(port) { _ in Idle() } }
            for future in batch { channels.append(try future.wait()) }
            i += batch.count
        }
        emit("CONNECTED \(target)")
        Thread.sleep(forTimeInterval: TimeInterval(options.int("hold", 60)))
    default:
        fail("unknown workload \(workload)")
    }
}

do {
    if role == "server" { try runServer() } else { try runClient() }
} catch {
    fail("\(role) \(workload): \(error)")
}
exit(0)
