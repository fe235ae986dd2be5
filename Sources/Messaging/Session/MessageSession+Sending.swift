import Locks
import ProtocolCore
import Synchronization
import Transport

/// Sending in a session: admission (kept, numbered, stored), the wait for the store, and the one
/// sender at a time that writes the decided frames to the connection without the lock.
extension MessageSession {
    // MARK: Sending (any context)

    /// Keeps `frame` (a one-way MESSAGE) until the peer acknowledges it and sends it on the current
    /// connection, if any. Waits while the session keeps its maximum (or the store its maximum of
    /// bytes). Order is the order of the calls' admission. With a store it returns once the
    /// message's record is stored at the configured durability.
    /// - Throws: what ended the session; `TransportError.Code.frameTooLarge`; ``MessagingError``
    ///   `.sessionStoreFailed` when the store cannot take the message (nothing was kept or sent).
    func send(_ frame: Frame) async throws {
        if let ticket = try await admit(frame) { try await stored(ticket, frame) }
    }

    /// Sends `frames` in order, like ``send(_:)`` each, but waits for the store once, after the
    /// last (with power-loss durability: one sync for the batch, not one wait per message).
    func send(contentsOf frames: [Frame]) async throws {
        var last: (Ticket, Frame)?
        for frame in frames {
            if let ticket = try await admit(frame) { last = (ticket, frame) }
        }
        if let (ticket, frame) = last { try await stored(ticket, frame) }
    }

    /// A message kept, its record on its way to the store.
    struct Ticket {
        let number: UInt64
        let epoch: UInt64
        /// The store's write generation it was admitted in.
        let generation: UInt32
    }

    /// Keeps `frame` (numbered; its record queued for the store, or decided for the wire): returns
    /// the ticket to wait for when the store must hold it first. Waits while the session or the
    /// store is full.
    private func admit(_ frame: Frame) async throws -> Ticket? {
        let size = try Frame.validatedSize(frame)
        while true {
            var direct: (driver: ConnectionDriver, epoch: UInt64)?
            var generation: UInt32 = 0
            let admission = try apply { (machine, effects) throws -> Machine.Admission in
                let epoch = machine.epoch
                generation = machine.generation
                return try machine.admit(
                    frame, size: size, storeHasRoom: store?.hasRoom(for: size) ?? true,
                    tryDirect: { driver in
                        // Nothing unsent: this sender takes the sending role and sends its own
                        // message after the lock (the frame is not copied into the outgoing list).
                        guard unsent.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged else {
                            return false
                        }
                        direct = (driver, epoch)
                        return true
                    }, &effects)
            }
            switch admission {
            case .kept(let number, _):
                if let direct { sendOutgoing(first: frame, number: number, on: direct.driver, epoch: direct.epoch) }
                return nil
            case .storing(let number, let epoch):
                return Ticket(number: number, epoch: epoch, generation: generation)
            case .waitForRoom:
                try await waitForRoom(size)
            case .waitForStore:
                await store!.waitForRoom(size)
            }
        }
    }

    /// Waits until the store holds the ticket's message (and a sync covers it, with power-loss
    /// durability); it goes on the wire then. (Usually at once: the sender wrote it itself, unless
    /// another caller was writing.)
    /// - Throws: ``MessagingError`` `.sessionStoreFailed` when the store did not take it (nothing
    ///   of it was kept or sent); what ended the session.
    private func stored(_ ticket: Ticket, _ frame: Frame) async throws {
        do {
            // Usually stored already (this sender wrote it): no suspension, no hop to another
            // thread (a continuation resumed at once still re-enqueues the task: a wake-up per send).
            switch read({ $0.ticket(ticket.number, epoch: ticket.epoch, generation: ticket.generation) }) {
            case .ready: return
            case .failed(let error): throw error
            case .waiting: break
            }
            try await withCheckedThrowingContinuation { (continuation: Sender) in
                apply { $0.waitForTicket(ticket.number, epoch: ticket.epoch, generation: ticket.generation, continuation, &$1) }
            }
        } catch let error as FileError {
            throw MessagingError(.sessionStoreFailed, "message '\(frame.typeID)' was not sent: \(error.message)", underlying: error)
        }
    }

    /// Waits until a message of `size` bytes may be kept (acknowledgements made room), the session
    /// ends, or the task is cancelled.
    private func waitForRoom(_ size: Int) async throws {
        let id = lastWaiterID.add(1, ordering: .relaxed).newValue
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: Sender) in
                apply { $0.waitForRoom(id, size: size, cancelled: Task.isCancelled, continuation, &$1) }
            }
        } onCancel: {
            apply { $0.cancelRoomWait(id, &$1) }
        }
    }

    // MARK: The sending role

    /// Sends what was decided (``SessionMachine/outgoing``) with the lock released, in the order
    /// decided: one caller at a time takes the frames (a caller that finds another sending leaves
    /// its frames to it) and sends them through the channel; a frame that did not go (the
    /// connection was closing) is marked untransmitted unless the session moved on meanwhile.
    func sendOutgoing() {
        var batch: [Machine.Outgoing] = []
        var failed: [UInt64] = []
        let (driver, epoch, taken) = read { $0.takeOutgoing(&batch) }
        send(&batch, on: driver, failed: &failed)
        sendRest(&batch, sent: taken, driver: driver, epoch: epoch, failed: failed)
    }

    /// A sender that took the sending role for its own message: sends it, then what others
    /// decided meanwhile.
    private func sendOutgoing(first frame: Frame, number: UInt64, on driver: ConnectionDriver, epoch: UInt64) {
        let failed = MessageChannel.transmitSession(frame, queued: false, on: driver) ? [] : [number]
        var batch: [Machine.Outgoing] = []
        sendRest(&batch, sent: 1, driver: driver, epoch: epoch, failed: failed)
    }

    /// Holding the sending role, `sent` frames sent: marks what failed, counts them off ``unsent``
    /// and, unless it is back at zero (the role given up), takes and sends the next frames.
    private func sendRest(
        _ batch: inout [Machine.Outgoing], sent: Int, driver: ConnectionDriver?, epoch: UInt64, failed: [UInt64]
    ) {
        var (sent, driver, epoch, failed) = (sent, driver, epoch, failed)
        while true {
            if !failed.isEmpty {  // (rare: the connection was closing)
                let numbers = failed
                read { [driver, epoch] in $0.notTransmitted(numbers, driver: driver, epoch: epoch) }
                failed.removeAll()
            }
            assert(sent > 0, "a sender holds at least the frame that made it the sender")
            if unsent.subtract(sent, ordering: .acquiringAndReleasing).newValue == 0 { return }
            (driver, epoch, sent) = read { $0.takeOutgoing(&batch) }
            send(&batch, on: driver, failed: &failed)
        }
    }

    /// Sends `batch` on the connection in order and empties it (keeping its buffer); the numbers of
    /// the messages that did not go are added to `failed`.
    private func send(_ batch: inout [Machine.Outgoing], on driver: ConnectionDriver?, failed: inout [UInt64]) {
        if let driver {
            for item in batch where !MessageChannel.transmitSession(item.frame, queued: item.queued, on: driver) {
                if let number = item.number { failed.append(number) }
            }
        }
        batch.removeAll(keepingCapacity: true)
    }
}
