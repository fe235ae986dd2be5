import Crypto
import FastJSON

/// Protocol version 2's constants (docs/PROTOCOL.md, "Version 2").
package enum SecureProtocol {
    /// What a version-2 client sends first, before the Noise handshake: `LANMSG/2`.
    package static let preamble: [UInt8] = Array("LANMSG/2".utf8)
    /// The Noise prologue: binds the handshake to this protocol and its preamble.
    package static let prologue: [UInt8] = Array("lanmsg v2 ".utf8) + preamble
    /// The largest Noise message (its 2-byte length prefix not included).
    package static let maxMessage = 65_535
    /// The most plaintext one transport message carries (the message minus the 16-byte tag).
    package static let maxPlaintext = maxMessage - 16
    /// Each direction's cipher is rekeyed after every this many transport messages (section 11.3);
    /// both sides count, so they rekey at the same message.
    package static let rekeyInterval: UInt64 = 1 << 16

    package static func protocolName(preSharedKey: Bool) -> String {
        preSharedKey ? "Noise_XXpsk3_25519_ChaChaPoly_SHA256" : "Noise_XX_25519_ChaChaPoly_SHA256"
    }

    /// The 6-digit code both sides show for a first contact: derived from the handshake hash, so a
    /// relay in the middle (which has a different hash on each side) shows two different codes.
    package static func comparisonCode(handshakeHash: [UInt8]) -> String {
        var hasher = SHA256()
        hasher.update(data: Array("lanmsg comparison code".utf8))
        hasher.update(data: handshakeHash)
        let digest = Array(hasher.finalize())
        let value = (UInt32(digest[0]) << 24 | UInt32(digest[1]) << 16 | UInt32(digest[2]) << 8 | UInt32(digest[3])) % 1_000_000
        let digits = String(value)
        let padded = String(repeating: "0", count: 6 - digits.count) + digits
        return "\(padded.prefix(3)) \(padded.suffix(3))"
    }
}

/// A peer as the version-2 handshake proves it: its static public key, and what it said about itself.
package struct ProvenPeer: Sendable, Equatable {
    package let publicKey: [UInt8]
    package let info: PeerInfo
    package let maxFrameSize: Int
    /// The handshake hash after message 2, the same on both sides (for
    /// ``SecureProtocol/comparisonCode(handshakeHash:)``).
    package let handshakeHash: [UInt8]
}

/// The version-2 handshake without I/O: the client sends the preamble and Noise `XX` (or `XXpsk3`
/// with a pre-shared key) message 1; the server answers message 2 with its hello; the client
/// checks the server's key (``Settings/verify``) and sends message 3 with its hello; the server
/// checks the client's. Each Noise message travels with a 2-byte big-endian length.
///
/// Feed it the bytes that arrive (``receive(_:)``), send the bytes it returns. When it reports the
/// peer, the transport ciphers are ready (``transport()``); bytes that arrived after the last
/// handshake message are in ``leftover``.
package struct SecureHandshake: Sendable {
    package enum Role: Sendable { case client, server }

    package struct Settings: @unchecked Sendable {
        // @unchecked Sendable: the Curve25519 private key is an immutable value; the rest is Sendable.
        package var info: PeerInfo
        package var maxFrameSize: Int
        package var staticKey: Curve25519.KeyAgreement.PrivateKey
        /// 32 bytes: selects `XXpsk3`; both sides must have the same.
        package var preSharedKey: [UInt8]?
        /// Whether this side accepts the peer (its proven key and hello); a refusal text ends the
        /// handshake. Called once, when the peer's key is known.
        package var verify: @Sendable (ProvenPeer) -> String?

        package init(
            info: PeerInfo, maxFrameSize: Int, staticKey: Curve25519.KeyAgreement.PrivateKey,
            preSharedKey: [UInt8]? = nil, verify: @escaping @Sendable (ProvenPeer) -> String? = { _ in nil }
        ) {
            self.info = info
            self.maxFrameSize = maxFrameSize
            self.staticKey = staticKey
            self.preSharedKey = preSharedKey
            self.verify = verify
        }
    }

    /// What happened after an event.
    package struct Output: Sendable {
        /// Raw bytes to send (preamble, length-prefixed Noise messages).
        package var bytes: [UInt8] = []
        /// Set once the handshake is over: the proven peer, or why it failed.
        package var outcome: Result<ProvenPeer, TransportError>?
    }

    package let role: Role
    private let settings: Settings
    private var noise: NoiseHandshake
    private var buffer: [UInt8] = []
    private var sawPreamble: Bool
    private var done = false
    /// The handshake hash right after message 2, which both sides know before either checks the
    /// other: what the comparison code is derived from.
    private var messageTwoHash: [UInt8] = []
    /// Bytes that arrived after the handshake's last message (the first transport messages).
    package private(set) var leftover: [UInt8] = []

    package init(role: Role, settings: Settings, ephemeral: Curve25519.KeyAgreement.PrivateKey? = nil) throws(TransportError) {
        self.role = role
        self.settings = settings
        sawPreamble = role == .client
        let psk = settings.preSharedKey != nil
        do {
            noise = try NoiseHandshake(
                pattern: psk ? .XXpsk3 : .XX, role: role == .client ? .initiator : .responder,
                protocolName: SecureProtocol.protocolName(preSharedKey: psk), prologue: SecureProtocol.prologue,
                localStatic: settings.staticKey, localEphemeral: ephemeral,
                psks: settings.preSharedKey.map { [$0] } ?? [])
        } catch {
            throw TransportError(.invalidArgument, "cannot start the encrypted handshake: \(error)")
        }
    }

    /// The connection is open: a client sends the preamble and message 1.
    package mutating func start() -> Output {
        guard role == .client else { return Output() }
        return step { machine throws(NoiseError) in
            try SecureProtocol.preamble + Self.handshakeFramed(machine.noise.writeMessage(payload: []))
        }
    }

    /// Bytes arrived from the peer.
    package mutating func receive(_ bytes: some Collection<UInt8>) -> Output {
        guard !done else {
            leftover += bytes
            return Output()
        }
        buffer += bytes
        if !sawPreamble {
            guard buffer.count >= SecureProtocol.preamble.count else { return Output() }
            guard Array(buffer.prefix(SecureProtocol.preamble.count)) == SecureProtocol.preamble else {
                return fail(.protocolViolation, "the peer did not start with the version-2 preamble")
            }
            buffer.removeFirst(SecureProtocol.preamble.count)
            sawPreamble = true
        }
        var output = Output()
        while !done, buffer.count >= 2 {
            let length = Int(buffer[0]) << 8 | Int(buffer[1])
            guard buffer.count >= 2 + length else { break }
            let message = Array(buffer[2..<(2 + length)])
            buffer.removeFirst(2 + length)
            let step = handle(message)
            output.bytes += step.bytes
            if let outcome = step.outcome { output.outcome = outcome }
        }
        if done {
            leftover = buffer
            buffer = []
        }
        return output
    }

    /// The transport ciphers, once the handshake succeeded.
    package func transport() throws(TransportError) -> (send: NoiseCipherState, receive: NoiseCipherState) {
        do {
            return try noise.split()
        } catch {
            throw TransportError(.helloFailed, "the handshake is not complete")
        }
    }

    // MARK: Steps

    private mutating func handle(_ message: [UInt8]) -> Output {
        let payload: [UInt8]
        do {
            payload = try noise.readMessage(message)
        } catch {
            let hint =
                settings.preSharedKey != nil
                ? " (with a pre-shared key: both sides must have the same key)" : ""
            return fail(.authenticationFailed, "the encrypted handshake failed: \(error)\(hint)")
        }
        switch (role, noise.isComplete) {
        case (.server, false):
            // Message 1 read. Its payload is empty (docs/PROTOCOL.md): anything else is another
            // protocol, or a peer probing what it can slip in before it is known.
            guard payload.isEmpty else {
                return fail(
                    .protocolViolation,
                    "the client's handshake message 1 carried a \(payload.count)-byte payload; version 2 sends it empty")
            }
            // Answer with message 2 carrying our hello.
            return step { machine throws(NoiseError) in
                let message = try Self.handshakeFramed(machine.noise.writeMessage(payload: machine.hello()))
                machine.messageTwoHash = machine.noise.handshakeHash
                return message
            }
        case (.client, false):
            // Message 2 read: the server's hello and proven key. Check them, then send message 3.
            messageTwoHash = noise.handshakeHash
            switch prove(payload) {
            case .failure(let error): return Output(outcome: .failure(error))
            case .success(let server):
                var output = step { machine throws(NoiseError) in
                    try Self.handshakeFramed(machine.noise.writeMessage(payload: machine.hello()))
                }
                if output.outcome == nil {
                    done = true
                    output.outcome = .success(
                        ProvenPeer(
                            publicKey: server.publicKey, info: server.info, maxFrameSize: server.maxFrameSize,
                            handshakeHash: messageTwoHash))
                }
                return output
            }
        case (.server, true):
            // Message 3 read: the client's hello and proven key.
            switch prove(payload) {
            case .failure(let error): return Output(outcome: .failure(error))
            case .success(let client):
                done = true
                return Output(outcome: .success(client))
            }
        case (.client, true):
            return fail(.protocolViolation, "an extra handshake message")
        }
    }

    /// Decodes the peer's hello from a handshake payload and asks ``Settings/verify``.
    private mutating func prove(_ payload: [UInt8]) -> Result<ProvenPeer, TransportError> {
        guard let key = noise.remoteStatic else {
            done = true
            return .failure(TransportError(.helloFailed, "the peer sent no static key"))
        }
        let hello: HelloPayload
        do {
            hello = try FastJSONDecoder().decode(HelloPayload.self, from: payload)
        } catch {
            done = true
            let text = "malformed hello in the encrypted handshake: \(error)"
            return .failure(TransportError(.helloFailed, text, closeReason: .protocolError(text)))
        }
        guard hello.version == 2 else {
            done = true
            let text = "the peer's hello says version \(hello.version) inside a version-2 handshake"
            return .failure(TransportError(.versionMismatch, text, closeReason: .helloFailed(text)))
        }
        if let problem = hello.problem {
            done = true
            let text = "malformed hello in the encrypted handshake: \(problem)"
            return .failure(TransportError(.helloFailed, text, closeReason: .protocolError(text)))
        }
        let proven = ProvenPeer(
            publicKey: key, info: hello.info, maxFrameSize: hello.maxFrame ?? HandshakeStateMachine.defaultMaxFrameSize,
            handshakeHash: messageTwoHash)
        if let refusal = settings.verify(proven) {
            done = true
            return .failure(TransportError(.untrustedKey, refusal, closeReason: .helloFailed(refusal)))
        }
        return .success(proven)
    }

    private func hello() -> [UInt8] {
        var hello = HelloPayload(settings.info)
        hello.version = 2
        hello.maxFrame = settings.maxFrameSize
        return (try? FastJSONEncoder().encode(hello)) ?? []
    }

    private mutating func step(_ body: (inout SecureHandshake) throws(NoiseError) -> [UInt8]) -> Output {
        do {
            return Output(bytes: try body(&self))
        } catch {
            return fail(.helloFailed, "the encrypted handshake failed: \(error)")
        }
    }

    private mutating func fail(_ code: TransportError.Code, _ text: String) -> Output {
        done = true
        return Output(outcome: .failure(TransportError(code, text, closeReason: .helloFailed(text))))
    }

    /// A handshake message with its length; one that does not fit (a huge hello) is an error.
    static func handshakeFramed(_ message: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard message.count <= SecureProtocol.maxMessage else {
            throw NoiseError(
                "this side's hello makes a handshake message of \(message.count) bytes, more than "
                    + "\(SecureProtocol.maxMessage); send less metadata")
        }
        return framed(message)
    }

    static func framed(_ message: [UInt8]) -> [UInt8] {
        // Truncating: an oversized handshake message is refused by step() before it is sent.
        [UInt8(truncatingIfNeeded: message.count >> 8), UInt8(truncatingIfNeeded: message.count)] + message
    }
}

/// The transport of version 2, without I/O: plaintext in, length-prefixed ChaChaPoly messages out,
/// and back. Each direction rekeys every ``SecureProtocol/rekeyInterval`` messages.
package struct SecureTransport: Sendable {
    private var sendCipher: NoiseCipherState
    private var receiveCipher: NoiseCipherState
    private var inbound: [UInt8] = []
    private var inboundStart = 0

    package init(send: NoiseCipherState, receive: NoiseCipherState) {
        sendCipher = send
        receiveCipher = receive
    }

    /// Encrypts up to ``SecureProtocol/maxPlaintext`` bytes into one message, length prefix included.
    package mutating func seal(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        var out: [UInt8] = []
        try seal(plaintext[...], into: &out)
        return out
    }

    /// Encrypts up to ``SecureProtocol/maxPlaintext`` bytes into one message appended to `out`,
    /// length prefix included.
    package mutating func seal(_ plaintext: ArraySlice<UInt8>, into out: inout [UInt8]) throws(NoiseError) {
        precondition(plaintext.count <= SecureProtocol.maxPlaintext)
        if sendCipher.nonce > 0 && sendCipher.nonce % SecureProtocol.rekeyInterval == 0 { sendCipher.rekey() }
        let length = plaintext.count + 16
        out.append(UInt8(truncatingIfNeeded: length >> 8))
        out.append(UInt8(truncatingIfNeeded: length))
        try sendCipher.encrypt(ad: [], plaintext, appendingTo: &out)
    }

    /// Takes received bytes; returns the plaintext of every complete message among them.
    /// - Throws: ``NoiseError`` when a message fails authentication: close the connection.
    package mutating func open(_ bytes: some Collection<UInt8>) throws(NoiseError) -> [UInt8] {
        if inboundStart > 0 && inboundStart == inbound.count {
            inbound.removeAll(keepingCapacity: true)
            inboundStart = 0
        }
        inbound.append(contentsOf: bytes)
        var plaintext: [UInt8] = []
        while inbound.count - inboundStart >= 2 {
            let length = Int(inbound[inboundStart]) << 8 | Int(inbound[inboundStart + 1])
            guard inbound.count - inboundStart >= 2 + length else { break }
            let message = inbound[(inboundStart + 2)..<(inboundStart + 2 + length)]
            inboundStart += 2 + length
            if receiveCipher.nonce > 0 && receiveCipher.nonce % SecureProtocol.rekeyInterval == 0 {
                receiveCipher.rekey()
            }
            try receiveCipher.decrypt(ad: [], message, appendingTo: &plaintext)
        }
        if inboundStart > 65_536 {
            inbound.removeSubrange(0..<inboundStart)
            inboundStart = 0
        }
        return plaintext
    }

    /// Transport messages sealed and opened so far (each direction's nonce).
    package var messageCounts: (sent: UInt64, received: UInt64) { (sendCipher.nonce, receiveCipher.nonce) }

    /// Received bytes of an incomplete message.
    package var pendingBytes: Int { inbound.count - inboundStart }
}
