import Foundation

/// What a power loss may have taken from a store written with process-crash durability, and
/// how the store remembers it until the sessions concerned have started anew.
///
/// A crash of the process loses nothing it wrote (the page cache keeps it, and the next opening
/// syncs it); a power loss may take the records written since the last sync, cut at a record
/// boundary, where nothing in the file shows it. When both sides of a session lose the same tail,
/// their stores agree on an earlier point and the session would go on with numbers the receiving
/// app already saw. So the lock file says which boot of the machine wrote last, with which
/// durability, and whether the store was closed (synced): a store written with process-crash
/// durability in another boot, and not closed, may have lost records, and all its sessions start
/// anew with their peers (a new position id). Those sessions are listed in `sessions.suspect`
/// (id and epoch, synced before the lock file says the new boot) until each has started anew: a
/// crash before then leaves the next opener the same judgement.
extension SessionJournal {
    static let suspectName = "sessions.suspect"

    /// The lock file's words: the pid, then `boot <id> <process-crash|power-loss>[ closed]`.
    static func holder(boot: String?, syncs: Bool, closed: Bool) -> [UInt8] {
        var text = "\(getpid())\n"
        if let boot { text += "boot \(boot) \(syncs ? "power-loss" : "process-crash")\(closed ? " closed" : "")\n" }
        return Array(text.utf8)
    }

    /// The boot in which the last holder wrote, when its records may have been lost since: it
    /// wrote with process-crash durability, did not close the store, and the machine booted again
    /// since. Nil otherwise: the same boot (its writes are in the page cache, and the opening syncs
    /// them), a closed store or power-loss durability (on the disk), no boot line (a store of an
    /// earlier version of the library, a new one) or no boot known now.
    static func lostBoot(previous: [UInt8], current: String?) -> String? {
        guard let current else { return nil }
        for line in String(decoding: previous, as: UTF8.self).split(separator: "\n") {
            let words = line.split(separator: " ")
            guard words.count >= 3, words[0] == "boot" else { continue }
            let closed = words.count >= 4 && words[3] == "closed"
            return words[1] != current && words[2] == "process-crash" && !closed ? String(words[1]) : nil
        }
        return nil
    }

    /// Marks the sessions that may have lost records — all of them after `lostBoot`, and those an
    /// earlier opening marked that have not started anew since (the same epoch) — and keeps their
    /// list in `sessions.suspect`, synced (removed when there is none). Returns how many.
    static func settleSuspects(
        _ sessions: inout [Journal.Key: Journal.Restored], lostBoot: Bool, directory: String, fileSystem: any StoreFileSystem
    ) throws(FileError) -> Int {
        let path = (directory as NSString).appendingPathComponent(suspectName)
        func failed(_ what: String, _ error: StoreCallError) -> FileError {
            FileError.system(path, "cannot \(what) the session store's list of sessions to start anew '\(path)'", errno: error.code)
        }
        var listed: [Journal.Key: UInt32] = [:]
        do throws(StoreCallError) {
            try fileSystem.remove(path + ".new")
            if let file = try fileSystem.open(path) {
                defer { file.close() }
                let bytes = try file.read(at: 0, count: try file.size())
                for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
                    let words = line.split(separator: " ")
                    if words.count == 2, let key = Journal.Key(hex: String(words[0])), let epoch = UInt32(words[1]) { listed[key] = epoch }
                }
            }
        } catch {
            throw failed("read", error)
        }
        var suspects: [(Journal.Key, UInt32)] = []
        for key in sessions.keys {
            let epoch = sessions[key]!.snapshot.epoch
            guard lostBoot || listed[key] == epoch else { continue }
            sessions[key]!.mayHaveLost = true
            suspects.append((key, epoch))
        }
        do throws(StoreCallError) {
            if suspects.isEmpty {
                if !listed.isEmpty { try fileSystem.remove(path) }
                return 0
            }
            let text = suspects.map { "\($0.0.hex) \($0.1)\n" }.joined()
            let file = try fileSystem.create(path + ".new")
            do throws(StoreCallError) {
                try file.write(Array(text.utf8), at: 0)
                try file.sync()
                file.close()
            } catch {
                file.close()
                throw error
            }
            try fileSystem.rename(path + ".new", to: path)
            try fileSystem.syncDirectory(of: path)
        } catch {
            throw failed("write", error)
        }
        return suspects.count
    }
}
