import Locks
import Logging
import Messaging
import Scheduling

/// The server side of the push protocol on top of a ``MessageServer``: feed it every server event with
/// ``handle(_:)``. It answers offers, receives the matching transfers into a ``PreviewStore`` (one job
/// per push, so several clients push at once), sends each result, and can drain or abort in-flight
/// pushes for a graceful shutdown. Its work runs as children of one root task (`PreviewWork`); an
/// offer's expiry and the drain's deadline are timers of its scheduler, not sleeping tasks.
public final class PreviewService: Sendable {
    /// The decisions (``PushController``) and the objects that carry them out, found by offer id:
    /// one lock, never held while anything is done.
    private struct State {
        var controller = PushController()
        /// Each waiting offer's expiry.
        var expiries: [String: ScheduledWork] = [:]
        /// Each push being received: its job and the channel it comes on.
        var receives: [String: (job: PreviewWork.Job, channel: MessageChannel)] = [:]
        /// Callers of ``waitForInFlight(timeout:)``, by number: resumed with true when the last push
        /// ends, or with false by their deadline's timer.
        var idleWaiters: [Int: CheckedContinuation<Bool, Never>] = [:]
        var nextWaiter = 0
    }

    /// Where files go.
    public let store: PreviewStore
    /// Where interrupted pushes are kept for a resume (nil: pushes start over).
    public let partials: PartialTransfers?
    private let logger: Logger
    private let offerExpiry: Duration
    /// The clock of the offers' expiry and the drain's deadline (Dispatch's; tests turn a manual one).
    private let scheduler: any Scheduler
    private let onStored: @Sendable (StoredFile) async -> Void
    private let state = Locked(State())
    private let work = PreviewWork()

    /// - Parameters:
    ///   - store: The directory and its limits.
    ///   - offerExpiry: How long an accepted offer waits for its transfer before its space is released.
    ///   - scheduler: The clock of the expiry and of ``waitForInFlight(timeout:)`` (tests: a `ManualScheduler`).
    ///   - logger: Where pushes are logged.
    ///   - onStored: Called after each stored file (update the TXT record, run a hook…).
    /// The web page's link sent with each stored result (nil: none, or only on loopback).
    private let page: @Sendable () -> PreviewResult.PageLink?

    public init(
        store: PreviewStore, partials: PartialTransfers? = nil, offerExpiry: Duration = .seconds(60), logger: Logger,
        page: @escaping @Sendable () -> PreviewResult.PageLink? = { nil },
        scheduler: any Scheduler = DispatchScheduler(),
        onStored: @escaping @Sendable (StoredFile) async -> Void = { _ in }
    ) {
        self.scheduler = scheduler
        self.page = page
        self.store = store
        self.partials = partials
        self.offerExpiry = offerExpiry
        self.logger = logger
        self.onStored = onStored
    }

    /// True once ``beginDraining()`` was called: new offers are refused.
    public var isDraining: Bool { state.withLock { $0.controller.draining } }
    /// Pushes whose data is being received.
    public var inFlightCount: Int { state.withLock { $0.controller.receiving.count } }

    /// Handles one server event without blocking (work runs as jobs of the service's one root task).
    public func handle(_ event: ServerEvent) {
        switch event {
        case .received(let connection, let message):
            if message.typeID == PreviewProtocol.TypeID.offer {
                work.run { await self.offer(message, from: connection) }
            } else {
                logger.debug(
                    "ignoring message", metadata: ["type": "\(message.typeID)", "connection": "\(connection)"])
            }
        case .transfer(let connection, let transfer):
            start(transfer, from: connection)
        case .closed(let connection, _):
            let dropped = state.withLock { state in
                state.controller.connectionClosed(connection.id).map { ($0.pending, state.expiries.removeValue(forKey: $0.offerID)) }
            }
            for (entry, expiry) in dropped {
                expiry?.cancel()
                store.release(entry.reservation)
            }
        case .accepted(let connection):
            logger.info("client connected", metadata: ["connection": "\(connection)"])
            // The code preview-push tells its user to compare (issue 45, 4): shown at a pusher's
            // first contact in this run, as bonjour-chat shows its members'.
            if let identity = connection.channel.peerIdentity,
                state.withLock({ $0.controller.firstContact(identity.fingerprint) })
            {
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

    /// What the controller needs to know of a resumable offer (nil when it cannot be resumed).
    private func resumable(_ offer: PreviewOffer, from connection: ServerConnection) -> PushController.Resume? {
        guard let partials, let pushID = offer.pushID, isSHA256Hex(offer.sha256) else { return nil }
        let sender = Self.sender(of: connection)
        let key = PartialTransfers.Key(sender: sender, sha256: offer.sha256, size: offer.size)
        return PushController.Resume(
            key: key, offset: partials.offset(for: key), completedKey: sender + "/" + pushID, pushID: pushID)
    }

    private func admit(_ offer: PreviewOffer, from connection: ServerConnection) async -> PreviewOfferReply {
        // At most a few rounds: an earlier attempt of the same push is stopped, then asked again.
        for _ in 0..<4 {
            let resumable = resumable(offer, from: connection)
            switch state.withLock({ $0.controller.admit(offer, resumable: resumable) }) {
            case .refuse(let failure):
                return .refuse(failure)
            case .alreadyStored(let done):
                logger.info(
                    "a retry of a stored push",
                    metadata: ["name": "\(FileName.printable(offer.name))", "stored": "\(FileName.printable(done.storedName ?? "?"))"])
                return .alreadyStored(done)
            case .stopEarlier(let offerID, let earlierConnection):
                // A retry of this push while its earlier attempt may still be receiving on a
                // connection that died unnoticed, or waits for its data: stop it (its bytes are kept).
                let receive = state.withLock { $0.receives[offerID] }
                if earlierConnection != nil, earlierConnection != connection.id { receive?.channel.abort() }
                receive?.job.cancel()
                await receive?.job.ended()
                let (entry, expiry) = state.withLock { state in
                    (state.controller.earlierStopped(offerID), state.expiries.removeValue(forKey: offerID))
                }
                expiry?.cancel()
                if let entry { store.release(entry.reservation) }
            case .reserve(let resume):
                let reservation: Reservation
                do {
                    reservation = try store.reserve(offer)
                } catch {
                    return .refuse(error)
                }
                let timer = scheduler.schedule(after: offerExpiry) { [weak self] in self?.expire(reservation.id) }
                let offset = state.withLock { state in
                    state.expiries[reservation.id] = timer
                    return state.controller.reserved(reservation, connection: connection.id, resume: resume)
                }
                logger.info(
                    "accepted offer",
                    metadata: [
                        "name": "\(offer.name)", "bytes": "\(offer.size)", "offer": "\(reservation.id)",
                        "connection": "\(connection)", "resume at": "\(offset)",
                    ])
                return .accept(reservation.id, offset: offset)
            }
        }
        return .refuse(PreviewFailure(PreviewFailure.transferFailed, "an earlier attempt of this push is still ending; try again"))
    }

    /// An offer's time ran out (or its answer could not be sent): its space is released.
    private func expire(_ id: String) {
        let (entry, expiry) = state.withLock { state in
            (state.controller.expire(id), state.expiries.removeValue(forKey: id))
        }
        expiry?.cancel()
        guard let entry else { return }
        store.release(entry.reservation)
        logger.notice("offer expired without data", metadata: ["offer": "\(id)"])
    }

    private func start(_ transfer: IncomingTransfer, from connection: ServerConnection) {
        let offerID = transfer.metadata[PreviewProtocol.offerMetadataKey]
        // One lock section: the decision, the offer's expiry taken, and — for a receive — its job
        // registered, so a retry or an abort that comes next finds the job (not a receive without one).
        let (decision, expiry, job) = state.withLock { state -> (PushController.TransferDecision, ScheduledWork?, PreviewWork.Job?) in
            let decision = state.controller.transferArrived(
                typeID: transfer.typeID, offerID: offerID, connection: connection.id, totalSize: transfer.totalSize)
            switch decision {
            case .refuse(_, nil):
                return (decision, nil, nil)
            case .refuse(_, let release?):
                return (decision, state.expiries.removeValue(forKey: release.id), nil)
            case .receive(let entry):
                let job = receiveJob(entry, transfer: transfer, from: connection)
                state.receives[entry.reservation.id] = (job, connection.channel)
                return (decision, state.expiries.removeValue(forKey: entry.reservation.id), job)
            }
        }
        expiry?.cancel()
        switch decision {
        case .refuse(let result, let release):
            transfer.discard()
            if let release { store.release(release) }
            logger.notice(
                "refused a transfer: \(result.failure?.message ?? "")",
                metadata: ["type": "\(transfer.typeID)", "connection": "\(connection)"])
            work.run { try? await connection.send(result, type: PreviewProtocol.TypeID.result) }
        case .receive(let entry):
            guard let job, !work.run(job) else { return }
            // The service is ending: not received.
            transfer.discard()
            store.release(entry.reservation)
            job.abandon()
            receiveEnded(entry)
        }
    }

    /// The job that receives an accepted transfer, then says its end.
    private func receiveJob(
        _ entry: PushController.Pending, transfer: IncomingTransfer, from connection: ServerConnection
    ) -> PreviewWork.Job {
        PreviewWork.Job {
            await self.receive(entry.reservation, resume: entry.resume, transfer: transfer, from: connection)
            self.receiveEnded(entry)
        }
    }

    /// A push's receive ended: forgotten, and when none is left those waiting for that are woken.
    private func receiveEnded(_ entry: PushController.Pending) {
        let id = entry.reservation.id
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.receives.removeValue(forKey: id)
            guard state.controller.receiveEnded(id, resume: entry.resume) else { return [] }
            defer { state.idleWaiters.removeAll() }
            return Array(state.idleWaiters.values)
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// Receives a resumable push through the partial-transfer store, then stores it.
    private func receiveResumable(
        _ reservation: Reservation, resume: PushController.Resume, partials: PartialTransfers, transfer: IncomingTransfer
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
        _ reservation: Reservation, resume: PushController.Resume?, transfer: IncomingTransfer, from connection: ServerConnection
    ) async {
        let id = reservation.id
        let result: PreviewResult
        var stored: StoredFile?
        do {
            let file: StoredFile
            if let resume, let partials {
                file = try await receiveResumable(reservation, resume: resume, partials: partials, transfer: transfer)
                let done = PreviewResult(offerID: id, storedName: file.name, sha256: file.sha256, size: file.size, page: page())
                state.withLock { $0.controller.stored(resume, done) }
            } else {
                file = try await store.receive(reservation, chunks: transfer.chunks)
            }
            stored = file
            stored?.pusher = StoredFile.Pusher(
                name: connection.peer.name, key: connection.channel.peerIdentity?.fingerprint.short)
            result = PreviewResult(offerID: id, storedName: file.name, sha256: file.sha256, size: file.size, page: page())
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
            work.run { try? await connection.send(result, type: PreviewProtocol.TypeID.result) }
        } else {
            do {
                try await connection.send(result, type: PreviewProtocol.TypeID.result)
            } catch {
                logger.notice("cannot send the result", metadata: ["connection": "\(connection)", "error": "\(error)"])
            }
        }
        if let stored { await onStored(stored) }
    }

    /// Refuses new offers from now on.
    public func beginDraining() {
        state.withLock { $0.controller.beginDraining() }
    }

    /// Waits until no push is in flight, at most `timeout` (a timer of its scheduler), or until the calling
    /// task is cancelled; returns whether none is left.
    public func waitForInFlight(timeout: Duration) async -> Bool {
        let timer = Locked<ScheduledWork?>(nil)
        // This caller's waiter number, and whether it gave up (cancelled) before it had one.
        let number = Locked<(waiter: Int?, gaveUp: Bool)>((nil, false))
        let giveUp: @Sendable () -> Void = { [weak self] in
            guard let waiter = number.withLock({ state -> Int? in
                state.gaveUp = true
                return state.waiter
            }) else { return }
            self?.state.withLock { $0.idleWaiters.removeValue(forKey: waiter) }?.resume(returning: false)
        }
        let idle = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let registered = state.withLock { state -> Int? in
                    if state.controller.receiving.isEmpty || Task.isCancelled { return nil }
                    state.nextWaiter += 1
                    state.idleWaiters[state.nextWaiter] = continuation
                    return state.nextWaiter
                }
                guard let registered else { return continuation.resume(returning: inFlightCount == 0) }
                let gaveUp = number.withLock { state -> Bool in
                    state.waiter = registered
                    return state.gaveUp
                }
                if gaveUp { return giveUp() }  // cancelled while registering
                timer.withLock { $0 = scheduler.schedule(after: timeout, giveUp) }
            }
        } onCancel: {
            giveUp()
        }
        timer.withLock { $0 }?.cancel()
        return idle || inFlightCount == 0
    }

    /// Aborts every push in flight (their temporary files are deleted) and waits for them to end;
    /// releases pending offers.
    public func abortInFlight() async {
        let (jobs, pending, expiries) = state.withLock { state in
            let (pending, receiving) = state.controller.abort()
            let expiries = Array(state.expiries.values)
            state.expiries.removeAll()
            return (receiving.compactMap { state.receives[$0]?.job }, pending, expiries)
        }
        for expiry in expiries { expiry.cancel() }
        for entry in pending { store.release(entry.reservation) }
        if !jobs.isEmpty { logger.warning("aborting pushes in flight", metadata: ["count": "\(jobs.count)"]) }
        for job in jobs { job.cancel() }
        for job in jobs { await job.ended() }
    }
}
