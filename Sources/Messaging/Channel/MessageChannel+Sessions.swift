import Dispatch
import FastJSON
import Locks
import Logging
import ProtocolCore
import Scheduling
import Synchronization
import Transport

extension MessageChannel {
    // MARK: Sessions (on the loop)

    /// Does what the session asked for the acknowledgement of handled messages, on the loop (from
    /// elsewhere: hops there).
    func performAck(_ step: SessionInbox.AckStep) {
        guard driver.loop.isCurrent else {
            if step != .nothing { queue.async { self.performAck(step) } }
            return
        }
        switch step {
        case .sendNow: sendAck()
        case .armDeadline:
            guard let session = sessionLink?.session else { return }
            driver.setDeadline(.ack, at: driver.now &+ session.configuration.ackDelay.nanoseconds)
        case .nothing: break
        }
    }

    /// Acknowledges the session messages handled since the last ACK. An armed acknowledgement
    /// deadline stays armed (``SessionInbox/ackStep()``): it passes within the ack delay and
    /// acknowledges what was handled since, or finds nothing to do; clearing it with every ACK and
    /// arming it again made and cancelled a timer every 32 messages of a stream.
    func sendAck() {
        assertOnLoop()
        guard let session = sessionLink?.session else { return }
        if let count = session.takeAck(on: self) {
            driver.enqueue(Frame.ack(count), bypassLimit: true) { _ in }
        }
    }

    /// Sends an ACK of `count` (taken from the session by the caller) on the loop, if the
    /// connection is still open. Any context; it goes ahead of what is queued after this call.
    func sendAck(_ count: UInt64) {
        queue.async {
            guard self.driver.isOpen else { return }
            self.driver.enqueue(Frame.ack(count), bypassLimit: true) { _ in }
        }
    }

    /// Client: the server answered its SESSION. Attached here, on the loop, before the next frame
    /// is read.
    func sessionAnswered(_ hello: SessionHello, _ waiter: Promise<MessageSession.Opened>) {
        guard let session = sessionLink?.session else {
            waiter.fail(TransportError(.helloFailed, "the session ended before the server answered"))
            return violation("a SESSION answer for a session that ended")
        }
        switch session.clientOpened(hello, on: self) {
        case .success(let opened): waiter.succeed(opened)
        case .failure(let ended as SessionEndedFirst):
            // (Closing before the waiter hears: its connect path aborts the channel, which would
            // drop a GOODBYE queued after.)
            if !ended.keptInStore {
                driver.enqueue(Frame(kind: .goodbye, payload: Array("the session ended".utf8)), bypassLimit: true) { _ in }
            }
            driver.closeGracefully()
            waiter.fail(TransportError(.connectionClosed, "\(ended)"))
        case .failure(let error):
            waiter.fail(error)
            // (A diverged session: the GOODBYE ends the old session at the server too.)
            violation((error as? TransportError)?.message ?? "\(error)")
        }
    }

    /// Client: opens `session` on this connection (sends SESSION, waits for the answer, resends).
    func openSession(_ session: MessageSession, timeout: Duration) async throws -> MessageSession.Opened {
        try await awaitSessionFrame(
            within: timeout, "the server did not answer the SESSION frame within \(timeout)", saysGoodbye: false,
            register: { link, promise in
                guard link.gate.waitForAnswer(promise) else {
                    promise.fail(TransportError(.helloFailed, "a session is being opened on this connection already"))
                    return
                }
                link.session = session
                self.driver.enqueue(HandshakeStateMachine.jsonFrame(.session, session.clientHello()), bypassLimit: true) { _ in }
            },
            expire: { link in link.gate.answerTimedOut() })
    }

    /// Server: waits for the client's SESSION frame (it offered a session in its hello).
    func sessionHello(timeout: Duration) async throws -> SessionHello {
        try await awaitSessionFrame(
            within: timeout, "the client offered a session but sent no SESSION frame within \(timeout)", saysGoodbye: true,
            register: { link, promise in
                switch link.gate.waitForHello(promise) {
                case .arrived(let hello): promise.succeed(hello)
                case .waiting: break
                case .notExpected: promise.fail(TransportError(.helloFailed, "no SESSION frame is expected on this connection"))
                }
            },
            expire: { link in link.gate.helloTimedOut() })
    }

    /// Runs `register` on the loop with this channel's session box and a promise that the SESSION
    /// frame's handler (or the close) completes. A timer on the loop ends the wait after `timeout`
    /// when `expire` still finds the promise waiting in the machine (and takes it): the connection
    /// closes, told why with a GOODBYE when `saysGoodbye` (the server's wait for a SESSION), without
    /// one otherwise (the client's wait for the answer: a GOODBYE would end the session). No task
    /// waits beside it (a task and a timeout race per session opened, before).
    private func awaitSessionFrame<T: Sendable>(
        within timeout: Duration, _ timeoutText: String, saysGoodbye: Bool,
        register: @escaping @Sendable (SessionLink, Promise<T>) -> Void,
        expire: @escaping @Sendable (SessionLink) -> Promise<T>?
    ) async throws -> T {
        let promise = Promise<T>()
        // The deadline's timer, cancelled once the wait is over (it held the channel for the whole
        // timeout after every answer, and a test's manual clock saw it pending).
        let deadline = Locked<ScheduledWork?>(nil)
        queue.async {
            let link = self.machine.makeLink()
            if !link.gate.helloArrived, !self.driver.acceptsFrames {
                promise.fail(TransportError(.connectionClosed, "the connection closed"))
                return
            }
            register(link, promise)
            let timer = self.configuration.scheduler.schedule(after: timeout, on: self.queue) { [weak self] in
                // (the link stays the channel's once made)
                guard let self, let link = self.sessionLink, let waiter = expire(link) else { return }  // answered, or closed
                waiter.fail(TransportError(.helloFailed, timeoutText))
                if saysGoodbye {
                    self.violation(timeoutText)  // said to the peer, then closed (not a silent drop)
                } else {
                    // A server slow to answer is no protocol error, and a GOODBYE would end the
                    // session (every GOODBYE does): closed without one, a lost connection to the
                    // server, which keeps the session for the client's next connection.
                    self.logger.warning("\(timeoutText); closing the connection without GOODBYE, so that the session continues on the next one")
                    self.driver.closeGracefully(reason: .helloFailed(timeoutText))
                }
            }
            deadline.withLock { $0 = timer }
        }
        defer { deadline.withLock { $0 }?.cancel() }
        return try await promise.value()
    }

    /// Server: attaches `session` to this connection, answers and resends (on the loop).
    func attachSession(_ session: MessageSession, hello: SessionHello, isNew: Bool) async throws -> MessageSession.Opened {
        try await onLoop { () throws(TransportError) -> MessageSession.Opened in
            guard self.driver.acceptsFrames else { throw TransportError(.connectionClosed, "the connection closed") }
            let link = self.machine.makeLink()
            link.session = session
            switch session.serverOpen(hello, isNew: isNew, on: self) {
            case .success(let opened): return opened
            case .failure(let error):
                self.violation(error.message)
                throw error
            }
        }
    }
}

extension MessageChannel {
    /// Sends a frame a session decided, on a channel's connection (`driver`: the session holds the
    /// driver, not the channel — see `MessageSession.State.outgoingDriver`), in the session's order,
    /// by one sender at a time, never under the session's lock: written by the sender when the
    /// connection is idle, else queued for the loop's flush (`queued`: always queued — a sync's
    /// batch). Never held back by senders waiting for room: the session bounds its own messages.
    /// False when the connection is closing.
    static func transmitSession(_ frame: Frame, queued: Bool, on driver: ConnectionDriver) -> Bool {
        do {
            if !queued, try driver.sendNow(frame, bypassLimit: true) != nil { return true }
        } catch {
            return false
        }
        // Queued behind what is unwritten (also when other senders wait for room: a session frame
        // is not one of theirs). A close meanwhile fails it; the session's resume sends it again.
        driver.enqueue(frame, bypassLimit: true) { _ in }
        return true
    }
}
