import Foundation
import Logging
import Messaging
import TestWaits
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
            if n % 20 == 0 { try #require(await client.acknowledged(within: .seconds(20)), "acknowledged through \(n)") }
        }
        try await received.wait("2,000 received") { $0 == 2_000 }
        try #require(await client.acknowledged(within: .seconds(20)), "all acknowledged")

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
        try await received.wait("\(2_000 + stored) received") { $0 == 2_000 + stored }
        held.release()
        try #require(await client.acknowledged(within: .seconds(20)), "all acknowledged")
        try await client.send(Reading(n: 4_001, pad: pad), type: "reading")
        try await received.wait("one more received") { $0 == 2_001 + stored }
        await client.close()
        await server.stop()
        pump.cancel()
        Harness.measured("store-disk readings through 40 KiB, acknowledged", 2_000, "readings")
        Harness.measured("store-disk readings stored unacknowledged before ENOSPC", Double(stored), "readings")
    }
}

extension SessionStoreDiskTests {
    /// A power-loss store whose `fdatasync` fails: a FUSE file system that answers `EIO` to fsync
    /// while a flag file exists (Tests/harness/failing-fs.py, Debian's python3-fusepy), mounted in
    /// the harness's mount namespace — the kernel's real path, `fdatasync` → FUSE → `EIO`. The
    /// send whose sync failed fails with `sessionStoreFailed` ("cannot sync the session store")
    /// and its message never reaches the server; every later send fails at once, also once the
    /// disk answers again (a failed sync cannot be retried); and when the connection is lost the
    /// client gives up (`sessionStoreUnusable`, final) instead of continuing a session its store
    /// no longer follows. Before: the failed sync was taken as done — `send` returned and the
    /// message went, though a power loss could take its record.
    @Test func aStoreWhoseSyncFailsFailsItsSendsAndTheClientGivesUp() async throws {
        let base = NSTemporaryDirectory() + "failing-sync-\(UUID().uuidString)"
        let (backing, mountPoint, flag) = (base + "/backing", base + "/mount", base + "/fail-sync")
        for directory in [backing, mountPoint] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        let script = Harness.repoRoot.appendingPathComponent("Tests/harness/failing-fs.py").path
        let fileSystem = try Background(["/usr/bin/python3", script, backing, mountPoint, flag])
        defer {
            _ = try? Harness.run(["umount", mountPoint])
            fileSystem.stop()
            try? FileManager.default.removeItem(atPath: base)
        }
        try await waitUntil("the FUSE file system mounted at \(mountPoint)", timeout: .seconds(10)) {
            (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8))?.contains(" \(mountPoint) ") == true
        }
        let logger = Harness.logger("failing-sync")

        var serverConfiguration = ServerConfiguration(serviceType: "_itest-fsync._tcp", serviceName: "fsync")
        serverConfiguration.publish = false
        serverConfiguration.listener.loopbackOnly = true
        serverConfiguration.channel.security = .plaintext
        let server = MessageServer(configuration: serverConfiguration, discovery: nil, logger: logger)
        try await server.start()
        let received = ReceivedCount()
        let closed = ReceivedCount()
        let connections = Locked<[ServerConnection]>([])
        let pump = Task {
            for await event in server.events {
                switch event {
                case .received(let connection, _):
                    connections.value.withLock { $0.append(connection) }
                    received.add()
                case .closed: closed.add()
                default: break
                }
            }
        }

        var configuration = ClientConfiguration(peerName: "sensor", reconnect: ReconnectPolicy())
        configuration.channel.security = .plaintext
        configuration.peerMemory = nil
        configuration.session?.store = SessionStore(directory: mountPoint + "/store", durability: .powerLoss)
        let client = try await MessageClient.connect(
            to: .host("127.0.0.1", port: server.port!), configuration: configuration, logger: logger)
        let gaveUp = Observed<MessagingError?>(nil)
        let events = Task {
            for await event in client.events {
                if case .gaveUp(let error) = event { gaveUp.update { $0 = error } }
            }
        }
        try await client.send(Reading(n: 1, pad: ""), type: "reading")
        try await received.wait("reading 1 received") { $0 == 1 }

        #expect(FileManager.default.createFile(atPath: flag, contents: nil))
        var failure: MessagingError?
        do {
            try await client.send(Reading(n: 2, pad: ""), type: "reading")
        } catch let error as MessagingError {
            failure = error
        }
        let error = try #require(failure, "send returned though the store's fdatasync failed")
        #expect(error.code == .sessionStoreFailed)
        #expect(error.message.contains("cannot sync the session store"), "\(error.message)")
        #expect((error.underlying as? FileError)?.errno == EIO)
        // The disk answers again; the store takes nothing more all the same.
        try FileManager.default.removeItem(atPath: flag)
        do {
            try await client.send(Reading(n: 3, pad: ""), type: "reading")
            Issue.record("a store whose sync failed took another message")
        } catch let later as MessagingError {
            #expect(later.code == .sessionStoreFailed, "\(later)")
        }

        // The connection is lost: the client does not continue the session, it gives up.
        let connection = try #require(connections.value.withLock { $0.first })
        connection.close(reason: "the test closes it")
        try await gaveUp.wait("the client gave up", timeout: .seconds(15)) { $0 != nil }
        let final = try #require(gaveUp.value)
        #expect(final.code == .sessionStoreUnusable, "\(final)")
        #expect(final.message.contains("restart the process"), "\(final.message)")
        // Nothing of readings 2 and 3 reached the server (its events are in order: the close last).
        try await closed.wait("the server saw the connection close") { $0 >= 1 }
        #expect(received.value == 1)
        await client.close()
        await server.stop()
        pump.cancel()
        events.cancel()
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

/// A count a test waits on, woken by each `add` (not a poll).
final class ReceivedCount: Sendable {
    private let count = Observed(0)
    func add() { count.update { $0 += 1 } }
    var value: Int { count.value }

    /// Waits (bounded) until the count satisfies `predicate`.
    func wait(_ what: String, timeout: Duration = .seconds(20), until predicate: (Int) -> Bool) async throws {
        try await count.wait(what, timeout: timeout, until: predicate)
    }
}
