import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif
@testable import Messaging

/// The journal's file on a real disk writes records inside the room written ahead of them as copies
/// into a shared mapping (no `pwrite` per batch), and every other write as before.
@Suite struct MappedJournalFileTests {
    /// Whether `/proc/self/maps` lists `path` (read to its end: Foundation's `String(contentsOfFile:)`
    /// stops after its first 4 KiB, the size a read of it returns at once).
    static func mapped(_ path: String) -> Bool {
        let fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while bytes.count < 64 << 20 {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
            if count <= 0 { break }
            bytes += chunk[..<count]
        }
        return String(decoding: bytes, as: UTF8.self).contains(path)
    }

    @Test func writesInsideTheRoomAreCopiesOthersAreWritesAndACutOrCloseUnmaps() throws {
        let directory = FileErrorTests.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/sessions.journal"
        let fileSystem = PosixFileSystem()
        let file = try fileSystem.create(path)
        try file.write([UInt8](repeating: 0, count: 65_536), at: 0)
        file.writesWillStayWithin(100, 65_536)
        #expect(Self.mapped(path), "the room is mapped")
        // Inside the room: read back through another descriptor (the same page cache).
        try file.write(Array("record one".utf8), at: 100)
        let other = try #require(try fileSystem.open(path))
        #expect(try other.read(at: 100, count: 10) == Array("record one".utf8))
        #expect(try file.size() == 65_536, "a copy does not grow the file")
        // Across the room's end: written as before, the file grows.
        try file.write(Array("0123456789".utf8), at: 65_530)
        #expect(try other.read(at: 65_530, count: 10) == Array("0123456789".utf8))
        #expect(try file.size() == 65_540)
        try file.sync()
        // A cut unmaps (a page past the end would fault); writes go on.
        try file.truncate(to: 200)
        #expect(!Self.mapped(path))
        try file.write(Array("after".utf8), at: 150)
        #expect(try other.read(at: 100, count: 100).count == 100)
        #expect(try other.read(at: 150, count: 5) == Array("after".utf8))
        file.writesWillStayWithin(0, 200)
        #expect(Self.mapped(path))
        file.close()
        #expect(!Self.mapped(path), "closing unmaps")
        other.close()
    }
}
