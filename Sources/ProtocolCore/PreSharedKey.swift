import Crypto

/// A pre-shared key for mutual authentication in the hello (HMAC-SHA256 challenge-response).
///
/// The key never goes on the wire: each side sends a fresh 32-byte nonce and proves the key by an
/// HMAC over both nonces, so a captured hello cannot be replayed.
public struct PreSharedKey: Sendable {
    package let keyBytes: [UInt8]

    /// A key from raw bytes (at least 16).
    /// - Throws: ``TransportError`` `.invalidArgument` for a shorter key.
    public init(bytes: [UInt8]) throws(TransportError) {
        guard bytes.count >= 16 else {
            throw TransportError(
                .invalidArgument,
                "a pre-shared key needs at least 16 bytes (got \(bytes.count)); generate one with: head -c 32 /dev/urandom | base64 > key")
        }
        keyBytes = bytes
    }

    /// HMAC-SHA256 over `label || first || second`.
    package func proof(_ label: String, _ first: [UInt8], _ second: [UInt8]) -> [UInt8] {
        var mac = HMAC<SHA256>(key: SymmetricKey(data: keyBytes))
        mac.update(data: Array(label.utf8))
        mac.update(data: first)
        mac.update(data: second)
        return Array(mac.finalize())
    }

    /// The server's proof: HMAC(key, "lanmsg-auth-v1 server" || client nonce || server nonce).
    package func serverProof(clientNonce: [UInt8], serverNonce: [UInt8]) -> [UInt8] {
        proof("lanmsg-auth-v1 server", clientNonce, serverNonce)
    }

    /// The client's proof: HMAC(key, "lanmsg-auth-v1 client" || server nonce || client nonce).
    package func clientProof(clientNonce: [UInt8], serverNonce: [UInt8]) -> [UInt8] {
        proof("lanmsg-auth-v1 client", serverNonce, clientNonce)
    }
}

package enum AuthNonce {
    package static let size = 32
    package static func make() -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<size).map { _ in UInt8.random(in: 0...255, using: &generator) }
    }
}

/// Constant-time comparison (no early exit on the first differing byte).
package func constantTimeEqual(_ lhs: [UInt8], _ rhs: [UInt8]) -> Bool {
    guard lhs.count == rhs.count else { return false }
    var difference: UInt8 = 0
    for index in lhs.indices { difference |= lhs[index] ^ rhs[index] }
    return difference == 0
}

package enum Hex {
    package static func encode(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    package static func decode(_ text: String) -> [UInt8]? {
        let utf8 = Array(text.utf8)
        guard utf8.count % 2 == 0, utf8.count <= 256 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        var out = [UInt8]()
        var index = 0
        while index < utf8.count {
            guard let high = nibble(utf8[index]), let low = nibble(utf8[index + 1]) else { return nil }
            out.append(high << 4 | low)
            index += 2
        }
        return out
    }
}

