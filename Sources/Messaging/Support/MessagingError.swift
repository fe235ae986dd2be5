import ProtocolCore

/// An error of the messaging layer (server or client): what happened and what to do.
public struct MessagingError: Error, Sendable, CustomStringConvertible {
    /// The kind of failure.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        fileprivate enum Kind: Sendable, Hashable {
            case notStarted, alreadyStarted, listenFailed, publishFailed, serviceNotFound, ambiguousService
            case connectFailed, stopped, peerTooSlow, notConnected, untrustedServer, unusableIdentity
            case sessionStoreUnusable, sessionStoreFailed
        }
        fileprivate let kind: Kind
        /// The server is not running.
        public static let notStarted = Code(kind: .notStarted)
        /// `start()` was called twice.
        public static let alreadyStarted = Code(kind: .alreadyStarted)
        /// The listening sockets could not be set up.
        public static let listenFailed = Code(kind: .listenFailed)
        /// Publishing through discovery failed.
        public static let publishFailed = Code(kind: .publishFailed)
        /// No service of that name (or type) was found in time.
        public static let serviceNotFound = Code(kind: .serviceNotFound)
        /// Several services matched and none was named.
        public static let ambiguousService = Code(kind: .ambiguousService)
        /// No address of the service accepted a connection.
        public static let connectFailed = Code(kind: .connectFailed)
        /// A peer did not accept data within the deadline (it does not read); it was dropped.
        public static let peerTooSlow = Code(kind: .peerTooSlow)
        /// The client has no connection (it is connecting or reconnecting, and none came within
        /// ``ClientConfiguration/connectionWait``).
        public static let notConnected = Code(kind: .notConnected)
        /// The server or client was stopped.
        public static let stopped = Code(kind: .stopped)
        /// The server proved a key this client does not trust (it changed since the first
        /// connection, is not pinned, or the trust policy refused it). Final: a client stops
        /// connecting and reconnecting at once (``ClientEvent/gaveUp(_:)``); `underlying` is the
        /// `TransportError` with code `untrustedKey`, whose message says what to do.
        public static let untrustedServer = Code(kind: .untrustedServer)
        /// This side's identity (its private key file) or trust store cannot be used: the server
        /// does not start (nothing listens, nothing is published), the client does not connect.
        /// The message names the file and what to do; `underlying` is the ``FileError``.
        public static let unusableIdentity = Code(kind: .unusableIdentity)
        /// The session store (``SessionConfiguration/store``) cannot be used: the server does not
        /// start, the client does not connect. Another process holds it, or its file is damaged,
        /// of another format version, or holds another identity's sessions; the message names the
        /// file and what to do (the library never resets a store by itself); `underlying` is the
        /// ``FileError``. Also, final (``ClientEvent/gaveUp(_:)``), when a connected client's store
        /// failed (a sync failed, or it could not keep a session's new epoch): it takes no more
        /// records in this process — restart it once the disk is mended.
        public static let sessionStoreUnusable = Code(kind: .sessionStoreUnusable)
        /// The session store could not keep a message (the disk is full, an I/O error): `send`
        /// failed and nothing of the message was kept or sent. With power-loss durability also when
        /// the store's sync failed: the message was not sent, and its record may be in the file
        /// (a process that opens the store again before a power loss sends it). `underlying` is
        /// the ``FileError``.
        public static let sessionStoreFailed = Code(kind: .sessionStoreFailed)

        public var description: String { "\(kind)" }
    }

    /// The kind of failure.
    public let code: Code
    /// What happened and what to do.
    public let message: String
    /// The underlying error (a `TransportError`, `DiscoveryError` or ``FileError``), if any.
    public let underlying: (any Error)?

    init(_ code: Code, _ message: String, underlying: (any Error)? = nil) {
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    public var description: String { message }
}

extension MessagingError {
    /// The error in one log line: a multi-line message (the key-change warning) is the app's to
    /// show — the error carries it whole — and the library's log says only its first line and
    /// where the rest is (issue 43, 7: the banner was shown twice, logged and printed).
    var logLine: String {
        firstLine(of: message, more: "\(code): the error reported to the app says what happened and what to do")
    }
}
