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

    enum Forget: String, CaseIterable, Sendable { case api, handEdit }

    /// Issue 57: the trust store is the one place a client knows a key from. A server whose key
    /// changed is refused at its remembered address, and the refusal names what makes it right
    /// (forget the name in the trust store); once the name is forgotten — through the API or by
    /// removing its line by hand — the peer memory's entry for it is forgotten too: never tried
    /// with the old key again (a refusal that could never end), and gone from the file.
    @Test(arguments: Forget.allCases)
    func aNameForgottenInTheTrustStoreIsForgottenInThePeerMemory(_ how: Forget) async throws {
        let harness = try await LoopbackServer(security: .encrypted(identity: .ephemeral(), trust: .anyKey))
        let directory = Self.directory()
        let memory = PeerMemory(path: directory + "/known_addresses")
        let store = TrustStore(path: directory + "/known_peers")
        let discovery = ServiceDiscovery(logger: testLogger(), backend: .avahi)  // no daemon here: finds nothing
        defer { Task { await discovery.shutdown() } }
        // Met before under its old key: trusted and remembered at its address.
        let oldKey = Identity.ephemeral().fingerprint
        try store.trust(oldKey, name: "Test")
        try store.trust(Identity.ephemeral().fingerprint, name: "Another")
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: harness.port)
        try memory.remember(type: "_test._tcp", name: "Test", fingerprint: oldKey, used: address, others: [])
        func connect() async throws -> MessageClient {
            var configuration = ClientConfiguration(peerName: "pusher")
            configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .trustOnFirstUse(store))
            configuration.browseTimeout = .milliseconds(300)
            configuration.peerMemory = memory
            configuration.session = nil
            configuration.channel.connectTimeout = .seconds(3)
            return try await MessageClient.connect(
                to: .service(name: "Test", type: "_test._tcp", discovery: discovery), configuration: configuration,
                logger: testLogger())
        }
        // The key changed: refused, and the refusal says what works.
        do {
            _ = try await connect()
            Issue.record("a server whose key is not the known one must be refused")
        } catch let error as MessagingError {
            #expect(error.code == .untrustedServer, "\(error)")
            #expect(error.message.contains("TrustStore.forget(name: \"Test\")"), "\(error.message)")
            #expect(error.message.contains("remove the line for 'Test' from \(store.path)"), "\(error.message)")
        }
        switch how {
        case .api:
            #expect(try store.forget(name: "Test"))
        case .handEdit:
            let text = try String(contentsOfFile: store.path, encoding: .utf8)
            let kept = text.split(separator: "\n").filter { !$0.hasSuffix(" Test") }.joined(separator: "\n") + "\n"
            try kept.write(toFile: store.path, atomically: true, encoding: .utf8)
        }
        #expect(store.fingerprint(for: "Test") == nil)
        // Forgotten: the remembered address (which only the old key could pass) is not tried, and
        // discovery finds nothing here — not found, no longer refused.
        do {
            _ = try await connect()
            Issue.record("nothing should be found: the remembered entry went with the key")
        } catch let error as MessagingError {
            #expect(error.code == .serviceNotFound, "\(error)")
        }
        #expect(memory.entry(type: "_test._tcp", name: "Test") == nil, "the entry must be forgotten with the key")
        #expect(store.entries.map(\.name) == ["Another"])
        await harness.server.stop()
    }
}
