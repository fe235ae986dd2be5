import Foundation
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

/// A streamed transfer arriving from the peer (for example a file).
///
/// Consume ``chunks`` (or use ``write(toFile:)`` / ``collect()``); chunks are never assembled in
/// memory unless you ask. If you do not want it, call ``discard()`` — an unconsumed transfer
/// eventually pauses reading of the whole connection.
public final class IncomingTransfer: Sendable {
    /// The stream id (the peer's sequence number of STREAM_START).
    public let streamID: UInt64
    /// The app-chosen type id.
    public let typeID: String
    /// The announced size in bytes.
    public let totalSize: UInt64
    /// App metadata sent with the transfer (file name, MIME type, …).
    public let metadata: [String: String]
    /// Progress as bytes arrive (latest value buffered); finishes when the transfer ends.
    public let progress: AsyncStream<TransferProgress>
    let buffer: BoundedQueue<[UInt8]>
    let progressContinuation: AsyncStream<TransferProgress>.Continuation

    init(streamID: UInt64, typeID: String, header: TransferHeader, buffer: BoundedQueue<[UInt8]>) {
        self.streamID = streamID
        self.typeID = typeID
        self.totalSize = header.size
        self.metadata = header.metadata
        self.buffer = buffer
        (progress, progressContinuation) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// The transfer's bytes, chunk by chunk. Throws `TransportError.Code.transferFailed` when the
    /// sender aborts, the size does not match, or the connection closes early.
    public var chunks: Chunks { Chunks(buffer: buffer) }

    /// The chunks of an ``IncomingTransfer``.
    public struct Chunks: AsyncSequence, Sendable {
        /// The element type: one chunk of bytes.
        public typealias Element = [UInt8]
        let buffer: BoundedQueue<[UInt8]>
        /// The iterator.
        public struct AsyncIterator: AsyncIteratorProtocol {
            let buffer: BoundedQueue<[UInt8]>
            /// The next chunk, or nil at the end of the transfer.
            public mutating func next() async throws -> [UInt8]? { try await buffer.next() }
        }
        /// Makes an iterator.
        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(buffer: buffer) }
    }

    /// Streams the transfer into a file (created or truncated), chunk by chunk.
    public func write(toFile path: String) async throws {
        let fd = FileDescriptor(
            try syscallValue("open(\(path))") { open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644) })
        defer { fd.close() }
        for try await chunk in chunks {
            var offset = 0
            while offset < chunk.count {
                let written = try chunk.withUnsafeBytes { (raw) throws(TransportError) -> Int in
                    try syscallValue("write(\(path))") {
                        Foundation.write(fd.rawValue, raw.baseAddress! + offset, raw.count - offset)
                    }
                }
                offset += written
            }
        }
    }

    /// Collects the whole transfer in memory (only for transfers you know are small).
    public func collect() async throws -> [UInt8] {
        var result: [UInt8] = []
        result.reserveCapacity(Int(clamping: min(totalSize, 64 * 1024 * 1024)))
        for try await chunk in chunks { result += chunk }
        return result
    }

    /// Drops the transfer: buffered and later chunks are thrown away.
    public func discard() { buffer.discard() }
}

/// The transfers a channel receives. Bounded like ``IncomingMessages``; ends when the channel closes.
public struct IncomingTransfers: AsyncSequence, Sendable {
    /// The element type.
    public typealias Element = IncomingTransfer
    let buffer: BoundedQueue<IncomingTransfer>

    /// The iterator.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let buffer: BoundedQueue<IncomingTransfer>
        /// The next transfer, or nil once the channel is closed.
        public mutating func next() async -> IncomingTransfer? { try? await buffer.next() }
    }

    /// Makes an iterator.
    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(buffer: buffer) }
}
