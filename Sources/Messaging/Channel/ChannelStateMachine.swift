import FastJSON
import ProtocolCore

/// The established phase of a ``MessageChannel``, without I/O: what every frame that arrives
/// after the hello exchange means, and what the channel must do about it.
///
/// One machine decides, for each frame:
/// - whether its kind is legal now (the hello's kinds never are; before a client's SESSION only
///   PING, PONG and GOODBYE are, through the ``SessionGate``);
/// - for a message: whether it is a session message (the session decides whether to deliver it
///   and, once the app handled it, when to acknowledge it), a reply to a waiting request (request
///   correlation, ``RequestTracker``), a late reply to one that timed out (dropped), or unsolicited;
/// - for a SESSION, ACK or GOODBYE frame: whether its payload is well formed and expected;
/// - for a transfer's frames: which stream, how far, and whether it completed (``TransferReceiver``).
///
/// The channel calls ``received(_:from:)`` on its loop and carries out the returned ``Received``:
/// resumes a request, hands a message to its handler or route, answers a PING, closes with the
/// protocol error. The requests it sends and the transfers it receives are tracked here too, so the
/// close hands back everything still waiting (``closed()``).
///
/// Generic over what the channel resumes and fills (a request's continuation, a transfer's sink)
/// and over its session link, so that its tests need neither continuations nor sockets. Not
/// thread-safe: it lives on the channel's loop. It holds three words, the size of an idle
/// connection's share (W5): the request tables and the session link are boxed and made on first
/// use (most channels never send a request or hold a session).
struct ChannelStateMachine<Link: SessionLinking, Token, Sink> {
    typealias Gate = SessionGate<Link.HelloWaiter, Link.AnswerWaiter>
    typealias Request = RequestTracker<Token>.Entry
    typealias Stream = TransferReceiver<Sink>.Stream

    /// The requests waiting for replies, in a box made on the first request.
    private final class Requests {
        var tracker = RequestTracker<Token>()
    }
    private var requests: Requests?
    private var transfers = TransferReceiver<Sink>()
    /// The session running on this connection, its SESSION exchange and what else the channel
    /// keeps with it; nil for most channels.
    private(set) var link: Link?

    /// - Parameter awaitsClientSession: Server side: the client offered a message session and this
    ///   server accepts them, so the client's next frame must be its SESSION.
    init(awaitsClientSession: Bool = false) {
        if awaitsClientSession { link = Link(gate: Gate(awaitsClientSession: true)) }
    }

    /// The session link, made now if there is none (a session is opened or awaited, or someone
    /// watches the connection's health).
    mutating func makeLink() -> Link {
        if let link { return link }
        let made = Link(gate: Gate())
        link = made
        return made
    }

    // MARK: Frames

    /// What the channel does with a frame.
    enum Received {
        /// A message for the app: no session's, no reply's; to its handler, the route or the buffer.
        case message
        /// A reply to a waiting request: resume it (it stopped waiting).
        case reply(Request)
        /// A reply to a request that timed out or was cancelled: drop it.
        case lateReply(UInt64)
        /// A message of the session on this connection: ask the session whether to deliver it (a
        /// replaced connection's is resent on the new one; a duplicate is dropped) and when to
        /// acknowledge it.
        case sessionMessage
        /// Answer the PING with a PONG.
        case ping
        /// A PONG: the peer's pace, and a round-trip sample.
        case pong
        /// Client: the server's SESSION answer, for this waiter.
        case sessionAnswer(Link.AnswerWaiter, SessionHello)
        /// Server: the client's SESSION, for this waiting server.
        case sessionHello(Link.HelloWaiter, SessionHello)
        /// Server: the client's SESSION, kept until the server asks for it.
        case sessionKept
        /// Client: the server's SESSION answer after the wait for it timed out (the connection
        /// is closing): drop it.
        case lateSessionAnswer
        /// The peer acknowledged this many session messages in all: tell the session.
        case ack(UInt64)
        /// The peer said goodbye (with its reason): close gracefully.
        case goodbye(String)
        /// A transfer starts: make its sink and hand it to ``transferStarted(_:header:sink:)``.
        case startTransfer(TransferHeader)
        /// Bytes of a transfer, `stream.received` in all so far.
        case chunk(Stream, [UInt8])
        /// A transfer ended: all its bytes came.
        case transferCompleted(Stream)
        /// A transfer ended early (the sender aborted, or too few bytes came): why.
        case transferFailed(Stream, String)
        /// The peer broke the protocol: say so and close.
        case violation(String)
    }

    /// A frame arrived from `peer` (its hello shapes a few errors).
    mutating func received(_ frame: Frame, from peer: PeerInfo) -> Received {
        if let link, let text = link.gate.violation(receiving: frame.kind) { return .violation(text) }
        switch frame.kind {
        case .message:
            if frame.isSessionMessage, link?.hasSession == true { return .sessionMessage }
            guard let replyTo = frame.reference, let requests else { return .message }
            if let request = requests.tracker.reply(to: replyTo) { return .reply(request) }
            return requests.tracker.isAbandoned(replyTo) ? .lateReply(replyTo) : .message
        case .ping:
            return .ping
        case .pong:
            return .pong
        case .session:
            return sessionFrame(frame, from: peer)
        case .ack:
            guard link?.hasSession == true else { return .violation("ACK without a session") }
            guard let count = frame.acknowledgedCount else { return .violation("an ACK must carry an 8-byte count") }
            return .ack(count)
        case .goodbye:
            return .goodbye(String(decoding: frame.payload, as: UTF8.self))
        case .streamStart:
            switch TransferReceiver<Sink>.header(of: frame) {
            case .failure(let violation): return .violation(violation.text)
            case .success(let header):
                if transfers.isOpen(frame.sequence) { return .violation("STREAM_START #\(frame.sequence) reuses an open stream id") }
                return .startTransfer(header)
            }
        case .streamChunk:
            switch transfers.chunk(frame) {
            case .deliver(let stream, let bytes): return .chunk(stream, bytes)
            case .violation(let text): return .violation(text)
            }
        case .streamEnd:
            switch transfers.end(frame) {
            case .completed(let stream): return .transferCompleted(stream)
            case .failed(let stream, let text): return .transferFailed(stream, text)
            case .violation(let text): return .violation(text)
            }
        case .hello, .helloAck, .refuse, .auth, .authOK:
            return .violation("unexpected \(frame.kind) frame after the hello exchange")
        }
    }

    private mutating func sessionFrame(_ frame: Frame, from peer: PeerInfo) -> Received {
        guard let hello = try? FastJSONDecoder().decode(SessionHello.self, from: frame.payload), hello.isWellFormed else {
            return .violation("malformed SESSION payload (it needs \"id\": 32 hex digits and \"received\")")
        }
        // SESSION is the client's first frame when it offered sessions, or the server's answer to it.
        guard let link else { return .violation(Gate.unexpectedSession(peerOfferedSessions: peer.sessions, peerName: peer.name)) }
        switch link.gate.sessionFrame(hello, peerOfferedSessions: peer.sessions, peerName: peer.name) {
        case .answer(let waiter): return .sessionAnswer(waiter, hello)
        case .hello(let waiter): return .sessionHello(waiter, hello)
        case .kept: return .sessionKept
        case .lateAnswer: return .lateSessionAnswer
        case .violation(let text): return .violation(text)
        }
    }

    /// The sink for the transfer ``Received/startTransfer(_:)`` announced: its chunks go to it.
    mutating func transferStarted(_ frame: Frame, header: TransferHeader, sink: Sink) {
        let reused = transfers.start(frame, header: header, sink: sink)
        assert(reused == nil, "received(_:from:) checked that the stream id is free")
    }

    // MARK: Requests sent

    /// A request went out and waits for its reply until `now + timeout`. Returns the deadline to
    /// arm when it is the new earliest, else nil.
    mutating func requestSent(_ sequence: UInt64, typeID: String, now: UInt64, timeout: UInt64, token: Token) -> UInt64? {
        let requests = requestTables()
        guard requests.tracker.add(sequence: sequence, typeID: typeID, now: now, timeout: timeout, token: token) else { return nil }
        return requests.tracker.nextDeadline
    }

    /// The caller stopped waiting for request `sequence` (cancelled): the request, if it still
    /// waited. Its reply, if one comes, is dropped.
    mutating func requestCancelled(_ sequence: UInt64) -> Request? { requests?.tracker.cancel(sequence) }

    /// A request cancelled before it was tracked (while it was being sent): its reply is dropped.
    mutating func requestAbandoned(_ sequence: UInt64) { requestTables().tracker.abandon(sequence) }

    /// The request tables, made on the first request.
    private mutating func requestTables() -> Requests {
        if let requests { return requests }
        let made = Requests()
        requests = made
        return made
    }

    /// The request deadline passed at `now`: the requests that timed out (they stop waiting), and
    /// the next deadline to arm.
    mutating func requestsExpired(now: UInt64) -> (expired: [Request], next: UInt64?) {
        guard let requests else { return ([], nil) }
        return (requests.tracker.expire(now: now), requests.tracker.nextDeadline)
    }

    // MARK: Close

    /// What waited when the connection closed: requests to fail, transfers to end, the SESSION
    /// exchange's waiters to fail. Nothing waits afterwards.
    struct Closed {
        var requests: [Request] = []
        var transfers: [Stream] = []
        var hello: Link.HelloWaiter?
        var answer: Link.AnswerWaiter?
    }

    /// The connection closed.
    mutating func closed() -> Closed {
        var closed = Closed()
        if let requests { closed.requests = requests.tracker.removeAll() }
        closed.transfers = transfers.removeAll()
        if let link { (closed.hello, closed.answer) = link.gate.closed() }
        return closed
    }
}

/// What a channel keeps with its message session (``ChannelStateMachine/link``): the
/// ``SessionGate``, and whatever else the channel needs with it (the session, its health
/// watchers). A class: made on first use, so a channel without a session holds one nil pointer.
protocol SessionLinking: AnyObject {
    associatedtype HelloWaiter
    associatedtype AnswerWaiter
    init(gate: SessionGate<HelloWaiter, AnswerWaiter>)
    var gate: SessionGate<HelloWaiter, AnswerWaiter> { get set }
    /// A message session runs on this connection (its messages are counted and acknowledged).
    var hasSession: Bool { get }
}
