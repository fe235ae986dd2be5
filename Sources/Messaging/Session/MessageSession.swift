import Dispatch
import Locks
import Logging
import ProtocolCore
import Scheduling
import Synchronization
import Transport

extension MessageChannel: SessionLink {
    var sessionDriver: ConnectionDriver { driver }
}

/// One side of a message session: the carrier of its ``SessionMachine``. Every input — from a
/// sender, the app or the channel's loop — is one call of ``apply(_:)``: the machine decides under
/// the lock; the records it decided are queued for the store before the lock is released (so
/// their order is the inputs' order), and everything else — writing those records, sending
/// frames, resuming senders and drain callers, acknowledging — happens after it. No system call
/// and no other lock is taken under the session's lock.
///
/// With a store (``SessionJournal``), a record's completion feeds the machine again: a message's
/// record written (and with power-loss durability, synced) lets it go on the wire and its `send`
/// return; a handled count written (synced) lets it be acknowledged.
///
/// Nothing refers to a session weakly (closures waiting for a write or a sync hold it until then):
/// an object with a weak reference keeps its reference counts in a side table, and every message
/// carries its session (``SessionMessageToken``) — W7 spent 23 % of the server in the slow
/// reference counting when the channel's link held it weakly.
final class MessageSession: Sendable {
    /// 32 hex digits (a client that renews its session takes a new one: read it now).
    var id: String { read { $0.id.hex } }
    let configuration: SessionConfiguration
    let logger: Logger
    /// Where the session is kept (nil: in memory only).
    let store: SessionJournal?

    /// A ``drained(within:)`` caller (completed by the drain, the close or its deadline), or an
    /// ``acknowledged(through:within:scheduler:)`` caller (with whether its messages were all acknowledged).
    typealias Waiter = Promise<Bool>
    typealias Sender = CheckedContinuation<Void, any Error>
    typealias Machine = SessionMachine<MessageChannel, Sender, Waiter>

    let state: Locked<Machine>
    /// The last id given to a sender waiting for room (what its cancellation looks for).
    let lastWaiterID = Atomic<UInt64>(0)
    /// Frames decided for the wire and not yet sent (``SessionMachine/outgoing`` and those a sender
    /// holds). The caller that raises it from zero is the sender until it is back at zero: one
    /// sender at a time keeps the wire order the numbering order without holding the lock while
    /// sending, and an uncontended sender gives the role up without taking the lock again.
    let unsent = Atomic<Int>(0)
    /// How many times a channel held a message of this session for its epoch's sync (tests).
    let epochHolds = Atomic<Int>(0)

    /// - Parameters:
    ///   - serving: A server's session: the channel its ``ServerConnection`` serves first.
    ///   - store: Where it is kept; ``begin(everConnected:)`` writes its first record there.
    ///   - owner: The key that opened it (a server's session), kept in the store.
    init(
        id: String, configuration: SessionConfiguration, logger: Logger, serving: MessageChannel? = nil,
        store: SessionJournal? = nil, owner: String? = nil
    ) {
        let key = Journal.Key(hex: id) ?? Journal.Key(high: 0, low: 0)
        self.configuration = configuration
        self.logger = logger
        self.store = store
        var machine = Machine(
            id: key, maxCount: configuration.maxUnacknowledgedMessages, maxBytes: configuration.maxUnacknowledgedBytes,
            stored: store != nil, syncs: store?.configuration.durability.syncs ?? false, owner: owner)
        machine.serving = serving
        machine.reportsDurably = configuration.acknowledgement != .onArrival
        state = Locked(machine)
    }

    /// A session kept in `store` by an earlier process: it continues where the store left it.
    init(
        restoring restored: Journal.Restored, configuration: SessionConfiguration, logger: Logger,
        serving: MessageChannel? = nil, store: SessionJournal
    ) {
        self.configuration = configuration
        self.logger = logger
        self.store = store
        var machine = Machine(
            restoring: restored, maxCount: configuration.maxUnacknowledgedMessages,
            maxBytes: configuration.maxUnacknowledgedBytes, syncs: store.configuration.durability.syncs)
        machine.serving = serving
        machine.reportsDurably = configuration.acknowledgement != .onArrival
        state = Locked(machine)
    }

    /// A fresh random id.
    static func makeID() -> String { Journal.Key.random().hex }

    // MARK: The one door

    /// Runs one input on the machine under the lock, queues the records it decided for the store
    /// (still under the lock: their order is fixed there) and counts the frames it decided as
    /// unsent; then, with the lock released, does the rest (``run(_:)``) — also when it throws.
    func apply<R, E: Error>(_ input: (inout Machine, inout Machine.Effects) throws(E) -> R) throws(E) -> R {
        var effects = Machine.Effects()
        var toDo = AfterLock()
        defer { run(effects, toDo) }
        return try state.withLock { (machine) throws(E) -> R in
            defer { toDo = settle(&effects, key: machine.id, generation: machine.generation) }
            return try input(&machine, &effects)
        }
    }

    /// What ``settle(_:generation:)`` leaves for after the lock.
    private struct AfterLock {
        var write = false
        var sendOutgoing = false
    }

    /// Under the lock: hands the input's records to the store's queue, with what their completion
    /// does, and counts the frames it decided (the caller that raises the count from zero sends).
    private func settle(_ effects: inout Machine.Effects, key: Journal.Key, generation: UInt32) -> AfterLock {
        var toDo = AfterLock()
        if !effects.records.isEmpty, let store {
            store.enqueue(effects.records, chain: (key, generation), done: completion(effects.afterWrite, generation: generation))
            effects.records = []
            toDo.write = true
        }
        if effects.outgoingAdded > 0, unsent.add(effects.outgoingAdded, ordering: .acquiringAndReleasing).oldValue == 0 {
            toDo.sendOutgoing = true
        }
        return toDo
    }

    /// Carries out what an input left, with the lock released.
    private func run(_ effects: Machine.Effects, _ toDo: AfterLock) {
        if let (_, error) = effects.epochNotStored {
            // First: no sender resumed below may write into the store before it refuses.
            store?.fail(error as? FileError ?? FileError(store?.path ?? "", "\(error)"))
        }
        if toDo.write { store?.write() }
        if toDo.sendOutgoing { sendOutgoing() }
        for (sender, error) in effects.senders {
            if let error { sender.resume(throwing: error) } else { sender.resume() }
        }
        for drain in effects.drains { drain.succeed(true) }
        for (waiter, acknowledged) in effects.acknowledgements { waiter.succeed(acknowledged) }
        for ready in effects.epochReady { ready() }
        if let (channel, step) = effects.ack { channel.performAck(step) }
        if let (channel, _) = effects.epochNotStored {
            channel?.close(reason: "the session store failed: the session cannot go on until the process restarts")
        }
    }

    /// Why the session's store takes no more records, if it does not: the session does not
    /// attach to a connection again in this process.
    var storeFailure: FileError? { store?.failure }

    /// What a server says (GOODBYE) to a client whose session it cannot attach: its store failed.
    static let storeFailedReason = "the server cannot keep sessions now (its session store failed); try again later"

    /// What a client reports when its store failed: final (it gives up), with what to do.
    static func storeFailed(_ failure: FileError) -> MessagingError {
        MessagingError(
            .sessionStoreUnusable, "cannot continue the session: \(failure.message) — restart the process once the disk is mended",
            underlying: failure)
    }

    /// What a store write's completion does: feeds the machine that it is written (with
    /// power-loss durability, once a sync covers it), or that it failed.
    private func completion(_ after: Machine.AfterWrite?, generation: UInt32) -> @Sendable (Result<UInt64, FileError>) -> Void {
        { [self] outcome in
            switch outcome {
            case .success(let position):
                guard let after else { return }
                apply { $0.written(after, &$1) }
                guard store?.configuration.durability.syncs == true else { return }
                // A failed sync is logged once by the store, which takes no more records: what it
                // covered is not durable, so its messages do not go and their senders fail.
                store?.whenSynced(position) { [self] error in
                    if let error {
                        apply { $0.syncFailed(after, error: error, &$1) }
                    } else {
                        apply { $0.synced(after, &$1) }
                    }
                }
            case .failure(let error):
                if let after {
                    if case .handled = after {
                        logger.warning("handled session messages are not acknowledged while the store cannot keep them: \(error.message)")
                    }
                    apply { $0.writeFailed(after, generation: generation, error: error, &$1) }
                } else {
                    logger.debug("session store: a record of a session was not written: \(error.message)")
                }
            }
        }
    }

    // MARK: Reading

    /// Reads the machine under the lock (no input: nothing to do after).
    func read<R>(_ body: (inout Machine) -> R) -> R { state.withLock { body(&$0) } }

    var counts: (reconnects: Int, resumes: Int) { read { ($0.reconnects, $0.resumes) } }
    var unacknowledgedCount: Int { read { $0.outbox.count } }
    var keptMessages: [UndeliveredMessage] { read { $0.outbox.kept.map(Self.undelivered) } }
    var progress: SessionProgress {
        read { SessionProgress(session: $0.id.hex, epoch: $0.epoch, sent: $0.outbox.nextNumber - 1, acknowledged: $0.outbox.acknowledged) }
    }
    var isEnded: Bool { read { $0.ended != nil } }
    /// Client: whether a connection made after the app closed the client must leave the session in
    /// the store (close without GOODBYE): it ended kept there, or — close() still waiting for the
    /// server's acknowledgements — it has a store and messages not acknowledged, which close() keeps.
    var staysInStore: Bool { read { $0.ended != nil ? $0.endKeptStored : $0.stored && $0.outbox.count > 0 } }
    /// It ended leaving itself in the store for a later process to continue.
    var endKeptStored: Bool { read { $0.endKeptStored } }
    /// The inbox's counts (delivered, handled, stored, acknowledged), read through the one door.
    var inbox: SessionInbox { read { $0.inbox } }
    /// Senders waiting for room.
    var waitingSenders: Int { read { $0.waitingSenders } }
    /// A server's session: the channel its ``ServerConnection`` serves now.
    var servingChannel: MessageChannel? { read { $0.serving } }

    /// A server's session: puts a resumed session's new channel in place; returns the old one.
    func replaceServing(with channel: MessageChannel) -> MessageChannel? { read { $0.replaceServing(with: channel) } }

    // MARK: Beginning

    /// A server's new session: writes its first record and returns once the store holds it (with
    /// power-loss durability, synced) — before its SESSION answer tells the client it exists.
    /// - Throws: ``FileError`` when the store cannot keep it.
    func begin(everConnected: Bool = false) async throws(FileError) {
        guard let store else {
            apply { $0.begin(everConnected: everConnected, &$1) }
            return
        }
        let syncs = store.configuration.durability.syncs
        let failure: FileError? = await withCheckedContinuation { (continuation: CheckedContinuation<FileError?, Never>) in
            read { machine in
                var effects = Machine.Effects()
                machine.begin(everConnected: everConnected, &effects)
                store.enqueue(effects.records, chain: (machine.id, machine.generation)) { outcome in
                    switch outcome {
                    case .success(let position) where syncs: store.whenSynced(position) { continuation.resume(returning: $0) }
                    case .success: continuation.resume(returning: nil)
                    case .failure(let error): continuation.resume(returning: error)
                    }
                }
            }
            store.write()
        }
        if let failure { throw failure }
    }

    /// A client's new session, when it is made: its first record, written now (before any other
    /// of it; no lock is held).
    func beginNow() throws(FileError) {
        guard let store else { return }
        try store.append(.session(read { $0.snapshot }))
    }

    // MARK: Receiving

    /// What became of a session message that arrived.
    enum Arrival {
        /// Not for the app (the machine's ``SessionMachine/Arrival/ignore``).
        case ignore
        /// Deliver it with this token.
        case deliver(SessionMessageToken)
        /// Hold it, and what follows it, until ``whenEpochDurable(_:)`` (not counted yet).
        case hold
    }

    /// A one-way message arrived on `channel` (on its loop): numbered, and with
    /// ``SessionAcknowledgement/onArrival`` taken as handled at once.
    func received(on channel: MessageChannel) -> Arrival {
        let onArrival = configuration.acknowledgement == .onArrival
        let (arrival, position) = apply { machine, effects -> (Machine.Arrival, String) in
            (machine.received(on: channel, onArrival: onArrival, &effects), machine.positionText)
        }
        switch arrival {
        case .ignore: return .ignore
        case .hold: return .hold
        case .deliver(let number, let epoch, _):
            return .deliver(SessionMessageToken(session: self, epoch: epoch, position: SessionPosition(session: position, number: number)))
        }
    }

    /// Runs `body` (any thread) once the current epoch's records are in the store (synced with
    /// power-loss durability, written with process-crash durability) — at once when they are
    /// (``SessionMachine/epochPending``), or when the session ends. A store that could not keep
    /// them never runs it: the connection closes, and what it held goes with it. The channel that
    /// held a message of a new epoch (``Arrival/hold``) offers it again then.
    func whenEpochDurable(_ body: @escaping @Sendable () -> Void) {
        apply { $0.waitForEpoch(body, &$1) }
    }

    /// The app handled message `number` of `epoch` (an older epoch's: nothing); the
    /// acknowledgement follows (at once, or once the store holds the count).
    func handled(_ number: UInt64, epoch: UInt64) {
        apply { $0.handled(number, epoch: epoch, &$1) }
    }

    /// The ACK to send now, if messages wait for one.
    func takeAck(on channel: MessageChannel) -> UInt64? { read { $0.takeAck(on: channel) } }

    /// The acknowledgement deadline of `channel` passed: the next acknowledgement arms it again.
    func ackDeadlinePassed(on channel: MessageChannel) { read { $0.ackDeadlinePassed(on: channel) } }

    /// The peer acknowledged `count` messages. Returns an error text for a violation.
    func acknowledged(_ count: UInt64, on channel: MessageChannel) -> String? {
        apply { $0.acknowledged(count, on: channel, &$1) }
    }

    /// The connection closed: keep everything for the next one.
    func detach(_ channel: MessageChannel) { apply { $0.detach(channel, &$1) } }

    // MARK: Opening on a connection

    /// Client, on the loop: the hello for a new connection (its SESSION frame), before it is sent.
    func clientHello() -> SessionHello { read { $0.clientHello() } }

    /// What opening the session on a new connection found.
    enum Opened: Sendable {
        /// The peer knew the session; `resent` messages went again.
        case resumed(resent: Int)
        /// A new session (the first connection, or the peer did not know it): `undelivered` were sent
        /// before and are not sent again.
        case new(undelivered: [UndeliveredMessage])
        /// Server: the client's SESSION claimed a state of the session this side cannot continue
        /// (`reason`); it started anew (`resumed: false`), and `undelivered` were sent before and
        /// are not sent again.
        case restarted(reason: String, undelivered: [UndeliveredMessage])
    }

    /// Client, on the loop: the server's SESSION answer arrived on `channel`. Attaches the session
    /// to it and (re)sends what the server has not received.
    /// - Returns: ``SessionDiverged`` as the failure when the answer claims a state of the session
    ///   this side cannot continue: the session was renewed under a new id (what it had sent is in
    ///   the error, to report), and the connection must close for a protocol error.
    func clientOpened(_ reply: SessionHello, on channel: MessageChannel) -> Result<Opened, any Error> {
        // The store failed while the SESSION was on its way: no attaching (final for the client).
        if let failure = storeFailure { return .failure(Self.storeFailed(failure)) }
        var report: ReportToken?
        var endedFirst: SessionEndedFirst?
        let answered = apply { machine, effects -> Result<Machine.Opened, TransportError>? in
            defer { report = token(machine.takeReport(), machine.id) }
            // It ended while its SESSION was on the way (the app closed the client): nothing
            // attaches, and the answer says nothing about a session that is over here.
            if machine.ended != nil {
                endedFirst = SessionEndedFirst(keptInStore: machine.endKeptStored)
                return nil
            }
            return machine.clientOpened(reply, on: channel, &effects)
        }
        guard let opened = answered else { return .failure(endedFirst ?? SessionEndedFirst(keptInStore: false)) }
        switch opened {
        case .success(.resumed(let resent)): return .success(.resumed(resent: resent))
        case .success(.new(let lost)): return .success(.new(undelivered: lost.map { Self.undelivered($0, report) }))
        case .success(.diverged(let reason, let lost)), .success(.restarted(let reason, let lost)):
            logger.warning("the server's state of the session does not match this side's (\(reason)); starting a new session")
            return .failure(
                SessionDiverged(
                    reason: "the server's state of the session does not match this client's: \(reason)",
                    undelivered: lost.map { Self.undelivered($0, report) }))
        case .failure(let error): return .failure(error)
        }
    }

    /// Server, on the loop: a client's SESSION for this session arrived on `channel` (the session
    /// was just made, `isNew`, or found). Attaches, answers and resends, or starts anew.
    func serverOpen(_ hello: SessionHello, isNew: Bool, on channel: MessageChannel) -> Result<Opened, TransportError> {
        if storeFailure != nil {
            // (The server checked before; the store failed since.)
            return .failure(TransportError(.helloFailed, Self.storeFailedReason))
        }
        var report: ReportToken?
        let opened = apply { machine, effects in
            defer { report = token(machine.takeReport(), machine.id) }
            return machine.serverOpen(hello, isNew: isNew, on: channel, &effects)
        }
        return opened.map { opened in
            switch opened {
            case .resumed(let resent): .resumed(resent: resent)
            case .new(let lost): .new(undelivered: lost.map { Self.undelivered($0, report) })
            case .restarted(let reason, let lost), .diverged(let reason, let lost):
                .restarted(reason: reason, undelivered: lost.map { Self.undelivered($0, report) })
            }
        }
    }

    // MARK: Ending

    /// Ends the session: sends fail from now on; returns the messages never acknowledged.
    /// - Parameter keepStored: Leave it in the store for a later process to continue (a server
    ///   that stops, a client closed with messages in flight): nothing is reported undelivered.
    func end(_ reason: MessagingError, keepStored: Bool = false) -> [UndeliveredMessage] {
        var report: ReportToken?
        let (lost, ack) = apply { machine, effects in
            defer { report = token(machine.takeReport(), machine.id) }
            return machine.end(reason, keepStored: keepStored, &effects)
        }
        if let (channel, count) = ack { channel.sendAck(count) }
        return lost.map { Self.undelivered($0, report) }
    }

    /// The way back to the store of a report the machine just wrote (nil: none).
    private func token(_ report: UInt64?, _ key: Journal.Key) -> ReportToken? {
        guard let report, let store else { return nil }
        return ReportToken(store: store, key: key, id: report)
    }

    /// Waits (up to `timeout`) until every kept message is acknowledged, or the connection is lost.
    /// Returns whether everything was acknowledged. The deadline is a timer of `scheduler`; whichever
    /// of it and the drain comes first completes the wait (a ``Promise``).
    func drained(within timeout: Duration, scheduler: any Scheduler = DispatchScheduler()) async -> Bool {
        let waiter = Waiter()
        let due = apply { machine, effects -> Bool in
            machine.drain(waiter, &effects)
            return machine.drainIsDue
        }
        if due { return unacknowledgedCount == 0 }
        let timer = scheduler.schedule(after: timeout) { waiter.succeed(false) }
        defer { timer.cancel() }
        _ = try? await waiter.value()
        return unacknowledgedCount == 0
    }

    /// Waits (up to `timeout`, or until its task is cancelled) until the peer acknowledged this
    /// epoch's messages through `number` (nil: all numbered so far), across reconnects and
    /// resumes. Returns whether it did: false at the deadline or the cancellation, when the session
    /// ended, when it started anew and reported one of them undelivered, or when the store dropped
    /// one (its sender got the error). An acknowledgement, not a timer, ends the wait (the
    /// machine's ``SessionMachine/acknowledgementWaiters``).
    func acknowledged(through number: UInt64?, within timeout: Duration, scheduler: any Scheduler) async -> Bool {
        let waiter = Waiter()
        let id = lastWaiterID.add(1, ordering: .relaxed).newValue
        apply { $0.waitForAcknowledgement(id, through: number, waiter, &$1) }
        let timer = scheduler.schedule(after: timeout) { [self] in apply { $0.cancelAcknowledgementWait(id, &$1) } }
        defer { timer.cancel() }
        return await withTaskCancellationHandler {
            (try? await waiter.value()) ?? false
        } onCancel: {
            apply { $0.cancelAcknowledgementWait(id, &$1) }
        }
    }

    static func undelivered(_ entry: SessionOutbox<Frame>.Entry) -> UndeliveredMessage { undelivered(entry, nil) }

    static func undelivered(_ entry: SessionOutbox<Frame>.Entry, _ report: ReportToken?) -> UndeliveredMessage {
        UndeliveredMessage(
            number: entry.number, typeID: entry.item.typeID, codecID: entry.item.codecID, payload: entry.item.payload,
            wasTransmitted: entry.transmitted, report: report)
    }
}

/// Client: the session ended before the server's answer to its SESSION arrived (the app closed the
/// client). The connection closes without a protocol error: without GOODBYE when the session stays
/// in the store (a GOODBYE would end it at the server too), with one that says it ended otherwise.
struct SessionEndedFirst: Error, Sendable, CustomStringConvertible {
    let keptInStore: Bool
    var description: String { "the session ended before the server answered its SESSION frame" }
}

/// A client's session could not continue as its server knows it (one of them lost part of its
/// state): it was renewed under a new id; `undelivered` were sent before and are reported, never
/// sent again. The connection closes for a protocol error and the client connects again at once.
struct SessionDiverged: Error, Sendable, CustomStringConvertible {
    let reason: String
    let undelivered: [UndeliveredMessage]
    var description: String { reason }
}
