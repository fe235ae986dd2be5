import Foundation
import Testing

@testable import Discovery
@testable import Messaging
import ProtocolCore
import Transport

/// Peers remembered: where a named server was reached and its key, tried when discovery finds
/// nothing — and accepted there only with that key. Discovery here finds nothing (no daemon, no
/// wide-area), as on a subnet where neither mDNS nor DNS-SD reaches the server.
@Suite struct PeerMemoryTests {
    static func directory() -> String {
        let path = NSTemporaryDirectory() + "peer-memory-\(UUID().uuidString.prefix(8))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    @Test func theFileKeepsTypeNameKeyAndAddressesInOrder() throws {
        let memory = PeerMemory(path: Self.directory() + "/known_addresses")
        let key = Identity.ephemeral().fingerprint
        let v4 = try SocketAddress(ipAddress: "10.81.2.20", port: 4242)
        let v6 = try SocketAddress(ipAddress: "fd81:2::20", port: 4242)
        try memory.remember(type: "_preview._tcp", name: "Projector on the 2nd floor", fingerprint: key, used: v6, others: [v4, v6])
        let entry = try #require(memory.entry(type: "_preview._tcp", name: "Projector on the 2nd floor"))
        #expect(entry.fingerprint == key)
        #expect(entry.addresses == [v6, v4])  // the one that worked first, no duplicates
        let text = try String(contentsOfFile: memory.path, encoding: .utf8)
        #expect(text.contains("_preview._tcp \(key.full) [fd81:2::20]:4242,10.81.2.20:4242 Projector on the 2nd floor"))
        var mode = stat()
        #expect(stat(memory.path, &mode) == 0 && mode.st_mode & 0o077 == 0, "the memory must not be readable by others")
        // A new connection replaces the entry; forget removes it.
        try memory.remember(type: "_preview._tcp", name: "Projector on the 2nd floor", fingerprint: key, used: v4, others: [])
        #expect(memory.entry(type: "_preview._tcp", name: "Projector on the 2nd floor")?.addresses == [v4])
        #expect(try memory.forget(type: "_preview._tcp", name: "Projector on the 2nd floor"))
        #expect(memory.entries.isEmpty)
    }

    @Test func aRememberedServerIsReachedWhenDiscoveryFindsNothingAndOnlyWithItsKey() async throws {
        let serverIdentity = Identity.ephemeral()
        let harness = try await LoopbackServer(security: .encrypted(identity: serverIdentity, trust: .anyKey))
        let memory = PeerMemory(path: Self.directory() + "/known_addresses")
        let discovery = ServiceDiscovery(logger: testLogger(), backend: .avahi)  // no daemon here: finds nothing
        defer { Task { await discovery.shutdown() } }
        func connect() async throws -> MessageClient {
            var configuration = ClientConfiguration(peerName: "pusher")
            configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
            configuration.browseTimeout = .milliseconds(300)
            configuration.peerMemory = memory
            configuration.channel.connectTimeout = .seconds(3)
            return try await MessageClient.connect(
                to: .service(name: "Test", type: "_test._tcp", discovery: discovery), configuration: configuration,
                logger: testLogger())
        }
        // Nothing remembered: not found, as before.
        await #expect(throws: MessagingError.self) { _ = try await connect() }
        // Remembered with the server's key: connected there, and the entry is kept current.
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: harness.port)
        try memory.remember(type: "_test._tcp", name: "Test", fingerprint: serverIdentity.fingerprint, used: address, others: [])
        let client = try await connect()
        #expect(client.channel?.peerIdentity?.fingerprint == serverIdentity.fingerprint)
        await client.close()
        // Remembered with another key: the server at that address is refused, whatever its name.
        try memory.remember(type: "_test._tcp", name: "Test", fingerprint: Identity.ephemeral().fingerprint, used: address, others: [])
        do {
            _ = try await connect()
            Issue.record("a server whose key is not the remembered one must be refused")
        } catch let error as MessagingError {
            #expect(error.message.contains("remembered for the key"), "\(error.message)")
        }
        await harness.server.stop()
    }
}
