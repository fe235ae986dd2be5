import Foundation
import Testing

@testable import Messaging

/// The one store behind ``TrustStore`` and ``PeerMemory``: a file of one entry per line, changed in
/// one locked read–edit–write step and read without a lock (a rename replaces it whole).
@Suite struct LineFileTests {
    static func path(_ name: String) -> String {
        let directory = NSTemporaryDirectory() + "line-file-\(UUID().uuidString.prefix(8))"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return directory + "/" + name
    }

    /// 32 peers trusted at once from 32 tasks: every one is in the file (two changes made at once
    /// without the file's lock would each read the old list, and one entry would be lost).
    @Test func changesMadeAtOnceLoseNothing() async throws {
        let store = TrustStore(path: Self.path("known_peers"))
        let keys = (0..<32).map { _ in Identity.ephemeral().fingerprint }
        await withTaskGroup(of: Void.self) { group in
            for (index, key) in keys.enumerated() {
                group.addTask { try? store.trust(key, name: "peer-\(index)") }
            }
        }
        let entries = store.entries
        #expect(entries.count == 32)
        for (index, key) in keys.enumerated() { #expect(store.fingerprint(for: "peer-\(index)") == key) }
    }

    /// Comment lines and lines that do not parse are skipped; a change that changes nothing writes
    /// nothing (the file keeps the lines it had).
    @Test func unreadableLinesAreSkippedAndANoOpWritesNothing() throws {
        let path = Self.path("known_peers")
        let key = Identity.ephemeral().fingerprint
        let text = "# a comment\nnot-a-fingerprint someone\n\(key.full) alice\n"
        try text.write(toFile: path, atomically: false, encoding: .utf8)
        let store = TrustStore(path: path)
        #expect(store.entries.map(\.name) == ["alice"])
        #expect(try !store.forget(name: "bob"))  // nothing to forget: no write
        #expect(try String(contentsOfFile: path, encoding: .utf8) == text)
        #expect(try store.forget(name: "alice"))
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "# lanmsg known peers: <fingerprint> <name>\n")
    }
}
