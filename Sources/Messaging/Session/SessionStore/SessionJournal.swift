import Dispatch
import Foundation
import Locks
import Logging
import SystemCalls

import Glibc

/// A ``SessionStore`` open in this process: one append-only file of ``Journal`` records in its
/// directory, held with a lock so that no other process uses it.
///
/// - ``append(_:)`` writes records at once (`pwrite`: in the operating system when it returns, so
///   they survive a crash of the process). A write that fails is undone (the file cut back), so the
///   file never holds a partial record after an error; the caller learns that nothing was stored.
/// - With ``SessionStore/Durability/powerLoss``, ``whenSynced(_:_:)`` runs its callback once the
///   records up to a point are on the disk. Syncs are grouped: while one runs, the callers that
///   come wait for the next, which covers all of them (one `fdatasync` on the store's serial queue
///   per batch, never one per caller, and no thread of its own).
/// - The file only grows until the records of what is no longer kept (acknowledged messages, ended
///   sessions) outweigh the rest: then it is compacted — the live sessions and their kept messages
///   are written to a new file, which replaces the old one by a rename.
///
/// What it keeps in memory is an index: each live session's counters and where its kept messages
/// lie in the file (their bytes are copied from there when compacting).
final class SessionJournal: Sendable {
    static let fileName = "sessions.journal"
    static let lockName = "sessions.lock"

    let directory: String
    let path: String
    let configuration: SessionStore
    private let header: Journal.Header
    private let logger: Logger
    private let lockFD: Int32
    /// Where the syncs (and the closing of a replaced file) run, one after another.
    private let syncQueue = DispatchQueue(label: "lanmsg.session-store")
    private let state: Locked<State>
    /// What the store held when it was opened: the sessions this process continues.
    let restored: [Journal.Key: Journal.Restored]

    /// A live session in the index.
    private struct Live {
        var snapshot: Journal.Snapshot
        /// Its kept messages in the file, oldest first (those before `head` were released).
        var messages: [(number: UInt64, offset: Int, length: Int)] = []
        var head = 0
        var bytes = 0

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

    private struct State {
        var fd: Int32
        /// The file's length: where the next record goes.
        var size: Int
        /// Bytes appended since the store was opened (a position that compaction does not move).
        var written: UInt64 = 0
        /// Of those, the ones known to be on the disk.
        var synced: UInt64 = 0
        var syncing = false
        /// Syncs done (what ``syncCount`` reports).
        var syncs = 0
        var syncWaiters: [(position: UInt64, done: @Sendable (FileError?) -> Void)] = []
        var sessions: [Journal.Key: Live] = [:]
        /// Bytes of kept messages (what ``SessionStore/maxBytes`` bounds).
        var liveBytes = 0
        var roomWaiters: [CheckedContinuation<Void, Never>] = []
        /// Compact when the file grows past this.
        var compactAt: Int
        /// A sync failed: the store is unusable from now on (a failed fsync cannot be retried).
        var failure: FileError?
        var closed = false
        /// Reused for every append.
        var buffer: [UInt8] = []
    }

    /// Compaction waits for the file to pass this size at least.
    static let minimumCompactionSize = 8 << 20

    /// Opens (or creates) the store in `configuration.directory` for `role`, as `identity`.
    /// - Throws: ``FileError`` naming the file, what is wrong and what to do: the directory cannot
    ///   be made, another process holds the store, or its file is damaged, of another format
    ///   version, another role or another identity. A torn last record (a crash during a write)
    ///   is no error: it is cut, and every complete record kept.
    init(_ configuration: SessionStore, role: Journal.Role, identity: String, logger: Logger) throws(FileError) {
        self.configuration = configuration
        self.logger = logger
        directory = configuration.directory
        path = (directory as NSString).appendingPathComponent(Self.fileName)
        header = Journal.Header(role: role, identity: identity)
        try createDirectories(for: path)
        lockFD = try Self.lock(directory)
        do throws(FileError) {
            let (fd, scan) = try Self.openFile(path, header: header, durability: configuration.durability, logger: logger)
            let sessions: [Journal.Key: Journal.Restored]
            switch Journal.replay(scan.records) {
            case .success(let replayed): sessions = replayed
            case .failure(let damage):
                closeDescriptor(fd)
                throw Self.damaged(path, damage)
            }
            restored = sessions
            var state = State(fd: fd, size: scan.end, compactAt: Self.minimumCompactionSize)
            for (key, session) in sessions {
                var live = Live(snapshot: session.snapshot)
                for message in session.messages {
                    live.messages.append((message.number, message.offset, message.length))
                    live.bytes += message.length
                }
                state.liveBytes += live.bytes
                state.sessions[key] = live
            }
            state.compactAt = max(Self.minimumCompactionSize, 2 * (state.liveBytes + 4096 * sessions.count))
            self.state = Locked(state)
        } catch {
            closeDescriptor(lockFD)
            throw error
        }
    }

    deinit {
        state.withLock { state in
            if !state.closed { closeDescriptor(state.fd) }
        }
        closeDescriptor(lockFD)
    }

    // MARK: Opening

    /// Takes the store's lock (released by the kernel when the process ends, however it ends).
    private static func lock(_ directory: String) throws(FileError) -> Int32 {
        let lockPath = (directory as NSString).appendingPathComponent(lockName)
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw FileError.system(lockPath, "cannot open the session store's lock '\(lockPath)'", errno: errno, advice: "check that the directory is writable")
        }
        if case .failure(let error) = retryingInterrupts({ flock(fd, LOCK_EX | LOCK_NB) }) {
            var holder = ""
            var bytes = [UInt8](repeating: 0, count: 32)
            let count = pread(fd, &bytes, bytes.count, 0)
            if count > 0, let pid = Int(String(decoding: bytes[0..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) {
                holder = " (pid \(pid))"
            }
            closeDescriptor(fd)
            guard error.wouldBlock else {
                throw FileError.system(lockPath, "cannot lock the session store '\(directory)'", errno: error.code)
            }
            throw FileError(
                lockPath,
                "the session store '\(directory)' is in use by another process\(holder): a store belongs to one process at a time; give this one a directory of its own, or stop the other first",
                errno: EWOULDBLOCK)
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = pwrite(fd, pid, pid.count, 0)
        return fd
    }

    /// Opens the file, creating it when there is none; reads it, checks its header and cuts a torn
    /// tail. Returns the descriptor and what it holds.
    private static func openFile(
        _ path: String, header: Journal.Header, durability: SessionStore.Durability, logger: Logger
    ) throws(FileError) -> (Int32, Journal.Scan) {
        // A file left by a compaction or a creation that a crash interrupted: the old file (or
        // none) still stands; the unfinished one is thrown away.
        unlink(path + ".new")
        var fd = open(path, O_RDWR | O_CLOEXEC)
        if fd < 0 {
            guard errno == ENOENT else {
                throw FileError.system(path, "cannot open the session store '\(path)'", errno: errno, advice: "check its permissions")
            }
            try create(path, header: header)
            fd = open(path, O_RDWR | O_CLOEXEC)
            guard fd >= 0 else { throw FileError.system(path, "cannot open the session store '\(path)'", errno: errno) }
        }
        let bytes: [UInt8]
        do {
            bytes = try readAll(fd, path)
        } catch {
            closeDescriptor(fd)
            throw error
        }
        let scanned = bytes.withUnsafeBytes { Journal.scan($0) }
        let scan: Journal.Scan
        switch scanned {
        case .success(let result): scan = result
        case .failure(let damage):
            closeDescriptor(fd)
            throw damaged(path, damage)
        }
        guard scan.header.role == header.role else {
            closeDescriptor(fd)
            throw FileError(
                path,
                "the session store '\(path)' holds \(scan.header.role) sessions and this is a \(header.role == .server ? "server" : "client"): give each its own directory")
        }
        guard scan.header.identity == header.identity else {
            closeDescriptor(fd)
            throw FileError(
                path,
                "the session store '\(path)' holds the sessions of identity \(scan.header.identity) and this process runs as \(header.identity): its sessions belong to that key. Use the identity that made them, or give this one another directory")
        }
        // With power-loss durability what was read must be on the disk before anything builds on
        // it (a crash of the process leaves written records in the page cache only).
        if durability.syncs { _ = fdatasync(fd) }
        if scan.torn > 0 {
            guard ftruncate(fd, off_t(scan.end)) == 0 else {
                let code = errno
                closeDescriptor(fd)
                throw FileError.system(path, "cannot cut the torn last record of '\(path)'", errno: code)
            }
            if durability.syncs { _ = fdatasync(fd) }
            logger.notice(
                "session store: cut a torn last record (\(scan.torn) bytes at byte \(scan.end) of '\(path)'), a write a crash interrupted; every complete record before it is kept")
        }
        return (fd, scan)
    }

    /// Creates the file with its header, whole or not at all (written beside it, synced, renamed).
    private static func create(_ path: String, header: Journal.Header) throws(FileError) {
        let temporary = path + ".new"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw FileError.system(path, "cannot create the session store '\(path)'", errno: errno, advice: "check that its directory is writable")
        }
        var failure = writeAllAndSync(fd, header.encoded)
        closeDescriptor(fd)
        if failure == nil, rename(temporary, path) != 0 { failure = errno }
        if let failure {
            unlink(temporary)
            throw FileError.system(path, "cannot create the session store '\(path)'", errno: failure)
        }
        syncDirectory(of: path)
    }

    private static func readAll(_ fd: Int32, _ path: String) throws(FileError) -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let result = chunk.withUnsafeMutableBytes { raw in retryingInterrupts { read(fd, raw.baseAddress!, raw.count) } }
            switch result {
            case .success(0): return bytes
            case .success(let count): bytes += chunk[0..<count]
            case .failure(let error): throw FileError.system(path, "cannot read the session store '\(path)'", errno: error.code)
            }
        }
    }

    /// The error for a damaged file: what is wrong, where, and what to do.
    private static func damaged(_ path: String, _ damage: Journal.Damage) -> FileError {
        let advice =
            "its sessions cannot be read. Restore the file from a backup, or move it away to start without sessions (their unacknowledged messages are then lost); the library never resets it by itself"
        switch damage {
        case .notAJournal:
            return FileError(path, "'\(path)' is not a session store's file (it does not begin with LANMSGSJ): move it away, or give the store another directory")
        case .otherVersion(let version):
            return FileError(
                path,
                "'\(path)' was written in session store format \(version); this library reads format \(Journal.version). Run the version of the library that wrote it, or give this one another directory")
        case .damagedHeader(let why):
            return FileError(path, "the session store '\(path)' is damaged: its header \(why); \(advice)")
        case .damagedRecord(let offset, let why):
            return FileError(path, "the session store '\(path)' is damaged at byte \(offset): a record \(why); \(advice)")
        }
    }

    // MARK: Writing

    /// Writes `records` at the end of the file, in order, with one system call. Returns the
    /// store's position after them (what ``whenSynced(_:_:)`` waits for).
    /// - Throws: ``FileError`` when the write failed (the disk is full, an I/O error) or the store
    ///   is closed: then nothing of `records` is in the file.
    @discardableResult
    func append(_ records: Journal.Record...) throws(FileError) -> UInt64 { try append(records) }

    @discardableResult
    func append(_ records: [Journal.Record]) throws(FileError) -> UInt64 {
        let (position, freed) = try state.withLock { (state) throws(FileError) -> (UInt64, Bool) in
            if let failure = state.failure { throw failure }
            guard !state.closed else { throw FileError(path, "the session store '\(path)' is closed") }
            state.buffer.removeAll(keepingCapacity: true)
            var spans: [(start: Int, length: Int)] = []
            spans.reserveCapacity(records.count)
            for record in records {
                let start = state.buffer.count
                record.encode(into: &state.buffer)
                spans.append((start, state.buffer.count - start))
            }
            if let code = Self.write(state.buffer, to: state.fd, at: state.size) {
                // Undo a partial write: the file ends with a complete record, as before.
                _ = ftruncate(state.fd, off_t(state.size))
                let advice = code == ENOSPC || code == EDQUOT
                    ? "the disk is full: free space on it; nothing of this was stored" : "nothing of this was stored"
                throw FileError.system(path, "cannot write to the session store '\(path)'", errno: code, advice: advice)
            }
            var freed = false
            for (record, span) in zip(records, spans) {
                freed = index(record, offset: state.size + span.start, length: span.length, in: &state) || freed
            }
            state.size += state.buffer.count
            state.written += UInt64(state.buffer.count)
            if state.size > state.compactAt { compact(&state) }
            return (state.written, freed)
        }
        if freed { wakeRoomWaiters() }
        return position
    }

    /// Writes all of `bytes` at `offset`: nil, or the errno of the call that failed.
    private static func write(_ bytes: [UInt8], to fd: Int32, at offset: Int) -> Int32? {
        var done = 0
        while done < bytes.count {
            let result = bytes.withUnsafeBytes { raw in
                retryingInterrupts { pwrite(fd, raw.baseAddress! + done, raw.count - done, off_t(offset + done)) }
            }
            switch result {
            case .success(0): return ENOSPC
            case .success(let count): done += count
            case .failure(let error): return error.code
            }
        }
        return nil
    }

    /// Updates the index for a record written at `offset`. Returns whether kept bytes were freed.
    private func index(_ record: Journal.Record, offset: Int, length: Int, in state: inout State) -> Bool {
        let key = record.key
        switch record {
        case .session(let snapshot):
            let old = state.sessions.updateValue(Live(snapshot: snapshot), forKey: key)
            state.liveBytes -= old?.bytes ?? 0
            return (old?.bytes ?? 0) > 0
        case .message(_, let number, _, _, _):
            guard state.sessions[key] != nil else { return false }
            state.sessions[key]!.messages.append((number, offset, length))
            state.sessions[key]!.bytes += length
            state.sessions[key]!.snapshot.nextNumber = number + 1
            state.liveBytes += length
            return false
        case .released(_, let through):
            guard state.sessions[key] != nil else { return false }
            state.sessions[key]!.snapshot.acknowledged = max(state.sessions[key]!.snapshot.acknowledged, through)
            let freed = state.sessions[key]!.release(through: through)
            state.liveBytes -= freed
            return freed > 0
        case .handled(_, let through):
            // The largest: handled counts are written after the session's lock, so two tasks
            // handling at once may write them out of order (a compaction must not go back).
            if let handled = state.sessions[key]?.snapshot.handled, through > handled {
                state.sessions[key]?.snapshot.handled = through
            }
            return false
        case .connected:
            state.sessions[key]?.snapshot.everConnected = true
            return false
        case .ended:
            let old = state.sessions.removeValue(forKey: key)
            state.liveBytes -= old?.bytes ?? 0
            return (old?.bytes ?? 0) > 0
        }
    }

    // MARK: Syncing (power-loss durability)

    /// Runs `done` once everything appended up to `position` is on the disk (with the error when
    /// a sync failed): at once when it is, else after the next sync, shared with everyone waiting.
    func whenSynced(_ position: UInt64, _ done: @escaping @Sendable (FileError?) -> Void) {
        enum Now {
            case ready(FileError?)
            case waiting(startSync: Bool)
        }
        let now = state.withLock { state -> Now in
            if let failure = state.failure { return .ready(failure) }
            if state.synced >= position || state.closed { return .ready(state.closed ? FileError(path, "the session store '\(path)' is closed") : nil) }
            state.syncWaiters.append((position, done))
            guard !state.syncing else { return .waiting(startSync: false) }
            state.syncing = true
            return .waiting(startSync: true)
        }
        switch now {
        case .ready(let error): done(error)
        case .waiting(true): startSync()
        case .waiting(false): break
        }
    }

    /// Waits until everything appended up to `position` is on the disk.
    func synced(_ position: UInt64) async throws(FileError) {
        let error = await withCheckedContinuation { (continuation: CheckedContinuation<FileError?, Never>) in
            whenSynced(position) { continuation.resume(returning: $0) }
        }
        if let error { throw error }
    }

    /// Syncs on the store's queue. The file and the position it covers are read there, in the
    /// block: a compaction that replaced the file closes the old one in a later block of the same
    /// queue, so the descriptor synced here is open (a descriptor read before the block was queued
    /// could be closed, or even reused, by then).
    private func startSync() {
        syncQueue.async { [self] in
            let (fd, position) = state.withLock { ($0.fd, $0.written) }
            let result = retryingInterrupts { fdatasync(fd) }
            var error: FileError?
            if case .failure(let failure) = result {
                error = FileError.system(
                    path, "cannot sync the session store '\(path)' to the disk", errno: failure.code,
                    advice: "what was written since the last sync may not survive a power loss; the store takes no more")
            }
            syncFinished(through: position, error: error)
        }
    }

    private func syncFinished(through position: UInt64, error: FileError?) {
        let (ready, next) = state.withLock { state -> ([(UInt64, @Sendable (FileError?) -> Void)], Bool) in
            if let error {
                // A failed fsync cannot be retried (the kernel may have dropped the pages): stop.
                if state.failure == nil { state.failure = error }
                defer { state.syncWaiters = [] }
                state.syncing = false
                return (state.syncWaiters, false)
            }
            state.synced = max(state.synced, position)
            state.syncs += 1
            let synced = state.synced
            let ready = state.syncWaiters.filter { $0.position <= synced }
            state.syncWaiters.removeAll { $0.position <= synced }
            guard !state.syncWaiters.isEmpty, !state.closed else {
                state.syncing = false
                return (ready, false)
            }
            return (ready, true)
        }
        if let error { logger.error("\(error.message)") }
        // The next sync starts before the callbacks run (they wake senders, which write more).
        if next { startSync() }
        for (_, done) in ready { done(error) }
    }

    // MARK: Room

    /// Whether `bytes` more of kept messages fit under ``SessionStore/maxBytes`` (one message
    /// always fits in an empty store).
    func hasRoom(for bytes: Int) -> Bool {
        state.withLock { $0.liveBytes == 0 || $0.liveBytes + bytes <= configuration.maxBytes }
    }

    /// Waits until acknowledgements free some room (or the store closes); the caller looks again.
    func waitForRoom(_ bytes: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.closed || state.liveBytes == 0 || state.liveBytes + bytes <= configuration.maxBytes { return true }
                state.roomWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    private func wakeRoomWaiters() {
        let waiters = state.withLock { state in
            defer { state.roomWaiters = [] }
            return state.roomWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Syncs done so far (the group commit's measure: senders waiting together share one).
    var syncCount: Int { state.withLock { $0.syncs } }

    /// Bytes of kept messages, and the file's length.
    var sizes: (live: Int, file: Int) { state.withLock { ($0.liveBytes, $0.size) } }

    // MARK: Compaction

    /// Rewrites the file with only what is live: each session's snapshot and its kept messages
    /// (their bytes copied as they are), into a new file that replaces the old one by a rename —
    /// synced first with power-loss durability. On failure the old file stays and grows on.
    private func compact(_ state: inout State) {
        let temporary = path + ".new"
        let fd = open(temporary, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            compactionFailed(&state, errno: errno)
            return
        }
        var out = header.encoded
        var moved: [Journal.Key: [Int]] = [:]
        var failure: Int32?
        var size = 0
        func flush() {
            guard failure == nil, !out.isEmpty else { return }
            failure = Self.write(out, to: fd, at: size)
            size += out.count
            out.removeAll(keepingCapacity: true)
        }
        for (key, live) in state.sessions {
            var snapshot = live.snapshot
            let kept = live.messages[live.head...]
            if let first = kept.first {
                snapshot.nextNumber = first.number
                snapshot.acknowledged = first.number - 1
            }
            Journal.Record.session(snapshot).encode(into: &out)
            var offsets: [Int] = []
            offsets.reserveCapacity(kept.count)
            for message in kept {
                offsets.append(size + out.count)
                let start = out.count
                out.append(contentsOf: repeatElement(0, count: message.length))
                let read = out.withUnsafeMutableBytes { raw in pread(state.fd, raw.baseAddress! + start, message.length, off_t(message.offset)) }
                if read != message.length {
                    failure = read < 0 ? errno : EIO
                    break
                }
                if out.count >= 1 << 20 { flush() }
            }
            moved[key] = offsets
            if failure != nil { break }
        }
        flush()
        if failure == nil, configuration.durability.syncs, fdatasync(fd) != 0 { failure = errno }
        if failure == nil, rename(temporary, path) != 0 { failure = errno }
        if let failure {
            closeDescriptor(fd)
            unlink(temporary)
            compactionFailed(&state, errno: failure)
            return
        }
        if configuration.durability.syncs { syncDirectory(of: path) }
        let old = state.fd
        syncQueue.async { closeDescriptor(old) }  // after a sync that may run on it
        state.fd = fd
        state.size = size
        for (key, offsets) in moved {
            guard let live = state.sessions[key] else { continue }
            var messages: [(number: UInt64, offset: Int, length: Int)] = []
            messages.reserveCapacity(offsets.count)
            for (message, offset) in zip(live.messages[live.head...], offsets) { messages.append((message.number, offset, message.length)) }
            state.sessions[key]!.messages = messages
            state.sessions[key]!.head = 0
        }
        state.compactAt = max(Self.minimumCompactionSize, 2 * size)
        if configuration.durability.syncs {
            // The new file is on the disk: everything written so far is.
            state.synced = state.written
        }
        logger.debug("session store compacted", metadata: ["bytes": "\(size)", "sessions": "\(state.sessions.count)"])
    }

    private func compactionFailed(_ state: inout State, errno code: Int32) {
        state.compactAt = state.size * 2
        logger.warning(
            "session store: cannot compact '\(path)' (\(String(cString: strerror(code)))); it keeps growing until the next attempt at \(state.compactAt) bytes")
    }

    // MARK: Closing

    /// Closes the file and releases the lock (another process may open the store then). Appends
    /// fail afterwards; waiters are released.
    func close() {
        let (fd, syncWaiters, roomWaiters) = state.withLock { state -> (Int32?, [(UInt64, @Sendable (FileError?) -> Void)], [CheckedContinuation<Void, Never>]) in
            guard !state.closed else { return (nil, [], []) }
            state.closed = true
            defer {
                state.syncWaiters = []
                state.roomWaiters = []
            }
            return (state.fd, state.syncWaiters, state.roomWaiters)
        }
        guard let fd else { return }
        let closedError = FileError(path, "the session store '\(path)' was closed")
        for (_, done) in syncWaiters { done(closedError) }
        for waiter in roomWaiters { waiter.resume() }
        syncQueue.sync {
            if configuration.durability.syncs { _ = fdatasync(fd) }
            closeDescriptor(fd)
        }
        flock(lockFD, LOCK_UN)
    }
}

/// `close(2)` (the journal's own `close()` hides the C function inside it).
private func closeDescriptor(_ fd: Int32) {
    _ = close(fd)
}
