import Foundation
import Locks
import Testing

@testable import Messaging

/// The session store against power loss, on the simulated disk (``SimulatedDisk``): the real
/// journal runs a workload of sessions — messages, acknowledgements, handled counts, new epochs,
/// ends, syncs and compactions (tiny, so they happen often) — while the disk records what a power
/// loss could leave after every system call. Each such crash state is opened again and judged:
/// - the store opens (never refused for what a crash left past the last sync);
/// - it holds exactly what the workload's records up to some point leave (a prefix: no record
///   without one written before it, no session half of one epoch and half of another);
/// - with power-loss durability, that point is past every record a sync had covered when the
///   crash came (nothing whose `send` returned is lost); with process-crash durability, when
///   everything in the page cache survived (a crash of the process, not the machine), past every
///   record whose write returned;
/// - it takes new records and reads them back.
/// Also with `EIO` and `ENOSPC` injected into one call of a run (any call: writes, syncs,
/// renames, the directory's sync).
///
/// `LANMSG_CRASH_STATES` sets how many crash states per durability (CI: 1,500; the long form:
/// `LANMSG_CRASH_STATES=20000 Tests/chaos/crash-states.sh`).
@Suite struct CrashStateTests {
    static var statesPerDurability: Int { Int(ProcessInfo.processInfo.environment["LANMSG_CRASH_STATES"] ?? "") ?? 1_500 }

    /// What a run did: the records handed to the journal (in order), and after how many calls how
    /// many of them were written (their `append` returned) or synced.
    struct Run: Sendable {
        var records: [Journal.Record] = []
        /// The records with the acknowledgements whose write failed: a full disk's
        /// compaction may still take their effect (what they release frees the room it needs).
        var withFailedReleases: [Journal.Record] = []
        var written: [(call: Int, records: Int)] = []
        var synced: [(call: Int, records: Int)] = []
        var images: [SimulatedDisk.Image] = []
        var errors = 0
        var compactions = 0
        var syncs = 0
        var trace: [String] = []
    }

    static let directory = "/store"

    static func open(_ disk: SimulatedDisk, _ durability: SessionStore.Durability) throws(FileError) -> SessionJournal {
        try SessionJournal(
            SessionStore(directory: directory, durability: durability), role: .server, identity: "plaintext", logger: testLogger(),
            fileSystem: disk, compactionFloor: 4096)
    }

    /// One workload, deterministic in its choices (`seed`), on a fresh disk; `failure`: a call that
    /// fails.
    static func run(_ durability: SessionStore.Durability, seed: UInt64, steps: Int, failure: (Int, Int32)? = nil) async -> Run {
        let disk = SimulatedDisk()
        let images = Locked<[SimulatedDisk.Image]>([])
        disk.onChange = { image in images.withLock { $0.append(image) } }
        disk.failure = failure
        var run = Run()
        var random = SeededRandom(seed)
        guard let journal = try? open(disk, durability) else {
            run.images = images.withLock { $0 }
            run.errors += 1
            return run
        }
        struct Session { var key: Journal.Key; var epoch: UInt32; var next: UInt64; var acknowledged: UInt64; var handled: UInt64 }
        var sessions: [Session] = []
        /// A session's beginning; `carrying` messages written before it (numbered from 1).
        func begin(_ key: Journal.Key, epoch: UInt32, carrying: UInt64 = 0) -> Journal.Record {
            .session(Journal.Snapshot(key: key, positionID: .random(), owner: "owner-\(key.low % 7)", nextNumber: carrying + 1, epoch: epoch))
        }
        var pendingSync: UInt64?
        for step in 0..<steps {
            var batch: [Journal.Record] = []
            var next = sessions
            let roll = Int.random(in: 0..<100, using: &random)
            if sessions.count < 2 || roll < 4 {
                let key = Journal.Key(high: UInt64(step), low: .random(in: 0...UInt64.max, using: &random))
                batch = [begin(key, epoch: 0)]
                next.append(Session(key: key, epoch: 0, next: 1, acknowledged: 0, handled: 0))
            } else {
                let index = Int.random(in: 0..<sessions.count, using: &random)
                var session = sessions[index]
                switch roll {
                case 4..<8:
                    batch = [.ended(session.key)]
                    next.remove(at: index)
                case 8..<12:
                    // A new epoch carrying the messages not released over, renumbered from 1, written
                    // before the record that begins it (format 3: all or nothing).
                    let carried = session.next - 1 - session.acknowledged
                    session = Session(key: session.key, epoch: session.epoch + 1, next: 1, acknowledged: 0, handled: 0)
                    for _ in 0..<carried {
                        let payload = (0..<Int.random(in: 1...200, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                        batch.append(.message(session.key, epoch: session.epoch, number: session.next, codecID: 1, typeID: "m", payload: payload))
                        session.next += 1
                    }
                    batch.append(begin(session.key, epoch: session.epoch, carrying: carried))
                case 43..<46:
                    // A client renews its session: the new one's carried messages, its beginning, the
                    // old one's end.
                    let key = Journal.Key(high: UInt64(step), low: .random(in: 0...UInt64.max, using: &random))
                    var renewed = Session(key: key, epoch: session.epoch + 1, next: 1, acknowledged: 0, handled: 0)
                    for _ in 0..<(session.next - 1 - session.acknowledged) {
                        batch.append(.message(key, epoch: renewed.epoch, number: renewed.next, codecID: 1, typeID: "m", payload: [UInt8(renewed.next & 0xff)]))
                        renewed.next += 1
                    }
                    batch += [begin(key, epoch: renewed.epoch, carrying: renewed.next - 1), .ended(session.key)]
                    next.remove(at: index)
                    next.append(renewed)
                case 12..<30 where session.next - 1 > session.acknowledged:
                    let through = UInt64.random(in: session.acknowledged + 1...session.next - 1, using: &random)
                    batch = [.released(session.key, epoch: session.epoch, through: through)]
                    session.acknowledged = through
                case 30..<40:
                    session.handled += UInt64.random(in: 1...5, using: &random)
                    batch = [.handled(session.key, epoch: session.epoch, through: session.handled)]
                case 40..<43:
                    batch = [.connected(session.key, epoch: session.epoch)]
                default:
                    let count = Int.random(in: 1...3, using: &random)
                    for _ in 0..<count {
                        let payload = (0..<Int.random(in: 1...200, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                        batch.append(.message(session.key, epoch: session.epoch, number: session.next, codecID: 1, typeID: "m", payload: payload))
                        session.next += 1
                    }
                }
                if index < next.count, next[index].key == session.key { next[index] = session }
            }
            do {
                let position = try journal.append(batch)
                sessions = next
                run.records += batch
                run.withFailedReleases += batch
                run.written.append((disk.callCount, run.records.count))
                if durability.syncs && (Int.random(in: 0..<4, using: &random) == 0 || step == steps - 1) {
                    pendingSync = position
                }
            } catch {
                run.errors += 1  // nothing of it was stored: the model goes on without it
                if batch.allSatisfy({ if case .released = $0 { true } else { false } }) {
                    run.withFailedReleases += batch
                }
            }
            if let position = pendingSync {
                pendingSync = nil
                let count = run.records.count
                do {
                    try await journal.synced(position)
                    run.synced.append((disk.callCount, count))
                } catch {
                    run.errors += 1
                }
            }
        }
        journal.close()
        run.compactions = journal.compactionCount
        run.trace = disk.trace
        run.syncs = journal.syncCount
        run.images = images.withLock { $0 }
        return run
    }

    /// What a store holds, in a form to compare.
    static func digest(_ sessions: [Journal.Key: Journal.Restored]) -> String {
        sessions.keys.sorted { ($0.high, $0.low) < ($1.high, $1.low) }.map { key in
            let session = sessions[key]!
            let snapshot = session.snapshot
            let messages = session.messages.map { "\($0.number):\($0.codecID):\($0.typeID):\($0.payload.hashValue)" }.joined(separator: ",")
            return "\(key.hex) e\(snapshot.epoch) p\(snapshot.positionID.hex) o\(snapshot.owner ?? "-") c\(snapshot.everConnected) "
                + "n\(snapshot.nextNumber) a\(snapshot.acknowledged) h\(snapshot.handled) [\(messages)]"
        }.joined(separator: "\n")
    }

    /// The digest of every prefix of the records: prefix length by digest.
    static func prefixes(_ records: [Journal.Record]) -> [String: [Int]] {
        var result: [String: [Int]] = [:]
        for length in 0...records.count {
            // (A failed end the workload went on after leaves records no session began: not a state.)
            guard let replayed = try? Journal.replay(records[0..<length].map { ($0, 0, 0) }).get() else { break }
            result[digest(replayed), default: []].append(length)
        }
        return result
    }

    /// Judges `count` crash states of `run` (spread over its images and the ways a power loss can
    /// go); returns how many it judged and the failures (at most 10).
    static func judge(_ run: Run, _ durability: SessionStore.Durability, count: Int, seed: UInt64) -> (judged: Int, failures: [String]) {
        var prefixes = prefixes(run.records)
        if run.withFailedReleases.count != run.records.count {
            for (digest, lengths) in Self.prefixes(run.withFailedReleases) { prefixes[digest, default: []] += lengths }
        }
        var random = SeededRandom(seed)
        var failures: [String] = []
        var judged = 0
        guard !run.images.isEmpty else { return (0, ["no image"]) }
        for index in 0..<count {
            let image = run.images[index % run.images.count]
            let choice = SimulatedDisk.Image.Choice.allCases[(index / run.images.count + index) % SimulatedDisk.Image.Choice.allCases.count]
            let disk = image.materialize(choice, using: &random)
            judged += 1
            let synced = run.synced.last { $0.call <= image.calls }?.records ?? 0
            let written = run.written.last { $0.call <= image.calls }?.records ?? 0
            let promised = durability.syncs ? synced : (choice == .everything ? written : 0)
            let what = "\(durability) state \(index): after call \(image.calls) of \(run.images.last!.calls), \(choice)"
            do {
                let journal = try open(disk, durability)
                let lengths = prefixes[digest(journal.restored)] ?? []
                if lengths.isEmpty {
                    failures.append("\(what): the store holds what no prefix of the records leaves:\n\(digest(journal.restored))")
                } else if lengths.max()! < promised {
                    failures.append("\(what): it holds the first \(lengths.max()!) records; \(promised) were promised; \(run.trace.filter { Int($0.split(separator: " ")[0])! > image.calls - 12 && Int($0.split(separator: " ")[0])! <= image.calls + 1 }) \(run.written.filter { $0.call > image.calls - 12 && $0.call <= image.calls + 3 })")
                }
                // It goes on: a new session and a message in it, read back.
                if index % 8 == 0 {
                    let key = Journal.Key(high: .max, low: UInt64(index))
                    try journal.append(.session(Journal.Snapshot(key: key, positionID: key)))
                    try journal.append(.message(key, epoch: 0, number: 1, codecID: 0, typeID: "after", payload: [1, 2, 3]))
                    journal.close()
                    let again = try open(disk, durability)
                    if again.restored[key]?.messages.map(\.payload) != [[1, 2, 3]] {
                        failures.append("\(what): a record written after the recovery did not come back: \(again.restored[key].map { "\($0.snapshot) \($0.messages.map(\.number))" } ?? "no session") \(disk.trace.suffix(20))")
                    }
                    again.close()
                } else {
                    journal.close()
                }
            } catch {
                failures.append("\(what): refused: \(error.message)")
            }
            if failures.count >= 10 { break }
        }
        return (judged, failures)
    }

    @Test(arguments: [SessionStore.Durability.processCrash, .powerLoss])
    func everyCrashStateRecoversWhatWasPromised(_ durability: SessionStore.Durability) async throws {
        var judged = 0
        var failures: [String] = []
        var seed: UInt64 = durability.syncs ? 1_000 : 2_000
        var (compactions, calls, runs) = (0, 0, 0)
        while judged < Self.statesPerDurability && failures.isEmpty {
            let run = await Self.run(durability, seed: seed, steps: 160)
            #expect(run.errors == 0, "the run itself failed \(run.errors) times")
            // (How many compactions finish within a run depends on the background copy's timing: CI
            // once saw 2 in a run. The workload must compact in every run, and often.)
            #expect(run.compactions >= 1, "the workload must compact (\(run.compactions))")
            runs += 1
            compactions += run.compactions
            calls += run.images.last?.calls ?? 0
            let result = Self.judge(run, durability, count: min(Self.statesPerDurability - judged, run.images.count * 6), seed: seed)
            judged += result.judged
            failures += result.failures
            seed += 1
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n\n"))")
        #expect(compactions >= 2 * runs, "the workload must compact often: \(compactions) compactions in \(runs) runs")
        print(
            "MEASURED crash states (\(durability)): \(judged) judged over \(calls) system calls and \(compactions) compactions, \(failures.count) failed")
    }

    /// The rewrite of a store of an older format at its opening (format 2 → 3: the new file
    /// written and synced beside the old one, renamed over it, the directory synced) against a
    /// power loss after any of its calls, every way the disk may go — also when one of its calls
    /// fails (`EIO`, `ENOSPC`; the opening is then refused with the reason, and the old store
    /// stays): every crash state opens and holds exactly what the old store held, the old file or
    /// the new one whole, and a second opening finds it in the current format.
    @Test(arguments: [SessionStore.Durability.processCrash, .powerLoss])
    func everyCrashStateOfAFormatRewriteHoldsWhatTheOldStoreHeld(_ durability: SessionStore.Durability) throws {
        let path = Self.directory + "/" + SessionJournal.fileName
        let old = SessionStoreTests.version2Store()
        let expected = try Self.open(SimulatedDisk(files: [path: old]), durability)
        #expect(expected.opening.migrated)
        let held = Self.digest(expected.restored)
        expected.close()
        #expect(held.contains("[2:1:t:") && held.contains(" h7 "), "\(held)")
        // A probe counts the opening's calls; then each of them fails once, in turn.
        let probe = SimulatedDisk(files: [path: old])
        let before = probe.callCount
        try Self.open(probe, durability).close()
        let calls = probe.callCount - before
        var (judged, refused) = (0, 0)
        var failures: [String] = []
        var random = SeededRandom(3)
        for failing in [nil] + (1...calls).flatMap({ [($0, EIO), ($0, ENOSPC)] as [(Int, Int32)?] }) {
            let disk = SimulatedDisk(files: [path: old])
            let images = Locked<[SimulatedDisk.Image]>([])
            disk.onChange = { image in images.withLock { $0.append(image) } }
            if let (call, code) = failing { disk.failure = (disk.callCount + call, code) }
            do {
                try Self.open(disk, durability).close()
            } catch {
                refused += 1
            }
            for image in images.withLock({ $0 }) {
                for choice in SimulatedDisk.Image.Choice.allCases {
                    judged += 1
                    let what = "after call \(image.calls)\(failing.map { " (call \($0.0) failing with \($0.1))" } ?? ""), \(choice)"
                    do {
                        let state = image.materialize(choice, using: &random)
                        let journal = try Self.open(state, durability)
                        if Self.digest(journal.restored) != held {
                            failures.append("\(what): holds\n\(Self.digest(journal.restored))\ninstead of\n\(held)")
                        }
                        journal.close()
                        let again = try Self.open(state, durability)
                        if again.opening.migrated || Self.digest(again.restored) != held {
                            failures.append("\(what): opened again, migrated \(again.opening.migrated), holds\n\(Self.digest(again.restored))")
                        }
                        again.close()
                    } catch {
                        failures.append("\(what): refused: \(error.message)")
                    }
                }
            }
        }
        #expect(refused > 0, "no injected failure refused the opening")
        #expect(failures.isEmpty, "\(failures.prefix(5).joined(separator: "\n\n"))")
        print("MEASURED crash states of a format rewrite (\(durability)): \(judged) judged over \(calls) calls, \(refused) openings refused by a failed call, \(failures.count) failed")
    }

    @Test(arguments: [SessionStore.Durability.processCrash, .powerLoss])
    func crashStatesAfterAFailedCallRecoverToo(_ durability: SessionStore.Durability) async throws {
        let probe = await Self.run(durability, seed: 7, steps: 60)
        let calls = probe.images.last?.calls ?? 0
        var judged = 0
        var failures: [String] = []
        var injected = 0
        var random = SeededRandom(99)
        let runs = max(6, Self.statesPerDurability / 150)
        for attempt in 0..<runs {
            let call = Int.random(in: 1...max(1, calls), using: &random)
            let code: Int32 = attempt % 2 == 0 ? EIO : ENOSPC
            let run = await Self.run(durability, seed: 7, steps: 60, failure: (call, code))
            if run.errors > 0 { injected += 1 }
            let after = SimulatedDiskRun(run).after(call)
            let result = Self.judge(after, durability, count: min(after.images.count, 30), seed: UInt64(attempt))
            judged += result.judged
            failures += result.failures.map { "\(code == EIO ? "EIO" : "ENOSPC") at call \(call): \($0)" }
            if !failures.isEmpty { break }
        }
        #expect(injected > 0, "no injected failure was met")
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n\n"))")
        print("MEASURED crash states after a failed call (\(durability)): \(judged) judged in \(runs) runs, \(failures.count) failed")
    }
}

/// A run's images from a call on (the states after an injected failure).
struct SimulatedDiskRun {
    let run: CrashStateTests.Run
    init(_ run: CrashStateTests.Run) { self.run = run }
    func after(_ call: Int) -> CrashStateTests.Run {
        var result = run
        result.images = run.images.filter { $0.calls >= call }
        if result.images.isEmpty, let last = run.images.last { result.images = [last] }
        return result
    }
}

/// SplitMix64: a seed reproduces a run's choices.
struct SeededRandom: RandomNumberGenerator {
    private var state: UInt64
    init(_ seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
