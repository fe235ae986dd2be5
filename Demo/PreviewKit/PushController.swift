import Messaging

/// The decisions of ``PreviewService``, without I/O (issue 46, 7; as ChatKit's `HostController`):
/// which offers are accepted, refused or answered with an earlier result; which push owns a
/// resumable partial; which transfer is received and which refused; what an expiry, a closed
/// connection, a push's end, a drain and an abort release. Each input is one method on the value,
/// called under the service's lock; it returns what to do, and the service does it after the lock
/// — reply, reserve, arm or cancel a timer, start or cancel a receive job, send a result, release.
/// The objects (timers, jobs, channels) stay with the service, found by offer id.
struct PushController: Sendable {
    /// A resumable push: its partial's key, where it resumes (the bytes the partials store holds),
    /// the key its result is remembered by (sender and push id) and the pusher's id of it.
    struct Resume: Sendable, Equatable {
        var key: PartialTransfers.Key
        var offset: UInt64
        var completedKey: String
        var pushID: String
    }

    /// An accepted offer waiting for its transfer.
    struct Pending: Sendable, Equatable {
        var connection: UInt64
        var reservation: Reservation
        var resume: Resume?
    }

    /// Which push owns a resumable partial, from its accepted offer until its receive ends.
    struct Claim: Sendable, Equatable {
        var pushID: String
        var offerID: String
        /// Its receive runs (on `connection`).
        var receiving = false
        var connection: UInt64?
    }

    /// The answer to an offer.
    enum Admission: Sendable, Equatable {
        case refuse(PreviewFailure)
        /// A retry of a push already stored: its result.
        case alreadyStored(PreviewResult)
        /// A retry of a push whose earlier attempt (this offer) may still wait or receive, on this
        /// connection: abort that connection when it is another one, cancel the receive and wait for
        /// it, expire the offer quietly — then ask again.
        case stopEarlier(offerID: String, connection: UInt64?)
        /// Reserve the space (``PreviewStore/reserve(_:)``), then ``reserved(_:connection:resume:)``.
        case reserve(resume: Resume?)
    }

    /// What to do with an arriving transfer.
    enum TransferDecision: Sendable, Equatable {
        /// Discard it and send this result (no such offer, another connection's, a size that does
        /// not match); `release` the offer's space when it had some.
        case refuse(PreviewResult, release: Reservation?)
        /// Cancel the offer's expiry and receive it (a job).
        case receive(Pending)
    }

    private(set) var pending: [String: Pending] = [:]
    /// The offers whose data is being received.
    private(set) var receiving: Set<String> = []
    private(set) var claims: [PartialTransfers.Key: Claim] = [:]
    /// Results of resumable pushes, by sender and push id (the newest `completedLimit`).
    private(set) var completed: [String: PreviewResult] = [:]
    private var completedOrder: [String] = []
    private(set) var draining = false
    /// The pushers' keys shown in this run (each once: its first contact with this server).
    private var shownKeys: Set<Fingerprint> = []
    static let completedLimit = 256

    init() {}

    // MARK: Offers

    /// An offer came. `resumable`: its partial, as the partials store has it now (when there is a
    /// partials store, a push id and a well-formed hash).
    func admit(_ offer: PreviewOffer, resumable resume: Resume?) -> Admission {
        guard !draining else {
            return .refuse(PreviewFailure(PreviewFailure.shuttingDown, "the server is shutting down; try another one or later"))
        }
        guard let resume else { return .reserve(resume: nil) }
        if let done = completed[resume.completedKey] { return .alreadyStored(done) }
        guard let claim = claims[resume.key] else { return .reserve(resume: resume) }
        if claim.pushID == resume.pushID {
            return .stopEarlier(offerID: claim.offerID, connection: claim.receiving ? claim.connection : nil)
        }
        return .reserve(resume: nil)  // another push of the same content owns the partial
    }

    /// The space is reserved: the offer waits for its transfer (arm its expiry). Returns the offset
    /// to accept it at — 0 when another push claimed the partial meanwhile (received without resume).
    mutating func reserved(_ reservation: Reservation, connection: UInt64, resume: Resume?) -> UInt64 {
        var admitted = resume
        if let resume {
            if claims[resume.key] == nil {
                claims[resume.key] = Claim(pushID: resume.pushID, offerID: reservation.id)
            } else {
                admitted = nil
            }
        }
        pending[reservation.id] = Pending(connection: connection, reservation: reservation, resume: admitted)
        return admitted?.offset ?? 0
    }

    /// An offer's time ran out, or its answer could not be sent: its space is released (the
    /// pending offer returned), its claim dropped.
    mutating func expire(_ offerID: String) -> Pending? {
        guard let entry = pending.removeValue(forKey: offerID) else { return nil }
        dropClaim(of: entry, offerID)
        return entry
    }

    /// A connection closed: its offers that wait for data are dropped (release them).
    mutating func connectionClosed(_ connection: UInt64) -> [(offerID: String, pending: Pending)] {
        let dropped = pending.filter { $0.value.connection == connection }
        for (id, entry) in dropped {
            pending.removeValue(forKey: id)
            dropClaim(of: entry, id)
        }
        return dropped.map { ($0.key, $0.value) }.sorted { $0.offerID < $1.offerID }
    }

    // MARK: Transfers

    /// A transfer arrived on `connection`: of `typeID`, for the offer in its metadata, announcing
    /// `totalSize` bytes.
    mutating func transferArrived(typeID: String, offerID: String?, connection: UInt64, totalSize: UInt64) -> TransferDecision {
        guard typeID == PreviewProtocol.TypeID.file, let offerID else {
            // Said to the sender, not only logged: a stream needs an accepted offer first.
            let failure = PreviewFailure(
                PreviewFailure.badRequest,
                typeID == PreviewProtocol.TypeID.file
                    ? "a \(PreviewProtocol.TypeID.file) stream needs the offerID of an accepted \(PreviewProtocol.TypeID.offer) in its metadata as \"\(PreviewProtocol.offerMetadataKey)\"; offer the file first"
                    : "this server takes \(PreviewProtocol.TypeID.file) streams only (after an accepted \(PreviewProtocol.TypeID.offer)), not '\(typeID)'")
            return .refuse(PreviewResult(offerID: offerID ?? "", failure: failure), release: nil)
        }
        guard let entry = pending[offerID], entry.connection == connection else {
            return .refuse(
                PreviewResult(
                    offerID: offerID,
                    failure: PreviewFailure(PreviewFailure.badRequest, "unknown or expired offer \(offerID); offer the file again")),
                release: nil)
        }
        pending.removeValue(forKey: offerID)
        let expected = entry.reservation.offer.size - (entry.resume?.offset ?? 0)
        guard totalSize == expected else {
            dropClaim(of: entry, offerID)
            let failure = PreviewFailure(
                PreviewFailure.sizeMismatch,
                "the transfer announces \(totalSize) bytes, the offer \(expected) (\(entry.reservation.offer.size) from byte \(entry.resume?.offset ?? 0))")
            return .refuse(PreviewResult(offerID: offerID, failure: failure), release: entry.reservation)
        }
        receiving.insert(offerID)
        if let key = entry.resume?.key, claims[key]?.offerID == offerID {
            claims[key]?.receiving = true
            claims[key]?.connection = connection
        }
        return .receive(entry)
    }

    /// A resumable push was stored: its retries get this result (said before the result is sent,
    /// so a retry that comes meanwhile is answered with it).
    mutating func stored(_ resume: Resume, _ result: PreviewResult) {
        remember(resume.completedKey, result)
    }

    /// A push's receive ended (stored, failed or cancelled). Returns whether none is in flight now
    /// (wake those waiting for that).
    mutating func receiveEnded(_ offerID: String, resume: Resume?) -> Bool {
        receiving.remove(offerID)
        if let resume, claims[resume.key]?.offerID == offerID { claims[resume.key] = nil }
        return receiving.isEmpty
    }

    /// The earlier attempt (``Admission/stopEarlier(offerID:connection:)``) ended: its claim is
    /// dropped whatever state it was in, and its offer, if it still waited, returned (release it).
    mutating func earlierStopped(_ offerID: String) -> Pending? {
        let entry = expire(offerID)
        for (key, claim) in claims where claim.offerID == offerID { claims[key] = nil }
        return entry
    }

    /// Remembers a resumable push's result for its retries (the newest ``completedLimit``).
    private mutating func remember(_ key: String, _ result: PreviewResult) {
        if completed.updateValue(result, forKey: key) == nil { completedOrder.append(key) }
        while completedOrder.count > Self.completedLimit {
            completed.removeValue(forKey: completedOrder.removeFirst())
        }
    }

    private mutating func dropClaim(of entry: Pending, _ offerID: String) {
        if let key = entry.resume?.key, claims[key]?.offerID == offerID { claims[key] = nil }
    }

    // MARK: Pushers, drain, abort

    /// A pusher connected with this key: true the first time in this run (show its code).
    mutating func firstContact(_ key: Fingerprint) -> Bool { shownKeys.insert(key).inserted }

    /// New offers are refused from now on.
    mutating func beginDraining() { draining = true }

    /// Shutdown: every waiting offer is dropped (release them); the receives to cancel.
    mutating func abort() -> (pending: [Pending], receiving: Set<String>) {
        let dropped = Array(pending.values)
        pending.removeAll()
        return (dropped, receiving)
    }
}
