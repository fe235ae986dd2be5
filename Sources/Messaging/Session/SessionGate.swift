import ProtocolCore

/// The session part of a channel's ``ChannelStateMachine``, for a ``MessageChannel`` that has, or
/// was offered, a message session, without I/O:
/// - which frame kinds are legal while the client's SESSION frame is awaited (a client that offered
///   a session sends SESSION first; only PING, PONG and GOODBYE may come before it);
/// - the SESSION exchange: who waits for which SESSION frame, and what a SESSION frame that
///   arrives means (the client's, kept until the server asks for it; the server's answer; one
///   that nobody expects, a protocol error).
/// (When to acknowledge is the session's own decision, ``SessionInbox``, under the session's lock:
/// the app says what it handled from any thread.)
///
/// ``ChannelStateMachine`` consults it for every frame and the channel does what it returns:
/// resumes a waiter, closes with a protocol error. Generic over the two waiters
/// so that its tests need neither continuations nor sockets. Not thread-safe: it lives on the
/// channel's loop.
struct SessionGate<HelloWaiter, AnswerWaiter> {
    enum Exchange {
        /// No SESSION frame expected (none offered to this side, or the exchange is over).
        case none
        /// Server: the client offered a session in its hello and its SESSION has not come; the
        /// server may be waiting for it already.
        case awaitingClientSession(HelloWaiter?)
        /// Server: the client's SESSION arrived before the server asked for it.
        case helloArrived(SessionHello)
        /// Client: waiting for the server's answer to its SESSION.
        case awaitingAnswer(AnswerWaiter)
        /// Client: the wait for the answer timed out, and the connection closes. An answer that
        /// comes now is late, not a protocol error: it is dropped.
        case answerAbandoned
    }

    private(set) var exchange: Exchange

    /// - Parameter awaitsClientSession: Server side: the client offered a message session and
    ///   this server accepts them, so the client's next frame must be its SESSION.
    init(awaitsClientSession: Bool = false) {
        exchange = awaitsClientSession ? .awaitingClientSession(nil) : .none
    }

    /// Kinds that may come before the client's SESSION frame.
    static var legalBeforeSession: Set<FrameKind> { [.session, .ping, .pong, .goodbye] }

    /// Whether a frame of `kind` may arrive now; nil if so, else what the peer did wrong.
    func violation(receiving kind: FrameKind) -> String? {
        guard case .awaitingClientSession = exchange, !Self.legalBeforeSession.contains(kind) else { return nil }
        return "the client offered a message session in its hello but sent \(kind) before its SESSION frame; "
            + "a client that offers sessions sends SESSION first (docs/PROTOCOL.md, \"Sessions\")"
    }

    // MARK: SESSION frames

    enum SessionFrame {
        /// Client: the server's answer; resume this waiter with the opened session.
        case answer(AnswerWaiter)
        /// Server: the client's SESSION, for this waiting server.
        case hello(HelloWaiter)
        /// Server: the client's SESSION, kept until the server asks (``waitForHello(_:)``).
        case kept
        /// Client: the server's answer after the wait for it timed out (the connection is
        /// closing): dropped, without a word to the peer.
        case lateAnswer
        /// Nobody expects a SESSION frame now: close with this protocol error.
        case violation(String)
    }

    /// A well-formed SESSION frame arrived. `peerOfferedSessions` and `peerName` (from the
    /// peer's hello) only shape the error when it was not expected.
    mutating func sessionFrame(_ hello: SessionHello, peerOfferedSessions: Bool, peerName: String) -> SessionFrame {
        switch exchange {
        case .awaitingAnswer(let waiter):
            exchange = .none
            return .answer(waiter)
        case .awaitingClientSession(let waiter?):
            exchange = .none
            return .hello(waiter)
        case .awaitingClientSession(nil):
            exchange = .helloArrived(hello)
            return .kept
        case .helloArrived:
            return .violation("a second SESSION frame")
        case .answerAbandoned:
            exchange = .none
            return .lateAnswer
        case .none:
            return .violation(Self.unexpectedSession(peerOfferedSessions: peerOfferedSessions, peerName: peerName))
        }
    }

    /// The protocol error for a SESSION frame nobody expects (also said by a channel that has no
    /// session box at all).
    static func unexpectedSession(peerOfferedSessions: Bool, peerName: String) -> String {
        peerOfferedSessions
            ? "an unexpected SESSION frame (a session is already open, or none was offered)"
            : "a SESSION frame, but \(peerName.isEmpty ? "the peer" : "'\(peerName)'") did not offer message sessions in its hello"
    }

    enum HelloWait {
        /// The client's SESSION is here already.
        case arrived(SessionHello)
        /// The waiter waits (``sessionFrame(_:peerOfferedSessions:peerName:)`` or the close or
        /// ``helloTimedOut()`` hands it back).
        case waiting
        /// No client SESSION is expected on this connection (or someone waits for it already).
        case notExpected
    }

    /// Server: waits for the client's SESSION frame.
    mutating func waitForHello(_ waiter: HelloWaiter) -> HelloWait {
        switch exchange {
        case .helloArrived(let hello):
            exchange = .none
            return .arrived(hello)
        case .awaitingClientSession(nil):
            exchange = .awaitingClientSession(waiter)
            return .waiting
        case .awaitingClientSession(.some), .awaitingAnswer, .answerAbandoned, .none:
            return .notExpected
        }
    }

    /// Whether the client's SESSION arrived and waits to be taken (it is served even after the
    /// connection closed).
    var helloArrived: Bool { if case .helloArrived = exchange { true } else { false } }

    /// Server: the wait for the client's SESSION timed out: the waiter, if it still waits.
    mutating func helloTimedOut() -> HelloWaiter? {
        guard case .awaitingClientSession(let waiter?) = exchange else { return nil }
        exchange = .awaitingClientSession(nil)
        return waiter
    }

    /// Client: sent its SESSION; `waiter` waits for the server's answer. False when a wait is
    /// under way already, or one timed out on this connection (the waiter is not kept).
    mutating func waitForAnswer(_ waiter: AnswerWaiter) -> Bool {
        guard case .none = exchange else { return false }
        exchange = .awaitingAnswer(waiter)
        return true
    }

    /// Client: the wait for the server's answer timed out: the waiter, if it still waits. The
    /// connection closes; an answer that comes after this is dropped (``SessionFrame/lateAnswer``).
    mutating func answerTimedOut() -> AnswerWaiter? {
        guard case .awaitingAnswer(let waiter) = exchange else { return nil }
        exchange = .answerAbandoned
        return waiter
    }

    /// The connection closed: the waiters to fail. Nothing is expected any more.
    mutating func closed() -> (hello: HelloWaiter?, answer: AnswerWaiter?) {
        defer { exchange = .none }
        switch exchange {
        case .awaitingClientSession(let waiter): return (waiter, nil)
        case .awaitingAnswer(let waiter): return (nil, waiter)
        case .none, .helloArrived, .answerAbandoned: return (nil, nil)
        }
    }
}
