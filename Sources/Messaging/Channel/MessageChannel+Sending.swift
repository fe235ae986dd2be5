import FastJSON
import Foundation
import ProtocolCore
import Transport

extension MessageChannel {
    /// Queues `frame`: at once when there is room (a plain call, no suspension), else waits for room.
    /// `@inline(__always)` so the fast path costs the caller no async frame of its own.
    @inline(__always)
    private func transmit(_ frame: Frame) async throws(TransportError) {
        if try driver.sendNow(frame) == nil { _ = try await driver.send(frame) }
    }

    private func encode<T: Encodable>(_ value: T, type: String) throws(TransportError) -> (UInt8, [UInt8]) {
        let codec = configuration.codecs.sendCodec
        do {
            return (codec.id, try codec.encode(value))
        } catch {
            throw TransportError(.encodingFailed, "could not encode \(T.self) for message '\(type)': \(error)")
        }
    }

    /// Sends a message encoded with the configured codec. Suspends while the send queue is full
    /// (above `ConnectionConfiguration.sendHighWaterMark`) until it drains below the low-water mark;
    /// that wait ends early only when the connection closes, not on task cancellation.
    /// - Parameters:
    ///   - value: The value to encode.
    ///   - type: The stable, app-chosen type id (at most 255 UTF-8 bytes), for example `"chat.message"`.
    /// - Throws: `TransportError.Code.encodingFailed`, `TransportError.Code.connectionClosed`,
    ///   `TransportError.Code.frameTooLarge` (larger than the peer accepts: nothing was sent).
    public func send<T: Encodable>(_ value: T, type: String) async throws {
        let (codec, payload) = try encode(value, type: type)
        try await transmit(Frame(kind: .message, codecID: codec, typeID: type, payload: payload))
    }

    /// Sends several messages of one type, in order, with one hand-off to the connection: all are
    /// encoded on the calling thread, numbered together and written with as few `sendmsg` calls as
    /// the socket allows (often one, from this thread). For a stream of small messages this saves
    /// a thread wake-up per message or two, like a NIO handler that flushes every N writes.
    ///
    /// The batch is admitted as a whole while the send queue is below its high-water mark and the
    /// batch is not larger than the mark (so the queue exceeds the mark by at most one batch);
    /// otherwise the messages wait one by one like ``send(_:type:)``.
    /// - Throws: `TransportError.Code.encodingFailed` (nothing of the batch is sent),
    ///   `TransportError.Code.connectionClosed`.
    public func send<T: Encodable>(contentsOf values: some Sequence<T>, type: String) async throws {
        var frames: [Frame] = []
        frames.reserveCapacity(values.underestimatedCount)
        for value in values {
            let (codec, payload) = try encode(value, type: type)
            frames.append(Frame(kind: .message, codecID: codec, typeID: type, payload: payload))
        }
        try await driver.send(contentsOf: frames)
    }

    /// Encodes a value with this channel's send codec, without sending it — for sending the same bytes
    /// to many channels (a broadcast encodes once) with ``sendEncoded(_:codecID:type:)``.
    public func encodeForSending<T: Encodable>(_ value: T, type: String) throws(TransportError) -> (
        codecID: UInt8, payload: [UInt8]
    ) {
        let (codec, payload) = try encode(value, type: type)
        return (codec, payload)
    }

    /// Sends a payload already encoded with the codec `codecID`.
    public func sendEncoded(_ payload: [UInt8], codecID: UInt8, type: String) async throws {
        try await transmit(Frame(kind: .message, codecID: codecID, typeID: type, payload: payload))
    }

    /// Sends a message without suspending, when the send queue has room: callable from any context,
    /// including an ``on(type:as:_:)`` handler (which runs on the channel's loop), so a handler can
    /// answer without a task. An idle connection writes the frame to the socket at once.
    /// - Parameters:
    ///   - value: The value to encode with the configured codec.
    ///   - type: The stable type id.
    ///   - replyTo: The sequence number of the message this one answers (``IncomingMessage/sequence``).
    /// - Returns: false, having sent nothing, while the send queue is above
    ///   `ConnectionConfiguration.sendHighWaterMark` (or other senders are waiting): use
    ///   ``send(_:type:)`` then, which waits for room.
    /// - Throws: `TransportError.Code.encodingFailed`, `TransportError.Code.connectionClosed`,
    ///   `TransportError.Code.invalidArgument` (type id longer than 255 bytes),
    ///   `TransportError.Code.frameTooLarge`.
    public func trySend<T: Encodable>(
        _ value: T, type: String, replyTo: UInt64? = nil
    ) throws(TransportError) -> Bool {
        let (codec, payload) = try encode(value, type: type)
        return try driver.trySend(
            Frame(kind: .message, codecID: codec, typeID: type, reference: replyTo, payload: payload))
    }

    /// Sends raw bytes (codec 0, no encoding, no base64).
    public func sendRaw(_ bytes: [UInt8], type: String) async throws {
        try await transmit(Frame(kind: .message, codecID: WireProtocol.rawCodecID, typeID: type, payload: bytes))
    }

    /// Replies to the request `message` (the reply carries its sequence number as reply-to).
    /// - Throws: `TransportError.Code.invalidArgument` when `message` was not a request (sent with
    ///   `send`, not `request`: nobody waits for a reply), and the errors of ``send(_:type:)``.
    ///
    /// A reply larger than the requester accepts (its `max_frame`) is not sent: the requester gets
    /// the error reply `too_large` instead (it would otherwise wait until its timeout), and this
    /// call throws `TransportError.Code.frameTooLarge`.
    public func reply<T: Encodable>(to message: IncomingMessage, with value: T, type: String) async throws {
        try Self.checkIsRequest(message)
        let (codec, payload) = try encode(value, type: type)
        try await transmitReply(
            Frame(kind: .message, codecID: codec, typeID: type, reference: message.sequence, payload: payload), to: message)
    }

    /// Replies to the request `message` with raw bytes (an oversized reply: as ``reply(to:with:type:)``).
    public func replyRaw(to message: IncomingMessage, bytes: [UInt8], type: String) async throws {
        try Self.checkIsRequest(message)
        try await transmitReply(
            Frame(
                kind: .message, codecID: WireProtocol.rawCodecID, typeID: type, reference: message.sequence,
                payload: bytes), to: message)
    }

    /// Sends a reply; one the peer would refuse for its size becomes the error reply `too_large`.
    private func transmitReply(_ frame: Frame, to message: IncomingMessage) async throws(TransportError) {
        do {
            try await transmit(frame)
        } catch where error.code == .frameTooLarge {
            try? await transmit(tooLargeReply(to: message))
            throw error
        }
    }

    /// The error reply `too_large` that replaces a reply the requester would refuse for its size.
    private func tooLargeReply(to message: IncomingMessage) -> Frame {
        let text = "the reply to '\(message.typeID)' is larger than this peer accepts (\(peerMaxFrameSize) bytes); "
            + "ask for less, or have it sent as a stream"
        return Self.errorFrame(RemoteError(code: RemoteError.tooLarge, message: text), to: message)
    }

    /// Answers the request `message` with an error: the requester's `request(...)` throws
    /// `error` (a ``RemoteError`` with your code and message).
    public func reply(to message: IncomingMessage, error: RemoteError) async throws {
        try Self.checkIsRequest(message)
        try await transmit(Self.errorFrame(error, to: message))
    }

    /// Replies without suspending, when the send queue has room (for ``on(type:as:_:)`` handlers):
    /// false, having sent nothing, when the queue is full. Any context.
    /// - Throws: like ``reply(to:with:type:)`` — an oversized reply throws
    ///   `TransportError.Code.frameTooLarge` and the requester gets the error reply `too_large`.
    public func tryReply<T: Encodable>(to message: IncomingMessage, with value: T, type: String) throws(TransportError)
        -> Bool
    {
        try Self.checkIsRequest(message)
        do {
            return try trySend(value, type: type, replyTo: message.sequence)
        } catch where error.code == .frameTooLarge {
            _ = try? driver.trySend(tooLargeReply(to: message))
            throw error
        }
    }

    /// ``reply(to:error:)`` without suspending (false when the send queue is full). Any context.
    public func tryReply(to message: IncomingMessage, error: RemoteError) throws(TransportError) -> Bool {
        try Self.checkIsRequest(message)
        return try driver.trySend(Self.errorFrame(error, to: message))
    }

    static func errorFrame(_ error: RemoteError, to message: IncomingMessage) -> Frame {
        var frame = HandshakeStateMachine.jsonFrame(.message, error)
        frame.typeID = message.typeID
        frame.reference = message.sequence
        frame.isError = true
        return frame
    }

    static func checkIsRequest(_ message: IncomingMessage) throws(TransportError) {
        guard message.expectsReply else {
            throw TransportError(
                .invalidArgument,
                "message '\(message.typeID)' #\(message.sequence) was sent with send(), not request(): "
                    + "nobody waits for a reply; send an ordinary message instead")
        }
    }

    // MARK: Requests

    /// Sends a request and waits for the peer's reply (matched by reply-to), decoded as `Response`.
    ///
    /// Cancelling the calling task stops the wait with `CancellationError` (a later reply is dropped).
    ///
    /// - Throws: ``RemoteError`` when the peer answers with an error (``reply(to:error:)``),
    ///   `TransportError.Code.requestTimedOut` when no reply arrives within `timeout` (a later
    ///   reply is dropped with a log line; the message says whether the peer was silent or this side
    ///   had stopped reading), `TransportError.Code.decodingFailed`, `TransportError.Code.connectionClosed`.
    public func request<Request: Encodable, Response: Decodable>(
        _ value: Request, type: String, expecting: Response.Type = Response.self, timeout: Duration = .seconds(10)
    ) async throws -> Response {
        let (codec, payload) = try encode(value, type: type)
        let reply = try await requestMessage(
            Frame(kind: .message, codecID: codec, typeID: type, payload: payload), timeout: timeout)
        return try reply.decode(Response.self)
    }

    /// Sends raw bytes as a request and returns the undecoded reply.
    /// - Throws: like ``request(_:type:expecting:timeout:)``.
    public func requestRaw(_ bytes: [UInt8], type: String, timeout: Duration = .seconds(10)) async throws
        -> IncomingMessage
    {
        try await requestMessage(
            Frame(kind: .message, codecID: WireProtocol.rawCodecID, typeID: type, payload: bytes), timeout: timeout)
    }

    /// Loop-confined bookkeeping of one request, shared with its cancellation handler.
    private final class RequestHandle: @unchecked Sendable {
        var sequence: UInt64?  // confined to the channel's loop
        var cancelled = false  // confined to the channel's loop
    }

    private func requestMessage(_ request: Frame, timeout: Duration) async throws -> IncomingMessage {
        let frame = { () -> Frame in
            var frame = request
            frame.expectsReply = true
            return frame
        }()
        let handle = RequestHandle()
        let reply: IncomingMessage = try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                onLoop {
                    guard !handle.cancelled else {
                        continuation.resume(throwing: CancellationError())
                        return
                    }
                    // On the loop, so the request is tracked before its reply can be read (the
                    // completion runs on the loop: at once, or when the flush admits the frame).
                    self.driver.enqueue(frame) { result in
                        switch result {
                        case .failure(let error):
                            continuation.resume(throwing: error)
                        case .success(let sequence):
                            guard !handle.cancelled else {
                                self.machine.requestAbandoned(sequence)
                                continuation.resume(throwing: CancellationError())
                                return
                            }
                            handle.sequence = sequence
                            self.track(sequence, typeID: frame.typeID, timeout: timeout, continuation)
                        }
                    }
                }
            }
        } onCancel: {
            queue.async {
                handle.cancelled = true
                if let sequence = handle.sequence, let entry = self.machine.requestCancelled(sequence) {
                    entry.token.resume(throwing: CancellationError())
                }
            }
        }
        if reply.isErrorReply {
            throw (try? FastJSONDecoder().decode(RemoteError.self, from: reply.payload))
                ?? RemoteError(code: "unknown", message: String(decoding: reply.payload.prefix(1000), as: UTF8.self))
        }
        return reply
    }

    /// Runs `body` on the loop: inline when already there (a task on ``taskExecutor``, a handler).
    private func onLoop(_ body: @escaping @Sendable () -> Void) {
        if driver.loop.isCurrent { body() } else { queue.async(execute: body) }
    }

    private func track(
        _ sequence: UInt64, typeID: String, timeout: Duration, _ continuation: CheckedContinuation<IncomingMessage, any Error>
    ) {
        assertOnLoop()
        if let deadline = machine.requestSent(
            sequence, typeID: typeID, now: driver.now, timeout: timeout.nanoseconds, token: continuation)
        {
            driver.setDeadline(.request, at: deadline)
        }
    }

    /// The request deadline passed: fail the requests that timed out, re-arm for the next one.
    func requestsTimedOut() {
        let now = driver.now
        let (expired, next) = machine.requestsExpired(now: now)
        for entry in expired {
            configuration.metrics?.requestTimeouts.increment()
            entry.token.resume(throwing: TransportError(.requestTimedOut, timeoutMessage(entry, now: now)))
        }
        driver.setDeadline(.request, at: next)
    }

    /// Says whose fault a timeout probably is: this side not reading (its buffers full because the
    /// app does not consume messages), a silent peer, or a peer that is alive but did not answer.
    private func timeoutMessage(_ entry: Machine.Request, now: UInt64) -> String {
        let waited = Duration.nanoseconds(Int64(clamping: now &- entry.sentAt))
        let head = "no reply to request '\(entry.typeID)' #\(entry.sequence) within \(waited)"
        if driver.isReadPaused {
            let unread =
                routeStopped
                ? "the app's events are full (nothing took them)"
                : "\(lazyMessageBuffer.load()?.count ?? 0) received messages were not consumed"
            return "\(head): this side stopped reading the connection because \(unread); the reply may be waiting "
                + "unread — consume `messages` (or the client's/server's events) or handle the types with on(type:)"
        }
        let silence = Duration.nanoseconds(Int64(clamping: now &- driver.lastFrameTime))
        if silence >= waited {
            return "\(head): the peer sent nothing for \(silence); it may be overloaded, stalled or unreachable"
        }
        return "\(head); the peer is alive (last frame \(silence) ago) but did not answer: it may not handle '\(entry.typeID)' requests"
    }
}
