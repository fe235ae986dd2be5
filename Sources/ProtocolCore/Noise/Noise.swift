import CLanmsgAEAD
import Crypto

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Why a Noise operation failed. Any of them ends the connection.
package struct NoiseError: Error, Sendable, Equatable, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// A 32-byte ChaChaPoly key in its own allocation (the object's tail: one allocation of 48
/// bytes), wiped when the last reference goes.
package final class CipherKey: ManagedBuffer<Void, UInt8> {

    static func make(_ key: some Collection<UInt8>) -> CipherKey {
        precondition(key.count == 32, "a ChaChaPoly key is 32 bytes")
        let made = unsafeDowncast(CipherKey.create(minimumCapacity: 32) { _ in () }, to: CipherKey.self)
        made.withUnsafeMutablePointerToElements { bytes in
            _ = UnsafeMutableBufferPointer(start: bytes, count: 32).initialize(from: key)
        }
        return made
    }

    deinit {
        withUnsafeMutablePointerToElements { lanmsg_wipe($0, 32) }
    }

    /// The key's bytes: valid while this object lives (callers hold it through their cipher
    /// state, which keeps it until it is replaced).
    var pointer: UnsafePointer<UInt8> { withUnsafeMutablePointerToElements { UnsafePointer($0) } }
}

/// The Noise protocol's `CipherState` with ChaChaPoly (section 5.1): a key and a 64-bit nonce,
/// incremented after every message and never reused.
///
/// The AEAD is libcrypto's (OpenSSL 3, through `CLanmsgAEAD`), which seals from and opens into the
/// caller's buffers: the transport's bulk path makes no intermediate copies (docs/PERFORMANCE.md,
/// "Encryption"). The handshake's hashing, HKDF and X25519 stay with swift-crypto.
package struct NoiseCipherState: @unchecked Sendable {
    // @unchecked Sendable: `key`'s bytes are written once, when made, and only read afterwards
    // (ManagedBuffer, which it is, opts out of Sendable).
    private var key: CipherKey?
    /// The nonce of the next message.
    package private(set) var nonce: UInt64 = 0
    /// 2⁶⁴ − 1 is reserved (section 5.1): a cipher that reaches it refuses to go on.
    private static let maxNonce = UInt64.max

    package init(key: [UInt8]? = nil) {
        self.key = key.map { CipherKey.make($0) }
    }

    package var hasKey: Bool { key != nil }

    /// Section 5.1's SetNonce: the next message uses `nonce`. Both ends of a transport must agree;
    /// tests use it to reach a rekey point (``SecureProtocol/rekeyInterval``) without sending
    /// 65,536 messages first.
    package mutating func setNonce(_ nonce: UInt64) { self.nonce = nonce }

    private func checkedKey() throws(NoiseError) -> CipherKey {
        guard let key else { throw NoiseError("no key") }
        guard nonce < Self.maxNonce else { throw NoiseError("the cipher's nonces are exhausted; reconnect") }
        return key
    }

    /// Encrypts `plaintext` with `ad`; without a key, returns `plaintext` (section 5.1).
    package mutating func encrypt(ad: [UInt8], _ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard key != nil else { return plaintext }
        var out = [UInt8]()
        out.reserveCapacity(plaintext.count + 16)
        try encrypt(ad: ad, plaintext[...], appendingTo: &out)
        return out
    }

    /// Encrypts `plaintext` and appends ciphertext and tag to `out`. Needs a key.
    package mutating func encrypt(
        ad: [UInt8], _ plaintext: ArraySlice<UInt8>, appendingTo out: inout [UInt8]
    ) throws(NoiseError) {
        let key = try checkedKey()
        let start = out.count
        ZeroBytes.append(plaintext.count + 16, to: &out)
        let status = plaintext.withUnsafeBytes { source in
            out.withUnsafeMutableBytes { destination in
                var span = lanmsg_span(base: source.baseAddress?.assumingMemoryBound(to: UInt8.self), length: source.count)
                return withUnsafePointer(to: &span) {
                    Self.seal(key, nonce, ad, UnsafeBufferPointer(start: $0, count: 1), into: destination.baseAddress! + start)
                }
            }
        }
        guard status == 0 else {
            out.removeSubrange(start...)
            throw NoiseError("encryption failed (libcrypto)")
        }
        nonce += 1
    }

    /// Seals the concatenation of `spans` (with `ad`) into `out`: the ciphertext, then the 16-byte
    /// tag. `out` must have room for their total length + 16. Needs a key.
    package mutating func seal(
        ad: [UInt8], spans: UnsafeBufferPointer<lanmsg_span>, into out: UnsafeMutableRawPointer
    ) throws(NoiseError) {
        let key = try checkedKey()
        guard Self.seal(key, nonce, ad, spans, into: out) == 0 else { throw NoiseError("encryption failed (libcrypto)") }
        nonce += 1
    }

    /// Decrypts and authenticates `ciphertext` (tag included), appending the plaintext to `out`.
    /// Needs a key.
    /// - Throws: ``NoiseError`` when the tag does not match (tampering, wrong key, replay).
    package mutating func decrypt(
        ad: [UInt8], _ ciphertext: ArraySlice<UInt8>, appendingTo out: inout [UInt8]
    ) throws(NoiseError) {
        let key = try checkedKey()
        guard ciphertext.count >= 16 else { throw Self.tooShort(ciphertext.count) }
        let start = out.count
        let length = ciphertext.count - 16
        ZeroBytes.append(length, to: &out)
        let status = ciphertext.withUnsafeBytes { source in
            out.withUnsafeMutableBytes { destination in
                var span = lanmsg_mutable_span(
                    base: (destination.baseAddress! + start).assumingMemoryBound(to: UInt8.self), length: length)
                return withUnsafePointer(to: &span) {
                    Self.open(key, nonce, ad, source, into: UnsafeBufferPointer(start: $0, count: 1))
                }
            }
        }
        guard status == 0 else {
            out.removeSubrange(start...)
            throw failedAuthentication()
        }
        nonce += 1
    }

    /// Opens `message` (ciphertext and 16-byte tag) with `ad`, writing the plaintext into `spans`
    /// in order (their lengths add up to the message's length − 16). Needs a key.
    /// - Throws: ``NoiseError`` when the tag does not match (tampering, wrong key, replay); the
    ///   spans then hold bytes that must not be used.
    package mutating func open(
        ad: [UInt8], _ message: UnsafeRawBufferPointer, into spans: UnsafeBufferPointer<lanmsg_mutable_span>
    ) throws(NoiseError) {
        let key = try checkedKey()
        guard message.count >= 16 else { throw Self.tooShort(message.count) }
        guard Self.open(key, nonce, ad, message, into: spans) == 0 else { throw failedAuthentication() }
        nonce += 1
    }

    /// Decrypts and authenticates `ciphertext` (tag included); without a key, returns it as is.
    /// - Throws: ``NoiseError`` when the tag does not match (tampering, wrong key, replay).
    package mutating func decrypt(ad: [UInt8], _ ciphertext: some Collection<UInt8>) throws(NoiseError) -> [UInt8] {
        guard key != nil else { return Array(ciphertext) }
        var out = [UInt8]()
        try decrypt(ad: ad, Array(ciphertext)[...], appendingTo: &out)
        return out
    }

    // The two libcrypto calls every method above makes (0: done).

    private static func seal(
        _ key: CipherKey, _ nonce: UInt64, _ ad: [UInt8], _ spans: UnsafeBufferPointer<lanmsg_span>,
        into out: UnsafeMutableRawPointer
    ) -> Int32 {
        ad.withUnsafeBufferPointer { ad in
            lanmsg_chachapoly_seal(
                key.pointer, nonce, ad.baseAddress, ad.count, spans.baseAddress, Int32(spans.count),
                out.assumingMemoryBound(to: UInt8.self))
        }
    }

    private static func open(
        _ key: CipherKey, _ nonce: UInt64, _ ad: [UInt8], _ message: UnsafeRawBufferPointer,
        into spans: UnsafeBufferPointer<lanmsg_mutable_span>
    ) -> Int32 {
        ad.withUnsafeBufferPointer { ad in
            lanmsg_chachapoly_open(
                key.pointer, nonce, ad.baseAddress, ad.count, message.baseAddress!.assumingMemoryBound(to: UInt8.self),
                message.count - 16, spans.baseAddress, Int32(spans.count))
        }
    }

    private static func tooShort(_ count: Int) -> NoiseError {
        NoiseError("a message of \(count) bytes is shorter than its tag")
    }

    private func failedAuthentication() -> NoiseError {
        NoiseError("a message failed authentication (nonce \(nonce)): it was altered, replayed or sent with another key")
    }

    /// `Rekey()` (section 4.2): the key becomes the first 32 bytes of encrypting 32 zero bytes with
    /// nonce 2⁶⁴ − 1. The nonce goes on counting.
    package mutating func rekey() {
        guard let key else { return }
        let zeros = [UInt8](repeating: 0, count: 32)
        var out = [UInt8](repeating: 0, count: 48)
        let status = zeros.withUnsafeBufferPointer { zeros in
            out.withUnsafeMutableBytes { out in
                var span = lanmsg_span(base: zeros.baseAddress, length: 32)
                return withUnsafePointer(to: &span) {
                    Self.seal(key, Self.maxNonce, [], UnsafeBufferPointer(start: $0, count: 1), into: out.baseAddress!)
                }
            }
        }
        precondition(status == 0, "libcrypto failed to rekey")
        self.key = CipherKey.make(out.prefix(32))
        lanmsg_wipe(&out, 48)
    }
}

/// The Noise protocol's `SymmetricState` with SHA-256 (section 5.2).
struct NoiseSymmetricState: Sendable {
    var cipher = NoiseCipherState()
    var chainingKey: [UInt8]
    var hash: [UInt8]

    init(protocolName: String) {
        let name = Array(protocolName.utf8)
        hash = name.count <= 32 ? name + [UInt8](repeating: 0, count: 32 - name.count) : Array(SHA256.hash(data: name))
        chainingKey = hash
    }

    /// HKDF with SHA-256 (section 4.3), 2 or 3 outputs of 32 bytes: RFC 5869 with the chaining key
    /// as salt and an empty info.
    static func hkdf(_ chainingKey: [UInt8], _ inputKeyMaterial: [UInt8], outputs: Int) -> [[UInt8]] {
        // libcrypto's HMAC-SHA256 (CLanmsgAEAD): the same function as swift-crypto's HKDF with the
        // chaining key as salt and no info, without its key objects and copies (a handshake runs
        // it 6 times per side; it was 15 % of a server's handshake time).
        var bytes = [UInt8](repeating: 0, count: 32 * outputs)
        let status = chainingKey.withUnsafeBufferPointer { key in
            inputKeyMaterial.withUnsafeBufferPointer { ikm in
                bytes.withUnsafeMutableBufferPointer { out in
                    lanmsg_noise_hkdf(key.baseAddress, ikm.baseAddress, ikm.count, Int32(outputs), out.baseAddress)
                }
            }
        }
        precondition(status == 0 && chainingKey.count == 32, "HKDF failed (libcrypto)")
        defer { lanmsg_wipe(&bytes, bytes.count) }
        return (0..<outputs).map { Array(bytes[(32 * $0)..<(32 * $0 + 32)]) }
    }

    mutating func mixKey(_ inputKeyMaterial: [UInt8]) {
        let out = Self.hkdf(chainingKey, inputKeyMaterial, outputs: 2)
        chainingKey = out[0]
        cipher = NoiseCipherState(key: out[1])
    }

    mutating func mixHash(_ data: [UInt8]) {
        var hasher = SHA256()
        hasher.update(data: hash)
        hasher.update(data: data)
        hash = Array(hasher.finalize())
    }

    mutating func mixKeyAndHash(_ inputKeyMaterial: [UInt8]) {
        let out = Self.hkdf(chainingKey, inputKeyMaterial, outputs: 3)
        chainingKey = out[0]
        mixHash(out[1])
        cipher = NoiseCipherState(key: out[2])
    }

    mutating func encryptAndHash(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        let ciphertext = try cipher.encrypt(ad: hash, plaintext)
        mixHash(ciphertext)
        return ciphertext
    }

    mutating func decryptAndHash(_ ciphertext: [UInt8]) throws(NoiseError) -> [UInt8] {
        let plaintext = try cipher.decrypt(ad: hash, ciphertext)
        mixHash(ciphertext)
        return plaintext
    }

    func split() -> (NoiseCipherState, NoiseCipherState) {
        let out = Self.hkdf(chainingKey, [], outputs: 2)
        return (NoiseCipherState(key: out[0]), NoiseCipherState(key: out[1]))
    }
}

/// The Noise protocol's `HandshakeState` with 25519, ChaChaPoly and SHA-256 (section 5.3), for any
/// handshake pattern. No I/O: ``writeMessage(payload:)`` returns the bytes to send,
/// ``readMessage(_:)`` takes the bytes received. After the last message, ``split()`` gives the two
/// transport ciphers and ``handshakeHash`` the value both sides share.
package struct NoiseHandshake: @unchecked Sendable {
    // @unchecked Sendable: the Curve25519 private keys are immutable values.
    package enum Role: Sendable { case initiator, responder }

    package let pattern: NoisePattern
    package let role: Role
    private var symmetric: NoiseSymmetricState
    private var localStatic: Curve25519.KeyAgreement.PrivateKey?
    private var localEphemeral: Curve25519.KeyAgreement.PrivateKey?
    /// The peer's static public key: known in advance, or learnt during the handshake.
    package private(set) var remoteStatic: [UInt8]?
    private var remoteEphemeral: [UInt8]?
    private var psks: [[UInt8]]
    private var messageIndex = 0

    /// - Parameters:
    ///   - protocolName: e.g. `Noise_XX_25519_ChaChaPoly_SHA256` (it is hashed into the state).
    ///   - prologue: Data both sides must agree on (mixed into the hash; a mismatch fails the handshake).
    ///   - localStatic: This side's long-term key, if the pattern uses one.
    ///   - localEphemeral: Only for test vectors: a fixed ephemeral key (otherwise a fresh one).
    ///   - remoteStatic: The peer's static public key, when known before the handshake.
    ///   - psks: Pre-shared keys (32 bytes each), in the order the pattern's `psk` tokens use them.
    package init(
        pattern: NoisePattern, role: Role, protocolName: String, prologue: [UInt8],
        localStatic: Curve25519.KeyAgreement.PrivateKey? = nil,
        localEphemeral: Curve25519.KeyAgreement.PrivateKey? = nil,
        remoteStatic: [UInt8]? = nil, remoteEphemeral: [UInt8]? = nil, psks: [[UInt8]] = []
    ) throws(NoiseError) {
        self.pattern = pattern
        self.role = role
        self.localStatic = localStatic
        self.localEphemeral = localEphemeral
        self.remoteStatic = remoteStatic
        self.remoteEphemeral = remoteEphemeral
        self.psks = psks
        symmetric = NoiseSymmetricState(protocolName: protocolName)
        symmetric.mixHash(prologue)
        // Pre-message keys: the initiator's first, then the responder's (section 5.3).
        for (sender, tokens) in [(Role.initiator, pattern.initiatorPreMessage), (.responder, pattern.responderPreMessage)] {
            for token in tokens {
                let key: [UInt8]?
                switch (token, sender == role) {
                case (.s, true): key = localStatic.map { Array($0.publicKey.rawRepresentation) }
                case (.s, false): key = remoteStatic
                case (.e, true): key = localEphemeral.map { Array($0.publicKey.rawRepresentation) }
                case (.e, false): key = remoteEphemeral
                default: throw NoiseError("pattern \(pattern.name) has a '\(token)' token in a pre-message")
                }
                guard let key else { throw NoiseError("pattern \(pattern.name) needs a pre-known '\(token)' key") }
                symmetric.mixHash(key)
                if token == .e && pattern.hasPSK { symmetric.mixKey(key) }
            }
        }
    }

    /// Whether every handshake message was written or read.
    package var isComplete: Bool { messageIndex >= pattern.messages.count }
    /// Whether this side sends the next handshake message.
    package var isMyTurn: Bool { (messageIndex % 2 == 0) == (role == .initiator) }
    /// `h`: the hash of the whole handshake, the same on both sides (channel binding).
    package var handshakeHash: [UInt8] { symmetric.hash }

    /// Writes the next handshake message carrying `payload` (encrypted once a key exists).
    package mutating func writeMessage(payload: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard !isComplete, isMyTurn else { throw NoiseError("it is not this side's turn to write a handshake message") }
        var out: [UInt8] = []
        for token in pattern.messages[messageIndex] {
            switch token {
            case .e:
                let ephemeral = localEphemeral ?? Curve25519.KeyAgreement.PrivateKey()
                localEphemeral = ephemeral
                let publicKey = Array(ephemeral.publicKey.rawRepresentation)
                out += publicKey
                symmetric.mixHash(publicKey)
                if pattern.hasPSK { symmetric.mixKey(publicKey) }
            case .s:
                guard let localStatic else { throw NoiseError("pattern \(pattern.name) needs this side's static key") }
                out += try symmetric.encryptAndHash(Array(localStatic.publicKey.rawRepresentation))
            case .psk:
                try mixPSK()
            case .ee, .es, .se, .ss:
                symmetric.mixKey(try dh(token))
            }
        }
        out += try symmetric.encryptAndHash(payload)
        messageIndex += 1
        return out
    }

    /// Reads the next handshake message and returns its payload.
    /// - Throws: ``NoiseError`` for a short or altered message, a wrong key or pre-shared key.
    package mutating func readMessage(_ message: [UInt8]) throws(NoiseError) -> [UInt8] {
        guard !isComplete, !isMyTurn else { throw NoiseError("a handshake message arrived out of turn") }
        var rest = message[...]
        func take(_ count: Int) throws(NoiseError) -> [UInt8] {
            guard rest.count >= count else { throw NoiseError("handshake message \(messageIndex + 1) is too short") }
            defer { rest = rest.dropFirst(count) }
            return Array(rest.prefix(count))
        }
        for token in pattern.messages[messageIndex] {
            switch token {
            case .e:
                let publicKey = try take(32)
                remoteEphemeral = publicKey
                symmetric.mixHash(publicKey)
                if pattern.hasPSK { symmetric.mixKey(publicKey) }
            case .s:
                let encrypted = try take(symmetric.cipher.hasKey ? 48 : 32)
                remoteStatic = try symmetric.decryptAndHash(encrypted)
            case .psk:
                try mixPSK()
            case .ee, .es, .se, .ss:
                symmetric.mixKey(try dh(token))
            }
        }
        let payload = try symmetric.decryptAndHash(Array(rest))
        messageIndex += 1
        return payload
    }

    /// The transport ciphers (section 5.2): the initiator sends with the first and receives with the
    /// second; the responder the other way round.
    package func split() throws(NoiseError) -> (send: NoiseCipherState, receive: NoiseCipherState) {
        guard isComplete else { throw NoiseError("the handshake is not complete") }
        let (first, second) = symmetric.split()
        return role == .initiator ? (first, second) : (second, first)
    }

    private mutating func mixPSK() throws(NoiseError) {
        guard !psks.isEmpty else { throw NoiseError("pattern \(pattern.name) needs a pre-shared key") }
        let psk = psks.removeFirst()
        guard psk.count == 32 else { throw NoiseError("a pre-shared key must be 32 bytes") }
        symmetric.mixKeyAndHash(psk)
    }

    /// The DH of a token: `es` is the initiator's ephemeral with the responder's static, and so on.
    private func dh(_ token: NoisePattern.Token) throws(NoiseError) -> [UInt8] {
        let initiator = role == .initiator
        let (local, remote): (Curve25519.KeyAgreement.PrivateKey?, [UInt8]?) =
            switch token {
            case .ee: (localEphemeral, remoteEphemeral)
            case .ss: (localStatic, remoteStatic)
            case .es: initiator ? (localEphemeral, remoteStatic) : (localStatic, remoteEphemeral)
            case .se: initiator ? (localStatic, remoteEphemeral) : (localEphemeral, remoteStatic)
            default: (nil, nil)
            }
        guard let local, let remote else { throw NoiseError("'\(token)' needs a key this side does not have") }
        do {
            let publicKey = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: remote)
            let secret = try local.sharedSecretFromKeyAgreement(with: publicKey)
            return secret.withUnsafeBytes { Array($0) }
        } catch {
            throw NoiseError("the peer's key is not a valid Curve25519 public key")
        }
    }
}
