import Foundation
import Messaging
import TestWaits
import Testing

/// Version 2 across the veth link between the two hosts: what a capture of the link holds, and what
/// a relay in the middle (terminating both sides with its own key) gets under each trust policy.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct EncryptionOnTheLinkTests {
    let logger = Harness.logger("encryption-test")
    static let hostB = "10.77.0.2"

    func startEcho(_ name: String, port: UInt16, _ extra: [String] = []) async throws -> (Background, String?) {
        let server = try Harness.spawn(
            onB: true,
            [Harness.binary("lanmsg-echo"), "--name", name, "--type", "_itest-link._tcp", "--port", String(port),
                "--identity", NSTemporaryDirectory() + "link-itest-\(UUID().uuidString)/identity"] + extra)
        try await server.waitForOutput("published as")
        let fingerprint = server.text.split(separator: "\n").first { $0.hasPrefix("fingerprint ") }
            .map { String($0.dropFirst("fingerprint ".count)) }
        return (server, fingerprint)
    }

    func configuration(_ security: ChannelSecurity, psk: String? = nil) -> ChannelConfiguration {
        var configuration = ChannelConfiguration(name: "link-client")
        configuration.security = security
        if let psk { configuration.preSharedKey = try! PreSharedKey(bytes: Array(psk.utf8)) }
        return configuration
    }

    func connect(port: UInt16, host: String = hostB, _ configuration: ChannelConfiguration) async throws -> MessageChannel {
        try await MessageChannel.connect(
            to: [try SocketAddress(ipAddress: host, port: port)], configuration: configuration, logger: logger)
    }

    @Test func aCaptureOfTheLinkHoldsNoPlaintextOfAnEncryptedConnection() async throws {
        let folder = NSTemporaryDirectory() + "link-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let pcap = folder + "/link.pcap"
        let written = try DirectoryWatch([folder])
        // tcpdump in host b's network namespace (host a's file system), on b's end of the veth link;
        // each packet handed over and written as it comes (--immediate-mode, -U).
        let capture = try Background([
            "nsenter", "-t", Harness.hostBPID, "-n", "--", "tcpdump", "-i", "vb", "--immediate-mode", "-U", "-s", "0", "-w", pcap,
            "tcp portrange 47311-47312",
        ])
        defer { capture.stop() }
        try await capture.waitForOutput("listening on", timeout: .seconds(15))

        let (encrypted, _) = try await startEcho("Capture Echo", port: 47311)
        defer { encrypted.stop() }
        let (plaintext, _) = try await startEcho("Capture Plain Echo", port: 47312, ["--security", "plaintext"])
        defer { plaintext.stop() }

        let secret = "capture-marker-\(UUID().uuidString.prefix(8))"
        let control = "control-marker-\(UUID().uuidString.prefix(8))"
        let secure = try await connect(port: 47311, configuration(.encrypted(identity: .ephemeral(), trust: .anyKey)))
        #expect(try await secure.requestRaw(Array(secret.utf8), type: "echo").payload == Array(secret.utf8))
        secure.close()
        _ = await secure.closed()
        let clear = try await connect(port: 47312, configuration(.plaintext))
        #expect(try await clear.requestRaw(Array(control.utf8), type: "echo").payload == Array(control.utf8))
        clear.close()
        _ = await clear.closed()

        // The control proves the capture saw the traffic: the plaintext connection's marker, both
        // ways, in the file — waited for (woken by tcpdump's writes), then the capture stopped. (Stopped
        // at once, before the harness gave children their default SIGTERM, it was stopped 5 s later.)
        let captured = { (try? [UInt8](Data(contentsOf: URL(fileURLWithPath: pcap)))) ?? [] }
        try await waitUntil("the plaintext control in the capture, both ways", timeout: .seconds(15), wokenBy: written.changes) {
            Self.count(of: control, in: captured()) >= 2
        }
        capture.stop()
        let bytes = captured()
        #expect(Self.count(of: control, in: bytes) >= 2, "the capture missed the plaintext control (\(bytes.count) bytes)")
        #expect(Self.count(of: secret, in: bytes) == 0, "the encrypted marker travelled in plaintext")
        #expect(Self.count(of: "Capture Echo", in: bytes) == 0, "the server's hello travelled in plaintext")
        #expect(Self.count(of: "LANMSG/2", in: bytes) >= 1, "the version-2 preamble (the one plaintext part)")
        print("MEASURED capture of the link: \(bytes.count) bytes, encrypted marker found 0 times, plaintext control \(Self.count(of: control, in: bytes)) times")
    }

    /// A relay on host a with its own key pair, accepting the victim's connection as if it were the
    /// server (same name); it can reach the real server itself.
    func startRelay(psk: String? = nil) async throws -> (MessageServer, UInt16) {
        var configuration = ServerConfiguration(serviceType: "_itest-link._tcp", serviceName: "Relay Echo", peerName: "MITM Echo")
        configuration.publish = false
        configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        if let psk { configuration.channel.preSharedKey = try PreSharedKey(bytes: Array(psk.utf8)) }
        let relay = MessageServer(configuration: configuration, discovery: nil, logger: logger)
        try await relay.start()
        return (relay, try #require(relay.port))
    }

    @Test func aRelayInTheMiddleIsRefusedUnderPinnedTrustOnFirstUseAndPreSharedKey() async throws {
        let directory = NSTemporaryDirectory() + "mitm-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (echo, fingerprintText) = try await startEcho("MITM Echo", port: 47313)
        defer { echo.stop() }
        let realFingerprint = try #require(fingerprintText.flatMap(Fingerprint.init))
        let (relay, relayPort) = try await startRelay()
        defer { Task { await relay.stop() } }
        let me = Identity.ephemeral()

        // Trust on first use, after a first contact with the real server: the relay's key is refused.
        let store = TrustStore(path: directory + "/known_peers")
        let tofu = configuration(.encrypted(identity: me, trust: .trustOnFirstUse(store)))
        let first = try await connect(port: 47313, tofu)
        #expect(first.peerIdentity?.fingerprint == realFingerprint)
        first.close()
        do {
            _ = try await connect(port: relayPort, host: "10.77.0.1", tofu)
            Issue.record("the relay was accepted under trust on first use")
        } catch let error as TransportError {
            #expect(error.message.contains("HAS CHANGED"), "\(error.message)")
        }

        // Pinned to the real server's fingerprint: the relay is refused, the real server accepted.
        let pinned = configuration(.encrypted(identity: me, trust: .pinned([realFingerprint])))
        await #expect(throws: TransportError.self) { _ = try await connect(port: relayPort, host: "10.77.0.1", pinned) }
        let direct = try await connect(port: 47313, pinned)
        direct.close()

        // "Any key" (unauthenticated, by explicit choice): the relay gets in, and the victim sees the
        // relay's key, not the server's: this is what the policy means, and why it is never a default.
        let anyKey = configuration(.encrypted(identity: me, trust: .anyKey))
        let fooled = try await connect(port: relayPort, host: "10.77.0.1", anyKey)
        #expect(fooled.peerIdentity?.fingerprint != realFingerprint)
        fooled.close()

        // A pre-shared key the relay does not hold: the victim's handshake with it fails.
        try "the key of the keyed echo\n".write(toFile: directory + "/key", atomically: true, encoding: .utf8)
        let (keyed, _) = try await startEcho("MITM Keyed Echo", port: 47314, ["--key-file", directory + "/key"])
        defer { keyed.stop() }
        let withKey = configuration(.encrypted(identity: me, trust: .anyKey), psk: "the key of the keyed echo")
        let real = try await connect(port: 47314, withKey)
        real.close()
        await #expect(throws: TransportError.self) { _ = try await connect(port: relayPort, host: "10.77.0.1", withKey) }
    }

    static func count(of needle: String, in haystack: [UInt8]) -> Int {
        let bytes = Array(needle.utf8)
        guard haystack.count >= bytes.count else { return 0 }
        var found = 0
        var start = 0
        while start <= haystack.count - bytes.count {
            if haystack[start] == bytes[0] && Array(haystack[start..<(start + bytes.count)]) == bytes {
                found += 1
                start += bytes.count
            } else {
                start += 1
            }
        }
        return found
    }
}
