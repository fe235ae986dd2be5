import Crypto
import Foundation
import Locks
import ProtocolCore
import Glibc

/// How a channel protects its connection.
public struct ChannelSecurity: Sendable {
    enum Mode: Sendable {
        case encrypted(Identity, TrustPolicy)
        /// The default: encrypted, this program's persistent identity, trust on first use with its
        /// trust store (both under the XDG data directory), resolved at the first connection.
        case standard
        case plaintext
    }
    let mode: Mode
    /// Server side, with ``encrypted(identity:trust:)``: also serve clients that speak the plaintext
    /// protocol version 1 (old peers). Off by default; a client never falls back to plaintext.
    public var acceptsPlaintextPeers = false

    /// Protocol version 2: a Noise handshake (`XX`, or `XXpsk3` with
    /// ``ChannelConfiguration/preSharedKey``) proves both sides' keys, then every byte is
    /// encrypted and authenticated. `trust` decides which peers' keys are accepted.
    public static func encrypted(identity: Identity, trust: TrustPolicy) -> ChannelSecurity {
        ChannelSecurity(mode: .encrypted(identity, trust))
    }

    /// Protocol version 1, in plaintext (for peers that cannot speak version 2). Both sides must
    /// choose it: an encrypted side never falls back to it.
    public static let plaintext = ChannelSecurity(mode: .plaintext)

    /// The default: encrypted (version 2) with this program's persistent identity
    /// (``Identity/defaultPath(app:)``, created on first use; `app` is the process name). A client
    /// trusts servers on first use with the program's trust store (``TrustStore/defaultPath(app:)``);
    /// a server accepts any client key (every client still proves its key, and the server sees its
    /// fingerprint in ``MessageChannel/peerIdentity``) — restrict it with
    /// ``encrypted(identity:trust:)``.
    public static let standard = ChannelSecurity(mode: .standard)

    var isEncrypted: Bool {
        if case .plaintext = mode { return false }
        return true
    }

    /// The identity and trust policy to use now (loads or creates the standard identity).
    func resolved(server: Bool = false) throws(FileError) -> (Identity, TrustPolicy)? {
        switch mode {
        case .plaintext: return nil
        case .encrypted(let identity, let policy): return (identity, policy)
        case .standard:
            let (identity, clientPolicy) = try Self.standardParts()
            return (identity, server ? .anyKey : clientPolicy)
        }
    }

    private static let standardCache = Locked<(Identity, TrustPolicy)?>(nil)

    static func standardParts() throws(FileError) -> (Identity, TrustPolicy) {
        try standardCache.withLock { cache throws(FileError) in
            if let cache { return cache }
            let app = ProcessInfo.processInfo.processName
            let identity = try Identity.loadOrCreate(at: Identity.defaultPath(app: app))
            let parts = (identity, TrustPolicy.trustOnFirstUse(TrustStore(path: TrustStore.defaultPath(app: app))))
            cache = parts
            return parts
        }
    }

    /// The protocol version this side speaks: 2 when encrypted, 1 in plaintext (published as
    /// `proto` by ``stampTXT(_:)``).
    var protocolVersion: Int { isEncrypted ? 2 : WireProtocol.version }

    /// This side's identity (nil in plaintext; for ``standard``, the program's identity — created
    /// now if needed; nil if it cannot be).
    public var identity: Identity? { (try? resolved())?.0 }

    /// `txt` with `proto=<version>` and, when encrypted, `fp=<short fingerprint>` (a hint for
    /// browsers; the handshake proves the key). ``MessageServer`` adds them itself; call this when
    /// publishing a service yourself.
    public func stampTXT(_ txt: TXTRecord) -> TXTRecord {
        var txt = txt
        txt["proto"] = String(protocolVersion)
        if let identity { txt["fp"] = identity.fingerprint.short }
        return txt
    }
}
