import Dispatch
import Discovery
import Locks
import Logging
import ProtocolCore
import ServiceLifecycle
import Transport

extension MessageServer {
    // MARK: Connections

    static func admission(_ configuration: ServerConfiguration) -> HandshakeAdmission {
        HandshakeAdmission(
            limits: .init(
                inFlight: configuration.maxPendingHandshakes,
                inFlightPerSource: configuration.maxPendingHandshakesPerAddress,
                perSecond: configuration.maxHandshakesPerSecond,
                perSecondPerSource: configuration.maxHandshakesPerSecondPerAddress,
                blockAfterRefusals: configuration.floodBlockThreshold),
            now: configuration.channel.scheduler.now)
    }

    func accepted(_ socket: AcceptedSocket) {
        let limit = configuration.maxConnections
        let remote = socket.remoteAddress
        let source = HandshakeAdmission.Source(remote)
        // The server's clock (its handshake rates, retry hints and blocks; Dispatch's uptime clock
        // but in a simulation), read before the lock, not inside it.
        let now = configuration.channel.scheduler.now
        let admission = withState {
            $0.admit(source, limit: limit, now: now, blockBase: configuration.floodBlockDuration.nanoseconds)
        }
        switch admission {
        case .notRunning:
            socket.close()
            refused(remote, .connectionLimit, "the server is stopping")
        case .full:
            // Said, not a bare close: REFUSE busy before the handshake, as for too many handshakes
            // (docs/PROTOCOL.md, "Busy"), so the client knows why and when to try again.
            let retry = Self.connectionLimitRetryMilliseconds
            let reason = "busy: this server holds its limit of \(limit) connections; try again in \(retry) ms"
            refuser.refuse(socket, with: Refusal(code: "busy", message: reason, retryMilliseconds: retry))
            refused(remote, .connectionLimit, "connection limit of \(limit) reached")
        case .busy(let why, let retry, let block):
            let reason = "busy: \(why); try again in \(retry) ms"
            refuser.refuse(socket, with: Refusal(code: "busy", message: reason, retryMilliseconds: retry))
            refused(remote, .busy, reason)
            if let block {
                block.listener.block(source, for: block.duration)
                metrics?.sourcesBlocked.increment()
                logger.warning(
                    "\(source) made \(block.count) connection attempts in one second that were refused busy\(block.again ? ", soon after its last block" : ""): blocking its attempts for \(block.duration) (the kernel drops them; ServerConfiguration.floodBlockThreshold)"
                )
            }
        case .admitted(let work):
            // A child of the server's one root task (``ServerWork``), not a task of its own.
            let started = work.run { [self] in
                let channel: MessageChannel
                do {
                    channel = try await MessageChannel.accept(socket, configuration: acceptedChannel, logger: logger)
                } catch {
                    handshakeAbandoned(source)
                    let code = (error as? TransportError).map { "\($0.code)" } ?? "\(type(of: error))"
                    refused(remote, .handshake, "\(error)", logAs: "handshake: \(code)")
                    return
                }
                withState { $0.handshakeSucceeded(source) }
                await register(channel)
            }
            if !started {  // stopped meanwhile
                socket.close()
                handshakeAbandoned(source)
            }
        }
    }

    /// A connection admitted from `source` ends before its handshake completed (it failed, or the
    /// server stopped before it began): its handshake's and its connection's places are free.
    private func handshakeAbandoned(_ source: HandshakeAdmission.Source) {
        withState { $0.handshakeAbandoned(source) }
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
        let now = configuration.channel.scheduler.now
        let thisSecond = withState { $0.refused(now: now) }
        if thisSecond <= Self.refusedEventsPerSecond { queue.pushBelowLimit(.refused(remote: remote, reason: reason)) }
    }

    /// The `retry_ms` of a REFUSE `busy` for the connection limit: a place frees when a client
    /// leaves, which no bound predicts; a second keeps a waiting client from hammering.
    static let connectionLimitRetryMilliseconds = 1_000

    /// ``ServerEvent/refused(remote:reason:)`` events reported per second at most.
    static let refusedEventsPerSecond = 100


    /// What the server's admission counted, read at once (tests).
    package struct AdmissionCounts: Sendable {
        /// Connections in their handshake now, and the most there were at once
        /// (``ServerConfiguration/maxPendingHandshakes`` bounds them).
        package let handshakesInProgress: Int, handshakesHighWater: Int
        /// Connections refused so far, for any reason (the events report up to 100 a second).
        package let refusals: Int
    }
    package var admissionCounts: AdmissionCounts {
        withState {
            AdmissionCounts(
                handshakesInProgress: $0.admission.inFlight, handshakesHighWater: $0.admission.highWater,
                refusals: $0.refusals)
        }
    }
    /// Sources whose connection attempts the kernel drops now (``ServerConfiguration/floodBlockThreshold``).
    package var blockedSources: [HandshakeAdmission.Source] { listener?.blockedSources ?? [] }

    private func register(_ channel: MessageChannel) async {
        // A client that offered a session sends SESSION first: new, or the resume of a known one.
        var hello: SessionHello?
        if channel.peer.sessions, configuration.session != nil {
            do {
                hello = try await channel.sessionHello(timeout: configuration.channel.helloTimeout)
            } catch {
                withState { $0.registry.released() }
                refused(channel.remoteAddress, .session, "session exchange failed: \(error)")
                return
            }
        }
        enum Decision {
            /// `keepsSession`: the client named a session, and the stop keeps sessions in the store.
            case stopping(keepsSession: Bool)
            case refuse(String)
            /// A new connection; `restored`: its session is one the store kept from before a restart.
            case new(ServerConnection, restored: Journal.Restored?)
            case resume(ServerConnection, old: MessageChannel)
        }
        let owner = channel.peerIdentity?.fingerprint
        // A session when the client named one and this server keeps them (then a resume finds it).
        let sessionID = configuration.session != nil ? hello?.id : nil
        let decision = withState { state -> Decision in
            // One the store kept from before a restart continues (the registry does not know it).
            var restored: Journal.Restored?
            if let sessionID, state.store != nil {
                switch state.takeRestored(sessionID, owner: owner?.full) {
                case .none: break
                case .restored(let found): restored = found
                case .refused(let reason):
                    state.registry.released()
                    return .refuse(reason)
                }
            }
            let journal = state.store
            let registration = state.register(session: sessionID, owner: owner) { id in
                let session = sessionID.flatMap { sessionID in
                    configuration.session.map { options in
                        if let restored, let journal {
                            return MessageSession(
                                restoring: restored, configuration: options, logger: logger, serving: channel, store: journal)
                        }
                        return MessageSession(
                            id: sessionID, configuration: options, logger: logger, serving: channel, store: journal,
                            owner: owner?.full)
                    }
                }
                return ServerConnection(id: id, channel: channel, session: session, events: queue, server: self)
            }
            switch registration {
            case nil: return .stopping(keepsSession: sessionID != nil && state.store != nil)
            case .refused(let reason): return .refuse(reason)
            case .resumed(let existing): return .resume(existing, old: existing.replace(with: channel))
            case .new(let connection):
                paced(connections: state.registry.count)
                return .new(connection, restored: restored)
            }
        }
        switch decision {
        case .stopping(let keepsSession):
            // A GOODBYE ends the session it names there: not one the store keeps for the next
            // server (a client resuming it as the stop began).
            if keepsSession { channel.closeWithoutGoodbye() } else { channel.close(reason: "server stopping") }
        case .refuse(let reason):
            channel.close(reason: reason)
            refused(channel.remoteAddress, .session, "refusing a session resume: \(reason)")
        case .new(let connection, let restored):
            var resent: Int?
            var lost: [UndeliveredMessage] = []
            if let session = connection.session, let hello {
                do {
                    // A new session's first record (a restored one's are in the store already),
                    // in the store before the answer tells the client the session exists.
                    // A store that failed keeps no session's new state: none attaches (its state
                    // in memory may be ahead of the store's) until the process restarts.
                    if let failure = session.storeFailure { throw failure }
                    if restored == nil { try await session.begin(everConnected: true) }
                    if restored != nil, let hook = beforeRestoredSessionAttaches.withLock({ $0 }) { await hook(channel) }
                    switch try await channel.attachSession(session, hello: hello, isNew: restored == nil) {
                    case .resumed(let count): resent = count
                    case .restarted(let reason, let undelivered):
                        // The store lost part of the session (or the client did): a new one.
                        logger.notice(
                            "the session kept in the store does not match the client's (\(reason)); it starts anew",
                            metadata: ["connection": "\(connection)", "undelivered": "\(undelivered.count)"])
                        lost = undelivered
                    case .new: break
                    }
                } catch {
                    if let restored, (error as? TransportError)?.code == .connectionClosed {
                        return await restoredResumeClosed(connection, channel, restored)
                    }
                    withState { $0.registry.neverOpened(connection.id) }  // never accepted: no `.closed`
                    if let error = error as? FileError {
                        // The store cannot keep it: the client is told and tries again later.
                        logger.error("cannot keep a new session: \(error.message)")
                        channel.close(reason: MessageSession.storeFailedReason)
                    }
                    // (Closed by a stop() with a store: the session stays there, endSession's rule.)
                    endSession(connection, reason: await channel.closed())
                    return
                }
                channel.onLoopPing()
            }
            // Unless a stop() meanwhile reported its end: then it is neither accepted nor routed.
            guard reportOpened(connection, .accepted(connection)) else { return channel.close(reason: "server stopping") }
            if !lost.isEmpty {
                logger.notice("\(lost.count) messages to \(connection) were never acknowledged")
                queue.push(.undelivered(connection, lost))
            }
            if let resent {
                // A session from before the restart: the app learns the connection, then that it
                // continues.
                logger.info("session continued from the store", metadata: ["connection": "\(connection)", "resent": "\(resent)"])
                _ = reportOpened(connection, .resumed(connection, resent: resent))
            } else {
                logger.debug("accepted", metadata: ["connection": "\(connection)"])
            }
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
            if let failure = session.storeFailure {
                // As for a new connection: no session attaches while the store cannot keep it; the
                // session waits for its client as after a lost connection.
                logger.error("cannot resume the session of \(connection): \(failure.message)")
                channel.close(reason: MessageSession.storeFailedReason)
                channelClosed(connection, channel, reason: await channel.closed())
                return
            }
            var resent = 0
            do {
                switch try await channel.attachSession(session, hello: hello, isNew: false) {
                case .resumed(let count): resent = count
                case .restarted(let reason, let lost):
                    // The client lost part of the session (or this side did): it goes on anew, on
                    // the same connection; what this side had sent is reported first.
                    logger.notice(
                        "the client's state of the session does not match this side's (\(reason)); it starts anew",
                        metadata: ["connection": "\(connection)", "undelivered": "\(lost.count)"])
                    if !lost.isEmpty { queue.push(.undelivered(connection, lost)) }
                case .new: break
                }
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
        withState { state in
            guard state.registry.mayReportOpened(connection.id) else { return false }
            queue.push(event)
            return true
        }
    }

    private var isStopping: Bool { withState { $0.lifecycle.isStopping } }

    /// Stopping with a session store: the sessions stay in it for the next server (``endSession(_:reason:keepStored:)``
    /// keeps each but one its client ended).
    var stopsKeepingSessions: Bool { withState { $0.lifecycle.isStopping && $0.store != nil } }

    /// Hands `channel`'s messages and transfers to the events from its loop (the previous channel
    /// of a resumed session was closed before, so order is kept), and reports its end. While the
    /// events hold ``ServerConfiguration/eventBufferLimit`` or more, a channel that delivers one
    /// stops reading until the app drains them to half.
    private func routeMessages(_ connection: ServerConnection, _ channel: MessageChannel) {
        channel.route(to: connection)
    }

    /// `channel` of `connection` closed (from its loop, after its last message).
    func routeClosed(_ connection: ServerConnection, _ channel: MessageChannel, reason: CloseReason) {
        // While stopping, stop() reports every connection's end once all are closed: the loops
        // only close (at 19,000 connections, reporting from them as well made stop() slower).
        guard !isStopping else { return }
        beforeALostConnectionIsHandled.withLock { $0 }?()
        channelClosed(connection, channel, reason: reason)
    }

    /// The connection that resumed a session the store kept from before the restart closed after
    /// the session was taken for it and before the session attached to it (the client's SESSION and
    /// its end read together, or a client that gave up waiting for the answer). Nothing of the
    /// session changed. Lost without a goodbye, the session goes back to the store's for its
    /// client's next connection, as if this one had not come — in one step with the registry, so
    /// that a resume comes either before (it took the session over: it stays that resume's) or
    /// after (it finds the session in the store). Ending it here forgot it: the next resume
    /// started a new session, and what was in flight was reported undelivered. A GOODBYE or a
    /// protocol error ends it, as on any connection.
    private func restoredResumeClosed(_ connection: ServerConnection, _ channel: MessageChannel, _ restored: Journal.Restored) async {
        let reason = await channel.closed()
        enum Outcome { case takenOver, ends, givenBack, expired }
        let outcome = withState { state -> Outcome in
            // A resume that replaced this channel meanwhile owns the session, however this one ended.
            guard connection.channel === channel else { return .takenOver }
            state.registry.neverOpened(connection.id)  // never accepted: no `.closed`
            if Self.endsSession(reason) { return .ends }
            if let session = connection.session { state.registry.sessionEnded(session.id, of: connection) }
            return state.returnRestored(restored) ? .givenBack : .expired
        }
        switch outcome {
        case .takenOver:
            return  // the session serves the resume's channel
        case .ends:
            endSession(connection, reason: reason)  // a GOODBYE or a protocol error, as on any connection
        case .givenBack:
            logger.notice(
                "a resume of a session kept from before the restart closed before the session attached; the session waits for its client",
                metadata: ["connection": "\(connection)", "reason": "\(reason)"])
            endSession(connection, reason: reason, keepStored: true)
        case .expired:
            endSession(connection, reason: reason)  // the grace period since the start is over
        }
    }

    /// Whether a connection that closed for `reason` ends its session: a GOODBYE (the peer ended it)
    /// or a protocol error (its state cannot be trusted) does; a lost connection does not.
    static func endsSession(_ reason: CloseReason) -> Bool {
        switch reason {
        case .goodbye, .protocolError, .frameTooLarge: true
        default: false
        }
    }

    /// A channel of `connection` closed: the connection ends, or (with a session, lost without a
    /// goodbye) waits for its client for the grace period.
    private func channelClosed(_ connection: ServerConnection, _ channel: MessageChannel, reason: CloseReason) {
        guard let session = connection.session, let grace = configuration.session?.gracePeriod else {
            return connectionClosed(connection, reason: reason)
        }
        guard connection.channel === channel else { return }  // replaced by a resume
        let running = withState { $0.lifecycle.isRunning }
        let ended = session.isEnded
        if Self.endsSession(reason) {
            // The client ended it or misbehaved: not a lost network. (`ServerConnection.close` ends
            // the session itself; a bare `channel.abort()` is treated like a lost connection.)
            return endSession(connection, reason: reason)
        }
        // Not running: stopped, or a stop() began after the loop looked (`routeClosed`) — then,
        // with a store, endSession keeps the session for the next server. (It ended it: a
        // connection lost at the moment the server stopped took its session with it, the next
        // server did not know it, and the client was told its unacknowledged messages may not
        // have arrived — found by the seeded world under ThreadSanitizer, seed 2.)
        guard running, !ended else { return endSession(connection, reason: reason) }
        logger.info(
            "connection lost; keeping its session for \(grace)",
            metadata: ["connection": "\(connection)", "reason": "\(reason)"])
        // Armed before the app is told (a test that turns the clock on `.interrupted` finds it armed).
        timers.schedule(after: grace) { [weak self] in
            if connection.channel === channel { self?.endSession(connection, reason: .sessionExpired) }
        }
        queue.push(.interrupted(connection, reason))
    }

    /// Ends a connection's session (reporting what was never acknowledged) and the connection.
    ///
    /// While a stop() with a session store runs, the session stays in the store for the next
    /// server instead (nothing is reported undelivered) — every session but one its client ended
    /// (a GOODBYE or a protocol error). One rule for every path a stop can meet half way: a
    /// connection lost, a new session's attach, the stop's own end of each connection.
    /// - Parameter keepStored: Keep it in the store whatever the server does (a session from
    ///   before a restart given back for its client).
    func endSession(_ connection: ServerConnection, reason: CloseReason, keepStored: Bool = false) {
        if let session = connection.session {
            withState { $0.registry.sessionEnded(session.id, of: connection) }
            // A store that failed keeps the session for the restarted process, which sends what it
            // holds: nothing of it is reported undelivered then (its end could not be stored).
            let keep = keepStored || session.storeFailure != nil || (!Self.endsSession(reason) && stopsKeepingSessions)
            let lost = session.end(MessagingError(.stopped, "the session ended: \(reason)"), keepStored: keep)
            if !lost.isEmpty {
                logger.notice("\(lost.count) messages to \(connection) were never acknowledged")
                queue.push(.undelivered(connection, lost))
            }
        }
        connectionClosed(connection, reason: reason)
    }

    /// Reports a connection's end exactly once (its channel's close, or `stop()`).
    private func connectionClosed(_ connection: ServerConnection, reason: CloseReason) {
        let first = withState { state -> Bool in
            defer { paced(connections: state.registry.count) }
            return state.registry.closed(connection.id)
        }
        guard first else { return }
        logger.debug("closed", metadata: ["connection": "\(connection)", "reason": "\(reason)"])
        queue.push(.closed(connection, reason))
    }
}
