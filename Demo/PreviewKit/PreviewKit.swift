import Discovery

/// The preview push protocol, spoken over a ``Messaging`` channel.
///
/// One push:
/// 1. The client sends the request `preview.offer` ``PreviewOffer`` `{name, size, sha256}`; the server
///    answers `preview.offer-reply` ``PreviewOfferReply``: accepted with an offer id, or refused with a
///    ``PreviewFailure`` (bad name, too large, not enough space, shutting down) — before any data flows.
/// 2. The client streams the file as a transfer of type `preview.file` whose metadata carries
///    `offer=<offer id>`.
/// 3. The server writes it to a temporary file, hashing as it goes, verifies size and SHA-256, renames
///    it into place and sends the message `preview.result` ``PreviewResult`` `{offerID, storedName, sha256}`
///    — or the same message with a failure (it may do so before the transfer ends, e.g. disk full).
public enum PreviewProtocol {
    /// The DNS-SD service type of preview servers.
    public static let serviceType = "_preview._tcp"
    /// The version of this push protocol (TXT key `pv`).
    public static let version = 1
    /// The version of preview-server (TXT key `sv`).
    public static let serverVersion = "1.0.0"

    /// Stable message and transfer type ids.
    public enum TypeID {
        /// Request: ``PreviewOffer``.
        public static let offer = "preview.offer"
        /// Reply to an offer: ``PreviewOfferReply``.
        public static let offerReply = "preview.offer-reply"
        /// Transfer carrying the file; metadata `offer`.
        public static let file = "preview.file"
        /// Server → client message: ``PreviewResult``.
        public static let result = "preview.result"
    }

    /// TXT keys the server publishes.
    public enum TXTKey {
        /// Push protocol version.
        public static let protocolVersion = "pv"
        /// Server version.
        public static let serverVersion = "sv"
        /// Largest accepted file, bytes.
        public static let maxSize = "max"
        /// Free space in the server's directory, bytes (updated after every push).
        public static let freeSpace = "free"
        /// The port of the server's live web page (`http://HOST:PORT/`), when it serves one beyond
        /// loopback (`--web-port` with `--web-address`).
        public static let webPort = "web"
    }

    /// The metadata key of a `preview.file` transfer naming its offer.
    public static let offerMetadataKey = "offer"

    /// The TXT record a server publishes.
    public static func txt(maxSize: UInt64, freeSpace: UInt64?, webPort: UInt16? = nil) -> TXTRecord {
        var record = TXTRecord()
        record[TXTKey.protocolVersion] = String(version)
        record[TXTKey.serverVersion] = serverVersion
        record[TXTKey.maxSize] = String(maxSize)
        if let freeSpace { record[TXTKey.freeSpace] = String(freeSpace) }
        if let webPort { record[TXTKey.webPort] = String(webPort) }
        return record
    }
}

/// Why a push was refused or failed. The `code` is a stable string so that new codes don't break
/// older peers; `message` says what happened and what to do.
public struct PreviewFailure: Error, Codable, Sendable, Hashable, CustomStringConvertible {
    /// A stable machine-readable code, e.g. ``badName``.
    public var code: String
    /// What happened and what to do.
    public var message: String

    public init(_ code: String, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }

    /// The name is empty, too long, contains `/`, NUL or control characters, or is `.`/`..`.
    public static let badName = "bad-name"
    /// Larger than the server's maximum size.
    public static let tooLarge = "too-large"
    /// Not enough free space in the server's directory.
    public static let noSpace = "no-space"
    /// The received bytes do not have the announced SHA-256.
    public static let hashMismatch = "hash-mismatch"
    /// More or fewer bytes than announced arrived.
    public static let sizeMismatch = "size-mismatch"
    /// The transfer was aborted or the connection was lost.
    public static let transferFailed = "transfer-failed"
    /// The server could not write or store the file.
    public static let storageFailed = "storage-failed"
    /// The server is shutting down.
    public static let shuttingDown = "shutting-down"
    /// A malformed request (e.g. a hash that is not 64 hex digits, an unknown offer).
    public static let badRequest = "bad-request"
    /// The local file could not be read (client side).
    public static let localFile = "local-file"
    /// No answer in time, or the connection failed (client side).
    public static let connection = "connection"
}

/// Request `preview.offer`: what the client wants to push.
public struct PreviewOffer: Codable, Sendable, Hashable {
    /// The file name to store under (validated by the server; see ``FileName``).
    public var name: String
    /// Size in bytes.
    public var size: UInt64
    /// SHA-256 of the content, lowercase hex.
    public var sha256: String
    /// The pusher's id of this push, the same in every retry of it (32 hex digits): a server that
    /// sees it resumes an interrupted transfer of the same content, and answers a retry of a push it
    /// already stored with that result instead of storing it twice. Absent: no resume.
    public var pushID: String?

    public init(name: String, size: UInt64, sha256: String, pushID: String? = nil) {
        self.name = name
        self.size = size
        self.sha256 = sha256
        self.pushID = pushID
    }
}

/// Reply `preview.offer-reply`.
public struct PreviewOfferReply: Codable, Sendable, Hashable {
    /// True: stream the file with this offer id. False: see ``failure``.
    public var accepted: Bool
    /// The id to put in the transfer's metadata.
    public var offerID: String?
    /// Why the offer was refused.
    public var failure: PreviewFailure?
    /// Bytes of this content the server already has from an interrupted attempt: stream the file
    /// from this offset (the transfer then carries size − offset bytes). Absent: 0.
    public var offset: UInt64?
    /// A retry of a push the server already stored (same `pushID`): its result; nothing to send.
    public var stored: PreviewResult?

    public init(
        accepted: Bool, offerID: String?, failure: PreviewFailure?, offset: UInt64? = nil, stored: PreviewResult? = nil
    ) {
        self.accepted = accepted
        self.offerID = offerID
        self.failure = failure
        self.offset = offset
        self.stored = stored
    }

    public static func accept(_ offerID: String, offset: UInt64 = 0) -> PreviewOfferReply {
        PreviewOfferReply(accepted: true, offerID: offerID, failure: nil, offset: offset > 0 ? offset : nil)
    }
    public static func refuse(_ failure: PreviewFailure) -> PreviewOfferReply {
        PreviewOfferReply(accepted: false, offerID: nil, failure: failure)
    }
    public static func alreadyStored(_ result: PreviewResult) -> PreviewOfferReply {
        PreviewOfferReply(accepted: false, offerID: nil, failure: nil, stored: result)
    }
}

/// Message `preview.result`: the outcome of one push.
public struct PreviewResult: Codable, Sendable, Hashable {
    /// The offer this result belongs to.
    public var offerID: String
    /// The name the file was stored under (a suffix like " (2)" when the name existed).
    public var storedName: String?
    /// SHA-256 of the stored bytes, lowercase hex.
    public var sha256: String?
    /// Size of the stored file.
    public var size: UInt64?
    /// Why the push failed (nil: stored).
    public var failure: PreviewFailure?
    /// The previewer's web page, when it listens beyond loopback: where a browser opens it, with its
    /// token (sent only with a stored result, over the encrypted channel, so only a pusher the
    /// previewer accepts learns it). Absent from older previewers.
    public var page: PageLink?

    /// The page's port and its path with the token (`/t/TOKEN/`); the host is the previewer's
    /// address the pusher reached.
    public struct PageLink: Codable, Sendable, Hashable {
        public var port: UInt16
        public var path: String

        public init(port: UInt16, path: String) {
            self.port = port
            self.path = path
        }
    }

    public init(
        offerID: String, storedName: String? = nil, sha256: String? = nil, size: UInt64? = nil,
        failure: PreviewFailure? = nil, page: PageLink? = nil
    ) {
        self.offerID = offerID
        self.storedName = storedName
        self.sha256 = sha256
        self.size = size
        self.failure = failure
        self.page = page
    }
}
