import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// A connected peer after a successful hello exchange: typed messages, request/response,
/// streamed transfers, heartbeat.
///
/// Create one with ``connect(to:configuration:logger:)`` (client) or
/// ``accept(_:configuration:logger:)`` (server). It stays open until either side closes, the peer
/// stops answering pings, or the peer misbehaves; ``closed()`` says why.
///
/// `@unchecked Sendable`: every mutable field is confined to the connection's loop.
public final class MessageChannel: @unchecked Sendable {
    let driver: ConnectionDriver
    let configuration: ChannelConfiguration
    /// The connection's logger (with `peer` metadata), built when a line is logged.
    var logger: Logger { driver.logger }
    var queue: DispatchQueue { driver.queue }

    /// What the peer said about itself in the hello exchange.
    public let peer: PeerInfo
    /// The largest frame body the peer accepts (its `max_frame`): larger messages are refused
    /// before sending, and transfer chunks are cut to fit.
    public let peerMaxFrameSize: Int
    /// The peer's address.
    public var remoteAddress: SocketAddress? { driver.remoteAddress }
    /// The local address of the connection.
    public var localAddress: SocketAddress? { driver.localAddress }
    /// Messages from the peer that are neither replies to ``request(_:type:expecting:timeout:)`` nor
    /// taken by an ``on(type:as:_:)`` handler — including unknown type ids and undecodable payloads.
    public let messages: IncomingMessages
    /// Streamed transfers from the peer.
    public var transfers: IncomingTransfers { IncomingTransfers(buffer: transferBuffer) }
    /// The transfers' buffer, made on first use: most channels never receive a transfer, and an
    /// idle channel should not pay for a second buffer.
    private let lazyTransferBuffer = AtomicLazyReference<BoundedQueue<IncomingTransfer>>()
    var transferBuffer: BoundedQueue<IncomingTransfer> {
        if let buffer = lazyTransferBuffer.load() { return buffer }
        return lazyTransferBuffer.storeIfNil(Self.inboundBuffer(driver, limit: configuration.incomingBufferLimit))
    }

    // Loop-confined state. The request tracker is boxed: most channels never send a request, and an
    // idle channel should hold one pointer, not its empty tables.
    final class Requests {
        var tracker = RequestTracker<CheckedContinuation<IncomingMessage, any Error>>()
    }
    var requests: Requests?
    /// The ``on(type:as:_:)`` handlers, read on the loop for every message without a lock. A handler
    /// installed from another thread goes to `installs` (made on first use) and `hasInstalls` is
    /// raised; the loop merges them before it dispatches the next message. So `on` never waits for
    /// the loop, and a message that arrives after it returned reaches the handler.
    private var handlers: [String: (IncomingMessage) -> Void] = [:]
    private let installs = AtomicLazyReference<PendingInstalls>()
    private let hasInstalls = Atomic<Bool>(false)
    final class PendingInstalls: Sendable {
        let list = Locked<[(String, (IncomingMessage) -> Void)]>([])
    }
    var incoming = TransferReceiver<IncomingTransfer>()

    /// The peer's proven identity when the connection is encrypted (protocol version 2); nil in
    /// plaintext.
    public var peerIdentity: PeerIdentity? { identityBox?.identity }
    private let identityBox: IdentityBox?
    final class IdentityBox: Sendable {
        let identity: PeerIdentity
        init(_ identity: PeerIdentity) { self.identity = identity }
    }

    init(
        driver: ConnectionDriver, established: HandshakeStateMachine.Established, configuration: ChannelConfiguration,
        identity: PeerIdentity? = nil
    ) {
        self.driver = driver
        identityBox = identity.map(IdentityBox.init)
        self.peer = established.peer
        self.peerMaxFrameSize = established.peerMaxFrameSize
        self.configuration = configuration
        messages = IncomingMessages(buffer: Self.inboundBuffer(driver, limit: configuration.incomingBufferLimit))
    }

    /// A buffer of inbound elements that pauses reading `driver` while it holds `limit` or more.
    static func inboundBuffer<Element>(_ driver: ConnectionDriver, limit: Int) -> BoundedQueue<Element> {
        BoundedQueue(
            limit: limit,
            onFull: { driver.pauseReading() },  // called from push(), which runs on the loop
            onDrained: { driver.queue.async { driver.resumeReading() } })
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
    ///   ``TransportError/Code/helloFailed``, ``TransportError/Code/authenticationFailed``.
    public static func connect(
        to addresses: [SocketAddress], configuration: ChannelConfiguration, logger: Logger
    ) async throws -> MessageChannel {
        let (fd, address) = try await TCPConnector.connect(
            to: addresses, attemptDelay: configuration.connectAttemptDelay, timeout: configuration.connectTimeout,
            logger: logger)
        logger.debug("connected to \(address); sending hello")
        let driver = ConnectionDriver(
            fd: fd, loop: configuration.loopGroup.next(), configuration: configuration.connection, logger: logger)
        if configuration.security.isEncrypted {
            return try await SecureExchange(driver: driver, role: .client, configuration: configuration).run()
        }
        return try await HelloExchange(driver: driver, role: .client, configuration: configuration).run()
    }

    /// Takes an accepted socket and performs the server side of the hello exchange.
    ///
    /// - Throws: ``TransportError/Code/versionMismatch`` (the peer was told why),
    ///   ``TransportError/Code/helloRefused`` (``ChannelConfiguration/helloValidator`` refused it),
    ///   ``TransportError/Code/helloFailed`` (timeout, malformed hello, connection lost),
    ///   ``TransportError/Code/authenticationFailed``.
    public static func accept(
        _ socket: AcceptedSocket, configuration: ChannelConfiguration, logger: Logger
    ) async throws -> MessageChannel {
        guard let fd = socket.take() else {
            throw TransportError(.invalidArgument, "the accepted socket was already used or closed")
        }
        let driver = ConnectionDriver(
            fd: fd, loop: configuration.loopGroup.next(), configuration: configuration.connection, logger: logger)
        if configuration.security.isEncrypted {
            return try await SecureExchange(driver: driver, role: .server, configuration: configuration).run()
        }
        return try await HelloExchange(driver: driver, role: .server, configuration: configuration).run()
    }

    /// Takes over the connection from the hello exchange. On the loop.
    func activate() {
        driver.setHandler(self)
        if let interval = configuration.pingInterval {
            driver.setDeadline(.heartbeat, at: uptimeNanoseconds() &+ interval.nanoseconds)
        }
    }

    // MARK: Handlers

    /// Routes messages of one type id to `handler` instead of ``messages``.
    ///
    /// The handler runs on the channel's loop, which is shared with other connections (one loop
    /// per core, like event loops), so a slow handler also delays them: keep it short and start a
    /// task for slow work. It may call ``trySend(_:type:replyTo:)`` on any channel. A payload that
    /// does not decode as `T` is logged and delivered to ``messages`` with its raw bytes.
    ///
    /// Installed before it returns (from any context, without waiting for the loop): a message that
    /// arrives afterwards reaches the handler. Installing a handler for a type again replaces it.
    public func on<T: Decodable>(
        type: String, as _: T.Type, _ handler: @escaping @Sendable (T, IncomingMessage) -> Void
    ) {
        let messages = self.messages
        let logger = driver.logger
        let dispatch: (IncomingMessage) -> Void = { message in
            do throws(TransportError) {
                handler(try message.decode(T.self), message)
            } catch {
                logger.warning("undecodable '\(type)' message from peer: \(error.message)")
                messages.buffer.push(message)
            }
        }
        if driver.loop.isCurrent {
            mergeInstalls()  // keep the order of installs made from other threads before this one
            handlers[type] = dispatch
            return
        }
        let pending = installs.load() ?? installs.storeIfNil(PendingInstalls())
        pending.list.withLock {
            $0.append((type, dispatch))
            hasInstalls.store(true, ordering: .sequentiallyConsistent)
        }
    }

    /// Moves handlers installed from other threads into the loop's table. On the loop.
    private func mergeInstalls() {
        guard hasInstalls.load(ordering: .sequentiallyConsistent), let pending = installs.load() else { return }
        let taken = pending.list.withLock { list in
            hasInstalls.store(false, ordering: .sequentiallyConsistent)
            defer { list = [] }
            return list
        }
        for (type, handler) in taken { handlers[type] = handler }
    }

    // MARK: Closing

    /// Waits until the channel is closed and returns why.
    public func closed() async -> CloseReason { await driver.closed() }

    /// Closes gracefully: sends GOODBYE with `reason`, flushes queued frames, then closes. Idempotent.
    public func close(reason: String = "closing") {
        queue.async {
            guard self.driver.isOpen else { return }
            self.driver.enqueue(Frame(kind: .goodbye, payload: Array(reason.utf8)), bypassLimit: true) { _ in }
            self.driver.closeGracefully()
        }
    }

    /// Closes immediately, dropping queued frames. Idempotent. Sends fail from the moment it returns.
    public func abort() { driver.abort(.localClose) }

    /// Bytes currently queued for the socket (for diagnostics and tests).
    public var queuedBytes: Int { driver.queuedBytes }

    /// The largest number of bytes that were ever queued for the socket.
    var maxQueuedBytes: Int { driver.maxQueuedBytes }

    /// A task executor that runs on this channel's loop (the serial queue its socket events
    /// and handlers run on, shared with other connections of the same loop, like a NIO event loop).
    ///
    /// A task that streams to this channel can prefer it, so that sending needs no thread hand-off:
    /// ```swift
    /// try await withTaskExecutorPreference(channel.taskExecutor) {
    ///     for sample in samples { try await channel.send(sample, type: "sample") }
    /// }
    /// ```
    /// The frames such a task sends pile up while it runs and are written together when it
    /// suspends (at the latest when the send queue reaches its high-water mark). While the task
    /// runs, the other connections of its loop wait, as they do for a handler: keep CPU-heavy work
    /// off it, or let it suspend often.
    public var taskExecutor: any TaskExecutor { driver.loop.executor }
}

// MARK: Receiving (on the loop)

extension MessageChannel: ConnectionHandler {
    package func connection(_ connection: ConnectionDriver, received frame: Frame) {
        switch frame.kind {
        case .message:
            handleMessage(frame)
        case .ping:
            driver.enqueue(Frame(kind: .pong, reference: frame.sequence), bypassLimit: true) { _ in }
        case .pong:
            break
        case .goodbye:
            let reason = String(decoding: frame.payload, as: UTF8.self)
            logger.debug("peer said goodbye: \(reason)")
            driver.closeGracefully(reason: .goodbye(reason))
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

    package func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) {
        switch kind {
        case .heartbeat: heartbeatTick()
        case .request: requestsTimedOut()
        case .handshake, .idleCheck, .linger: break
        }
    }

    package func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
        let error = TransportError.closed(reason)
        if let requests {
            for entry in requests.tracker.removeAll() { entry.token.resume(throwing: error) }
        }
        for stream in incoming.removeAll() {
            stream.sink.buffer.finish(
                throwing: TransportError(.transferFailed, "the connection closed during the transfer (\(reason))"))
            stream.sink.progressContinuation.finish()
        }
        handlers.removeAll()
        installs.load()?.list.withLock { $0.removeAll() }
        messages.buffer.finish()
        transferBuffer.finish()
    }

    func violation(_ text: String) {
        logger.warning("peer \(remoteAddress.map { "\($0)" } ?? "?") violated the protocol: \(text)")
        driver.enqueue(Frame(kind: .goodbye, payload: Array("protocol error: \(text)".utf8)), bypassLimit: true) { _ in }
        driver.closeGracefully(reason: .protocolError(text))
    }

    private func handleMessage(_ frame: Frame) {
        let message = IncomingMessage(frame: frame, codecs: configuration.codecs)
        if let replyTo = frame.reference, let requests {
            if let entry = requests.tracker.reply(to: replyTo) {
                entry.token.resume(returning: message)
                return
            }
            if requests.tracker.isAbandoned(replyTo) {
                logger.notice("dropping late reply '\(frame.typeID)' to request #\(replyTo), which timed out")
                return
            }
        }
        mergeInstalls()
        if let handler = handlers[frame.typeID] {
            handler(message)
        } else {
            messages.buffer.push(message)
        }
    }

    private func handleStreamStart(_ frame: Frame) {
        let header: TransferHeader
        switch TransferReceiver<IncomingTransfer>.header(of: frame) {
        case .success(let decoded): header = decoded
        case .failure(let violation): return self.violation(violation.text)
        }
        let buffer: BoundedQueue<[UInt8]> = Self.inboundBuffer(driver, limit: configuration.transferChunkBufferLimit)
        let transfer = IncomingTransfer(streamID: frame.sequence, typeID: frame.typeID, header: header, buffer: buffer)
        if let violation = incoming.start(frame, header: header, sink: transfer) { return self.violation(violation.text) }
        transfer.progressContinuation.yield(
            TransferProgress(
                streamID: frame.sequence, typeID: frame.typeID, completedBytes: 0, totalBytes: header.size,
                isFinished: false))
        transferBuffer.push(transfer)
    }

    private func handleChunk(_ frame: Frame) {
        switch incoming.chunk(frame) {
        case .violation(let text):
            violation(text)
        case .deliver(let stream, let bytes):
            stream.sink.buffer.push(bytes)
            stream.sink.progressContinuation.yield(
                TransferProgress(
                    streamID: stream.streamID, typeID: stream.typeID, completedBytes: stream.received,
                    totalBytes: stream.totalSize, isFinished: false))
        }
    }

    private func handleStreamEnd(_ frame: Frame) {
        switch incoming.end(frame) {
        case .violation(let text):
            violation(text)
        case .failed(let stream, let text):
            logger.info("transfer '\(stream.typeID)' #\(stream.streamID) failed: \(text)")
            stream.sink.buffer.finish(throwing: TransportError(.transferFailed, text))
            stream.sink.progressContinuation.finish()
        case .completed(let stream):
            stream.sink.progressContinuation.yield(
                TransferProgress(
                    streamID: stream.streamID, typeID: stream.typeID, completedBytes: stream.received,
                    totalBytes: stream.totalSize, isFinished: true))
            stream.sink.buffer.finish()
            stream.sink.progressContinuation.finish()
        }
    }

    private func heartbeatTick() {
        guard let interval = configuration.pingInterval else { return }
        let beat = Heartbeat(interval: interval.nanoseconds, timeout: configuration.heartbeatTimeout.nanoseconds)
        switch beat.tick(now: uptimeNanoseconds(), lastHeard: driver.lastFrameTime, readingPaused: driver.isReadPaused) {
        case .timedOut:
            logger.warning("peer sent nothing for \(configuration.heartbeatTimeout); closing (heartbeat timeout)")
            driver.tearDown(.heartbeatTimeout)
        case .ping(let next):
            driver.enqueue(Frame(kind: .ping), bypassLimit: true) { _ in }
            driver.setDeadline(.heartbeat, at: next)
        }
    }
}
