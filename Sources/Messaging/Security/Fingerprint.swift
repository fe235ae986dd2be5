import Crypto
import Foundation
import Locks
import ProtocolCore
import Glibc

/// The fingerprint of a peer's static public key: its SHA-256. The full form is 64 hex digits; the
/// short form, the first 16 in groups of four (`1a2b-3c4d-5e6f-7a8b`), is what people compare
/// and what the TXT record carries as a hint (the handshake proves the key, not the TXT record).
public struct Fingerprint: Sendable, Hashable, CustomStringConvertible {
    /// The 32 bytes, inline (no allocation: every encrypted channel keeps its peer's).
    private let digest: SIMD32<UInt8>

    /// The 32 bytes of the SHA-256.
    public var bytes: [UInt8] { (0..<32).map { digest[$0] } }

    /// The fingerprint of a 32-byte Curve25519 public key.
    public init(publicKey: [UInt8]) { self.init(digestBytes: SHA256.hash(data: publicKey)) }

    private init(digestBytes: some Sequence<UInt8>) {
        var digest = SIMD32<UInt8>()
        for (index, byte) in digestBytes.enumerated() { digest[index] = byte }
        self.digest = digest
    }

    /// Parses the full form: 64 hex digits (separators `:`, `-` and spaces ignored). Nil otherwise.
    public init?(_ text: String) {
        let digits = text.lowercased().filter { !":- ".contains($0) }
        guard digits.count == 64 else { return nil }
        var bytes: [UInt8] = []
        var index = digits.startIndex
        while index < digits.endIndex {
            let next = digits.index(index, offsetBy: 2)
            guard let byte = UInt8(digits[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        self.init(digestBytes: bytes)
    }

    /// 64 lowercase hex digits.
    public var full: String { bytes.map { String(format: "%02x", $0) }.joined() }

    /// The first 16 hex digits in groups of four.
    public var short: String {
        let hex = String(full.prefix(16))
        return stride(from: 0, to: 16, by: 4).map { offset in
            String(hex.dropFirst(offset).prefix(4))
        }.joined(separator: "-")
    }

    public var description: String { short }
}
