import Logging
import Messaging
import Synchronization

/// The server side of the push protocol on top of a ``MessageServer``: feed it every server event with
/// ``handle(_:)``. It answers offers, receives the matching transfers into a ``PreviewStore`` (one task
/// per push, so several clients push at once), sends each result, and can drain or abort in-flight
/// pushes for a graceful shutdown.
public final class PreviewService: Sendable {
    /// A resumable push: its partial's key, where it resumes, and the pusher's id of it.
    private struct Resume {
        let key: PartialTransfers.Key
        let offset: UInt64
        let completedKey: String
        let pushID: String
    }

    private struct Claim {
        let pushID: String
        var offerID: String
        var task: Task<Void, Never>?
        var channel: MessageChannel?
    }

    private struct Pending {
        let connectionID: UInt64
        let reservation: Reservation
        let expiry: Task<Void, Never>
        var resume: Resume?
    }

    private struct State {
        var pending: [String: Pending] = [:]
        var inFlight: [String: Task<Void, Never>] = [:]
        /// Resumable pushes by content key, from their accepted offer until their receive ends: one
        /// push owns a partial at a time; a retry of it (same push id) takes over, another push of the
        /// same content from the same sender is received without resume.
        var claims: [PartialTransfers.Key: Claim] = [:]
        /// Results of resumable pushes, by sender and push id (the newest 256): a retry of a push that
        /// was stored gets its result instead of a second copy.
        var completed: [String: PreviewResult] = [:]
        var completedOrder: [String] = []
        var draining = false
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
        /// The pushers' keys shown in this run (each once: its first contact with this server).
        var shownKeys: Set<Fingerprint> = []
    }

    /// Where files go.
    public let store: PreviewStore
    /// Where interrupted pushes are kept for a resume (nil: pushes start over).
    public let partials: PartialTransfers?
    private let logger: Logger
    private let offerExpiry: Duration
    private let onStored: @Sendable (StoredFile) async -> Void
    private let state = Mutex(State())

    /// - Parameters:
    ///   - store: The directory and its limits.
    ///   - offerExpiry: How long an accepted offer waits for its transfer before its space is released.
    ///   - logger: Where pushes are logged.
    ///   - onStored: Called after each stored file (update the TXT record, run a hook…).
    public init(
        store: PreviewStore, partials: PartialTransfers? = nil, offerExpiry: Duration = .seconds(60), logger: Logger,
        onStored: @escaping @Sendable (StoredFile) async -> Void = { _ in }
    ) {
        self.store = store
        self.partials = partials
        self.offerExpiry = offerExpiry
        self.logger = logger
        self.onStored = onStored
    }

    /// True once ``beginDraining()`` was called: new offers are refused.
    public var isDraining: Bool { state.withLock { $0.draining } }
    /// Pushes whose data is being received.
    public var inFlightCount: Int { state.withLock { $0.inFlight.count } }

    /// Handles one server event without blocking (work runs in tasks).
    public func handle(_ event: ServerEvent) {
        switch event {
        case .received(let connection, let message):
            if message.typeID == PreviewProtocol.TypeID.offer {
                Task { await self.offer(message, from: connection) }
            } else {
                logger.debug(
                    "ignoring message", metadata: ["type": "\(message.typeID)", "connection": "\(connection)"])
            }
        case .transfer(let connection, let transfer):
            start(transfer, from: connection)
        case .closed(let connection, _):
            dropPending(of: connection.id)
        case .accepted(let connection):
            logger.info("client connected", metadata: ["connection": "\(connection)"])
            // The code preview-push tells its user to compare (issue 45, 4): shown at a pusher's
            // first contact in this run, as bonjour-chat shows its members'.
            if let identity = connection.channel.peerIdentity, state.withLock({ $0.shownKeys.insert(identity.fingerprint).inserted }) {
                logger.notice(
                    "pusher '\(FileName.printable(identity.name))' has key \(identity.fingerprint.full), comparison code \(identity.comparisonCode) — preview-push shows the same code on its first contact")
            }
        case .refused(let remote, let reason):
            // The server's log already has these, as a summary per interval.
            logger.debug(
                "refused connection", metadata: ["remote": "\(remote.map { "\($0)" } ?? "?")", "reason": "\(reason)"])
        case .registrationFailed(let domain, let error):
            logger.warning("wide-area registration in \(domain) failed: \(error.message)")
        case .published, .renamed, .interrupted, .resumed, .undelivered, .registered:
            break
        }
    }

    private func offer(_ message: IncomingMessage, from connection: ServerConnection) async {
        let reply: PreviewOfferReply
        do {
            let offer = try message.decode(PreviewOffer.self)
            reply = await admit(offer, from: connection)
        } catch {
            reply = .refuse(PreviewFailure(PreviewFailure.badRequest, "malformed offer: \(error.message)"))
        }
        if let failure = reply.failure {
            logger.notice("refused offer", metadata: ["connection": "\(connection)", "reason": "\(failure.message)"])
        }
        do {
            try await connection.reply(to: message, with: reply, type: PreviewProtocol.TypeID.offerReply)
        } catch {
            logger.notice("cannot answer offer", metadata: ["connection": "\(connection)", "error": "\(error)"])
            if let id = reply.offerID { expire(id) }
        }
    }

    /// Who pushes: the client's key fingerprint (a plaintext client: its name).
    static func sender(of connection: ServerConnection) -> String {
        connection.channel.peerIdentity.map { $0.fingerprint.full } ?? "name:" + connection.peer.name
    }

    private func admit(_ offer: PreviewOffer, from connection: ServerConnection) async -> PreviewOfferReply {
        guard !isDraining else {
            return .refuse(
                PreviewFailure(PreviewFailure.shuttingDown, "the server is shutting down; try another one or later"))
        }
        var resume: Resume?
        if let partials, let pushID = offer.pushID, isSHA256Hex(offer.sha256) {
            let sender = Self.sender(of: connection)
            let completedKey = sender + "/" + pushID
            if let done = state.withLock({ $0.completed[completedKey] }) {
                logger.info("a retry of a stored push", metadata: ["name": "\(FileName.printable(offer.name))", "stored": "\(FileName.printable(done.storedName ?? "?"))"])
                return .alreadyStored(done)
            }
            let key = PartialTransfers.Key(sender: sender, sha256: offer.sha256, size: offer.size)
            let claim: Claim? = state.withLock { $0.claims[key] }
            var mayResume = true
            if let claim {
                if claim.pushID == pushID {
                    // A retry of this push while its earlier attempt may still be receiving on a
                    // connection that died unnoticed, or waits for its data: stop it (its bytes are kept).
                    if let channel = claim.channel, channel !== connection.channel { channel.abort() }
                    claim.task?.cancel()
                    await claim.task?.value
                    expire(claim.offerID, quietly: true)
                } else {
                    mayResume = false  // another push of the same content owns the partial
                }
            }
            if mayResume {
                resume = Resume(key: key, offset: partials.offset(for: key), completedKey: completedKey, pushID: pushID)
            }
        }
        let reservation: Reservation
        do {
            reservation = try store.reserve(offer)
        } catch {
            return .refuse(error)
        }
        let expiry = offerExpiry
        let timer = Task { [weak self] in
            try? await Task.sleep(for: expiry)
            if !Task.isCancelled { self?.expire(reservation.id) }
        }
        let claimed: Bool = state.withLock { state in
            var admitted = resume
            if let key = resume?.key {
                if state.claims[key] == nil {
                    state.claims[key] = Claim(pushID: resume!.pushID, offerID: reservation.id)
                } else {
                    admitted = nil  // another push claimed it meanwhile: receive without resume
                }
            }
            state.pending[reservation.id] = Pending(
                connectionID: connection.id, reservation: reservation, expiry: timer, resume: admitted)
            return admitted != nil || resume == nil
        }
        if !claimed { resume = nil }
        logger.info(
            "accepted offer",
            metadata: [
                "name": "\(offer.name)", "bytes": "\(offer.size)", "offer": "\(reservation.id)",
                "connection": "\(connection)", "resume at": "\(resume?.offset ?? 0)",
            ])
        return .accept(reservation.id, offset: resume?.offset ?? 0)
    }

    private func expire(_ id: String, quietly: Bool = false) {
        let entry: Pending? = state.withLock { state in
            let entry = state.pending.removeValue(forKey: id)
            if let key = entry?.resume?.key, state.claims[key]?.offerID == id { state.claims[key] = nil }
            return entry
        }
        guard let entry else { return }
        entry.expiry.cancel()
        store.release(entry.reservation)
        if !quietly { logger.notice("offer expired without data", metadata: ["offer": "\(id)"]) }
    }

    private func dropPending(of connectionID: UInt64) {
        let dropped = state.withLock { state -> [Pending] in
            let entries = state.pending.filter { $0.value.connectionID == connectionID }
            for (id, entry) in entries {
                state.pending.removeValue(forKey: id)
                if let key = entry.resume?.key, state.claims[key]?.offerID == id { state.claims[key] = nil }
            }
            return Array(entries.values)
        }
        for entry in dropped {
            entry.expiry.cancel()
            store.release(entry.reservation)
        }
    }

    private func start(_ transfer: IncomingTransfer, from connection: ServerConnection) {
        guard transfer.typeID == PreviewProtocol.TypeID.file,
            let id = transfer.metadata[PreviewProtocol.offerMetadataKey]
        else {
            // Said to the sender, not only logged: a stream needs an accepted offer first.
            logger.notice(
                "discarding a stream without an offer",
                metadata: ["type": "\(transfer.typeID)", "connection": "\(connection)"])
            transfer.discard()
            let failure = PreviewFailure(
                PreviewFailure.badRequest,
                transfer.typeID == PreviewProtocol.TypeID.file
                    ? "a \(PreviewProtocol.TypeID.file) stream needs the offerID of an accepted \(PreviewProtocol.TypeID.offer) in its metadata as \"\(PreviewProtocol.offerMetadataKey)\"; offer the file first"
                    : "this server takes \(PreviewProtocol.TypeID.file) streams only (after an accepted \(PreviewProtocol.TypeID.offer)), not '\(transfer.typeID)'")
            Task {
                try? await connection.send(
                    PreviewResult(offerID: transfer.metadata[PreviewProtocol.offerMetadataKey] ?? "", failure: failure),
                    type: PreviewProtocol.TypeID.result)
            }
            return
        }
        let started: Pending? = state.withLock { state in
            guard let entry = state.pending[id], entry.connectionID == connection.id else { return nil }
            state.pending.removeValue(forKey: id)
            return entry
        }
        guard let entry = started else {
            transfer.discard()
            logger.notice("transfer for an unknown offer", metadata: ["offer": "\(id)", "connection": "\(connection)"])
            let failure = PreviewFailure(
                PreviewFailure.badRequest, "unknown or expired offer \(id); offer the file again")
            Task {
                try? await connection.send(
                    PreviewResult(offerID: id, failure: failure), type: PreviewProtocol.TypeID.result)
            }
            return
        }
        entry.expiry.cancel()
        let expected = entry.reservation.offer.size - (entry.resume?.offset ?? 0)
        guard transfer.totalSize == expected else {
            transfer.discard()
            store.release(entry.reservation)
            let failure = PreviewFailure(
                PreviewFailure.sizeMismatch,
                "the transfer announces \(transfer.totalSize) bytes, the offer \(expected) (\(entry.reservation.offer.size) from byte \(entry.resume?.offset ?? 0))")
            Task {
                try? await connection.send(
                    PreviewResult(offerID: id, failure: failure), type: PreviewProtocol.TypeID.result)
            }
            return
        }
        // Created under the lock, so the task cannot remove itself before it is registered.
        let channel = connection.channel
        state.withLock { state in
            let task = Task {
                await self.receive(entry.reservation, resume: entry.resume, transfer: transfer, from: connection)
                let waiters = self.state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    state.inFlight.removeValue(forKey: id)
                    if let key = entry.resume?.key, state.claims[key]?.offerID == id { state.claims[key] = nil }
                    guard state.inFlight.isEmpty else { return [] }
                    defer { state.idleWaiters.removeAll() }
                    return state.idleWaiters
                }
                for waiter in waiters { waiter.resume() }
            }
            state.inFlight[id] = task
            if let key = entry.resume?.key, state.claims[key]?.offerID == id {
                state.claims[key]?.task = task
                state.claims[key]?.channel = channel
            }
        }
    }

    /// Receives a resumable push through the partial-transfer store, then stores it.
    private func receiveResumable(
        _ reservation: Reservation, resume: Resume, partials: PartialTransfers, transfer: IncomingTransfer
    ) async throws(PreviewFailure) -> StoredFile {
        let path: String
        do {
            path = try await partials.receive(transfer.chunks, key: resume.key, offset: resume.offset)
        } catch {
            switch error.code {
            case .interrupted:
                throw PreviewFailure(
                    PreviewFailure.transferFailed,
                    "\(error.message); the \(error.kept) bytes received are kept: push the same file again to resume")
            case .hashMismatch: throw PreviewFailure(PreviewFailure.hashMismatch, error.message)
            case .sizeMismatch: throw PreviewFailure(PreviewFailure.sizeMismatch, error.message)
            case .busy: throw PreviewFailure(PreviewFailure.transferFailed, error.message + "; try again")
            case .storage:
                throw PreviewFailure(
                    error.message.contains("No space") ? PreviewFailure.noSpace : PreviewFailure.storageFailed,
                    error.message)
            }
        }
        return try store.commit(partial: path, offer: reservation.offer)
    }

    private func receive(
        _ reservation: Reservation, resume: Resume?, transfer: IncomingTransfer, from connection: ServerConnection
    ) async {
        let id = reservation.id
        let result: PreviewResult
        var stored: StoredFile?
        do {
            let file: StoredFile
            if let resume, let partials {
                file = try await receiveResumable(reservation, resume: resume, partials: partials, transfer: transfer)
                remember(resume.completedKey, PreviewResult(offerID: id, storedName: file.name, sha256: file.sha256, size: file.size))
            } else {
                file = try await store.receive(reservation, chunks: transfer.chunks)
            }
            stored = file
            stored?.pusher = StoredFile.Pusher(
                name: connection.peer.name, key: connection.channel.peerIdentity?.fingerprint.short)
            result = PreviewResult(offerID: id, storedName: file.name, sha256: file.sha256, size: file.size)
        } catch {
            transfer.discard()
            logger.warning(
                "push failed",
                metadata: [
                    "name": "\(reservation.offer.name)", "connection": "\(connection)", "reason": "\(error.message)",
                ])
            result = PreviewResult(offerID: id, failure: error)
        }
        store.release(reservation)
        if Task.isCancelled {
            // Aborted for shutdown: tell the client, but do not wait on a peer that does not read.
            Task { try? await connection.send(result, type: PreviewProtocol.TypeID.result) }
        } else {
            do {
                try await connection.send(result, type: PreviewProtocol.TypeID.result)
            } catch {
                logger.notice("cannot send the result", metadata: ["connection": "\(connection)", "error": "\(error)"])
            }
        }
        if let stored { await onStored(stored) }
    }

    /// Remembers a resumable push's result for its retries (the newest 256).
    private func remember(_ key: String, _ result: PreviewResult) {
        state.withLock { state in
            if state.completed.updateValue(result, forKey: key) == nil { state.completedOrder.append(key) }
            while state.completedOrder.count > 256 {
                state.completed.removeValue(forKey: state.completedOrder.removeFirst())
            }
        }
    }

    /// Refuses new offers from now on.
    public func beginDraining() {
        state.withLock { $0.draining = true }
    }

    /// Waits until no push is in flight, at most `timeout`; returns whether none is left.
    public func waitForInFlight(timeout: Duration) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    let idle = self.state.withLock { state -> Bool in
                        if state.inFlight.isEmpty { return true }
                        state.idleWaiters.append(continuation)
                        return false
                    }
                    if idle { continuation.resume() }
                }
                return true
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            if !first {
                // Release the idle waiter so the group can finish.
                let waiters = self.state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    defer { state.idleWaiters.removeAll() }
                    return state.idleWaiters
                }
                for waiter in waiters { waiter.resume() }
            }
            return first || inFlightCount == 0
        }
    }

    /// Aborts every push in flight (their temporary files are deleted) and waits for them to end;
    /// releases pending offers.
    public func abortInFlight() async {
        let (tasks, pending) = state.withLock { state in
            let result = (Array(state.inFlight.values), Array(state.pending.values))
            state.pending.removeAll()
            return result
        }
        for entry in pending {
            entry.expiry.cancel()
            store.release(entry.reservation)
        }
        if !tasks.isEmpty { logger.warning("aborting pushes in flight", metadata: ["count": "\(tasks.count)"]) }
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
    }
}
