import Foundation
import TestWaits
import Testing

@testable import Messaging

/// Durable sessions against `kill -9`, with real processes and real files (issue 42): a sensor
/// (client) streams numbered values to a collector (server); each keeps its sessions in a store,
/// the collector writes each value to its file and then lets the library acknowledge it (the
/// program is Tests/SessionChaos). Killed at random points of progress — after 5–300 values more
/// reached the receivers' files, or (one cycle in eight) as soon as the restarted sides said READY,
/// mid-resume — the receiver, then the sender (every other time while the receiver is away and
/// the sender went on for 1–40 values), then either or both while values flow both ways, then the
/// same with power-loss durability — the
/// files must hold every value exactly once, in order, and the senders must report nothing
/// undelivered.
///
/// Short in the test run (`LANMSG_CHAOS_CYCLES`, default 8 per phase); the long form is
/// `Tests/chaos/session-chaos.sh --cycles 100`. Loopback only; every process is one this test
/// started, stopped by its PID.
@Suite(.serialized) struct SessionChaosTests {
    static var cycles: Int { Int(ProcessInfo.processInfo.environment["LANMSG_CHAOS_CYCLES"] ?? "") ?? 8 }

    enum Victim: String { case receiver, sender, both }

    struct Phase {
        let name: String
        /// Who is killed in each cycle (`both`: the server, the client or both, at random).
        let victim: Victim
        /// The collector streams values to the sensor too.
        let bothWays: Bool
        let durability: String
        /// Each killed side's store loses its last records before it starts again (cut at a record
        /// boundary, or inside a record): the sides run the recovery recipe (`--recover`).
        var truncate = false
    }

    static let phases = [
        Phase(name: "receiver killed", victim: .receiver, bothWays: false, durability: "crash"),
        Phase(name: "sender killed", victim: .sender, bothWays: false, durability: "crash"),
        Phase(name: "both ways, either or both killed", victim: .both, bothWays: true, durability: "crash"),
        Phase(name: "both ways, power-loss durability", victim: .both, bothWays: true, durability: "power"),
        // Issue 53, 3: stores that lost records (what a power loss leaves under process-crash
        // durability, a file cut by hand): the sessions must never go on with numbers reused.
        Phase(name: "receiver's store cut", victim: .receiver, bothWays: false, durability: "crash", truncate: true),
        Phase(name: "sender's store cut", victim: .sender, bothWays: false, durability: "crash", truncate: true),
        Phase(name: "both ways, either or both stores cut", victim: .both, bothWays: true, durability: "crash", truncate: true),
    ]

    @Test(arguments: 0..<phases.count)
    func killedProcessesLoseNothingAndDuplicateNothing(_ index: Int) async throws {
        let phase = Self.phases[index]
        // `LANMSG_CHAOS_PHASES=6` (indices, comma-separated): only those phases, for a long run of one.
        if let only = ProcessInfo.processInfo.environment["LANMSG_CHAOS_PHASES"],
            !only.split(separator: ",").compactMap({ Int($0) }).contains(index)
        {
            return
        }
        let root = NSTemporaryDirectory() + "session-chaos-\(index)-\(UInt64.random(in: 0...UInt64.max))"
        defer { if ProcessInfo.processInfo.environment["LANMSG_CHAOS_KEEP"] == nil { try? FileManager.default.removeItem(atPath: root) } }
        let port = try freePort()
        let recover = phase.truncate ? ["--recover"] : []
        let server = Side(
            name: "server", arguments: ["server", "--port", "\(port)", "--dir", root + "/server", "--durability", phase.durability]
                + (phase.bothWays ? ["--send"] : []) + recover)
        let client = Side(
            name: "client",
            arguments: ["client", "--port", "\(port)", "--dir", root + "/client", "--send", "--durability", phase.durability] + recover)
        defer {
            server.kill()
            client.kill()
        }
        try await server.start()
        try await client.start()
        // Kills land at points of progress, not of time: after the receivers took a number of
        // values more (their files, told by inotify; with --recover a value sent again that the
        // receiver had is a line of duplicates.log) — and a restart after which nothing moves
        // fails here, with what the sides said. (With cut stores the values owed grow with the
        // cycles, and so may the time before a new one arrives: the wait grows as the drain's.)
        let receivers = [root + "/server"] + (phase.bothWays ? [root + "/client"] : [])
        let watch = try DirectoryWatch([root + "/server", root + "/client"])
        let bound = Duration.seconds(60 + (phase.truncate ? 2 * Self.cycles : 0))
        func takenBy(_ receivers: [String]) -> LineCounts {
            LineCounts(receivers.flatMap { [$0 + "/received.log", $0 + "/duplicates.log"] }, within: bound)
        }
        var taken = takenBy(receivers)
        // What the test did, beside the sides' program.log (times comparable): for a kept run.
        _ = FileManager.default.createFile(atPath: root + "/cycles.log", contents: nil)
        let cycleLog = FileHandle(forWritingAtPath: root + "/cycles.log")
        defer { try? cycleLog?.close() }
        func record(_ line: String) {
            let now = Date().timeIntervalSince1970
            cycleLog?.write(Data((String(format: "%.6f ", now) + line + "\n").utf8))
        }
        var kills = (server: 0, client: 0)
        var cut = 0
        var powerLosses = 0
        var atOnce = 0
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<Self.cycles {
            // One cycle in eight kills as soon as the sides said READY (mid-resume); the others
            // after 5–300 values more.
            if Int.random(in: 0..<8, using: &generator) == 0 {
                atOnce += 1
            } else {
                try await taken.waitForMore(Int.random(in: 5...300, using: &generator), watch: watch, sides: [server, client])
            }
            let victims: [Side]
            switch phase.victim {
            case .receiver: victims = [server]
            case .sender: victims = [client]
            case .both: victims = [[server], [client], [server, client]].randomElement(using: &generator)!
            }
            // Every other time the sender dies, the receiver is away (stopped, its sessions kept):
            // what the sender sent meanwhile is in its memory and its store only.
            let away = phase.victim == .sender && kills.client % 2 == 1
            if away {
                server.signal(SIGTERM)
                await server.waitForExit()
                // The sender goes on while the receiver is away: 1–40 values more in its file.
                var sent = LineCounts([root + "/client/sent.log"], within: bound)
                try await sent.waitForMore(Int.random(in: 1...40, using: &generator), watch: watch, sides: [client])
            }
            for side in victims { side.kill() }
            record("cycle: killed \(victims.map(\.name))" + (away ? " (the receiver away)" : ""))
            if phase.truncate {
                for side in victims {
                    let bytes = Self.cutStore(root + (side === server ? "/server" : "/client") + "/store/sessions.journal", using: &generator)
                    record("cut \(bytes) bytes of the \(side.name)'s journal")
                    cut += bytes
                    // A power loss (the machine starts again: a new boot) — always when both
                    // stores lost records at once, as nothing else could tell the two stores'
                    // earlier agreement from the truth (MessageSessions.md); else half the time,
                    // the other half a hand cutting the file in the same boot.
                    if victims.count == 2 || Bool.random(using: &generator) {
                        side.boot = UUID().uuidString
                        powerLosses += 1
                        record("the \(side.name) starts in a new boot (a power loss)")
                    }
                }
            }
            if away { try await server.start() }
            for side in victims {
                if side === server { kills.server += 1 } else { kills.client += 1 }
                try await side.start()
            }
        }
        // Calm, once the last restarts moved on (each way): the senders stop, everything they sent
        // is acknowledged, then both end.
        for receiver in receivers {
            var each = takenBy([receiver])
            try await each.waitForMore(5, watch: watch, sides: [server, client])
        }
        let senders = phase.bothWays ? [client, server] : [client]
        for side in senders { side.signal(SIGUSR1) }
        // With cut stores the recovery recipe sends again, after each start, whatever its log
        // says was sent and neither its store nor a report accounts for — the whole history when
        // the store's session is one the log never saw (a renewal whose report a kill took): the
        // calm's work grows with the cycles, so the wait does too. (The senders once paced
        // themselves by the value, which stands still while owed values go again: at ~90 values a
        // second such a drain outlasted 76 s in CI; the calm's time is in the MEASURED line.)
        let drain = Duration.seconds(60 + (phase.truncate ? 2 * Self.cycles : 0))
        let calm = ContinuousClock.now
        for side in senders { try await side.waitFor("DRAINED", timeout: drain) }
        let drained = ContinuousClock.now - calm
        for side in [client, server] { side.signal(SIGTERM) }
        for side in [client, server] { await side.waitForExit() }

        let check = phase.truncate ? Self.checkRecovered : Self.check
        var counts = check(root + "/server", root + "/client", "sensor → collector")
        var report = "\(phase.name): \(Self.cycles) cycles (\(kills.server) collector kills, \(kills.client) sensor kills, \(atOnce) at once after READY"
            + (phase.truncate ? ", \(cut) bytes cut, \(powerLosses) as power losses" : "") + "), \(counts.arrived) values up"
        if phase.bothWays {
            let down = check(root + "/client", root + "/server", "collector → sensor")
            report += ", \(down.arrived) down"
            counts.lost += down.lost
            counts.duplicated += down.duplicated
            counts.undelivered += down.undelivered
        }
        let what = phase.truncate ? "reported undelivered (and sent again)" : "undelivered"
        // Reports a killed side's app had not taken, made again by its next process (the library's
        // notice in each side's program.log).
        let again = [root + "/server", root + "/client"].reduce(0) { total, side in
            total + (((try? String(contentsOfFile: side + "/program.log", encoding: .utf8)) ?? "").components(separatedBy: "are reported again").count - 1)
        }
        print(
            "MEASURED session chaos \(report); lost \(counts.lost), duplicated \(counts.duplicated), \(what) \(counts.undelivered)"
                + " (\(again) reports made again after a restart);"
                + " drained in \(String(format: "%.1f", Double(drained.components.seconds) + Double(drained.components.attoseconds) / 1e18)) s")
    }

    /// Checks one direction: the receiver's file holds each session's numbers 1…n once, in order,
    /// and the values in increasing order (none twice); every value whose `send` returned is there;
    /// the sender reported nothing undelivered. Returns what it counted.
    static func check(_ receiver: String, _ sender: String, _ direction: String) -> (arrived: Int, lost: Int, duplicated: Int, undelivered: Int) {
        func lines(_ path: String) -> [Substring] {
            ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n")
        }
        var next: [Substring: UInt64] = [:]
        var values: [Int] = []
        for line in lines(receiver + "/received.log") {
            let fields = line.split(separator: " ")
            guard fields.count == 3, let number = UInt64(fields[1]), let value = Int(fields[2]) else {
                Issue.record("\(direction): a line that is no message: \(line)")
                continue
            }
            let expected = next[fields[0], default: 1]
            #expect(number == expected, "\(direction): session \(fields[0].prefix(8)) number \(number) where \(expected) was next")
            next[fields[0]] = number + 1
            values.append(value)
        }
        let duplicated = values.count - Set(values).count
        #expect(duplicated == 0, "\(direction): \(duplicated) values twice")
        #expect(values == values.sorted(), "\(direction): values out of order")
        let received = Set(values)
        let sent = lines(sender + "/sent.log").compactMap { $0.split(separator: " ").first.flatMap { Int($0) } }
        let lost = sent.filter { !received.contains($0) }
        #expect(lost.isEmpty, "\(direction): \(lost.count) sent values never arrived, the first \(lost.prefix(10))")
        #expect(!sent.isEmpty, "\(direction): nothing was sent")
        let undelivered = lines(sender + "/undelivered.log")
        #expect(undelivered.isEmpty, "\(direction): reported undelivered: \(undelivered.prefix(10))")
        return (values.count, lost.count, duplicated, undelivered.count)
    }

    /// A store that lost its last records, as a power loss leaves it (process-crash durability) or
    /// a hand cuts it: its journal cut at a record boundary (the last 1…20 records), or inside one of
    /// its last records. Returns the bytes cut.
    static func cutStore(_ path: String, using generator: inout SystemRandomNumberGenerator) -> Int {
        guard let bytes = FileManager.default.contents(atPath: path).map([UInt8].init),
            case .success(let scan) = bytes.withUnsafeBytes({ Journal.scan($0) }), scan.records.count > 1
        else { return 0 }
        let dropped = Int.random(in: 1...min(20, scan.records.count - 1), using: &generator)
        let last = scan.records[scan.records.count - dropped]
        let length = Bool.random(using: &generator) ? last.offset : last.offset + Int.random(in: 1..<last.length, using: &generator)
        guard truncate(path, off_t(length)) == 0 else { return 0 }
        return bytes.count - length
    }

    /// Checks one direction of a phase whose stores lost records, where the sides run the recovery
    /// recipe (`--recover`): every value whose `send` returned arrived — none lost, whether the
    /// library delivered it, reported it undelivered and the sender sent it again, or the sender
    /// found its store had lost it and sent it again; the receiver's file holds each value once (a
    /// value that came again was dropped by the app, counted), and within each session position
    /// numbers only increase (no number reused under an old session id: that would have been
    /// skipped by the recipe, and the value lost).
    static func checkRecovered(_ receiver: String, _ sender: String, _ direction: String) -> (arrived: Int, lost: Int, duplicated: Int, undelivered: Int) {
        func lines(_ path: String) -> [Substring] {
            ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n")
        }
        var last: [Substring: UInt64] = [:]
        var values: [Int] = []
        for line in lines(receiver + "/received.log") {
            let fields = line.split(separator: " ")
            guard fields.count == 3, let number = UInt64(fields[1]), let value = Int(fields[2]) else {
                Issue.record("\(direction): a line that is no message: \(line)")
                continue
            }
            #expect(number > last[fields[0], default: 0], "\(direction): session \(fields[0].prefix(8)) number \(number) after \(last[fields[0], default: 0])")
            last[fields[0]] = number
            values.append(value)
        }
        #expect(values.count == Set(values).count, "\(direction): the receiver's file holds a value twice")
        let received = Set(values)
        let sent = lines(sender + "/sent.log").compactMap { $0.split(separator: " ").first.flatMap { Int($0) } }
        let lost = Set(sent).subtracting(received).sorted()
        #expect(lost.isEmpty, "\(direction): \(lost.count) sent values never arrived, the first \(lost.prefix(10))")
        #expect(!sent.isEmpty, "\(direction): nothing was sent")
        return (values.count, lost.count, lines(receiver + "/duplicates.log").count, lines(sender + "/undelivered.log").count)
    }

    /// The lines in some files the sides append to (their received or sent values), counted as
    /// they grow: only what was appended since the last count is read. (The programs open them
    /// with `O_APPEND` and never shorten them; a store cut by the test is the journal, not these.)
    struct LineCounts {
        let paths: [String]
        /// How long a wait for more lines may take before it is a failure.
        let bound: Duration
        var offsets: [Int]
        var lines: [Int]

        init(_ paths: [String], within bound: Duration) {
            self.paths = paths
            self.bound = bound
            offsets = Array(repeating: 0, count: paths.count)
            lines = Array(repeating: 0, count: paths.count)
            _ = count()
        }

        /// Counts what was appended; returns the lines in all the files.
        mutating func count() -> Int {
            for index in paths.indices {
                guard let handle = FileHandle(forReadingAtPath: paths[index]) else { continue }
                defer { try? handle.close() }
                let size = Int((try? handle.seekToEnd()) ?? 0)
                guard size > offsets[index], (try? handle.seek(toOffset: UInt64(offsets[index]))) != nil,
                    let data = try? handle.read(upToCount: size - offsets[index])
                else { continue }
                offsets[index] += data.count
                lines[index] += data.reduce(0) { $0 + ($1 == 10 ? 1 : 0) }
            }
            return lines.reduce(0, +)
        }

        /// Waits until the files hold `more` lines than now, woken by their writes (the watch);
        /// `bound` without them is a failure that says what the sides said.
        mutating func waitForMore(_ more: Int, watch: DirectoryWatch, sides: [Side]) async throws {
            let target = count() + more
            var counts = self
            do {
                try await waitUntil("\(more) lines more in \(paths.map { ($0 as NSString).lastPathComponent })", timeout: bound, wokenBy: watch.changes) {
                    counts.count() >= target
                }
            } catch {
                throw TestFailure("\(error); the sides said: " + sides.map { "\($0.name): \($0.text.suffix(1_500))" }.joined(separator: "\n"))
            }
            self = counts
        }
    }

    /// One program: started, killed with SIGKILL, started again on the same directory.
    final class Side: @unchecked Sendable {  // touched by the test's task only
        let name: String
        let arguments: [String]
        /// The boot of the machine it runs in (`--boot`): a new one after a simulated power loss.
        var boot = UUID().uuidString
        private var process: Process?
        private var output = ""
        /// Its output and its exit, as events.
        private var watch: ChildWatch?

        init(name: String, arguments: [String]) {
            self.name = name
            self.arguments = arguments
        }

        static var binary: String {
            var directory = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
            if directory.lastPathComponent.hasSuffix(".xctest") { directory.deleteLastPathComponent() }
            return directory.appendingPathComponent("session-chaos").path
        }

        /// Starts it and waits until it says READY.
        func start() async throws {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: Self.binary)
            process.arguments = arguments + ["--boot", boot]
            output = NSTemporaryDirectory() + "session-chaos-\(name)-\(UInt64.random(in: 0...UInt64.max)).out"
            _ = FileManager.default.createFile(atPath: output, contents: nil)
            process.standardOutput = FileHandle(forWritingAtPath: output)
            process.standardError = process.standardOutput
            try process.run()
            self.process = process
            watch = try ChildWatch(pid: process.processIdentifier, outputPath: output)
            try await waitFor("READY", timeout: .seconds(20))
        }

        var text: String { (try? String(contentsOfFile: output, encoding: .utf8)) ?? "" }

        /// Waits (bounded) until the output says `needle`, woken by each write and by the exit.
        func waitFor(_ needle: String, timeout: Duration) async throws {
            if let watch {
                try? await waitUntil("\(name) said \(needle)", timeout: timeout, wokenBy: watch.changes) {
                    text.contains(needle) || watch.exited || process?.isRunning != true
                }
            }
            guard text.contains(needle) else {
                throw TestFailure("\(name): no \(needle) within \(timeout); it said: \(text.suffix(2000))")
            }
        }

        func signal(_ number: Int32) {
            if let process, process.isRunning { Foundation.kill(process.processIdentifier, number) }
        }

        /// SIGKILL, and waits until it is gone (its store's lock with it).
        func kill() {
            guard let process, process.isRunning else { return }
            Foundation.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            try? FileManager.default.removeItem(atPath: output)
        }

        /// Waits (up to 30 s, woken by its exit: its pidfd) for it to end after SIGTERM; then SIGKILL.
        func waitForExit() async {
            guard let process else { return }
            if let watch {
                try? await waitUntil("\(name) exited", timeout: .seconds(30), wokenBy: watch.changes) {
                    watch.exited || !process.isRunning
                }
            }
            if watch?.exited == true { process.waitUntilExit() }  // gone: reaped in a moment
            if process.isRunning { kill() }
            try? FileManager.default.removeItem(atPath: output)
        }
    }
}
