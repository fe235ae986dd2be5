import Foundation
import Messaging
import Testing

/// Trust that follows the key, not the name (issue 43, 22): an impostor that claims a server's name
/// first pushes the real server to "name #2". A client that knows the real key finds it there (by
/// its TXT `fp`, proven in the handshake), refuses the impostor loudly and reports it, instead of
/// refusing the impostor and giving up for good. Real avahi-daemon on both hosts; the servers are
/// lanmsg-echo on host b.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct TrustFollowsTheKeyTests {
    let logger = Harness.logger("key-test")
    static let type = "_itest-key._tcp"

    func echo(_ name: String, identity: String, _ extra: [String] = []) async throws -> (Background, port: UInt16, key: String) {
        let server = try Harness.spawn(
            onB: true, [Harness.binary("lanmsg-echo"), "--name", name, "--type", Self.type, "--identity", identity] + extra)
        try await server.waitForOutput("published as")
        let lines = server.text.split(separator: "\n").map(String.init)
        let port = try #require(lines.first { $0.hasPrefix("listening on port ") }.flatMap { UInt16($0.dropFirst(18)) })
        let key = try #require(lines.first { $0.hasPrefix("fingerprint ") }.map { String($0.dropFirst(12)) })
        return (server, port, key)
    }

    func configuration(_ directory: String, keepsLooking: Bool = false) -> ClientConfiguration {
        var configuration = ClientConfiguration(peerName: "key-test")
        configuration.channel.security = .encrypted(
            identity: .ephemeral(), trust: .trustOnFirstUse(TrustStore(path: directory + "/known_peers")))
        configuration.peerMemory = PeerMemory.shared(path: directory + "/known_addresses")
        configuration.session = nil
        configuration.browseTimeout = .seconds(8)
        configuration.keepsLookingForKnownKey = keepsLooking
        return configuration
    }

    /// The whole story: met once as "Pantry"; then an impostor holds "Pantry" (announcing the real
    /// key's short fingerprint in its TXT, which anyone can copy) and the real server comes back as
    /// "Pantry #2". The client asks for "Pantry", is refused by the impostor's key (reported as a
    /// `waiting` event with `untrustedServer`, the key-change warning's first line), and ends
    /// connected to the real key at "Pantry #2". Without the key to follow, it gave up at the
    /// impostor.
    @Test func aClientThatKnowsTheKeyFindsTheServerUnderItsNewNameAndRefusesTheImpostor() async throws {
        let directory = NSTemporaryDirectory() + "key-follows-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }

        let (real, _, realKey) = try await echo("Pantry", identity: directory + "/real")
        let first = try await MessageClient.connect(
            to: .service(name: "Pantry", type: Self.type, discovery: discovery), configuration: configuration(directory),
            logger: logger)
        #expect(first.channel?.peerIdentity?.fingerprint.full == realKey)
        await first.close()
        real.stop()
        _ = real.wait(timeout: .seconds(10))

        let (decoy, decoyPort, decoyKey) = try await echo("Decoy", identity: directory + "/impostor")
        defer { decoy.stop() }
        let short = String(realKey.prefix(16)).enumerated().map { $0.offset > 0 && $0.offset % 4 == 0 ? "-\($0.element)" : "\($0.element)" }
            .joined()
        let impostor = try Harness.spawn(
            onB: true, ["avahi-publish", "-s", "Pantry", Self.type, String(decoyPort), "proto=2", "fp=\(short)"])
        defer { impostor.stop() }
        try await impostor.waitForOutput("Established under name 'Pantry'")
        let realAgain: Background
        (realAgain, _, _) = try await echo("Pantry", identity: directory + "/real")
        defer { realAgain.stop() }
        #expect(realAgain.text.contains("published as Pantry #2"), "\(realAgain.text)")

        let second = try await MessageClient.connect(
            to: .service(name: "Pantry", type: Self.type, discovery: discovery), configuration: configuration(directory),
            logger: logger)
        let connectedKey = second.channel?.peerIdentity?.fingerprint.full
        #expect(connectedKey == realKey, "connected to \(connectedKey ?? "nothing"); the impostor is \(decoyKey)")
        let count = try await second.request("stats", type: "echo.stats", expecting: Int.self)
        #expect(count >= 1)
        let events = Collector(second.events)
        let (refusal, _) = try await events.wait(timeout: .seconds(5), "the impostor reported") {
            if case .waiting(let error) = $0 { error.code == .untrustedServer } else { false }
        }
        guard case .waiting(let error) = refusal else { return }
        #expect(error.message.contains("refused 'Pantry'"), "\(error.message)")
        #expect(error.message.contains("HAS CHANGED"), "\(error.message)")
        await second.close()
    }

    /// Only the impostor: the refusal is final after the browse timeout (as a key change always
    /// was), with the whole warning and what was looked for; with `keepsLookingForKnownKey` the
    /// client keeps looking and connects when the real server appears, however late.
    @Test func onlyAnImpostorIsFinalAfterTheBrowseTimeoutUnlessTheClientKeepsLooking() async throws {
        let directory = NSTemporaryDirectory() + "key-only-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        var (real, _, realKey) = try await echo("Larder", identity: directory + "/real")
        let first = try await MessageClient.connect(
            to: .service(name: "Larder", type: Self.type, discovery: discovery), configuration: configuration(directory),
            logger: logger)
        await first.close()
        real.stop()
        _ = real.wait(timeout: .seconds(10))
        let (impostor, _, _) = try await echo("Larder", identity: directory + "/impostor")

        var short = configuration(directory)
        short.browseTimeout = .seconds(3)
        let started = ContinuousClock.now
        await #expect {
            _ = try await MessageClient.connect(
                to: .service(name: "Larder", type: Self.type, discovery: discovery), configuration: short, logger: logger)
        } throws: { error in
            guard let error = error as? MessagingError, error.code == .untrustedServer else { return false }
            return error.message.contains("HAS CHANGED") && error.message.contains("No \(Self.type) service presented the key")
        }
        #expect(ContinuousClock.now - started >= .seconds(3))

        // An unattended client waits for the real key as long as it takes.
        var patient = configuration(directory, keepsLooking: true)
        patient.waitsForServer = true
        patient.reconnect = ReconnectPolicy(initialDelay: .milliseconds(200), maxDelay: .seconds(1))
        let waiting = try await MessageClient.connect(
            to: .service(name: "Larder", type: Self.type, discovery: discovery), configuration: patient, logger: logger)
        let events = Collector(waiting.events)
        try await events.wait(timeout: .seconds(15), "the impostor refused") {
            if case .waiting(let error) = $0 { error.code == .untrustedServer } else { false }
        }
        impostor.stop()
        _ = impostor.wait(timeout: .seconds(10))
        (real, _, _) = try await echo("Larder", identity: directory + "/real")
        defer { real.stop() }
        try await events.wait(timeout: .seconds(20), "connected to the real key") {
            if case .connected = $0 { true } else { false }
        }
        #expect(waiting.channel?.peerIdentity?.fingerprint.full == realKey)
        await waiting.close()
    }

    enum Forget: String, CaseIterable, Sendable { case api, handEdit }

    /// Issue 57, the app's flow: a client met the board under its old key; the board is reinstalled
    /// with a new key (same name). The client is refused with the key-change warning, which names
    /// the one thing that works; the user forgets the name — through `TrustStore.forget(name:)` or
    /// by removing its line from `known_peers` by hand — and the next connection is a first
    /// contact with the new key: both sides show the same comparison code, and the trust store and
    /// the peer memory hold the new key. (Before the fix the peer memory kept the old key as a
    /// trust anchor: refused for the whole browse timeout after `forget` returned true.)
    @Test(arguments: Forget.allCases)
    func aForgottenKeyIsAFirstContactAgain(_ how: Forget) async throws {
        let directory = NSTemporaryDirectory() + "key-forget-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        let name = "Board \(how.rawValue)"
        let store = TrustStore(path: directory + "/known_peers")
        var settings = configuration(directory)
        settings.browseTimeout = .seconds(3)
        func connect() async throws -> MessageClient {
            try await MessageClient.connect(
                to: .service(name: name, type: Self.type, discovery: discovery), configuration: settings, logger: logger)
        }

        let (old, _, oldKey) = try await echo(name, identity: directory + "/old")
        let first = try await connect()
        #expect(first.channel?.peerIdentity?.isFirstContact == true)
        #expect(first.channel?.peerIdentity?.fingerprint.full == oldKey)
        await first.close()
        old.stop()
        _ = old.wait(timeout: .seconds(10))

        // Reinstalled: a new key under the same name.
        let (new, _, newKey) = try await echo(name, identity: directory + "/new")
        defer { new.stop() }
        do {
            _ = try await connect()
            Issue.record("a changed key must be refused while the old one is known")
        } catch let error as MessagingError {
            logger.notice("the app's error after the key change: \(error.message)")  // (the lines a user sees)
            #expect(error.code == .untrustedServer)
            #expect(error.message.contains("HAS CHANGED"), "\(error.message)")
            #expect(error.message.contains("TrustStore.forget(name: \"\(name)\")"), "\(error.message)")
            #expect(error.message.contains("remove the line for '\(name)' from \(store.path)"), "\(error.message)")
        }

        switch how {
        case .api:
            #expect(try store.forget(name: name))
        case .handEdit:
            let text = try String(contentsOfFile: store.path, encoding: .utf8)
            let kept = text.split(separator: "\n").filter { !$0.hasSuffix(" \(name)") }.joined(separator: "\n") + "\n"
            try kept.write(toFile: store.path, atomically: true, encoding: .utf8)
        }

        let second = try await connect()
        let identity = try #require(second.channel?.peerIdentity)
        #expect(identity.isFirstContact, "a forgotten key makes the next connection a first contact")
        #expect(identity.fingerprint.full == newKey)
        // The server shows the same comparison code for this client (lanmsg-echo prints it).
        try await new.waitForOutput("comparison code \(identity.comparisonCode)")
        let serverLine = new.text.split(separator: "\n").last { $0.contains("comparison code") } ?? ""
        logger.notice(
            "after forgetting (\(how.rawValue)): first contact with key \(identity.fingerprint.full), comparison code \(identity.comparisonCode); the server says: \(serverLine)")
        #expect(store.fingerprint(for: name)?.full == newKey, "the new key is trusted now")
        let memory = PeerMemory.shared(path: directory + "/known_addresses")
        #expect(memory.entry(type: Self.type, name: name)?.fingerprint.full == newKey)
        _ = try await second.request("stats", type: "echo.stats", expecting: Int.self)
        await second.close()
    }
}
