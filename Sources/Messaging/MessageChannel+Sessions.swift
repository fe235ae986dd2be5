import Dispatch
import FastJSON
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

extension MessageChannel {
    // MARK: Sessions (on the loop)

    /// Acknowledges the session messages received since the last ACK.
    func sendAck() {
        assertOnLoop()
        guard let link = sessionLink, let session = link.session else { return }
        link.machine.ackSent()
        driver.setDeadline(.ack, at: nil)
        if let count = session.takeAck(on: self) {
            driver.enqueue(Frame.ack(count), bypassLimit: true) { _ in }
        }
    }

    func handleAck(_ frame: Frame) {
        guard let session = sessionLink?.session else { return violation("ACK without a session") }
        guard let count = frame.acknowledgedCount else { return violation("an ACK must carry an 8-byte count") }
        if let text = session.acknowledged(count, on: self) { violation(text) }
    }

    func handleSessionHello(_ frame: Frame) {
        guard let hello = try? FastJSONDecoder().decode(SessionHello.self, from: frame.payload), hello.isWellFormed else {
            return violation("malformed SESSION payload (it needs \"id\": 32 hex digits and \"received\")")
        }
        // SESSION is the client's first frame when it offered sessions, or the server's answer to it.
        guard let link = sessionLink else {
            return violation(SessionLink.Machine.unexpectedSession(peerOfferedSessions: peer.sessions, peerName: peer.name))
        }
        switch link.machine.sessionFrame(hello, peerOfferedSessions: peer.sessions, peerName: peer.name) {
        case .answer(let waiter):
            // Client: the server's answer. Attached here, on the loop, before the next frame is read.
            guard let session = link.session else {
                waiter.resume(throwing: TransportError(.helloFailed, "the session ended before the server answered"))
                return violation("a SESSION answer for a session that ended")
            }
            switch session.clientOpened(hello, on: self) {
            case .success(let opened): waiter.resume(returning: opened)
            case .failure(let error):
                waiter.resume(throwing: error)
                violation(error.message)
            }
        case .hello(let waiter):
            waiter.resume(returning: hello)
        case .kept:
            break
        case .violation(let text):
            violation(text)
        }
    }

    /// Client: opens `session` on this connection (sends SESSION, waits for the answer, resends).
    func openSession(_ session: MessageSession, timeout: Duration) async throws -> MessageSession.Opened {
        try await awaitSessionFrame(
            within: timeout, "the server did not answer the SESSION frame within \(timeout)",
            register: { link, continuation in
                guard link.machine.waitForAnswer(continuation) else {
                    return continuation.resume(throwing: TransportError(.helloFailed, "a session is being opened on this connection already"))
                }
                link.session = session
                self.driver.enqueue(HandshakeStateMachine.jsonFrame(.session, session.clientHello()), bypassLimit: true) { _ in }
            },
            expire: { link in link.machine.answerTimedOut() })
    }

    /// Server: waits for the client's SESSION frame (it offered a session in its hello).
    func sessionHello(timeout: Duration) async throws -> SessionHello {
        try await awaitSessionFrame(
            within: timeout, "the client offered a session but sent no SESSION frame within \(timeout)",
            register: { link, continuation in
                switch link.machine.waitForHello(continuation) {
                case .arrived(let hello): continuation.resume(returning: hello)
                case .waiting: break
                case .notExpected:
                    continuation.resume(throwing: TransportError(.helloFailed, "no SESSION frame is expected on this connection"))
                }
            },
            expire: { link in link.machine.helloTimedOut() })
    }

    /// Runs `register` on the loop with this channel's session box and a continuation that the
    /// SESSION frame's handler (or the close) resumes. A timer on the loop ends the wait after
    /// `timeout` when `expire` still finds the continuation waiting (and takes it): the connection
    /// is told why and closed. No task waits beside it (a task and a timeout race per session
    /// opened, before).
    private func awaitSessionFrame<T: Sendable>(
        within timeout: Duration, _ timeoutText: String,
        register: @escaping @Sendable (SessionLink, CheckedContinuation<T, any Error>) -> Void,
        expire: @escaping @Sendable (SessionLink) -> CheckedContinuation<T, any Error>?
    ) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            queue.async {
                let link = self.sessionLink ?? SessionLink()
                self.sessionLink = link
                if !link.machine.helloArrived, !self.driver.acceptsFrames {
                    continuation.resume(throwing: TransportError(.connectionClosed, "the connection closed"))
                    return
                }
                register(link, continuation)
                self.queue.asyncAfter(deadline: dispatchDeadline(after: timeout)) { [weak self] in
                    // (the link stays the channel's once made)
                    guard let self, let link = self.sessionLink, let waiter = expire(link) else { return }  // answered, or closed
                    waiter.resume(throwing: TransportError(.helloFailed, timeoutText))
                    self.violation(timeoutText)  // said to the peer, then closed (not a silent drop)
                }
            }
        }
    }

    /// Server: attaches `session` to this connection, answers and resends (on the loop).
    func attachSession(_ session: MessageSession, hello: SessionHello, isNew: Bool) async throws -> Int {
        try await onLoop { () throws(TransportError) -> Int in
            guard self.driver.acceptsFrames else { throw TransportError(.connectionClosed, "the connection closed") }
            let link = self.sessionLink ?? SessionLink()
            self.sessionLink = link
            link.session = session
            switch session.serverOpen(hello, isNew: isNew, on: self) {
            case .success(let resent): return resent
            case .failure(let error):
                self.violation(error.message)
                throw error
            }
        }
    }
}
