import Dispatch
import Foundation
import Logging
import Synchronization

/// One compaction of a session store's file: the live sessions and their kept messages, as they
/// stood when it began, copied into `sessions.journal.new` (a new salt) on the compaction queue;
/// then, while the writer goes on, what the writer appended meanwhile, again and again until
/// little is left; the writer then copies the rest, syncs the new file, renames it over the old
/// one and goes on in it — the directory synced before anything written since counts as on the
/// disk. A crash at any point leaves the old file whole (the new one is synced before the rename,
/// and an unfinished one is deleted at the next start) or the new one whole.
///
/// Touched by the compaction queue until it is ready, then by the writer alone.
final class JournalCompaction: @unchecked Sendable {
    let temporary: String
    let fileSystem: any StoreFileSystem
    let old: (file: any StoreFile, header: Journal.Header, generation: Int)
    let header: Journal.Header
    private let sessions: [(Journal.Key, JournalWriter.Live)]
    /// The reports not taken when it began (written anew into the new file, after the sessions).
    private let reports: [Journal.Report]
    /// The new file and its length.
    private(set) var file: (any StoreFile)?
    private(set) var size = 0
    /// Each session's kept messages as they stood when it began, in their order, with their
    /// places in the new file (built by the copy: the writer takes them as the sessions' index).
    var placed: [Journal.Key: [(number: UInt64, offset: Int, length: Int)]] = [:]
    /// Where the old file ended when it began: what lies after it is copied in order, record by
    /// record, to ``catchUpBase`` on — a record at old offset `o` is at `o - start + catchUpBase`.
    let start: Int
    private(set) var catchUpBase = 0
    /// The old file is copied up to here.
    private(set) var cut: Int
    private var buffer: [UInt8] = []
    private(set) var failure: StoreCallError?
    /// The copy on the compaction queue is over: the writer may finish it.
    let copied = Atomic(false)
    /// Signalled when it is (and again by each waiter: every one gets through).
    private let copiedSignal = DispatchSemaphore(value: 0)

    init(
        path: String, fileSystem: any StoreFileSystem, old: (file: any StoreFile, header: Journal.Header, generation: Int),
        sessions: [Journal.Key: JournalWriter.Live], reports: [Journal.Report], cut: Int
    ) {
        self.reports = reports
        temporary = path + ".new"
        self.fileSystem = fileSystem
        self.old = old
        header = .fresh(role: old.header.role, identity: old.header.identity)
        self.sessions = Array(sessions)
        self.cut = cut
        start = cut
    }

    /// Writes the new file: header, each session's snapshot, every kept message (copied as it is,
    /// its checks salted anew), then what the writer appended since, while more than `small` bytes
    /// of it are left (`end` reads where the old file ends now; nil when it was replaced).
    func copy(end: () -> Int?, small: Int) {
        do throws(StoreCallError) {
            let file = try fileSystem.create(temporary)
            self.file = file
            buffer = header.encoded
            // Sessions first (a session's record must come before its messages), then the messages
            // in their order in the old file (each session's in its own order).
            // (Each session's messages are in file order: sorted by place, they stay in each
            // session's order, and each is appended to its session's list as it is copied.)
            var messages: [(offset: Int, length: Int, session: Int, number: UInt64)] = []
            for (index, (_, live)) in sessions.enumerated() {
                var snapshot = live.snapshot
                if let first = live.kept.first {
                    snapshot.nextNumber = first.number
                    snapshot.acknowledged = first.number - 1
                }
                Journal.Record.session(snapshot).encode(into: &buffer, header: header, synced: 0)
                messages += live.kept.map { ($0.offset, $0.length, index, $0.number) }
            }
            Journal.encode(reports, into: &buffer, header: header)
            messages.sort { $0.offset < $1.offset }
            // (Room to grow: the writer appends to them under its role, where a copy of a long list would stall it.)
            var lists: [[(number: UInt64, offset: Int, length: Int)]] = []
            for (_, live) in sessions {
                let count: Int = live.kept.count
                lists.append([])
                lists[lists.count - 1].reserveCapacity(count + count / 4 + 64)
            }
            var chunk: (start: Int, bytes: [UInt8]) = (0, [])
            for message in messages {
                if message.offset < chunk.start || message.offset + message.length > chunk.start + chunk.bytes.count {
                    chunk = (message.offset, try old.file.read(at: message.offset, count: max(1 << 20, message.length)))
                    guard chunk.bytes.count >= message.length else { throw StoreCallError("pread", temporary, EIO) }
                }
                let from = message.offset - chunk.start
                lists[message.session].append((message.number, size + buffer.count, message.length))
                try append(chunk.bytes[from..<from + message.length])
            }
            for (index, (key, _)) in sessions.enumerated() where !lists[index].isEmpty { placed[key] = lists[index] }
            catchUpBase = size + buffer.count
            // Caught up and synced, then again what came during the sync (a few rounds at most):
            // the writer finishes it with little left to copy and sync while it holds its role.
            for _ in 0..<4 {
                while let end = end(), end - cut > small { try catchUp(through: end) }
                try flush()
                try file.sync()
                unsynced = 0
                guard let end = end(), end - cut > small else { break }
            }
        } catch {
            failure = error
        }
        copied.store(true, ordering: .releasing)
        copiedSignal.signal()
    }

    /// Waits until the copy is over (never on the compaction queue: the copy runs there).
    func waitUntilCopied() {
        guard !copied.load(ordering: .acquiring) else { return }
        copiedSignal.wait()
        copiedSignal.signal()
    }

    /// Copies the records the writer appended to the old file from ``cut`` up to `end` (each
    /// complete: the writer's end is always after a whole record).
    func catchUp(through end: Int) throws(StoreCallError) {
        while cut < end {
            let bytes = try old.file.read(at: cut, count: min(end - cut, 1 << 20))
            var offset = 0
            while bytes.count - offset >= Journal.recordHeaderSize {
                let length = Journal.recordHeaderSize + Int(bytes.loadBigEndian(at: offset, as: UInt32.self))
                if bytes.count - offset < length {
                    guard offset == 0 else { break }  // read the rest of a long record from its start
                    let whole = try old.file.read(at: cut, count: length)
                    guard whole.count == length else { throw StoreCallError("pread", temporary, EIO) }
                    try append(whole[...])
                    offset = length
                    break
                }
                try append(bytes[offset..<offset + length])
                offset += length
            }
            guard offset > 0 else { throw StoreCallError("pread", temporary, EIO) }
            cut += offset
        }
        try flush()
    }

    /// Appends one record of the old file, resealed for the new one.
    private func append(_ record: ArraySlice<UInt8>) throws(StoreCallError) {
        let start = buffer.count
        buffer += record
        buffer.withUnsafeMutableBytes { raw in Journal.reseal(raw, at: start, from: old.header, to: header, synced: 0) }
        if buffer.count >= 1 << 20 { try flush() }
    }

    /// Where the writer's index entries of session `key` go in the new file: the index's
    /// messages (oldest first) with their new places, and where the kept ones start; nil when
    /// one of them has no place there. Touches only what was written since it began (the rest is
    /// ``placed``, taken as it is), so the writer spends little on it whatever the store's size.
    func index(of key: Journal.Key, _ live: JournalWriter.Live) -> (messages: [(number: UInt64, offset: Int, length: Int)], head: Int)? {
        let kept = live.kept
        // The first kept message written after the copy began (places only grow in a session).
        var (low, high) = (kept.startIndex, kept.endIndex)
        while low < high {
            let middle = (low + high) / 2
            if kept[middle].offset < start { low = middle + 1 } else { high = middle }
        }
        let copied = low - kept.startIndex
        // (Taken out of `placed`: the index's own array, appended to without a copy.)
        var messages = placed.removeValue(forKey: key) ?? []
        var head = 0
        if copied > 0 {
            // Those from before: the tail of what the copy placed (releases only take from the front).
            guard messages.count >= copied else { return nil }
            head = messages.count - copied
            guard messages[head].number == kept[kept.startIndex].number, messages[messages.count - 1].number == kept[low - 1].number,
                messages[head].length == kept[kept.startIndex].length
            else { return nil }
        } else {
            messages = []
        }
        for entry in kept[low...] { messages.append((entry.number, entry.offset - start + catchUpBase, entry.length)) }
        return (messages, head)
    }

    private func flush() throws(StoreCallError) {
        guard !buffer.isEmpty, let file else { return }
        try file.write(buffer, at: size)
        size += buffer.count
        unsynced += buffer.count
        buffer.removeAll(keepingCapacity: true)
        // Synced as it goes: a copy of hundreds of MiB left to one sync at the end would fill the
        // disk's queue, and every sync of the journal meanwhile (each send's, with power-loss
        // durability) would wait behind it.
        if unsynced >= Self.syncEvery {
            try file.sync()
            unsynced = 0
        }
    }

    /// Bytes of the new file written and not yet synced, and how many may be.
    private var unsynced = 0
    static let syncEvery = 2 << 20

    /// Throws the new file away.
    func abandon() {
        file?.close()
        try? fileSystem.remove(temporary)
    }

    /// A file of an older format (1 or 2) rewritten in this one from what was read of it (at the
    /// start, before any writer): the new file is written, synced and renamed over the old one, the
    /// directory synced. Each session's messages keep its epoch (version 1 had none: 0).
    static func rewrite(
        path: String, restored: [Journal.Key: Journal.Restored], order: [Journal.Key], reports: [Journal.Report],
        role: Journal.Role, identity: String, old: any StoreFile, fileSystem: any StoreFileSystem
    ) throws(FileError) -> JournalWriter.State {
        let header = Journal.Header.fresh(role: role, identity: identity)
        var bytes = header.encoded
        var live: [Journal.Key: JournalWriter.Live] = [:]
        for key in order {
            guard let session = restored[key] else { continue }
            var snapshot = session.snapshot
            if let first = session.messages.first {
                snapshot.nextNumber = first.number
                snapshot.acknowledged = first.number - 1
            }
            Journal.Record.session(snapshot).encode(into: &bytes, header: header, synced: 0)
            var entry = JournalWriter.Live(snapshot: session.snapshot)
            for message in session.messages {
                let start = bytes.count
                Journal.Record.message(
                    key, epoch: session.snapshot.epoch, number: message.number, codecID: message.codecID, typeID: message.typeID,
                    payload: message.payload
                ).encode(into: &bytes, header: header, synced: 0)
                entry.messages.append((message.number, start, bytes.count - start))
                entry.bytes += bytes.count - start
            }
            live[key] = entry
        }
        Journal.encode(reports, into: &bytes, header: header)
        let temporary = path + ".new"
        do throws(StoreCallError) {
            let file = try fileSystem.create(temporary)
            do throws(StoreCallError) {
                try file.write(bytes, at: 0)
                try file.sync()
                try fileSystem.rename(temporary, to: path)
                try fileSystem.syncDirectory(of: path)
            } catch {
                file.close()
                try? fileSystem.remove(temporary)
                throw error
            }
            old.close()
            return JournalWriter.State(file: file, header: header, size: bytes.count, live: live, reports: reports)
        } catch {
            throw FileError.system(path, "cannot rewrite the session store '\(path)' in the current format", errno: error.code)
        }
    }
}

extension SessionJournal {
    // MARK: Compaction (the writer's side)

    /// Holding the role, the file past its compaction size: starts a compaction of what the index
    /// holds now, copied on the compaction queue.
    func startCompaction() {
        let job = makeCompaction()
        writer.compaction = job
        compactionQueue.async { [self] in
            let generation = job.old.generation
            job.copy(end: { shared.withLock { $0.generation == generation && !$0.closed ? $0.fileEnd : nil } }, small: 64 << 10)
            compactionReady.store(true, ordering: .sequentiallyConsistent)
            // The writer finishes it: whoever writes now, else a thread of its own — not this one,
            // whose drain could start the next compaction and wait for its copy, which this
            // serial queue runs only after this block.
            DispatchQueue.global().async { [self] in write() }
        }
    }

    /// Holding the role, a write failed for a full disk: compacts at once (the file is mostly
    /// released records). Returns whether the file was replaced.
    func compactNow() -> Bool {
        // The reserve gives a full disk the room the copy needs (made again after).
        try? fileSystem.remove(reservePath)
        let job = makeCompaction()
        job.copy(end: { nil }, small: 0)
        let done = finish(job)
        if done { replacedFilesClosed() }  // the replaced file closed (its room back) before the reserve is made again
        makeReserve()
        return done
    }

    /// A file of ``reserveSize`` bytes beside the journal, given up when the disk is full so that a
    /// compaction can still write its file (the way databases keep a ballast file). Made when the
    /// store opens and after each compaction on a full disk, when there is room; nothing depends
    /// on it otherwise.
    var reservePath: String { path + ".reserve" }
    static let reserveSize = 8 << 10

    func makeReserve() {
        do throws(StoreCallError) {
            if let existing = try fileSystem.open(reservePath) {
                existing.close()  // (it is there: nothing to do)
                return
            }
            let file = try fileSystem.create(reservePath)
            defer { file.close() }
            try file.write([UInt8](repeating: 0, count: Self.reserveSize), at: 0)
        } catch {
            try? fileSystem.remove(reservePath)
        }
    }

    private func makeCompaction() -> JournalCompaction {
        let generation = shared.withLock { $0.generation }
        return JournalCompaction(
            path: path, fileSystem: fileSystem, old: (writer.state.file, writer.state.header, generation),
            sessions: writer.state.sessions, reports: writer.state.reports, cut: writer.state.size)
    }

    /// Holding the role: waits for the background copy, and finishes the compaction.
    func waitForCompaction() {
        writer.compaction?.waitUntilCopied()
        finishCompaction()
    }

    /// Holding the role, the background copy done: finishes the compaction.
    func finishCompaction() {
        guard let job = writer.compaction, job.copied.load(ordering: .acquiring) else { return }
        writer.compaction = nil
        _ = finish(job)
    }

    /// Holding the role: copies what is left, syncs the new file, renames it into place and goes on
    /// in it; on any failure the old file stays and grows on until the next attempt.
    private func finish(_ job: JournalCompaction) -> Bool {
        if shared.withLock({ $0.closed }) {
            job.abandon()  // the store closed meanwhile: its file stays as it is
            return false
        }
        var failure = job.failure
        // Every kept message must have its place in the new file (else the index could not follow).
        var index: [(Journal.Key, [(number: UInt64, offset: Int, length: Int)], Int)] = []
        if failure == nil {
            do throws(StoreCallError) {
                try job.catchUp(through: writer.state.size)
                for (key, live) in writer.state.sessions {
                    guard let entry = job.index(of: key, live) else { throw StoreCallError("compact", path, EIO) }
                    index.append((key, entry.messages, entry.head))
                }
                try job.file!.sync()
                try fileSystem.rename(job.temporary, to: path)
            } catch {
                failure = error
            }
        }
        if let failure {
            job.abandon()
            writer.compactAt = max(writer.floor, writer.state.size * 2)
            let free = fileSystem.freeSpace(at: directory).map { "\($0) bytes free on its disk" } ?? "its disk's free space unknown"
            logger.warning(
                "session store: cannot compact '\(path)' (\(failure); \(writer.state.liveBytes) bytes of kept messages in \(writer.state.size), \(free)); it keeps growing until the next attempt at \(writer.compactAt) bytes")
            return false
        }
        let replaced = writer.state.file
        while let (key, messages, head) = index.popLast() {  // (moved, not copied: the writer appends to them)
            writer.state.sessions[key]!.messages = messages
            writer.state.sessions[key]!.head = head
        }
        writer.state.file = job.file!
        writer.state.header = job.header
        writer.state.size = job.size
        writer.state.allocated = job.size
        writer.state.allocateAgainAt = 0
        if !writer.fixedFloor { writer.floor = Self.compactionFloor(fileSystem.freeSpace(at: directory)) }
        writer.compactAt = max(writer.floor, 2 * (writer.state.keptBytes + 256 * writer.state.sessions.count))
        shared.withLock { state in
            state.file = job.file!
            state.generation += 1
            state.fileEnd = job.size
            state.frontier = job.size  // synced above
            state.directorySyncPending = true
            state.compactions += 1
        }
        // The rename is on the disk once the directory is; the replaced file is closed after any
        // sync that may run on it (on the sync queue), on a queue of its own (``closeQueue``).
        syncQueue.async { [self] in
            let generation = shared.withLock { $0.directorySyncPending ? $0.generation : nil }
            if let generation {
                do {
                    try fileSystem.syncDirectory(of: path)
                    shared.withLock { if $0.generation == generation { $0.directorySyncPending = false } }
                } catch {
                    logger.warning("session store: cannot sync the directory of '\(path)' after compacting it: \(error)")
                }
            }
            closeQueue.async { replaced.close() }
        }
        logger.debug("session store compacted", metadata: ["bytes": "\(job.size)", "sessions": "\(writer.state.sessions.count)"])
        return true
    }
}

extension Array where Element == UInt8 {
    /// The big-endian integer at `offset`.
    func loadBigEndian<T: FixedWidthInteger>(at offset: Int, as _: T.Type) -> T {
        withUnsafeBytes { T(bigEndian: $0.loadUnaligned(fromByteOffset: offset, as: T.self)) }
    }
}

extension Journal {
    /// Appends the records of `reports` (a compaction's or a rewrite's new file: they apply on their
    /// own, wherever they stand).
    static func encode(_ reports: [Report], into bytes: inout [UInt8], header: Header) {
        for report in reports {
            for message in report.messages { Record.reported(report.key, message).encode(into: &bytes, header: header, synced: 0) }
        }
    }
}
