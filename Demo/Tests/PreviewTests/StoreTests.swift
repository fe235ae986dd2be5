import Foundation
import Logging
import PreviewKit
import Testing

/// A fresh directory under /tmp, removed by `remove()`.
struct TempDirectory {
    let path: String

    init() throws {
        var template = Array("/tmp/preview-tests-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw TestError("mkdtemp failed") }
        path = String(cString: made)
    }

    var entries: [String] { ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted() }

    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        let file = path + "/" + name
        guard FileManager.default.createFile(atPath: file, contents: Data(bytes)) else {
            throw TestError("cannot write \(file)")
        }
        return file
    }

    func read(_ name: String) -> [UInt8]? {
        FileManager.default.contents(atPath: path + "/" + name).map { [UInt8]($0) }
    }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

struct TestError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Deterministic pseudo-random bytes.
func pattern(_ count: Int, seed: UInt64 = 1) -> [UInt8] {
    var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
    return (0..<count).map { _ in
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return UInt8(truncatingIfNeeded: state)
    }
}

/// `bytes` as chunks of `size`, optionally failing after `failAfter` chunks.
func chunks(_ bytes: [UInt8], size: Int = 1000, failAfter: Int? = nil) -> AsyncThrowingStream<[UInt8], any Error> {
    AsyncThrowingStream { continuation in
        var index = 0
        var offset = 0
        while offset < bytes.count {
            if let failAfter, index == failAfter {
                continuation.finish(throwing: TestError("connection lost"))
                return
            }
            continuation.yield(Array(bytes[offset..<min(offset + size, bytes.count)]))
            offset += size
            index += 1
        }
        continuation.finish()
    }
}

@Suite struct StoreTests {
    let logger = Logger(label: "preview-tests")

    func digest(_ bytes: [UInt8], in directory: TempDirectory) throws -> String {
        let path = try directory.write("digest-input", bytes)
        defer { unlink(path) }
        return try sha256OfFile(atPath: path).hex
    }

    @Test func sha256OfAKnownVector() throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let path = try directory.write("abc", Array("abc".utf8))
        let (hex, size) = try sha256OfFile(atPath: path)
        #expect(hex == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(size == 3)
        let empty = try directory.write("empty", [])
        #expect(
            try sha256OfFile(atPath: empty).hex == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    }

    @Test func storesAVerifiedFileAndLeavesNoTemporary() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let bytes = pattern(100_000)
        let hash = try digest(bytes, in: directory)
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let reservation = try store.reserve(
            PreviewOffer(name: "doc.pdf", size: UInt64(bytes.count), sha256: hash.uppercased()))
        let stored = try await store.receive(reservation, chunks: chunks(bytes, size: 4096))
        store.release(reservation)
        #expect(stored.name == "doc.pdf")
        #expect(stored.sha256 == hash)
        #expect(directory.entries == ["doc.pdf"])
        #expect(directory.read("doc.pdf") == bytes)
        #expect(store.reservationCount == 0)
    }

    @Test func anExistingNameGetsASuffixAndIsNeverOverwritten() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        _ = try directory.write("doc.pdf", Array("original".utf8))
        _ = try directory.write("doc (2).pdf", Array("second".utf8))
        let bytes = pattern(5000, seed: 7)
        let hash = try digest(bytes, in: directory)
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let reservation = try store.reserve(PreviewOffer(name: "doc.pdf", size: 5000, sha256: hash))
        let stored = try await store.receive(reservation, chunks: chunks(bytes))
        #expect(stored.name == "doc (3).pdf")
        #expect(directory.read("doc.pdf") == Array("original".utf8))
        #expect(directory.read("doc (2).pdf") == Array("second".utf8))
        #expect(directory.read("doc (3).pdf") == bytes)
        #expect(directory.entries == ["doc (2).pdf", "doc (3).pdf", "doc.pdf"])
    }

    @Test func aHashMismatchStoresNothing() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let reservation = try store.reserve(
            PreviewOffer(name: "x.bin", size: 3000, sha256: String(repeating: "0", count: 64)))
        await #expect { try await store.receive(reservation, chunks: chunks(pattern(3000))) } throws: { error in
            (error as? PreviewFailure)?.code == PreviewFailure.hashMismatch
        }
        #expect(directory.entries.isEmpty)
    }

    @Test func anInterruptedTransferDeletesTheTemporaryFile() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let bytes = pattern(50_000)
        let hash = try digest(bytes, in: directory)
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let reservation = try store.reserve(PreviewOffer(name: "x.bin", size: 50_000, sha256: hash))
        await #expect { try await store.receive(reservation, chunks: chunks(bytes, failAfter: 10)) } throws: { error in
            (error as? PreviewFailure)?.code == PreviewFailure.transferFailed
        }
        #expect(directory.entries.isEmpty)
    }

    @Test func tooFewOrTooManyBytesStoreNothing() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let bytes = pattern(10_000)
        let hash = try digest(bytes, in: directory)
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let short = try store.reserve(PreviewOffer(name: "x.bin", size: 10_001, sha256: hash))
        await #expect { try await store.receive(short, chunks: chunks(bytes)) } throws: { error in
            (error as? PreviewFailure)?.code == PreviewFailure.sizeMismatch
        }
        let long = try store.reserve(PreviewOffer(name: "x.bin", size: 9_999, sha256: hash))
        await #expect { try await store.receive(long, chunks: chunks(bytes)) } throws: { error in
            (error as? PreviewFailure)?.code == PreviewFailure.sizeMismatch
        }
        #expect(directory.entries.isEmpty)
    }

    @Test func cancellingTheReceiveDeletesTheTemporaryFile() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let reservation = try store.reserve(
            PreviewOffer(name: "slow.bin", size: 1 << 20, sha256: String(repeating: "a", count: 64)))
        // A stream that delivers one chunk and then never ends.
        let (stream, continuation) = AsyncThrowingStream<[UInt8], any Error>.makeStream()
        continuation.yield(pattern(1000))
        let task = Task { try await store.receive(reservation, chunks: stream) }
        let deadline = ContinuousClock.now + .seconds(10)
        while !directory.entries.contains(where: FileName.isTempFile) {
            guard ContinuousClock.now < deadline else { throw TestError("no temporary file appeared") }
            await Task.yield()
        }
        task.cancel()
        await #expect { try await task.value } throws: { error in
            (error as? PreviewFailure)?.code == PreviewFailure.transferFailed
        }
        #expect(directory.entries.isEmpty)
        continuation.finish()
    }

    @Test func offersAreCheckedBeforeAnyDataFlows() throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let hash = String(repeating: "ab", count: 32)
        let store = try PreviewStore(directory: directory.path, maxSize: 1000, logger: logger)
        #expect(throws: PreviewFailure.self) { try store.reserve(PreviewOffer(name: "big", size: 1001, sha256: hash)) }
        do {
            _ = try store.reserve(PreviewOffer(name: "big", size: 1001, sha256: hash))
        } catch {
            #expect(error.code == PreviewFailure.tooLarge)
        }
        do {
            _ = try store.reserve(PreviewOffer(name: "../x", size: 10, sha256: hash))
            Issue.record("../x admitted")
        } catch {
            #expect(error.code == PreviewFailure.badName)
        }
        do {
            _ = try store.reserve(PreviewOffer(name: "ok", size: 10, sha256: "xyz"))
            Issue.record("a malformed hash was admitted")
        } catch {
            #expect(error.code == PreviewFailure.badRequest)
        }
        // Not enough space: more than the file system has free (the size limit allows it).
        let roomy = try PreviewStore(directory: directory.path, maxSize: .max, logger: logger)
        let free = try #require(roomy.freeSpace())
        do {
            _ = try roomy.reserve(PreviewOffer(name: "huge", size: free + 1, sha256: hash))
            Issue.record("an offer larger than the free space was admitted")
        } catch {
            #expect(error.code == PreviewFailure.noSpace)
        }
        // Reservations count against the free space until released. (The file system's free space
        // moves while the test runs — other processes write and delete — so the second offer is
        // 64 MiB over half: it does not fit beside the first unless 64 MiB were freed meanwhile.)
        let slack: UInt64 = 64 << 20
        let first = try roomy.reserve(PreviewOffer(name: "half", size: free / 2 + 1, sha256: hash))
        #expect(throws: PreviewFailure.self) {
            try roomy.reserve(PreviewOffer(name: "half2", size: free / 2 + slack, sha256: hash))
        }
        roomy.release(first)
        let second = try roomy.reserve(PreviewOffer(name: "half2", size: free / 2 + slack, sha256: hash))
        roomy.release(second)
        #expect(directory.entries.isEmpty)
    }

    @Test func staleTemporaryFilesAreRemovedOnStart() throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        _ = try directory.write(".preview-deadbeef.part", [1, 2, 3])
        _ = try directory.write(".preview-0.part", [])
        _ = try directory.write("keep.pdf", [4])
        _ = try directory.write(".preview-notes.txt", [5])
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let removed = store.removeStaleTempFiles()
        #expect(removed.sorted() == [".preview-0.part", ".preview-deadbeef.part"])
        #expect(directory.entries == [".preview-notes.txt", "keep.pdf"])
    }

    @Test func aMissingDirectoryIsAClearError() {
        #expect(throws: PreviewFailure.self) {
            _ = try PreviewStore(directory: "/nonexistent/preview-dir", maxSize: 1, logger: Logger(label: "x"))
        }
    }
}
