// The session journal's room (what SessionStore.maxBytes bounds), its counters and a server's port kept beside it.
import Dispatch
import Foundation
import Locks
import Logging
import Synchronization

extension SessionJournal {
    // MARK: Room

    /// Whether `bytes` more of kept messages fit under ``SessionStore/maxBytes`` (one message
    /// always fits in an empty store).
    func hasRoom(for bytes: Int) -> Bool {
        let live = liveBytes.load(ordering: .relaxed)
        return live == 0 || live + bytes <= configuration.maxBytes
    }

    /// Waits until acknowledgements free some room (or the store closes); the caller looks again.
    func waitForRoom(_ bytes: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = shared.withLock { state -> Bool in
                if state.closed || hasRoom(for: bytes) { return true }
                state.roomWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    func wakeRoomWaiters() {
        let waiters = shared.withLock { state in
            defer { state.roomWaiters = [] }
            return state.roomWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Syncs done so far (the group commit's measure: senders waiting together share one).
    var syncCount: Int { shared.withLock { $0.syncs } }
    /// Compactions done so far.
    var compactionCount: Int { shared.withLock { $0.compactions } }

    /// Bytes of kept messages, and the file's length.
    var sizes: (live: Int, file: Int) { (liveBytes.load(ordering: .relaxed), shared.withLock { $0.fileEnd }) }

    // MARK: The server's port

    /// A server's port of its last run, kept beside the journal (`sessions.port`), if any.
    var previousPort: UInt16? {
        guard let text = try? String(contentsOfFile: portPath, encoding: .utf8) else { return nil }
        return UInt16(text.trimmingCharacters(in: .whitespacesAndNewlines)).flatMap { $0 == 0 ? nil : $0 }
    }

    /// Keeps a server's port for its next run (written atomically; a failure only costs that hint).
    func remember(port: UInt16) {
        guard previousPort != port else { return }
        do {
            try writeFileAtomically(portPath, "\(port)\n", what: "the session store's port file")
        } catch {
            logger.notice("session store: cannot keep the server's port for its next run: \(error.message)")
        }
    }

    private var portPath: String { (directory as NSString).appendingPathComponent("sessions.port") }
}
