// What both implementations share: the message, the workload sizes, timing, and the result lines
// that Benchmarks/run.sh parses. Nothing here does I/O on sockets.
import CBenchSupport
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The W1/W2/W4 message.
public struct Sample: Codable, Sendable, Equatable {
    public var id: Int
    public var name: String
    public var value: Double
    public var tags: [String]

    public init(id: Int, name: String, value: Double, tags: [String]) {
        self.id = id
        self.name = name
        self.value = value
        self.tags = tags
    }

    /// The i-th sample: a 16-ASCII-character name, three short tags. (`BENCH_SAMPLE_PAD=N`, for
    /// Benchmarks/curves.sh: the name N bytes longer, a bigger message of the same shape.)
    public static func make(_ i: Int) -> Sample {
        let digits = String(i % 10000)
        let name = "sample-name-" + String(repeating: "0", count: 4 - digits.count) + digits
        return Sample(
            id: i, name: padding.isEmpty ? name : name + padding,
            value: Double(i) * 0.25 + 0.5, tags: ["alpha", "beta", "gamma"])
    }

    static let padding = String(repeating: "x", count: Workload.environment("BENCH_SAMPLE_PAD", 0, least: 0))
}

/// Workload sizes (exactly as issue 7 defines them). `Benchmarks/curves.sh` (issue 55) varies some
/// of them through the environment, read by server and client alike: `BENCH_W3_SIZE` and
/// `BENCH_W3_COUNT` (W3's message size and count), `BENCH_W4_CLIENTS` and `BENCH_W4_MESSAGES`,
/// `BENCH_W5_CONNECTIONS`, `BENCH_W1_MESSAGES` (W1's and W7's), `BENCH_W2_ROUND_TRIPS`,
/// `BENCH_W2_WARMUP` and `BENCH_W2_CONNECTIONS` (and ``Sample/make(_:)``'s `BENCH_SAMPLE_PAD`). Unset, they are issue 7's.
public enum Workload {
    public static let w1Messages = environment("BENCH_W1_MESSAGES", 1_000_000)
    public static let w2RoundTrips = environment("BENCH_W2_ROUND_TRIPS", 100_000)
    public static let w2Warmup = environment("BENCH_W2_WARMUP", 2_000)
    /// W2's connections, each with one round trip in flight (`BENCH_W2_ROUND_TRIPS` split among
    /// them, each warmed up by `BENCH_W2_WARMUP` of its own): the curve of latency against
    /// connections (issue 55). 1: issue 7's W2.
    public static let w2Connections = environment("BENCH_W2_CONNECTIONS", 1)
    public static let w3Messages = environment("BENCH_W3_COUNT", 1024)
    public static let w3MessageSize = environment("BENCH_W3_SIZE", 1 << 20)
    public static let w4Clients = environment("BENCH_W4_CLIENTS", 50)
    public static let w4Messages = environment("BENCH_W4_MESSAGES", 20_000)
    public static let w5Connections = environment("BENCH_W5_CONNECTIONS", 5_000)

    /// An integer of at least `least` from the environment, or `standard`.
    static func environment(_ name: String, _ standard: Int, least: Int = 1) -> Int {
        guard let text = ProcessInfo.processInfo.environment[name] else { return standard }
        guard let value = Int(text), value >= least else { fatalError("\(name)=\(text): an integer of at least \(least), please") }
        return value
    }
    /// W6: request/reply calls, how many are outstanding at once, and when client RSS is sampled first.
    public static let w6Requests = 1_000_000
    public static let w6Outstanding = 100
    public static let w6Checkpoint = 100_000
}

/// Parsed `--key value` options and the positional words.
public struct Options: Sendable {
    public var words: [String] = []
    public var values: [String: String] = [:]

    public init(_ arguments: [String] = Array(CommandLine.arguments.dropFirst())) {
        var i = 0
        while i < arguments.count {
            let a = arguments[i]
            if a.hasPrefix("--"), i + 1 < arguments.count {
                values[String(a.dropFirst(2))] = arguments[i + 1]
                i += 2
            } else {
                words.append(a)
                i += 1
            }
        }
    }

    public func int(_ key: String, _ fallback: Int) -> Int { values[key].flatMap(Int.init) ?? fallback }
    public func string(_ key: String, _ fallback: String) -> String { values[key] ?? fallback }
}

/// Seconds elapsed since `start`.
public func seconds(since start: ContinuousClock.Instant) -> Double {
    let d = ContinuousClock.now - start
    return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}

/// Prints one line and flushes (the runner reads stdout line by line).
public func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Prints to stderr and exits with status 1.
public func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("bench: \(message)\n".utf8))
    exit(1)
}

/// Exits the process after `seconds` no matter what (every benchmark process is bounded).
public func armWatchdog(seconds: Int) {
    let t = Thread {
        Thread.sleep(forTimeInterval: TimeInterval(seconds))
        FileHandle.standardError.write(Data("bench: watchdog fired after \(seconds) s\n".utf8))
        exit(2)
    }
    t.start()
}

/// A numeric field of /proc/self/status (`kB` fields in bytes), or 0.
public func processStatus(_ field: String) -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
    for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
        let parts = line.split(separator: " ", omittingEmptySubsequences: true).flatMap { $0.split(separator: "\t") }
        guard parts.count >= 2, let value = Int(parts[1]) else { return 0 }
        return parts.count >= 3 && parts[2] == "kB" ? value * 1024 : value
    }
    return 0
}

/// VmRSS of this process in bytes (from /proc/self/status).
public func residentBytes() -> Int { processStatus("VmRSS") }

/// Bytes of heap in use (glibc mallinfo2: small chunks plus mmapped blocks), all arenas.
public func heapInUse() -> Int {
    Int(bench_heap_in_use())
}

/// Bytes malloc holds free inside its arenas (touched pages it keeps for reuse), all arenas.
public func heapFree() -> Int {
    Int(bench_heap_free())
}

/// Latency percentiles of W2 (microseconds).
public func latencySummary(_ nanos: [UInt64]) -> (p50: Double, p99: Double, max: Double) {
    let sorted = nanos.sorted()
    func at(_ q: Double) -> Double {
        Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))]) / 1000
    }
    return (at(0.50), at(0.99), Double(sorted.last ?? 0) / 1000)
}

/// A latency histogram of fixed size (1 µs buckets up to 200 ms, one overflow bucket), allocated
/// and touched when made: recording never allocates, so it does not grow the process's memory while
/// a workload runs (W6 samples RSS during the run). Thread-safe.
public final class LatencyHistogram: @unchecked Sendable {
    // Guarded by lock.
    private let lock = NSLock()
    private var buckets: [UInt32]
    private var total = 0
    private var maximum: UInt64 = 0

    public init(maxMicroseconds: Int = 200_000) {
        buckets = [UInt32](repeating: 0, count: maxMicroseconds + 1)
    }

    public func record(nanoseconds: UInt64) {
        let micros = Int(min(nanoseconds / 1000, UInt64(buckets.count - 1)))
        lock.withLock {
            buckets[micros] &+= 1
            total += 1
            maximum = max(maximum, nanoseconds)
        }
    }

    public var count: Int { lock.withLock { total } }

    /// Percentiles in microseconds (bucket resolution) and the maximum.
    public func summary() -> (p50: Double, p99: Double, max: Double) {
        lock.withLock {
            func at(_ q: Double) -> Double {
                let rank = Int((Double(total) * q).rounded(.down))
                var seen = 0
                for (micros, n) in buckets.enumerated() {
                    seen += Int(n)
                    if seen > rank { return Double(micros) + 0.5 }
                }
                return Double(buckets.count)
            }
            return (at(0.50), at(0.99), Double(maximum) / 1000)
        }
    }
}

/// The monotonic clock in nanoseconds.
@inline(__always) public func nowNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// Result line format parsed by run.sh:
/// `RESULT <workload> <impl> <metric>=<value> ...`
public func result(_ workload: String, _ impl: String, _ fields: KeyValuePairs<String, String>) {
    emit("RESULT \(workload) \(impl) " + fields.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
}

public func fmt(_ v: Double, _ digits: Int = 1) -> String { String(format: "%.\(digits)f", v) }

/// W2's RESULT with `BENCH_W2_CONNECTIONS` above 1: the percentiles of every round trip after each
/// connection's warm-up, and the round trips a second of all of them (warm-ups included) over
/// `seconds`.
public func resultW2(_ impl: String, _ latencies: [UInt64], connections: Int, each: Int, seconds: Double) {
    let s = latencySummary(latencies)
    let trips = Double(connections * (each + Workload.w2Warmup))
    result(
        "W2", impl,
        [
            "p50_us": fmt(s.p50), "p99_us": fmt(s.p99), "max_us": fmt(s.max), "connections": "\(connections)",
            "round_trips_per_s": fmt(trips / seconds, 0),
        ])
}
