import ProtocolCore
import Dispatch
import Foundation
import Synchronization
import Logging

/// Settings of a ``MessageChannel``.
public struct ChannelConfiguration: Sendable {
    // The values live in one immutable, shared object (see SharedValues): every channel accepted
    // with the same configuration shares it instead of holding ~300 bytes of its own.
    struct Values: Sendable {
        var name: String
        var metadata: [String: String] = [:]
        var codecs: CodecRegistry = CodecRegistry()
        var connection: ConnectionConfiguration = ConnectionConfiguration()
        var protocolVersion: Int = WireProtocol.version
        var helloTimeout: Duration = .seconds(10)
        var pingInterval: Duration? = .seconds(5)
        var heartbeatTimeout: Duration = .seconds(15)
        var connectTimeout: Duration = .seconds(10)
        var connectAttemptDelay: Duration = .milliseconds(250)
        var incomingBufferLimit: Int = 64
        var transferChunkBufferLimit: Int = 16
        var helloValidator: (@Sendable (PeerInfo) -> String?)? = nil
        var preSharedKey: PreSharedKey? = nil
    }

    private var storage: SharedValues<Values>

    /// This side's name, sent in HELLO.
    public var name: String {
        get { storage.values.name }
        set { storage.update { $0.name = newValue } }
    }

    /// App metadata sent in HELLO.
    public var metadata: [String: String] {
        get { storage.values.metadata }
        set { storage.update { $0.metadata = newValue } }
    }

    /// Codecs: the one used to send, plus any others accepted on receive.
    public var codecs: CodecRegistry {
        get { storage.values.codecs }
        set { storage.update { $0.codecs = newValue } }
    }

    /// Frame-level settings (max frame size, send-queue water marks, idle timeout).
    public var connection: ConnectionConfiguration {
        get { storage.values.connection }
        set { storage.update { $0.connection = newValue } }
    }

    /// The protocol version this side speaks. Leave at ``WireProtocol/version`` (tests change it).
    public var protocolVersion: Int {
        get { storage.values.protocolVersion }
        set { storage.update { $0.protocolVersion = newValue } }
    }

    /// Close the connection when the hello exchange does not complete within this time.
    public var helloTimeout: Duration {
        get { storage.values.helloTimeout }
        set { storage.update { $0.helloTimeout = newValue } }
    }

    /// Send a PING this often (nil: no heartbeat).
    public var pingInterval: Duration? {
        get { storage.values.pingInterval }
        set { storage.update { $0.pingInterval = newValue } }
    }

    /// Close with ``CloseReason/heartbeatTimeout`` when nothing arrived from the peer for this long
    /// (checked every ``pingInterval``).
    public var heartbeatTimeout: Duration {
        get { storage.values.heartbeatTimeout }
        set { storage.update { $0.heartbeatTimeout = newValue } }
    }

    /// Overall timeout of an outbound connect (all addresses).
    public var connectTimeout: Duration {
        get { storage.values.connectTimeout }
        set { storage.update { $0.connectTimeout = newValue } }
    }

    /// Delay between Happy Eyeballs attempts (RFC 8305 recommends 250 ms).
    public var connectAttemptDelay: Duration {
        get { storage.values.connectAttemptDelay }
        set { storage.update { $0.connectAttemptDelay = newValue } }
    }

    /// How many unconsumed messages (and transfers) are buffered before reading pauses.
    public var incomingBufferLimit: Int {
        get { storage.values.incomingBufferLimit }
        set { storage.update { $0.incomingBufferLimit = newValue } }
    }

    /// How many unconsumed chunks per incoming transfer are buffered before reading pauses.
    public var transferChunkBufferLimit: Int {
        get { storage.values.transferChunkBufferLimit }
        set { storage.update { $0.transferChunkBufferLimit = newValue } }
    }

    /// Server side: return a non-nil refusal message to refuse a peer after its HELLO.
    public var helloValidator: (@Sendable (PeerInfo) -> String?)? {
        get { storage.values.helloValidator }
        set { storage.update { $0.helloValidator = newValue } }
    }

    /// A pre-shared key. When set, the hello includes a mutual HMAC-SHA256 challenge-response with
    /// fresh nonces from both sides (the key never travels): a server accepts only clients proving
    /// the same key, and a client accepts only a server proving it. See docs/PROTOCOL.md.
    public var preSharedKey: PreSharedKey? {
        get { storage.values.preSharedKey }
        set { storage.update { $0.preSharedKey = newValue } }
    }

    /// Creates a configuration with this side's name.
    public init(name: String) { storage = SharedValues(Values(name: name)) }

    var peerInfo: PeerInfo { PeerInfo(version: protocolVersion, name: name, metadata: metadata) }
}

/// A connected peer after a successful hello exchange: typed messages, request/response,
/// streamed transfers, heartbeat.
///
/// Create one with ``connect(to:configuration:logger:)`` (client) or
/// ``accept(_:configuration:logger:)`` (server). It stays open until either side closes, the peer
/// stops answering pings, or the peer misbehaves; ``closed()`` says why.
///
/// `@unchecked Sendable`: every mutable field is confined to the connection's serial queue.
public final class MessageChannel: @unchecked Sendable {
    let connection: Connection
    let configuration: ChannelConfiguration
    /// The connection's logger (with `peer` metadata), built when a line is logged.
    var logger: Logger { connection.logger }
    var queue: DispatchQueue { connection.queue }

    /// What the peer said about itself in the hello exchange.
    public let peer: PeerInfo
    /// The peer's address.
    public var remoteAddress: SocketAddress? { connection.remoteAddress }
    /// The local address of the connection.
    public var localAddress: SocketAddress? { connection.localAddress }
    /// Messages from the peer that are neither replies to ``request(_:type:expecting:timeout:)`` nor
    /// taken by an ``on(type:as:_:)`` handler — including unknown type ids and undecodable payloads.
    public let messages: IncomingMessages
    /// Streamed transfers from the peer.
    public var transfers: IncomingTransfers { IncomingTransfers(buffer: transferBuffer) }
    /// The transfers' buffer, made on first use: most channels never receive a transfer, and an
    /// idle channel should not pay for a second buffer.
    private let lazyTransferBuffer = AtomicLazyReference<BoundedBuffer<IncomingTransfer>>()
    private var transferBuffer: BoundedBuffer<IncomingTransfer> {
        if let buffer = lazyTransferBuffer.load() { return buffer }
        return lazyTransferBuffer.storeIfNil(Self.inboundBuffer(connection, limit: configuration.incomingBufferLimit))
    }

    // Queue-confined state.
    private var pendingRequests: [UInt64: CheckedContinuation<IncomingMessage, any Error>] = [:]
    private var expiredRequests: Set<UInt64> = []
    private var expiredOrder: [UInt64] = []
    private var handlers: [String: (IncomingMessage) -> Void] = [:]
    private var incoming: [UInt64: (transfer: IncomingTransfer, received: UInt64)] = [:]
    private var heartbeat: (any DispatchSourceTimer)?
    private var lastHeard = DispatchTime.now()

    init(connection: Connection, peer: PeerInfo, configuration: ChannelConfiguration, logger: Logger) {
        self.connection = connection
        self.peer = peer
        self.configuration = configuration
        messages = IncomingMessages(buffer: Self.inboundBuffer(connection, limit: configuration.incomingBufferLimit))
    }

    /// A buffer of inbound elements that pauses reading `connection` while it holds `limit` or more.
    private static func inboundBuffer<Element>(_ connection: Connection, limit: Int) -> BoundedBuffer<Element> {
        BoundedBuffer(
            limit: limit,
            onFull: { connection.pauseReading() },  // called from push(), which runs on the queue
            onDrained: { connection.queue.async { connection.resumeReading() } })
    }

    // MARK: Opening

    /// Connects to the first reachable address (Happy Eyeballs) and performs the hello exchange.
    ///
    /// - Parameters:
    ///   - addresses: Candidate addresses, for example every address a DNS-SD resolve returned.
    ///     Link-local IPv6 addresses need their interface index as scope id.
    ///   - configuration: This side's name, metadata, codecs, timeouts.
    ///   - logger: Where this channel logs.
    /// - Throws: ``TransportError`` — ``TransportError/Code/connectFailed``/``TransportError/Code/connectTimedOut``
    ///   (with each address's failure), ``TransportError/Code/versionMismatch``, ``TransportError/Code/helloRefused``,
    ///   ``TransportError/Code/helloFailed``.
    public static func connect(
        to addresses: [SocketAddress], configuration: ChannelConfiguration, logger: Logger
    ) async throws -> MessageChannel {
        let (fd, address) = try await TCPConnector.connect(
            to: addresses, attemptDelay: configuration.connectAttemptDelay, timeout: configuration.connectTimeout,
            logger: logger)
        logger.debug("connected to \(address); sending hello")
        let connection = Connection(fd: fd, configuration: configuration.connection, logger: logger)
        return try await Handshake(connection: connection, role: .client, configuration: configuration, logger: logger)
            .run()
    }

    /// Takes an accepted socket and performs the server side of the hello exchange.
    ///
    /// - Throws: ``TransportError/Code/versionMismatch`` (the peer was told why),
    ///   ``TransportError/Code/helloRefused`` (``ChannelConfiguration/helloValidator`` refused it),
    ///   ``TransportError/Code/helloFailed`` (timeout, malformed hello, connection lost).
    public static func accept(
        _ socket: AcceptedSocket, configuration: ChannelConfiguration, logger: Logger
    ) async throws -> MessageChannel {
        guard let fd = socket.take() else {
            throw TransportError(.invalidArgument, "the accepted socket was already used or closed")
        }
        let connection = Connection(fd: fd, configuration: configuration.connection, logger: logger)
        return try await Handshake(connection: connection, role: .server, configuration: configuration, logger: logger)
            .run()
    }

    /// Installs the channel's handlers; called on the queue by the handshake.
    func activate() {
        dispatchPrecondition(condition: .onQueue(queue))
        connection.setHandlers(onFrame: { [self] in handle($0) }, onClose: { [self] in didClose($0) })
        lastHeard = .now()
        if let interval = configuration.pingInterval {
            let timer = DispatchSource.makeTimerSource(queue: queue)
            timer.schedule(deadline: .now() + interval.timeInterval, repeating: interval.timeInterval)
            timer.setEventHandler { [weak self] in self?.heartbeatTick() }
            timer.resume()
            heartbeat = timer
        }
    }

    // MARK: Sending

    private func encode<T: Encodable>(_ value: T, type: String) throws(TransportError) -> (UInt8, [UInt8]) {
        let codec = configuration.codecs.sendCodec
        do {
            return (codec.id, try codec.encode(value))
        } catch {
            throw TransportError(.encodingFailed, "could not encode \(T.self) for message '\(type)': \(error)")
        }
    }

    /// Sends a message encoded with the configured codec. Suspends while the send queue is full
    /// (above ``ConnectionConfiguration/sendHighWaterMark``) until it drains below the low-water mark;
    /// that wait ends early only when the connection closes, not on task cancellation.
    /// - Parameters:
    ///   - value: The value to encode.
    ///   - type: The stable, app-chosen type id (at most 255 UTF-8 bytes), for example `"chat.message"`.
    /// - Throws: ``TransportError/Code/encodingFailed``, ``TransportError/Code/connectionClosed``.
    public func send<T: Encodable>(_ value: T, type: String) async throws {
        let (codec, payload) = try encode(value, type: type)
        _ = try await connection.send(Frame(kind: .message, codecID: codec, typeID: type, payload: payload))
    }

    /// Sends several messages of one type, in order, with one hand-off to the connection: all are
    /// encoded on the calling thread, numbered together and written with as few `sendmsg` calls as
    /// the socket allows (often one, from this thread). For a stream of small messages this saves
    /// a thread wake-up per message or two, like a NIO handler that flushes every N writes.
    ///
    /// The batch is admitted as a whole while the send queue is below its high-water mark and the
    /// batch is not larger than the mark (so the queue exceeds the mark by at most one batch);
    /// otherwise the messages wait one by one like ``send(_:type:)``.
    /// - Throws: ``TransportError/Code/encodingFailed`` (nothing of the batch is sent),
    ///   ``TransportError/Code/connectionClosed``.
    public func send<T: Encodable>(contentsOf values: some Sequence<T>, type: String) async throws {
        var frames: [Frame] = []
        frames.reserveCapacity(values.underestimatedCount)
        for value in values {
            let (codec, payload) = try encode(value, type: type)
            frames.append(Frame(kind: .message, codecID: codec, typeID: type, payload: payload))
        }
        try await connection.send(contentsOf: frames)
    }

    /// Encodes a value with this channel's send codec, without sending it — for sending the same bytes
    /// to many channels (a broadcast encodes once) with ``sendEncoded(_:codecID:type:)``.
    public func encodeForSending<T: Encodable>(_ value: T, type: String) throws(TransportError) -> (codecID: UInt8, payload: [UInt8]) {
        let (codec, payload) = try encode(value, type: type)
        return (codec, payload)
    }

    /// Sends a payload already encoded with the codec `codecID`.
    public func sendEncoded(_ payload: [UInt8], codecID: UInt8, type: String) async throws {
        _ = try await connection.send(Frame(kind: .message, codecID: codecID, typeID: type, payload: payload))
    }

    /// Sends a message without suspending, when the send queue has room: callable from any context,
    /// including an ``on(type:as:_:)`` handler (which runs on the channel's queue), so a handler can
    /// answer without a task. An idle connection writes the frame to the socket at once.
    /// - Parameters:
    ///   - value: The value to encode with the configured codec.
    ///   - type: The stable type id.
    ///   - replyTo: The sequence number of the message this one answers (``IncomingMessage/sequence``).
    /// - Returns: false, having sent nothing, while the send queue is above
    ///   ``ConnectionConfiguration/sendHighWaterMark`` (or other senders are waiting): use
    ///   ``send(_:type:)`` then, which waits for room.
    /// - Throws: ``TransportError/Code/encodingFailed``, ``TransportError/Code/connectionClosed``,
    ///   ``TransportError/Code/invalidArgument`` (type id longer than 255 bytes).
    public func trySend<T: Encodable>(
        _ value: T, type: String, replyTo: UInt64? = nil
    ) throws(TransportError) -> Bool {
        let (codec, payload) = try encode(value, type: type)
        return try connection.trySend(
            Frame(kind: .message, codecID: codec, typeID: type, reference: replyTo, payload: payload))
    }

    /// Sends raw bytes (codec 0, no encoding, no base64).
    public func sendRaw(_ bytes: [UInt8], type: String) async throws {
        _ = try await connection.send(
            Frame(kind: .message, codecID: WireProtocol.rawCodecID, typeID: type, payload: bytes))
    }

    /// Sends a request and waits for the peer's reply (matched by reply-to), decoded as `Response`.
    ///
    /// Cancelling the calling task stops the wait with `CancellationError` (a later reply is dropped).
    ///
    /// - Throws: ``TransportError/Code/requestTimedOut`` when no reply arrives within `timeout` (a later
    ///   reply is dropped with a log line), ``TransportError/Code/decodingFailed``,
    ///   ``TransportError/Code/connectionClosed``.
    public func request<Request: Encodable, Response: Decodable>(
        _ value: Request, type: String, expecting: Response.Type = Response.self, timeout: Duration = .seconds(10)
    ) async throws -> Response {
        let (codec, payload) = try encode(value, type: type)
        let reply = try await requestMessage(
            Frame(kind: .message, codecID: codec, typeID: type, payload: payload), timeout: timeout)
        return try reply.decode(Response.self)
    }

    /// Sends raw bytes as a request and returns the undecoded reply.
    public func requestRaw(_ bytes: [UInt8], type: String, timeout: Duration = .seconds(10)) async throws
        -> IncomingMessage
    {
        try await requestMessage(
            Frame(kind: .message, codecID: WireProtocol.rawCodecID, typeID: type, payload: bytes), timeout: timeout)
    }

    /// Queue-confined bookkeeping of one request, shared with its cancellation handler.
    private final class RequestHandle: @unchecked Sendable {
        var sequence: UInt64?  // confined to the channel's queue
        var cancelled = false  // confined to the channel's queue
    }

    private func requestMessage(_ frame: Frame, timeout: Duration) async throws -> IncomingMessage {
        let handle = RequestHandle()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                queue.async {
                    guard !handle.cancelled else {
                        continuation.resume(throwing: CancellationError())
                        return
                    }
                    self.connection.enqueue(frame) { result in
                        switch result {
                        case .failure(let error):
                            continuation.resume(throwing: error)
                        case .success(let sequence):
                            guard !handle.cancelled else {
                                self.expire(sequence)
                                continuation.resume(throwing: CancellationError())
                                return
                            }
                            handle.sequence = sequence
                            self.pendingRequests[sequence] = continuation
                            self.queue.asyncAfter(deadline: .now() + timeout.timeInterval) { [weak self] in
                                self?.requestTimedOut(sequence, type: frame.typeID, timeout: timeout)
                            }
                        }
                    }
                }
            }
        } onCancel: {
            queue.async {
                handle.cancelled = true
                if let sequence = handle.sequence, let continuation = self.pendingRequests.removeValue(forKey: sequence)
                {
                    self.expire(sequence)
                    continuation.resume(throwing: CancellationError())
                }
            }
        }
    }

    /// Remembers a request whose reply is no longer awaited, so a late reply is dropped (bounded).
    private func expire(_ sequence: UInt64) {
        expiredRequests.insert(sequence)
        expiredOrder.append(sequence)
        if expiredOrder.count > 1024 { expiredRequests.remove(expiredOrder.removeFirst()) }
    }

    private func requestTimedOut(_ sequence: UInt64, type: String, timeout: Duration) {
        guard let continuation = pendingRequests.removeValue(forKey: sequence) else { return }
        expire(sequence)
        continuation.resume(
            throwing: TransportError(
                .requestTimedOut,
                "no reply to request '\(type)' #\(sequence) within \(timeout); "
                    + "the peer may be slow or not handle this type"
            ))
    }

    /// Replies to `message` (the reply carries its sequence number as reply-to).
    public func reply<T: Encodable>(to message: IncomingMessage, with value: T, type: String) async throws {
        let (codec, payload) = try encode(value, type: type)
        _ = try await connection.send(
            Frame(kind: .message, codecID: codec, typeID: type, reference: message.sequence, payload: payload))
    }

    /// Replies to `message` with raw bytes.
    public func replyRaw(to message: IncomingMessage, bytes: [UInt8], type: String) async throws {
        _ = try await connection.send(
            Frame(
                kind: .message, codecID: WireProtocol.rawCodecID, typeID: type, reference: message.sequence,
                payload: bytes))
    }

    // MARK: Handlers

    /// Routes messages of one type id to `handler` instead of ``messages``.
    ///
    /// The handler runs on the channel's queue, which is shared with other connections (one loop
    /// queue per core, like event loops), so a slow handler also delays them: keep it short and
    /// start a task for slow work. It may call ``trySend(_:type:replyTo:)`` on any channel. A payload
    /// that does not decode as `T` is logged and delivered to ``messages`` with its raw bytes.
    public func on<T: Decodable>(
        type: String, as _: T.Type, _ handler: @escaping @Sendable (T, IncomingMessage) -> Void
    ) {
        // Installed before returning: a message that arrives after `on` returns reaches the handler.
        connection.onQueue {
            self.handlers[type] = { [weak self] message in
                do throws(TransportError) {
                    handler(try message.decode(T.self), message)
                } catch {
                    self?.logger.warning("undecodable '\(type)' message from peer: \(error.message)")
                    self?.messages.buffer.push(message)
                }
            }
        }
    }

    // MARK: Transfers

    /// Starts a streamed transfer of `totalSize` bytes; send the bytes with ``OutgoingTransfer/send(_:)``.
    public func startTransfer(type: String, totalSize: UInt64, metadata: [String: String] = [:]) async throws
        -> OutgoingTransfer
    {
        let header = try FoundationJSONCodec().encode(TransferHeader(size: totalSize, metadata: metadata))
        let streamID = try await connection.send(
            Frame(kind: .streamStart, codecID: WireProtocol.jsonCodecID, typeID: type, payload: header))
        return OutgoingTransfer(channel: self, streamID: streamID, typeID: type, totalSize: totalSize)
    }

    /// Streams a file to the peer in chunks, never holding more than a chunk (plus the bounded send
    /// queue) in memory.
    ///
    /// - Parameters:
    ///   - path: The file to send.
    ///   - type: The transfer's type id.
    ///   - metadata: App metadata (for example the file name).
    ///   - chunkSize: Bytes per chunk (default 64 KiB).
    ///   - progress: Called with 0 bytes when the transfer starts, after every chunk, and once finished.
    public func sendFile(
        at path: String, type: String, metadata: [String: String] = [:], chunkSize: Int = 64 * 1024,
        progress: (@Sendable (TransferProgress) -> Void)? = nil
    ) async throws {
        guard chunkSize > 0, chunkSize <= configuration.connection.maxFrameSize - 1024 else {
            throw TransportError(
                .invalidArgument, "chunk size \(chunkSize) must be positive and below the max frame size")
        }
        let fd = try syscallValue("open(\(path))") { open(path, O_RDONLY | O_CLOEXEC) }
        defer { closeFD(fd) }
        var info = stat()
        try syscallValue("fstat(\(path))") { fstat(fd, &info) }
        let total = UInt64(info.st_size)
        let transfer = try await startTransfer(type: type, totalSize: total, metadata: metadata)
        transfer.progressHandler = progress
        progress?(transfer.currentProgress(finished: false))
        var buffer = [UInt8](repeating: 0, count: chunkSize)
        do {
            while true {
                let count = try buffer.withUnsafeMutableBytes { (raw) throws(TransportError) -> Int in
                    try syscallValue("read(\(path))") { read(fd, raw.baseAddress, raw.count) }
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

    // MARK: Closing

    /// Waits until the channel is closed and returns why.
    public func closed() async -> CloseReason { await connection.closed() }

    /// Closes gracefully: sends GOODBYE with `reason`, flushes queued frames, then closes. Idempotent.
    public func close(reason: String = "closing") {
        queue.async {
            guard case .open = self.connection.state else { return }
            self.connection.enqueue(
                Frame(kind: .goodbye, payload: Array(reason.utf8)), bypassLimit: true, completion: { _ in })
            self.connection.closeGracefully()
        }
    }

    /// Closes immediately, dropping queued frames. Idempotent.
    public func abort() {
        queue.async { self.connection.teardown(.localClose) }
    }

    /// Bytes currently queued for the socket (for diagnostics and tests).
    public var queuedBytes: Int { connection.onQueue { connection.queuedBytes } }

    /// The largest number of bytes that were ever queued for the socket.
    var maxQueuedBytes: Int { connection.onQueue { connection.maxQueuedBytes } }

    // MARK: Receiving (on the queue)

    private func handle(_ frame: Frame) {
        lastHeard = .now()
        switch frame.kind {
        case .message:
            handleMessage(frame)
        case .ping:
            connection.enqueue(Frame(kind: .pong, reference: frame.sequence), bypassLimit: true, completion: { _ in })
        case .pong:
            break
        case .goodbye:
            let reason = String(decoding: frame.payload, as: UTF8.self)
            logger.debug("peer said goodbye: \(reason)")
            connection.peerIsClosing(.goodbye(reason))
        case .streamStart:
            handleStreamStart(frame)
        case .streamChunk:
            handleChunk(frame)
        case .streamEnd:
            handleStreamEnd(frame)
        case .hello, .helloAck, .refuse, .auth, .authOK:
            violation("unexpected \(frame.kind) frame after the hello exchange")
        }
    }

    private func violation(_ text: String) {
        logger.warning("peer \(remoteAddress.map { "\($0)" } ?? "?") violated the protocol: \(text)")
        connection.enqueue(
            Frame(kind: .goodbye, payload: Array("protocol error: \(text)".utf8)), bypassLimit: true,
            completion: { _ in })
        connection.closeGracefully(reason: .protocolError(text))
    }

    private func handleMessage(_ frame: Frame) {
        let message = IncomingMessage(frame: frame, codecs: configuration.codecs)
        if let replyTo = frame.reference {
            if let continuation = pendingRequests.removeValue(forKey: replyTo) {
                continuation.resume(returning: message)
                return
            }
            if expiredRequests.contains(replyTo) {
                logger.notice("dropping late reply '\(frame.typeID)' to request #\(replyTo), which timed out")
                return
            }
        }
        if let handler = handlers[frame.typeID] {
            handler(message)
        } else {
            messages.buffer.push(message)
        }
    }

    private func handleStreamStart(_ frame: Frame) {
        let header: TransferHeader
        do {
            header = try frame.payload.withUnsafeBytes {
                try FoundationJSONCodec().decode(TransferHeader.self, from: $0)
            }
        } catch {
            violation("STREAM_START #\(frame.sequence) has a malformed header: \(error)")
            return
        }
        let buffer: BoundedBuffer<[UInt8]> = Self.inboundBuffer(connection, limit: configuration.transferChunkBufferLimit)
        let transfer = IncomingTransfer(streamID: frame.sequence, typeID: frame.typeID, header: header, buffer: buffer)
        incoming[frame.sequence] = (transfer, 0)
        transfer.progressContinuation.yield(
            TransferProgress(
                streamID: frame.sequence, typeID: frame.typeID, completedBytes: 0, totalBytes: header.size,
                isFinished: false))
        transferBuffer.push(transfer)
    }

    private func handleChunk(_ frame: Frame) {
        guard let id = frame.reference, let entry = incoming[id] else {
            violation("STREAM_CHUNK for unknown stream \(frame.reference.map(String.init) ?? "nil")")
            return
        }
        let received = entry.received + UInt64(frame.payload.count)
        guard received <= entry.transfer.totalSize else {
            violation("stream \(id) sent \(received) bytes, more than the announced \(entry.transfer.totalSize)")
            return
        }
        incoming[id]?.received = received
        entry.transfer.buffer.push(frame.payload)
        entry.transfer.progressContinuation.yield(
            TransferProgress(
                streamID: id, typeID: entry.transfer.typeID, completedBytes: received,
                totalBytes: entry.transfer.totalSize, isFinished: false))
    }

    private func handleStreamEnd(_ frame: Frame) {
        guard let id = frame.reference, let entry = incoming.removeValue(forKey: id) else {
            violation("STREAM_END for unknown stream \(frame.reference.map(String.init) ?? "nil")")
            return
        }
        let transfer = entry.transfer
        if !frame.payload.isEmpty {
            let reason = String(decoding: frame.payload, as: UTF8.self)
            logger.info("peer aborted transfer '\(transfer.typeID)' #\(id): \(reason)")
            transfer.buffer.finish(
                throwing: TransportError(.transferFailed, "the sender aborted the transfer: \(reason)"))
        } else if entry.received != transfer.totalSize {
            logger.warning("transfer #\(id) ended after \(entry.received) of \(transfer.totalSize) bytes")
            transfer.buffer.finish(
                throwing: TransportError(
                    .transferFailed,
                    "the transfer ended after \(entry.received) of \(transfer.totalSize) announced bytes"))
        } else {
            transfer.progressContinuation.yield(
                TransferProgress(
                    streamID: id, typeID: transfer.typeID, completedBytes: entry.received,
                    totalBytes: transfer.totalSize,
                    isFinished: true))
            transfer.buffer.finish()
        }
        transfer.progressContinuation.finish()
    }

    private func heartbeatTick() {
        guard !connection.isClosed else { return }
        if connection.isReadPaused {
            lastHeard = .now()  // we stopped reading on purpose; the peer is not silent
        } else if DispatchTime.now().uptimeNanoseconds - lastHeard.uptimeNanoseconds
            > configuration.heartbeatTimeout.nanoseconds
        {
            logger.warning("peer sent nothing for \(configuration.heartbeatTimeout); closing (heartbeat timeout)")
            connection.teardown(.heartbeatTimeout)
            return
        }
        connection.enqueue(Frame(kind: .ping), bypassLimit: true, completion: { _ in })
    }

    private func didClose(_ reason: CloseReason) {
        heartbeat?.cancel()
        heartbeat = nil
        let error = TransportError.closed(reason)
        let requests = pendingRequests
        pendingRequests.removeAll()
        for (_, continuation) in requests { continuation.resume(throwing: error) }
        for (_, entry) in incoming {
            entry.transfer.buffer.finish(
                throwing: TransportError(.transferFailed, "the connection closed during the transfer (\(reason))"))
            entry.transfer.progressContinuation.finish()
        }
        incoming.removeAll()
        handlers.removeAll()
        messages.buffer.finish()
        transferBuffer.finish()
    }
}

/// A streamed transfer being sent; created by ``MessageChannel/startTransfer(type:totalSize:metadata:)``.
///
/// Call ``send(_:)`` for each chunk (sequentially), then ``finish()``.
/// `@unchecked Sendable`: the mutable fields are guarded by `lock`.
public final class OutgoingTransfer: @unchecked Sendable {
    private let channel: MessageChannel
    /// The stream id (this side's sequence number of STREAM_START).
    public let streamID: UInt64
    /// The transfer's type id.
    public let typeID: String
    /// The announced total size.
    public let totalSize: UInt64
    private let lock = NSLock()
    private var sent: UInt64 = 0  // guarded by lock
    private var ended = false  // guarded by lock
    var progressHandler: (@Sendable (TransferProgress) -> Void)? {
        get { lock.withLock { _progressHandler } }
        set { lock.withLock { _progressHandler = newValue } }
    }
    private var _progressHandler: (@Sendable (TransferProgress) -> Void)?  // guarded by lock

    init(channel: MessageChannel, streamID: UInt64, typeID: String, totalSize: UInt64) {
        self.channel = channel
        self.streamID = streamID
        self.typeID = typeID
        self.totalSize = totalSize
    }

    func currentProgress(finished: Bool) -> TransferProgress {
        TransferProgress(
            streamID: streamID, typeID: typeID, completedBytes: lock.withLock { sent }, totalBytes: totalSize,
            isFinished: finished)
    }

    /// Sends one chunk; suspends while the channel's send queue is full (this is what bounds memory).
    public func send(_ chunk: [UInt8]) async throws {
        let total: UInt64? = lock.withLock {
            guard !ended, sent + UInt64(chunk.count) <= totalSize else { return nil }
            sent += UInt64(chunk.count)
            return sent
        }
        guard total != nil else {
            throw TransportError(
                .invalidArgument,
                "chunk exceeds the announced size \(totalSize) of transfer #\(streamID), or it has ended")
        }
        _ = try await channel.connection.send(Frame(kind: .streamChunk, reference: streamID, payload: chunk))
        progressHandler?(currentProgress(finished: false))
    }

    /// Ends the transfer. Throws ``TransportError/Code/transferFailed`` (and aborts it) when fewer bytes
    /// than announced were sent.
    public func finish() async throws {
        let (done, alreadyEnded) = lock.withLock { () -> (UInt64, Bool) in
            defer { ended = true }
            return (sent, ended)
        }
        guard !alreadyEnded else { return }
        guard done == totalSize else {
            let reason = "sent \(done) of \(totalSize) announced bytes"
            _ = try? await channel.connection.send(
                Frame(kind: .streamEnd, reference: streamID, payload: Array(reason.utf8)), bypassLimit: true)
            throw TransportError(.transferFailed, "transfer #\(streamID) \(reason); the receiver saw it as aborted")
        }
        _ = try await channel.connection.send(Frame(kind: .streamEnd, reference: streamID))
        progressHandler?(currentProgress(finished: true))
    }

    /// Aborts the transfer; the receiver's chunk sequence throws with `reason`.
    public func abort(reason: String) async {
        let alreadyEnded = lock.withLock { () -> Bool in
            defer { ended = true }
            return ended
        }
        guard !alreadyEnded else { return }
        _ = try? await channel.connection.send(
            Frame(kind: .streamEnd, reference: streamID, payload: Array(reason.isEmpty ? "aborted".utf8 : reason.utf8)),
            bypassLimit: true)
    }
}

/// The hello exchange on a fresh connection, with optional pre-shared-key authentication.
/// `@unchecked Sendable`: state confined to the connection's queue.
final class Handshake: @unchecked Sendable {
    enum Role { case client, server }
    /// Where an authenticated exchange stands.
    private enum AuthState {
        case none
        /// Client: sent its nonce in HELLO.
        case clientSentNonce([UInt8])
        /// Client: sent AUTH, waiting for AUTH_OK.
        case clientAwaitingOK(PeerInfo)
        /// Server: sent its challenge, waiting for AUTH.
        case serverAwaitingProof(info: PeerInfo, clientNonce: [UInt8], serverNonce: [UInt8])
    }

    let connection: Connection
    let role: Role
    let configuration: ChannelConfiguration
    let logger: Logger
    private var continuation: CheckedContinuation<MessageChannel, any Error>?
    private var done = false
    private var timeout: (any DispatchSourceTimer)?
    private var auth = AuthState.none

    init(connection: Connection, role: Role, configuration: ChannelConfiguration, logger: Logger) {
        self.connection = connection
        self.role = role
        self.configuration = configuration
        self.logger = connection.logger
    }

    private var peerDescription: String { connection.remoteAddress.map { "\($0)" } ?? "?" }

    /// Released by `succeed` after the channel is built, taken by `run` after the hand-off: makes the
    /// hand-off visible to ThreadSanitizer (a continuation resumed before its task suspended
    /// synchronizes through the runtime's atomics, which it does not see).
    private let handoff = Lock()

    func run() async throws -> MessageChannel {
        let channel = try await handshake()
        handoff.withLock {}
        return channel
    }

    private func handshake() async throws -> MessageChannel {
        try await withCheckedThrowingContinuation { continuation in
            connection.queue.async {
                self.continuation = continuation
                self.connection.start(onFrame: { [self] in handle($0) }, onClose: { [self] in closed($0) })
                // A timer source, not asyncAfter: cancelling it frees it at once, while a cancelled
                // asyncAfter item stays allocated until its deadline (per connection, for 10 s).
                let timer = DispatchSource.makeTimerSource(queue: self.connection.queue)
                timer.schedule(deadline: .now() + self.configuration.helloTimeout.timeInterval)
                timer.setEventHandler { [weak self] in self?.timedOut() }
                timer.resume()
                self.timeout = timer
                if self.role == .client {
                    if self.configuration.preSharedKey != nil {
                        let nonce = AuthNonce.make()
                        self.auth = .clientSentNonce(nonce)
                        self.send(.hello, HelloPayload(self.configuration.peerInfo, nonce: Hex.encode(nonce)))
                    } else {
                        self.send(.hello, self.configuration.peerInfo)
                    }
                }
            }
        }
    }

    private func send<T: Encodable>(_ kind: FrameKind, _ value: T) {
        let payload = (try? FoundationJSONCodec().encode(value)) ?? []
        connection.enqueue(
            Frame(kind: kind, codecID: WireProtocol.jsonCodecID, payload: payload), bypassLimit: true,
            completion: { _ in })
    }

    private func refuse(code: String, _ text: String, error: TransportError.Code) {
        send(.refuse, Refusal(code: code, message: text))
        fail(TransportError(error, text, closeReason: .helloFailed(text)), close: .helloFailed(text))
    }

    private func authFailure(_ text: String) {
        logger.warning("authentication failed with \(peerDescription): \(text)")
        fail(TransportError(.authenticationFailed, text, closeReason: .helloFailed(text)), close: .helloFailed(text))
    }

    private func handle(_ frame: Frame) {
        guard !done else { return }
        switch (role, frame.kind) {
        case (.client, .helloAck):
            guard let hello = decode(HelloPayload.self, frame) else { return }
            let info = hello.info
            guard info.version == configuration.protocolVersion else {
                let text =
                    "peer acknowledged with protocol version \(info.version), "
                    + "this side speaks \(configuration.protocolVersion)"
                fail(TransportError(.versionMismatch, text, closeReason: .helloFailed(text)), close: .helloFailed(text))
                return
            }
            switch (configuration.preSharedKey, auth, hello.auth) {
            case (nil, _, nil):
                succeed(info)
            case (nil, _, .some):
                authFailure("the server '\(info.name)' requires a pre-shared key; give this client the same key (--key-file)")
            case (.some, _, nil):
                authFailure(
                    "the server '\(info.name)' did not prove the pre-shared key (it runs without one); refusing to talk to an unauthenticated server")
            case (.some(let key), .clientSentNonce(let clientNonce), .some(let challenge)):
                guard challenge.scheme == "hmac-sha256", let serverNonce = Hex.decode(challenge.nonce),
                    serverNonce.count == AuthNonce.size, let proof = Hex.decode(challenge.proof)
                else {
                    authFailure("the server sent a malformed authentication challenge")
                    return
                }
                guard constantTimeEqual(proof, key.serverProof(clientNonce: clientNonce, serverNonce: serverNonce)) else {
                    authFailure("the server '\(info.name)' proved a different pre-shared key; check that both sides use the same key file")
                    return
                }
                auth = .clientAwaitingOK(info)
                send(.auth, AuthProof(proof: Hex.encode(key.clientProof(clientNonce: clientNonce, serverNonce: serverNonce))))
            case (.some, _, .some):
                authFailure("unexpected authentication state")
            }
        case (.client, .authOK):
            guard case .clientAwaitingOK(let info) = auth else {
                protocolFailure("AUTH_OK without an authentication exchange")
                return
            }
            succeed(info)
        case (.client, .refuse):
            let refusal = decode(Refusal.self, frame) ?? Refusal(code: "unknown", message: "refused")
            let code: TransportError.Code =
                switch refusal.code {
                case "version_mismatch": .versionMismatch
                case "auth_required", "auth_failed": .authenticationFailed
                default: .helloRefused
                }
            logger.warning("peer refused the hello: \(refusal.message)")
            fail(
                TransportError(
                    code, "the peer refused the connection: \(refusal.message)",
                    closeReason: .helloFailed(refusal.message)),
                close: .helloFailed(refusal.message))
        case (.server, .hello):
            guard case .none = auth, let hello = decode(HelloPayload.self, frame) else {
                if case .none = auth {} else { protocolFailure("a second HELLO") }
                return
            }
            let info = hello.info
            if info.version != configuration.protocolVersion {
                let text =
                    "protocol version mismatch: the server speaks version \(configuration.protocolVersion), "
                    + "the client '\(info.name)' sent version \(info.version); update the older side"
                logger.warning("refusing peer: \(text)")
                refuse(code: "version_mismatch", text, error: .versionMismatch)
                return
            }
            if let refusal = configuration.helloValidator?(info) {
                logger.info("refusing peer '\(info.name)': \(refusal)")
                refuse(code: "refused", "refused peer '\(info.name)': \(refusal)", error: .helloRefused)
                return
            }
            guard let key = configuration.preSharedKey else {
                send(.helloAck, configuration.peerInfo)
                succeed(info)
                return
            }
            guard let nonceText = hello.nonce, let clientNonce = Hex.decode(nonceText), clientNonce.count == AuthNonce.size else {
                let text = "this server requires a pre-shared key; start the client with the same key (--key-file)"
                logger.warning("refusing unauthenticated client '\(info.name)' from \(peerDescription): no key offered")
                refuse(code: "auth_required", text, error: .authenticationFailed)
                return
            }
            let serverNonce = AuthNonce.make()
            auth = .serverAwaitingProof(info: info, clientNonce: clientNonce, serverNonce: serverNonce)
            let challenge = AuthChallenge(
                scheme: "hmac-sha256", nonce: Hex.encode(serverNonce),
                proof: Hex.encode(key.serverProof(clientNonce: clientNonce, serverNonce: serverNonce)))
            send(.helloAck, HelloPayload(configuration.peerInfo, auth: challenge))
        case (.server, .auth):
            guard case .serverAwaitingProof(let info, let clientNonce, let serverNonce) = auth,
                let key = configuration.preSharedKey
            else {
                protocolFailure("AUTH without a challenge")
                return
            }
            guard let proofMessage = decode(AuthProof.self, frame) else { return }
            guard let proof = Hex.decode(proofMessage.proof),
                constantTimeEqual(proof, key.clientProof(clientNonce: clientNonce, serverNonce: serverNonce))
            else {
                logger.warning("refusing client '\(info.name)' from \(peerDescription): wrong pre-shared key (or a replayed hello)")
                refuse(
                    code: "auth_failed", "authentication failed: wrong pre-shared key; use the server's key file",
                    error: .authenticationFailed)
                return
            }
            connection.enqueue(Frame(kind: .authOK), bypassLimit: true, completion: { _ in })
            succeed(info)
        default:
            protocolFailure(
                "expected \(role == .client ? "HELLO_ACK, AUTH_OK or REFUSE" : "HELLO or AUTH"), got \(frame.kind)")
        }
    }

    private func protocolFailure(_ text: String) {
        logger.warning("hostile or broken peer \(peerDescription) during hello: \(text)")
        fail(
            TransportError(.helloFailed, "hello failed: \(text)", closeReason: .protocolError(text)),
            close: .protocolError(text))
    }

    private func decode<T: Decodable>(_ type: T.Type, _ frame: Frame) -> T? {
        do {
            return try frame.payload.withUnsafeBytes { try FoundationJSONCodec().decode(T.self, from: $0) }
        } catch {
            let text = "malformed \(frame.kind) payload: \(error)"
            logger.warning("hostile or broken peer during hello: \(text)")
            fail(
                TransportError(.helloFailed, "hello failed: \(text)", closeReason: .protocolError(text)),
                close: .protocolError(text))
            return nil
        }
    }

    private func succeed(_ info: PeerInfo) {
        done = true
        timeout?.cancel()
        logger.debug("hello complete with '\(info.name)' (version \(info.version))")
        let channel = handoff.withLock {
            let channel = MessageChannel(connection: connection, peer: info, configuration: configuration, logger: logger)
            channel.activate()
            return channel
        }
        continuation?.resume(returning: channel)
        continuation = nil
    }

    private func fail(_ error: TransportError, close reason: CloseReason) {
        done = true
        timeout?.cancel()
        connection.closeGracefully(reason: reason)
        continuation?.resume(throwing: error)
        continuation = nil
    }

    private func timedOut() {
        guard !done else { return }
        let text = "no hello exchange within \(configuration.helloTimeout)"
        logger.warning("\(text); closing")
        done = true
        connection.teardown(.helloFailed(text))
        continuation?.resume(
            throwing: TransportError(
                .helloFailed, "\(text); is the peer speaking this protocol?", closeReason: .helloFailed(text)))
        continuation = nil
    }

    private func closed(_ reason: CloseReason) {
        guard !done else { return }
        done = true
        timeout?.cancel()
        continuation?.resume(
            throwing: TransportError(
                .helloFailed, "the connection closed during the hello exchange: \(reason)", closeReason: reason))
        continuation = nil
    }
}
