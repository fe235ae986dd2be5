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

/// This app's long-term identity: a Curve25519 key pair. Its public key's ``fingerprint`` is what
/// peers remember; the private key never leaves this process and is never logged.
public struct Identity: @unchecked Sendable {
    // @unchecked: the private key is an immutable value.
    let privateKey: Curve25519.KeyAgreement.PrivateKey

    /// A new key pair that lives only as long as this value (peers see a new key every run).
    public static func ephemeral() -> Identity { Identity(privateKey: .init()) }

    /// The 32-byte public key.
    public var publicKey: [UInt8] { Array(privateKey.publicKey.rawRepresentation) }
    /// The public key's fingerprint.
    public var fingerprint: Fingerprint { Fingerprint(publicKey: publicKey) }

    /// Where an app's identity lives by default: `$XDG_DATA_HOME/lanmsg/<app>/identity`
    /// (`~/.local/share/lanmsg/<app>/identity` without `XDG_DATA_HOME`).
    public static func defaultPath(app: String) -> String { dataDirectory(app: app) + "/identity" }

    /// Loads the identity stored at `path`, or creates one there (directories mode 0700, the file
    /// mode 0600) when the file does not exist.
    /// - Throws: ``FileError`` when the file cannot be read or written, is malformed, or can be
    ///   read by other users (like ssh, a key file open to others is refused).
    public static func loadOrCreate(at path: String) throws(FileError) -> Identity {
        if FileManager.default.fileExists(atPath: path) { return try load(path) }
        let identity = Identity.ephemeral()
        let text = "lanmsg-identity-1 " + Data(identity.privateKey.rawRepresentation).base64EncodedString() + "\n"
        try createDirectories(for: path)
        // Created whole, then linked into place exclusively (issue 43: two processes creating it at
        // once, one read the other's half-written file): the file at `path` is always complete, and
        // of two creators the second finds the first's key and uses it.
        let temporary = path + ".tmp.\(getpid()).\(UInt64.random(in: 0...UInt64.max))"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw FileError.system(
                path, "cannot create the identity file '\(path)'", errno: errno,
                advice: "check that its directory is writable or give another path")
        }
        let failure = writeAllAndSync(fd, Array(text.utf8))
        close(fd)
        defer { unlink(temporary) }
        if let failure {
            throw FileError.system(path, "cannot write the identity file '\(path)'", errno: failure)
        }
        guard link(temporary, path) == 0 else {
            let code = errno
            if code == EEXIST { return try load(path) }  // another process created it meanwhile: its key
            throw FileError.system(
                path, "cannot create the identity file '\(path)'", errno: code,
                advice: "check that its directory is writable or give another path")
        }
        syncDirectory(of: path)
        return identity
    }

    private static func load(_ path: String) throws(FileError) -> Identity {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw FileError.system(path, "cannot read the identity file '\(path)'", errno: errno)
        }
        if info.st_mode & 0o077 != 0 {
            throw FileError(
                path,
                "the identity file '\(path)' can be read by other users (mode \(String(info.st_mode & 0o777, radix: 8))); "
                    + "its private key must be private: run `chmod 600 '\(path)'`")
        }
        guard let data = FileManager.default.contents(atPath: path),
            let text = String(data: data, encoding: .utf8)
        else {
            throw FileError(path, "cannot read the identity file '\(path)'; check its permissions")
        }
        let parts = text.split(whereSeparator: \.isWhitespace)
        guard parts.count == 2, parts[0] == "lanmsg-identity-1", let raw = Data(base64Encoded: String(parts[1])),
            let key = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: raw)
        else {
            // The library writes identity files whole (a temporary file linked into place), so this
            // is not one another process is still writing.
            throw FileError(
                path,
                "the identity file '\(path)' is not a lanmsg identity (expected `lanmsg-identity-1 <base64 key>`, found "
                    + (data.isEmpty ? "an empty file" : "\(data.count) bytes of something else")
                    + "); it was not written by this library. Restore it from a backup, or move it away to create a "
                    + "new identity (peers that trusted the old one will refuse the new one)")
        }
        return Identity(privateKey: key)
    }

    static func dataDirectory(app: String) -> String {
        let environment = ProcessInfo.processInfo.environment
        let base =
            environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? ((environment["HOME"] ?? NSHomeDirectory()) + "/.local/share")
        return base + "/lanmsg/" + app
    }
}

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

/// Known peers, like ssh's `known_hosts`: one line per peer name, `<full fingerprint> <name>`.
/// Every lookup reads the file, so several processes can share it; changes are written to a
/// temporary file and renamed into place (mode 0600).
public final class TrustStore: Sendable {
    /// The file.
    public var path: String { file.path }
    private let file: LineFile<(name: String, fingerprint: Fingerprint)>

    /// A store in `path` (created on the first ``trust(_:name:)``).
    public init(path: String) {
        file = LineFile(
            path: path, header: "# lanmsg known peers: <fingerprint> <name>", what: "the trust store",
            parse: { line in
                guard let space = line.firstIndex(of: " "), let fingerprint = Fingerprint(String(line[..<space])) else { return nil }
                return (String(line[line.index(after: space)...]), fingerprint)
            },
            format: { "\($0.fingerprint.full) \($0.name)" })
    }

    /// Where an app's trust store lives by default: `$XDG_DATA_HOME/lanmsg/<app>/known_peers`.
    public static func defaultPath(app: String) -> String { Identity.dataDirectory(app: app) + "/known_peers" }

    /// Every known peer: name and fingerprint, in file order.
    public var entries: [(name: String, fingerprint: Fingerprint)] { file.entries }

    /// The fingerprint remembered for `name`, if any.
    public func fingerprint(for name: String) -> Fingerprint? {
        file.entries.first { $0.name == name }?.fingerprint
    }

    /// Remembers `fingerprint` for `name`, replacing what was remembered for it.
    /// - Throws: ``FileError`` when the file cannot be written.
    public func trust(_ fingerprint: Fingerprint, name: String) throws(FileError) {
        try file.update { list in
            list.removeAll { $0.name == name }
            list.append((name, fingerprint))
            return true
        }
    }

    /// Forgets `name`; returns whether it was known.
    @discardableResult
    public func forget(name: String) throws(FileError) -> Bool {
        try file.update { list in
            let count = list.count
            list.removeAll { $0.name == name }
            return list.count != count
        }
    }
}

/// Which peers' keys this side accepts.
public struct TrustPolicy: Sendable {
    enum Rule: Sendable {
        case firstUse(TrustStore)
        case pinned(Set<Fingerprint>)
        case anyKey
        case custom(@Sendable (PeerIdentity) -> String?)
    }
    let rule: Rule

    /// Keys the peer must have besides what ``rule`` says (a server looked for by its key, or at an
    /// address remembered for a key). The rule's own verdict — and so whether this is a first
    /// contact, which a wrapping `.custom` rule could not tell — is kept.
    struct Required: Sendable {
        let keys: Set<Fingerprint>
        /// Checked before the rule (its refusal is the more precise one), or after it.
        let beforeRule: Bool
        let refusal: @Sendable (PeerIdentity) -> String
    }
    var required: Required?

    init(rule: Rule, required: Required? = nil) {
        self.rule = rule
        self.required = required
    }

    /// Trust on first use: a name seen for the first time is remembered with its key once the
    /// connection is established (show the comparison code); a known name presenting another key is
    /// refused loudly, never accepted.
    public static func trustOnFirstUse(_ store: TrustStore) -> TrustPolicy { TrustPolicy(rule: .firstUse(store)) }

    /// Only peers whose key has one of these fingerprints.
    public static func pinned(_ fingerprints: [Fingerprint]) -> TrustPolicy { TrustPolicy(rule: .pinned(Set(fingerprints))) }

    /// Any key: encrypted, but the peer is not authenticated (unless a pre-shared key is set, which
    /// only peers holding it can use). Choose it explicitly; never a default.
    public static let anyKey = TrustPolicy(rule: .anyKey)

    /// The app decides: return nil to accept the peer, or a refusal message. Called on the
    /// connection's loop during the handshake, which other connections share: decide from memory,
    /// without blocking I/O.
    public static func custom(_ decide: @escaping @Sendable (PeerIdentity) -> String?) -> TrustPolicy {
        TrustPolicy(rule: .custom(decide))
    }

    /// At an address remembered for a server (``PeerMemory``): only the key proven there before,
    /// and only if `base` accepts it too (a key the user removed from the trust store, or that a
    /// custom policy refuses, stays refused). Reads the trust store now, off the connection's loop.
    static func remembered(_ fingerprint: Fingerprint, within base: TrustPolicy) -> TrustPolicy {
        TrustPolicy(
            rule: base.rule,
            required: Required(keys: [fingerprint], beforeRule: true) { peer in
                "'\(peer.name)' presented the key \(peer.fingerprint.full) at an address remembered for the key "
                    + "\(fingerprint.full); refused (another machine may use the address now). Find the server by "
                    + "discovery, or forget it in the peer memory (known_addresses) if its key really changed."
            })
    }

    /// Only a key in `keys`, and only if `base` accepts it too (the base's refusal first: for a
    /// trust store, the key-change warning). For a client looking for a server by the key it knows
    /// among instances of any name (``ClientConfiguration/keepsLookingForKnownKey``).
    static func knownKey(_ keys: Set<Fingerprint>, for name: String, within base: TrustPolicy) -> TrustPolicy {
        TrustPolicy(
            rule: base.rule,
            required: Required(keys: keys, beforeRule: false) { peer in
                "the server found for '\(name)' presented the key \(peer.fingerprint.full), not the key this client "
                    + "knows for '\(name)' (\(keys.map(\.short).sorted().joined(separator: ", "))); refused"
            })
    }

    /// The keys this policy expects of the peer called `name`: its trust store's entry for the
    /// name, or the pinned keys; none for the other rules (read now: a file read for a store).
    func knownKeys(forName name: String) -> Set<Fingerprint> {
        switch rule {
        case .firstUse(let store): store.fingerprint(for: name).map { [$0] } ?? []
        case .pinned(let keys): keys
        case .anyKey, .custom: []
        }
    }

    /// The peers a trust-on-first-use store knows, read now (a file read: call it before the
    /// handshake, off the connection's loop); empty for the other rules.
    func knownPeers() -> [String: Fingerprint] {
        guard case .firstUse(let store) = rule else { return [:] }
        return Dictionary(store.entries.map { ($0.name, $0.fingerprint) }, uniquingKeysWith: { _, last in last })
    }

    /// Decides about a proven peer: the identity the app will see, or why it is refused. Runs on
    /// the connection's loop during the handshake: no file I/O here (`known` is ``knownPeers()``,
    /// read before); ``remember(_:)`` writes after the hand-off.
    func evaluate(
        name: String, fingerprint: Fingerprint, code: String, known: [String: Fingerprint]
    ) -> Result<PeerIdentity, TransportError> {
        guard let required else { return evaluateRule(name: name, fingerprint: fingerprint, code: code, known: known) }
        let refusal = { () -> Result<PeerIdentity, TransportError> in
            let peer = PeerIdentity(name: name, fingerprint: fingerprint, comparisonCode: code, isFirstContact: false)
            return .failure(TransportError(.untrustedKey, required.refusal(peer)))
        }
        if required.beforeRule, !required.keys.contains(fingerprint) { return refusal() }
        let verdict = evaluateRule(name: name, fingerprint: fingerprint, code: code, known: known)
        if case .success = verdict, !required.keys.contains(fingerprint) { return refusal() }
        return verdict
    }

    private func evaluateRule(
        name: String, fingerprint: Fingerprint, code: String, known: [String: Fingerprint]
    ) -> Result<PeerIdentity, TransportError> {
        switch rule {
        case .anyKey:
            return .success(PeerIdentity(name: name, fingerprint: fingerprint, comparisonCode: code, isFirstContact: true))
        case .pinned(let set):
            guard set.contains(fingerprint) else {
                return .failure(
                    TransportError(
                        .untrustedKey,
                        "'\(name)' presented the key \(fingerprint.full), which is not among the \(set.count) pinned "
                            + "fingerprint(s); refused. Pin its fingerprint if you trust it."))
            }
            return .success(PeerIdentity(name: name, fingerprint: fingerprint, comparisonCode: code, isFirstContact: false))
        case .custom(let decide):
            let identity = PeerIdentity(name: name, fingerprint: fingerprint, comparisonCode: code, isFirstContact: true)
            if let refusal = decide(identity) { return .failure(TransportError(.untrustedKey, refusal)) }
            return .success(identity)
        case .firstUse(let store):
            if let known = known[name] {
                guard known == fingerprint else {
                    return .failure(TransportError(.untrustedKey, Self.keyChangedWarning(name, fingerprint, known, store)))
                }
                return .success(PeerIdentity(name: name, fingerprint: fingerprint, comparisonCode: code, isFirstContact: false))
            }
            return .success(PeerIdentity(name: name, fingerprint: fingerprint, comparisonCode: code, isFirstContact: true))
        }
    }

    /// After a successful connection: trust on first use remembers a new peer's key now (not when
    /// the key was proven: a connection the other side then refused teaches nothing, and the user
    /// sees the comparison code on the first connection that works).
    func remember(_ identity: PeerIdentity) throws(FileError) {
        guard case .firstUse(let store) = rule, identity.isFirstContact else { return }
        try store.trust(identity.fingerprint, name: identity.name)
    }

    static func keyChangedWarning(_ name: String, _ presented: Fingerprint, _ known: Fingerprint, _ store: TrustStore) -> String {
        """
        @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
        @     WARNING: THE KEY OF PEER '\(name)' HAS CHANGED!
        @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
        Someone could be impersonating '\(name)' right now (a man-in-the-middle attack),
        or it was reinstalled and made a new identity. The connection was refused; nothing was sent.
        Presented fingerprint:  \(presented.full)
        Remembered fingerprint: \(known.full)  (in \(store.path))
        If you know the change is legitimate, compare the new fingerprint with the peer's owner,
        then forget the old one (remove the line for '\(name)' from \(store.path)) and connect again.
        """
    }
}

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
