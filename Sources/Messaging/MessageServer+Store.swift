import Dispatch
import Locks
import Logging
import ProtocolCore
import Transport

extension MessageServer {
    // MARK: The session store

    /// Opens the session store when one is configured, and takes the sessions it holds: a client
    /// that resumes one continues it (``restoredSession(_:owner:)``).
    /// - Throws: ``MessagingError`` `.sessionStoreUnusable`, naming the file and what to do.
    func openStore() throws(MessagingError) -> SessionJournal? {
        guard let options = configuration.session, let storeConfiguration = options.store else { return nil }
        let journal: SessionJournal
        do {
            journal = try SessionJournal(
                storeConfiguration, role: .server, identity: try Self.storeIdentity(configuration.channel.security, server: true),
                logger: logger)
        } catch {
            throw MessagingError(.sessionStoreUnusable, "cannot start the server: \(error.message)", underlying: error)
        }
        let restored = Dictionary(uniqueKeysWithValues: journal.restored.map { ($0.key.hex, $0.value) })
        store.withLock { $0 = (journal, restored) }
        if !restored.isEmpty {
            let messages = restored.values.reduce(0) { $0 + $1.messages.count }
            logger.info(
                "session store: \(restored.count) sessions to continue (\(messages) messages not acknowledged yet); their clients have \(options.gracePeriod) to come back",
                metadata: ["store": "\(journal.path)"])
        }
        return journal
    }

    /// What names this process in its store: its key's full fingerprint, or `plaintext`.
    static func storeIdentity(_ security: ChannelSecurity, server: Bool) throws(FileError) -> String {
        try security.resolved(server: server).map { $0.0.fingerprint.full } ?? "plaintext"
    }

    /// Closes the store (its lock is released: a new server may open it).
    func closeStore() {
        let journal = store.withLock { store in
            defer { store = (nil, [:]) }
            return store.journal
        }
        journal?.close()
    }

    /// What the store kept under a session id from before a restart.
    enum RestoredSession {
        case none
        /// Another key opened it: refused, with the reason.
        case refused(String)
        case restored(Journal.Restored)
    }

    /// The session the store kept under `id` from before a restart, taken for the connection that
    /// resumes it. A session that `owner`'s key did not open is refused (and stays for its own).
    func restoredSession(_ id: String, owner: Fingerprint?) -> RestoredSession {
        store.withLock { store in
            guard let restored = store.restored[id] else { return .none }
            guard restored.snapshot.owner == owner?.full else {
                return .refused("session \(id.prefix(8))… belongs to another identity key")
            }
            store.restored[id] = nil
            return .restored(restored)
        }
    }

    /// The grace period since the start passed: the sessions from before the restart that no
    /// client resumed end. What they kept is reported as never acknowledged (``ServerEvent/undelivered(_:_:)``
    /// of a connection made for the report, closed).
    func expireRestored() {
        let (journal, expired) = store.withLock { store in
            defer { store.restored = [:] }
            return (store.journal, Array(store.restored.values))
        }
        guard let journal, !expired.isEmpty else { return }
        logger.notice("session store: \(expired.count) sessions from before the restart were not resumed within the grace period; they end")
        for restored in expired {
            // A connection made for the report: its channel is closed from the start (the client
            // never came back), its peer known only by the key that opened the session.
            let channel = MessageChannel.closedPlaceholder(
                peerName: restored.snapshot.owner.map { "session of " + (Fingerprint($0)?.short ?? $0) } ?? "session",
                configuration: acceptedChannel, logger: logger)
            let session = MessageSession(
                restoring: restored, configuration: configuration.session ?? SessionConfiguration(), logger: logger,
                serving: channel, store: journal)
            let lost = session.end(MessagingError(.stopped, "the session ended: its client did not come back after the restart"))
            guard !lost.isEmpty else { continue }
            let id = withState { $0.registry.makeID() }
            let connection = ServerConnection(id: id, channel: channel, session: session, events: queue, server: nil)
            logger.notice("\(lost.count) messages of session \(restored.snapshot.key) were never acknowledged")
            queue.push(.undelivered(connection, lost))
            queue.push(.closed(connection, .sessionExpired))
        }
    }
}
