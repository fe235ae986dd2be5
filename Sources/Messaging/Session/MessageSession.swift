import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// One side of a message session (see `ProtocolCore/Session.swift`): numbers, keeps and resends
/// one-way messages, counts and acknowledges the peer's, and outlives the connections it runs on —
/// with a ``SessionStore``, the process too.
///
/// A thin facade over ``State``, the session's machine: every input, from a sender or from the
/// channel's loop, is one call of ``apply(_:)``, which runs it on the state under the lock and then
/// does what it left to do (``Wakes``: senders and drain callers to resume, store syncs to wait
/// for) with the lock released.
///
/// With a store (``SessionJournal``), each input writes its record in the same step, before
/// anything it implies leaves the process: a message's record before it goes on the wire, a handled
/// count before the ACK that tells it. With power-loss durability a message goes on the wire, and a
/// handled count into an ACK, only once a sync covers its record (``State/durableThrough``,
/// ``SessionInbox/stored``).
///
/// Nothing refers to a session weakly (closures waiting for a sync hold it until the sync): an
/// object with a weak reference keeps its reference counts in a side table, and every message
/// carries its session (``SessionMessageToken``) — W7 spent 23 % of the server in the slow
/// reference counting when the channel's link held it weakly.
final class MessageSession: Sendable {
    /// 32 hex digits.
    let id: String
    let configuration: SessionConfiguration
    let logger: Logger
    /// Where the session is kept (nil: in memory only).
    let store: SessionJournal?
    /// ``id`` as the store's key.
    let key: Journal.Key

    /// A ``drained(within:)`` caller: completed by the drain, the close or its deadline, whichever
    /// comes first.
    typealias DrainWaiter = Promise<Void>
    typealias Sender = CheckedContinuation<Void, any Error>

    /// What an input leaves to do once the lock is released.
    struct Wakes {
        /// Senders to resume, each with the error it gets (nil: room was made, look again).
        var senders: [(Sender, (any Error)?)] = []
        var drains: [DrainWaiter] = []
        /// Store positions to wait for, each with what to do once synced (power-loss durability).
        var syncs: [(UInt64, @Sendable (FileError?) -> Void)] = []
        /// The peer acknowledged messages up to this number (of this epoch): the store releases them.
        var released: (through: UInt64, epoch: UInt32)?
        /// Frames were decided for the wire (``State/outgoing``): send them.
        var sendOutgoing = false

        fileprivate func run(_ session: MessageSession) {
            if sendOutgoing { session.sendOutgoing() }
            for (sender, error) in senders {
                if let error { sender.resume(throwing: error) } else { sender.resume() }
            }
            for drain in drains { drain.succeed(()) }
            guard let store = session.store else { return }
            for (position, done) in syncs { store.whenSynced(position, done) }
            if let released, (try? store.append(.released(session.key, epoch: released.epoch, through: released.through))) == nil {
                session.logger.debug("session store: could not record acknowledgement \(released.through)")
            }
        }
    }

    /// A frame the session decided to send, sent after the lock is released (``sendOutgoing()``),
    /// in the order decided.
    struct Outgoing: Sendable {
        var frame: Frame
        /// The message's number (nil: the SESSION answer), marked untransmitted if it does not go.
        var number: UInt64?
        /// Queued for the loop's next flush (a sync's batch), not written by the sender.
        var queued: Bool
    }

    /// The session's machine: what it keeps and counts, and how each input changes it.
    struct State: Sendable {
        var outbox: SessionOutbox<Frame>
        var inbox: SessionInbox
        /// The connection the session runs on now (after its SESSION exchange).
        var channel: MessageChannel?
        /// A server's session: the channel its ``ServerConnection`` serves now (kept after the
        /// connection is lost, replaced by a resume; unlike ``channel``, never cleared).
        var serving: MessageChannel?
        /// Whether a connection ever carried the session (a client's first SESSION is no resume).
        var everConnected = false
        /// Messages up to this number may go on the wire: all of them, but with power-loss
        /// durability only those a sync covers.
        var durableThrough: UInt64 = 0
        /// Senders waiting for room, FIFO.
        var waiters: [(UInt64, Sender)] = []
        /// ``drained(within:)`` callers.
        var drainWaiters: [DrainWaiter] = []
        /// Set when the session ended: sends fail with it.
        var ended: MessagingError?
        var reconnects = 0
        var resumes = 0
        /// Counts the times the session started anew on this side (its numbers start over): a
        /// token of an older epoch acknowledges nothing.
        var epoch: UInt64 = 0
        /// ``SessionPosition/session`` of the messages received in this epoch: random, never reused.
        var positionID = MessageSession.makeID()
        /// Frames decided for the connection of ``outgoingDriver`` and not yet taken by a sender, in order.
        var outgoing: [Outgoing] = []
        /// The channel's connection they go on. (The driver, not the channel, is what the senders
        /// hold: a channel is referred to weakly, and each retain of it takes the slow path through
        /// its side table — 12 % more of W7's client CPU when the senders held the channel.)
        var outgoingDriver: ConnectionDriver?
        /// Frames dropped from ``outgoing`` (the session moved to another connection) since the
        /// sender last took it: the sender counts them off ``MessageSession/unsent`` with its own.
        var droppedOutgoing = 0

        /// Decides that `frame` goes on `channel` (sent once the lock is released); false when there
        /// is no connection (it goes when one resumes the session). The caller that finds nothing
        /// unsent becomes the sender (``Wakes/sendOutgoing``).
        mutating func send(
            _ frame: Frame, number: UInt64?, queued: Bool = false, on channel: MessageChannel?, unsent: borrowing Atomic<Int>,
            _ wakes: inout Wakes
        ) -> Bool {
            guard let channel else { return false }
            if outgoingDriver !== channel.driver { switchOutgoing(to: channel) }
            outgoing.append(Outgoing(frame: frame, number: number, queued: queued))
            if unsent.add(1, ordering: .acquiringAndReleasing).oldValue == 0 { wakes.sendOutgoing = true }
            return true
        }

        /// A sender's own message when nothing is unsent: the sender takes the sending role and
        /// sends it itself after the lock (the frame is not copied into ``outgoing``); nil otherwise.
        mutating func sendYourself(on channel: MessageChannel?, unsent: borrowing Atomic<Int>) -> (driver: ConnectionDriver, epoch: UInt64)? {
            guard let channel, outgoingDriver === channel.driver,
                unsent.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged
            else { return nil }
            return (channel.driver, epoch)
        }

        /// The session moves to `channel`: what was decided for the previous one and not taken did
        /// not go (a resume or a new session sends it).
        mutating func switchOutgoing(to channel: MessageChannel) {
            for item in outgoing { if let number = item.number { outbox.markUntransmitted(number) } }
            droppedOutgoing += outgoing.count
            outgoing.removeAll(keepingCapacity: true)
            outgoingDriver = channel.driver
        }

        /// The session starts anew (the peer did not know it): numbers start over, under a new
        /// position id.
        mutating func startEpoch() {
            inbox.reset()
            epoch += 1
            positionID = MessageSession.makeID()
        }

        /// What the channel does for the acknowledgement now, if anything.
        mutating func ackAction() -> (MessageChannel, SessionInbox.AckStep)? {
            // The channel is taken (retained) only when there is something to do: most handled
            // messages need no step, and a channel's reference counts are slow (it is referred
            // to weakly).
            guard channel != nil else { return nil }
            let step = inbox.ackStep()
            guard step != .nothing, let channel else { return nil }
            return (channel, step)
        }

        /// What the store knows of the session now (its kept messages are records of their own).
        func snapshot(key: Journal.Key, owner: String?) -> Journal.Snapshot {
            Journal.Snapshot(
                key: key, positionID: Journal.Key(hex: positionID)!, owner: owner, everConnected: everConnected,
                nextNumber: outbox.nextNumber, acknowledged: outbox.acknowledged, handled: inbox.stored,
                epoch: UInt32(truncatingIfNeeded: epoch))
        }

        /// Wakes the waiting senders (they re-check for room, oldest first).
        mutating func wakeSenders(_ wakes: inout Wakes, with error: (any Error)? = nil) {
            wakes.senders += waiters.map { ($0.1, error) }
            waiters = []
        }

        /// Whether a drain wait is over: nothing is kept, or the connection or the session is gone.
        var drainIsDue: Bool { outbox.count == 0 || channel == nil || ended != nil }

        /// Resumes the drain waiters when their wait is over (``drainIsDue``).
        mutating func wakeDrainsIfDue(_ wakes: inout Wakes) {
            guard drainIsDue else { return }
            wakes.drains += drainWaiters
            drainWaiters = []
        }
    }
    private let state: Locked<State>
    /// The last id given to a sender waiting for room (what its cancellation looks for).
    private let lastWaiterID = Atomic<UInt64>(0)
    /// Frames decided for the wire and not yet sent (``State/outgoing`` and those a sender holds).
    /// The caller that raises it from zero is the sender until it is back at zero: one sender at a
    /// time keeps the wire order the numbering order without holding the lock while sending, and
    /// an uncontended sender gives the role up without taking the lock again.
    private let unsent = Atomic<Int>(0)
    /// The owner's key kept in the store's snapshots (a server's session: the client's).
    private let owner: String?

    /// - Parameters:
    ///   - serving: A server's session: the channel its ``ServerConnection`` serves first.
    ///   - store: Where it is kept; ``begin()`` writes its first record there.
    ///   - owner: The key that opened it (a server's session), kept in the store.
    init(
        id: String, configuration: SessionConfiguration, logger: Logger, serving: MessageChannel? = nil,
        store: SessionJournal? = nil, owner: String? = nil
    ) {
        self.id = id
        key = Journal.Key(hex: id) ?? Journal.Key(high: 0, low: 0)
        self.configuration = configuration
        self.logger = logger
        self.store = store
        self.owner = owner
        var state = State(
            outbox: SessionOutbox(
                maxCount: configuration.maxUnacknowledgedMessages, maxBytes: configuration.maxUnacknowledgedBytes),
            inbox: SessionInbox())
        state.serving = serving
        self.state = Locked(state)
    }

    /// A session kept in `store` by an earlier process: it continues where the store left it. Its
    /// kept messages count as transmitted when a connection ever carried it (they may have
    /// arrived): a peer that resumes gets what it lacks, a peer that forgot the session gets none
    /// of them again (they are reported undelivered).
    init(
        restoring restored: Journal.Restored, configuration: SessionConfiguration, logger: Logger,
        serving: MessageChannel? = nil, store: SessionJournal
    ) {
        let snapshot = restored.snapshot
        id = snapshot.key.hex
        key = snapshot.key
        self.configuration = configuration
        self.logger = logger
        self.store = store
        owner = snapshot.owner
        var outbox = SessionOutbox<Frame>(
            maxCount: configuration.maxUnacknowledgedMessages, maxBytes: configuration.maxUnacknowledgedBytes)
        let items = restored.messages.map { message in
            let frame = Frame(kind: .message, codecID: message.codecID, typeID: message.typeID, payload: message.payload)
            return (item: frame, size: (try? Frame.validatedSize(frame)) ?? message.payload.count)
        }
        outbox.restore(
            items, firstNumber: restored.messages.first?.number ?? snapshot.nextNumber, nextNumber: snapshot.nextNumber,
            transmitted: snapshot.everConnected)
        var state = State(outbox: outbox, inbox: SessionInbox(restoredThrough: snapshot.handled))
        state.everConnected = snapshot.everConnected
        state.durableThrough = snapshot.nextNumber - 1
        state.positionID = snapshot.positionID.hex
        state.epoch = UInt64(snapshot.epoch)
        state.serving = serving
        self.state = Locked(state)
    }

    /// Writes the session's first record to its store (nothing without one).
    /// - Parameter everConnected: A server's session exists only on a connection: true.
    /// - Throws: ``FileError`` when the store cannot write it.
    func begin(everConnected: Bool = false) throws(FileError) {
        guard let store else { return }
        let snapshot = apply { state, _ in
            state.everConnected = state.everConnected || everConnected
            return state.snapshot(key: key, owner: owner)
        }
        try store.append(.session(snapshot))
    }

    /// Runs one input on the state under the lock; then, with the lock released, wakes what it says
    /// (also when it throws). The one place the session's state is touched.
    private func apply<R, E: Error>(_ input: (inout State, inout Wakes) throws(E) -> R) throws(E) -> R {
        var wakes = Wakes()
        defer { wakes.run(self) }
        return try state.withLock { (state) throws(E) -> R in try input(&state, &wakes) }
    }

    /// A fresh random id.
    static func makeID() -> String {
        var generator = SystemRandomNumberGenerator()
        return Hex.encode((0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    var counts: (reconnects: Int, resumes: Int) { apply { state, _ in (state.reconnects, state.resumes) } }
    var unacknowledgedCount: Int { apply { state, _ in state.outbox.count } }
    var keptMessages: [UndeliveredMessage] { apply { state, _ in state.outbox.kept.map(Self.undelivered) } }
    var isEnded: Bool { apply { state, _ in state.ended != nil } }
    /// The inbox's counts (delivered, handled, stored, acknowledged), read through the one door.
    var inbox: SessionInbox { apply { state, _ in state.inbox } }
    /// Senders waiting for room.
    var waitingSenders: Int { apply { state, _ in state.waiters.count } }
    /// A server's session: the channel its ``ServerConnection`` serves now (set at init, replaced,
    /// never cleared, by a resume).
    var servingChannel: MessageChannel? { apply { state, _ in state.serving } }

    /// A server's session: puts a resumed session's new channel in place; returns the old one.
    func replaceServing(with channel: MessageChannel) -> MessageChannel? {
        apply { state, _ in
            defer { state.serving = channel }
            return state.serving
        }
    }

    /// Whether a sync must cover a record before what it implies leaves the process.
    private var syncs: Bool { store?.configuration.durability.syncs ?? false }

    // MARK: Sending (any context)

    /// Keeps `frame` (a one-way MESSAGE) until the peer acknowledges it and sends it on the current
    /// connection, if any. Waits while the session keeps its maximum (or the store its maximum of
    /// bytes). Order is the order of the calls' admission. With a store it returns once the
    /// message's record is stored at the configured durability.
    /// - Throws: what ended the session; `TransportError.Code.frameTooLarge`; ``MessagingError``
    ///   `.sessionStoreFailed` when the store cannot take the message (nothing was kept or sent).
    func send(_ frame: Frame) async throws {
        if let ticket = try await admit(frame) { await durable(ticket) }
    }

    /// Sends `frames` in order, like ``send(_:)`` each, but with power-loss durability waits for
    /// the disk once, after the last (one sync for the batch, not one wait per message).
    func send(contentsOf frames: [Frame]) async throws {
        var last: SyncTicket?
        for frame in frames {
            if let ticket = try await admit(frame, before: last) { last = ticket }
        }
        if let last { await durable(last) }
    }

    /// A message kept, waiting for a sync to cover its record (power-loss durability).
    struct SyncTicket {
        let position: UInt64
        let number: UInt64
        let epoch: UInt64
    }

    /// Keeps `frame` (numbered, in the store, sent when it may be): returns the ticket to wait
    /// for when a sync must cover it first. Waits while the session or the store is full — after
    /// asking for the sync of `pending` (a batch's messages kept so far: the room they hold is
    /// freed only once they are on the disk, sent and acknowledged).
    private func admit(_ frame: Frame, before pending: SyncTicket? = nil) async throws -> SyncTicket? {
        let size = try Frame.validatedSize(frame)
        enum Admission {
            /// Kept; when `direct`, this sender took the sending role and sends it itself.
            case kept(direct: (driver: ConnectionDriver, epoch: UInt64, number: UInt64)?)
            /// Kept; the message goes out once the store has synced up to this position.
            case syncing(SyncTicket)
            case waitForRoom
            case waitForStore
        }
        var pending = pending
        while true {
            let admission = try apply { (state, wakes) throws -> Admission in
                if let ended = state.ended { throw ended }
                guard state.waiters.isEmpty, state.outbox.hasRoom(for: size) else { return .waitForRoom }
                // (`size` counts the 4-byte length; the limit is on the body after it, as the
                // connection's own check.)
                if let channel = state.channel, size - 4 > channel.peerMaxFrameSize {
                    throw TransportError(
                        .frameTooLarge,
                        "a message of \(size - 4) bytes exceeds the peer's limit of \(channel.peerMaxFrameSize) bytes; "
                            + "nothing was sent — send large data as a transfer")
                }
                let number = state.outbox.nextNumber
                // In the store first (when there is one): a message leaves only once it is kept.
                var position: UInt64?
                if let store {
                    guard store.hasRoom(for: size) else { return .waitForStore }
                    do throws(FileError) {
                        position = try store.append(
                            .message(
                                key, epoch: UInt32(truncatingIfNeeded: state.epoch), number: number, codecID: frame.codecID,
                                typeID: frame.typeID, payload: frame.payload))
                    } catch {
                        throw MessagingError(
                            .sessionStoreFailed, "message '\(frame.typeID)' was not sent: \(error.message)", underlying: error)
                    }
                }
                if let position, syncs {
                    state.outbox.append(frame, size: size, transmitted: false)
                    return .syncing(SyncTicket(position: position, number: number, epoch: state.epoch))
                }
                state.durableThrough = number
                if let (driver, epoch) = state.sendYourself(on: state.channel, unsent: unsent) {
                    state.outbox.append(frame, size: size, transmitted: true)
                    return .kept(direct: (driver, epoch, number))
                }
                state.outbox.append(frame, size: size, transmitted: state.send(frame, number: number, on: state.channel, unsent: unsent, &wakes))
                return .kept(direct: nil)
            }
            switch admission {
            case .kept(let direct):
                if let direct { sendOutgoing(first: frame, number: direct.number, on: direct.driver, epoch: direct.epoch) }
                return nil
            case .syncing(let ticket):
                return ticket
            case .waitForRoom, .waitForStore:
                if let ticket = pending {
                    pending = nil
                    store?.whenSynced(ticket.position) { [self] _ in
                        madeDurable(through: ticket.number, epoch: ticket.epoch)
                    }
                }
                if case .waitForStore = admission { await store!.waitForRoom(size) } else { try await waitForRoom(size) }
            }
        }
    }

    /// Waits until a sync covers the ticket's record; the messages up to it go on the wire then.
    /// (A failed sync is logged once by the store, which takes no more records: the next send
    /// fails. The message is kept in memory and goes out.)
    private func durable(_ ticket: SyncTicket) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            store!.whenSynced(ticket.position) { [self] _ in
                madeDurable(through: ticket.number, epoch: ticket.epoch)
                continuation.resume()
            }
        }
    }

    /// A sync covers the messages up to `number` (of `epoch`): they may go on the wire now.
    private func madeDurable(through number: UInt64, epoch: UInt64) {
        apply { state, wakes in
            guard state.epoch == epoch, number > state.durableThrough else { return }
            // Those before went when their sync came (or go with the next resume).
            let from = state.durableThrough + 1
            state.durableThrough = number
            guard let channel = state.channel else { return }
            // Queued for the loop's next flush, not written by the sender: a sync releases a batch,
            // and writing each at once cost a `sendmsg` per message (49k for 50k in strace).
            var going: [SessionOutbox<Frame>.Entry] = []
            state.outbox.transmitEntries(from: from, through: number) { entry in
                going.append(entry)
                return true
            }
            for entry in going { _ = state.send(entry.item, number: entry.number, queued: true, on: channel, unsent: unsent, &wakes) }
        }
    }

    /// Sends what was decided (``State/outgoing``) with the lock released, in the order decided:
    /// one caller at a time takes the frames (a caller that finds another sending leaves its frames
    /// to it) and sends them through the channel; a frame that did not go (the connection was
    /// closing) is marked untransmitted unless the session moved on meanwhile.
    fileprivate func sendOutgoing() {
        var batch: [Outgoing] = []
        var (driver, epoch, failed): (ConnectionDriver?, UInt64, [UInt64]) = (nil, 0, [])
        let taken = take(&batch, &driver, &epoch)
        send(&batch, on: driver, failed: &failed)
        sendRest(&batch, sent: taken, driver: driver, epoch: epoch, failed: failed)
    }

    /// A sender that took the sending role for its own message (``State/sendYourself(on:unsent:)``):
    /// sends it, then what others decided meanwhile.
    private func sendOutgoing(first frame: Frame, number: UInt64, on driver: ConnectionDriver, epoch: UInt64) {
        let failed = MessageChannel.transmitSession(frame, queued: false, on: driver) ? [] : [number]
        var batch: [Outgoing] = []
        sendRest(&batch, sent: 1, driver: driver, epoch: epoch, failed: failed)
    }

    /// Holding the sending role, `sent` frames sent: marks what failed, counts them off ``unsent``
    /// and, unless it is back at zero (the role given up), takes and sends the next frames.
    private func sendRest(_ batch: inout [Outgoing], sent: Int, driver: ConnectionDriver?, epoch: UInt64, failed: [UInt64]) {
        var (sent, driver, epoch, failed) = (sent, driver, epoch, failed)
        while true {
            if !failed.isEmpty {  // (rare: the connection was closing)
                apply { state, _ in
                    guard state.epoch == epoch, state.outgoingDriver === driver else { return }
                    for number in failed { state.outbox.markUntransmitted(number) }
                }
                failed.removeAll()
            }
            assert(sent > 0, "a sender holds at least the frame that made it the sender")
            if unsent.subtract(sent, ordering: .acquiringAndReleasing).newValue == 0 { return }
            sent = take(&batch, &driver, &epoch)
            send(&batch, on: driver, failed: &failed)
        }
    }

    /// Takes what waits in ``State/outgoing`` (the buffers swapped: `batch` must be empty); returns
    /// how many frames that counts off ``unsent``, the dropped ones included.
    private func take(_ batch: inout [Outgoing], _ driver: inout ConnectionDriver?, _ epoch: inout UInt64) -> Int {
        apply { state, _ -> Int in
            swap(&batch, &state.outgoing)
            (driver, epoch) = (state.outgoingDriver, state.epoch)
            defer { state.droppedOutgoing = 0 }
            return batch.count + state.droppedOutgoing
        }
    }

    /// Sends `batch` on the connection in order and empties it (keeping its buffer); the numbers of
    /// the messages that did not go are added to `failed`.
    private func send(_ batch: inout [Outgoing], on driver: ConnectionDriver?, failed: inout [UInt64]) {
        if let driver {
            for item in batch where !MessageChannel.transmitSession(item.frame, queued: item.queued, on: driver) {
                if let number = item.number { failed.append(number) }
            }
        }
        batch.removeAll(keepingCapacity: true)
    }

    /// Waits until a message of `size` bytes may be kept (acknowledgements made room), the session
    /// ends, or the task is cancelled.
    private func waitForRoom(_ size: Int) async throws {
        let id = lastWaiterID.add(1, ordering: .relaxed).newValue
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: Sender) in
                apply { state, wakes in
                    let error: (any Error)? = state.ended ?? (Task.isCancelled ? CancellationError() : nil)
                    // Room made between the caller's check and now: no acknowledgement would wake us.
                    if error != nil || state.outbox.hasRoom(for: size) {
                        wakes.senders.append((continuation, error))
                    } else {
                        state.waiters.append((id, continuation))
                    }
                }
            }
        } onCancel: {
            apply { state, wakes in
                guard let index = state.waiters.firstIndex(where: { $0.0 == id }) else { return }
                wakes.senders.append((state.waiters.remove(at: index).1, CancellationError()))
            }
        }
    }

    // MARK: Receiving

    /// What became of a session message that arrived.
    enum Arrival {
        /// Not for the app: the channel was replaced (the new one resends it), or it is a
        /// duplicate of one delivered before and not yet handled (resent after a reconnect).
        case ignore
        /// Deliver it with this token; `ack` is what the channel does for the acknowledgement now
        /// (``SessionAcknowledgement/onArrival`` only; otherwise the app's handling decides).
        case deliver(SessionMessageToken, ack: SessionInbox.AckStep)
    }

    /// A one-way message arrived on `channel` (on its loop): number it, and with
    /// ``SessionAcknowledgement/onArrival`` take it as handled at once.
    func received(on channel: MessageChannel) -> Arrival {
        let (arrival, handled) = apply { state, _ -> (Arrival, Handled) in
            guard state.channel === channel, let number = state.inbox.receive() else { return (.ignore, .nothing) }
            let token = SessionMessageToken(
                session: self, epoch: state.epoch, position: SessionPosition(session: state.positionID, number: number))
            guard configuration.acknowledgement == .onArrival, state.inbox.handle(number) else {
                return (.deliver(token, ack: .nothing), .nothing)
            }
            return (.deliver(token, ack: .nothing), handledAdvanced(&state))
        }
        guard case .deliver(let token, _) = arrival, let (_, step) = finish(handled) else { return arrival }
        return .deliver(token, ack: step)
    }

    /// The app handled message `number` of epoch `epoch` (an older epoch's: nothing). Returns the
    /// channel and what it does for the acknowledgement, when it does something.
    func handled(_ number: UInt64, epoch: UInt64) -> (MessageChannel, SessionInbox.AckStep)? {
        let handled = apply { state, _ -> Handled in
            // Counted also while disconnected (the next SESSION frame tells it).
            guard state.epoch == epoch, state.inbox.handle(number) else { return .nothing }
            return handledAdvanced(&state)
        }
        return finish(handled)
    }

    /// What an advanced handled count leaves to do once the session's lock is released.
    private enum Handled {
        case nothing
        /// Acknowledge: the channel does this.
        case ack(MessageChannel, SessionInbox.AckStep)
        /// Keep the count in the store first (outside the lock: a record's system call under it
        /// made the loop and the app's thread wait for each other), then acknowledge it.
        case store(through: UInt64, epoch: UInt64)
    }

    /// The handled count advanced (under the lock): without a store it may be acknowledged at
    /// once; with one it is written first (``finish(_:)``).
    private func handledAdvanced(_ state: inout State) -> Handled {
        guard store == nil else { return .store(through: state.inbox.handled, epoch: state.epoch) }
        state.inbox.store(through: state.inbox.handled)
        return state.ackAction().map { .ack($0.0, $0.1) } ?? .nothing
    }

    /// Does what ``handledAdvanced(_:)`` left, with the lock released: writes the handled count
    /// and — at once, or (power-loss durability) once a sync covers it — lets it be acknowledged.
    /// Records written out of order (two tasks handling at once) are harmless: the store and the
    /// inbox keep the largest count. A count the store cannot write is not acknowledged: the
    /// sender keeps the messages, and a later count covers them.
    private func finish(_ handled: Handled) -> (MessageChannel, SessionInbox.AckStep)? {
        switch handled {
        case .nothing: return nil
        case .ack(let channel, let step): return (channel, step)
        case .store(let through, let epoch):
            guard let store else { return nil }
            let position: UInt64
            do throws(FileError) {
                position = try store.append(.handled(key, epoch: UInt32(truncatingIfNeeded: epoch), through: through))
            } catch {
                logger.warning("handled session messages are not acknowledged while the store cannot keep them: \(error.message)")
                return nil
            }
            if syncs {
                store.whenSynced(position) { [self] _ in
                    guard let (channel, step) = handledStored(through: through, epoch: epoch) else { return }
                    channel.performAck(step)
                }
                return nil
            }
            return handledStored(through: through, epoch: epoch)
        }
    }

    /// The store keeps the handled count `through` (of `epoch`): it may be acknowledged.
    private func handledStored(through: UInt64, epoch: UInt64) -> (MessageChannel, SessionInbox.AckStep)? {
        apply { state, _ in
            guard state.epoch == epoch else { return nil }
            state.inbox.store(through: through)
            return state.ackAction()
        }
    }

    /// The ACK to send now, if messages wait for one.
    func takeAck(on channel: MessageChannel) -> UInt64? {
        apply { state, _ in state.channel === channel ? state.inbox.takeAck() : nil }
    }

    /// The acknowledgement deadline of `channel` passed: the next acknowledgement arms it again.
    func ackDeadlinePassed(on channel: MessageChannel) {
        apply { state, _ in if state.channel === channel { state.inbox.deadlinePassed() } }
    }

    /// The peer acknowledged `count` messages. Returns an error text for a violation.
    func acknowledged(_ count: UInt64, on channel: MessageChannel) -> String? {
        apply { state, wakes in
            guard state.channel === channel else { return nil }
            guard let released = state.outbox.acknowledge(through: count) else {
                return "ACK of \(count) messages, but only \(state.outbox.nextNumber - 1) were sent"
            }
            if released > 0 {
                state.wakeSenders(&wakes)
                // Written after the lock (the store keeps the largest), never synced: a released
                // record lost in a crash only makes the restarted side resend what the peer says
                // it has (it drops them).
                if store != nil { wakes.released = (count, UInt32(truncatingIfNeeded: state.epoch)) }
            }
            state.wakeDrainsIfDue(&wakes)
            return nil
        }
    }

    /// The connection closed: keep everything for the next one.
    func detach(_ channel: MessageChannel) {
        apply { state, wakes in
            guard state.channel === channel else { return }
            state.channel = nil
            state.wakeDrainsIfDue(&wakes)
        }
    }

    // MARK: Opening on a connection

    /// Client, on the loop: the hello for a new connection (its SESSION frame), before it is sent.
    func clientHello() -> SessionHello {
        apply { state, _ in
            SessionHello(id: id, received: state.inbox.reconnected())
        }
    }

    /// What opening the session on a new connection found.
    enum Opened: Sendable {
        /// The peer knew the session; `resent` messages went again.
        case resumed(resent: Int)
        /// A new session (the first connection, or the peer did not know it): `undelivered` were sent
        /// before and are not sent again.
        case new(undelivered: [UndeliveredMessage])
    }

    /// Client, on the loop: the server's SESSION answer arrived on `channel`. Attaches the session
    /// to it and (re)sends what the server has not received.
    func clientOpened(_ reply: SessionHello, on channel: MessageChannel) -> Result<Opened, TransportError> {
        guard reply.id == id else {
            return .failure(TransportError(.protocolViolation, "the SESSION answer names another session"))
        }
        // The answer acknowledges (or forgets) kept messages: senders waiting for room may go on
        // (no ACK would wake them when everything was acknowledged this way).
        return apply { state, wakes in
            defer { state.wakeSenders(&wakes) }
            return clientOpen(reply, on: channel, &state, &wakes)
        }
    }

    /// Client: attaches to `channel` on the server's SESSION answer, resuming (resending what the
    /// server lacks) or starting anew (what was sent before is undelivered, what was not goes now).
    private func clientOpen(
        _ reply: SessionHello, on channel: MessageChannel, _ state: inout State, _ wakes: inout Wakes
    ) -> Result<Opened, TransportError> {
        let opened: Opened
        let wasConnected = state.everConnected
        state.switchOutgoing(to: channel)
        if reply.resumed == true, state.everConnected,
            let resend = state.outbox.resume(peerReceived: reply.received, transmittable: state.durableThrough)
        {
            for entry in resend { _ = state.send(entry.item, number: entry.number, on: channel, unsent: unsent, &wakes) }
            state.resumes += 1
            opened = .resumed(resent: resend.count)
        } else {
            if reply.resumed == true && state.everConnected {
                logger.warning("the server's session state does not match this side's; starting a new session")
            }
            let (lost, kept) = state.outbox.restart()
            state.startEpoch()
            state.everConnected = true  // (before the snapshot: its messages go out on this connection)
            // The store starts the session over too: its snapshot, then the kept messages under
            // their new numbers (written before any of them goes out).
            var transmittable = kept.last?.number ?? 0
            if let store {
                // (The snapshot counts from the first kept message: their records follow it.)
                var snapshot = state.snapshot(key: key, owner: owner)
                snapshot.nextNumber = kept.first?.number ?? snapshot.nextNumber
                snapshot.acknowledged = snapshot.nextNumber - 1
                var records: [Journal.Record] = [.session(snapshot)]
                for entry in kept {
                    records.append(
                        .message(
                            key, epoch: UInt32(truncatingIfNeeded: state.epoch), number: entry.number, codecID: entry.item.codecID,
                            typeID: entry.item.typeID, payload: entry.item.payload))
                }
                do throws(FileError) {
                    let position = try store.append(records)
                    if syncs {
                        transmittable = 0
                        let (epoch, last) = (state.epoch, kept.last?.number ?? 0)
                        wakes.syncs.append((position, { [self] _ in madeDurable(through: last, epoch: epoch) }))
                    }
                } catch {
                    // The store cannot follow: what it holds is stale. Go on in memory; a restart
                    // would resume the old session, which the server no longer knows (reported then).
                    logger.error("the session store cannot record the new session: \(error.message)")
                }
            }
            state.durableThrough = transmittable
            var going: [SessionOutbox<Frame>.Entry] = []
            state.outbox.transmitEntries(through: transmittable) { entry in
                going.append(entry)
                return true
            }
            for entry in going { _ = state.send(entry.item, number: entry.number, on: channel, unsent: unsent, &wakes) }
            opened = .new(undelivered: lost.map(Self.undelivered))
        }
        if wasConnected { state.reconnects += 1 }
        state.channel = channel
        return .success(opened)
    }

    /// Server, on the loop: a client's SESSION for this session arrived on `channel` (the session
    /// was just made, `isNew`, or found). Attaches, answers and resends.
    func serverOpen(_ hello: SessionHello, isNew: Bool, on channel: MessageChannel) -> Result<Int, TransportError> {
        apply { state, wakes in
            defer { state.wakeSenders(&wakes) }
            var resent: [SessionOutbox<Frame>.Entry] = []
            state.switchOutgoing(to: channel)
            if !isNew {
                guard let entries = state.outbox.resume(peerReceived: hello.received, transmittable: state.durableThrough) else {
                    return .failure(
                        TransportError(
                            .protocolViolation,
                            "the client says it received \(hello.received) session messages; "
                                + "\(state.outbox.acknowledged)…\(state.outbox.nextNumber - 1) is possible"))
                }
                resent = entries
                state.reconnects += 1
                state.resumes += 1
            }
            let answer = SessionHello(id: id, received: state.inbox.reconnected(), resumed: !isNew)
            _ = state.send(HandshakeStateMachine.jsonFrame(.session, answer), number: nil, on: channel, unsent: unsent, &wakes)
            for entry in resent { _ = state.send(entry.item, number: entry.number, on: channel, unsent: unsent, &wakes) }
            state.everConnected = true
            state.channel = channel
            return .success(resent.count)
        }
    }

    /// Ends the session: sends fail from now on; returns the messages never acknowledged.
    /// - Parameter keepStored: Leave it in the store for a later process to continue (a server
    ///   that stops, a client closed with messages in flight): nothing is reported undelivered.
    func end(_ reason: MessagingError, keepStored: Bool = false) -> [UndeliveredMessage] {
        let (lost, ack) = apply { state, wakes -> ([UndeliveredMessage], (MessageChannel, UInt64)?) in
            guard state.ended == nil else { return ([], nil) }
            // What the app handled is acknowledged before the session ends, ahead of the GOODBYE
            // that usually follows: the peer must not report those messages as never
            // acknowledged after a clean close (issue 45, 7).
            let ack = state.channel.flatMap { channel in state.inbox.takeAck().map { (channel, $0) } }
            state.ended = reason
            state.channel = nil
            state.wakeDrainsIfDue(&wakes)
            state.wakeSenders(&wakes, with: reason)
            if let store, !keepStored, (try? store.append(.ended(key))) == nil {
                logger.warning("session store: could not record the end of session \(key); a restart would resume it")
            }
            let kept = state.outbox.removeAll()
            return (keepStored && store != nil ? [] : kept.map(Self.undelivered), ack)
        }
        if let (channel, count) = ack { channel.sendAck(count) }
        return lost
    }

    /// Waits (up to `timeout`) until every kept message is acknowledged, or the connection is lost.
    /// Returns whether everything was acknowledged. The deadline is a Dispatch timer; whichever of
    /// it and the drain comes first completes the wait (a ``Promise``).
    func drained(within timeout: Duration) async -> Bool {
        let waiter = DrainWaiter()
        let (now, drained) = apply { state, _ -> (Bool, Bool) in
            if state.drainIsDue { return (true, state.outbox.count == 0) }
            state.drainWaiters.append(waiter)
            return (false, false)
        }
        if now { return drained }
        DispatchQueue.global().asyncAfter(deadline: dispatchDeadline(after: timeout)) { waiter.succeed(()) }
        _ = try? await waiter.value()
        return unacknowledgedCount == 0
    }

    fileprivate static func undelivered(_ entry: SessionOutbox<Frame>.Entry) -> UndeliveredMessage {
        UndeliveredMessage(
            number: entry.number, typeID: entry.item.typeID, codecID: entry.item.codecID, payload: entry.item.payload,
            wasTransmitted: entry.transmitted)
    }
}
