import Foundation
import Locks
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

extension MessageChannel {
    /// The largest chunk a transfer to this peer may carry: its frame limit minus the 20 bytes of a
    /// STREAM_CHUNK's header (12 fixed + the 8-byte stream id).
    public var maxChunkSize: Int { peerMaxFrameSize - Frame.fixedHeaderSize - 8 }

    /// Starts a streamed transfer of `totalSize` bytes; send the bytes with ``OutgoingTransfer/send(_:)``.
    public func startTransfer(type: String, totalSize: UInt64, metadata: [String: String] = [:]) async throws
        -> OutgoingTransfer
    {
        try await startTransfer(type: type, totalSize: totalSize, metadata: metadata, progress: nil)
    }

    /// Starts a transfer whose chunks are reported to `progress` as they go.
    private func startTransfer(
        type: String, totalSize: UInt64, metadata: [String: String], progress: (@Sendable (TransferProgress) -> Void)?
    ) async throws -> OutgoingTransfer {
        var frame = HandshakeStateMachine.jsonFrame(.streamStart, TransferHeader(size: totalSize, metadata: metadata))
        frame.typeID = type
        let streamID = try await driver.send(frame)
        return OutgoingTransfer(channel: self, streamID: streamID, typeID: type, totalSize: totalSize, progress: progress)
    }

    /// Streams a file to the peer in chunks, never holding more than a chunk (plus the bounded send
    /// queue) in memory.
    ///
    /// - Parameters:
    ///   - path: The file to send.
    ///   - type: The transfer's type id.
    ///   - metadata: App metadata (for example the file name).
    ///   - offset: Send the file from this byte on (a resume: the receiver said it has the bytes
    ///     before it, see ``PartialTransfers``); the transfer's size is the rest of the file.
    ///   - chunkSize: Bytes per chunk (default 64 KiB; at most ``maxChunkSize``).
    ///   - progress: Called with 0 bytes when the transfer starts, after every chunk, and once finished
    ///     (counting from `offset`).
    public func sendFile(
        at path: String, type: String, metadata: [String: String] = [:], startingAt offset: UInt64 = 0,
        chunkSize: Int = 64 * 1024, progress: (@Sendable (TransferProgress) -> Void)? = nil
    ) async throws {
        guard chunkSize > 0, chunkSize <= maxChunkSize else {
            throw TransportError(
                .invalidArgument,
                "chunk size \(chunkSize) must be positive and at most \(maxChunkSize) bytes (the peer's frame limit minus 20)")
        }
        let fd = FileDescriptor(try syscallValue("open(\(path))") { open(path, O_RDONLY | O_CLOEXEC) })
        defer { fd.close() }
        var info = stat()
        try syscallValue("fstat(\(path))") { fstat(fd.rawValue, &info) }
        let size = UInt64(info.st_size)
        guard offset <= size else {
            throw TransportError(.invalidArgument, "offset \(offset) is beyond the end of \(path) (\(size) bytes)")
        }
        if offset > 0 { try syscallValue("lseek(\(path))") { lseek(fd.rawValue, off_t(offset), SEEK_SET) } }
        let transfer = try await startTransfer(type: type, totalSize: size - offset, metadata: metadata, progress: progress)
        progress?(transfer.status(0, finished: false))
        var buffer = [UInt8](repeating: 0, count: chunkSize)
        do {
            while true {
                let count = try buffer.withUnsafeMutableBytes { (raw) throws(TransportError) -> Int in
                    try syscallValue("read(\(path))") { read(fd.rawValue, raw.baseAddress, raw.count) }
                }
                if count == 0 { break }
                try await transfer.send(count == chunkSize ? buffer : Array(buffer[0..<count]))
            }
            try await transfer.finish()
        } catch {
            await transfer.abort(reason: "sender failed: \(error)")
            throw error
        }
    }
}

/// A streamed transfer being sent; created by ``MessageChannel/startTransfer(type:totalSize:metadata:)``.
///
/// Call ``send(_:)`` for each chunk (sequentially), then ``finish()``.
public final class OutgoingTransfer: Sendable {
    private let channel: MessageChannel
    /// The stream id (this side's sequence number of STREAM_START).
    public let streamID: UInt64
    /// The transfer's type id.
    public let typeID: String
    /// The announced total size.
    public let totalSize: UInt64
    private struct State {
        var sent: UInt64 = 0
        var ended = false
    }
    private let state = Locked(State())
    /// Told after every chunk and once finished (``MessageChannel/sendFile(at:type:metadata:startingAt:chunkSize:progress:)``).
    private let progress: (@Sendable (TransferProgress) -> Void)?

    init(
        channel: MessageChannel, streamID: UInt64, typeID: String, totalSize: UInt64,
        progress: (@Sendable (TransferProgress) -> Void)? = nil
    ) {
        self.channel = channel
        self.streamID = streamID
        self.typeID = typeID
        self.totalSize = totalSize
        self.progress = progress
    }

    /// The progress after `sent` bytes.
    func status(_ sent: UInt64, finished: Bool) -> TransferProgress {
        TransferProgress(streamID: streamID, typeID: typeID, completedBytes: sent, totalBytes: totalSize, isFinished: finished)
    }

    /// Sends one chunk; suspends while the channel's send queue is full (this is what bounds memory).
    public func send(_ chunk: [UInt8]) async throws {
        let total: UInt64? = state.withLock { state in
            guard !state.ended, state.sent + UInt64(chunk.count) <= totalSize else { return nil }
            state.sent += UInt64(chunk.count)
            return state.sent
        }
        guard let total else {
            throw TransportError(
                .invalidArgument,
                "chunk exceeds the announced size \(totalSize) of transfer #\(streamID), or it has ended")
        }
        _ = try await channel.driver.send(Frame(kind: .streamChunk, reference: streamID, payload: chunk))
        progress?(status(total, finished: false))
    }

    /// Ends the transfer. Throws `TransportError.Code.transferFailed` (and aborts it) when fewer bytes
    /// than announced were sent.
    public func finish() async throws {
        guard let done = end() else { return }
        guard done == totalSize else {
            let reason = "sent \(done) of \(totalSize) announced bytes"
            _ = try? await channel.driver.send(
                Frame(kind: .streamEnd, reference: streamID, payload: Array(reason.utf8)), bypassLimit: true)
            throw TransportError(.transferFailed, "transfer #\(streamID) \(reason); the receiver saw it as aborted")
        }
        _ = try await channel.driver.send(Frame(kind: .streamEnd, reference: streamID))
        progress?(status(done, finished: true))
    }

    /// Ends the transfer (finished or aborted): the bytes sent, or nil when it had ended already.
    private func end() -> UInt64? {
        state.withLock { state in
            defer { state.ended = true }
            return state.ended ? nil : state.sent
        }
    }

    /// Aborts the transfer; the receiver's chunk sequence throws with `reason`.
    public func abort(reason: String) async {
        guard end() != nil else { return }
        _ = try? await channel.driver.send(
            Frame(kind: .streamEnd, reference: streamID, payload: Array(reason.isEmpty ? "aborted".utf8 : reason.utf8)),
            bypassLimit: true)
    }
}

/// The hello exchange on a fresh connection, with optional pre-shared-key authentication.
