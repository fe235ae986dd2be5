import Dispatch
@_spi(Programs) import Discovery
import Locks
import Logging
import Scheduling
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

extension MessageClient {
    // MARK: Connecting

    func attach(_ established: (MessageChannel, MessageSession.Opened?)) {
        let (channel, opened) = established
        var resumed = false
        if case .resumed? = opened { resumed = true }
        let outcome = withState { state in
            state.connecting = nil
            return state.lifecycle.established(channel, peer: channel.peer, via: channel.remoteAddress, resumed: resumed)
        }
        guard case .connected(let waiters) = outcome else {
            // Closed meanwhile. With a store and messages not acknowledged, close() keeps the
            // session there for the next client: no GOODBYE, which would end it at the server.
            if session?.staysInStore == true {
                channel.closeWithoutGoodbye()
            } else {
                channel.close(reason: "client closed")
            }
            return
        }
        if let key = channel.peerIdentity?.fingerprint, let address = channel.remoteAddress {
            withState { $0.lastReached = LastReached(addresses: [address], key: key) }
        }
        queue.push(.connected(channel.peer, via: channel.remoteAddress))
        switch opened {
        case .resumed(let resent)?: queue.push(.resumed(resent: resent))
        case .new(let lost)? where !lost.isEmpty:
            logger.warning("the server did not know this client's session: \(lost.count) messages may not have arrived")
            queue.push(.undelivered(lost))
        default: break
        }
        for waiter in waiters { waiter.succeed(channel) }
        // The channel hands its messages, transfers and close to the events from its loop: no
        // buffer of its own and no task in between (one inbound queue per connection, like a
        // server's).
        let queue = self.queue
        channel.route(
            to: ClosureRoute(
                deliver: { [self] message, channel in deliver(message, from: channel) },
                transfer: { transfer, channel in queue.push(.transfer(transfer), from: channel) },
                closed: { [self] reason, channel in
                    queue.forget(channel)  // a channel the full events stopped: not kept after its close
                    let next = lifecycle { $0.channelClosed(channel, reason: reason) }
                    queue.push(.disconnected(reason))
                    switch next {
                    case .nothing: return
                    case .reconnect: startConnecting()
                    case .finish: queue.finish()
                    }
                }))
    }

    /// Hands an unsolicited message to the app, on `channel`'s loop. While the app reads events, a
    /// full queue stops the channel reading (back-pressure) until the app drains it to half. While
    /// nothing has ever read them, or the app stopped reading (``watchForStall(_:taken:)``), the
    /// oldest unsolicited message is dropped instead, so that the connection keeps being read and
    /// replies to requests keep arriving. Returns false when the channel must stop reading.
    private func deliver(_ message: IncomingMessage, from channel: MessageChannel) -> Bool {
        // One critical section of the queue's decides (it was four, counting the client's own).
        let pushed = queue.push(.received(message), from: channel) { event in
            if case .received = event { return true }
            return false
        }
        switch pushed {
        case .added:
            return true
        case .stop(let taken):
            watchForStall(channel, taken: taken)
            return false
        case .evicted(let dropped, let event):
            // Nobody reads the events: a dropped session message counts as handled (acknowledged,
            // as in 1.0), in any acknowledgement mode — nobody can acknowledge it any more, and the
            // session would wait for it forever. (Counted in `droppedMessages`.)
            if case .received(let evicted) = event { evicted.acknowledge() }
            if dropped & (dropped - 1) == 0 {  // 1, 2, 4, 8, …: say so without flooding the log
                logger.notice(
                    "nothing reads client.events: dropped \(dropped) unsolicited messages so far (the oldest first; the newest \(queue.limit) events are kept); replies to requests are not affected")
            }
            return true
        }
    }

    /// The events are full and `channel` stopped reading. An app that takes nothing for a second
    /// stopped reading, and must not stall the connection: replies to its requests travel on it.
    /// Then, as when nobody ever read, the channel reads on and the oldest unsolicited messages are
    /// dropped — until the app reads again. An app that reads, however slowly, keeps the
    /// back-pressure. On the channel's loop.
    private func watchForStall(_ channel: MessageChannel, taken: UInt64) {
        guard !channel.stallCheckArmed else { return }  // one check at a time per channel
        channel.stallCheckArmed = true
        configuration.channel.scheduler.schedule(after: .seconds(1), on: channel.queue) { [weak self, weak channel] in
            guard let channel else { return }
            channel.stallCheckArmed = false
            guard let self, channel.routeStopped else { return }  // reading again
            let now = queue.taken
            guard now == taken else { return watchForStall(channel, taken: now) }  // reading, slowly
            queue.markStalled(at: now)
            logger.notice(
                "the app stopped reading client.events (full for a second): dropping the oldest unsolicited messages so that replies keep arriving")
            channel.resumeProducing()
        }
    }

    /// Starts the background connect loop (waiting for the server, or reconnecting), unless closed.
    /// The loop is started and its task kept in one critical section: kept in a second one, a loop
    /// that connected and lost its connection in between had its newer loop's task overwritten by
    /// this older (ended) one, and `close()` cancelled the ended task while the newer loop went on.
    func startConnecting() {
        withState { state in
            guard state.lifecycle.startLoop() else { return }
            state.connecting = Task { await self.connectLoop() }
        }
    }

    /// Tries until connected, closed, or out of attempts; the lifecycle decides after each
    /// failure (retry after its back-off, or give up). For a service it browses until the service
    /// appears and connects at once.
    private func connectLoop() async {
        while !Task.isCancelled {
            let error: MessagingError
            do {
                attach(try await establish(waiting: true))
                return
            } catch let failure {
                error = failure
            }
            if Task.isCancelled { return }
            let transport = error.underlying as? TransportError
            switch lifecycle({ $0.attemptFailed(error, retryAfter: transport?.retryAfter, refused: transport?.everyAddressRefused ?? false) }) {
            case .stop:
                return
            case .giveUp(let final):
                // Said once (the event and every waiting caller carry it), then closed.
                logger.warning("\(final.logLine)")
                giveUp(final)
                return
            case .retry(let wait, let reconnecting, let attempt):
                logger.info("connect failed", metadata: ["attempt": "\(attempt)", "error": "\(error.message)"])
                // A busy server says when to come back: the wait is not sooner than that.
                queue.push(reconnecting ? .reconnecting(attempt: attempt, delay: wait) : .waiting(error))
                await configuration.channel.scheduler.sleep(for: wait)  // a timer; cancelling the task ends it at once
            }
        }
    }

    /// Stops connecting for good: the session's unacknowledged messages are reported, the app
    /// gets ``ClientEvent/gaveUp(_:)``, every caller waiting for a connection gets `error`.
    private func giveUp(_ error: MessagingError) {
        // The lifecycle first: an app's `close()` since the failed attempt closed the client — its
        // close ends the session and the events, and no give-up is reported after it (nor does the
        // state turn from `closed` to `closed(error)`).
        guard let waiters = lifecycle({ $0.giveUp(error) }) else {
            logger.debug("closed by the app before giving up: \(error.message)")
            return
        }
        // (A store that failed keeps the session for the restarted process, which sends what it
        // holds: nothing of it is reported undelivered — the app would send it again.)
        if let lost = session?.end(error, keepStored: session?.storeFailure != nil), !lost.isEmpty { queue.push(.undelivered(lost)) }
        session?.store?.close()
        queue.push(.gaveUp(error))
        for waiter in waiters { waiter.fail(error) }
        queue.finish()
    }

    /// Connects (finding the server, the handshake, the session's opening). A session the server
    /// could not continue as this side knows it was renewed under a new id by the failed attempt
    /// (its GOODBYE ended the old one there): the next attempt goes at once, with the new session.
    func establish(waiting: Bool) async throws(MessagingError) -> (MessageChannel, MessageSession.Opened?) {
        do {
            return try await establishOnce(waiting: waiting)
        } catch where error.underlying is SessionDiverged {
            logger.notice("\(error.message)")
            return try await establishOnce(waiting: waiting)
        }
    }

    private func establishOnce(waiting: Bool) async throws(MessagingError) -> (MessageChannel, MessageSession.Opened?) {
        // A server asked for by name whose key this client knows is looked for by its key
        // (issue 43, 22): whatever it is called now, impostors refused and reported.
        let wanted = knownKeys()
        var found: (addresses: [SocketAddress], remembered: Fingerprint?) = ([], nil)
        var byKey: MessageChannel?
        if !wanted.isEmpty, case .service(let name?, let type, let discovery) = target {
            // After a lost connection: its address too, tried beside discovery (issue 53, 7).
            let last = waiting ? withState { $0.lastReached }.flatMap { wanted.contains($0.key) ? $0.addresses : nil } : nil
            switch try await findByKey(wanted, name: name, type: type, discovery: discovery, waiting: waiting, last: last) {
            case .connected(let channel, let addresses): (byKey, found) = (channel, (addresses, nil))
            case .notFound: found = try await addresses(waiting: false, browse: false)
            }
        } else {
            found = try await addresses(waiting: waiting)
        }
        do {
            let channel: MessageChannel
            do {
                if let byKey { channel = byKey } else { channel = try await connect(found) }
            } catch where found.remembered != nil && waiting {
                // A waiting client goes back to waiting for discovery when the remembered addresses
                // do not answer (it does not spend a reconnect attempt on them).
                logger.info("the remembered addresses did not answer (\(error)); waiting for discovery")
                found = try await addresses(waiting: true, useMemory: false)
                channel = try await connect(found)
            }
            remember(channel, resolved: found.addresses)
            guard let session, sessionInUse else { return (channel, nil) }
            guard channel.peer.sessions else {
                logger.notice(
                    "the server '\(channel.peer.name)' does not offer message sessions: messages sent while disconnected will fail")
                serverLacksSessions.store(true, ordering: .releasing)
                return (channel, nil)
            }
            if let failure = session.storeFailure {
                // Final (the lifecycle gives up): the store takes no more records in this process,
                // and the session's state in memory may be ahead of it.
                channel.close(reason: "the client's session store failed")
                throw MessageSession.storeFailed(failure)
            }
            do {
                let opened = try await channel.openSession(session, timeout: configuration.channel.helloTimeout)
                channel.onLoopPing()
                return (channel, opened)
            } catch let diverged as SessionDiverged {
                // The server's state of the session and this side's differ: the session was renewed
                // under a new id (the GOODBYE ended the old one there); what had been sent is
                // reported, and the client connects again at once.
                if !diverged.undelivered.isEmpty { queue.push(.undelivered(diverged.undelivered)) }
                throw MessagingError(.connectFailed, "\(diverged.reason); a new session begins on the next connection", underlying: diverged)
            } catch {
                channel.abort()
                throw error
            }
        } catch let error as TransportError where error.code == .untrustedKey {
            // Not a connection problem: retrying meets the same key. The message is the trust
            // policy's (for a changed key: what happened and what to do).
            throw MessagingError(.untrustedServer, error.message, underlying: error)
        } catch let error as TransportError where found.remembered != nil {
            // Said in the error, which the app shows, not only in a notice (issue 45, 6): what was
            // tried, why, and what makes this fallback work.
            let tried = found.addresses.map(\.description).joined(separator: ", ")
            throw MessagingError(
                .connectFailed,
                "cannot connect to \(target): discovery did not find it, and the addresses remembered from its last connection "
                    + "(\(tried)) did not answer: \(error.message). A server on a kernel-assigned port without a session store "
                    + "listens on another port after a restart: give it a fixed port (--port) for this fallback to find it",
                underlying: error)
        } catch let error as TransportError {
            throw MessagingError(.connectFailed, "cannot connect to \(target): \(error.message)", underlying: error)
        } catch let error as MessagingError {
            throw error
        } catch {
            throw MessagingError(.connectFailed, "cannot connect to \(target): \(error)", underlying: error)
        }
    }

    /// Connects to what `addresses(waiting:)` found; at remembered addresses only the remembered
    /// key, which the configured trust policy must accept as well; with `requiring`, only one of
    /// those keys (a server found by its key).
    func connect(
        _ found: (addresses: [SocketAddress], remembered: Fingerprint?), requiring keys: Set<Fingerprint>? = nil
    ) async throws -> MessageChannel {
        var channelConfiguration = configuration.channel
        channelConfiguration.metrics = metrics
        channelConfiguration.loopGroup = connectionLoop
        if case .service(let name?, _, _) = target { channelConfiguration.expectedPeerName = name }
        channelConfiguration.offersSessions = session != nil && sessionInUse
        if let remembered = found.remembered, let (identity, policy) = try configuration.channel.security.resolved() {
            // Found by memory, not discovery: only the key that was proven there before will do.
            channelConfiguration.security = .encrypted(identity: identity, trust: .remembered(remembered, within: policy))
        } else if let keys, case .service(let name?, _, _) = target,
            let (identity, policy) = try configuration.channel.security.resolved()
        {
            channelConfiguration.security = .encrypted(identity: identity, trust: .knownKey(keys, for: name, within: policy))
        }
        return try await MessageChannel.connect(to: found.addresses, configuration: channelConfiguration, logger: logger)
    }

    /// A server remembered from an earlier connection (``ClientConfiguration/peerMemory``), when
    /// the channel is encrypted (there is a key to insist on) and the trust policy still holds the
    /// remembered key. An entry whose key the policy no longer holds (the name forgotten in the
    /// trust store, through ``TrustStore/forget(name:)`` or by hand; the key no longer pinned) is
    /// forgotten with it: never used, and removed from the file.
    private func rememberedEntry() -> PeerMemory.Entry? {
        guard case .service(let name?, let type, _) = target, configuration.channel.security.isEncrypted,
            let memory = configuration.peerMemory, let entry = memory.entry(type: type, name: name),
            let (_, policy) = try? configuration.channel.security.resolved()
        else { return nil }
        if policy.stillHolds(entry.fingerprint, forName: name) { return entry }
        logger.notice(
            "forgot the remembered addresses of '\(name)' (\(type)): its key is no longer one the trust policy holds",
            metadata: ["key": "\(entry.fingerprint.short)"])
        do {
            try memory.forget(type: type, name: name)
        } catch {
            logger.notice("could not forget the remembered addresses: \(error.message)")
        }
        return nil
    }

    /// After a connection to a named service: remember where it was and its proven key.
    private func remember(_ channel: MessageChannel, resolved: [SocketAddress]) {
        guard case .service(let name?, let type, _) = target, let memory = configuration.peerMemory,
            let identity = channel.peerIdentity
        else { return }
        do {
            try memory.remember(
                type: type, name: name, fingerprint: identity.fingerprint, used: channel.remoteAddress, others: resolved)
        } catch {
            logger.notice("could not remember the server's addresses: \(error.message)")
        }
    }

    /// - Parameter browse: false after ``findByKey(_:name:type:discovery:waiting:)`` found nothing:
    ///   only the remembered addresses, or the error saying nothing was found.
    private func addresses(waiting: Bool, useMemory: Bool = true, browse: Bool = true) async throws(MessagingError) -> (addresses: [SocketAddress], remembered: Fingerprint?) {
        switch target {
        case .host(let host, let port):
            do {
                return (try HostLookup.addresses(host: host, port: port), nil)
            } catch {
                throw MessagingError(.connectFailed, error.message, underlying: error)
            }
        case .service(let name, let type, let discovery):
            let queue = self.queue
            var notFoundYet: (@Sendable (MessagingError) -> Void)?
            if waiting {
                notFoundYet = { [weak self] error in
                    self?.lifecycle { $0.waiting(error) }
                    _ = queue.push(.waiting(error))
                }
            }
            let remembered = useMemory ? rememberedEntry() : nil
            if !browse {
                guard let remembered else {
                    throw MessagingError(
                        .serviceNotFound,
                        "no \(type) service named '\(name ?? "")' or announcing its known key found within \(configuration.browseTimeout); check that it runs on this network")
                }
                logger.notice(
                    "discovery found no \(type) service named '\(remembered.name)' or with its key within \(configuration.browseTimeout); trying the addresses it had last time, accepting only its remembered key",
                    metadata: [
                        "addresses": "\(remembered.addresses.map(\.description).joined(separator: ", "))",
                        "key": "\(remembered.fingerprint.short)",
                    ])
                return (remembered.addresses, remembered.fingerprint)
            }
            let service: DiscoveredService
            do {
                // With a remembered server, a waiting client browses one browse timeout at a time,
                // trying the remembered addresses in between.
                service = try await Self.find(
                    name: name, type: type, discovery: discovery,
                    timeout: waiting && remembered == nil ? .seconds(86_400) : configuration.browseTimeout,
                    notFoundYet: notFoundYet)
            } catch {
                guard error.code == .serviceNotFound, let remembered else { throw error }
                logger.notice(
                    "discovery found no \(type) service named '\(remembered.name)' within \(configuration.browseTimeout); trying the addresses it had last time, accepting only its remembered key",
                    metadata: [
                        "addresses": "\(remembered.addresses.map(\.description).joined(separator: ", "))",
                        "key": "\(remembered.fingerprint.short)",
                    ])
                return (remembered.addresses, remembered.fingerprint)
            }
            let resolved: ResolvedService
            do {
                resolved = try await discovery.resolve(service, timeout: configuration.resolveTimeout)
            } catch {
                throw MessagingError(
                    .serviceNotFound, "found \(service.identity) but could not resolve it: \(error.message)",
                    underlying: error)
            }
            // The resolved bytes and interface become socket addresses directly (no text round trip).
            let addresses = resolved.addresses.compactMap {
                SocketAddress(bytes: $0.ip.bytes, port: $0.port, scopeID: $0.scopeID)
            }
            guard !addresses.isEmpty else {
                throw MessagingError(.serviceNotFound, "\(service.identity) resolved without a usable address")
            }
            logger.debug("resolved", metadata: ["service": "\(resolved)"])
            return (addresses, nil)
        }
    }

    /// Browses for services of `type` and picks one: the one named `name` (returned the moment it is
    /// seen), or the only one (decided once Avahi reported "all for now", about a second; a service
    /// appearing later is taken the moment it appears).
    /// - Parameters:
    ///   - name: The instance name to look for; nil takes the only service of `type`.
    ///   - type: The DNS-SD service type, e.g. `_chat._tcp`.
    ///   - discovery: The discovery object to browse with.
    ///   - timeout: How long to browse before giving up.
    ///   - notFoundYet: Called once when the first "all for now" came without a match.
    /// - Throws: ``MessagingError`` `.serviceNotFound` or `.ambiguousService` (names listed).
    public static func find(
        name: String?, type: String, discovery: ServiceDiscovery, timeout: Duration,
        notFoundYet: (@Sendable (MessagingError) -> Void)? = nil
    ) async throws(MessagingError) -> DiscoveredService {
        let found: [DiscoveredService]
        let sawAllForNow = Locked(false)
        let wanted = name.map { "a \(type) service named '\($0)'" } ?? "a \(type) service"
        do {
            found = try await discovery.services(ofType: type, timeout: timeout) { seen, allForNow in
                let matched = name.map { name in seen.contains { $0.name == name } } ?? !seen.isEmpty
                if allForNow {
                    let first = sawAllForNow.withLock { saw -> Bool in
                        defer { saw = true }
                        return !saw
                    }
                    if first && !matched {
                        notFoundYet?(MessagingError(.serviceNotFound, "waiting for \(wanted) to appear"))
                    }
                }
                // Without a name, "the only one" is known once the network has answered.
                return matched && (name != nil || sawAllForNow.withLock { $0 })
            }
        } catch {
            throw MessagingError(.serviceNotFound, "cannot browse for \(type): \(error.message)", underlying: error)
        }
        if let name {
            guard let match = found.first(where: { $0.name == name }) else {
                throw MessagingError(
                    .serviceNotFound,
                    "no \(type) service named '\(name)' found within \(timeout); check the name, or that it runs on this network")
            }
            return match
        }
        switch found.count {
        case 0:
            throw MessagingError(
                .serviceNotFound, "no \(type) service found within \(timeout); is one running on this network?")
        case 1:
            return found[0]
        default:
            let names = found.map { "'\($0.name)'" }.sorted().joined(separator: ", ")
            throw MessagingError(
                .ambiguousService, "\(found.count) \(type) services found (\(names)); name the one you want")
        }
    }
}
