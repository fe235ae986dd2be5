import Foundation
import Logging
import Messaging
import Testing

/// A session store on a disk that fills up: a real `ENOSPC`, from a 256 KiB tmpfs mounted in the
/// harness's own mount namespace (host "a"; never the machine's). `send` fails with
/// `sessionStoreFailed` and keeps nothing; what it returned for arrives; the store reads back
/// whole; with room again, sending goes on.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct SessionStoreDiskTests {
    struct Reading: Codable, Sendable { var n: Int; var pad: String }

    @Test func aFullDiskFailsSendAndKeepsNothingItDidNotStore() async throws {
        let mountPoint = NSTemporaryDirectory() + "store-disk-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        let mounted = try Harness.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", mountPoint])
        try #require(mounted.status == 0, "mount: \(mounted.output)")
        defer { _ = try? Harness.run(["umount", mountPoint]) }
        // Most of the disk taken by another file: about 40 KiB left for the store.
        let filler = mountPoint + "/filler"
        #expect(FileManager.default.createFile(atPath: filler, contents: Data(count: 216 * 1024)))
        let logger = Harness.logger("store-disk")

        let received = ReceivedCount()
        var serverConfiguration = ServerConfiguration(serviceType: "_itest-disk._tcp", serviceName: "disk")
        serverConfiguration.publish = false
        serverConfiguration.listener.loopbackOnly = true
        serverConfiguration.channel.security = .plaintext
        let server = MessageServer(configuration: serverConfiguration, discovery: nil, logger: logger)
        try await server.start()
        let pump = Task { for await event in server.events { if case .received = event { received.add() } } }

        var configuration = ClientConfiguration(peerName: "sensor", reconnect: ReconnectPolicy())
        configuration.channel.security = .plaintext
        configuration.peerMemory = nil
        configuration.session?.store = SessionStore(directory: mountPoint + "/store")
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: server.port!), configuration: configuration, logger: logger)
        let pad = String(repeating: "x", count: 300)
        var stored = 0
        var failure: MessagingError?
        for n in 1...2_000 {
            do {
                try await client.send(Reading(n: n, pad: pad), type: "reading")
                stored += 1
            } catch let error as MessagingError {
                failure = error
                break
            }
        }
        let error = try #require(failure, "2,000 readings of 300 bytes fit in 40 KiB")
        #expect(error.code == .sessionStoreFailed)
        #expect(error.message.contains("the disk is full") && error.message.contains("nothing of this was stored"), "\(error.message)")
        #expect((error.underlying as? FileError)?.errno == ENOSPC)
        // What `send` returned for arrives; the failed one was neither kept nor sent.
        try await waitForCondition("\(stored) received") { received.value == stored }
        try await waitForCondition("all acknowledged") { client.unacknowledgedCount == 0 }
        #expect(received.value == stored)
        await client.close()

        // The store reads back (no partial record was left), and with room again sending goes on.
        try FileManager.default.removeItem(atPath: filler)
        let again = try await MessageClient.connect(
            to: .host("127.0.0.1", port: server.port!), configuration: configuration, logger: logger)
        try await again.send(Reading(n: stored + 1, pad: pad), type: "reading")
        try await waitForCondition("one more received") { received.value == stored + 1 }
        await again.close()
        await server.stop()
        pump.cancel()
        Harness.measured("store-disk readings stored before ENOSPC", Double(stored), "readings")
    }
}

final class ReceivedCount: @unchecked Sendable {  // guarded by lock
    private let lock = NSLock()
    private var count = 0
    func add() { lock.withLock { count += 1 } }
    var value: Int { lock.withLock { count } }
}

func waitForCondition(_ what: String, timeout: Duration = .seconds(20), _ condition: () async -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while !(await condition()) {
        guard ContinuousClock.now < deadline else { throw HarnessError("not \(what) within \(timeout)") }
        try await Task.sleep(for: .milliseconds(10))
    }
}
