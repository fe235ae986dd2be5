// W8C (issue 53): a compaction of a large session store while senders send. One process: a server
// whose store keeps --live-mib MiB of messages to a client that never acknowledges them (the
// holder), while --senders tasks stream 1 KiB messages to a second client that acknowledges them
// (the streamer) — the released records pile up until the store compacts (twice what is live). A
// watcher sees the compaction's new file appear and go (`sessions.journal.new`); the senders' send
// times during that window are what the compaction costs them (goal: max ≤ 10 ms).
//   bench-ours solo W8C --store DIR [--live-mib 256] [--senders 64] [--w8-mode crash|power]
import BenchCommon
import Dispatch
import Foundation
import Messaging

struct Blob: Codable, Sendable { var s: String }

/// One `send`: when it began and how long it took (nanoseconds of the uptime clock).
struct TimedSend { let start: UInt64; let nanoseconds: UInt64 }

/// The compaction windows the watcher saw (uptime nanoseconds), guarded by its lock.
final class CompactionWatcher: @unchecked Sendable {
    private let lock = NSLock()
    private var windows: [(start: UInt64, end: UInt64?)] = []
    private var stopped = false
    private let path: String

    init(journal: String) { path = journal + ".new" }

    /// Polls for the compaction's file every 200 µs on a thread of its own (a benchmark's watcher).
    func start() {
        Thread {
            var present = false
            while !self.lock.withLock({ self.stopped }) {
                let now = access(self.path, F_OK) == 0
                if now != present {
                    let t = DispatchTime.now().uptimeNanoseconds
                    self.lock.withLock {
                        if now { self.windows.append((t, nil)) } else if !self.windows.isEmpty { self.windows[self.windows.count - 1].end = t }
                    }
                    present = now
                }
                usleep(200)
            }
        }.start()
    }

    func stop() { lock.withLock { stopped = true } }
    var completed: [(start: UInt64, end: UInt64)] { lock.withLock { windows.compactMap { w in w.end.map { (w.start, $0) } } } }
}

func runCompaction() async throws {
    let directory = options.string("store", NSTemporaryDirectory() + "bench-w8c-\(getpid())") + "/server"
    try? FileManager.default.removeItem(atPath: directory)
    let liveMiB = options.int("live-mib", 256)
    let senders = options.int("senders", 64)
    let mode = options.string("w8-mode", "crash")
    let server = try await topFloorServer {
        var store = SessionStore(directory: directory, durability: mode == "power" ? .powerLoss : .processCrash)
        store.maxBytes = 4 << 30
        $0.session?.store = store
        $0.session?.maxUnacknowledgedMessages = 1 << 20
        $0.session?.maxUnacknowledgedBytes = 4 << 30
    }
    let connections = AsyncStream<ServerConnection>.makeStream()
    Task {
        for await event in server.events {
            if case .accepted(let connection) = event { connections.continuation.yield(connection) }
        }
    }
    func client(_ name: String, acknowledging: Bool) async throws -> MessageClient {
        var cc = ClientConfiguration(peerName: name, reconnect: ReconnectPolicy())
        cc.channel = configuration(name)
        cc.peerMemory = nil
        cc.session?.acknowledgement = acknowledging ? .automatic : .manual
        let client = try await MessageClient.connect(to: .host("127.0.0.1", port: server.port!), configuration: cc, logger: logger)
        Task { for await _ in client.events {} }  // the holder's app never acknowledges (manual)
        return client
    }
    let holderClient = try await client("holder", acknowledging: false)
    var iterator = connections.stream.makeAsyncIterator()
    guard let holder = await iterator.next() else { fail("W8C: no holder") }
    let block = Blob(s: String(repeating: "b", count: 4080))  // about 4 KiB of JSON
    let fillStart = ContinuousClock.now
    for _ in 0..<(liveMiB * 256) { try await holder.send(block, type: "live") }
    emit("FILLED \(liveMiB) MiB in \(fmt(seconds(since: fillStart), 2)) s")
    let streamerClient = try await client("streamer", acknowledging: true)
    guard let streamer = await iterator.next() else { fail("W8C: no streamer") }

    let watcher = CompactionWatcher(journal: directory + "/sessions.journal")
    watcher.start()
    let payload = Blob(s: String(repeating: "a", count: 1010))  // about 1 KiB
    let deadline = ContinuousClock.now + .seconds(options.int("seconds", 90))
    let timings = try await withThrowingTaskGroup(of: [TimedSend].self) { group in
        for _ in 0..<senders {
            group.addTask {
                var mine: [TimedSend] = []
                while watcher.completed.isEmpty && ContinuousClock.now < deadline {
                    let start = DispatchTime.now().uptimeNanoseconds
                    try await streamer.send(payload, type: "stream")
                    mine.append(TimedSend(start: start, nanoseconds: DispatchTime.now().uptimeNanoseconds - start))
                }
                return mine
            }
        }
        var all: [TimedSend] = []
        for try await part in group { all += part }
        return all
    }
    watcher.stop()
    guard let window = watcher.completed.first else { fail("W8C: no compaction within the time given (\(timings.count) sends)") }
    func summary(_ sends: [TimedSend]) -> (p50: Double, p99: Double, max: Double) {
        let sorted = sends.map(\.nanoseconds).sorted()
        guard !sorted.isEmpty else { return (0, 0, 0) }
        func at(_ q: Double) -> Double { Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))]) / 1000 }
        return (at(0.5), at(0.99), Double(sorted.last!) / 1000)
    }
    // During: sends that overlapped the window (began before its end, ended after its start).
    let during = timings.filter { $0.start < window.end && $0.start + $0.nanoseconds > window.start }
    let before = timings.filter { $0.start + $0.nanoseconds <= window.start }
    let d = summary(during)
    let b = summary(before)
    let fileSize = (try? FileManager.default.attributesOfItem(atPath: directory + "/sessions.journal")[.size] as? Int) ?? 0
    result(
        "W8C", "ours+" + mode + "+s\(senders)",
        [
            "live_mib": "\(liveMiB)", "compaction_ms": fmt(Double(window.end - window.start) / 1e6, 0),
            "sends_during": "\(during.count)", "during_p50_us": fmt(d.p50), "during_p99_us": fmt(d.p99), "during_max_us": fmt(d.max),
            "before_p50_us": fmt(b.p50), "before_p99_us": fmt(b.p99), "before_max_us": fmt(b.max),
            "file_after_mib": fmt(Double(fileSize) / Double(1 << 20), 0),
        ])
    await holderClient.close()
    await streamerClient.close()
    await server.stop()
    try? FileManager.default.removeItem(atPath: directory)
}
