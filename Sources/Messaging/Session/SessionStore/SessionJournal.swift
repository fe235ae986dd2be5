import Dispatch
import Foundation
import Locks
import Logging
import Scheduling
import Synchronization

/// A ``SessionStore`` open in this process: one append-only file of ``Journal`` records in its
/// directory, held with a lock so that no other process uses it, and written by **one writer**.
///
/// - Sessions hand their records over with ``enqueue(_:chain:done:)`` while they hold their own
///   lock (that fixes the order; no lock is taken and no system call made there), and call
///   ``write()`` once they released it: whoever finds nobody writing writes everything queued, in
///   order, with one `pwrite` (``JournalWriter``), and runs each batch's completion after it. A
///   batch is in the operating system when its completion runs (it survives a crash of the
///   process).
/// - ``whenSynced(_:_:)`` runs its callback once the records up to a position are on the disk
///   (`fdatasync` on the store's queue, grouped: one sync serves every caller waiting). With
///   ``SessionStore/Durability/processCrash`` a sync still runs in the background about once a
///   second after writes (so a power loss takes at most about the last second), and every record
///   says how far the file was synced when it was written: recovery tells bytes that never reached
///   the disk whole (cut) from damage (refused) by it (``Journal/scan(_:)``).
/// - When the records of what is no longer kept outweigh the rest, the file is compacted in the
///   background (``JournalCompaction``): the live sessions and their kept messages are copied into
///   a new file, what was written meanwhile is copied after them, the new file is synced and
///   renamed over the old one, and the directory synced — never on a connection's loop, and the
///   writer waits only for the last few records and one sync.
final class SessionJournal: Sendable {
    static let fileName = "sessions.journal"
    static let lockName = "sessions.lock"

    let directory: String
    let path: String
    let configuration: SessionStore
    let logger: Logger
    let fileSystem: any StoreFileSystem
    /// What the store held when it was opened: the sessions this process continues.
    let restored: [Journal.Key: Journal.Restored]
    /// The order their sessions began in the file (the newest last).
    let restoredOrder: [Journal.Key]
    /// Reports of undelivered messages an earlier process made and its app never took (it died
    /// first): the server or client that opened the store makes them again, first.
    let pendingReports: [Journal.Report]
    /// What opening found and did.
    let opening: Opening

    /// What opening a store found and did about it.
    struct Opening: Sendable, Equatable {
        /// Bytes cut from the end: what a crash left past the last sync (0: none).
        var cutBytes = 0
        /// Where they began.
        var cutAt = 0
        /// Complete records among them, behind bytes that never arrived whole (cut with them).
        var droppedRecords = 0
        /// The file was in an older format version (1, 2 or 3) and was rewritten in ``Journal/version``.
        var migrated = false
        /// The last process wrote in another boot of the machine with process-crash durability
        /// and did not close the store: its boot id (its last records may be lost).
        var lostBoot: String?
        /// Sessions that start anew with their peers at their next connection: their records may
        /// be lost (in the boot above, or one an earlier opening found).
        var mayHaveLost = 0
    }

    let storeLock: any StoreLockHandle
    /// This boot of the machine (written in the lock file with the durability).
    let boot: String?
    /// The store was closed with everything synced (the lock file says so then).
    let closedSynced = Atomic<Bool>(false)
    let queue = JournalQueue()
    /// Held by the one caller writing now (``write()``): the writer's state is its alone.
    let writing = Atomic<Bool>(false)
    let writer: JournalWriter
    /// A compaction's copy is done: the writer finishes it (``finishCompaction()``).
    let compactionReady = Atomic<Bool>(false)
    let shared: Locked<Shared>
    /// Syncs and directory syncs after a compaction: one after another.
    let syncQueue = DispatchQueue(label: "lanmsg.session-store.sync")
    /// The closing of files a compaction replaced, after the directory sync: a file of hundreds of
    /// MiB renamed over is freed by its close, which can take tens of milliseconds — never in
    /// the way of a sync a sender waits for.
    let closeQueue = DispatchQueue(label: "lanmsg.session-store.close")
    /// The copying of a compaction, beside everything else.
    let compactionQueue = DispatchQueue(label: "lanmsg.session-store.compaction", qos: .utility)
    /// Bytes of kept messages (what ``SessionStore/maxBytes`` bounds).
    let liveBytes = Atomic<Int>(0)
    /// The clock of the background sync of process-crash durability (the server's or the client's;
    /// tests: a `ManualScheduler`).
    let scheduler: any Scheduler

    /// What the writer, the syncs and the callers share (under the lock; never held across a
    /// system call).
    struct Shared {
        /// The file the records go to now, and its generation (a compaction makes the next).
        var file: any StoreFile
        var generation = 0
        /// Bytes appended since the store was opened (a position compaction does not move).
        var written: UInt64 = 0
        /// The end of the current file, where ``written`` is.
        var fileEnd: Int
        /// Of ``written``, what is known to be on the disk.
        var synced: UInt64 = 0
        /// The current file is on the disk up to here (what records say they know of).
        var frontier: Int
        var syncing = false
        var syncs = 0
        /// Compactions done (the tests' measure).
        var compactions = 0
        var syncWaiters: [(position: UInt64, done: @Sendable (FileError?) -> Void)] = []
        var roomWaiters: [CheckedContinuation<Void, Never>] = []
        /// A sync failed: the store takes no more (a failed fsync cannot be retried).
        var failure: FileError?
        /// ``fail(_:)``: the store takes no new records (what was written still syncs).
        var refused: FileError?
        var closed = false
        /// A compaction renamed its file into place: the directory must be synced before anything
        /// written since counts as on the disk.
        var directorySyncPending = false
        /// The background sync is armed, and its timer (nil for the instant between the two).
        var backgroundSyncArmed = false
        var backgroundSyncTimer: ScheduledWork?
    }

    /// Opens (or creates) the store in `configuration.directory` for `role`, as `identity`.
    /// - Throws: ``FileError`` naming the file, what is wrong and what to do: the directory cannot
    ///   be made, another process holds the store, or its file is damaged, of another format
    ///   version, another role or another identity. Bytes a crash left past the last sync (zeros,
    ///   a torn record) are no error: they are cut, with a notice, and every record before kept.
    /// - Parameter compactionFloor: Tests only: compact past this size instead of
    ///   ``compactionFloor(_:)``'s.
    init(
        _ configuration: SessionStore, role: Journal.Role, identity: String, logger: Logger,
        fileSystem: any StoreFileSystem = PosixFileSystem(), compactionFloor: Int? = nil,
        scheduler: any Scheduler = DispatchScheduler()
    ) throws(FileError) {
        self.configuration = configuration
        self.scheduler = scheduler
        self.logger = logger
        self.fileSystem = fileSystem
        directory = configuration.directory
        path = (directory as NSString).appendingPathComponent(Self.fileName)
        do {
            try fileSystem.makeDirectories(directory)
        } catch {
            throw FileError.system(directory, "cannot create the session store's directory '\(directory)'", errno: error.code)
        }
        let (lock, previousHolder) = try fileSystem.lock(directory, name: Self.lockName)
        storeLock = lock
        boot = configuration.boot ?? SessionStore.machineBoot()
        do throws(FileError) {
            let opened = try Self.openFile(path, role: role, identity: identity, fileSystem: fileSystem, logger: logger)
            var opening = opened.opening
            var sessions = opened.restored
            opening.lostBoot = Self.lostBoot(previous: previousHolder, current: boot)
            opening.mayHaveLost = try Self.settleSuspects(
                &sessions, lostBoot: opening.lostBoot != nil, directory: directory, fileSystem: fileSystem)
            // Only now, the suspects on the disk, does the lock file say this boot.
            _ = lock.rewrite(Self.holder(boot: boot, syncs: configuration.durability.syncs, closed: false))
            if let lost = opening.lostBoot, !sessions.isEmpty {
                logger.notice(
                    "session store: '\(path)' was last written with process-crash durability in another boot of this machine (\(lost.prefix(8))…) by a process that did not close it: the records of its last second or so may have been lost with the power. Its \(sessions.count) sessions start anew with their peers when they connect again (a new position id; what they had sent and not had acknowledged is reported undelivered), never going on with numbers the peer may have seen")
            }
            restored = sessions
            restoredOrder = opened.order
            pendingReports = opened.writer.reports
            var state = opened.writer
            if opened.header.version < Journal.version {
                // Rewritten in this version at once: records of version 1 say nothing of syncs or
                // epochs; a file of version 2 must not be appended to in version 3's order (a
                // version-2 reader would drop the messages an epoch change carries over), nor one of
                // version 3 with reports in it (a version-3 reader would call them damage).
                state = try JournalCompaction.rewrite(
                    path: path, restored: opened.restored, order: opened.order, reports: opened.writer.reports, role: role,
                    identity: identity,
                    old: state.file, fileSystem: fileSystem)
                opening.migrated = true
                logger.notice(
                    "session store: '\(path)' was in format version \(opened.header.version); rewritten as version \(Journal.version)")
            }
            self.opening = opening
            writer = JournalWriter(
                state: state, floor: compactionFloor ?? Self.compactionFloor(fileSystem.freeSpace(at: directory)),
                fixed: compactionFloor != nil)
            liveBytes.store(state.liveBytes, ordering: .relaxed)
            shared = Locked(Shared(file: state.file, fileEnd: state.size, frontier: state.size))
        } catch {
            storeLock.unlock()
            throw error
        }
        makeReserve()
    }

    deinit {
        shared.withLock { $0.backgroundSyncTimer }?.cancel()
        if !writer.filesClosed { writer.state.file.close() }
        storeLock.unlock()
    }

    /// Compaction waits for the file to pass this size at least: a quarter of the disk's free
    /// space, between 4 KiB and 8 MiB — a store on a small disk compacts long before it is full
    /// (the copy needs room too), a busy one on a large disk does not rewrite its file many times a
    /// second. Read again after every compaction.
    static func compactionFloor(_ free: Int?) -> Int {
        min(8 << 20, max(4 << 10, (free ?? Int.max) / 4))
    }

    // MARK: Opening

    /// What ``openFile(_:role:identity:fileSystem:logger:)`` read.
    private struct Opened {
        var header: Journal.Header
        var writer: JournalWriter.State
        var restored: [Journal.Key: Journal.Restored]
        var order: [Journal.Key]
        var opening: Opening
    }

    /// Opens the file, creating it when there is none; reads it, checks its header, cuts what a
    /// crash left past the last sync, and syncs it (what is read must be on the disk before
    /// anything builds on it: a crash of the process leaves written records in the page cache only).
    private static func openFile(
        _ path: String, role: Journal.Role, identity: String, fileSystem: any StoreFileSystem, logger: Logger
    ) throws(FileError) -> Opened {
        func failed(_ what: String, _ error: StoreCallError, advice: String? = nil) -> FileError {
            FileError.system(path, "\(what) the session store '\(path)'", errno: error.code, advice: advice)
        }
        let file: any StoreFile
        do throws(StoreCallError) {
            // A file left by a compaction or a creation that a crash interrupted: the old file (or
            // none) still stands; the unfinished one is thrown away.
            try fileSystem.remove(path + ".new")
            if let existing = try fileSystem.open(path) {
                file = existing
            } else {
                try create(path, header: .fresh(role: role, identity: identity), fileSystem: fileSystem)
                guard let created = try fileSystem.open(path) else { throw StoreCallError("open", path, ENOENT) }
                file = created
            }
        } catch {
            throw failed("cannot open", error, advice: "check its permissions")
        }
        do throws(FileError) {
            let bytes: [UInt8]
            do throws(StoreCallError) {
                bytes = try file.read(at: 0, count: try file.size())
            } catch {
                throw failed("cannot read", error)
            }
            let scan: Journal.Scan
            switch bytes.withUnsafeBytes({ Journal.scan($0) }) {
            case .success(let result): scan = result
            case .failure(let damage): throw damaged(path, damage)
            }
            guard scan.header.role == role else {
                throw FileError(
                    path,
                    "the session store '\(path)' holds \(scan.header.role) sessions and this is a \(role == .server ? "server" : "client"): give each its own directory")
            }
            guard scan.header.identity == identity else {
                throw FileError(
                    path,
                    "the session store '\(path)' holds the sessions of identity \(scan.header.identity) and this process runs as \(identity): its sessions belong to that key. Use the identity that made them, or give this one another directory")
            }
            let sessions: [Journal.Key: Journal.Restored]
            switch Journal.replay(scan.records) {
            case .success(let replayed): sessions = replayed
            case .failure(let damage): throw damaged(path, damage)
            }
            var opening = Opening()
            do throws(StoreCallError) {
                if scan.torn > 0 {
                    try file.truncate(to: scan.end)
                    opening = Opening(cutBytes: scan.torn, cutAt: scan.end, droppedRecords: scan.droppedRecords)
                }
                try file.sync()
            } catch {
                throw failed("cannot cut and sync", error)
            }
            if scan.torn > 0, scan.droppedRecords == 0, Self.allZeros(bytes[scan.end...]) {
                logger.notice(
                    "session store: cut \(scan.torn) bytes at byte \(scan.end) of '\(path)', all zeros: the room the store writes ahead of its records (left by a process that stopped without closing the store), or a tail the disk zero-filled after a power loss; every record before it is kept. A session whose last records were lost with a power cut starts anew if its peer's count does not match, and what it had not acknowledged is reported")
            } else if scan.torn > 0 {
                let dropped = scan.droppedRecords == 0 ? "" : " (with \(scan.droppedRecords) complete records behind bytes that never arrived)"
                logger.notice(
                    "session store: cut \(scan.torn) bytes at byte \(scan.end) of '\(path)'\(dropped): what was written after the last sync and did not reach the disk whole (a crash or a power loss); every record before it is kept. A session whose last records were among them starts anew if its peer's count does not match, and what it had not acknowledged is reported")
            }
            var order: [(Int, Journal.Key)] = []
            for (record, offset, _) in scan.records { if case .session(let snapshot) = record { order.append((offset, snapshot.key)) } }
            var latest: [Journal.Key: Int] = [:]
            for (offset, key) in order { latest[key] = offset }
            let keys = sessions.keys.sorted { latest[$0, default: 0] < latest[$1, default: 0] }
            let state = JournalWriter.State(
                file: file, header: scan.header, size: scan.end, sessions: sessions, reports: Journal.reports(scan.records))
            return Opened(header: scan.header, writer: state, restored: sessions, order: keys, opening: opening)
        } catch {
            file.close()
            throw error
        }
    }

    /// Creates the file with its header, whole or not at all (written beside it, synced, renamed,
    /// the directory synced).
    static func create(_ path: String, header: Journal.Header, fileSystem: any StoreFileSystem) throws(StoreCallError) {
        let temporary = path + ".new"
        let file = try fileSystem.create(temporary)
        do {
            try file.write(header.encoded, at: 0)
            try file.sync()
            file.close()
            try fileSystem.rename(temporary, to: path)
        } catch {
            file.close()
            try? fileSystem.remove(temporary)
            throw error
        }
        try fileSystem.syncDirectory(of: path)
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
                "'\(path)' was written in session store format \(version); this library reads formats 1 to \(Journal.version). Run the version of the library that wrote it, or give this one another directory")
        case .damagedHeader(let why):
            return FileError(path, "the session store '\(path)' is damaged: its header \(why); \(advice)")
        case .damagedRecord(let offset, let why):
            return FileError(path, "the session store '\(path)' is damaged at byte \(offset): a record \(why); \(advice)")
        }
    }

    // MARK: Syncing

    /// Runs `done` once everything appended up to `position` is on the disk (with the error when
    /// a sync failed): at once when it is, else after the next sync, shared with everyone waiting.
    func whenSynced(_ position: UInt64, _ done: @escaping @Sendable (FileError?) -> Void) {
        enum Now {
            case ready(FileError?)
            case waiting(startSync: Bool)
        }
        let now = shared.withLock { state -> Now in
            if let failure = state.failure { return .ready(failure) }
            if state.closed { return .ready(FileError(path, "the session store '\(path)' is closed")) }
            if state.synced >= position { return .ready(nil) }
            state.syncWaiters.append((position, done))
            guard !state.syncing else { return .waiting(startSync: false) }
            state.syncing = true
            return .waiting(startSync: true)
        }
        switch now {
        case .ready(let error): done(error)
        case .waiting(true): syncQueue.async { [self] in runSync() }
        case .waiting(false): break
        }
    }

    /// Whether every byte of `bytes` is zero — compared a page at a time (`memcmp`): the room a
    /// store writes ahead of its records can be megabytes, and a byte at a time was most of a
    /// debug build's opening (the session simulation opens stores thousands of times).
    static func allZeros(_ bytes: ArraySlice<UInt8>) -> Bool {
        let zeros = [UInt8](repeating: 0, count: 4096)
        return bytes.withUnsafeBytes { raw in
            zeros.withUnsafeBytes { zero in
                guard let base = raw.baseAddress, let page = zero.baseAddress else { return true }
                var offset = 0
                while offset < raw.count {
                    let count = min(zero.count, raw.count - offset)
                    if memcmp(base + offset, page, count) != 0 { return false }
                    offset += count
                }
                return true
            }
        }
    }

    /// Why the store takes no more records (a failed sync, or ``fail(_:)``), if it does not.
    var failure: FileError? { shared.withLock { $0.failure ?? $0.refused } }

    /// The store takes no new records from now on, for `error` (logged once): a session could
    /// not keep what it began, and its state in memory is ahead of the store's — only a restart
    /// of the process, from what the store holds, continues its sessions. What was written before
    /// still syncs (other sessions' senders are not failed for records the file holds).
    func fail(_ error: FileError) {
        let first = shared.withLock { state -> Bool in
            guard state.failure == nil, state.refused == nil else { return false }
            state.refused = error
            return true
        }
        if first {
            logger.error("\(error.message); the session store takes no more records: restart the process once the disk is mended")
        }
    }

    /// Waits until everything appended up to `position` is on the disk.
    func synced(_ position: UInt64) async throws(FileError) {
        let error = await withCheckedContinuation { (continuation: CheckedContinuation<FileError?, Never>) in
            whenSynced(position) { continuation.resume(returning: $0) }
        }
        if let error { throw error }
    }

    /// One sync, on the store's queue: the directory first when a compaction renamed a file into
    /// place, then the current file. The file and what it covers are read here, in the block: a
    /// compaction closes a replaced file in a later block of the same queue, so the file synced
    /// here is open.
    private func runSync() {
        let (file, generation, position, end, directory, closed) = shared.withLock {
            ($0.file, $0.generation, $0.written, $0.fileEnd, $0.directorySyncPending, $0.closed)
        }
        var error: FileError?
        if closed {
            // The file is closed (or is being closed by the writer, synced): no call on it.
            syncFinished(through: 0, generation: generation, end: end, directory: false, error: nil)
            return
        }
        do throws(StoreCallError) {
            if directory { try fileSystem.syncDirectory(of: path) }
            try file.sync()
        } catch let failure {
            error = FileError.system(
                path, "cannot sync the session store '\(path)' to the disk", errno: failure.code,
                advice: "what was written since the last sync may not survive a power loss; the store takes no more")
        }
        syncFinished(through: position, generation: generation, end: end, directory: directory, error: error)
    }

    private func syncFinished(through position: UInt64, generation: Int, end: Int, directory: Bool, error: FileError?) {
        let (ready, next) = shared.withLock { state -> ([(UInt64, @Sendable (FileError?) -> Void)], Bool) in
            if let error {
                // A failed fsync cannot be retried (the kernel may have dropped the pages): stop.
                if state.failure == nil { state.failure = error }
                defer { state.syncWaiters = [] }
                state.syncing = false
                return (state.syncWaiters, false)
            }
            if directory && state.generation == generation { state.directorySyncPending = false }
            state.synced = max(state.synced, position)
            if state.generation == generation { state.frontier = max(state.frontier, end) }
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
        if next { syncQueue.async { [self] in runSync() } }
        for (_, done) in ready { done(error) }
    }

    /// Process-crash durability: arms the background sync (about a second after a write) unless it
    /// is armed.
    func armBackgroundSync() {
        guard !configuration.durability.syncs else { return }
        let arm = shared.withLock { state -> Bool in
            guard !state.backgroundSyncArmed, !state.closed else { return false }
            state.backgroundSyncArmed = true
            return true
        }
        guard arm else { return }
        let timer = scheduler.schedule(after: .seconds(1), on: syncQueue) { [weak self] in self?.runBackgroundSync() }
        // Closed meanwhile: the timer is not needed. (Run already: cancelling it does nothing.)
        let kept = shared.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.backgroundSyncTimer = timer
            return true
        }
        if !kept { timer.cancel() }
    }

    private func runBackgroundSync() {
        let due = shared.withLock { state -> Bool in
            state.backgroundSyncArmed = false
            state.backgroundSyncTimer = nil
            guard !state.syncing, !state.closed, state.failure == nil, state.synced < state.written else { return false }
            state.syncing = true
            return true
        }
        if due { runSync() }
    }
}
