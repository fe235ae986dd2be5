import Dispatch
import FastJSON
import Locks
import Logging
@_spi(Programs) import ProtocolCore
import Synchronization
@_spi(Programs) import Transport

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
    /// (Held by the connection, the one place: its senders refuse larger frames.)
    public var peerMaxFrameSize: Int { driver.peerMaxFrameSize }
    /// The peer's address.
    public var remoteAddress: SocketAddress? { driver.remoteAddress }
    /// The local address of the connection (asked of its socket); nil once the socket is closed.
    public var localAddress: SocketAddress? { driver.localAddress }
    /// Messages from the peer that are neither replies to ``request(_:type:expecting:timeout:)`` nor
    /// taken by an ``on(type:as:_:)`` handler — including unknown type ids and undecodable payloads.
    public var messages: IncomingMessages { IncomingMessages(buffer: messageBuffer) }
    /// The messages' buffer, made on first use (by a consumer, or the first message no handler
    /// takes): an idle channel whose app uses handlers, or nothing yet, holds no buffer.
    let lazyMessageBuffer = LazyReference<BoundedQueue<IncomingMessage>>()
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
    let lazyTransferBuffer = LazyReference<BoundedQueue<IncomingTransfer>>()
    /// Whether anything ever read ``transfers`` (tests, like ``messagesWereRead``).
    var transfersWereRead: Bool { lazyTransferBuffer.load()?.hasConsumer ?? false }
    var transferBuffer: BoundedQueue<IncomingTransfer> {
        if let buffer = lazyTransferBuffer.load() { return buffer }
        return lazyTransferBuffer.storeIfNil(Self.inboundBuffer(driver, limit: configuration.incomingBufferLimit))
    }

    /// What each frame means, the requests waiting for replies, the transfers being received and
    /// the session link (loop-confined).
    var machine: Machine
    typealias Machine = ChannelStateMachine<SessionLink, CheckedContinuation<IncomingMessage, any Error>, IncomingTransfer>
    /// The ``on(type:as:_:)`` handlers, read on the loop for every message without a lock. A handler
    /// installed from another thread goes to `installs` (made on first use) and `hasInstalls` is
    /// raised; the loop merges them before it dispatches the next message. So `on` never waits for
    /// the loop, and a message that arrives after it returned reaches the handler.
    var handlers: [String: (IncomingMessage) -> Void] = [:]
    let installs = LazyReference<PendingInstalls>()
    private let hasInstalls = Atomic<Bool>(false)
    /// The pace the peer asked for in its last PONG, in hundredths of a second (0: none; 16 bits
    /// hold the 10-minute maximum), between the 1-byte flag and the 32-bit limit: in their padding,
    /// no byte more per connection. Loop-confined.
    var peerPaceCentiseconds: UInt16 = 0
    /// Reading stopped because the route's receiver was full (``route(to:)``). Loop-confined.
    var routeStopped = false
    /// A client's check whether its app stopped reading is armed (one at a time). Loop-confined.
    var stallCheckArmed = false
    /// Server: where this channel's messages and close go instead of ``messages`` (``route(to:)``).
    /// Loop-confined.
    var route: (any MessageRoute)?
    final class PendingInstalls: Sendable {
        let list = Locked<[(String, (IncomingMessage) -> Void)]>([])
    }
    /// Round-trip times from the heartbeat (loop-confined; read through ``health``).
    var rtt = RTTEstimator()
    /// The message session running on this connection, its SESSION exchange and the consumers of
    /// ``healthUpdates`` (``ChannelStateMachine/link``; nil for most channels).
    var sessionLink: SessionLink? { machine.link }
    final class SessionLink: SessionLinking {
        /// Strong, and cleared when the channel closes (``connection(_:closedWith:)``): a server's
        /// session holds the channel it serves, so the two keep each other only while the channel
        /// is open. (Weak, it gave the session a side table of reference counts: every message
        /// carries its session, and each copy then took the slow path — 23 % of W7's server.)
        var session: MessageSession?
        /// The session gate, the SESSION exchange and the acknowledgement deadline.
        var gate: SessionGate<Promise<SessionHello>, Promise<MessageSession.Opened>>
        /// Consumers of ``healthUpdates``.
        var healthWatchers: [AsyncStream<ConnectionHealth>.Continuation] = []
        /// A session message held until its epoch's records are synced (the first; the channel
        /// machine has seen it), then the frames that came after it (not seen yet), in order —
        /// ``MessageChannel/holdForEpoch(_:_:)``. Empty almost always. Loop-confined.
        var heldForEpoch: [Frame] = []

        init(gate: SessionGate<Promise<SessionHello>, Promise<MessageSession.Opened>>) { self.gate = gate }
        var hasSession: Bool { session != nil }
    }

    /// The peer's proven identity when the connection is encrypted (protocol version 2); nil in
    /// plaintext. Kept in the channel itself: encryption is the default, and a box of its own cost
    /// every encrypted connection an allocation (32 B more than inline, measured at 19,000).
    public let peerIdentity: PeerIdentity?

    /// - Parameter awaitsSession: Server side: the client offered a message session and this
    ///   server accepts them, so the client's next frame must be its SESSION.
    init(
        driver: ConnectionDriver, established: HandshakeStateMachine.Established, configuration: ChannelConfiguration,
        identity: PeerIdentity? = nil, awaitsSession: Bool = false
    ) {
        self.driver = driver
        peerIdentity = identity
        self.peer = established.peer
        driver.setPeerMaxFrameSize(established.peerMaxFrameSize)
        self.configuration = configuration
        machine = Machine(awaitsClientSession: awaitsSession)
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
            scheduler: configuration.scheduler, logger: logger)
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
    package static func handshake(
        _ driver: ConnectionDriver, client: Bool, configuration: ChannelConfiguration
    ) async throws -> MessageChannel {
        do {
            // A cancelled task (a stopping server's handshakes, a client's connect given up)
            // closes the connection: the exchange ends at once instead of at its timeout.
            return try await withTaskCancellationHandler {
                if configuration.security.isEncrypted {
                    return try await SecureExchange(driver: driver, role: client ? .client : .server, configuration: configuration)
                        .run()
                }
                return try await HelloExchange(driver: driver, role: client ? .client : .server, configuration: configuration)
                    .run()
            } onCancel: {
                driver.abort(.localClose)
            }
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

    /// Runs `body` on the channel's loop, where its state lives, and returns what it returns or
    /// throws: the one way an async caller asks the loop (``health``, ``isOpen``, attaching a
    /// session).
    func onLoop<T: Sendable, Failure: Error>(_ body: @escaping @Sendable () throws(Failure) -> T) async throws(Failure) -> T {
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, Failure>, Never>) in
            queue.async { continuation.resume(returning: Result(catching: body)) }
        }
        return try result.get()
    }

    /// Takes over the connection from the hello exchange. On the loop.
    func activate() {
        assertOnLoop()
        configuration.metrics?.open.increment()
        driver.setHandler(self)
        if let beat = heartbeat { armHeartbeat(beat, from: driver.now) }
    }

    // MARK: Handlers

    /// Routes messages of one type id to `handler` instead of ``messages``.
    ///
    /// The handler runs on the channel's loop, which is shared with other connections (one loop
    /// per core, like event loops), so a slow handler also delays them: keep it short and start a
    /// task for slow work. It may call ``trySend(_:type:replyTo:)`` on any channel. A payload that
    /// does not decode as `T` is logged and delivered to ``messages`` with its raw bytes. A session
    /// message counts as handled when the handler returns (``SessionAcknowledgement/automatic``).
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
                message.handledAutomatically()
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
    func mergeInstalls() {
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

    /// Why the channel closed, or nil when it is still open after `timeout`.
    func closed(within timeout: Duration) async -> CloseReason? { await driver.closed(within: timeout) }

    /// Closes gracefully: sends GOODBYE with `reason`, flushes queued frames, then closes. Idempotent.
    public func close(reason: String = "closing") {
        queue.async {
            guard self.driver.isOpen else { return }
            // What the app handled is acknowledged before the GOODBYE ends the session (issue 45,
            // 7: the ACK waited for its 20 ms delay, and the peer reported those messages as never
            // acknowledged after a clean close).
            self.sendAck()
            self.driver.enqueue(Frame(kind: .goodbye, payload: Array(reason.utf8)), bypassLimit: true) { _ in }
            self.driver.closeGracefully()
        }
    }

    /// Closes gracefully without a GOODBYE (queued frames are flushed first): to the peer, a lost
    /// connection. A message session on it continues when the peer reconnects (a server or client
    /// with a session store that stops, or closes with messages in flight).
    func closeWithoutGoodbye() {
        queue.async {
            guard self.driver.isOpen else { return }
            self.driver.closeGracefully()
        }
    }

    /// Whether the connection is still open (neither side closed it, as far as this side knows);
    /// asked on the loop, where its state lives.
    var isOpen: Bool {
        get async { await onLoop { self.driver.isOpen } }
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
