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
import BenchCommon
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

func limit(_ key: String, _ fallback: Int?) -> Int? {
    guard let value = options.values[key] else { return fallback }
    return value == "off" ? nil : Int(value)
}

func runServer() async throws {
    var logger = Logger(label: "siege-server")
    logger.logLevel = .notice
    var configuration = ServerConfiguration(serviceType: "_siege._tcp", serviceName: "siege")
    configuration.publish = false
    configuration.listener.loopbackOnly = true
    configuration.listener.families = [.ipv4]
    configuration.channel.security = security
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

func connect(_ port: UInt16) async throws -> MessageChannel {
    var logger = Logger(label: "siege-client")
    logger.logLevel = .error
    return try await MessageChannel.connect(
        to: [SocketAddress.ipv4Loopback(port: port)], configuration: channelConfiguration("client"), logger: logger)
}

/// Round trips for `seconds`, each request sent when the previous reply arrived (W2's handler
/// client: the next request goes out from the reply's handler).
func runW2(_ port: UInt16) async throws {
    let seconds = Double(options.int("seconds", 10))
    let channel = try await connect(port)
    let sample = Sample.make(42)
    let finished = AsyncStream<[UInt64]>.makeStream()
    final class State: @unchecked Sendable {  // touched only by the handler (serial) and before it runs
        var latencies: [UInt64] = []
        var t0: UInt64 = 0
        var end: UInt64 = 0
        var warm = 0
    }
    let state = State()
    state.latencies.reserveCapacity(200_000)
    channel.on(type: "s", as: Sample.self) { back, _ in
        guard back == sample else { fail("W2: bad reply") }
        let t = nowNanos()
        if state.warm < Workload.w2Warmup { state.warm += 1 } else { state.latencies.append(t - state.t0) }
        if state.warm == Workload.w2Warmup && state.end == 0 { state.end = t + UInt64(seconds * 1e9) }
        if state.end != 0 && t >= state.end {
            finished.continuation.yield(state.latencies)
            return
        }
        state.t0 = nowNanos()
        guard (try? channel.trySend(sample, type: "s")) == true else { fail("W2: send queue full") }
    }
    state.t0 = nowNanos()
    try await channel.send(sample, type: "s")
    var results = finished.stream.makeAsyncIterator()
    guard let latencies = await results.next() else { fail("W2: no result") }
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

do {
    switch role {
    case "server": try await runServer()
    case "w2": try await runW2(UInt16(options.int("port", 0)))
    case "legit": try await runLegit(UInt16(options.int("port", 0)))
    default: fail("unknown role \(role)")
    }
} catch {
    fail("\(role): \(error)")
}
exit(0)
