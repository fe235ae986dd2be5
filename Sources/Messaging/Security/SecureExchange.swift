import Crypto
import FastJSON
import Locks
import Logging
import ProtocolCore
import Transport

/// Protocol version 2 on a fresh connection: the Noise handshake (``SecureHandshake``), the trust
/// decision (``TrustPolicy``), then the server's verdict — AUTH_OK or REFUSE, already encrypted —
/// and the hand-off to a new ``MessageChannel`` on the encrypted transport.
///
/// A server also recognises a version-1 client by its first byte (a v1 frame's length starts with
/// a zero byte; the v2 preamble with `L`): it serves it in version 1 when
/// ``ChannelSecurity/acceptsPlaintextPeers`` says so, and otherwise tells it why in a version-1
/// REFUSE. A client never falls back.
///
/// `@unchecked Sendable`: every mutable field is confined to the connection's loop.
final class SecureExchange: ConnectionHandler, @unchecked Sendable {
    private enum Phase {
        case detecting([UInt8])
        case handshaking
        case awaitingVerdict(ProvenPeer)
        case done
    }

    private enum Outcome: Sendable {
        case channel(MessageChannel)
        case plaintextPeer([UInt8])
    }

    private let driver: ConnectionDriver
    private let role: SecureHandshake.Role
    private let configuration: ChannelConfiguration
    private let policy: TrustPolicy
    private var machine: SecureHandshake
    private var phase: Phase
    /// The channel (or a version-1 peer), or why there is none: completed on the loop, awaited by
    /// ``run()``.
    private let result = Promise<Outcome>()
    /// The trust decision, made inside the handshake (``SecureHandshake/Settings/verify``).
    private let decision = Locked<PeerIdentity?>(nil)

    init(driver: ConnectionDriver, role: SecureHandshake.Role, configuration: ChannelConfiguration) throws {
        let resolved: (Identity, TrustPolicy)?
        do {
            resolved = try configuration.security.resolved(server: role == .server)
        } catch {
            driver.queue.async { driver.tearDown(.localClose) }
            throw error
        }
        guard let (identity, policy) = resolved else {
            preconditionFailure("SecureExchange needs an encrypted configuration")
        }
        self.driver = driver
        self.role = role
        self.configuration = configuration
        self.policy = policy
        let decision = self.decision
        let validator = role == .server ? configuration.helloValidator : nil
        let expectedName = role == .client ? configuration.expectedPeerName : nil
        let known = policy.knownPeers()  // read here, off the loop the handshake runs on
        let settings = SecureHandshake.Settings(
            info: configuration.peerInfo(version: 2),
            maxFrameSize: configuration.connection.maxFrameSize, staticKey: identity.privateKey,
            preSharedKey: configuration.preSharedKey.map { Self.noisePSK($0) },
            verify: { peer in
                let fingerprint = Fingerprint(publicKey: peer.publicKey)
                let code = SecureProtocol.comparisonCode(handshakeHash: peer.handshakeHash)
                switch policy.evaluate(
                    name: expectedName ?? peer.info.name, fingerprint: fingerprint, code: code, known: known)
                {
                case .success(let identity):
                    // The app's own check of the hello (as in version 1), after the key's.
                    if let refusal = validator?(peer.info) { return "refused peer '\(peer.info.name)': \(refusal)" }
                    decision.withLock { $0 = identity }
                    return nil
                case .failure(let error):
                    return error.message
                }
            })
        // The ephemeral key is made here, in the connecting or accepting task, not on the
        // connection's loop where the handshake runs (docs/PERFORMANCE.md, "Encryption").
        machine = try SecureHandshake(role: role, settings: settings, ephemeral: Curve25519.KeyAgreement.PrivateKey())
        phase = role == .server ? .detecting([]) : .handshaking
    }

    /// The 32-byte Noise PSK of a configured key: SHA-256 of the key's bytes (a key file's trimmed
    /// content, as in version 1), so any key length maps to the 32 bytes `XXpsk3` needs.
    static func noisePSK(_ key: PreSharedKey) -> [UInt8] {
        var hasher = SHA256()
        hasher.update(data: Array("lanmsg psk v2".utf8))
        hasher.update(data: key.keyBytes)
        return Array(hasher.finalize())
    }

    func run() async throws -> MessageChannel {
        driver.queue.async {
            self.driver.startRaw(handler: self)
            self.driver.setDeadline(.handshake, at: self.driver.now &+ self.configuration.helloTimeout.nanoseconds)
            if self.role == .client { self.driver.sendRaw(self.machine.start().bytes) }
        }
        switch try await result.value() {
        case .channel(let channel):
            // Trust on first use writes the new key here, in the caller's task: a file write and
            // fsync do not belong on the connection's loop.
            if let identity = channel.peerIdentity {
                do {
                    try policy.remember(identity)
                } catch {
                    driver.logger.warning("cannot remember the key of '\(identity.name)': \(error.message)")
                }
            }
            return channel
        case .plaintextPeer(let leftover):
            return try await HelloExchange(driver: driver, role: .server, configuration: configuration)
                .run(adopting: leftover)
        }
    }

    // MARK: Events (on the loop)

    func connection(_ connection: ConnectionDriver, receivedBytes bytes: [UInt8]) {
        connection.assertOnLoop("SecureExchange")
        switch phase {
        case .detecting(var buffered):
            buffered += bytes
            guard let first = buffered.first else { return }
            if first == SecureProtocol.preamble[0] {
                phase = .handshaking
                handshake(buffered)
            } else {
                plaintextPeer(buffered)
            }
        case .handshaking:
            handshake(bytes)
        case .awaitingVerdict, .done:
            break  // raw input ends with the handshake
        }
    }

    func connection(_ connection: ConnectionDriver, received frame: Frame) {
        connection.assertOnLoop("SecureExchange")
        guard case .awaitingVerdict(let peer) = phase else { return }
        switch frame.kind {
        case .authOK:
            succeed(peer)
        case .refuse:
            let refusal =
                (try? FastJSONDecoder().decode(Refusal.self, from: frame.payload))
                ?? Refusal(code: "unknown", message: String(decoding: frame.payload.prefix(500), as: UTF8.self))
            let text = "the server refused the connection: \(refusal.message)"
            driver.logger.warning("\(text)")
            // The code says which error: a bad hello, another version or the server's policy.
            fail(refusal.error(text))
        default:
            let text = "expected AUTH_OK or REFUSE after the encrypted handshake, got frame kind \(frame.kind)"
            fail(TransportError(.helloFailed, text, closeReason: .protocolError(text)))
        }
    }

    func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) {
        connection.assertOnLoop("SecureExchange")
        guard kind == .handshake else { return }
        let text =
            "the encrypted handshake did not complete within \(configuration.helloTimeout) "
            + "(the peer is slow, or does not speak protocol version 2)"
        fail(TransportError(.helloFailed, text, closeReason: .helloFailed(text)), atOnce: true)
    }

    func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
        connection.assertOnLoop("SecureExchange")
        if case .done = phase { return }
        let text: String
        switch (role, phase) {
        case (.client, .handshaking):
            text =
                "the server closed the connection during the encrypted handshake (\(reason)): it may speak only "
                + "plaintext protocol version 1 (then both sides must be configured with .plaintext), or it "
                + "refused this side's key or pre-shared key — see the server's log"
        case (_, .awaitingVerdict):
            text =
                configuration.preSharedKey != nil
                ? "the server closed the connection after the handshake without accepting it (\(reason)): "
                    + "its pre-shared key differs from this side's key (both sides need the same key file)"
                : "the server closed the connection after the handshake without accepting it (\(reason)): "
                    + "it is shutting down or at its connection limit — see the server's log"
        default:
            text = "the connection closed during the encrypted handshake (\(reason))"
        }
        fail(TransportError(.helloFailed, text, closeReason: reason))
    }

    // MARK: Steps

    private func handshake(_ bytes: [UInt8]) {
        let output = machine.receive(bytes)
        if !output.bytes.isEmpty { driver.sendRaw(output.bytes) }
        guard let outcome = output.outcome else { return }
        switch outcome {
        case .success(let peer):
            guard let transport = makeTransport() else { return }
            driver.beginEncryption(transport, leftover: machine.leftover)
            if role == .server {
                driver.enqueue(Frame(kind: .authOK), bypassLimit: true) { _ in }
                succeed(peer)
            } else {
                phase = .awaitingVerdict(peer)
            }
        case .failure(let error):
            // Thrown to the caller, which says it (a MessageServer as a summary: RefusalLog).
            driver.logger.debug("\(error.message)")
            // A server that read the whole handshake (it refused the client's key) says why,
            // encrypted; otherwise there is no channel to say it on.
            if role == .server, let (send, receive) = try? machine.transport() {
                driver.beginEncryption(SecureTransport(send: send, receive: receive), leftover: [])
                // The code says which: a hello that breaks the spec, another version, or the
                // server's policy (docs/PROTOCOL.md, "Verdict").
                let code =
                    switch error.code {
                    case .helloFailed: "bad_hello"
                    case .versionMismatch: "version_mismatch"
                    default: "refused"  // untrustedKey: the policy refused the client's key or hello
                    }
                let refusal = Refusal(code: code, message: error.message)
                driver.enqueue(HandshakeStateMachine.jsonFrame(.refuse, refusal), bypassLimit: true) { _ in }
            }
            fail(error)
        }
    }

    private func makeTransport() -> SecureTransport? {
        do {
            let (send, receive) = try machine.transport()
            return SecureTransport(send: send, receive: receive)
        } catch {
            fail(error)
            return nil
        }
    }

    /// The first bytes are not the version-2 preamble: a version-1 client.
    private func plaintextPeer(_ buffered: [UInt8]) {
        if configuration.security.acceptsPlaintextPeers {
            driver.setDeadline(.handshake, at: nil)
            phase = .done
            result.succeed(.plaintextPeer(buffered))
            return
        }
        let text =
            "this server requires protocol version 2 (encrypted and authenticated); the client spoke the "
            + "plaintext version 1. Upgrade the client, or configure the server to accept plaintext peers."
        driver.beginFrames(leftover: [])
        driver.enqueue(
            HandshakeStateMachine.jsonFrame(.refuse, Refusal(code: "version_mismatch", message: text)), bypassLimit: true
        ) { _ in }
        driver.logger.debug("refused a plaintext (version 1) client: \(text)")  // thrown below
        fail(TransportError(.versionMismatch, text, closeReason: .helloFailed(text)))
    }

    private func succeed(_ peer: ProvenPeer) {
        driver.setDeadline(.handshake, at: nil)
        phase = .done
        let identity = decision.withLock { $0 }
        if let identity {
            driver.logger.debug(
                "encrypted channel with '\(peer.info.name)' (\(identity.fingerprint), code \(identity.comparisonCode))")
        }
        let established = HandshakeStateMachine.Established(peer: peer.info, peerMaxFrameSize: peer.maxFrameSize)
        let channel = MessageChannel(
            driver: driver, established: established, configuration: configuration, identity: identity,
            awaitsSession: role == .server && configuration.offersSessions && peer.info.sessions)
        channel.activate()
        result.succeed(.channel(channel))
    }

    private func fail(_ error: TransportError, atOnce: Bool = false) {
        driver.setDeadline(.handshake, at: nil)
        phase = .done
        if atOnce {
            driver.tearDown(error.closeReason ?? .localClose)
        } else if !driver.isClosed {
            driver.closeGracefully(reason: error.closeReason)
        }
        result.fail(error)
    }
}
