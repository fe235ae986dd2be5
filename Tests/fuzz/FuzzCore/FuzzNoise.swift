// Version 2's decoders fed hostile bytes: the server side of the Noise handshake (preamble, message
// lengths, message 1 and 3, the hello inside), and the transport after a real handshake. Half the
// inputs are a genuine client transcript (fixed keys) with the input XORed in, so the fuzzer reaches
// past the preamble and the first message. Invariants: no crash; a finished handshake answers
// nothing more; an unchanged transcript succeeds; the transport never returns more plaintext than
// the bytes it was given.
import Crypto
import ProtocolCore

private func key(_ byte: UInt8) -> Curve25519.KeyAgreement.PrivateKey {
    try! Curve25519.KeyAgreement.PrivateKey(rawRepresentation: [UInt8](repeating: byte, count: 32))
}

private func settings(_ name: String, _ byte: UInt8) -> SecureHandshake.Settings {
    .init(
        info: PeerInfo(version: 2, name: name), maxFrameSize: 1 << 16, staticKey: key(byte),
        verify: { $0.info.name == "refused" ? "refused by policy" : nil })
}

/// A client's whole side of a handshake with a server whose ephemeral key is fixed, and the
/// client's transport cipher: the same bytes every time.
private let transcript: (bytes: [UInt8], transport: SecureTransport?) = {
    var client = try! SecureHandshake(role: .client, settings: settings("client", 1), ephemeral: key(2))
    var server = try! SecureHandshake(role: .server, settings: settings("server", 3), ephemeral: key(4))
    let first = client.start().bytes
    let third = client.receive(server.receive(first).bytes).bytes
    let ciphers = try? client.transport()
    return (first + third, ciphers.map { SecureTransport(send: $0.send, receive: $0.receive) })
}()

func fuzzNoise(_ bytes: [UInt8]) {
    guard let mode = bytes.first else { return }
    let body = Array(bytes.dropFirst())
    if mode & 0xC0 == 0xC0 { return fuzzSecureStream(body) }
    var input = body
    if mode & 1 == 1 {
        // The real transcript, altered by the input, then any input beyond it.
        input = transcript.bytes
        for (index, byte) in body.prefix(input.count).enumerated() { input[index] ^= byte }
        input += body.dropFirst(transcript.bytes.count)
    }
    var server = try! SecureHandshake(role: .server, settings: settings("server", 3), ephemeral: key(4))
    let step = Int(mode >> 1) % 9 + 1
    var outcome: Result<ProvenPeer, TransportError>?
    var index = 0
    while index < input.count {
        let piece = input[index..<min(index + step, input.count)]
        index += piece.count
        let output = server.receive(piece)
        if outcome != nil { check(output.bytes.isEmpty && output.outcome == nil, "a finished handshake answered") }
        check(output.bytes.count <= 2 + 65_535, "one handshake step sent \(output.bytes.count) bytes")
        if let result = output.outcome { outcome = result }
    }
    let unchanged = mode & 1 == 1 && body.prefix(transcript.bytes.count).allSatisfy { $0 == 0 }
    if unchanged && body.count >= transcript.bytes.count {
        guard case .success = outcome else { fatalError("the genuine transcript failed: \(String(describing: outcome))") }
    }
    // The transport after a handshake: whatever arrives either opens or throws.
    if case .success = outcome, let ciphers = try? server.transport() {
        var transport = SecureTransport(send: ciphers.send, receive: ciphers.receive)
        if let plaintext = try? transport.open(server.leftover) {
            check(plaintext.count <= server.leftover.count, "more plaintext than ciphertext")
        }
    }
    if mode & 2 == 2, var sender = transcript.transport {
        // A sealed message with the input XORed in: opens only when unaltered.
        guard var sealed = try? sender.seal(Array(body.prefix(64))) else { return }
        let altered = body.dropFirst(64).prefix(sealed.count).contains { $0 != 0 }
        for (offset, byte) in body.dropFirst(64).prefix(sealed.count).enumerated() { sealed[offset] ^= byte }
        var receiver = try! SecureHandshake(role: .server, settings: settings("server", 3), ephemeral: key(4))
        _ = receiver.receive(transcript.bytes)
        guard let ciphers = try? receiver.transport() else { fatalError("the genuine transcript has no transport") }
        var transport = SecureTransport(send: ciphers.send, receive: ciphers.receive)
        let opened = try? transport.open(sealed)
        if !altered { check(opened == Array(body.prefix(64)), "an unaltered message did not open") }
        else if let opened, !opened.isEmpty { check(false, "an altered message opened") }
    }
}

/// The receiving half of version 2 as a connection drives it. Plaintext — the input's own bytes (any
/// frames or garbage) with a synthesized frame of up to 255 KiB inserted, so that large payloads are
/// opened in place — is sealed into transport messages of an input-chosen size and handed to the
/// receiver in input-chosen pieces: opened from the "read" while no message is cut, read into the
/// cut message's buffer while one is (as `ConnectionDriver.handleReadable` does), frames taken out
/// after each piece. Invariant: exactly the frames (and the error, if any) a plaintext decoder gives
/// for the same bytes; with one byte altered, authentication fails and nothing after it is decoded.
func fuzzSecureStream(_ bytes: [UInt8]) {
    guard bytes.count >= 6, var sender = transcript.transport?.sender else { return }
    var server = try! SecureHandshake(role: .server, settings: settings("server", 3), ephemeral: key(4))
    _ = server.receive(transcript.bytes)
    guard let ciphers = try? server.transport() else { fatalError("the genuine transcript has no transport") }
    let receiver = SecureReceiver(cipher: ciphers.receive)

    var plaintext = Array(bytes.dropFirst(6))
    let largePayload = Int(bytes[1]) << 10
    if largePayload > 0 {
        let frame = Frame(kind: .message, typeID: "big", payload: [UInt8](repeating: bytes[2], count: largePayload))
        let at = Int(bytes[3]) % (plaintext.count + 1)
        plaintext.insert(contentsOf: try! frame.encoded(), at: at)
    }
    let messageSize = 1 + (Int(bytes[0]) * 263) % SecureProtocol.maxPlaintext
    var sealed: [UInt8] = []
    var offset = 0
    while offset < plaintext.count {
        let end = min(offset + messageSize, plaintext.count)
        try! sender.seal(plaintext[offset..<end], into: &sealed)
        offset = end
    }
    // bytes[4]: flip one sealed byte (odd values), at a position chosen by bytes[5].
    let altered = bytes[4] & 1 == 1 && !sealed.isEmpty
    if altered { sealed[(Int(bytes[5]) * 7919) % sealed.count] ^= bytes[4] | 1 }

    func drain(_ decoder: inout FrameDecoder, into frames: inout [Frame]) -> Bool {
        while frames.count < 2000 {
            do {
                guard let frame = try decoder.next() else { return true }
                frames.append(frame)
            } catch {
                return false
            }
        }
        return true
    }
    var reference = FrameDecoder(maxFrameSize: 1 << 18, checkSequence: false)
    reference.append(contentsOf: plaintext)
    var expected: [Frame] = []
    let referenceOK = drain(&reference, into: &expected)

    var decoder = FrameDecoder(maxFrameSize: 1 << 18, checkSequence: false)
    var frames: [Frame] = []
    var decoderOK = true
    var opened = true
    var position = 0
    var round = 0
    sealed.withUnsafeBytes { stream in
        while position < stream.count && decoderOK && opened {
            let seed = Int(bytes[round % bytes.count])
            round += 1
            let piece = min(stream.count - position, 1 + (seed * 331 + round) % 70_000)
            do throws(NoiseError) {
                if receiver.pendingBytes > 0 && seed & 1 == 0 {
                    let got = try receiver.readIntoPending(extra: seed * 17, into: &decoder) { space in
                        let take = min(space.count, piece)
                        space.copyMemory(from: UnsafeRawBufferPointer(rebasing: stream[position..<(position + take)]))
                        return take
                    }
                    position += got
                } else {
                    try receiver.open(UnsafeRawBufferPointer(rebasing: stream[position..<(position + piece)]), into: &decoder)
                    position += piece
                }
            } catch {
                opened = false
            }
            decoderOK = drain(&decoder, into: &frames)
            if seed & 2 == 2 { receiver.releaseStorageIfIdle(); decoder.releaseStorageIfEmpty() }
        }
    }
    if altered {
        // Every frame decoded before the failure is one of the genuine ones, in order.
        check(frames.count <= expected.count && Array(expected.prefix(frames.count)) == frames, "an altered stream gave other frames")
        // (An altered length prefix may instead leave a message waiting for bytes that never come.)
        if decoderOK && receiver.pendingBytes == 0 { check(!opened, "an altered transport message opened") }
        return
    }
    check(opened, "a genuine transport message failed to open")
    check(frames == expected, "the encrypted path decoded \(frames.count) frames, the plaintext one \(expected.count)")
    check(decoderOK == referenceOK, "the encrypted path and the plaintext one disagree on an error")
    if decoderOK { check(receiver.pendingBytes == 0, "bytes left in the receiver after a complete stream") }
}
