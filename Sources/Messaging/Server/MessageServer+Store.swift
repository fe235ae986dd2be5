import Dispatch
import Locks
import Logging
import ProtocolCore
import Transport

extension MessageServer {
    // MARK: The session store

    /// Opens the session store when one is configured; the server's state takes the sessions it
    /// holds (a client that resumes one continues it: ``ServerState/takeRestored(_:owner:)``).
    /// - Throws: ``MessagingError`` `.sessionStoreUnusable`, naming the file and what to do.
    func openStore() throws(MessagingError) -> SessionJournal? {
        guard let options = configuration.session, let storeConfiguration = options.store else { return nil }
        let journal: SessionJournal
        do {
            journal = try SessionJournal(
                storeConfiguration, role: .server, identity: try configuration.channel.security.storeIdentity(server: true),
                logger: logger, scheduler: configuration.channel.scheduler)
        } catch {
            throw MessagingError(.sessionStoreUnusable, "cannot start the server: \(error.message)", underlying: error)
        }
        withState { $0.opened(journal) }
        reportAgain(journal)
        if !journal.restored.isEmpty {
            let messages = journal.restored.values.reduce(0) { $0 + $1.messages.count }
            logger.info(
                "session store: \(journal.restored.count) sessions to continue (\(messages) messages not acknowledged yet); their clients have \(options.gracePeriod) to come back",
                metadata: ["store": "\(journal.path)"])
        }
        return journal
    }

    /// Reports of undelivered messages an earlier process made and its app never took (it died
    /// first): made again, first, each on a connection made for the report (closed; its peer named
    /// by the key that opened the session; no other event names it), as ``expireRestored()`` does.
    /// Taken like any report: when the events loop asks for the next event (also with
    /// ``SessionAcknowledgement/onArrival``, which keeps no report of its own: one an earlier
    /// configuration left).
    func reportAgain(_ journal: SessionJournal) {
        for (report, messages) in journal.reportsToMakeAgain() {
            let id = withState { $0.registry.makeID() }
            let connection = ServerConnection(id: id, channel: reportChannel(owner: report.owner), events: queue, server: nil)
            logger.notice(
                "session store: \(messages.count) messages of session \(report.key), reported undelivered before the restart and not taken by the app then, are reported again")
            queue.push(.undelivered(connection, messages))
        }
    }

    /// The channel of a connection made for a report of a session whose client is not connected:
    /// closed from the start, its peer known only by the key that opened the session.
    private func reportChannel(owner: String?) -> MessageChannel {
        MessageChannel.closedPlaceholder(
            peerName: owner.map { "session of " + (Fingerprint($0)?.short ?? $0) } ?? "session",
            configuration: acceptedChannel, logger: logger)
    }

    /// Closes the store (its lock is released: a new server may open it).
    func closeStore() {
        withState { $0.closedStore() }?.close()
    }

    /// The grace period since the start passed: the sessions from before the restart that no
    /// client resumed end. What they kept is reported as never acknowledged (``ServerEvent/undelivered(_:_:)``
    /// of a connection made for the report, closed).
    func expireRestored() {
        let (journal, expired) = withState { $0.takeUnclaimed() }
        guard let journal, !expired.isEmpty else { return }
        logger.notice("session store: \(expired.count) sessions from before the restart were not resumed within the grace period; they end")
        for restored in expired {
            let channel = reportChannel(owner: restored.snapshot.owner)
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

extension ChannelSecurity {
    /// What names this process in a session store: its key's full fingerprint, or `plaintext`.
    func storeIdentity(server: Bool) throws(FileError) -> String {
        try resolved(server: server).map { $0.0.fingerprint.full } ?? "plaintext"
    }
}
