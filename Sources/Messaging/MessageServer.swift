import Discovery
import Locks
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
    /// Where the server is in its life; each state holds what exists in it. Every step that awaits
    /// checks the state again afterwards (a `stop()` may have come in between).
    private enum Phase {
        case idle
        case starting(Listener?)
        case running(Listener, (any ServicePublication)?)
        case stopping
        case stopped
    }

    private struct State {
        var phase = Phase.idle
        var connections: [UInt64: ServerConnection] = [:]
        /// Connections whose `.closed` event was not pushed yet.
        var unreported: Set<UInt64> = []
        var pendingHellos = 0
        /// Which connections may start their handshake (``ServerConfiguration/maxPendingHandshakes``
        /// and the rates).
        var admission: HandshakeAdmission
        /// This second (uptime) and the refused events reported in it.
        var refusedEvents = PerSecondCount()
        /// Refused connections since the start (tests).
        var refusals = 0
        /// Sources blocked for flooding: how long their last block was and when it ends (uptime ns).
        var blocks: [HandshakeAdmission.Source: (duration: Duration, until: UInt64)] = [:]
        var nextID: UInt64 = 0
        /// Connections with a message session, by session id (kept through the grace period).
        var sessions: [String: ServerConnection] = [:]

        init(admission: HandshakeAdmission) { self.admission = admission }
    }

    /// The configuration the server was created with.
    public let configuration: ServerConfiguration
    private let publisher: (any ServicePublisher)?
    private let logger: Logger
    /// Refused connections and failed handshakes, logged as a summary per interval.
    private let refusals: RefusalLog
    /// Writes the REFUSE `busy` of connections over an admission bound.
    private let refuser: Refuser
    private let state: Locked<State>
    private let queue: BoundedQueue<ServerEvent>
    /// Events waiting for the app (tests).
    var bufferedEvents: Int { queue.count }
    /// What happens on the server, in order; see ``ServerEvent``.
    public let events: ServerEvents
    /// Its connections' metrics (nil when no metrics back end is bootstrapped).
    let metrics: MessagingMetrics?
    /// The heartbeat pace under load (nil: ``ServerConfiguration/heartbeatsPerSecond`` is nil or
    /// the channels have no heartbeat).
    private let pacer: HeartbeatPacer?
    /// The configuration of every accepted channel, made once: all of them share its storage.
    private let acceptedChannel: ChannelConfiguration

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
        self.refusals = RefusalLog(logger: logger, interval: configuration.refusalLogInterval)
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

    private var listener: Listener? {
        state.withLock { state in
            switch state.phase {
            case .starting(let listener): listener
            case .running(let listener, _): listener
            case .idle, .stopping, .stopped: nil
            }
        }
    }

    /// The listening port (nil before `start()` and after `stop()`).
    public var port: UInt16? { listener?.port }
    /// The addresses the listener is bound to.
    public var boundAddresses: [SocketAddress] { listener?.boundAddresses ?? [] }
    /// The current published name (nil when not published).
    public var publishedName: String? {
        state.withLock { state in
            if case .running(_, let publication?) = state.phase { return publication.name }
            return nil
        }
    }
    /// The open connections (hello completed), oldest first.
    public var connections: [ServerConnection] {
        state.withLock { $0.connections.values.sorted { $0.id < $1.id } }
    }

    /// Listens (IPv4 + IPv6 on one port) and publishes the service with `proto=<version>` in its TXT
    /// (and, when encrypted, `fp=<short fingerprint>`: a hint only, the handshake proves the key).
    /// - Throws: ``MessagingError`` `.alreadyStarted`, `.listenFailed`, `.publishFailed`, or
    ///   `.stopped` when ``stop()`` was called while starting (nothing is left running then).
    public func start() async throws(MessagingError) {
        let proceed = state.withLock { state -> Bool in
            guard case .idle = state.phase else { return false }
            state.phase = .starting(nil)
            return true
        }
        guard proceed else { throw MessagingError(.alreadyStarted, "the server was already started; create a new one") }
        // The identity first: a server that cannot prove its key must not publish a service every
        // handshake with would fail.
        do {
            _ = try configuration.channel.security.resolved(server: true)
        } catch {
            state.withLock { state in if case .starting = state.phase { state.phase = .stopped } }
            throw MessagingError(.unusableIdentity, "cannot start the server: \(error.message)", underlying: error)
        }
        let listener: Listener
        do {
            listener = try Listener(configuration: configuration.listener, logger: logger) { [weak self] socket in
                self?.accepted(socket)
            }
        } catch {
            state.withLock { state in if case .starting = state.phase { state.phase = .stopped } }
            throw MessagingError(.listenFailed, "cannot listen: \(error.message)", underlying: error)
        }
        let stillStarting = state.withLock { state -> Bool in
            guard case .starting = state.phase else { return false }
            state.phase = .starting(listener)
            return true
        }
        guard stillStarting else {
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
                state.withLock { state in if case .starting = state.phase { state.phase = .stopped } }
                throw MessagingError(.publishFailed, "cannot publish the server: \(error.message)", underlying: error)
            }
        }
        // Re-check after the await: a stop() meanwhile must not leave a live publication behind.
        let running = state.withLock { state -> Bool in
            guard case .starting = state.phase else { return false }
            state.phase = .running(listener, publication)
            return true
        }
        guard running else {
            await publication?.unpublish()
            listener.stop()
            throw Self.stoppedWhileStarting
        }
        if let publication { forwardEvents(of: publication) }
        logger.info("server running", metadata: ["port": "\(listener.port)", "type": "\(configuration.serviceType)"])
    }

    private static var stoppedWhileStarting: MessagingError {
        MessagingError(.stopped, "the server was stopped while starting; nothing is listening or published")
    }

    private func forwardEvents(of publication: any ServicePublication) {
        let queue = self.queue
        Task {
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
        let publication = state.withLock { state -> (any ServicePublication)? in
            if case .running(_, let publication) = state.phase { return publication }
            return nil
        }
        guard let publication else {
            throw MessagingError(.notStarted, "the server is not published; start it with a ServiceDiscovery first")
        }
        let record = configuration.channel.security.stampTXT(txt)
        do {
            try await publication.updateTXT(record)
        } catch {
            throw MessagingError(.publishFailed, "TXT update refused: \(error.message)", underlying: error)
        }
    }

    // MARK: Connections

    private static func admission(_ configuration: ServerConfiguration) -> HandshakeAdmission {
        HandshakeAdmission(
            limits: .init(
                inFlight: configuration.maxPendingHandshakes,
                inFlightPerSource: configuration.maxPendingHandshakesPerAddress,
                perSecond: configuration.maxHandshakesPerSecond,
                perSecondPerSource: configuration.maxHandshakesPerSecondPerAddress,
                blockAfterRefusals: configuration.floodBlockThreshold),
            now: uptimeNanoseconds())
    }

    private func accepted(_ socket: AcceptedSocket) {
        let limit = configuration.maxConnections
        let remote = socket.remoteAddress
        let source = HandshakeAdmission.Source(remote)
        enum Admission { case admitted, full, busy(String, Int, block: Listener?) }
        let admission = state.withLock { state -> Admission in
            guard case .running(let listener, _) = state.phase, state.connections.count + state.pendingHellos < limit else {
                return .full
            }
            // Before any handshake work: a handshake costs the server key agreements, so only so
            // many run at once and start per second, in all and from one source.
            switch state.admission.admit(source, now: uptimeNanoseconds()) {
            case .busy(let why, let retry, let block): return .busy(why, retry, block: block ? listener : nil)
            case .admitted: break
            }
            state.pendingHellos += 1
            return .admitted
        }
        switch admission {
        case .full:
            socket.close()
            refused(remote, .connectionLimit, "connection limit of \(limit) reached (or server stopping)")
        case .busy(let why, let retry, let blockAt):
            let reason = "busy: \(why); try again in \(retry) ms"
            refuser.refuse(socket, with: Refusal(code: "busy", message: reason, retryMilliseconds: retry))
            refused(remote, .busy, reason)
            if let listener = blockAt, let threshold = configuration.floodBlockThreshold {
                let duration = blockDuration(source)
                listener.block(source, for: duration)
                metrics?.sourcesBlocked.increment()
                logger.warning(
                    "\(source) made \(threshold) connection attempts in one second that were refused busy: blocking its attempts for \(duration) (the kernel drops them; ServerConfiguration.floodBlockThreshold)"
                )
            }
        case .admitted:
            Task {
                let channel: MessageChannel
                do {
                    channel = try await MessageChannel.accept(socket, configuration: acceptedChannel, logger: logger)
                } catch {
                    state.withLock {
                        $0.admission.ended(source)
                        $0.pendingHellos -= 1
                    }
                    let code = (error as? TransportError).map { "\($0.code)" } ?? "\(type(of: error))"
                    refused(remote, .handshake, "\(error)", logAs: "handshake: \(code)")
                    return
                }
                state.withLock { $0.admission.ended(source) }
                await register(channel)
            }
        }
    }

    /// The server now holds `connections`: its heartbeat pace follows (and its metric).
    private func paced(connections: Int) {
        guard let pacer else { return }
        pacer.update(connections: connections)
        metrics?.heartbeatPace.record(Double(pacer.pace) / 1e9)
    }

    /// A refused connection: counted, reported as an event, logged as part of the interval's
    /// summary (``RefusalLog``; `logAs` is its reason there, the metric's name by default).
    private func refused(
        _ remote: SocketAddress?, _ kind: MessagingMetrics.Refusal, _ reason: String, logAs: String? = nil
    ) {
        refusals.record(reason: logAs ?? kind.rawValue, source: remote, detail: "refused a connection: \(reason)")
        metrics?.refused(kind)
        // Under a flood, thousands of events a second would cost the app a wake-up each and grow
        // the queue when it does not keep up: past ``refusedEventsPerSecond``, or past the event
        // queue's limit, refusals are only counted (metrics) and summarised (log).
        let now = uptimeNanoseconds()
        let thisSecond = state.withLock { state -> Int in
            state.refusals += 1
            return state.refusedEvents.add(now: now)
        }
        if thisSecond <= Self.refusedEventsPerSecond { queue.pushBelowLimit(.refused(remote: remote, reason: reason)) }
    }

    /// How long to block a flooding source: ``ServerConfiguration/floodBlockDuration``, doubled
    /// (up to 32 times) each time it floods again within twice its last block after the block
    /// ended — a flood that never stops then reaches the server for a fraction of a second in
    /// minutes, not every 10 s.
    private func blockDuration(_ source: HandshakeAdmission.Source) -> Duration {
        let base = configuration.floodBlockDuration
        let now = uptimeNanoseconds()
        return state.withLock { state in
            var duration = base
            if let last = state.blocks[source], now < last.until &+ 2 &* last.duration.nanoseconds {
                duration = min(last.duration * 2, base * 32)
            }
            state.blocks[source] = (duration, now &+ duration.nanoseconds)
            if state.blocks.count > 256 {  // forget the sources that have been quiet long enough
                state.blocks = state.blocks.filter { now < $0.value.until &+ 2 &* $0.value.duration.nanoseconds }
            }
            return duration
        }
    }

    /// ``ServerEvent/refused(remote:reason:)`` events reported per second at most.
    static let refusedEventsPerSecond = 100


    /// Connections in their handshake now, and the most there were at once
    /// (``ServerConfiguration/maxPendingHandshakes`` bounds them).
    package var handshakesInProgress: Int { state.withLock { $0.admission.inFlight } }
    package var handshakesHighWater: Int { state.withLock { $0.admission.highWater } }
    /// Connections refused so far, for any reason (the events report up to 100 a second).
    package var refusalCount: Int { state.withLock { $0.refusals } }
    /// Sources whose connection attempts the kernel drops now (``ServerConfiguration/floodBlockThreshold``).
    package var blockedSources: [HandshakeAdmission.Source] { listener?.blockedSources ?? [] }

    private func register(_ channel: MessageChannel) async {
        // A client that offered a session sends SESSION first: new, or the resume of a known one.
        var hello: SessionHello?
        if channel.peer.sessions, configuration.session != nil {
            do {
                hello = try await channel.sessionHello(timeout: configuration.channel.helloTimeout)
            } catch {
                state.withLock { $0.pendingHellos -= 1 }
                refused(channel.remoteAddress, .session, "session exchange failed: \(error)")
                return
            }
        }
        enum Decision {
            case stopping
            case refuse(String)
            case new(ServerConnection)
            case resume(ServerConnection, old: MessageChannel)
        }
        let owner = channel.peerIdentity?.fingerprint
        let decision = state.withLock { state -> Decision in
            state.pendingHellos -= 1
            guard case .running = state.phase else { return .stopping }
            if let hello, let existing = state.sessions[hello.id], let session = existing.session {
                guard session.state.withLock({ $0.owner }) == owner else {
                    return .refuse("session \(hello.id.prefix(8))… belongs to another identity key")
                }
                return .resume(existing, old: existing.replace(with: channel))
            }
            state.nextID += 1
            var session: MessageSession?
            if let hello, let options = configuration.session {
                session = MessageSession(id: hello.id, configuration: options, logger: logger)
                session?.state.withLock { $0.owner = owner }
            }
            let connection = ServerConnection(id: state.nextID, channel: channel, session: session)
            state.connections[connection.id] = connection
            // From here its end is reported once (by its channel's close or by a stop() that
            // lists it meanwhile), though `.accepted` comes after the session exchange.
            state.unreported.insert(connection.id)
            paced(connections: state.connections.count)
            if let hello, session != nil { state.sessions[hello.id] = connection }
            return .new(connection)
        }
        switch decision {
        case .stopping:
            channel.close(reason: "server stopping")
        case .refuse(let reason):
            channel.close(reason: reason)
            refused(channel.remoteAddress, .session, "refusing a session resume: \(reason)")
        case .new(let connection):
            if let session = connection.session, let hello {
                do {
                    _ = try await channel.attachSession(session, hello: hello, isNew: true)
                } catch {
                    state.withLock { _ = $0.unreported.remove(connection.id) }  // never accepted: no `.closed`
                    endSession(connection, reason: await channel.closed())
                    return
                }
                channel.onLoopPing()
            }
            // Unless a stop() meanwhile reported its end: then it is neither accepted nor routed.
            guard reportOpened(connection, .accepted(connection)) else { return channel.close(reason: "server stopping") }
            logger.debug("accepted", metadata: ["connection": "\(connection)"])
            metrics?.accepted.increment()
            routeMessages(connection, channel)
        case .resume(let connection, let old):
            if await old.isOpen {
                // The old connection was lost without a sign (the client's side was destroyed, or
                // a link went down): say so before saying the client is back.
                logger.info("connection lost unnoticed; the client resumed on a new one", metadata: ["connection": "\(connection)"])
                queue.push(.interrupted(connection, .superseded))
            }
            old.abort()  // a half-open connection the client gave up on
            // Its loop has handed on every message it took (they come before the new channel's).
            _ = await old.closed()
            guard let session = connection.session, let hello else { return }
            let resent: Int
            do {
                resent = try await channel.attachSession(session, hello: hello, isNew: false)
            } catch let error as TransportError where error.code == .connectionClosed {
                // The new connection was lost before the session was attached to it (dropped again
                // at once): a lost connection like any other, so the session waits for its client
                // (ending it here reported messages as undelivered that a resume would deliver).
                channelClosed(connection, channel, reason: await channel.closed())
                return
            } catch {
                logger.warning("cannot resume the session of \(connection): \(error)")
                endSession(connection, reason: .protocolError("\(error)"))
                return
            }
            channel.onLoopPing()
            logger.info("session resumed", metadata: ["connection": "\(connection)", "resent": "\(resent)"])
            guard reportOpened(connection, .resumed(connection, resent: resent)) else {
                return channel.close(reason: "the session ended")  // stopping, or its grace period passed
            }
            metrics?.accepted.increment()
            routeMessages(connection, channel)
        }
    }

    /// Pushes `event` (`.accepted`, `.resumed`) unless the connection's end was already reported
    /// (a stop() that listed it while its session was being attached): atomically with that report.
    private func reportOpened(_ connection: ServerConnection, _ event: ServerEvent) -> Bool {
        state.withLock { state in
            guard state.unreported.contains(connection.id) else { return false }
            queue.push(event)
            return true
        }
    }

    private var isStopping: Bool { state.withLock { if case .stopping = $0.phase { true } else { false } } }

    /// Hands `channel`'s messages and transfers to the events from its loop (the previous channel
    /// of a resumed session was closed before, so order is kept), and reports its end. While the
    /// events hold ``ServerConfiguration/eventBufferLimit`` or more, a channel that delivers one
    /// stops reading until the app drains them to half.
    private func routeMessages(_ connection: ServerConnection, _ channel: MessageChannel) {
        let queue = self.queue
        channel.route(
            to: MessageRoute(
                deliver: { message, channel in queue.push(.received(connection, message), from: channel) },
                transfer: { transfer, _ in queue.push(.transfer(connection, transfer)) },
                closed: { [self] reason, channel in
                    // While stopping, stop() reports every connection's end once all are closed:
                    // the loops only close (at 19,000 connections, reporting from them as well
                    // made stop() slower).
                    guard !isStopping else { return }
                    channelClosed(connection, channel, reason: reason)
                }))
    }

    /// A channel of `connection` closed: the connection ends, or (with a session, lost without a
    /// goodbye) waits for its client for the grace period.
    private func channelClosed(_ connection: ServerConnection, _ channel: MessageChannel, reason: CloseReason) {
        guard let session = connection.session, let grace = configuration.session?.gracePeriod else {
            return connectionClosed(connection, reason: reason)
        }
        guard connection.channel === channel else { return }  // replaced by a resume
        let running = state.withLock { if case .running = $0.phase { true } else { false } }
        let ended = session.state.withLock { $0.ended != nil }
        switch reason {
        case .goodbye, .protocolError, .frameTooLarge:
            // The client ended it or misbehaved: not a lost network. (`ServerConnection.close` ends
            // the session itself; a bare `channel.abort()` is treated like a lost connection.)
            return endSession(connection, reason: reason)
        default:
            break
        }
        guard running, !ended else { return endSession(connection, reason: reason) }
        logger.info(
            "connection lost; keeping its session for \(grace)",
            metadata: ["connection": "\(connection)", "reason": "\(reason)"])
        queue.push(.interrupted(connection, reason))
        Task {
            try? await Task.sleep(for: grace)
            if connection.channel === channel { self.endSession(connection, reason: .sessionExpired) }
        }
    }

    /// Ends a connection's session (reporting what was never acknowledged) and the connection.
    private func endSession(_ connection: ServerConnection, reason: CloseReason) {
        if let session = connection.session {
            state.withLock { state in
                if state.sessions[session.id] === connection { state.sessions.removeValue(forKey: session.id) }
            }
            let lost = session.end(MessagingError(.stopped, "the session ended: \(reason)"))
            if !lost.isEmpty {
                logger.notice("\(lost.count) messages to \(connection) were never acknowledged")
                queue.push(.undelivered(connection, lost))
            }
        }
        connectionClosed(connection, reason: reason)
    }

    /// Reports a connection's end exactly once (its channel's close, or `stop()`).
    private func connectionClosed(_ connection: ServerConnection, reason: CloseReason) {
        let first = state.withLock { state -> Bool in
            state.connections.removeValue(forKey: connection.id)
            paced(connections: state.connections.count)
            return state.unreported.remove(connection.id) != nil
        }
        guard first else { return }
        logger.debug("closed", metadata: ["connection": "\(connection)", "reason": "\(reason)"])
        queue.push(.closed(connection, reason))
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
        // Connections already closing (a peer dropped by an earlier broadcast, whose end is not yet
        // reported) are skipped: each failure is reported once.
        let targets = connections.filter {
            !except.contains($0) && ($0.session != nil || $0.channel.driver.acceptsFrames)
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
                        try await sendWithDeadline(connection: connection, timeout: timeout) {
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
    /// messages) within the grace period, aborts what is left, reports every connection's `.closed`,
    /// and ends ``events``. Idempotent; a `stop()` during ``start()`` makes `start()` undo what it did.
    public func stop() async {
        let stopping = state.withLock { state -> (Listener?, (any ServicePublication)?, [ServerConnection])? in
            switch state.phase {
            case .idle:
                state.phase = .stopped
                return nil
            case .stopping, .stopped:
                return nil
            case .starting(let listener):
                state.phase = .stopping
                return (listener, nil, [])
            case .running(let listener, let publication):
                state.phase = .stopping
                return (listener, publication, Array(state.connections.values))
            }
        }
        guard let (listener, publication, connections) = stopping else {
            if state.withLock({ if case .stopped = $0.phase { true } else { false } }) { queue.finish() }
            return
        }
        await publication?.unpublish()
        listener?.stop()
        for connection in connections { connection.channel.close(reason: "server stopping") }
        let grace = configuration.stopGracePeriod
        // One task per connection waiting for its close, and one timer for all of them that
        // aborts those still open after the grace period (19,000 connections: a timer and two
        // tasks each took seconds of their own).
        let reasons = await withTaskGroup(of: (Int, CloseReason)?.self) { group in
            for (index, connection) in connections.enumerated() {
                group.addTask { (index, await connection.channel.closed()) }
            }
            group.addTask {
                try? await Task.sleep(for: grace)
                if !Task.isCancelled { for connection in connections { connection.channel.abort() } }
                return nil
            }
            var reasons = [CloseReason?](repeating: nil, count: connections.count)
            var open = connections.count
            while open > 0, let next = await group.next() {
                guard let (index, reason) = next else { continue }
                reasons[index] = reason
                open -= 1
            }
            group.cancelAll()  // the timer, when every connection closed in time
            return reasons
        }
        // Every connection's end is reported here, once all are closed (each channel's loop
        // pushed its last message before its `closed()` returned; while stopping, the loops do
        // not report ends themselves).
        for (connection, reason) in zip(connections, reasons) {
            endSession(connection, reason: reason ?? .localClose)
        }
        state.withLock { $0.phase = .stopped }
        queue.finish()
        refusals.flush()
        logger.info("server stopped")
    }

    /// Runs the server as a swift-service-lifecycle service: starts it, and on graceful shutdown
    /// (or cancellation) stops it.
    public func run() async throws {
        try await start()
        try? await gracefulShutdown()
        await stop()
    }
}

/// Runs a send; when it is still waiting for queue space after `timeout`, aborts the connection
/// (a peer that does not read) so the send fails instead of hanging.
func sendWithDeadline(
    connection: ServerConnection, timeout: Duration, _ send: @escaping @Sendable () async throws -> Void
) async throws {
    let sender = Task { try await send() }
    let finished = await raceTimeout(timeout) { _ = await sender.result }
    if !finished {
        sender.cancel()
        if let session = connection.session {
            _ = session.end(MessagingError(.peerTooSlow, "\(connection) did not acknowledge messages for \(timeout)"))
        }
        connection.channel.abort()
        throw MessagingError(
            .peerTooSlow,
            "\(connection) did not accept data for \(timeout) (a peer that does not read); dropped it — raise the broadcast timeout if such peers are expected")
    }
    try await sender.value
}
