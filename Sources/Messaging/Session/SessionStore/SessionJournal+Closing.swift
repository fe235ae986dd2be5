import Dispatch
import Foundation
import Locks
import Logging
import Synchronization

// The journal's end: a clean close (synced, the room ahead cut, the lock's holder line rewritten)
// and the writer's part of it.
extension SessionJournal {
    /// Closes the file (synced first: a clean stop leaves everything on the disk) and releases the
    /// lock (another process may open the store then). Appends fail afterwards; waiters are
    /// released. The file is closed by the writer (``closeFiles()``): whoever holds the writing
    /// role now, or this caller, after a write in progress and a compaction's copy.
    func close() {
        let (syncWaiters, roomWaiters, first) = shared.withLock {
            state -> ([(UInt64, @Sendable (FileError?) -> Void)], [CheckedContinuation<Void, Never>], Bool) in
            guard !state.closed else { return ([], [], false) }
            state.closed = true
            defer {
                state.syncWaiters = []
                state.roomWaiters = []
            }
            return (state.syncWaiters, state.roomWaiters, true)
        }
        guard first else { return }
        let closedError = FileError(path, "the session store '\(path)' was closed")
        for (_, done) in syncWaiters { done(closedError) }
        for waiter in roomWaiters { waiter.resume() }
        shared.withLock { $0.backgroundSyncTimer }?.cancel()
        // An empty batch: its drain sees the store closed and closes the file first.
        let filesClosed = DispatchSemaphore(value: 0)
        enqueue([]) { _ in filesClosed.signal() }
        write()
        filesClosed.wait()
        if closedSynced.load(ordering: .acquiring) {
            // Everything is on the disk: the next opener trusts it in whatever boot.
            _ = storeLock.rewrite(Self.holder(boot: boot, syncs: configuration.durability.syncs, closed: true))
        }
        storeLock.unlock()
    }

    /// Holding the writing role, the store closed: abandons a compaction (after its copy), syncs
    /// the file and closes it — once.
    func closeFiles() {
        guard !writer.filesClosed else { return }
        writer.filesClosed = true
        if let job = writer.compaction {
            job.waitUntilCopied()
            job.abandon()
            writer.compaction = nil
        }
        let file = writer.state.file
        // The room written ahead of the records goes: a store closed cleanly ends with its last record.
        if writer.state.allocated > writer.state.size {
            do {
                try file.truncate(to: writer.state.size)
                writer.state.allocated = writer.state.size
            } catch {
                logger.warning("session store: cannot cut the room ahead of the records of '\(path)' while closing it: \(error); the next start cuts it")
            }
        }
        syncQueue.sync {
            do {
                try file.sync()
                closedSynced.store(shared.withLock { $0.failure == nil }, ordering: .releasing)
            } catch {
                logger.warning("session store: cannot sync '\(path)' while closing it: \(error)")
            }
            file.close()
        }
        closeQueue.sync {}
    }

    /// Waits until the files compactions replaced are closed (their room back on the disk).
    func replacedFilesClosed() {
        syncQueue.sync {}
        closeQueue.sync {}
    }
}
