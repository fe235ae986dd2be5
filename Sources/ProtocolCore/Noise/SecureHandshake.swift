#if canImport(Glibc)
    import Glibc
#endif

import CLanmsgAEAD
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
        /// Tests: these bytes are sent as this side's hello instead of the one `info` makes (a
        /// peer that writes a hello the spec does not allow).
        package var rawHello: [UInt8]?

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
            if role == .client && buffer[0] == 0 && buffer[1] == 0 {
                // Not a Noise message (message 2 is never empty): the server refused the connection
                // before the handshake, with a version-1 REFUSE frame, whose 4-byte length begins
                // with these two zero bytes (docs/PROTOCOL.md, "Busy").
                return refusedBeforeHandshake()
            }
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

    /// A REFUSE frame (version-1 framing, in the clear) where message 2 was expected: the server
    /// refused before any key agreement. Waits for the whole frame, then fails with its code.
    private mutating func refusedBeforeHandshake() -> Output {
        guard buffer.count >= 4 else { return Output() }
        let length = Int(buffer[0]) << 24 | Int(buffer[1]) << 16 | Int(buffer[2]) << 8 | Int(buffer[3])
        guard length <= SecureProtocol.maxMessage else {
            return fail(.protocolViolation, "the server sent an empty handshake message 2 followed by \(length) bytes that are not a REFUSE frame")
        }
        guard buffer.count >= 4 + length else { return Output() }
        var decoder = FrameDecoder(maxFrameSize: SecureProtocol.maxMessage, checkSequence: false)
        decoder.append(contentsOf: buffer.prefix(4 + length))
        guard let frame = try? decoder.next(), frame.kind == .refuse,
            let refusal = try? FastJSONDecoder().decode(Refusal.self, from: frame.payload)
        else {
            return fail(.protocolViolation, "the server sent an empty handshake message 2 not followed by a REFUSE frame")
        }
        done = true
        let text = "the server refused the connection before the handshake: \(refusal.message)"
        return Output(outcome: .failure(refusal.error(text)))
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
        // The version first, then the other keys (as version 1: a later version may change them),
        // so `{"version":3}` is version_mismatch in both versions (docs/PROTOCOL.md, "Hello").
        guard let versionOnly = try? FastJSONDecoder().decode(HelloVersion.self, from: payload) else {
            done = true
            let text = "malformed hello in the encrypted handshake: it must be a JSON object with an integer \"version\" and a string \"name\""
            return .failure(TransportError(.helloFailed, text, closeReason: .protocolError(text)))
        }
        guard versionOnly.version == 2 else {
            done = true
            let text = "the peer's hello says version \(versionOnly.version) inside a version-2 handshake"
            return .failure(TransportError(.versionMismatch, text, closeReason: .helloFailed(text)))
        }
        let hello: HelloPayload
        do {
            hello = try FastJSONDecoder().decode(HelloPayload.self, from: payload)
        } catch {
            done = true
            let text = "malformed hello in the encrypted handshake: \(error)"
            return .failure(TransportError(.helloFailed, text, closeReason: .protocolError(text)))
        }
        if let problem = hello.problem {
            done = true
            let text = "malformed hello in the encrypted handshake: \(problem)"
            return .failure(TransportError(.helloFailed, text, closeReason: .protocolError(text)))
        }
        let proven = ProvenPeer(
            publicKey: key, info: hello.info, maxFrameSize: hello.maxFrame ?? WireProtocol.defaultMaxFrameSize,
            handshakeHash: messageTwoHash)
        if let refusal = settings.verify(proven) {
            done = true
            // The error carries the policy's whole text (the app shows it); the close reason,
            // which the connection logs, its first line.
            let reason = firstLine(of: refusal, more: "refused by this side's trust policy")
            return .failure(TransportError(.untrustedKey, refusal, closeReason: .helloFailed(reason)))
        }
        return .success(proven)
    }

    private func hello() -> [UInt8] {
        if let rawHello = settings.rawHello { return rawHello }
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

    package static func framed(_ message: [UInt8]) -> [UInt8] {
        // Truncating: an oversized handshake message is refused by step() before it is sent.
        [UInt8(truncatingIfNeeded: message.count >> 8), UInt8(truncatingIfNeeded: message.count)] + message
    }
}

/// The transport of version 2, without I/O: plaintext in, length-prefixed ChaChaPoly messages out,
/// and back. Each direction rekeys every ``SecureProtocol/rekeyInterval`` messages. A connection
/// uses the two halves apart (``sender``, ``receiver``): it seals where frames are queued and opens
/// where bytes are read.
package struct SecureTransport: Sendable {
    package var sender: SecureSender
    package var receiver: SecureReceiver

    package init(send: NoiseCipherState, receive: NoiseCipherState) {
        sender = SecureSender(cipher: send)
        receiver = SecureReceiver(cipher: receive)
    }

    /// Encrypts up to ``SecureProtocol/maxPlaintext`` bytes into one message, length prefix included.
    package mutating func seal(_ plaintext: [UInt8]) throws(NoiseError) -> [UInt8] {
        var out: [UInt8] = []
        try sender.seal(plaintext[...], into: &out)
        return out
    }

    /// Encrypts up to ``SecureProtocol/maxPlaintext`` bytes into one message appended to `out`,
    /// length prefix included.
    package mutating func seal(_ plaintext: ArraySlice<UInt8>, into out: inout [UInt8]) throws(NoiseError) {
        try sender.seal(plaintext, into: &out)
    }

    /// Takes received bytes; returns the plaintext of every complete message among them.
    /// - Throws: ``NoiseError`` when a message fails authentication: close the connection.
    package mutating func open(_ bytes: some Collection<UInt8>) throws(NoiseError) -> [UInt8] {
        var sink = PlaintextBytes()
        let copy = Array(bytes)
        try copy.withUnsafeBufferPointer { (raw) throws(NoiseError) in
            try receiver.open(UnsafeRawBufferPointer(raw), into: &sink)
        }
        return sink.bytes
    }

    /// Transport messages sealed and opened so far (each direction's nonce).
    package var messageCounts: (sent: UInt64, received: UInt64) { (sender.messageCount, receiver.messageCount) }

    /// Received bytes of an incomplete message.
    package var pendingBytes: Int { receiver.pendingBytes }
}

/// The sending half of ``SecureTransport``: seals plaintext (gathered from several buffers, without
/// copying it first) into length-prefixed transport messages.
package struct SecureSender: Sendable {
    private var cipher: NoiseCipherState

    package init(cipher: NoiseCipherState) { self.cipher = cipher }

    /// Messages sealed so far (the next message's nonce).
    package var messageCount: UInt64 { cipher.nonce }

    /// The next message's nonce (``NoiseCipherState/setNonce(_:)``; tests only).
    package mutating func setNonce(_ nonce: UInt64) { cipher.setNonce(nonce) }

    /// The size on the wire of a message carrying `plaintextCount` bytes: length prefix and tag.
    @inline(__always)
    package static func sealedSize(_ plaintextCount: Int) -> Int { plaintextCount + 18 }

    /// Seals the concatenation of `spans` (`plaintextCount` bytes in all, at most
    /// ``SecureProtocol/maxPlaintext``) into one message at `out`, which has room for
    /// ``sealedSize(_:)`` bytes: the 2-byte length, the ciphertext and the tag.
    package mutating func seal(
        _ spans: UnsafeBufferPointer<lanmsg_span>, plaintextCount: Int, into out: UnsafeMutableRawPointer
    ) throws(NoiseError) {
        precondition(plaintextCount <= SecureProtocol.maxPlaintext)
        cipher.rekeyWhenDue()
        let length = plaintextCount + 16
        out.storeBytes(of: UInt8(truncatingIfNeeded: length >> 8), as: UInt8.self)
        out.storeBytes(of: UInt8(truncatingIfNeeded: length), toByteOffset: 1, as: UInt8.self)
        try cipher.seal(ad: [], spans: spans, into: out + 2)
    }

    /// Seals up to ``SecureProtocol/maxPlaintext`` bytes into one message appended to `out`.
    package mutating func seal(_ plaintext: ArraySlice<UInt8>, into out: inout [UInt8]) throws(NoiseError) {
        precondition(plaintext.count <= SecureProtocol.maxPlaintext)
        cipher.rekeyWhenDue()
        let length = plaintext.count + 16
        out.append(UInt8(truncatingIfNeeded: length >> 8))
        out.append(UInt8(truncatingIfNeeded: length))
        do throws(NoiseError) {
            try cipher.encrypt(ad: [], plaintext, appendingTo: &out)
        } catch {
            out.removeLast(2)
            throw error
        }
    }
}

extension NoiseCipherState {
    /// Rekeys before every ``SecureProtocol/rekeyInterval``-th message (not before the first).
    mutating func rekeyWhenDue() {
        if nonce > 0 && nonce % SecureProtocol.rekeyInterval == 0 { rekey() }
    }
}

/// Where opened plaintext goes: ``FrameDecoder`` (straight into its buffers), or bytes.
package protocol PlaintextSink {
    /// Lets `write` fill the next `count` bytes, given as two regions in order.
    mutating func receive<E: Error>(
        count: Int, _ write: (UnsafeMutableRawBufferPointer, UnsafeMutableRawBufferPointer) throws(E) -> Void
    ) throws(E)
}

extension FrameDecoder: PlaintextSink {}

/// Plaintext collected into an array.
package struct PlaintextBytes: PlaintextSink {
    package var bytes: [UInt8] = []
    package init() {}

    package mutating func receive<E: Error>(
        count: Int, _ write: (UnsafeMutableRawBufferPointer, UnsafeMutableRawBufferPointer) throws(E) -> Void
    ) throws(E) {
        try bytes.append(count: count) { (tail) throws(E) in try write(UnsafeMutableRawBufferPointer(start: nil, count: 0), tail) }
    }
}

/// The receiving half of ``SecureTransport``: opens transport messages from the bytes read, into a
/// ``PlaintextSink``. A message cut by the end of a read is kept until the rest arrives (the only
/// bytes it copies); everything else is decrypted from the read buffer into the sink. A reference
/// to one receiving state: copies share it.
package struct SecureReceiver: Sendable {
    /// The cipher and the first bytes of an incomplete message (empty most of the time; no
    /// storage when empty), in one object: an idle connection's receiving half is one allocation.
    private let pending: ReceiveBuffer

    package init(cipher: NoiseCipherState) { pending = ReceiveBuffer(cipher: cipher) }

    /// Messages opened so far (the next message's nonce).
    package var messageCount: UInt64 { pending.cipher.nonce }

    /// The next message's nonce (``NoiseCipherState/setNonce(_:)``; tests only).
    package func setNonce(_ nonce: UInt64) { pending.cipher.setNonce(nonce) }

    /// Received bytes of an incomplete message.
    package var pendingBytes: Int { pending.count }

    /// Opens every complete message in `bytes` into `sink`; an incomplete end is kept for the next call.
    /// - Throws: ``NoiseError`` when a message fails authentication: close the connection.
    package func open(_ bytes: UnsafeRawBufferPointer, into sink: inout some PlaintextSink) throws(NoiseError) {
        var offset = 0
        if pending.count > 0 {
            // Complete the kept message first (its length prefix may itself be cut).
            if pending.count < 2 {
                let take = min(2 - pending.count, bytes.count)
                pending.append(UnsafeRawBufferPointer(rebasing: bytes[0..<take]))
                offset = take
                guard pending.count == 2 else { return }
            }
            let missing = 2 + pending.messageLength - pending.count
            let take = min(missing, bytes.count - offset)
            pending.append(UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + take)]))
            offset += take
            guard take == missing else { return }
            try Self.openMessage(UnsafeRawBufferPointer(rebasing: pending.bytes[2...]), &pending.cipher, into: &sink)
            pending.removeFirst(pending.count)
        }
        offset = try Self.openComplete(bytes, from: offset, &pending.cipher, into: &sink)
        if offset < bytes.count { pending.append(UnsafeRawBufferPointer(rebasing: bytes[offset...])) }
    }

    /// While a message is incomplete: lets `read` append up to the rest of it plus `extra` bytes to
    /// it directly (no read buffer in between), then opens what is complete into `sink`. Returns
    /// what `read` returned (0: end of file or nothing read).
    package func readIntoPending(
        extra: Int, into sink: inout some PlaintextSink, _ read: (UnsafeMutableRawBufferPointer) -> Int
    ) throws(NoiseError) -> Int {
        let missing = pending.count < 2 ? 2 - pending.count : 2 + pending.messageLength - pending.count
        let count = read(pending.space(missing + extra))
        guard count > 0 else { return count }
        pending.commit(count)
        let consumed = try Self.openComplete(pending.bytes, from: 0, &pending.cipher, into: &sink)
        pending.removeFirst(consumed)  // the incomplete rest moves to the front; the storage stays
        return count
    }

    /// Frees the storage of the incomplete-message buffer when it holds nothing (an idle
    /// connection keeps none).
    package func releaseStorageIfIdle() { pending.releaseIfEmpty() }

    /// Opens the complete messages of `bytes` from `offset` on; returns where the first incomplete one begins.
    private static func openComplete(
        _ bytes: UnsafeRawBufferPointer, from start: Int, _ cipher: inout NoiseCipherState, into sink: inout some PlaintextSink
    ) throws(NoiseError) -> Int {
        var offset = start
        while bytes.count - offset >= 2 {
            let length = length(bytes[offset], bytes[offset + 1])
            guard bytes.count - offset >= 2 + length else { break }
            try openMessage(UnsafeRawBufferPointer(rebasing: bytes[(offset + 2)..<(offset + 2 + length)]), &cipher, into: &sink)
            offset += 2 + length
        }
        return offset
    }

    private static func openMessage(
        _ message: UnsafeRawBufferPointer, _ cipher: inout NoiseCipherState, into sink: inout some PlaintextSink
    ) throws(NoiseError) {
        guard message.count >= 16 else { throw NoiseError("a message of \(message.count) bytes is shorter than its tag") }
        cipher.rekeyWhenDue()
        try sink.receive(count: message.count - 16) { (first, second) throws(NoiseError) in
            var spans = (
                lanmsg_mutable_span(base: first.baseAddress?.assumingMemoryBound(to: UInt8.self), length: first.count),
                lanmsg_mutable_span(base: second.baseAddress?.assumingMemoryBound(to: UInt8.self), length: second.count)
            )
            try withUnsafePointer(to: &spans) { (pair) throws(NoiseError) in
                try pair.withMemoryRebound(to: lanmsg_mutable_span.self, capacity: 2) { (base) throws(NoiseError) in
                    try cipher.open(ad: [], message, into: UnsafeBufferPointer(start: base, count: 2))
                }
            }
        }
    }

    @inline(__always)
    private static func length(_ high: UInt8, _ low: UInt8) -> Int { Int(high) << 8 | Int(low) }
}

/// The receiving cipher and the received bytes kept between reads, in one allocation that grows
/// as needed and is freed when empty on request; bytes are read into it directly (no
/// zero-filling, no intermediate buffer). Owned by one ``SecureReceiver`` (on its connection's loop).
final class ReceiveBuffer: @unchecked Sendable {
    // @unchecked Sendable: used by one connection at a time (its loop).
    var cipher: NoiseCipherState
    private var storage: UnsafeMutableRawBufferPointer?
    private(set) var count = 0

    init(cipher: NoiseCipherState) { self.cipher = cipher }

    deinit { storage?.deallocate() }

    var bytes: UnsafeRawBufferPointer {
        guard let storage else { return UnsafeRawBufferPointer(start: nil, count: 0) }
        return UnsafeRawBufferPointer(rebasing: storage[0..<count])
    }

    /// The length in the 2-byte prefix of the message at the front (needs 2 bytes).
    var messageLength: Int { Int(storage![0]) << 8 | Int(storage![1]) }

    /// Room for `size` more bytes after the kept ones; ``commit(_:)`` what was written.
    func space(_ size: Int) -> UnsafeMutableRawBufferPointer {
        reserve(count + size)
        return UnsafeMutableRawBufferPointer(rebasing: storage![count..<(count + size)])
    }

    func commit(_ written: Int) { count += written }

    func append(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        space(bytes.count).copyMemory(from: bytes)
        count += bytes.count
    }

    /// Drops the first `n` bytes (the rest moves to the front).
    func removeFirst(_ n: Int) {
        guard n > 0, let storage else { return }
        if n < count { (storage.baseAddress! + 0).copyMemory(from: storage.baseAddress! + n, byteCount: count - n) }
        count -= n
    }

    func releaseIfEmpty() {
        guard count == 0, let storage else { return }
        storage.deallocate()
        self.storage = nil
    }

    private func reserve(_ capacity: Int) {
        if let storage, storage.count >= capacity { return }
        let grown = UnsafeMutableRawBufferPointer.allocate(byteCount: max(capacity, 2 * (storage?.count ?? 0), 4096), alignment: 16)
        if let storage {
            grown.baseAddress!.copyMemory(from: storage.baseAddress!, byteCount: count)
            storage.deallocate()
        }
        storage = grown
    }
}
