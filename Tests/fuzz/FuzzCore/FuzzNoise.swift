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
