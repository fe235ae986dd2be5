/// The wire protocol's constants.
public enum WireProtocol {
    /// The protocol version sent in HELLO. Peers with different versions refuse each other.
    public static let version = 1
    /// Codec id of raw bytes (no codec).
    public static let rawCodecID: UInt8 = 0
    /// Codec id of JSON.
    public static let jsonCodecID: UInt8 = 1
    /// The largest frame body a peer accepts when its hello has no `max_frame` (older peers), and
    /// the default limit of ours (`ConnectionConfiguration.maxFrameSize`): 16 MiB. The one place
    /// this value is written.
    package static let defaultMaxFrameSize = 16 * 1024 * 1024
}

/// What a peer says about itself in the hello exchange.
public struct PeerInfo: Sendable, Codable, Hashable {
    /// The peer's protocol version.
    public var version: Int
    /// The peer's display name.
    public var name: String
    /// App metadata (for example an app version or capabilities).
    public var metadata: [String: String]
    /// Whether the peer offered message sessions in its hello (`"sessions":true`).
    package var sessions = false

    enum CodingKeys: String, CodingKey { case version, name, metadata }

    // Equal when the public fields are: the session offer is the protocol's business.
    public static func == (lhs: PeerInfo, rhs: PeerInfo) -> Bool {
        lhs.version == rhs.version && lhs.name == rhs.name && lhs.metadata == rhs.metadata
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(version)
        hasher.combine(name)
        hasher.combine(metadata)
    }

    /// Creates peer info.
    public init(version: Int = WireProtocol.version, name: String, metadata: [String: String] = [:]) {
        self.version = version
        self.name = name
        self.metadata = metadata
    }
}

/// The payload of a REFUSE frame.
package struct Refusal: Codable, Sendable {
    package var code: String
    package var message: String
    /// `busy` only: when to try again, in milliseconds (docs/PROTOCOL.md, "Busy").
    package var retryMilliseconds: Int?
    package init(code: String, message: String, retryMilliseconds: Int? = nil) {
        self.code = code
        self.message = message
        self.retryMilliseconds = retryMilliseconds
    }

    private enum CodingKeys: String, CodingKey {
        case code, message
        case retryMilliseconds = "retry_ms"
    }
}

extension Refusal {
    /// The error a refused client reports, chosen by `code` (docs/PROTOCOL.md, "Hello" and
    /// "Verdict"); an unknown code is a refusal.
    package var errorCode: TransportError.Code {
        switch code {
        case "version_mismatch": .versionMismatch
        case "auth_required", "auth_failed": .authenticationFailed
        case "bad_hello": .helloFailed
        case "busy": .serverBusy
        default: .helloRefused
        }
    }

    /// The error a client reports for this refusal: `text` says it, the code is ``errorCode``, and
    /// a `busy` refusal's retry hint is kept.
    package func error(_ text: String) -> TransportError {
        TransportError(
            errorCode, text, closeReason: .helloFailed(message),
            retryAfter: retryMilliseconds.map { .milliseconds(max(0, $0)) })
    }
}

/// The payload of a STREAM_START frame. Encoded with sorted keys, the metadata's included.
package struct TransferHeader: Codable, Sendable {
    // Declared in sorted order (the encoder writes keys in declaration order).
    package var metadata: [String: String]
    package var size: UInt64
    package init(size: UInt64, metadata: [String: String]) {
        self.size = size
        self.metadata = metadata
    }

    enum CodingKeys: String, CodingKey { case metadata, size }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(SortedMap(metadata), forKey: .metadata)
        try container.encode(size, forKey: .size)
    }
}

/// A string map encoded as a JSON object with its keys in sorted order (a Swift dictionary
/// encodes in its hash order, which differs from run to run): the protocol's own JSON is
/// deterministic (docs/PROTOCOL.md, "Frame kinds").
package struct SortedMap: Encodable {
    package let map: [String: String]
    package init(_ map: [String: String]) { self.map = map }

    struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Key.self)
        for key in map.keys.sorted() { try container.encode(map[key]!, forKey: Key(stringValue: key)) }
    }
}


/// HELLO / HELLO_ACK payload: the public ``PeerInfo``, this side's frame limit and the
/// authentication fields. Required on receive: `version` (integer) and `name` (string); `metadata`
/// defaults to `{}`, `max_frame` to 16 MiB. Encoded with sorted keys.
package struct HelloPayload: Codable, Sendable {
    package var version: Int
    package var name: String
    package var metadata: [String: String]
    /// The largest frame body the sender accepts (bytes after the length prefix).
    package var maxFrame: Int?
    /// Client's nonce (hex), sent when the client has a pre-shared key.
    package var nonce: String?
    /// Server's challenge and proof, sent when the server has a pre-shared key.
    package var auth: AuthChallenge?
    /// Message sessions: the client will open one; the server accepts them. Absent = no.
    package var sessions: Bool?

    package init(_ info: PeerInfo, nonce: String? = nil, auth: AuthChallenge? = nil) {
        version = info.version
        name = info.name
        metadata = info.metadata
        sessions = info.sessions ? true : nil
        self.nonce = nonce
        self.auth = auth
    }

    package var info: PeerInfo {
        var info = PeerInfo(version: version, name: name, metadata: metadata)
        info.sessions = sessions == true
        return info
    }

    // Declared in sorted order: the encoder writes keys in this order.
    enum CodingKeys: String, CodingKey {
        case auth
        case maxFrame = "max_frame"
        case metadata, name, nonce, sessions, version
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        version = try container.decode(Int.self, forKey: .version)
        name = try container.decode(String.self, forKey: .name)
        metadata = try container.decodeIfPresent([String: String].self, forKey: .metadata) ?? [:]
        maxFrame = try container.decodeIfPresent(Int.self, forKey: .maxFrame)
        nonce = try container.decodeIfPresent(String.self, forKey: .nonce)
        auth = try container.decodeIfPresent(AuthChallenge.self, forKey: .auth)
        sessions = try? container.decodeIfPresent(Bool.self, forKey: .sessions)
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(auth, forKey: .auth)
        try container.encodeIfPresent(maxFrame, forKey: .maxFrame)
        try container.encode(SortedMap(metadata), forKey: .metadata)
        try container.encode(name, forKey: .name)
        try container.encodeIfPresent(nonce, forKey: .nonce)
        try container.encodeIfPresent(sessions, forKey: .sessions)
        try container.encode(version, forKey: .version)
    }
}

extension HelloPayload {
    /// The smallest `max_frame` a peer may announce: every control frame (PING, PONG, ACK, SESSION,
    /// GOODBYE) and an error reply fit in it (docs/PROTOCOL.md, "Hello").
    package static let minMaxFrame = 1024
    /// The largest: a frame's length field is 32 bits.
    package static let maxMaxFrame = Int(UInt32.max)

    /// Why this hello cannot be accepted beyond its required keys (nil when it can): a `max_frame`
    /// outside ``minMaxFrame``…``maxMaxFrame``.
    package var problem: String? {
        guard let maxFrame else { return nil }
        guard maxFrame >= Self.minMaxFrame, maxFrame <= Self.maxMaxFrame else {
            return "\"max_frame\" is \(maxFrame), outside the allowed \(Self.minMaxFrame)…\(Self.maxMaxFrame): every "
                + "peer must accept frames of at least \(Self.minMaxFrame) bytes"
        }
        return nil
    }
}

/// The server's challenge in HELLO_ACK (pre-shared key only).
package struct AuthChallenge: Codable, Sendable {
    // Sorted order (see HelloPayload).
    package var nonce: String
    package var proof: String
    package var scheme: String
    package init(scheme: String, nonce: String, proof: String) {
        self.scheme = scheme
        self.nonce = nonce
        self.proof = proof
    }
}

/// The client's proof in AUTH (pre-shared key only).
package struct AuthProof: Codable, Sendable {
    package var proof: String
    package init(proof: String) { self.proof = proof }
}
