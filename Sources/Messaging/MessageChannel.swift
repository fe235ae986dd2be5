import Dispatch
import FastJSON
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
    public var peerMaxFrameSize: Int { Int(storedPeerMaxFrameSize) }
    /// The peer's address.
    public var remoteAddress: SocketAddress? { driver.remoteAddress }
    /// The local address of the connection.
    public var localAddress: SocketAddress? { driver.localAddress }
    /// Messages from the peer that are neither replies to ``request(_:type:expecting:timeout:)`` nor
    /// taken by an ``on(type:as:_:)`` handler — including unknown type ids and undecodable payloads.
    public var messages: IncomingMessages { IncomingMessages(buffer: messageBuffer) }
    /// The messages' buffer, made on first use (by a consumer, or the first message no handler
    /// takes): an idle channel whose app uses handlers, or nothing yet, holds no buffer.
    private let lazyMessageBuffer = AtomicLazyReference<BoundedQueue<IncomingMessage>>()
    var messageBuffer: BoundedQueue<IncomingMessage> {
        if let buffer = lazyMessageBuffer.load() { return buffer }
        return lazyMessageBuffer.storeIfNil(Self.inboundBuffer(driver, limit: configuration.incomingBufferLimit))
    }
    /// Whether anything ever read ``messages`` (tests: nothing reads a server's routed channel's;
    /// its messages go to the server's events from the loop).
    var messagesWereRead: Bool { lazyMessageBuffer.load()?.hasConsumer ?? false }
    /// Streamed transfers from the peer.
    public var transfers: IncomingTransfers { IncomingTransfers(buffer: transferBuffer) }
    /// The transfers' buffer, made on first use: most channels never receive a transfer, and an
    /// idle channel should not pay for a second buffer.
    private let lazyTransferBuffer = AtomicLazyReference<BoundedQueue<IncomingTransfer>>()
    /// Whether anything ever read ``transfers`` (tests, like ``messagesWereRead``).
    var transfersWereRead: Bool { lazyTransferBuffer.load()?.hasConsumer ?? false }
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
    /// The pace the peer asked for in its last PONG, in hundredths of a second (0: none; 16 bits
    /// hold the 10-minute maximum), between the 1-byte flag and the 32-bit limit: in their padding,
    /// no byte more per connection. Loop-confined.
    private var peerPaceCentiseconds: UInt16 = 0
    /// Reading stopped because the route's receiver was full (``route(to:)``). Loop-confined.
    private var routeStopped = false
    /// Server: where this channel's messages and close go instead of ``messages`` (``route(to:)``).
    /// Loop-confined.
    private var route: MessageRoute?
    /// ``peerMaxFrameSize`` in 32 bits (a frame's length field is 32 bits), next to the 1-byte flag:
    /// every idle connection holds one, and 8 bytes per connection show in W5.
    private let storedPeerMaxFrameSize: UInt32
    final class PendingInstalls: Sendable {
        let list = Locked<[(String, (IncomingMessage) -> Void)]>([])
    }
    var incoming = TransferReceiver<IncomingTransfer>()
    /// Round-trip times from the heartbeat (loop-confined; read through ``health``).
    var rtt = RTTEstimator()
    /// The message session running on this connection, its SESSION exchange and the consumers of
    /// ``healthUpdates``; nil for most channels (loop-confined; one pointer for an idle connection).
    var sessionLink: SessionLink?
    final class SessionLink {
        var session: MessageSession?
        /// Server: a SESSION frame that arrived before anyone asked for it.
        var pendingHello: SessionHello?
        /// Server: waits for the client's SESSION; client: waits for the server's answer.
        var helloWaiter: CheckedContinuation<SessionHello, any Error>?
        var openedWaiter: CheckedContinuation<MessageSession.Opened, any Error>?
        var ackArmed = false
        /// Server: the client offered a session in its hello, and its SESSION has not come yet —
        /// the only frames allowed before it are SESSION, PING, PONG and GOODBYE.
        var awaitingClientSession = false
        /// Consumers of ``healthUpdates``.
        var healthWatchers: [AsyncStream<ConnectionHealth>.Continuation] = []
    }

    /// The peer's proven identity when the connection is encrypted (protocol version 2); nil in
    /// plaintext.
    public var peerIdentity: PeerIdentity? { identityBox?.identity }
    private let identityBox: IdentityBox?
    final class IdentityBox: Sendable {
        let identity: PeerIdentity
        init(_ identity: PeerIdentity) { self.identity = identity }
    }

    /// - Parameter awaitsSession: Server side: the client offered a message session and this
    ///   server accepts them, so the client's next frame must be its SESSION.
    init(
        driver: ConnectionDriver, established: HandshakeStateMachine.Established, configuration: ChannelConfiguration,
        identity: PeerIdentity? = nil, awaitsSession: Bool = false
    ) {
        self.driver = driver
        identityBox = identity.map(IdentityBox.init)
        self.peer = established.peer
        self.storedPeerMaxFrameSize = UInt32(clamping: established.peerMaxFrameSize)
        self.configuration = configuration
        if awaitsSession {
            let link = SessionLink()
            link.awaitingClientSession = true
            sessionLink = link
        }
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
    /// - Throws: `TransportError` — `TransportError.Code.connectFailed`/`TransportError.Code.connectTimedOut`
    ///   (with each address's failure), `TransportError.Code.versionMismatch`, `TransportError.Code.helloRefused`,
    ///   `TransportError.Code.helloFailed`, `TransportError.Code.authenticationFailed`.
    public static func connect(
        to addresses: [SocketAddress], configuration: ChannelConfiguration, logger: Logger
    ) async throws -> MessageChannel {
        try configuration.checkFrameLimit()
        let (fd, address) = try await TCPConnector.connect(
            to: addresses, attemptDelay: configuration.connectAttemptDelay, timeout: configuration.connectTimeout,
            logger: logger)
        logger.debug("connected to \(address); sending hello")
        let driver = ConnectionDriver(
            fd: fd, loop: configuration.loopGroup.next(), configuration: configuration.connection, logger: logger)
        return try await handshake(driver, client: true, configuration: configuration)
    }

    /// Takes an accepted socket and performs the server side of the hello exchange.
    ///
    /// A failure is logged here at debug level only: saying it is the caller's (``MessageServer``
    /// logs refusals as a summary per interval, so a flood of bad handshakes is not a line each).
    ///
    /// - Throws: `TransportError.Code.versionMismatch` (the peer was told why),
    ///   `TransportError.Code.helloRefused` (``ChannelConfiguration/helloValidator`` refused it),
    ///   `TransportError.Code.helloFailed` (timeout, malformed hello, connection lost),
    ///   `TransportError.Code.authenticationFailed`.
    public static func accept(
        _ socket: AcceptedSocket, configuration: ChannelConfiguration, logger: Logger
    ) async throws -> MessageChannel {
        try configuration.checkFrameLimit()
        guard let fd = socket.take() else {
            throw TransportError(.invalidArgument, "the accepted socket was already used or closed")
        }
        let driver = ConnectionDriver(
            fd: fd, loop: configuration.loopGroup.next(), configuration: configuration.connection, logger: logger)
        return try await handshake(driver, client: false, configuration: configuration)
    }

    /// The hello exchange (version 1) or the secure handshake (version 2), counted when it fails.
    private static func handshake(
        _ driver: ConnectionDriver, client: Bool, configuration: ChannelConfiguration
    ) async throws -> MessageChannel {
        do {
            if configuration.security.isEncrypted {
                return try await SecureExchange(driver: driver, role: client ? .client : .server, configuration: configuration)
                    .run()
            }
            return try await HelloExchange(driver: driver, role: client ? .client : .server, configuration: configuration)
                .run()
        } catch {
            configuration.metrics?.handshakeFailed(error)
            throw error
        }
    }

    /// Checks, in debug builds, that loop-confined state is touched on the connection's loop (the
    /// entry points below call it: the driver's callbacks and what other types call on the loop),
    /// so that a wrong thread fails at once instead of only under ThreadSanitizer. Compiled out in
    /// release builds.
    @inline(__always)
    func assertOnLoop(_ function: StaticString = #function) { driver.assertOnLoop("MessageChannel", function) }

    /// Takes over the connection from the hello exchange. On the loop.
    func activate() {
        assertOnLoop()
        configuration.metrics?.open.increment()
        driver.setHandler(self)
        if let beat = heartbeat { armHeartbeat(beat, from: uptimeNanoseconds()) }
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
        let logger = driver.logger
        let dispatch: (IncomingMessage) -> Void = { [weak self] message in
            do throws(TransportError) {
                handler(try message.decode(T.self), message)
            } catch {
                logger.warning("undecodable '\(type)' message from peer: \(error.message)")
                self?.deliverUnhandled(message)
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
        assertOnLoop()
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

    /// Whether the connection is still open (neither side closed it, as far as this side knows);
    /// asked on the loop, where its state lives.
    var isOpen: Bool {
        get async { await withCheckedContinuation { continuation in queue.async { continuation.resume(returning: self.driver.isOpen) } } }
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
        assertOnLoop()
        if let link = sessionLink, link.awaitingClientSession,
            ![.session, .ping, .pong, .goodbye].contains(frame.kind)
        {
            return violation(
                "the client offered a message session in its hello but sent \(frame.kind) before its SESSION frame; "
                    + "a client that offers sessions sends SESSION first (docs/PROTOCOL.md, \"Sessions\")")
        }
        switch frame.kind {
        case .message:
            handleMessage(frame)
        case .ping:
            let pace = configuration.heartbeatPacer?.pace ?? 0
            driver.enqueue(Frame.pong(reference: frame.sequence, pace: pace), bypassLimit: true) { _ in }
            pingAlongIfDueSoon()
        case .pong:
            peerPaced(frame.pongPace)
            if let reference = frame.reference, rtt.pongReceived(reference: reference, now: uptimeNanoseconds()),
                let watchers = sessionLink?.healthWatchers, !watchers.isEmpty
            {
                let health = healthOnLoop()
                for watcher in watchers { watcher.yield(health) }
            }
        case .session:
            handleSessionHello(frame)
        case .ack:
            handleAck(frame)
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
        assertOnLoop()
        switch kind {
        case .heartbeat: heartbeatTick()
        case .request: requestsTimedOut()
        case .ack: sendAck()
        case .handshake, .idleCheck, .linger: break
        }
    }

    package func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
        assertOnLoop()
        configuration.metrics?.closed(reason)
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
        if let link = sessionLink {
            for watcher in link.healthWatchers { watcher.finish() }
            link.healthWatchers = []
            link.session?.detach(self)
            link.helloWaiter?.resume(throwing: error)
            link.openedWaiter?.resume(throwing: error)
            link.helloWaiter = nil
            link.openedWaiter = nil
        }
        messageBuffer.finish()
        transferBuffer.finish()
        if let route {
            self.route = nil
            route.closed(reason, self)  // after the last message
        }
    }

    func violation(_ text: String) {
        assertOnLoop()
        logger.warning("peer \(remoteAddress.map { "\($0)" } ?? "?") violated the protocol: \(text)")
        driver.enqueue(Frame(kind: .goodbye, payload: Array("protocol error: \(text)".utf8)), bypassLimit: true) { _ in }
        driver.closeGracefully(reason: .protocolError(text))
    }

    private func handleMessage(_ frame: Frame) {
        if let session = sessionLink?.session, frame.isSessionMessage {
            let (deliver, ackNow) = session.received(on: self)
            guard deliver else { return }  // this connection was replaced: the new one resends it
            if ackNow {
                sendAck()
            } else if let link = sessionLink, !link.ackArmed {
                link.ackArmed = true
                driver.setDeadline(.ack, at: uptimeNanoseconds() &+ session.configuration.ackDelay.nanoseconds)
            }
        }
        let message = IncomingMessage(frame: frame, codecs: configuration.codecs)
        if let replyTo = frame.reference, let requests {
            if let entry = requests.tracker.reply(to: replyTo) {
                configuration.metrics?.requestAnswered(type: entry.typeID, nanoseconds: uptimeNanoseconds() &- entry.sentAt)
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
            deliverUnhandled(message)
        }
    }

    /// A message no handler or request took: to the server's route, or to ``messages``. On the loop.
    private func deliverUnhandled(_ message: IncomingMessage) {
        assertOnLoop()
        if let route { deliver(message, to: route) } else { messageBuffer.push(message) }
    }

    private func deliver(_ message: IncomingMessage, to route: MessageRoute) {
        if !route.deliver(message, self) && !routeStopped {
            routeStopped = true
            driver.pauseReading()
        }
    }

    /// Server: hands the messages no handler or request takes, and the transfers, to `route`, on
    /// the loop and in order, instead of ``messages`` and ``transfers``, and then the close — so
    /// that no task waits per connection to move them on (a waiting task costs ~2.9 KB). What
    /// arrived before goes first. Any context; takes effect on the loop.
    func route(to route: MessageRoute) {
        queue.async { [self] in
            for message in lazyMessageBuffer.load()?.takeAll() ?? [] { deliver(message, to: route) }
            for transfer in lazyTransferBuffer.load()?.takeAll() ?? [] { route.transfer(transfer, self) }
            if driver.isClosed {
                route.closed(driver.closeReason ?? .localClose, self)
            } else {
                self.route = route
            }
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
        if let route { route.transfer(transfer, self) } else { transferBuffer.push(transfer) }
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

    // MARK: Sessions (on the loop)

    /// Acknowledges the session messages received since the last ACK.
    func sendAck() {
        assertOnLoop()
        guard let link = sessionLink, let session = link.session else { return }
        link.ackArmed = false
        driver.setDeadline(.ack, at: nil)
        if let count = session.takeAck(on: self) {
            driver.enqueue(Frame.ack(count), bypassLimit: true) { _ in }
        }
    }

    private func handleAck(_ frame: Frame) {
        guard let session = sessionLink?.session else { return violation("ACK without a session") }
        guard let count = frame.acknowledgedCount else { return violation("an ACK must carry an 8-byte count") }
        if let text = session.acknowledged(count, on: self) { violation(text) }
    }

    private func handleSessionHello(_ frame: Frame) {
        guard let hello = try? FastJSONDecoder().decode(SessionHello.self, from: frame.payload), hello.isWellFormed else {
            return violation("malformed SESSION payload (it needs \"id\": 32 hex digits and \"received\")")
        }
        // SESSION is the client's first frame when it offered sessions, or the server's answer to it.
        guard let link = sessionLink, link.awaitingClientSession || link.openedWaiter != nil else {
            return violation(
                peer.sessions
                    ? "an unexpected SESSION frame (a session is already open, or none was offered)"
                    : "a SESSION frame, but \(peer.name.isEmpty ? "the peer" : "'\(peer.name)'") did not offer message sessions in its hello")
        }
        link.awaitingClientSession = false
        if let waiter = link.openedWaiter, let session = link.session {
            // Client: the server's answer. Attached here, on the loop, before the next frame is read.
            link.openedWaiter = nil
            switch session.clientOpened(hello, on: self) {
            case .success(let opened): waiter.resume(returning: opened)
            case .failure(let error):
                waiter.resume(throwing: error)
                violation(error.message)
            }
            return
        }
        guard link.session == nil, link.pendingHello == nil else { return violation("a second SESSION frame") }
        if let waiter = link.helloWaiter {
            link.helloWaiter = nil
            waiter.resume(returning: hello)
        } else {
            link.pendingHello = hello
        }
    }

    /// Client: opens `session` on this connection (sends SESSION, waits for the answer, resends).
    func openSession(_ session: MessageSession, timeout: Duration) async throws -> MessageSession.Opened {
        try await awaitSessionFrame(
            within: timeout, "the server did not answer the SESSION frame within \(timeout)"
        ) { link, continuation in
            link.session = session
            link.openedWaiter = continuation
            self.driver.enqueue(HandshakeStateMachine.jsonFrame(.session, session.clientHello()), bypassLimit: true) { _ in }
        }
    }

    /// Server: waits for the client's SESSION frame (it offered a session in its hello).
    func sessionHello(timeout: Duration) async throws -> SessionHello {
        try await awaitSessionFrame(
            within: timeout, "the client offered a session but sent no SESSION frame within \(timeout)"
        ) { link, continuation in
            if let hello = link.pendingHello {
                link.pendingHello = nil
                continuation.resume(returning: hello)
            } else {
                link.helloWaiter = continuation
            }
        }
    }

    /// Runs `register` on the loop with this channel's session box and a continuation that the
    /// SESSION frame's handler (or the close) resumes; aborts the connection when nothing came
    /// within `timeout`.
    private func awaitSessionFrame<T: Sendable>(
        within timeout: Duration, _ timeoutText: String,
        _ register: @escaping @Sendable (SessionLink, CheckedContinuation<T, any Error>) -> Void
    ) async throws -> T {
        let waiting = Task {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                queue.async {
                    let link = self.sessionLink ?? SessionLink()
                    self.sessionLink = link
                    if link.pendingHello == nil, !self.driver.acceptsFrames {
                        continuation.resume(throwing: TransportError(.connectionClosed, "the connection closed"))
                        return
                    }
                    register(link, continuation)
                }
            }
        }
        guard await raceTimeout(timeout, { _ = await waiting.result }) else {
            // Said to the peer, then closed (not a silent drop).
            queue.async { self.violation(timeoutText) }
            throw TransportError(.helloFailed, timeoutText)
        }
        return try await waiting.value
    }

    /// Server: attaches `session` to this connection, answers and resends (on the loop).
    func attachSession(_ session: MessageSession, hello: SessionHello, isNew: Bool) async throws -> Int {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Int, any Error>) in
            queue.async {
                guard self.driver.acceptsFrames else {
                    continuation.resume(throwing: TransportError(.connectionClosed, "the connection closed"))
                    return
                }
                let link = self.sessionLink ?? SessionLink()
                self.sessionLink = link
                link.session = session
                switch session.serverOpen(hello, isNew: isNew, on: self) {
                case .success(let resent): continuation.resume(returning: resent)
                case .failure(let error):
                    self.violation(error.message)
                    continuation.resume(throwing: error)
                }
            }
        }
    }

    // MARK: Health

    /// The connection's health: round-trip time from the heartbeat and when the peer was last
    /// heard from. Any context (it asks the loop).
    public var health: ConnectionHealth {
        get async {
            await withCheckedContinuation { continuation in
                queue.async { continuation.resume(returning: self.healthOnLoop()) }
            }
        }
    }

    /// The connection's health after every round-trip sample (each heartbeat, by default every 5 s),
    /// the newest kept for a slow consumer; ends when the channel closes. Each access is a new stream.
    public var healthUpdates: AsyncStream<ConnectionHealth> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: ConnectionHealth.self, bufferingPolicy: .bufferingNewest(1))
        queue.async {
            guard self.driver.isOpen else { return continuation.finish() }
            let link = self.sessionLink ?? SessionLink()
            self.sessionLink = link
            link.healthWatchers.append(continuation)
        }
        return stream
    }

    func healthOnLoop() -> ConnectionHealth {
        assertOnLoop()
        func duration(_ micros: UInt32) -> Duration? { rtt.samples == 0 ? nil : .microseconds(Int64(micros)) }
        let silence = uptimeNanoseconds() &- driver.lastFrameTime
        var health = ConnectionHealth(
            smoothedRTT: duration(rtt.smoothedMicros), rttVariation: duration(rtt.variationMicros),
            lastRTT: duration(rtt.lastMicros), sinceLastHeard: .nanoseconds(Int64(clamping: silence)),
            samples: Int(rtt.samples))
        if let session = sessionLink?.session {
            (health.reconnects, health.resumes) = session.counts
        }
        return health
    }

    /// Sends a PING now for a first round-trip sample. Any context.
    func onLoopPing() { queue.async { self.ping() } }

    /// Sends a PING now (besides the heartbeat's), for a fresh round-trip sample. On the loop.
    func ping() {
        assertOnLoop()
        driver.enqueue(Frame(kind: .ping), bypassLimit: true) { [self] result in
            if case .success(let sequence) = result { rtt.pingSent(sequence: sequence, now: uptimeNanoseconds()) }
        }
    }

    /// Answering the peer's PING: this side's own goes along in the same write when it is due soon
    /// (``Heartbeat/pingsAlong(now:due:)``: an idle server's CPU is its wakeups, issue 28). On the loop.
    private func pingAlongIfDueSoon() {
        guard let beat = heartbeat, let due = driver.coarseDeadlines[.heartbeat] else { return }
        let now = uptimeNanoseconds()
        guard beat.pingsAlong(now: now, due: due) else { return }
        ping()
        armHeartbeat(beat, from: now)
    }

    /// The heartbeat as configured, slowed to the peer's pace or this server's own
    /// (docs/PROTOCOL.md, "Heartbeat pacing"); nil without heartbeat.
    private var heartbeat: Heartbeat? {
        guard let interval = configuration.pingInterval else { return nil }
        let configured = Heartbeat(interval: interval.nanoseconds, timeout: configuration.heartbeatTimeout.nanoseconds)
        let pace = max(UInt64(peerPaceCentiseconds) * 10_000_000, configuration.heartbeatPacer?.pace ?? 0)
        return configured.paced(pace)
    }

    /// The peer's PONG said how often it wants to be pinged (`pace` ns, 0: as configured). A new
    /// pace re-arms the heartbeat from now (the PONG is a sign of life) and lets the connection's
    /// idle check wait as long as the paced heartbeat's timeout. On the loop.
    private func peerPaced(_ pace: UInt64) {
        let centiseconds = UInt16(clamping: (pace + 9_999_999) / 10_000_000)
        guard centiseconds != peerPaceCentiseconds else { return }
        peerPaceCentiseconds = centiseconds
        guard let beat = heartbeat else { return }
        if centiseconds > 0 { logger.debug("the peer asks to be pinged every \(Duration.nanoseconds(Int64(beat.interval)))") }
        armHeartbeat(beat, from: uptimeNanoseconds())
    }

    /// The next heartbeat `beat.interval` after `now`; a paced heartbeat also lets the connection's
    /// idle check (a server's 30 s without a complete frame) wait as long as its timeout, since a
    /// peer pinging at that pace sends frames less often. On the loop.
    private func armHeartbeat(_ beat: Heartbeat, from now: UInt64) {
        driver.setDeadline(.heartbeat, at: now &+ beat.interval, slack: beat.slack)
        driver.idleTimeoutFloor = beat.interval > (configuration.pingInterval?.nanoseconds ?? 0) ? beat.timeout : 0
    }

    private func heartbeatTick() {
        guard let beat = heartbeat else { return }
        switch beat.tick(now: uptimeNanoseconds(), lastHeard: driver.lastFrameTime, readingPaused: driver.isReadPaused) {
        case .timedOut:
            logger.warning("peer sent nothing for \(Duration.nanoseconds(Int64(beat.timeout))); closing (heartbeat timeout)")
            driver.tearDown(.heartbeatTimeout)
        case .ping:
            ping()
            armHeartbeat(beat, from: uptimeNanoseconds())
        }
    }
}

/// Where a server's channel hands its messages and then its close (``MessageChannel/route(to:)``),
/// on the channel's loop.
final class MessageRoute: Sendable {
    /// Takes a message; false when the receiver is full: the channel stops reading until its
    /// ``QueueProducer/resumeProducing()``.
    let deliver: @Sendable (IncomingMessage, MessageChannel) -> Bool
    /// Takes a transfer (not held back: its chunks have their own bounded buffer).
    let transfer: @Sendable (IncomingTransfer, MessageChannel) -> Void
    /// The channel closed, after its last message.
    let closed: @Sendable (CloseReason, MessageChannel) -> Void

    init(
        deliver: @escaping @Sendable (IncomingMessage, MessageChannel) -> Bool,
        transfer: @escaping @Sendable (IncomingTransfer, MessageChannel) -> Void,
        closed: @escaping @Sendable (CloseReason, MessageChannel) -> Void
    ) {
        self.deliver = deliver
        self.transfer = transfer
        self.closed = closed
    }
}

extension MessageChannel: QueueProducer {
    /// The route's receiver has room again: read again (when its being full stopped reading).
    func resumeProducing() {
        queue.async { [self] in
            guard routeStopped else { return }
            routeStopped = false
            driver.resumeReading()
        }
    }
}
