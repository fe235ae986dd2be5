import ProtocolCore

/// The session machine's receiving side, its opening on a connection, and its end.
extension SessionMachine {
    // MARK: Receiving

    /// What became of a session message that arrived.
    enum Arrival: Equatable {
        /// Not for the app: the channel was replaced (the new one resends it), or it is a
        /// duplicate of one delivered before and not yet handled (resent after a reconnect).
        case ignore
        /// Deliver it: its number in this epoch (whose position id is `positionID`).
        case deliver(number: UInt64, epoch: UInt64, positionID: Journal.Key)
        /// Not counted yet: the epoch's records are not synced (``epochPending``). The carrier
        /// holds it, and what follows it on the connection, until they are
        /// (``waitForEpoch(_:_:)``), then offers it again.
        case hold
    }

    /// A one-way message arrived on `link`: numbered; with `onArrival`, handled at once.
    mutating func received(on link: Link, onArrival: Bool, _ effects: inout Effects) -> Arrival {
        guard channel === link else { return .ignore }
        if epochPending { return .hold }
        guard let number = inbox.receive() else { return .ignore }
        if onArrival, inbox.handle(number) { handledAdvanced(&effects) }
        return .deliver(number: number, epoch: epoch, positionID: positionID)
    }

    /// The app handled message `number` of `epoch` (an older epoch's, or after the session ended:
    /// nothing — a record after its `ended` would name a session no record began, and the next
    /// start would refuse the store).
    mutating func handled(_ number: UInt64, epoch: UInt64, _ effects: inout Effects) {
        // Counted also while disconnected (the next SESSION frame tells it).
        guard ended == nil, epoch == self.epoch, inbox.handle(number) else { return }
        handledAdvanced(&effects)
    }

    /// The handled count advanced: without a store it may be acknowledged at once; with one it is
    /// written first (then ``written(_:_:)`` or ``synced(_:_:)`` let it be acknowledged). A count
    /// the store cannot write is not acknowledged: the sender keeps the messages, and a later
    /// count covers them.
    private mutating func handledAdvanced(_ effects: inout Effects) {
        guard stored else {
            inbox.store(through: inbox.handled)
            effects.ack = ackAction()
            return
        }
        effects.records.append(.handled(id, epoch: storeEpoch, through: inbox.handled))
        effects.afterWrite = .handled(through: inbox.handled, epoch: epoch)
    }

    /// The store keeps the handled count `through` (of `epoch`): it may be acknowledged.
    mutating func handledStored(through: UInt64, epoch: UInt64, _ effects: inout Effects) {
        guard epoch == self.epoch else { return }
        inbox.store(through: through)
        effects.ack = ackAction()
    }

    /// What the channel does for the acknowledgement now, if anything.
    private mutating func ackAction() -> (Link, SessionInbox.AckStep)? {
        guard let channel else { return nil }
        let step = inbox.ackStep()
        return step == .nothing ? nil : (channel, step)
    }

    /// The ACK to send now on `link`, if messages wait for one.
    mutating func takeAck(on link: Link) -> UInt64? { channel === link ? inbox.takeAck() : nil }

    /// The acknowledgement deadline of `link` passed: the next acknowledgement arms it again.
    mutating func ackDeadlinePassed(on link: Link) {
        if channel === link { inbox.deadlinePassed() }
    }

    // MARK: Opening on a connection

    /// What opening the session on a new connection found.
    enum Opened {
        /// The peer knew the session; `resent` messages went again.
        case resumed(resent: Int)
        /// A new session (the first connection, or the peer did not know it): `undelivered` were
        /// sent before and are not sent again.
        case new(undelivered: [SessionOutbox<Frame>.Entry])
        /// Client: the server's answer claims a session this side cannot continue (`reason`: one
        /// of them lost part of its state). The session was renewed under a new id — `undelivered`
        /// were sent before and are not sent again, the rest goes in the new one — and this
        /// connection must be closed for a protocol error (its GOODBYE ends the old session there).
        case diverged(reason: String, undelivered: [SessionOutbox<Frame>.Entry])
        /// Server: the client's SESSION claims a session this side cannot continue (`reason`): it
        /// started anew under the same id (answered `resumed: false`); `undelivered` were sent
        /// before and are not sent again.
        case restarted(reason: String, undelivered: [SessionOutbox<Frame>.Entry])
    }

    /// Client: the hello for a new connection (its SESSION frame), before it is sent.
    mutating func clientHello() -> SessionHello {
        SessionHello(id: id.hex, received: inbox.reconnected(), epoch: peerEpoch?.hex, sent: transmittedThrough)
    }

    /// Why the peer's SESSION (a client's, or a server's answer) names a state of the session
    /// this side cannot continue, or nil when it can: this side's store may have lost records
    /// (``mayHaveLost``: whatever the peer says); another epoch's token; a count of this
    /// side's messages beyond what it sent, or below what the peer acknowledged before; fewer
    /// messages sent than this side already counted of them. Each means one side lost part of its
    /// state (a store that lost records): continuing would reuse numbers for other messages.
    func divergence(_ peer: SessionHello, mine token: Journal.Key?) -> String? {
        if mayHaveLost {
            return "this side's store may have lost its last records in a power loss (process-crash durability), so its counts cannot be trusted"
        }
        if let theirs = peer.epoch, let token, theirs != token.hex {
            return "it names epoch \(theirs.prefix(8))…, not the current one (\(token.hex.prefix(8))…)"
        }
        let sent = outbox.nextNumber - 1
        if peer.received > sent {
            return "it says it received \(peer.received) messages of this side, which sent \(sent)"
        }
        if peer.received < outbox.acknowledged {
            return "it says it received \(peer.received) messages of this side, which it had acknowledged \(outbox.acknowledged) of"
        }
        if let theirs = peer.sent, theirs < inbox.delivered {
            return "it says it sent \(theirs) messages, and this side counted \(inbox.delivered) of them"
        }
        return nil
    }

    /// The peer's SESSION says it received up to `peerReceived`: releases what it has and returns
    /// what to send again (nil: it claims what this side cannot continue). The release is recorded
    /// like an ACK's — without it, a session resumed after every restart kept every message it ever
    /// sent in its journal (compaction keeps what was never released), and the replay at the next
    /// start grew without bound.
    private mutating func resumeOutbox(peerReceived: UInt64, _ effects: inout Effects) -> [SessionOutbox<Frame>.Entry]? {
        let before = outbox.acknowledged
        guard let resend = outbox.resume(peerReceived: peerReceived, transmittable: durableThrough) else { return nil }
        if outbox.acknowledged > before {
            if stored { effects.records.append(.released(id, epoch: storeEpoch, through: outbox.acknowledged)) }
            wakeAcknowledgementWaiters(&effects)
        }
        return resend
    }

    /// Client: the server's SESSION answer arrived on `link`. Attaches to it and resends what the
    /// server lacks, starts anew (the server did not know the session), or — when the answer
    /// claims a state this side cannot continue — renews the session under a new id. The answer
    /// acknowledges (or forgets) kept messages: senders waiting for room look again.
    mutating func clientOpened(_ reply: SessionHello, on link: Link, _ effects: inout Effects) -> Result<Opened, TransportError> {
        guard reply.id == id.hex else { return .failure(TransportError(.protocolViolation, "the SESSION answer names another session")) }
        defer { wakeRoomWaiters(&effects) }
        let wasConnected = everConnected
        // A store that may have lost records may have lost the very epoch that connected — and
        // its app got messages under that epoch's position: a server that resumes would send them
        // again under a new one. So it renews (the server reports what it kept) even when the
        // store says it never connected. (Found by the session simulation, seed 934.)
        if reply.resumed == true, everConnected || mayHaveLost {
            let reason = divergence(reply, mine: peerEpoch) ?? "it says it received \(reply.received) messages"
            guard divergence(reply, mine: peerEpoch) == nil,
                let resend = resumeOutbox(peerReceived: reply.received, &effects)
            else {
                return .success(.diverged(reason: reason, undelivered: renew(&effects)))
            }
            switchOutgoing(to: link)
            for entry in resend { _ = send(entry.item, number: entry.number, on: link, &effects) }
            resumes += 1
            reconnects += 1
            phase = .attached(link)
            // What the app handled while the answer was on its way (after the SESSION frame said
            // `received`) was stored with no connection to acknowledge it on: acknowledged now —
            // else the server resends it, this side drops the copy, and nothing acknowledges it
            // until the app handles another (found by the session simulation, seed 7381).
            effects.ack = ackAction()
            return .success(.resumed(resent: resend.count))
        }
        switchOutgoing(to: link)
        peerEpoch = reply.epoch.flatMap(Journal.Key.init(hex:))
        let lost = startAnew(&effects)
        if wasConnected { reconnects += 1 }
        phase = .attached(link)
        if !stored { makeTransmittable(through: outbox.nextNumber - 1, queued: false, &effects) }
        return .success(.new(undelivered: lost))
    }

    /// The session starts anew (the peer did not know it, or could not continue it): numbers
    /// start over under a new position id. What was transmitted may or may not have arrived: it
    /// is returned (reported undelivered, never sent again); what never went stays, renumbered
    /// from 1, to go in the new epoch — once the store holds its new records (the caller sends
    /// them at once without a store).
    private mutating func startAnew(renewing old: Journal.Key? = nil, _ effects: inout Effects) -> [SessionOutbox<Frame>.Entry] {
        let unsent = outbox.kept.filter { !$0.transmitted }.map(\.number)
        let (lost, kept) = outbox.restart()
        let previous = epoch
        inbox.reset()
        mayHaveLost = false
        epoch += 1
        positionID = .random()
        // (Before the snapshot: its messages go out on the next connection — a renewed session's
        // next SESSION opens a new one.)
        everConnected = old == nil
        // Senders waiting for a message that never went wait for its new number.
        for index in ticketWaiters.indices[ticketHead...] where ticketWaiters[index].epoch == previous {
            if let position = unsent.firstIndex(of: ticketWaiters[index].number) {
                ticketWaiters[index].number = UInt64(position + 1)
                ticketWaiters[index].epoch = epoch
            }
        }
        ticketsRenumbered(&effects)
        acknowledgementWaitersRenumbered(lost: lost, unsent: unsent, from: previous)
        wakeAcknowledgementWaiters(&effects)
        let last = kept.last?.number ?? 0
        writtenThrough = stored ? 0 : last
        durableThrough = 0
        // (The carried messages are in the store, under the old epoch or the new: a failure of a
        // later write never drops them, whatever order the writers' completions come in.)
        carriedThrough = stored ? last : 0
        epochRefused = false
        transmittedThrough = 0
        if stored {
            // The store starts over too: the kept messages under their new numbers, then the
            // snapshot that begins the epoch (saying it carries them: acknowledged 0, the next
            // number after them), then the old session's end when it was renewed — in this order,
            // so that a power loss keeping only part of them leaves the session as it was, its
            // messages with it: they apply only with the snapshot after them (`Journal.Staged`;
            // found by the session simulation, seed 318: the snapshot first, a torn tail lost three
            // messages whose `send` had returned). Written before any of them goes. Before them
            // all, the report of what the new epoch drops (it stays until the app took it).
            recordReport(lost, key: old ?? id, &effects)
            for entry in kept {
                effects.records.append(
                    .message(
                        id, epoch: storeEpoch, number: entry.number, codecID: entry.item.codecID, typeID: entry.item.typeID,
                        payload: entry.item.payload))
            }
            effects.records.append(.session(snapshot))
            if let old { effects.records.append(.ended(old)) }
            effects.afterWrite = .begun(through: last, epoch: epoch)
            // Its first message reaches the app only once these records are in the store (written,
            // or synced with power-loss durability): the position it carries must survive.
            epochPending = true
        }
        return lost
    }

    /// Client: the session cannot continue as the server knows it. A new session under a new id
    /// (the old one ends in the store); what was transmitted is returned (reported undelivered),
    /// what never went is kept for the new one. Detached: the connection closes.
    private mutating func renew(_ effects: inout Effects) -> [SessionOutbox<Frame>.Entry] {
        let old = id
        id = .random()
        peerEpoch = nil
        if let channel { switchOutgoing(to: channel) }
        let lost = startAnew(renewing: old, &effects)
        phase = .detached
        return lost
    }

    /// Server: a client's SESSION for this session arrived on `link` (the session was just made,
    /// `isNew`, or found). Attaches, answers and resends — or, when the client's SESSION claims a
    /// state this side cannot continue, starts anew under the same id (answered `resumed: false`).
    mutating func serverOpen(_ hello: SessionHello, isNew: Bool, on link: Link, _ effects: inout Effects) -> Result<Opened, TransportError> {
        defer { wakeRoomWaiters(&effects) }
        switchOutgoing(to: link)
        var opened = Opened.new(undelivered: [])
        var resent: [SessionOutbox<Frame>.Entry] = []
        if !isNew {
            let reason = divergence(hello, mine: positionID)
            if reason == nil, let entries = resumeOutbox(peerReceived: hello.received, &effects) {
                resent = entries
                resumes += 1
                opened = .resumed(resent: entries.count)
            } else {
                let why = reason ?? "it says it received \(hello.received) messages"
                opened = .restarted(reason: why, undelivered: startAnew(&effects))
            }
            reconnects += 1
        }
        let answer = SessionHello(
            id: id.hex, received: inbox.reconnected(), resumed: { if case .resumed = opened { true } else { false } }(),
            epoch: positionID.hex, sent: transmittedThrough)
        _ = send(HandshakeStateMachine.jsonFrame(.session, answer), number: nil, on: link, &effects)
        for entry in resent { _ = send(entry.item, number: entry.number, on: link, &effects) }
        everConnected = true
        phase = .attached(link)
        if case .restarted = opened, !stored { makeTransmittable(through: outbox.nextNumber - 1, queued: false, &effects) }
        return .success(opened)
    }

    // MARK: Ending

    /// Ends the session: sends fail from now on. Returns the messages never acknowledged (none
    /// with `keepStored` and a store: it keeps them for a later process), and the ACK to send for
    /// what the app handled — ahead of the GOODBYE that usually follows, so that the peer does not
    /// report those messages as never acknowledged after a clean close (issue 45, 7).
    mutating func end(
        _ reason: MessagingError, keepStored: Bool, _ effects: inout Effects
    ) -> (lost: [SessionOutbox<Frame>.Entry], ack: (Link, UInt64)?) {
        guard ended == nil else { return ([], nil) }
        let ack = channel.flatMap { channel in inbox.takeAck().map { (channel, $0) } }
        phase = .ended(reason)
        endKeptStored = keepStored && stored
        epochDurable(&effects)
        wakeDrainsIfDue(&effects)
        wakeAcknowledgementWaiters(&effects)
        wakeRoomWaiters(&effects, with: reason)
        failTickets(with: reason, &effects)
        let kept = outbox.removeAll()
        if stored && !keepStored {
            recordReport(kept, key: id, &effects)  // (before the end that drops them)
            effects.records.append(.ended(id))
        }
        return (keepStored && stored ? [] : kept, ack)
    }
}
