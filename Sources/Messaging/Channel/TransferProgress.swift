import Foundation
import ProtocolCore
import Transport

/// Progress of a streamed transfer (bytes done of total), reported on both sides.
public struct TransferProgress: Sendable, Hashable {
    /// The stream id (sequence number of the STREAM_START frame).
    public let streamID: UInt64
    /// The transfer's type id.
    public let typeID: String
    /// Bytes sent or received so far.
    public let completedBytes: UInt64
    /// The announced total size.
    public let totalBytes: UInt64
    /// True once the transfer ended successfully.
    public let isFinished: Bool

    /// Completed fraction between 0 and 1.
    public var fraction: Double { totalBytes == 0 ? 1 : Double(completedBytes) / Double(totalBytes) }
}
