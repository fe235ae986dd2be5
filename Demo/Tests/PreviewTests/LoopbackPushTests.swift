import Foundation
import Logging
import Messaging
import PreviewKit
import Scheduling
import Locks
import DemoTestWaits
import Testing

/// The push protocol end to end over loopback TCP, in process (no discovery, no harness).
@Suite struct LoopbackPushTests {
    let logger = Logger(label: "preview-loopback")

    /// A listening (unpublished) server whose events go to a PreviewService over `directory`.
    func startServer(_ directory: TempDirectory, maxSize: UInt64 = 1 << 30) async throws -> (
        MessageServer, PreviewService, Task<Void, Never>
    ) {
        var configuration = ServerConfiguration(serviceType: PreviewProtocol.serviceType, serviceName: "Loopback")
        configuration.publish = false
        let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
        try await server.start()
        let store = try PreviewStore(directory: directory.path, maxSize: maxSize, logger: logger)
        let service = PreviewService(store: store, logger: logger)
        let events = Task { for await event in server.events { service.handle(event) } }
        return (server, service, events)
    }

    func connect(_ server: MessageServer) async throws -> MessageChannel {
        try await MessageChannel.connect(
            to: [.ipv4Loopback(port: try #require(server.port))], configuration: ChannelConfiguration(name: "pusher"),
            logger: logger)
    }

    @Test func pushesFilesAndSuffixesRepeatedNames() async throws {
        let directory = try TempDirectory()
        let source = try TempDirectory()
        defer {
            directory.remove()
            source.remove()
        }
        let (server, service, events) = try await startServer(directory)
        let channel = try await connect(server)
        let pusher = PreviewPusher(channel: channel)
        let bytes = pattern(3 * 256 * 1024 + 5)
        let file = try source.write("doc.pdf", bytes)
        let progress = ProgressLog()
        let first = try await pusher.push(path: file, progress: { progress.append($0.sentBytes) })
        let second = try await pusher.push(path: file)
        let empty = try await pusher.push(path: try source.write("empty.txt", []))
        #expect(first.storedName == "doc.pdf")
        #expect(second.storedName == "doc (2).pdf")
        #expect(empty.storedName == "empty.txt" && empty.size == 0)
        #expect(first.sha256 == (try sha256OfFile(atPath: file).hex))
        #expect(directory.read("doc.pdf") == bytes && directory.read("doc (2).pdf") == bytes)
        #expect(directory.entries == ["doc (2).pdf", "doc.pdf", "empty.txt"])
        #expect(progress.values.last == UInt64(bytes.count))
        #expect(service.store.reservationCount == 0)
        channel.close()
        await server.stop()
        await events.value
    }

    /// An accepted offer whose data never comes holds its space for the offer's expiry — a minute on
    /// the service's manual clock, not a second less — then releases it.
    @Test func anOfferWithoutDataIsReleasedWhenItsExpiryComes() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        var configuration = ServerConfiguration(serviceType: PreviewProtocol.serviceType, serviceName: "Expiring")
        configuration.publish = false
        let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
        try await server.start()
        let clock = ManualScheduler()
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 20, logger: logger)
        let service = PreviewService(store: store, offerExpiry: .seconds(60), logger: logger, scheduler: clock)
        let events = Task { for await event in server.events { service.handle(event) } }
        let channel = try await connect(server)
        let reply = try await channel.request(
            PreviewOffer(name: "never.pdf", size: 1000, sha256: String(repeating: "0", count: 64)), type: PreviewProtocol.TypeID.offer,
            expecting: PreviewOfferReply.self, timeout: .seconds(10))
        #expect(reply.accepted)
        #expect(store.reservationCount == 1 && clock.pendingCount == 1)
        clock.advance(by: .seconds(59))
        #expect(store.reservationCount == 1, "released before its expiry")
        clock.advance(by: .seconds(1))
        #expect(store.reservationCount == 0, "still held after its expiry")
        channel.close()
        await server.stop()
        await events.value
    }

    @Test func refusalsComeBeforeAnyData() async throws {
        let directory = try TempDirectory()
        let source = try TempDirectory()
        defer {
            directory.remove()
            source.remove()
        }
        let (server, _, events) = try await startServer(directory, maxSize: 1000)
        let channel = try await connect(server)
        let pusher = PreviewPusher(channel: channel)
        let file = try source.write("big.bin", pattern(1001))
        await #expect { try await pusher.push(path: file) } throws: {
            ($0 as? PreviewFailure)?.code == PreviewFailure.tooLarge
        }
        await #expect { try await pusher.push(path: file, name: "../escape") } throws: {
            ($0 as? PreviewFailure)?.code == PreviewFailure.badName
        }
        #expect(directory.entries.isEmpty)
        channel.close()
        await server.stop()
        await events.value
    }

    @Test func drainingRefusesNewOffersAndAbortDeletesPartialData() async throws {
        let directory = try TempDirectory()
        let source = try TempDirectory()
        defer {
            directory.remove()
            source.remove()
        }
        let (server, service, events) = try await startServer(directory)
        let channel = try await connect(server)
        let pusher = PreviewPusher(channel: channel)
        let file = try source.write("slow.bin", pattern(4 << 20))
        // 1 MiB/s: still in flight when the service aborts it.
        let push = Task { try await pusher.push(path: file, chunkSize: 64 * 1024, bytesPerSecond: 1 << 20) }
        // (the service tells no one of its partial files: the tests' one poll)
        try await waitUntil("the push started (a transfer in flight and its partial file)", timeout: .seconds(10)) {
            service.inFlightCount > 0 && directory.entries.contains(where: FileName.isTempFile)
        }
        service.beginDraining()
        let other = try source.write("late.txt", [1, 2, 3])
        await #expect { try await pusher.push(path: other) } throws: {
            ($0 as? PreviewFailure)?.code == PreviewFailure.shuttingDown
        }
        #expect(await service.waitForInFlight(timeout: .milliseconds(100)) == false)
        await service.abortInFlight()
        #expect(directory.entries.isEmpty)
        await #expect { try await push.value } throws: { $0 is PreviewFailure }
        channel.close()
        await server.stop()
        await events.value
    }
}

/// Progress values, collected from the push's callback.
final class ProgressLog: Sendable {
    private let storage = Locked<[UInt64]>([])
    func append(_ value: UInt64) { storage.withLock { $0.append(value) } }
    var values: [UInt64] { storage.withLock { $0 } }
}

/// What a careful user met (issue 27, items 16 and 17).
@Suite struct PreviewEdgeTests {
    let logger = Logger(label: "preview-edge")

    /// A stream sent without an accepted offer is answered with a failed result naming the
    /// problem (it used to be discarded in silence, the sender waiting for a result forever).
    @Test func aStreamWithoutAnOfferGetsAResultSayingSo() async throws {
        let directory = try TempDirectory()
        defer { directory.remove() }
        let harness = LoopbackPushTests()
        let (server, _, events) = try await harness.startServer(directory)
        let channel = try await harness.connect(server)
        let results = Task { () -> PreviewResult? in
            for await message in channel.messages where message.typeID == PreviewProtocol.TypeID.result {
                return try? message.decode(PreviewResult.self)
            }
            return nil
        }
        let stream = try await channel.startTransfer(type: PreviewProtocol.TypeID.file, totalSize: 5, metadata: ["name": "sneaky.txt"])
        try await stream.send(Array("hello".utf8))
        try await stream.finish()
        let result = try #require(try await value(of: results, "the service's answer", within: .seconds(5)))
        #expect(result.failure?.code == PreviewFailure.badRequest)
        #expect(result.failure?.message.contains("offer the file first") == true, "\(String(describing: result.failure))")
        #expect(directory.entries.isEmpty)
        channel.close()
        await server.stop()
        await events.value
    }

    /// Names that a terminal or a file manager would render deceptively are refused, and every
    /// name a program prints is escaped.
    @Test func bidirectionalAndC1ControlsAreRefusedAndEscaped() {
        for name in ["invoice\u{202E}fdp.exe", "a\u{2066}b", "x\u{200F}y", "bell\u{0085}.txt", "csi\u{009B}31m.txt"] {
            #expect(throws: PreviewFailure.self) { try FileName.validate(name) }
            let shown = FileName.printable(name)
            #expect(!shown.unicodeScalars.contains { $0.value >= 0x80 && $0.value <= 0x9F || FileName.isBidiControl($0) }, "\(shown)")
            #expect(shown.contains("\\u{"), "\(shown)")
        }
        do {
            try FileName.validate("invoice\u{202E}fdp.exe")
        } catch {
            #expect(error.message.contains("U+202E"), "\(error.message)")
        }
        // Ordinary non-ASCII names stay as they are.
        #expect((try? FileName.validate("Überweisung – März.pdf")) != nil)
        #expect(FileName.printable("Überweisung – März.pdf") == "Überweisung – März.pdf")
    }
}
