import BenchCommon
import Crypto
import Dispatch

/// `bench-ours x25519`: the handshake's Diffie-Hellman work alone, one core (issue 55, the floor
/// the handshake rate is measured against). Noise `XX` with ephemeral keys, as version 2 runs it:
/// each side makes one ephemeral key pair and computes three X25519 shared secrets (`ee`, `es`,
/// `se`) — both sides, 2 key generations and 6 agreements a handshake, done here with the same
/// swift-crypto calls the handshake makes, and nothing else (no hashing, no sockets).
/// Prints `RESULT X25519 ours+noise dh_us=… keygen_us=… handshake_us=…` (`handshake_us`: both
/// sides' DH work of one handshake on one core).
func runX25519Floor() {
    let initiatorStatic = Curve25519.KeyAgreement.PrivateKey()
    let responderStatic = Curve25519.KeyAgreement.PrivateKey()
    var sink: UInt8 = 0
    func handshake() throws {
        let ie = Curve25519.KeyAgreement.PrivateKey()
        let re = Curve25519.KeyAgreement.PrivateKey()
        // Message 2 (responder: e, ee, s, es), then its reading by the initiator.
        let secrets = [
            try re.sharedSecretFromKeyAgreement(with: ie.publicKey),
            try responderStatic.sharedSecretFromKeyAgreement(with: ie.publicKey),
            try ie.sharedSecretFromKeyAgreement(with: re.publicKey),
            try ie.sharedSecretFromKeyAgreement(with: responderStatic.publicKey),
            // Message 3 (initiator: s, se), then its reading by the responder.
            try initiatorStatic.sharedSecretFromKeyAgreement(with: re.publicKey),
            try re.sharedSecretFromKeyAgreement(with: initiatorStatic.publicKey),
        ]
        for secret in secrets { secret.withUnsafeBytes { sink ^= $0[0] } }
    }
    func time(_ count: Int, _ body: () throws -> Void) -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<count {
            do { try body() } catch { fail("x25519: \(error)") }
        }
        return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e3 / Double(count)
    }
    _ = time(200, handshake)  // warm-up
    let handshakeUs = time(4_000, handshake)
    let keygenUs = time(20_000) { sink ^= Curve25519.KeyAgreement.PrivateKey().publicKey.rawRepresentation[0] }
    let peer = Curve25519.KeyAgreement.PrivateKey().publicKey
    let dhUs = time(20_000) {
        try initiatorStatic.sharedSecretFromKeyAgreement(with: peer).withUnsafeBytes { sink ^= $0[0] }
    }
    result(
        "X25519", "ours+noise",
        [
            "dh_us": fmt(dhUs, 1), "keygen_us": fmt(keygenUs, 1), "handshake_us": fmt(handshakeUs, 1),
            "sink": String(sink & 1),  // (keeps the work from being optimised away)
        ])
}
