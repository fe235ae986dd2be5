import Foundation
import ProtocolCore
import Transport

/// A message received from the peer.
public struct IncomingMessage: Sendable {
    /// The app-chosen type id, for example `"chat.message"`.
    public let typeID: String
    /// The peer's sequence number of this message; pass the message to ``MessageChannel/reply(to:with:type:)``.
    public let sequence: UInt64
    /// The sequence number of the message this one answers, if it is a reply.
    public let replyTo: UInt64?
    /// The codec id of ``payload`` (0 raw bytes, 1 JSON).
    public let codecID: UInt8
    /// The raw payload bytes, always available (also for unknown type ids and undecodable payloads).
    public let payload: [UInt8]
    /// Whether the sender awaits a reply: it sent the message with `request(...)`. Answer it with
    /// ``MessageChannel/reply(to:with:type:)`` or ``MessageChannel/reply(to:error:)``; a message sent
    /// with `send(...)` cannot be replied to.
    public let expectsReply: Bool
    /// Whether this is an error reply (``RemoteError``); `request(...)` throws those.
    let isErrorReply: Bool
    let codecs: CodecRegistry
    /// A session message's way back to its session (nil for any other message).
    let sessionToken: SessionMessageToken?

    init(frame: Frame, codecs: CodecRegistry, session: SessionMessageToken? = nil) {
        sessionToken = session
        typeID = frame.typeID
        sequence = frame.sequence
        replyTo = frame.reference
        codecID = frame.codecID
        payload = frame.payload
        expectsReply = frame.expectsReply
        isErrorReply = frame.isError
        self.codecs = codecs
    }

    /// Where this message stands in its message session (session and number), when it is a
    /// session message: a one-way message on a connection with a session. nil otherwise.
    ///
    /// Store it with the message's effect, and skip a message whose position you already have:
    /// each message then takes effect exactly once, also when a crash makes it arrive again.
    public var sessionPosition: SessionPosition? { sessionToken?.position }

    /// Says that the app has handled this session message: the sender may forget it. (Nothing for
    /// other messages, or when said before.)
    ///
    /// With ``SessionAcknowledgement/automatic`` (the default) the message counts as handled anyway
    /// when the loop iteration or handler that got it is done; call this to say so sooner. With
    /// ``SessionAcknowledgement/manual`` only this says so — call it for every session message, in
    /// any order, from any task: the sender hears of everything up to the first message not
    /// acknowledged yet. Acknowledgements are sent together (every 32 messages, or
    /// ``SessionConfiguration/ackDelay`` after the first).
    public func acknowledge() { sessionToken?.handled(automatic: false) }

    /// The code that got this message is done with it (its loop iteration, its handler): handled,
    /// with ``SessionAcknowledgement/automatic``.
    func handledAutomatically() { sessionToken?.handled(automatic: true) }

    /// Decodes the payload with the codec named by ``codecID``.
    ///
    /// A raw-bytes payload (codec 0) decodes only as `[UInt8]`.
    /// - Throws: `TransportError.Code.decodingFailed`; the connection is unaffected.
    public func decode<T: Decodable>(_ type: T.Type = T.self) throws(TransportError) -> T {
        if codecID == WireProtocol.rawCodecID {
            if let bytes = payload as? T { return bytes }
            throw TransportError(
                .decodingFailed,
                "message '\(typeID)' #\(sequence) carries raw bytes; read `payload` instead of decoding \(T.self)")
        }
        guard let codec = codecs.codec(for: codecID) else {
            throw TransportError(
                .decodingFailed,
                "message '\(typeID)' #\(sequence) uses codec \(codecID), which is not configured; "
                    + "add it to CodecRegistry"
            )
        }
        do {
            return try payload.withUnsafeBytes { try codec.decode(T.self, from: $0) }
        } catch {
            throw TransportError(
                .decodingFailed, "could not decode message '\(typeID)' #\(sequence) as \(T.self): \(error)")
        }
    }
}

/// The messages a channel receives that are not replies to its requests and not taken by a handler.
///
/// Bounded: when the app stops consuming, the channel stops reading the socket. Ends when the channel closes.
public struct IncomingMessages: AsyncSequence, Sendable {
    /// The element type.
    public typealias Element = IncomingMessage
    let buffer: BoundedQueue<IncomingMessage>

    /// The iterator. Asking it for the next message (or leaving the loop) counts as having handled
    /// the one before (``SessionAcknowledgement/automatic``).
    public struct AsyncIterator: AsyncIteratorProtocol {
        let buffer: BoundedQueue<IncomingMessage>
        let handling = HandledOnNext()
        /// The next message, or nil once the channel is closed (or the task is cancelled).
        public mutating func next() async -> IncomingMessage? {
            handling.done()
            let message = try? await buffer.next()
            handling.handling(message)
            return message
        }
    }

    /// Makes an iterator.
    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(buffer: buffer) }
}

/// The message an events iterator handed out last: handled when the iterator is asked for the next
/// element, or when it goes away (the loop ended: `break`, `return`, a throw).
/// (``SessionAcknowledgement/automatic``.) A class for its `deinit`; one per iterator.
final class HandledOnNext {
    /// Only the message's way back to its session: its payload is not kept here.
    private var current: SessionMessageToken?

    /// The app is handling `message` now (nil: nothing to handle).
    func handling(_ message: IncomingMessage?) { current = message?.sessionToken }

    /// The app is done with what it was handling.
    func done() {
        guard let token = current else { return }
        current = nil
        token.handled(automatic: true)
    }

    deinit { current?.handled(automatic: true) }
}

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
