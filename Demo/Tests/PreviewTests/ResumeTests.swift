import Crypto
import Foundation
import Logging
import Messaging
import PreviewKit
import Locks
import DemoTestWaits
import Testing

/// Resumable transfers: the partial-transfer store on its own, then an interrupted push over
/// loopback that resumes where the server's kept bytes end.
@Suite struct ResumeTests {
    let logger = Logger(label: "preview-resume")
    struct Broken: Error {}

    static func hex(_ bytes: [UInt8]) -> String { SHA256.hash(data: bytes).map { String(format: "%02x", $0) }.joined() }

    /// Chunks of `bytes`, 100,000 at a time, ending with `error` if given.
    static func chunks(_ bytes: ArraySlice<UInt8>, endingWith error: (any Error)? = nil) -> AsyncThrowingStream<
        [UInt8], any Error
    > {
        AsyncThrowingStream { continuation in
            var start = bytes.startIndex
            while start < bytes.endIndex {
                let end = min(start + 100_000, bytes.endIndex)
                continuation.yield(Array(bytes[start..<end]))
                start = end
            }
            continuation.finish(throwing: error)
        }
    }

    @Test func partialsAreKeptResumedAndVerified() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let partials = try PartialTransfers(directory: directory.path + "/partial", logger: logger)
        let bytes = pattern(1_000_000)
        let key = PartialTransfers.Key(sender: "alice", sha256: Self.hex(bytes), size: 1_000_000)
        #expect(partials.offset(for: key) == 0)
        // The first attempt stops after 300,000 bytes: they are kept.
        await #expect {
            _ = try await partials.receive(Self.chunks(bytes[0..<300_000], endingWith: Broken()), key: key, offset: 0)
        } throws: { ($0 as? ResumableTransferError)?.code == .interrupted && ($0 as? ResumableTransferError)?.kept == 300_000 }
        #expect(partials.offset(for: key) == 300_000)
        // Another sender's identical content does not share it.
        #expect(partials.offset(for: PartialTransfers.Key(sender: "mallory", sha256: key.sha256, size: key.size)) == 0)
        // The resume sends the rest; the whole file is verified.
        let path = try await partials.receive(Self.chunks(bytes[300_000...]), key: key, offset: 300_000)
        #expect(FileManager.default.contents(atPath: path).map { [UInt8]($0) } == bytes)
        unlink(path)
        #expect(partials.offset(for: key) == 0)

        // A resume whose bytes do not add up to the announced hash: the partial is deleted.
        let liar = PartialTransfers.Key(sender: "alice", sha256: String(repeating: "0", count: 64), size: 1_000_000)
        await #expect {
            _ = try await partials.receive(Self.chunks(bytes[...]), key: liar, offset: 0)
        } throws: { ($0 as? ResumableTransferError)?.code == .hashMismatch }
        #expect(partials.offset(for: liar) == 0)
        // More than announced: deleted too.
        let small = PartialTransfers.Key(sender: "alice", sha256: key.sha256, size: 10)
        await #expect {
            _ = try await partials.receive(Self.chunks(bytes[0..<11]), key: small, offset: 0)
        } throws: { ($0 as? ResumableTransferError)?.code == .sizeMismatch }
        #expect(partials.offset(for: small) == 0)
        // An offset beyond what is kept is refused.
        await #expect {
            _ = try await partials.receive(Self.chunks(bytes[5...]), key: key, offset: 5)
        } throws: { ($0 as? ResumableTransferError)?.code == .sizeMismatch }
    }

    @Test func expiredPartialsAreDeleted() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let bytes = pattern(200_000)
        let key = PartialTransfers.Key(sender: "alice", sha256: Self.hex(bytes), size: 200_000)
        let keeping = try PartialTransfers(directory: directory.path + "/p", logger: logger)
        _ = try? await keeping.receive(Self.chunks(bytes[0..<100_000], endingWith: Broken()), key: key, offset: 0)
        #expect(keeping.offset(for: key) == 100_000)
        #expect(keeping.removeExpired() == 0)  // kept for an hour by default
        // A store that keeps partials for no time deletes them when it opens.
        let expiring = try PartialTransfers(directory: directory.path + "/p", keepFor: .zero, logger: logger)
        #expect(keeping.offset(for: key) == 0)
        #expect(expiring.removeExpired() == 0)
    }

    /// A push whose connection is cut mid-way retries by itself and sends only what the server had not
    /// kept; the stored file is the original, and at most 10 % more than the file was sent in all.
    @Test func anInterruptedPushResumes() async throws {
        let directory = try TempDirectory()
        let source = try TempDirectory()
        defer {
            directory.remove()
            source.remove()
        }
        var configuration = ServerConfiguration(serviceType: PreviewProtocol.serviceType, serviceName: "Resume")
        configuration.publish = false
        configuration.listener.loopbackOnly = true
        let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
        try await server.start()
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 30, logger: logger)
        let partials = try PartialTransfers(directory: directory.path + "/.lanmsg-partial", logger: logger)
        let service = PreviewService(store: store, partials: partials, logger: logger)
        let events = Task { for await event in server.events { service.handle(event) } }

        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: try #require(server.port)),
            configuration: ClientConfiguration(
                peerName: "pusher", reconnect: ReconnectPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(100))),
            logger: logger)
        let drain = Task { for await _ in client.events {} }
        let bytes = pattern(8 << 20)
        let file = try source.write("big.bin", bytes)
        let retries = Locked<[ResumingPusher.Retry]>([])
        let resumedAt = Locked<[UInt64]>([])
        let pusher = ResumingPusher(client: client, retryFor: .seconds(20))
        let push = Task {
            try await pusher.push(
                path: file, bytesPerSecond: 8 << 20, timeout: .seconds(10), resultTimeout: .seconds(30),
                onRetry: { retry in retries.withLock { $0.append(retry) } },
                onResume: { offset in resumedAt.withLock { $0.append(offset) } })
        }
        // Cut the connection once the server has kept about 2 MiB.
        let partialDirectory = directory.path + "/.lanmsg-partial"
        // (the server tells no one how much it kept: the tests' one poll)
        try await waitUntil("the server kept 2 MiB of the push", timeout: .seconds(20)) { Self.bytesIn(partialDirectory) >= 2 << 20 }
        client.channel?.abort()
        let result = try await push.value
        #expect(result.sha256 == Self.hex(bytes))
        #expect(directory.read("big.bin") == bytes)
        let retry = try #require(retries.withLock { $0 }.first)
        #expect(retries.withLock { $0.count } == 1)
        let offset = try #require(resumedAt.withLock { $0 }.first)
        #expect(offset >= 2 << 20)
        let total = retry.sentBytes + UInt64(bytes.count) - offset
        #expect(Double(total) <= 1.1 * Double(bytes.count), "sent \(total) bytes for \(bytes.count)")
        #expect(Self.bytesIn(partialDirectory) == 0)  // the partial became the stored file
        // A retry of the same push after it was stored is answered with the stored result (no copy).
        #expect(directory.entries == [".lanmsg-partial", "big.bin"])
        print("MEASURED resumed push: \(bytes.count) bytes, cut at \(retry.sentBytes), resumed at \(offset), sent \(total) in all")
        await client.close()
        drain.cancel()
        await server.stop()
        await events.value
    }

    static func bytesIn(_ directory: String) -> UInt64 {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        return names.reduce(0) { sum, name in
            let size = (try? FileManager.default.attributesOfItem(atPath: directory + "/" + name)[.size] as? UInt64) ?? 0
            return sum + size
        }
    }
}
