import Dispatch
import Discovery
import Locks
import Logging
import ProtocolCore
import Scheduling
import Synchronization
import Transport

/// A messaging client: connects to a server by address or by discovered service name (resolve,
/// then Happy Eyeballs over every address, IPv6 link-local included), optionally waits for the
/// server to appear, and reconnects.
///
/// ```swift
/// let client = try await MessageClient.connect(
///     to: .service(name: "Lobby", type: "_chat._tcp", discovery: discovery),
///     configuration: .init(peerName: "alice"), logger: logger)
/// try await client.send("hello", type: "chat.say")
/// for await event in client.events { print(event) }
/// ```
///
/// Replies to ``request(_:type:expecting:timeout:)`` reach their caller whatever the app does with
/// ``events``; see ``ClientConfiguration/eventBufferLimit`` for what happens to other messages.
///
/// Every connection of a client runs on one loop of ``ChannelConfiguration/loopGroup``, reconnects
/// included. A task that streams through the client can prefer that loop's executor, so that its
/// sends need no hand-off to another thread (W7 in docs/PERFORMANCE.md: about 1.5 times the messages
/// per second); while it runs, the other connections of that loop wait, as for a handler:
/// ```swift
/// if let executor = client.channel?.taskExecutor {
///     try await withTaskExecutorPreference(executor) {
///         for reading in readings { try await client.send(reading, type: "reading") }
///     }
/// }
/// ```
public final class MessageClient: Sendable {
    /// The lifecycle (``ClientLifecycle``: connecting, connected, reconnecting, closed; waiters;
    /// back-off) and what the client keeps beside it, under one lock.
    struct State {
        var lifecycle: ClientLifecycle<MessageChannel, Promise<MessageChannel>>
        /// The background connect loop (waiting for the server, or reconnecting): cancelled by close().
        var connecting: Task<Void, Never>?
        /// Consumers of ``connectionStates``, and the state version they were last told.
        var stateWatchers: [UInt64: AsyncStream<ConnectionState>.Continuation] = [:]
        var nextWatcher: UInt64 = 0
        var toldVersion: UInt64 = 0
        /// Where the last connection was and the key proven there (encrypted channels): when it is
        /// lost, tried again before each round of looking for the server by its key.
        var lastReached: LastReached?
    }

    /// Where a connection was, and the key proven there.
    struct LastReached: Sendable {
        var addresses: [SocketAddress]
        var key: Fingerprint
    }

    /// Where this client connects.
    public let target: ServiceTarget
    /// The configuration it was created with.
    public let configuration: ClientConfiguration
    let logger: Logger
    /// Touched only through ``withState(_:)``.
    private let state: Locked<State>
    /// A server without message sessions was met: sends go straight to the connection from now on.
    /// A flag every send reads, set once: no lock.
    let serverLacksSessions = Atomic(false)
    let queue: BoundedQueue<ClientEvent>
    /// What happens on the client, in order; see ``ClientEvent``.
    public let events: ClientEvents
    /// The message session (with a reconnect policy and ``ClientConfiguration/session``).
    let session: MessageSession?
    /// Its connections' metrics (nil when no metrics back end is bootstrapped).
    let metrics = MessagingMetrics.make(role: "client")
    /// A group of one loop, taken from ``ClientConfiguration/channel``'s group: every connection of
    /// this client runs on it, reconnects included, so a task that prefers its executor
    /// (``MessageChannel/taskExecutor``) keeps sending without a thread hand-off after a reconnect.
    let connectionLoop: LoopGroup

    private init(target: ServiceTarget, configuration: ClientConfiguration, logger: Logger, session: MessageSession?) {
        self.target = target
        self.configuration = configuration
        self.logger = logger
        connectionLoop = LoopGroup(loops: [configuration.channel.loopGroup.next()])
        self.session = session
        state = Locked(State(lifecycle: ClientLifecycle(policy: configuration.reconnect, target: "\(target)")))
        let queue = BoundedQueue<ClientEvent>(limit: configuration.eventBufferLimit)
        self.queue = queue
        self.events = ClientEvents(queue: queue)
    }

    /// Connects (resolving the target first) and performs the hello. With
    /// ``ClientConfiguration/waitsForServer`` it returns at once and connects in the background.
    /// - Throws: ``MessagingError`` `.serviceNotFound`, `.ambiguousService` (the names are in the
    ///   message), `.connectFailed` (each address's failure in the message).
    public static func connect(
        to target: ServiceTarget, configuration: ClientConfiguration, logger: Logger
    ) async throws(MessagingError) -> MessageClient {
        do {
            _ = try configuration.channel.security.resolved()
        } catch {
            throw MessagingError(.unusableIdentity, "cannot connect: \(error.message)", underlying: error)
        }
        let (session, leftover) = try makeSession(configuration, logger: logger)
        let client = MessageClient(target: target, configuration: configuration, logger: logger, session: session)
        // Reports an earlier process made and its app never took (it died first): made again,
        // first, one event each as they were made (also with `.onArrival`, which keeps no report of
        // its own: one an earlier configuration left), taken when the events loop goes on.
        for (_, messages) in session?.store?.reportsToMakeAgain() ?? [] {
            logger.notice(
                "session store: \(messages.count) messages reported undelivered before the restart, and not taken by the app then, are reported again")
            client.queue.push(.undelivered(messages))
        }
        // The store's other sessions (a client keeps one): ended, what they kept reported first.
        if !leftover.isEmpty { client.queue.push(.undelivered(leftover)) }
        if configuration.waitsForServer {
            client.startConnecting()
        } else {
            client.attach(try await client.establish(waiting: false))
        }
        return client
    }

    /// The client's message session (with a reconnect policy and ``ClientConfiguration/session``):
    /// the one its session store kept from an earlier process, or a new one. A store holding
    /// several (a client keeps one; an earlier version could leave more) continues the newest and
    /// ends the others: their kept messages are returned, to be reported undelivered.
    /// - Throws: ``MessagingError`` `.sessionStoreUnusable` (the file and what to do).
    private static func makeSession(
        _ configuration: ClientConfiguration, logger: Logger
    ) throws(MessagingError) -> (MessageSession?, [UndeliveredMessage]) {
        guard let options = configuration.session, configuration.reconnect != nil else { return (nil, []) }
        guard let storeConfiguration = options.store else {
            return (MessageSession(id: MessageSession.makeID(), configuration: options, logger: logger), [])
        }
        let journal: SessionJournal
        do {
            journal = try SessionJournal(
                storeConfiguration, role: .client,
                identity: try configuration.channel.security.storeIdentity(server: false), logger: logger,
                scheduler: configuration.channel.scheduler)
        } catch {
            throw MessagingError(.sessionStoreUnusable, "cannot connect: \(error.message)", underlying: error)
        }
        var leftover: [UndeliveredMessage] = []
        for key in journal.restoredOrder.dropLast() {
            guard let old = journal.restored[key] else { continue }
            let ended = MessageSession(restoring: old, configuration: options, logger: logger, store: journal)
                .end(MessagingError(.stopped, "the session store held more than one session"))
            logger.notice(
                "session store: ended session \(key), one of several it held (\(ended.count) messages it kept are reported undelivered)",
                metadata: ["store": "\(journal.path)"])
            leftover += ended
        }
        if let newest = journal.restoredOrder.last, let restored = journal.restored[newest] {
            logger.info(
                "session store: continuing session \(restored.snapshot.key) (\(restored.messages.count) messages not acknowledged yet)",
                metadata: ["store": "\(journal.path)"])
            return (MessageSession(restoring: restored, configuration: options, logger: logger, store: journal), leftover)
        }
        let session = MessageSession(id: MessageSession.makeID(), configuration: options, logger: logger, store: journal)
        do {
            try session.beginNow()
        } catch {
            journal.close()
            throw MessagingError(.sessionStoreUnusable, "cannot connect: \(error.message)", underlying: error)
        }
        return (session, leftover)
    }

    /// The current channel (nil while disconnected).
    public var channel: MessageChannel? { lifecycle { $0.channel } }
    /// The server's hello, when connected.
    public var peer: PeerInfo? { channel?.peer }
    /// Unsolicited messages dropped because nothing read ``events`` while they arrived.
    public var droppedMessages: Int { queue.evictedCount }

    /// Sends a one-way message.
    ///
    /// With a message session (a reconnect policy and ``ClientConfiguration/session``, the default
    /// then) it returns once the message is kept for the server: sent at once when connected, else
    /// when the client reconnects; it waits only while the session keeps its maximum of
    /// unacknowledged messages. Without one it suspends while the send queue is full, and while the
    /// client is connecting or reconnecting it waits up to ``ClientConfiguration/connectionWait``
    /// for the connection.
    public func send<T: Encodable>(_ value: T, type: String) async throws {
        try await route().send(value, type: type, codec: configuration.channel.codecs.sendCodec)
    }

    /// Whether sends go through the session (false once a server without sessions was met).
    var sessionInUse: Bool { !serverLacksSessions.load(ordering: .acquiring) }

    /// Where one-way messages go: the session while one is in use (it keeps them across
    /// reconnects), else the channel, waited for while connecting (up to
    /// ``ClientConfiguration/connectionWait``).
    private func route() async throws -> OutboundRoute {
        if let session, sessionInUse { return .session(session) }
        return .channel(try await readyChannel(within: configuration.connectionWait))
    }

    /// The connection's health (round-trip time, last heard) with this client's reconnect and
    /// resume counts; nil while disconnected.
    public var health: ConnectionHealth? {
        get async {
            guard let channel else { return nil }
            var health = await channel.health
            if let session { (health.reconnects, health.resumes) = session.counts }
            return health
        }
    }

    /// One-way messages kept until the server acknowledges them (0 without a session).
    public var unacknowledgedCount: Int { session?.unacknowledgedCount ?? 0 }

    /// The one-way messages the server has not acknowledged yet, oldest first (empty without a
    /// session): what would be lost if the session could not be resumed.
    public var unacknowledgedMessages: [UndeliveredMessage] { session?.keptMessages ?? [] }
    /// Where sending stands in the message session (nil without one): right after a `send`
    /// returns, ``SessionProgress/sent`` is that message's number. After a restart on a
    /// ``SessionStore`` it says how far the store got (see ``SessionProgress``).
    public var sendProgress: SessionProgress? { session?.progress }

    /// Waits until the server has acknowledged the one-way messages sent so far — or those through
    /// `number`, a ``SessionProgress/sent`` of ``sendProgress`` — across reconnects and resumes:
    /// an acknowledgement ends the wait, no timer polls. What `send` returning does not say: the
    /// server has them (its app got them, or with ``SessionAcknowledgement/manual`` handled them).
    ///
    /// ```swift
    /// try await client.send(Note(text: "saved"), type: "note")
    /// guard await client.acknowledged(within: .seconds(5)) else { /* still kept, still sent on */ }
    /// ```
    ///
    /// - Returns: `true` once they are all acknowledged (at once when they are already, and without
    ///   a message session, which keeps nothing). `false` when `timeout` passed or the task was
    ///   cancelled first — nothing is lost: they stay kept and go on being sent — or when they
    ///   cannot be acknowledged any more: the client was closed, the session started anew and
    ///   reported one of them undelivered (``ClientEvent/undelivered(_:)``), or its store failed
    ///   and `send` threw for one of them.
    public func acknowledged(through number: UInt64? = nil, within timeout: Duration) async -> Bool {
        guard let session else { return true }
        return await session.acknowledged(through: number, within: timeout, scheduler: configuration.channel.scheduler)
    }

    /// Whether the current connection resumed the message session of an earlier one (set before
    /// ``ClientEvent/connected(_:via:)`` is reported).
    public var resumedSession: Bool { lifecycle { $0.resumed } }

    /// Where the connection stands now, with the reason for the last transition.
    public var connectionState: ConnectionState { lifecycle { $0.state } }

    /// Every change of ``connectionState``, starting with the current one (the newest kept for a
    /// slow reader); ends once the client is closed or, without reconnecting, disconnected. Apart
    /// from ``events``: reading one owes nothing to the other. Each access is a new stream.
    public var connectionStates: AsyncStream<ConnectionState> {
        let (stream, continuation) = AsyncStream.makeStream(of: ConnectionState.self, bufferingPolicy: .bufferingNewest(1))
        let id = withState { state -> UInt64? in
            continuation.yield(state.lifecycle.state)
            guard !state.lifecycle.state.isFinal else { return nil }
            state.nextWatcher += 1
            state.stateWatchers[state.nextWatcher] = continuation
            return state.nextWatcher
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        // A reader that goes away (its task cancelled) is forgotten. (Called outside the lock:
        // the client finishes its watchers after releasing it.)
        continuation.onTermination = { [weak self] _ in
            _ = self?.withState { $0.stateWatchers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Runs `body` on the lifecycle under the lock (see ``withState(_:)``).
    func lifecycle<R>(_ body: (inout ClientLifecycle<MessageChannel, Promise<MessageChannel>>) -> R) -> R {
        withState { body(&$0.lifecycle) }
    }

    /// Runs `body` on the state under the lock and tells the watchers of ``connectionStates`` when
    /// it changed the connection state (under the lock, so they see the changes in order).
    func withState<R>(_ body: (inout State) -> R) -> R {
        let (result, ended) = state.withLock { state -> (R, [AsyncStream<ConnectionState>.Continuation]) in
            let result = body(&state)
            guard state.lifecycle.stateVersion != state.toldVersion else { return (result, []) }
            state.toldVersion = state.lifecycle.stateVersion
            let now = state.lifecycle.state
            for watcher in state.stateWatchers.values { watcher.yield(now) }
            guard now.isFinal else { return (result, []) }
            defer { state.stateWatchers = [:] }
            return (result, Array(state.stateWatchers.values))
        }
        for watcher in ended { watcher.finish() }  // outside the lock: finishing runs onTermination
        return result
    }

    /// Sends several messages of one type in order with one hand-off to the connection (see
    /// `MessageChannel.send(contentsOf:type:)`): cheaper than one `send` each for a stream of
    /// small messages. In a message session all are encoded before the first is kept; with a
    /// ``SessionStore`` of ``SessionStore/Durability/powerLoss`` it returns once one sync covers
    /// the whole batch (a batch of 64 costs about one `fdatasync`, not 64).
    public func send<T: Encodable>(contentsOf values: some Sequence<T>, type: String) async throws {
        try await route().send(contentsOf: values, type: type, codec: configuration.channel.codecs.sendCodec)
    }

    /// Sends a request and waits for the reply (see ``MessageChannel/request(_:type:expecting:timeout:)``).
    /// While the client is connecting or reconnecting, waiting for the connection counts against
    /// `timeout` too (and against ``ClientConfiguration/connectionWait``).
    /// - Throws: ``RemoteError`` when the server answers with an error, `TransportError`
    ///   (`.requestTimedOut`, …), ``MessagingError`` `.notConnected`.
    public func request<Request: Encodable, Response: Decodable>(
        _ value: Request, type: String, expecting: Response.Type = Response.self, timeout: Duration = .seconds(10)
    ) async throws -> Response {
        let start = ContinuousClock.now
        let channel = try await readyChannel(within: min(timeout, configuration.connectionWait))
        let left = timeout - (ContinuousClock.now - start)
        return try await channel.request(value, type: type, expecting: expecting, timeout: max(left, .milliseconds(1)))
    }

    /// Closes gracefully (queued messages are flushed) and stops connecting and reconnecting. Idempotent.
    public func close(reason: String = "client closing") async {
        let ((channel, waiters), connecting) = withState { state in
            defer { state.connecting = nil }
            return (state.lifecycle.close(), state.connecting)
        }
        connecting?.cancel()
        for waiter in waiters { waiter.fail(MessagingError(.stopped, "the client was closed")) }
        var keptInStore = false
        if let session {
            // Let the server acknowledge what it was sent, then end the session (GOODBYE ends it there).
            let drained = await session.drained(within: .seconds(5), scheduler: configuration.channel.scheduler)
            if !drained {
                logger.notice("closing with \(session.unacknowledgedCount) messages the server has not acknowledged")
            }
            // With a store, what the server has not acknowledged stays there for the next process
            // to send: the session is not ended (no GOODBYE), the server keeps it for its grace
            // period, and nothing is reported undelivered.
            keptInStore = !drained && session.store != nil
            let lost = session.end(MessagingError(.stopped, "the client was closed"), keepStored: keptInStore)
            if !lost.isEmpty { queue.push(.undelivered(lost)) }
            if keptInStore {
                logger.notice("the session store keeps them: the next client on '\(session.store!.directory)' sends them")
            }
        }
        if let channel {
            if keptInStore { channel.closeWithoutGoodbye() } else { channel.close(reason: reason) }
            _ = await channel.closed(within: .seconds(5))
        }
        session?.store?.close()
        queue.finish()
    }

    // MARK: Waiting for a connection

    /// The current connection, waiting up to `wait` while the client connects or reconnects.
    /// - Throws: ``MessagingError`` `.notConnected` (with the last attempt's failure), `.stopped`.
    public func connectedChannel(within wait: Duration) async throws -> MessageChannel {
        try await readyChannel(within: wait)
    }

    private func readyChannel(within wait: Duration) async throws -> MessageChannel {
        switch lifecycle({ $0.ready(waiting: wait) }) {
        case .channel(let channel): return channel
        case .failure(let error): throw error
        case .wait: break
        }
        // Registered first, then the timer armed (so it cannot fire before); a channel, the close
        // or the timer completes the promise, whichever comes first.
        let promise = Promise<MessageChannel>()
        let (id, now) = lifecycle { $0.addWaiter(promise) }
        switch now {
        case .channel(let channel): return channel
        case .failure(let error): throw error
        case .wait: break
        }
        let timer = configuration.channel.scheduler.schedule(after: wait) { [weak self] in
            guard let self else { return }
            let (waiter, error) = lifecycle { ($0.waiterTimedOut(id), $0.timedOut(wait)) }
            waiter?.fail(error)
        }
        defer { timer.cancel() }
        return try await promise.value()
    }
}
