import Foundation
import Locks
import Testing
@testable import Messaging
import ProtocolCore

#if canImport(Glibc)
    import Glibc
#endif

/// The files the library keeps for an app fail with ``FileError``: which file, what to do, and the
/// system's errno when a system call failed (as root, a file standing where a directory must be is
/// a failure permissions cannot wave through).
@Suite struct FileErrorTests {
    static func directory() -> String {
        let path = NSTemporaryDirectory() + "lanmsg-file-errors-\(UInt64.random(in: 0...UInt64.max))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    @Test("a trust store that cannot be written throws FileError naming the file, with the system's errno")
    func trustStoreWrite() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The store's file is a directory: the rename into place fails with EISDIR.
        let path = directory + "/known_peers"
        try FileManager.default.createDirectory(atPath: path + "/occupied", withIntermediateDirectories: true)
        let store = TrustStore(path: path)
        let error = #expect(throws: FileError.self) { try store.trust(Identity.ephemeral().fingerprint, name: "Projector") }
        #expect(error?.path == path)
        #expect(error?.errno == EISDIR)
        #expect(error?.message.contains("cannot write the trust store '\(path)'") == true)
        // Nothing was left behind: no temporary file beside it (the lock file stays, empty).
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).sorted() == ["known_peers", "known_peers.lock"])
    }

    /// Eight creators of one identity at once (issue 43, 5: two of 20 tries failed "is not a lanmsg
    /// identity … move it away", one having read another's half-written file): every one gets the
    /// same key, in every round, and no temporary file is left.
    @Test func identitiesCreatedAtOnceAreOneIdentity() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for round in 0..<300 {
            let path = directory + "/\(round)/identity"
            let results = Locked<[Result<String, FileError>]>([])
            DispatchQueue.concurrentPerform(iterations: 8) { _ in
                let result = Result { () throws(FileError) -> String in try Identity.loadOrCreate(at: path).fingerprint.full }
                results.withLock { $0.append(result) }
            }
            let keys = try results.withLock { $0 }.map { try $0.get() }
            #expect(Set(keys).count == 1, "round \(round): \(keys)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory + "/\(round)") == ["identity"])
        }
    }

    /// Two programs sharing a trust store (two values on one file stand for two processes: each has
    /// its own in-process lock) remember 25 peers each at once: all 100 are kept (a change read the
    /// list, and another's write in between was lost).
    @Test func aTrustStoreSharedByFourWritersLosesNoEntry() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/known_peers"
        let stores = (0..<4).map { _ in TrustStore(path: path) }
        let failures = Locked<[FileError]>([])
        DispatchQueue.concurrentPerform(iterations: 4) { writer in
            for peer in 0..<25 {
                do throws(FileError) { try stores[writer].trust(Identity.ephemeral().fingerprint, name: "peer \(writer)-\(peer)") } catch {
                    failures.withLock { $0.append(error) }
                }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty)
        #expect(TrustStore(path: path).entries.count == 100)
    }

    @Test("remembering a peer under a path whose directory is a file throws FileError for that directory")
    func peerMemoryDirectory() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "a file\n".write(toFile: directory + "/data", atomically: false, encoding: .utf8)
        let memory = PeerMemory(path: directory + "/data/lanmsg/known_addresses")
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: 4000)
        let error = #expect(throws: FileError.self) {
            try memory.remember(
                type: "_test._tcp", name: "Test", fingerprint: Identity.ephemeral().fingerprint, used: address, others: [])
        }
        #expect(error?.path == directory + "/data/lanmsg")
        #expect(error?.message.contains("cannot create the directory") == true)
    }

    @Test("a key file that is missing, or too short, throws FileError naming it")
    func keyFile() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let missing = #expect(throws: FileError.self) { try PreSharedKey(contentsOfFile: directory + "/none") }
        #expect(missing?.path == directory + "/none" && missing?.errno == ENOENT)
        try "short\n".write(toFile: directory + "/short", atomically: false, encoding: .utf8)
        let short = #expect(throws: FileError.self) { try PreSharedKey(contentsOfFile: directory + "/short") }
        #expect(short?.path == directory + "/short" && short?.errno == nil)
        #expect(short?.message.contains("at least 16 bytes") == true)
    }

    @Test("an identity whose directory cannot be made throws FileError naming that directory")
    func identityCreate() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "a file\n".write(toFile: directory + "/file", atomically: false, encoding: .utf8)
        let path = directory + "/file/identity"
        let error = #expect(throws: FileError.self) { try Identity.loadOrCreate(at: path) }
        #expect(error?.path == directory + "/file")
    }
}
