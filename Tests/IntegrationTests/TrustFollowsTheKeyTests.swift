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
}
