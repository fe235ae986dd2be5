import Dispatch
import Foundation
import Locks
import Logging

/// The journal writer's state: the file, its header and end, and the index of what is live in it.
/// Touched only by the caller holding the journal's writing role (``SessionJournal/write()``).
final class JournalWriter: @unchecked Sendable {
    /// A live session in the index.
    struct Live {
        var snapshot: Journal.Snapshot
        /// Its kept messages in the file, oldest first (those before `head` were released).
        var messages: [(number: UInt64, offset: Int, length: Int)] = []
        var head = 0
        var bytes = 0

        init(snapshot: Journal.Snapshot) { self.snapshot = snapshot }

        init(_ restored: Journal.Restored) {
            snapshot = restored.snapshot
            for message in restored.messages {
                messages.append((message.number, message.offset, message.length))
                bytes += message.length
            }
        }

        var kept: ArraySlice<(number: UInt64, offset: Int, length: Int)> { messages[head...] }

        mutating func release(through number: UInt64) -> Int {
            var freed = 0
            while head < messages.count, messages[head].number <= number {
                freed += messages[head].length
                head += 1
            }
            if head > 64 && head * 2 > messages.count {
                messages.removeFirst(head)
                head = 0
            }
            bytes -= freed
            return freed
        }
    }

    struct State {
        var file: any StoreFile
        var header: Journal.Header
        /// Where the next record goes: the end of the records.
        var size: Int
        /// The file's length: zeros from `size` to here, written ahead of the records
        /// (``SessionJournal/allocateAhead(through:)``).
        var allocated: Int
        /// After room could not be written ahead (a full disk): no new try before the records
        /// reach here, a step further (0: none pending).
        var allocateAgainAt = 0
        var sessions: [Journal.Key: Live]
        /// Messages of an epoch whose beginning record has not been indexed yet (``Journal/Staged``).
        var staged = Journal.Staged<(number: UInt64, offset: Int, length: Int)>()
        /// Bytes of kept messages.
        var liveBytes: Int
        /// Reports of undelivered messages the app has not taken (``Journal/Record/reported(_:_:)``),
        /// oldest first: a compaction writes them into its new file. (Rare and short-lived: the
        /// app takes a report when its events loop goes on.)
        var reportIndex: Journal.Reports
        var reports: [Journal.Report] { reportIndex.pending }
        /// What compaction weighs: kept messages and the reports not taken.
        var keptBytes: Int { liveBytes + reportIndex.bytes }

        init(
            file: any StoreFile, header: Journal.Header, size: Int, sessions: [Journal.Key: Journal.Restored],
            reports: [Journal.Report]
        ) {
            self.init(file: file, header: header, size: size, live: sessions.mapValues(Live.init), reports: reports)
        }

        init(file: any StoreFile, header: Journal.Header, size: Int, live: [Journal.Key: Live], reports: [Journal.Report]) {
            self.file = file
            self.header = header
            self.size = size
            allocated = size
            sessions = live
            liveBytes = live.values.reduce(0) { $0 + $1.bytes }
            reportIndex = Journal.Reports(reports)
        }
    }

    var state: State
    /// Reused for every write: the bytes, where each record lies in them, where each batch ends.
    var buffer: [UInt8] = []
    var spans: [(offset: Int, length: Int)] = []
    var ends: [Int] = []
    /// Sessions whose batch failed, with the generation that failed (its later batches fail too).
    var failedChains: [Journal.Key: UInt32] = [:]
    /// Compact when the file grows past this.
    var compactAt: Int
    /// The least size that is compacted (``SessionJournal/compactionFloor(_:)``, or a test's).
    var floor: Int
    /// The floor is a test's: not read from the disk again.
    let fixedFloor: Bool
    /// The compaction copying in the background, if any.
    var compaction: JournalCompaction?
    /// The store was closed and its file with it (``SessionJournal/closeFiles()``).
    var filesClosed = false

    init(state: State, floor: Int, fixed: Bool) {
        self.state = state
        self.floor = floor
        fixedFloor = fixed
        compactAt = max(floor, 2 * (state.keptBytes + 256 * state.sessions.count))
    }

    /// Updates the index for a record written at `offset`. Returns the kept bytes it freed.
    func index(_ record: Journal.Record, offset: Int, length: Int) -> Int {
        let key = record.key
        if case .message = record {} else { state.reportIndex.apply(record) }  // (reports: ``Journal/Reports``)
        switch record {
        case .session(let snapshot):
            var live = Live(snapshot: snapshot)
            // (The file passed the replay's rule when it was opened, and the writer writes a
            // group and its beginning record in one batch: a mismatch cannot happen here.)
            if case .carried(let carried)? = state.staged.take(key, for: snapshot) {
                for message in carried {
                    live.messages.append(message)
                    live.bytes += message.length
                }
            }
            state.liveBytes += live.bytes
            let old = state.sessions.updateValue(live, forKey: key)
            state.liveBytes -= old?.bytes ?? 0
            return old?.bytes ?? 0
        case .ended:
            state.staged.drop(key)
            let old = state.sessions.removeValue(forKey: key)
            state.liveBytes -= old?.bytes ?? 0
            return old?.bytes ?? 0
        case .reported, .reportTaken:
            return 0
        default:
            break
        }
        // Records of another epoch never apply (as in ``Journal/replay(_:)``); a message of an
        // epoch to come is staged.
        // (One lookup, the session changed in place: each record is one call, and a lookup per
        // field copied the session's index out and back — perf: 5 % of a crash-durable sender.)
        let slot = state.sessions.index(forKey: key)
        let current = slot.map { state.sessions.values[$0].snapshot.epoch }
        guard let slot, current == record.epoch else {
            if case .message(_, let epoch, let number, _, _, _) = record,
                state.staged.stages(key, epoch: epoch, number: number, current: current, ended: false)
            {
                state.staged.add(key, epoch: epoch, number: number, (number, offset, length))
            }
            return 0
        }
        switch record {
        case .message(_, _, let number, _, _, _):
            modify(&state.sessions.values[slot]) { live in
                live.messages.append((number, offset, length))
                live.bytes += length
                live.snapshot.nextNumber = number + 1
            }
            state.liveBytes += length
        case .released(_, _, let through):
            let freed = modify(&state.sessions.values[slot]) { live in
                live.snapshot.acknowledged = max(live.snapshot.acknowledged, through)
                return live.release(through: through)
            }
            state.liveBytes -= freed
            return freed
        case .handled(_, _, let through):
            modify(&state.sessions.values[slot]) { $0.snapshot.handled = max($0.snapshot.handled, through) }
        case .connected:
            state.sessions.values[slot].snapshot.everConnected = true
        case .session, .ended, .reported, .reportTaken:
            break
        }
        return 0
    }

    private func modify<R>(_ live: inout Live, _ body: (inout Live) -> R) -> R { body(&live) }
}

extension SessionJournal {
    // MARK: Writing

    /// Queues `records` to be written after everything queued before (any context: no lock is
    /// taken, no system call made — call it under the session's lock to fix their order). `done`
    /// runs once they are written, on the writer's thread, with the position after them (what
    /// ``whenSynced(_:_:)`` waits for), or with why they were not (then nothing of them is in the
    /// file). Nothing is written until someone calls ``write()``.
    /// - Parameter chain: The session and its write generation (``JournalQueue/Batch/chain``).
    func enqueue(
        _ records: [Journal.Record], chain: (key: Journal.Key, generation: UInt32)? = nil,
        done: (@Sendable (Result<UInt64, FileError>) -> Void)? = nil
    ) {
        queue.push(JournalQueue.Batch(records, chain: chain, done: done))
    }

    /// Writes what is queued, unless another caller is writing now (it writes it then: a writer
    /// looks again after giving up the role). Call it with no lock held: it makes system calls and
    /// runs the batches' completions.
    func write() {
        while !queue.isEmpty || compactionReady.load(ordering: .sequentiallyConsistent) {
            guard writing.compareExchange(expected: false, desired: true, ordering: .sequentiallyConsistent).exchanged else { return }
            var outcomes: [(JournalQueue.Batch, Result<UInt64, FileError>)] = []
            drain(&outcomes)
            if compactionReady.exchange(false, ordering: .sequentiallyConsistent) { finishCompaction() }
            writing.store(false, ordering: .sequentiallyConsistent)
            // The completions run with the role given up: another caller writes the next records
            // meanwhile. (Their order across writers does not matter: each says "written through
            // a position", and the machine keeps the highest.)
            for (batch, outcome) in outcomes { batch.done?(outcome) }
        }
    }

    /// Writes `records` now and returns the position after them (or throws; then nothing of them
    /// is in the file). Blocks while another caller writes.
    @discardableResult
    func append(_ records: Journal.Record...) throws(FileError) -> UInt64 { try append(records) }

    @discardableResult
    func append(_ records: [Journal.Record]) throws(FileError) -> UInt64 {
        let result = Locked<Result<UInt64, FileError>?>(nil)
        let written = DispatchSemaphore(value: 0)
        enqueue(records) { outcome in
            result.withLock { $0 = outcome }
            written.signal()
        }
        write()
        written.wait()
        return try result.withLock { $0! }.get()
    }

    /// Holding the role: takes every queued batch, writes them with one `pwrite`, updates the
    /// index, and adds their outcomes (the caller runs their completions after the role).
    private func drain(_ outcomes: inout [(JournalQueue.Batch, Result<UInt64, FileError>)]) {
        let batches = queue.takeAll()
        guard !batches.isEmpty else { return }
        let (stopped, closed) = shared.withLock { state -> (FileError?, Bool) in
            (state.failure ?? state.refused ?? (state.closed ? FileError(path, "the session store '\(path)' is closed") : nil), state.closed)
        }
        if closed { closeFiles() }
        if let stopped {
            outcomes = batches.map { ($0, .failure(stopped)) }
            return
        }
        // (Usually no session's batch failed: the batches are taken as they are, no new array.)
        let filtering = !writer.failedChains.isEmpty
        var taken = filtering ? [] : batches
        for batch in batches where filtering {
            if let chain = batch.chain, let failed = writer.failedChains[chain.key] {
                if failed == chain.generation {
                    outcomes.append((batch, .failure(FileError(path, "the session store '\(path)' did not store an earlier record of this session; nothing of this was stored"))))
                    continue
                }
                writer.failedChains[chain.key] = nil
            }
            taken.append(batch)
        }
        guard !taken.isEmpty else { return }
        // Writing faster than a compaction copies: the writer waits for it (the file must not grow
        // without bound, nor fill a small disk, while the copy catches up).
        if writer.compaction != nil, writer.state.size > 2 * writer.compactAt { waitForCompaction() }
        var attempt = 0
        while true {
            attempt += 1
            // (Read now: a compaction above may have replaced the file; its frontier is then the
            // new file's end, synced. A write tried again without one claims no more than before.)
            let frontier = shared.withLock { $0.frontier }
            encode(taken, frontier: frontier)
            let start = writer.state.size
            if start + writer.buffer.count > writer.state.allocated { allocateAhead(through: start + writer.buffer.count) }
            do {
                try writer.state.file.write(writer.buffer, at: start)
            } catch {
                do {
                    try writer.state.file.truncate(to: start)  // undo a partial write: the file ends with a complete record
                    writer.state.allocated = start
                } catch let cut {
                    logger.warning("session store: cannot cut back a failed write of '\(path)' (\(cut)); the next record is written over it")
                }
                let full = error.code == ENOSPC || error.code == EDQUOT
                if full, attempt <= 2 {
                    // A full disk: what the batches' acknowledgements release frees room whether or
                    // not their records fit (the index takes it now; a compaction writes what it leaves, and a
                    // release that is lost only makes a restarted side resend what the peer
                    // drops). A compaction copying in the background may be what filled it: it is
                    // finished first, and the write tried again in the file it left. A file mostly
                    // of released records then makes room by compacting at once.
                    if attempt == 1 {
                        for batch in taken {
                            for record in batch.records {
                                if case .released = record { _ = writer.index(record, offset: 0, length: 0) }
                            }
                        }
                        liveBytes.store(writer.state.liveBytes, ordering: .relaxed)
                    }
                    // A file a compaction replaced gives its room back once closed, on the sync
                    // queue after any sync of it: that first (it may be what filled the disk).
                    replacedFilesClosed()
                    let generation = shared.withLock { $0.generation }
                    if writer.compaction != nil { waitForCompaction() }
                    var replaced = shared.withLock { $0.generation } != generation
                    if !replaced, writer.state.liveBytes * 2 < writer.state.size { replaced = compactNow() }
                    if replaced { replacedFilesClosed() }  // (compactNow waited already; a background one not)
                    if replaced || attempt == 1 { continue }
                }
                let failure = FileError.system(
                    path, "cannot write to the session store '\(path)'", errno: error.code,
                    advice: full ? "the disk is full: free space on it; nothing of this was stored" : "nothing of this was stored")
                for batch in taken {
                    if let chain = batch.chain { writer.failedChains[chain.key] = chain.generation }
                    outcomes.append((batch, .failure(failure)))
                }
                return
            }
            var freed = 0
            var span = 0
            for batch in taken {
                for record in batch.records {
                    freed += writer.index(record, offset: start + writer.spans[span].offset, length: writer.spans[span].length)
                    span += 1
                }
            }
            writer.state.size += writer.buffer.count
            let (before, end) = (writer.state.size - writer.buffer.count, writer.state.size)
            let written = shared.withLock { state -> UInt64 in
                defer {
                    state.written += UInt64(end - before)
                    state.fileEnd = end
                }
                return state.written
            }
            liveBytes.store(writer.state.liveBytes, ordering: .relaxed)
            for (index, batch) in taken.enumerated() { outcomes.append((batch, .success(written + UInt64(writer.ends[index])))) }
            if freed > 0 { wakeRoomWaiters() }
            armBackgroundSync()
            if writer.compaction == nil, writer.state.size > writer.compactAt { startCompaction() }
            return
        }
    }

    /// Holding the role: writes zeros ahead of the records, past `end` up to the next multiple of a
    /// step (``step``; a quarter of a smaller file, at least 64 KiB). A record then overwrites
    /// blocks the file already has, and its `fdatasync` writes the data alone — not the file's new
    /// length and block map with it (figures at ``step`` and in docs/PERFORMANCE.md). Recovery cuts zeros past the last record as it cuts any torn
    /// tail, and a clean close cuts them. When they cannot be written (a full disk) the records are
    /// appended as before, and the next step is tried a step later.
    private func allocateAhead(through end: Int) {
        guard end >= writer.state.allocateAgainAt else { return }
        let step = min(Self.step, max(64 << 10, writer.state.size / 4))
        let from = writer.state.allocated
        let to = (end / step + 1) * step
        var offset = from
        do throws(StoreCallError) {
            while offset < to {
                let count = min(to - offset, Self.zeros.count)
                try writer.state.file.write(count == Self.zeros.count ? Self.zeros : Array(Self.zeros[..<count]), at: offset)
                offset += count
            }
            writer.state.allocated = to
            writer.state.allocateAgainAt = 0
            // At `.processCrash`, records up to there are copies into the file's pages, no system
            // call each (W8 with one sender: 70–86k → 100–124k messages/s). Not at `.powerLoss`:
            // its sends wait for a sync, which writing back a mapping makes dearer (every page
            // written protected again, the next copy faults) for nothing measurable.
            if !configuration.durability.syncs { writer.state.file.writesWillStayWithin(writer.state.size, to) }
        } catch {
            // (Zeros that were written take room a full disk lacks. Should the cut fail too, zeros
            // stay past `allocated`: written over by the next records, or cut at the next start.)
            try? writer.state.file.truncate(to: from)
            writer.state.allocateAgainAt = end + step
            logger.debug("session store: cannot write room ahead in '\(path)' (\(error)); records are appended")
        }
    }

    /// How far ``allocateAhead(through:)`` writes ahead at most: the sync that first takes a step's
    /// zeros to the disk is the slow one. Measured here with 10 KiB synced at a time (W8's 64
    /// senders): steps of 256 KiB give `fdatasync` p50 / p90 / p99 of 106–112 / 146–147 / 403–410
    /// µs against 247–290 / 298–348 / 369–429 for appends; steps of 1 MiB raise p99 to 622–692.
    static let step = 256 << 10
    /// What ``allocateAhead(through:)`` writes (a step at a time).
    static let zeros = [UInt8](repeating: 0, count: step)

    /// Encodes the batches into the writer's buffer: where each record lies in the buffer
    /// (``JournalWriter/spans``, in the batches' order) and where each batch ends
    /// (``JournalWriter/ends``). (Buffers the writer keeps: no allocation per write.)
    private func encode(_ batches: [JournalQueue.Batch], frontier: Int) {
        writer.buffer.removeAll(keepingCapacity: true)
        writer.spans.removeAll(keepingCapacity: true)
        writer.ends.removeAll(keepingCapacity: true)
        for batch in batches {
            for record in batch.records {
                let start = writer.buffer.count
                record.encode(into: &writer.buffer, header: writer.state.header, synced: frontier)
                writer.spans.append((start, writer.buffer.count - start))
            }
            writer.ends.append(writer.buffer.count)
        }
    }
}
