import Dispatch
import Discovery
import Locks
import Scheduling
import Logging
import ProtocolCore
import ServiceLifecycle
import Transport

/// A messaging server: listens on IPv4 and IPv6 on one port, publishes itself through discovery,
/// accepts clients, and reports what happens as ``events``.
///
/// ```swift
/// let server = MessageServer(configuration: .init(serviceType: "_chat._tcp", serviceName: "Lobby"),
///                            discovery: discovery, logger: logger)
/// try await server.start()
/// for await event in server.events {
///     if case .received(let connection, let message) = event, message.typeID == "chat.say" {
///         let text = try message.decode(String.self)
///         _ = await server.broadcast(text, type: "chat.said")
///     }
/// }
/// ```
///
/// Also a swift-service-lifecycle `Service`: `run()` starts it and stops it gracefully on shutdown.
public final class MessageServer: Service, Sendable {
    /// The server's state (see ``ServerState``), held under ``state``'s lock.
    typealias State = ServerState<Listener, any ServicePublication, ServerWork, ServerConnection, Fingerprint>

    /// The configuration the server was created with.
    public let configuration: ServerConfiguration
    private let publisher: (any ServicePublisher)?
    let logger: Logger
    /// Refused connections and failed handshakes, logged as a summary per interval.
    let refusals: RefusalLog
    /// Writes the REFUSE `busy` of connections over an admission bound.
    let refuser: Refuser
    /// Touched only through ``withState(_:)``.
    private let state: Locked<State>
    let queue: BoundedQueue<ServerEvent>
    /// Events waiting for the app (tests).
    var bufferedEvents: Int { queue.count }
    /// What happens on the server, in order; see ``ServerEvent``.
    public let events: ServerEvents
    /// Its connections' metrics (nil when no metrics back end is bootstrapped).
    let metrics: MessagingMetrics?
    /// The heartbeat pace under load (nil: ``ServerConfiguration/heartbeatsPerSecond`` is nil or
    /// the channels have no heartbeat).
    let pacer: HeartbeatPacer?
    /// The configuration of every accepted channel, made once: all of them share its storage.
    let acceptedChannel: ChannelConfiguration
    /// The grace periods' timers; ``stop()`` cancels what is left.
    let timers: ServerTimers
    /// Tests: runs after a session the store kept from before a restart was taken for a connection
    /// and before it attaches to it (the moment a connection that closes costs that session most).
    let beforeRestoredSessionAttaches = Locked<(@Sendable (MessageChannel) async -> Void)?>(nil)
    /// Tests: runs on a channel's loop after it found the server not stopping and before it handles
    /// the connection's loss (a stop() can begin in between).
    let beforeALostConnectionIsHandled = Locked<(@Sendable () -> Void)?>(nil)

    /// - Parameters:
    ///   - configuration: Service type and name, limits, channel settings.
    ///   - discovery: Used to publish the server; nil (or `configuration.publish == false`) only listens.
    ///   - logger: Where the server logs (accepts, refusals, closes with reasons).
    public convenience init(configuration: ServerConfiguration, discovery: ServiceDiscovery?, logger: Logger) {
        self.init(configuration: configuration, publisher: discovery, logger: logger)
    }

    /// A server publishing through `publisher` (tests control publishing with it).
    package init(configuration: ServerConfiguration, publisher: (any ServicePublisher)?, logger: Logger) {
        self.configuration = configuration
        self.publisher = publisher
        self.logger = logger
        self.refusals = RefusalLog(logger: logger, interval: configuration.refusalLogInterval, scheduler: configuration.channel.scheduler)
        self.timers = ServerTimers(scheduler: configuration.channel.scheduler)
        self.state = Locked(State(admission: Self.admission(configuration)))
        self.refuser = Refuser(configuration: configuration.channel, logger: logger)
        let queue = BoundedQueue<ServerEvent>(limit: configuration.eventBufferLimit)
        self.queue = queue
        self.events = ServerEvents(queue: queue)
        let metrics = MessagingMetrics.make(role: "server")
        self.metrics = metrics
        let pacer = configuration.heartbeatsPerSecond.flatMap { perSecond in
            configuration.channel.pingInterval.map { HeartbeatPacer(perSecond: perSecond, interval: $0.nanoseconds) }
        }
        self.pacer = pacer
        var channel = configuration.channel
        channel.metrics = metrics
        channel.offersSessions = configuration.session != nil
        channel.heartbeatPacer = pacer
        acceptedChannel = channel
    }

    /// Runs `body` on the server's state under its lock: the one place the state is touched (each
    /// input is one call; the I/O it decides happens after, outside the lock).
    func withState<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        try state.withLock(body)
    }

    var listener: Listener? { withState { $0.lifecycle.listener } }

    /// The listening port (nil before `start()` and after `stop()`).
    public var port: UInt16? { listener?.port }
    /// The addresses the listener is bound to.
    public var boundAddresses: [SocketAddress] { listener?.boundAddresses ?? [] }
    /// The current published name (nil when not published).
    public var publishedName: String? { withState { $0.lifecycle.publication?.name } }
    /// The open connections (hello completed), oldest first.
    public var connections: [ServerConnection] {
        withState { $0.registry.all }
    }

    /// Listens (IPv4 + IPv6 on one port) and publishes the service with `proto=<version>` in its TXT
    /// (and, when encrypted, `fp=<short fingerprint>`: a hint only, the handshake proves the key).
    /// - Throws: ``MessagingError`` `.alreadyStarted`, `.listenFailed`, `.publishFailed`, or
    ///   `.stopped` when ``stop()`` was called while starting (nothing is left running then).
    public func start() async throws(MessagingError) {
        guard withState({ $0.lifecycle.startRequested() }) else { throw MessagingError(.alreadyStarted, "the server was already started; create a new one") }
        // Every way out before the server runs passes here: it is stopped then (unless a stop()
        // came in meanwhile and took over).
        var running = false
        defer { if !running { withState { $0.lifecycle.startFailed() } } }
        // The identity first: a server that cannot prove its key must not publish a service every
        // handshake with would fail.
        do {
            _ = try configuration.channel.security.resolved(server: true)
        } catch {
            throw MessagingError(.unusableIdentity, "cannot start the server: \(error.message)", underlying: error)
        }
        // The session store next: a server that cannot continue its sessions does not start
        // (its clients would find them forgotten).
        let journal = try openStore()
        defer { if !running { closeStore() } }
        let listener: Listener
        do {
            listener = try listen(previous: journal?.previousPort)
        } catch {
            throw MessagingError(.listenFailed, "cannot listen: \(error.message)", underlying: error)
        }
        journal?.remember(port: listener.port)
        guard withState({ $0.lifecycle.listening(listener) }) else {
            listener.stop()
            throw Self.stoppedWhileStarting
        }
        var publication: (any ServicePublication)?
        if configuration.publish, let publisher {
            let txt = configuration.channel.security.stampTXT(configuration.txt)
            do {
                publication = try await publisher.publishService(
                    name: configuration.serviceName, type: configuration.serviceType, port: listener.port, txt: txt)
            } catch {
                listener.stop()
                throw MessagingError(.publishFailed, "cannot publish the server: \(error.message)", underlying: error)
            }
        }
        // Re-check after the await: a stop() meanwhile must not leave a live publication behind.
        let work = ServerWork()
        guard withState({ $0.lifecycle.started(listener, publication, work) }) else {
            work.finish()
            await publication?.unpublish()
            listener.stop()
            throw Self.stoppedWhileStarting
        }
        running = true
        if let journal, let grace = configuration.session?.gracePeriod, !journal.restored.isEmpty {
            timers.schedule(after: grace) { [weak self] in self?.expireRestored() }
        }
        if let publication { forwardEvents(of: publication, in: work) }
        logger.info("server running", metadata: ["port": "\(listener.port)", "type": "\(configuration.serviceType)"])
    }

    /// The listener. A server with a session store and a kernel-assigned port listens again on the
    /// port it had (`previous`, kept in the store) when it is free: clients that resume their
    /// sessions after a restart find it where they left it — their resolution and their peer
    /// memory hold that port — instead of waiting for discovery to announce a new one (issue 53,
    /// 7). When it is taken, a kernel-assigned port, as without a store.
    private func listen(previous: UInt16?) throws(TransportError) -> Listener {
        let accept: @Sendable (AcceptedSocket) -> Void = { [weak self] socket in self?.accepted(socket) }
        let clock = configuration.channel.scheduler  // its back-off and its blocks' expiry, on the server's clock
        if let previous, configuration.listener.port == 0, configuration.listener.address == nil {
            var again = configuration.listener
            again.port = previous
            do {
                return try Listener(
                    configuration: again, logger: logger, acceptCall: Listener.systemAccept, scheduler: clock, onAccept: accept)
            } catch {
                logger.notice("the port of the last run, \(previous), is taken (\(error.message)); listening on another")
            }
        }
        return try Listener(
            configuration: configuration.listener, logger: logger, acceptCall: Listener.systemAccept, scheduler: clock, onAccept: accept)
    }

    private static var stoppedWhileStarting: MessagingError {
        MessagingError(.stopped, "the server was stopped while starting; nothing is listening or published")
    }

    private func forwardEvents(of publication: any ServicePublication, in work: ServerWork) {
        let queue = self.queue
        work.run {
            for await event in publication.events {
                switch event {
                case .established(let name): queue.push(.published(name: name))
                case .renamed(let from, let to): queue.push(.renamed(from: from, to: to))
                case .registered(let name, let domain): queue.push(.registered(name: name, domain: domain))
                case .registrationFailed(let domain, let error): queue.push(.registrationFailed(domain: domain, error))
                default: break
                }
            }
        }
    }

    /// Replaces the published TXT record (the server keeps `proto`).
    /// - Throws: ``MessagingError`` `.notStarted`, or `.publishFailed` wrapping the discovery error.
    public func updateTXT(_ txt: TXTRecord) async throws(MessagingError) {
        guard let publication = withState({ $0.lifecycle.publication }) else {
            throw MessagingError(.notStarted, "the server is not published; start it with a ServiceDiscovery first")
        }
        let record = configuration.channel.security.stampTXT(txt)
        do {
            try await publication.updateTXT(record)
        } catch {
            throw MessagingError(.publishFailed, "TXT update refused: \(error.message)", underlying: error)
        }
    }

}

extension MessageServer {
    /// Sends one message to every open connection (except those in `except`). The value is encoded
    /// once. A connection whose send queue stays full for `timeout` (a peer that does not read) is
    /// dropped and reported failed — once: later broadcasts skip it while it closes.
    /// - Returns: One result per connection; failures carry their error, nothing is swallowed.
    public func broadcast<T: Encodable>(
        _ value: T, type: String, except: Set<ServerConnection> = [], timeout: Duration = .seconds(10)
    ) async -> [BroadcastResult] {
        await broadcast(value, type: type, to: connections.filter { !except.contains($0) }, timeout: timeout)
    }

    /// Sends one message to the connections given (a room's members, say), as
    /// ``broadcast(_:type:except:timeout:)`` does to all: encoded once, a connection whose send
    /// queue stays full for `timeout` dropped and reported failed — once: connections already
    /// closing are skipped, and one given twice gets it once.
    /// - Returns: One result per connection sent to; failures carry their error.
    public func broadcast<T: Encodable>(
        _ value: T, type: String, to connections: [ServerConnection], timeout: Duration = .seconds(10)
    ) async -> [BroadcastResult] {
        // Connections already closing (a peer dropped by an earlier broadcast, whose end is not yet
        // reported) are skipped: each failure is reported once.
        var seen = Set<ServerConnection>()
        let targets = connections.filter {
            seen.insert($0).inserted && ($0.session != nil || $0.channel.driver.acceptsFrames)
        }
        guard let first = targets.first else { return [] }
        let encoded: (codecID: UInt8, payload: [UInt8])
        do {
            encoded = try first.channel.encodeForSending(value, type: type)
        } catch {
            return targets.map { BroadcastResult(connection: $0, error: error) }
        }
        let logger = self.logger
        return await withTaskGroup(of: BroadcastResult.self) { group in
            for connection in targets {
                group.addTask {
                    do {
                        try await sendWithDeadline(connection: connection, timeout: timeout, server: self) {
                            try await connection.sendEncoded(encoded.payload, codecID: encoded.codecID, type: type)
                        }
                        return BroadcastResult(connection: connection, error: nil)
                    } catch {
                        logger.notice("broadcast failed", metadata: ["connection": "\(connection)", "error": "\(error)"])
                        return BroadcastResult(connection: connection, error: error)
                    }
                }
            }
            var results: [BroadcastResult] = []
            for await result in group { results.append(result) }
            return results.sorted { $0.connection.id < $1.connection.id }
        }
    }

    /// Stops: unpublishes, stops accepting, closes every connection gracefully (flushing queued
    /// messages) within the grace period, aborts what is left and the handshakes still in progress,
    /// reports every connection's `.closed`, and ends ``events``. When it returns, nothing of the
    /// server runs (a `stop()` called while another runs returns when that one did). Idempotent; a
    /// `stop()` during ``start()`` makes `start()` undo what it did: a `start()` still awaiting its
    /// publication when `stop()` returns withdraws it, closes its listener and throws `.stopped`.
    public func stop() async {
        let (action, connections) = withState { state in
            let action = state.lifecycle.stopRequested()
            if case .stop = action { return (action, state.registry.all) }
            return (action, [])
        }
        let listener: Listener?, publication: (any ServicePublication)?, running: ServerWork?
        switch action {
        case .none:
            // Another stop() runs: this one returns when it did (it returned at once, with the
            // listener and the connections perhaps still open).
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let stopped = withState { state -> Bool in
                    guard !state.lifecycle.isStopped else { return true }
                    state.stopWaiters.append(continuation)
                    return false
                }
                if stopped { continuation.resume() }
            }
            return
        case .finishEvents:
            queue.finish()
            return
        case .stop(let open, let published, let work):
            (listener, publication, running) = (open, published, work)
            // No new background work; what runs is ended and waited for once the connections
            // closed (below).
            work?.finish()
        }
        // No grace period ends while stopping: every session ends or is kept below, by stop().
        timers.cancelAll()
        await publication?.unpublish()
        listener?.stop()
        // With a session store the sessions outlive the server: their connections close without
        // GOODBYE (a GOODBYE would end them), so their clients reconnect and a restarted server
        // continues them from the store.
        let keepSessions = withState { $0.store != nil }
        for connection in connections {
            if keepSessions && connection.session != nil {
                connection.channel.closeWithoutGoodbye()
            } else {
                connection.channel.close(reason: "server stopping")
            }
        }
        let grace = configuration.stopGracePeriod
        // One child task per connection waiting for its close, and one timer for all of them that
        // aborts those still open after the grace period (19,000 connections: a timer and two
        // tasks each took seconds of their own). Cancelled, the timer lets go of the connections
        // at once.
        let abortLate = timers.schedule(after: grace, whileStopping: true) {
            for connection in connections { connection.channel.abort() }
        }
        let reasons = await withTaskGroup(of: (Int, CloseReason).self) { group in
            for (index, connection) in connections.enumerated() {
                group.addTask { (index, await connection.channel.closed()) }
            }
            var reasons = [CloseReason?](repeating: nil, count: connections.count)
            for await (index, reason) in group { reasons[index] = reason }
            return reasons
        }
        timers.cancel(abortLate)  // every connection closed in time
        // The handshakes still running (a peer that connected and said nothing yet) are aborted
        // and awaited: when stop() returns, nothing of the server runs (they used to run on
        // until their hello timeout, holding their sockets).
        await running?.cancel()
        // Every connection's end is reported here, once all are closed (each channel's loop
        // pushed its last message before its `closed()` returned; while stopping, the loops do
        // not report ends themselves).
        // With a store, endSession keeps each session there — but one its client ended meanwhile
        // (its GOODBYE, a protocol error): that one ends.
        for (connection, reason) in zip(connections, reasons) {
            endSession(connection, reason: reason ?? .localClose)
        }
        if keepSessions {
            let kept = connections.filter { $0.session?.endKeptStored == true }.count
            logger.info("session store: \(kept) sessions kept for their clients to continue after a restart")
        }
        closeStore()
        withState { $0.lifecycle.stopped() }
        queue.finish()
        refusals.flush()
        logger.info("server stopped")
        let waiting = withState { state in
            defer { state.stopWaiters = [] }
            return state.stopWaiters
        }
        for stop in waiting { stop.resume() }
    }

    /// Runs the server as a swift-service-lifecycle service: starts it, and on graceful shutdown
    /// (or cancellation) stops it.
    public func run() async throws {
        try await start()
        try? await gracefulShutdown()
        await stop()
    }
}

/// Runs a send; when it is still waiting for queue space (or, in a message session, for room
/// among the unacknowledged) after `timeout`, drops the connection — a peer that does not read —
/// so the send fails instead of hanging. The deadline is a timer on the connection's loop (a
/// broadcast to 19,000 connections made three tasks for each, before).
/// A stop() with a session store that begins meanwhile keeps the session there: the connection is
/// dropped, and the stop ends it as it does every other.
func sendWithDeadline(
    connection: ServerConnection, timeout: Duration, server: MessageServer, _ send: () async throws -> Void
) async throws {
    let outcome = RaceOutcome()
    let channel = connection.channel
    let timer = channel.configuration.scheduler.schedule(after: timeout, on: channel.queue) { [weak server] in
        guard outcome.expire() else { return }  // the send finished first
        if let session = connection.session, server?.stopsKeepingSessions != true {
            let lost = session.end(MessagingError(.peerTooSlow, "\(connection) did not acknowledge messages for \(timeout)"))
            if !lost.isEmpty { connection.events.push(.undelivered(connection, lost)) }
        }
        channel.abort()
    }
    do {
        try await send()
        if outcome.finish() {
            timer.cancel()
            return
        }
    } catch {
        if outcome.finish() {
            timer.cancel()
            throw error
        }
    }
    throw MessagingError(
        .peerTooSlow,
        "\(connection) did not accept data for \(timeout) (a peer that does not read); dropped it — raise the broadcast timeout if such peers are expected")
}

/// The background work of a running server — the handshake of each accepted socket, the forwarding
/// of its publication's events — as child tasks of one root task (a discarding task group fed by a
/// stream of jobs) instead of an unstructured task each: the server owns one task; `stop()` ends
/// the intake (``finish()``) at once, and cancels and awaits what still runs (``cancel()``) once the
/// connections closed.
final class ServerWork: Sendable {
    typealias Job = @Sendable () async -> Void
    /// The jobs not started yet, handed over under a lock ThreadSanitizer sees; the stream only wakes
    /// the root task. (The stream's own lock is inside the precompiled standard library: a socket
    /// made on the listener's queue and read in its handshake job looked like a data race to
    /// ThreadSanitizer — it stopped a CI run's TSan stage, 2026-12-04. See `Locked`.)
    private let handoff: Locked<(jobs: [Job], finished: Bool)>
    private let wakeups: AsyncStream<Void>.Continuation
    private let root: Task<Void, Never>

    init() {
        let (stream, wakeups) = AsyncStream.makeStream(of: Void.self)
        let handoff = Locked<(jobs: [Job], finished: Bool)>(([], false))
        self.handoff = handoff
        self.wakeups = wakeups
        @Sendable func taken() -> [Job] {
            handoff.withLock { state in
                defer { state.jobs = [] }
                return state.jobs
            }
        }
        root = Task {
            await withDiscardingTaskGroup { group in
                for await _ in stream {
                    for job in taken() { group.addTask(operation: job) }
                }
                // (A job handed over just before the intake ended, its wake-up after: it runs too.)
                for job in taken() { group.addTask(operation: job) }
            }
        }
    }

    /// Runs `job` as a child of the root task; false once ``finish()`` was called.
    @discardableResult
    func run(_ job: @escaping Job) -> Bool {
        let accepted = handoff.withLock { state -> Bool in
            guard !state.finished else { return false }
            state.jobs.append(job)
            return true
        }
        if accepted { wakeups.yield(()) }
        return accepted
    }

    /// Takes no more jobs; the root task ends when the running ones have.
    func finish() {
        handoff.withLock { $0.finished = true }
        wakeups.finish()
    }

    /// Takes no more jobs, cancels the running ones (a handshake aborts its connection) and waits
    /// until they and the root task ended.
    func cancel() async {
        finish()
        root.cancel()
        await root.value
    }

    /// Waits until every job ended and the root task with them (tests).
    func ended() async { await root.value }
}
