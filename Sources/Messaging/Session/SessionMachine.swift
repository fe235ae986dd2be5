import ProtocolCore
import Synchronization

/// What a session runs on: a connection (``MessageChannel``), and the driver its frames are
/// written to (held by the senders instead of the channel: see ``SessionMachine/outgoingDriver``).
protocol SessionLink: AnyObject, Sendable {
    associatedtype Driver: AnyObject & Sendable
    var sessionDriver: Driver { get }
    /// The largest frame body the peer takes (an atomic load: read under the session's lock).
    var peerMaxFrameSize: Int { get }
}

/// One side of a message session without I/O (see `ProtocolCore/Session.swift`): numbers, keeps
/// and resends one-way messages, counts and acknowledges the peer's, and decides what its store
/// writes and when. Each input is one method; it changes the state and says what the carrier
/// (``MessageSession``) does after releasing its lock, in ``Effects``: the records to hand to the
/// store (queued under the lock, so their order is the order of the inputs), what to do once they
/// are written, frames to send, senders and drain callers to resume, an acknowledgement to make.
///
/// Generic over the link and the waiters so that its tests need neither sockets nor tasks. Not
/// thread-safe: the carrier holds it under its lock. Its fields are set by its inputs only (they
/// are not `private(set)` because the inputs live in three files).
struct SessionMachine<Link: SessionLink, Sender, Drain> {
    /// Where the session is.
    enum Phase {
        /// No connection carries it now (none yet, or it was lost): messages are kept.
        case detached
        /// A connection carries it (after its SESSION exchange).
        case attached(Link)
        /// It ended (the error says why): sends fail with it.
        case ended(MessagingError)
    }

    /// What a store write does once written (the carrier's completion calls back with it).
    enum AfterWrite: Equatable {
        /// Messages up to `through` of `epoch` are in the store.
        case messages(through: UInt64, epoch: UInt64)
        /// The handled count `through` of `epoch` is in the store.
        case handled(through: UInt64, epoch: UInt64)
        /// The session's record (a new session, or a new epoch with its kept messages up to
        /// `through`) is in the store.
        case begun(through: UInt64, epoch: UInt64)
    }

    /// What an input leaves the carrier to do once the lock is released.
    struct Effects {
        /// Records for the store, in order (the carrier queues them before releasing the lock).
        var records: [Journal.Record] = []
        /// What their being written means (nil: nothing waits for them).
        var afterWrite: AfterWrite?
        /// Senders to resume, each with the error it gets (nil: go on).
        var senders: [(Sender, (any Error)?)] = []
        var drains: [Drain] = []
        /// Acknowledgement waiters to complete, each with whether its messages were all acknowledged.
        var acknowledgements: [(Drain, Bool)] = []
        /// Callers waiting for the epoch's records (``waitForEpoch(_:_:)``) to go on, now.
        var epochReady: [@Sendable () -> Void] = []
        /// Frames added to ``outgoing`` (the carrier counts them as unsent under its lock; the one
        /// that raises the count from zero sends them).
        var outgoingAdded = 0
        /// What the channel does for the acknowledgement now.
        var ack: (Link, SessionInbox.AckStep)?
        /// The store could not keep the epoch that began (its records were refused, or their sync
        /// failed): the carrier makes the store take no more records and closes the session's
        /// connection (`link`, if attached) with `error` — nothing goes or is delivered under an
        /// epoch the store does not hold.
        var epochNotStored: (link: Link?, error: any Error)?
    }

    /// A frame decided for the wire, sent after the lock is released, in the order decided.
    struct Outgoing: Sendable {
        var frame: Frame
        /// The message's number (nil: the SESSION answer), marked untransmitted if it does not go.
        var number: UInt64?
        /// Queued for the loop's next flush (a sync's batch), not written by the sender.
        var queued: Bool
    }

    /// The session's id (a client that finds its server's state diverged from its own starts a
    /// new session under a new id: ``SessionMachine/renew(_:)``).
    var id: Journal.Key
    /// A client's: the server's token of the current epoch (its answer's `epoch`), if it gave one.
    var peerEpoch: Journal.Key?
    /// Whether records go to a store, and whether they must be synced before they count.
    let stored: Bool
    let syncs: Bool

    var phase: Phase = .detached
    /// It ended leaving itself in the store for a later process to continue (``end(_:keepStored:_:)``).
    var endKeptStored = false
    var outbox: SessionOutbox<Frame>
    var inbox: SessionInbox
    /// A server's session: the channel its ``ServerConnection`` serves now (kept after the
    /// connection is lost, replaced by a resume; never cleared).
    var serving: Link?
    /// Whether a connection ever carried the session (a client's first SESSION is no resume).
    var everConnected = false
    /// Messages up to this number are in the store (all of them without one).
    var writtenThrough: UInt64 = 0
    /// Messages up to this number may go on the wire: written, and with power-loss durability synced.
    var durableThrough: UInt64 = 0
    /// The messages the current epoch carried when the store could not keep the epoch
    /// (``epochNotStored(through:error:_:)``): kept, never sent, never dropped in this process.
    var carriedThrough: UInt64 = 0
    /// The store could not keep the current epoch: nothing of it goes on the wire.
    var epochRefused = false
    /// The store failed for good (a sync failed, or it could not keep an epoch): no message of
    /// this epoch not yet durable will be — a sender that asks for its ticket gets this.
    var storeFailure: (any Error)?
    /// The highest number handed to a connection in this epoch (what the peer may have counted):
    /// the `sent` of this side's SESSION frames. Messages numbered since, not yet sent — after a
    /// restart, before the first connection — are not in it: their numbers are new to the peer, and
    /// one it counted already means this side lost what it had sent under it.
    var transmittedThrough: UInt64 = 0
    /// Senders waiting for room, FIFO, with the id their cancellation names.
    var roomWaiters: [(UInt64, Sender)] = []
    /// Senders waiting until their message may go (``durableThrough``): those from
    /// ``ticketHead`` on, in the order of their numbers, all of this epoch (those before the head
    /// went on). Released from the front — a sync's completions come one per batch, and taking
    /// every waiter apart for each (removeAll, 64 senders waiting) cost 19 % of a power-loss
    /// sender's time in perf.
    var ticketWaiters: [TicketWaiter] = []
    var ticketHead = 0

    /// A sender waiting for message `number` of `epoch`. (Named fields instead of a tuple, for
    /// reading; what made releasing them cheap is the list's order, not this type: the struct
    /// alone was still copied through value witnesses, measured.)
    struct TicketWaiter {
        var number: UInt64
        var epoch: UInt64
        let sender: Sender
    }
    var drainWaiters: [Drain] = []
    /// Callers waiting until the peer acknowledged the messages of `epoch` up to `through`
    /// (``waitForAcknowledgement(_:through:_:_:)``), with the id their deadline or cancellation names.
    var acknowledgementWaiters: [AcknowledgementWaiter] = []
    struct AcknowledgementWaiter {
        let id: UInt64
        var epoch: UInt64
        var through: UInt64
        let waiter: Drain
    }
    var reconnects = 0
    var resumes = 0
    /// Counts the times the session started anew on this side (its numbers start over): a token
    /// or a record of an older epoch acknowledges nothing.
    var epoch: UInt64 = 0
    /// ``SessionPosition/session`` of the messages received in this epoch: random, never reused.
    var positionID: Journal.Key { didSet { positionText = positionID.hex } }
    /// ``positionID`` in hex (as each delivered message carries it).
    var positionText: String
    /// The store's write generation: a failed write fails the rest of its generation.
    var generation: UInt32 = 0
    /// Why the last generations ended, and through which number their messages had been written:
    /// a sender whose message was in the failed tail may ask for its ticket only after the failure
    /// (it wrote the record itself, and the completion ran before it waited) — it gets the error
    /// then, not a wait for a number the next generation reuses. (The few most recent: a sender
    /// waits for its ticket right after its message was admitted.)
    private var failedGenerations: [(generation: UInt32, epoch: UInt64, after: UInt64, error: any Error)] = []
    /// Frames decided for the connection of ``outgoingDriver`` and not taken by a sender yet.
    var outgoing: [Outgoing] = []
    /// The driver they go on. (The driver, not the channel, is what the senders hold: a channel
    /// is referred to weakly, and each retain of it takes the slow path through its side table —
    /// 12 % more of W7's client CPU when the senders held the channel.)
    var outgoingDriver: Link.Driver?
    /// Frames dropped from ``outgoing`` (the session moved on) since a sender last took it.
    private var droppedOutgoing = 0
    /// The owner's key kept in the store's snapshots (a server's session: the client's).
    let owner: String?
    /// With a store: the current epoch began (``startAnew(renewing:_:)``) and its records — the
    /// position id its messages reach the app under — are not in the store yet (synced with
    /// power-loss durability, written with process-crash durability). A message of it is not
    /// counted or handed to the app before they are (``Arrival/hold``, ``waitForEpoch(_:_:)``):
    /// after a power loss the epoch would be gone, the session would start anew under another
    /// position id, and the messages the app had would come again under it, which the app cannot
    /// recognise. (Found by the session simulation, seed 310.) One sync (or write) per epoch.
    var epochPending = false
    var epochWaiters: [@Sendable () -> Void] = []
    /// Its store may have lost its last records (a power loss under process-crash durability):
    /// it cannot go on as it stands, and starts anew at its next connection.
    var mayHaveLost = false
    /// With a store: messages it reports undelivered stay in the store until the app took the
    /// report (``Journal/Record/reported(_:_:)``), so that a process that dies first makes the
    /// report again (not with ``SessionAcknowledgement/onArrival``: what the app was handed counts
    /// as handled then, and a report as taken).
    var reportsDurably = false
    /// The report the last input wrote to the store, for the carrier to hand out with its
    /// messages (``takeReport()``).
    private var lastReport: UInt64?

    init(id: Journal.Key, maxCount: Int, maxBytes: Int, stored: Bool, syncs: Bool, owner: String?, ackEvery: UInt64 = 32) {
        self.id = id
        self.stored = stored
        self.syncs = syncs && stored
        self.owner = owner
        outbox = SessionOutbox(maxCount: maxCount, maxBytes: maxBytes)
        inbox = SessionInbox(ackEvery: ackEvery)
        let position = Journal.Key.random()
        positionID = position
        positionText = position.hex
    }

    /// A session kept in a store by an earlier process: it continues where the store left it. Its
    /// kept messages count as transmitted when a connection ever carried it (they may have
    /// arrived): a peer that resumes gets what it lacks, a peer that forgot the session gets none
    /// of them again (they are reported undelivered). So do they when the store may have lost its
    /// last records (``Journal/Restored/mayHaveLost``): what was lost may be the very records that
    /// said they went — a later epoch that renumbered and sent them — and the session starts anew
    /// at its next connection, where messages counted as never sent go again under a new position:
    /// the peer's app would get them twice (found by the session simulation, seed 19).
    init(restoring restored: Journal.Restored, maxCount: Int, maxBytes: Int, syncs: Bool, ackEvery: UInt64 = 32) {
        let snapshot = restored.snapshot
        self.init(id: snapshot.key, maxCount: maxCount, maxBytes: maxBytes, stored: true, syncs: syncs, owner: snapshot.owner, ackEvery: ackEvery)
        let items = restored.messages.map { message in
            let frame = Frame(kind: .message, codecID: message.codecID, typeID: message.typeID, payload: message.payload)
            return (item: frame, size: (try? Frame.validatedSize(frame)) ?? message.payload.count)
        }
        outbox.restore(
            items, firstNumber: restored.messages.first?.number ?? snapshot.nextNumber, nextNumber: snapshot.nextNumber,
            transmitted: snapshot.everConnected || restored.mayHaveLost)
        inbox = SessionInbox(restoredThrough: snapshot.handled, ackEvery: ackEvery)
        everConnected = snapshot.everConnected
        writtenThrough = snapshot.nextNumber - 1
        transmittedThrough = snapshot.everConnected ? snapshot.nextNumber - 1 : 0
        durableThrough = writtenThrough
        positionID = snapshot.positionID
        positionText = snapshot.positionID.hex  // (no observer runs in an initializer)
        epoch = UInt64(snapshot.epoch)
        peerEpoch = snapshot.peerEpoch
        mayHaveLost = restored.mayHaveLost
    }

    // MARK: Reports of undelivered messages

    /// With a store and ``reportsDurably``: `lost` (about to be reported undelivered) go into the
    /// store as one report, ahead of the records that drop them (the epoch's new snapshot, the
    /// session's end) and staged (``Journal/Reported/staged``): applied only with them, so no crash
    /// can take the messages from the store and leave no report, nor leave them in both (then the
    /// session would send again what the app was told it never would). `key`: the session they were
    /// sent in (a renewal's old one: its *ended* applies the report).
    mutating func recordReport(_ lost: [SessionOutbox<Frame>.Entry], key: Journal.Key, _ effects: inout Effects) {
        guard stored, reportsDurably, !lost.isEmpty else { return }
        let report = UInt64.random(in: 1...UInt64.max)
        for entry in lost {
            effects.records.append(
                .reported(
                    key,
                    Journal.Reported(
                        report: report, owner: owner, staged: true, number: entry.number, transmitted: entry.transmitted,
                        codecID: entry.item.codecID, typeID: entry.item.typeID, payload: entry.item.payload)))
        }
        lastReport = report
    }

    /// The report the last input wrote (nil: none), once.
    mutating func takeReport() -> UInt64? {
        defer { lastReport = nil }
        return lastReport
    }

    // MARK: Reading

    var channel: Link? { if case .attached(let link) = phase { link } else { nil } }
    var ended: MessagingError? { if case .ended(let error) = phase { error } else { nil } }
    var waitingSenders: Int { roomWaiters.count }
    var storeEpoch: UInt32 { UInt32(truncatingIfNeeded: epoch) }

    /// What the store knows of the session now (its kept messages are records of their own).
    var snapshot: Journal.Snapshot {
        Journal.Snapshot(
            key: id, positionID: positionID, owner: owner, everConnected: everConnected, nextNumber: outbox.nextNumber,
            acknowledged: outbox.acknowledged, handled: inbox.stored, epoch: storeEpoch, peerEpoch: peerEpoch)
    }

    /// The session's first record (a new session): written before it is used.
    mutating func begin(everConnected connected: Bool, _ effects: inout Effects) {
        everConnected = everConnected || connected
        guard stored else { return }
        effects.records.append(.session(snapshot))
        effects.afterWrite = .begun(through: 0, epoch: epoch)
    }

    // MARK: Sending

    /// What ``admit(_:size:storeHasRoom:_:)`` decided for a new message.
    enum Admission: Equatable {
        /// Kept; it may go now. `direct`: this sender took the sending role (nothing else was
        /// unsent) and sends it itself, on the driver of `epoch`, after the lock.
        case kept(number: UInt64, direct: Bool)
        /// Kept; its record goes to the store first (`effects.records`): the sender waits for its
        /// number (``waitForTicket(_:epoch:_:_:)``) unless it only wants it queued.
        case storing(number: UInt64, epoch: UInt64)
        case waitForRoom
        case waitForStore
    }

    /// A one-way message of `size` bytes (its frame's length field included) is sent: kept,
    /// numbered, and written to the store or decided for the wire.
    /// - Parameter direct: The caller may take the sending role itself (``tryDirect``).
    /// - Throws: what ended the session; `frameTooLarge` beyond the peer's limit (nothing kept).
    mutating func admit(
        _ frame: Frame, size: Int, storeHasRoom: Bool, tryDirect: (Link.Driver) -> Bool, _ effects: inout Effects
    ) throws -> Admission {
        if case .ended(let error) = phase { throw error }
        guard roomWaiters.isEmpty, outbox.hasRoom(for: size) else { return .waitForRoom }
        // (`size` counts the 4-byte length; the limit is on the body after it, as the connection's.)
        if let channel, size - 4 > channel.peerMaxFrameSize {
            throw TransportError(
                .frameTooLarge,
                "a message of \(size - 4) bytes exceeds the peer's limit of \(channel.peerMaxFrameSize) bytes; "
                    + "nothing was sent — send large data as a transfer")
        }
        let number = outbox.nextNumber
        if stored {
            guard storeHasRoom else { return .waitForStore }
            // In the store first: it leaves only once it is kept there.
            effects.records.append(
                .message(id, epoch: storeEpoch, number: number, codecID: frame.codecID, typeID: frame.typeID, payload: frame.payload))
            effects.afterWrite = .messages(through: number, epoch: epoch)
            outbox.append(frame, size: size, transmitted: false)
            return .storing(number: number, epoch: epoch)
        }
        writtenThrough = number
        durableThrough = number
        if let channel, outgoingDriver === channel.sessionDriver, tryDirect(channel.sessionDriver) {
            outbox.append(frame, size: size, transmitted: true)
            transmittedThrough = number
            return .kept(number: number, direct: true)
        }
        outbox.append(frame, size: size, transmitted: send(frame, number: number, on: channel, &effects))
        return .kept(number: number, direct: false)
    }

    /// The store holds the records of `after` now (the carrier's completion).
    mutating func written(_ after: AfterWrite, _ effects: inout Effects) {
        guard !epochRefused else { return }
        // Process-crash durability: the epoch's records are in the store once written.
        if !syncs, case .begun(_, let epoch) = after, epoch == self.epoch { epochDurable(&effects) }
        switch after {
        case .messages(let through, let epoch), .begun(let through, let epoch):
            guard epoch == self.epoch, through > writtenThrough else { return }
            writtenThrough = through
            if !syncs { makeTransmittable(through: through, queued: false, &effects) }
        case .handled(let through, let epoch):
            if !syncs { handledStored(through: through, epoch: epoch, &effects) }
        }
    }

    /// A sync covers the records of `after` (power-loss durability).
    mutating func synced(_ after: AfterWrite, _ effects: inout Effects) {
        guard !epochRefused else { return }
        switch after {
        case .messages(let through, let epoch), .begun(let through, let epoch):
            guard epoch == self.epoch else { return }
            if case .begun = after { epochDurable(&effects) }
            writtenThrough = max(writtenThrough, through)
            // Queued for the loop's next flush, not written by each sender: a sync releases a
            // batch, and writing each at once cost a `sendmsg` per message (49k for 50k in strace).
            makeTransmittable(through: through, queued: true, &effects)
        case .handled(let through, let epoch):
            handledStored(through: through, epoch: epoch, &effects)
        }
    }

    /// Messages up to `number` (of this epoch) may go on the wire now: those not sent go, the
    /// senders waiting for them go on.
    mutating func makeTransmittable(through number: UInt64, queued: Bool, _ effects: inout Effects) {
        if number > durableThrough {
            // Those before went when theirs came (or go with the next resume).
            let from = durableThrough + 1
            durableThrough = number
            if let channel {
                var going: [SessionOutbox<Frame>.Entry] = []
                outbox.transmitEntries(from: from, through: number) { entry in
                    going.append(entry)
                    return true
                }
                for entry in going { _ = send(entry.item, number: entry.number, queued: queued, on: channel, &effects) }
            }
        }
        while ticketHead < ticketWaiters.count, ticketWaiters[ticketHead].number <= durableThrough {
            effects.senders.append((ticketWaiters[ticketHead].sender, nil))
            ticketHead += 1
        }
        compactTicketWaiters()
    }

    /// Drops the waiters that went on from the list once they are most of it.
    private mutating func compactTicketWaiters() {
        if ticketHead == ticketWaiters.count {
            ticketWaiters.removeAll(keepingCapacity: true)
            ticketHead = 0
        } else if ticketHead > 32, ticketHead * 2 > ticketWaiters.count {
            ticketWaiters.removeFirst(ticketHead)
            ticketHead = 0
        }
    }

    /// The epoch changed (``startAnew(renewing:_:)``, which renumbered the waiters whose message
    /// goes again): those of the old epoch go on (their message went), the rest are put in order.
    mutating func ticketsRenumbered(_ effects: inout Effects) {
        ticketWaiters.removeFirst(ticketHead)
        ticketHead = 0
        ticketWaiters.removeAll { waiter in
            guard waiter.epoch != epoch else { return false }
            effects.senders.append((waiter.sender, nil))
            return true
        }
        ticketWaiters.sort { $0.number < $1.number }
    }

    /// A write of the store failed: the messages it did not take are not kept (their senders get
    /// `error`), and the next records start a new generation (the store failed the rest of this one).
    mutating func writeFailed(_ after: AfterWrite, generation failed: UInt32, error: any Error, _ effects: inout Effects) {
        // (Whatever the generation: a batch refused for an earlier failure of its chain never
        // reaches the disk either.)
        if case .begun(let through, let epoch) = after, epoch == self.epoch { epochNotStored(through: through, error: error, &effects) }
        guard failed == generation else { return }
        switch after {
        case .messages(_, let epoch) where epoch == self.epoch:
            // The tail above what was written was never in the store (and never sent).
            dropUnstored(after: writtenThrough, error: error, &effects)
        default:
            generation &+= 1
        }
    }

    /// A sync of the store failed (power-loss durability; the store takes no more records): what
    /// it covered may not survive a power loss, so none of it counts as stored. The messages not
    /// synced never went on the wire (they wait for their sync): their senders get `error` and they
    /// are not sent — as for a failed write, except that their records may still be in the file,
    /// where a restart of the process finds them and sends them then (their numbers are used by
    /// nothing else: the store refused every record since). A handled count not synced is never
    /// acknowledged (the peer resends, the app sees the position again). A new epoch's record not
    /// synced: as for a failed write (``epochNotStored(through:error:_:)``).
    mutating func syncFailed(_ after: AfterWrite, error: any Error, _ effects: inout Effects) {
        if storeFailure == nil { storeFailure = error }
        switch after {
        case .messages(_, let epoch) where epoch == self.epoch:
            guard writtenThrough > max(durableThrough, carriedThrough) || ticketWaiters.count > ticketHead else { return }
            dropUnstored(after: durableThrough, error: error, &effects)
        case .begun(let through, let epoch) where epoch == self.epoch:
            epochNotStored(through: through, error: error, &effects)
        default:
            break
        }
    }

    /// The store could not keep the epoch that began (its records were refused, or their sync
    /// failed): it holds the session as it was before, and a restart continues from there. So
    /// nothing of the new epoch may reach the peer or the app — a message delivered under its
    /// position, or sent under its numbers, would come again under others after the restart
    /// (found by the session simulation's store failures, seed 82: the client's app got a message
    /// twice). The messages it carries stay kept, not sent (in the store under the old epoch: a
    /// later failure never drops them); their senders that waited for the new numbers get
    /// `error`; messages held for the epoch stay held and go with the connection, which the
    /// carrier closes (``Effects/epochNotStored``), and the store takes no more records — the
    /// process continues no session until it starts again.
    private mutating func epochNotStored(through: UInt64, error: any Error, _ effects: inout Effects) {
        epochRefused = true
        if storeFailure == nil { storeFailure = error }
        carriedThrough = max(carriedThrough, through)
        writtenThrough = max(writtenThrough, through)
        var kept = ticketHead
        for index in ticketWaiters.indices[ticketHead...] {
            if ticketWaiters[index].epoch == epoch {
                effects.senders.append((ticketWaiters[index].sender, error))
            } else {
                ticketWaiters[kept] = ticketWaiters[index]
                kept += 1
            }
        }
        ticketWaiters.removeLast(ticketWaiters.count - kept)
        compactTicketWaiters()
        epochWaiters = []  // (what they would offer again goes with the connection)
        effects.epochNotStored = (channel, error)
    }

    /// The messages of this epoch above `kept` are not in the store: they leave the outbox, their
    /// senders get `error`, and the store's generation ends (a sender of it that asks for its
    /// ticket later gets the error too: ``ticket(_:epoch:generation:)``).
    private mutating func dropUnstored(after stored: UInt64, error: any Error, _ effects: inout Effects) {
        // (Never the messages an epoch the store could not keep carries: they are in it under the
        // epoch before.)
        let kept = max(stored, carriedThrough)
        failedGenerations.append((generation, epoch, kept, error))
        if failedGenerations.count > 8 { failedGenerations.removeFirst() }
        generation &+= 1
        writtenThrough = min(writtenThrough, kept)
        let removed = outbox.removeNewest(after: kept)
        // (Those above what was kept: the end of the list, in number order.)
        var first = ticketWaiters.count
        while first > ticketHead, ticketWaiters[first - 1].epoch == epoch, ticketWaiters[first - 1].number > kept { first -= 1 }
        for waiter in ticketWaiters[first...] { effects.senders.append((waiter.sender, error)) }
        ticketWaiters.removeLast(ticketWaiters.count - first)
        compactTicketWaiters()
        if removed > 0 {
            wakeRoomWaiters(&effects)
            // Waiters for a dropped message: it never goes (its sender got the error), and its
            // number goes to the next message.
            acknowledgementWaiters.removeAll { waiter in
                guard waiter.epoch == epoch, waiter.through > kept else { return false }
                effects.acknowledgements.append((waiter.waiter, false))
                return true
            }
        }
    }

    /// `waiter` runs once the current epoch's records are in the store (at once when they are, or
    /// without a store never pending): the carrier offers a held message again then.
    mutating func waitForEpoch(_ waiter: @escaping @Sendable () -> Void, _ effects: inout Effects) {
        if epochPending { epochWaiters.append(waiter) } else { effects.epochReady.append(waiter) }
    }

    /// The epoch's records are in the store (or the session ended).
    mutating func epochDurable(_ effects: inout Effects) {
        epochPending = false
        effects.epochReady += epochWaiters
        epochWaiters = []
    }

    /// Fails the senders waiting for their message (the session ended).
    mutating func failTickets(with error: any Error, _ effects: inout Effects) {
        effects.senders += ticketWaiters[ticketHead...].map { ($0.sender, error) }
        ticketWaiters = []
        ticketHead = 0
    }

    /// A sender waits until message `number` of `epoch` may go (false: it may already).
    /// `generation`: the store's write generation when the message was admitted (nil: this one).
    mutating func waitForTicket(_ number: UInt64, epoch: UInt64, generation admitted: UInt32? = nil, _ sender: Sender, _ effects: inout Effects) {
        switch ticket(number, epoch: epoch, generation: admitted) {
        case .ready: effects.senders.append((sender, nil))
        case .failed(let error): effects.senders.append((sender, error))
        case .waiting:
            // In number order (almost always at the end: senders wait in the order they were admitted).
            var index = ticketWaiters.count
            while index > ticketHead, ticketWaiters[index - 1].number > number { index -= 1 }
            ticketWaiters.insert(TicketWaiter(number: number, epoch: epoch, sender: sender), at: index)
        }
    }

    /// Where a sender's message stands (``waitForTicket(_:epoch:generation:_:_:)`` without the
    /// wait: a sender whose message is already stored goes on without suspending).
    enum TicketState {
        /// It may go (or went): the sender is done.
        case ready
        /// Its write failed before it waited, or the session ended.
        case failed(any Error)
        case waiting
    }

    func ticket(_ number: UInt64, epoch: UInt64, generation admitted: UInt32? = nil) -> TicketState {
        if let admitted, admitted != generation,
            let failure = failedGenerations.first(where: { $0.generation == admitted && $0.epoch == epoch }),
            number > failure.after
        {
            return .failed(failure.error)  // its write failed before it waited
        } else if let ended {
            return .failed(ended)
        } else if epoch != self.epoch || number <= durableThrough {
            return .ready
        } else if let storeFailure {
            // (Admitted before or after the store failed: its record will never be durable — and
            // nothing else would end this wait.)
            return .failed(storeFailure)
        }
        return .waiting
    }

    /// Decides that `frame` goes on `channel` (sent once the lock is released); false when there
    /// is no connection (it goes when one resumes the session). The caller that finds nothing
    /// unsent becomes the sender (``Effects/sendOutgoing``): ``outgoing`` tells the carrier.
    mutating func send(_ frame: Frame, number: UInt64?, queued: Bool = false, on channel: Link?, _ effects: inout Effects) -> Bool {
        guard let channel else { return false }
        if outgoingDriver !== channel.sessionDriver { switchOutgoing(to: channel) }
        outgoing.append(Outgoing(frame: frame, number: number, queued: queued))
        if let number { transmittedThrough = max(transmittedThrough, number) }
        effects.outgoingAdded += 1
        return true
    }

    /// The session moves to `channel`: what was decided for the previous one and not taken did
    /// not go (a resume or a new session sends it).
    mutating func switchOutgoing(to channel: Link) {
        for item in outgoing { if let number = item.number { outbox.markUntransmitted(number) } }
        droppedOutgoing += outgoing.count
        outgoing.removeAll(keepingCapacity: true)
        outgoingDriver = channel.sessionDriver
    }

    /// A sender takes what waits in ``outgoing`` (swapped with `batch`, which must be empty):
    /// returns the driver and epoch they go on, and how many frames that counts off the unsent
    /// count, the dropped ones included.
    mutating func takeOutgoing(_ batch: inout [Outgoing]) -> (driver: Link.Driver?, epoch: UInt64, count: Int) {
        swap(&batch, &outgoing)
        defer { droppedOutgoing = 0 }
        return (outgoingDriver, epoch, batch.count + droppedOutgoing)
    }

    /// Messages handed to `driver` in `epoch` did not go (the connection was closing): a new
    /// session sends them instead of reporting them undelivered (unless the session moved on).
    mutating func notTransmitted(_ numbers: [UInt64], driver: Link.Driver?, epoch: UInt64) {
        guard epoch == self.epoch, outgoingDriver === driver else { return }
        for number in numbers { outbox.markUntransmitted(number) }
    }

    /// A sender waits for room (`id`: what its cancellation names); resumed at once when there is
    /// room now, or the session ended, or it was cancelled.
    mutating func waitForRoom(_ id: UInt64, size: Int, cancelled: Bool, _ sender: Sender, _ effects: inout Effects) {
        let error: (any Error)? = ended ?? (cancelled ? CancellationError() : nil)
        // Room made between the caller's check and now: no acknowledgement would wake it.
        if error != nil || outbox.hasRoom(for: size) {
            effects.senders.append((sender, error))
        } else {
            roomWaiters.append((id, sender))
        }
    }

    /// The room wait `id` was cancelled.
    mutating func cancelRoomWait(_ id: UInt64, _ effects: inout Effects) {
        guard let index = roomWaiters.firstIndex(where: { $0.0 == id }) else { return }
        effects.senders.append((roomWaiters.remove(at: index).1, CancellationError()))
    }

    /// Wakes the senders waiting for room (they look again, oldest first), or fails them.
    mutating func wakeRoomWaiters(_ effects: inout Effects, with error: (any Error)? = nil) {
        effects.senders += roomWaiters.map { ($0.1, error) }
        roomWaiters = []
    }
}
