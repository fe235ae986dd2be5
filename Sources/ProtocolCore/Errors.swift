import Glibc

/// An error of a connection, a channel or a message (connecting, the hello, sending, decoding).
///
/// Match on ``code`` (for example `error.code == .requestTimedOut`); ``message`` says what happened
/// and what to do about it. New codes may be added without breaking callers.
public struct TransportError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kind of a ``TransportError``.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case syscallFailed, invalidAddress, connectFailed, connectTimedOut, connectionClosed
            case versionMismatch, helloRefused, helloFailed, requestTimedOut, encodingFailed, decodingFailed
            case frameTooLarge, protocolViolation, transferFailed, invalidArgument, listenerFailed, authenticationFailed
            case untrustedKey, serverBusy
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A system call failed; ``TransportError/errno`` and ``TransportError/call`` say which and why.
        public static let syscallFailed = Code(.syscallFailed)
        /// A string could not be parsed as a numeric IPv4/IPv6 address.
        public static let invalidAddress = Code(.invalidAddress)
        /// No address could be connected to; ``TransportError/connectFailures`` lists each attempt.
        public static let connectFailed = Code(.connectFailed)
        /// Connecting did not complete within the timeout.
        public static let connectTimedOut = Code(.connectTimedOut)
        /// The connection is closed; ``TransportError/closeReason`` says why.
        public static let connectionClosed = Code(.connectionClosed)
        /// The peers speak different protocol versions.
        public static let versionMismatch = Code(.versionMismatch)
        /// The peer refused the hello exchange.
        public static let helloRefused = Code(.helloRefused)
        /// The server has too many connections in their handshake (in all, or from this address)
        /// and refused this one before any key agreement (REFUSE `busy`): try again shortly.
        public static let serverBusy = Code(.serverBusy)
        /// The hello exchange failed (timeout, malformed hello, connection lost).
        public static let helloFailed = Code(.helloFailed)
        /// A request got no reply within its timeout.
        public static let requestTimedOut = Code(.requestTimedOut)
        /// A value could not be encoded by the codec.
        public static let encodingFailed = Code(.encodingFailed)
        /// A payload could not be decoded into the requested type.
        public static let decodingFailed = Code(.decodingFailed)
        /// A frame exceeds the configured maximum frame size.
        public static let frameTooLarge = Code(.frameTooLarge)
        /// The peer violated the wire protocol.
        public static let protocolViolation = Code(.protocolViolation)
        /// A streamed transfer failed or was aborted.
        public static let transferFailed = Code(.transferFailed)
        /// An argument was out of range.
        public static let invalidArgument = Code(.invalidArgument)
        /// The listener could not be set up.
        public static let listenerFailed = Code(.listenerFailed)
        /// Pre-shared-key authentication failed (wrong or missing key on one side), or the encrypted
        /// handshake itself failed (a message that does not decrypt).
        public static let authenticationFailed = Code(.authenticationFailed)
        /// The peer proved a key this side does not trust: it differs from the key remembered for
        /// its name (trust on first use: the peer was reinstalled — or is an impostor), it is not
        /// among the pinned fingerprints, or the app's trust policy refused it. Retrying does not
        /// change it: the message says what the user can do.
        public static let untrustedKey = Code(.untrustedKey)

        /// The code's name.
        public var description: String { base.rawValue }
    }

    /// One failed connection attempt, reported by ``TransportError/connectFailures``.
    public struct ConnectFailure: Hashable, Sendable, CustomStringConvertible {
        /// The address that was tried.
        public let address: SocketAddress
        /// Why the attempt failed (a syscall error, or a timeout/cancellation note).
        public let reason: String
        /// The system's error number when the system refused the attempt (`ECONNREFUSED`: nothing
        /// listens at the address; `EHOSTUNREACH`, …); nil for a timeout or cancellation.
        public let errno: Int32?
        /// A textual description: `address: reason`.
        public var description: String { "\(address): \(reason)" }

        package init(address: SocketAddress, reason: String, errno: Int32? = nil) {
            self.address = address
            self.reason = reason
            self.errno = errno
        }
    }

    /// The kind of error.
    public let code: Code
    /// A human-readable explanation: what happened and what to do.
    public let message: String
    /// The `errno` value, for ``Code/syscallFailed`` and some connect failures.
    public let errno: Int32?
    /// The name of the failed system call, for ``Code/syscallFailed``.
    public let call: String?
    /// The reason the connection closed, for ``Code/connectionClosed``.
    public let closeReason: CloseReason?
    /// Each address's failure, for ``Code/connectFailed`` and ``Code/connectTimedOut``.
    public let connectFailures: [ConnectFailure]
    /// Whether every address refused the connection (`ECONNREFUSED`): the hosts answered, and
    /// nothing listens on that port — a server that is restarting, or moved to another port.
    package var everyAddressRefused: Bool {
        code == .connectFailed && !connectFailures.isEmpty && connectFailures.allSatisfy { $0.errno == ECONNREFUSED }
    }

    /// For ``Code/serverBusy``: how long the server asked the client to wait before trying again
    /// (nil when it did not say).
    public let retryAfter: Duration?

    package init(
        _ code: Code, _ message: String, errno: Int32? = nil, call: String? = nil,
        closeReason: CloseReason? = nil, connectFailures: [ConnectFailure] = [], retryAfter: Duration? = nil
    ) {
        self.code = code
        self.message = message
        self.errno = errno
        self.call = call
        self.closeReason = closeReason
        self.connectFailures = connectFailures
        self.retryAfter = retryAfter
    }

    /// A textual description including the code and message.
    public var description: String { "TransportError.\(code): \(message)" }

    package static func syscall(_ call: String, errno: Int32) -> TransportError {
        TransportError(
            .syscallFailed, "\(call) failed: \(errnoString(errno)) (errno \(errno))", errno: errno, call: call)
    }

    package static func closed(_ reason: CloseReason) -> TransportError {
        TransportError(.connectionClosed, "the connection is closed (\(reason)); open a new one", closeReason: reason)
    }
}

package func errnoString(_ code: Int32) -> String {
    String(cString: strerror(code))
}

/// Why a connection ended.
public enum CloseReason: Hashable, Sendable, CustomStringConvertible {
    /// The peer closed its side (end of file) without a GOODBYE frame.
    case closedByPeer
    /// The peer sent a GOODBYE frame with this reason text, then closed.
    case goodbye(String)
    /// The peer reset the connection (ECONNRESET / EPIPE).
    case reset
    /// The peer announced a frame larger than the configured limit.
    case frameTooLarge(size: UInt64, limit: Int)
    /// The peer violated the wire protocol; the text says how.
    case protocolError(String)
    /// Nothing complete arrived within the idle timeout (for example half a frame and then silence).
    case idleTimeout
    /// The peer did not answer pings within the heartbeat timeout.
    case heartbeatTimeout
    /// The hello exchange did not complete in time, or was refused; the text says why.
    case helloFailed(String)
    /// This side closed the connection (``MessageChannel/close()`` or ``MessageChannel/abort()``).
    case localClose
    /// A system call failed with this `errno`.
    case error(Int32)
    /// Server: the client's connection was lost and it did not resume its message session within
    /// the grace period.
    case sessionExpired
    /// Server: the client resumed its message session on a new connection while this one still
    /// looked open — it had been lost without a sign (a half-open connection).
    case superseded

    /// A textual description of the reason.
    public var description: String {
        switch self {
        case .closedByPeer: "closed by peer"
        case .goodbye(let reason): "peer said goodbye: \(reason)"
        case .reset: "connection reset by peer"
        case .frameTooLarge(let size, let limit): "frame of \(size) bytes exceeds the limit of \(limit) bytes"
        case .protocolError(let text): "protocol error: \(text)"
        case .idleTimeout: "idle timeout"
        case .heartbeatTimeout: "heartbeat timeout"
        case .helloFailed(let text): "hello failed: \(text)"
        case .localClose: "closed locally"
        case .sessionExpired: "the connection was lost and the client did not come back within the session's grace period"
        case .superseded: "the client came back on a new connection before this one was seen lost"
        case .error(let code): "error: \(errnoString(code)) (errno \(code))"
        }
    }
}

/// `text` as one log line: a multi-line message (the key-change warning, a banner of `@` lines)
/// becomes its first line of words, and `more` says where the rest is. A single line is kept.
package func firstLine(of text: String, more: String) -> String {
    var lines = text.split(separator: "\n").map { line -> Substring in
        var line = line[...]
        while let first = line.first, first == "@" || first == " " { line = line.dropFirst() }
        while let last = line.last, last == "@" || last == " " { line = line.dropLast() }
        return line
    }
    lines.removeAll { $0.isEmpty }
    guard lines.count > 1, let first = lines.first else { return text }
    return "\(first) (\(more))"
}
