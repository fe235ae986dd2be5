import Crypto
import Foundation
import Locks
import Logging
import ProtocolCore
import Transport
import SystemCalls

/// Why a resumable receive did not produce a complete file.
public struct ResumableTransferError: Error, Sendable, CustomStringConvertible {
    /// The kind of failure.
    public enum Code: Sendable, Hashable {
        /// The bytes stopped before the end (connection lost, sender aborted, cancelled): what arrived
        /// is kept, and the next offer of the same content resumes after it.
        case interrupted
        /// The whole file does not have the announced SHA-256: the partial file was deleted.
        case hashMismatch
        /// More bytes arrived than announced, or an offset beyond what is kept: the partial was deleted.
        case sizeMismatch
        /// Another receive of the same content is running.
        case busy
        /// Writing, reading or syncing the partial file failed (the `errno` is in the message).
        case storage
    }

    /// The kind of failure.
    public let code: Code
    /// What happened and what to do.
    public let message: String
    /// Bytes kept for a resume (after an interruption).
    public let kept: UInt64

    public var description: String { message }
}
