import Foundation
import Logging
import Messaging
import Testing

/// A session store on a small disk: a real `ENOSPC`, from a 256 KiB tmpfs mounted in the
/// harness's own mount namespace (host "a"; never the machine's), about 40 KiB left for the store.
/// Acknowledged messages never fill it (the store compacts relative to what it keeps, and on a
/// full disk); unacknowledged ones do: then `send` fails with `sessionStoreFailed` and keeps
/// nothing; what it returned for arrives; once the server acknowledges, sending goes on.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct SessionStoreDiskTests {
    struct Reading: Codable, Sendable { var n: Int; var pad: String }

    @Test func aSmallDiskFillsOnlyWithWhatIsUnacknowledged() async throws {
        let mountPoint = NSTemporaryDirectory() + "store-disk-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        let mounted = try Harness.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", mountPoint])
        try #require(mounted.status == 0, "mount: \(mounted.output)")
        defer { _ = try? Harness.run(["umount", mountPoint]) }
        // Most of the disk taken by another file: about 40 KiB left for the store.
        let filler = mountPoint + "/filler"
        #expect(FileManager.default.createFile(atPath: filler, contents: Data(count: 216 * 1024)))
        let logger = Harness.logger("store-disk")

        // The server acknowledges by hand: at once, or not at all while `holding`.
        let received = ReceivedCount()
        let held = HeldMessages()
        var serverConfiguration = ServerConfiguration(serviceType: "_itest-disk._tcp", serviceName: "disk")
        serverConfiguration.publish = false
        serverConfiguration.listener.loopbackOnly = true
        serverConfiguration.channel.security = .plaintext
        serverConfiguration.session?.acknowledgement = .manual
        let server = MessageServer(configuration: serverConfiguration, discovery: nil, logger: logger)
        try await server.start()
        let pump = Task {
            for await event in server.events {
                guard case .received(_, let message) = event else { continue }
                received.add()
                held.take(message)
            }
        }

        var configuration = ClientConfiguration(peerName: "sensor", reconnect: ReconnectPolicy())
        configuration.channel.security = .plaintext
        configuration.peerMemory = nil
        configuration.session?.store = SessionStore(directory: mountPoint + "/store")
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: server.port!), configuration: configuration, logger: logger)
        let pad = String(repeating: "x", count: 300)
        // 2,000 readings of 300 bytes, acknowledged as they come (20 at most in flight, 7 KiB):
        // 750 KiB through a store with 40 KiB of room (its floor of 8 MiB before compaction filled
        // this disk after about 120).
        for n in 1...2_000 {
            try await client.send(Reading(n: n, pad: pad), type: "reading")
            if n % 20 == 0 { try await waitForCondition("acknowledged through \(n)") { client.unacknowledgedCount == 0 } }
        }
        try await waitForCondition("2,000 received") { received.value == 2_000 }
        try await waitForCondition("all acknowledged") { client.unacknowledgedCount == 0 }

        // Unacknowledged, they fill it: `send` fails, saying so, and keeps nothing.
        held.hold()
        var stored = 0
        var failure: MessagingError?
        for n in 2_001...4_000 {
            do {
                try await client.send(Reading(n: n, pad: pad), type: "reading")
                stored += 1
            } catch let error as MessagingError {
                failure = error
                break
            }
        }
        let error = try #require(failure, "2,000 unacknowledged readings of 300 bytes fit in 40 KiB")
        #expect(error.code == .sessionStoreFailed)
        #expect(error.message.contains("the disk is full") && error.message.contains("nothing of this was stored"), "\(error.message)")
        #expect((error.underlying as? FileError)?.errno == ENOSPC)
        #expect(client.unacknowledgedCount == stored, "the failed one is not kept")
        // What `send` returned for arrives; once acknowledged, the room is back and sending goes on.
        try await waitForCondition("\(2_000 + stored) received") { received.value == 2_000 + stored }
        held.release()
        try await waitForCondition("all acknowledged") { client.unacknowledgedCount == 0 }
        try await client.send(Reading(n: 4_001, pad: pad), type: "reading")
        try await waitForCondition("one more received") { received.value == 2_001 + stored }
        await client.close()
        await server.stop()
        pump.cancel()
        Harness.measured("store-disk readings through 40 KiB, acknowledged", 2_000, "readings")
        Harness.measured("store-disk readings stored unacknowledged before ENOSPC", Double(stored), "readings")
    }
}

/// The server's messages, acknowledged at once or held (then acknowledged together).
final class HeldMessages: @unchecked Sendable {  // guarded by lock
    private let lock = NSLock()
    private var holding = false
    private var messages: [IncomingMessage] = []
    func take(_ message: IncomingMessage) {
        let now = lock.withLock { () -> Bool in
            if holding { messages.append(message) }
            return !holding
        }
        if now { message.acknowledge() }
    }
    func hold() { lock.withLock { holding = true } }
    func release() {
        let held = lock.withLock { () -> [IncomingMessage] in
            holding = false
            defer { messages = [] }
            return messages
        }
        for message in held { message.acknowledge() }
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
