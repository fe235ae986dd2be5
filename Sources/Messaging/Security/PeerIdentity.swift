import Crypto
import Foundation
import Locks
import ProtocolCore
import Glibc

/// What the handshake proved about the peer, and how this side decided to trust it.
public struct PeerIdentity: Sendable, Equatable {
    /// The name the peer gave in its hello.
    public let name: String
    /// Its proven static key's fingerprint.
    public let fingerprint: Fingerprint
    /// This side had never seen this peer's name (trust on first use just remembered its key), or
    /// the trust policy accepts any key: show ``comparisonCode`` to the user.
    public let isFirstContact: Bool
    /// The code's six digits as a number: every encrypted channel keeps its peer's identity, so
    /// it is kept in 4 bytes rather than as a string.
    private let code: UInt32

    /// Six digits (`"123 456"`) derived from the handshake: both sides show the same code unless
    /// someone relays the connection. Compare it on a first contact.
    public var comparisonCode: String {
        let digits = String(code)
        let padded = String(repeating: "0", count: max(0, 6 - digits.count)) + digits
        return "\(padded.prefix(3)) \(padded.suffix(3))"
    }

    /// - Parameter comparisonCode: ``SecureProtocol/comparisonCode(handshakeHash:)``'s `"123 456"`.
    init(name: String, fingerprint: Fingerprint, comparisonCode: String, isFirstContact: Bool) {
        self.name = name
        self.fingerprint = fingerprint
        self.isFirstContact = isFirstContact
        code = UInt32(comparisonCode.filter { $0 != " " }) ?? 0
    }
}
