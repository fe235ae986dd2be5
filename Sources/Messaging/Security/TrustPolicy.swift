import Crypto
import Foundation
import Locks
import ProtocolCore
import Glibc

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
    /// and only if `base` accepts it too (a custom policy that refuses it keeps it refused). The
    /// client uses such an address only while `base` still holds the key
    /// (``stillHolds(_:forName:)``).
    static func remembered(_ fingerprint: Fingerprint, within base: TrustPolicy) -> TrustPolicy {
        TrustPolicy(
            rule: base.rule,
            required: Required(keys: [fingerprint], beforeRule: true) { peer in
                "'\(peer.name)' presented the key \(peer.fingerprint.full) at an address remembered for the key "
                    + "\(fingerprint.full); refused (another machine may use the address now). Find the server by "
                    + "discovery; if its key really changed, \(base.howToForget(peer.name, remembered: true))."
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
                    + "knows for '\(name)' (\(keys.map(\.short).sorted().joined(separator: ", "))); refused. If its key "
                    + "really changed, \(base.howToForget(name, remembered: false))"
            })
    }

    /// What makes a legitimately changed key of `name` acceptable again, for an app and for a
    /// person at a terminal: the one thing that works for this policy's rule (issue 57: the trust
    /// store, or the pins, is the only place a client knows a key from).
    func howToForget(_ name: String, remembered: Bool) -> String {
        switch rule {
        case .firstUse(let store):
            "forget the old key and connect again: TrustStore.forget(name: \"\(name)\") in an app, or remove the line "
                + "for '\(name)' from \(store.path) by hand (its remembered addresses are forgotten with it)"
        case .pinned:
            "pin the new fingerprint instead of the old one (TrustPolicy.pinned)"
        case .anyKey, .custom:
            remembered
                ? "forget the remembered server: PeerMemory.forget(type:name:) in an app, or remove its line from "
                    + "known_addresses by hand" : "change what the app's trust policy accepts"
        }
    }

    /// Whether this policy still holds `fingerprint` as the key of `name`: a trust store's entry for
    /// the name is that key, or the key is pinned (a file read for a store: call it off the
    /// connection's loop). A key the policy does not hold — a name forgotten in the trust store,
    /// through ``TrustStore/forget(name:)`` or by hand, or a key no longer pinned — is not a key
    /// this client knows, wherever else it is remembered (``PeerMemory``). The other rules keep no
    /// keys: true.
    func stillHolds(_ fingerprint: Fingerprint, forName name: String) -> Bool {
        switch rule {
        case .firstUse(let store): store.fingerprint(for: name) == fingerprint
        case .pinned(let keys): keys.contains(fingerprint)
        case .anyKey, .custom: true
        }
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
        then forget the old key and connect again (the next connection is a first contact):
          in an app:  TrustStore.forget(name: "\(name)")
          by hand:    remove the line for '\(name)' from \(store.path)
        """
    }
}
