import Foundation
import ProtocolCore
import Transport

/// A message received from the peer.
public struct IncomingMessage: Sendable {
    /// The app-chosen type id, for example `"chat.message"`.
    public let typeID: String
    /// The peer's sequence number of this message; pass the message to ``MessageChannel/reply(to:with:type:)``.
    public let sequence: UInt64
    /// The sequence number of the message this one answers, if it is a reply.
    public let replyTo: UInt64?
    /// The codec id of ``payload`` (0 raw bytes, 1 JSON).
    public let codecID: UInt8
    /// The raw payload bytes, always available (also for unknown type ids and undecodable payloads).
    public let payload: [UInt8]
    /// Whether the sender awaits a reply: it sent the message with `request(...)`. Answer it with
    /// ``MessageChannel/reply(to:with:type:)`` or ``MessageChannel/reply(to:error:)``; a message sent
    /// with `send(...)` cannot be replied to.
    public let expectsReply: Bool
    /// Whether this is an error reply (``RemoteError``); `request(...)` throws those.
    let isErrorReply: Bool
    let codecs: CodecRegistry
    /// A session message's way back to its session (nil for any other message).
    let sessionToken: SessionMessageToken?

    init(frame: Frame, codecs: CodecRegistry, session: SessionMessageToken? = nil) {
        sessionToken = session
        typeID = frame.typeID
        sequence = frame.sequence
        replyTo = frame.reference
        codecID = frame.codecID
        payload = frame.payload
        expectsReply = frame.expectsReply
        isErrorReply = frame.isError
        self.codecs = codecs
    }

    /// Where this message stands in its message session (session and number), when it is a
    /// session message: a one-way message on a connection with a session. nil otherwise.
    ///
    /// Store it with the message's effect, and skip a message whose position you already have:
    /// each message then takes effect exactly once, also when a crash makes it arrive again.
    public var sessionPosition: SessionPosition? { sessionToken?.position }

    /// Says that the app has handled this session message: the sender may forget it. (Nothing for
    /// other messages, or when said before.)
    ///
    /// With ``SessionAcknowledgement/automatic`` (the default) the message counts as handled anyway
    /// when the loop iteration or handler that got it is done; call this to say so sooner. With
    /// ``SessionAcknowledgement/manual`` only this says so — call it for every session message, in
    /// any order, from any task: the sender hears of everything up to the first message not
    /// acknowledged yet. Acknowledgements are sent together (every 32 messages, or
    /// ``SessionConfiguration/ackDelay`` after the first).
    public func acknowledge() { sessionToken?.handled(automatic: false) }

    /// The code that got this message is done with it (its loop iteration, its handler): handled,
    /// with ``SessionAcknowledgement/automatic``.
    func handledAutomatically() { sessionToken?.handled(automatic: true) }

    /// Decodes the payload with the codec named by ``codecID``.
    ///
    /// A raw-bytes payload (codec 0) decodes only as `[UInt8]`.
    /// - Throws: `TransportError.Code.decodingFailed`; the connection is unaffected.
    public func decode<T: Decodable>(_ type: T.Type = T.self) throws(TransportError) -> T {
        if codecID == WireProtocol.rawCodecID {
            if let bytes = payload as? T { return bytes }
            throw TransportError(
                .decodingFailed,
                "message '\(typeID)' #\(sequence) carries raw bytes; read `payload` instead of decoding \(T.self)")
        }
        guard let codec = codecs.codec(for: codecID) else {
            throw TransportError(
                .decodingFailed,
                "message '\(typeID)' #\(sequence) uses codec \(codecID), which is not configured; "
                    + "add it to CodecRegistry"
            )
        }
        do {
            return try payload.withUnsafeBytes { try codec.decode(T.self, from: $0) }
        } catch {
            throw TransportError(
                .decodingFailed, "could not decode message '\(typeID)' #\(sequence) as \(T.self): \(error)")
        }
    }
}

/// The messages a channel receives that are not replies to its requests and not taken by a handler.
///
/// Bounded: when the app stops consuming, the channel stops reading the socket. Ends when the channel closes.
public struct IncomingMessages: AsyncSequence, Sendable {
    /// The element type.
    public typealias Element = IncomingMessage
    let buffer: BoundedQueue<IncomingMessage>

    /// The iterator. Asking it for the next message counts as having handled the one before
    /// (``SessionAcknowledgement/automatic``); leaving the loop first (`break`, `return`, a throw)
    /// does not: that message is handed out again, first, to the next loop.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let buffer: BoundedQueue<IncomingMessage>
        let handling: HandledOnNext<IncomingMessage>
        /// The next message, or nil once the channel is closed (or the task is cancelled).
        public mutating func next() async -> IncomingMessage? {
            handling.done()
            let message = try? await buffer.next()
            handling.handling(message, message)
            return message
        }
    }

    /// Makes an iterator.
    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(buffer: buffer, handling: HandledOnNext(buffer)) }
}

/// The message an events iterator handed out last (``SessionAcknowledgement/automatic``): handled
/// when the iterator is asked for the next element. When the iterator goes away first — the loop
/// ended with `break`, `return` or a throw — it was not: it is put back in front of the events, and
/// the next loop over them gets it first (issue 53, 5: a `try` that fails in the exactly-once
/// recipe must not acknowledge the message it failed on). A class for its `deinit`; one per
/// iterator.
final class HandledOnNext<Element: Sendable> {
    private let queue: BoundedQueue<Element>
    /// The element handed out and the way back to its message's session (its payload is the
    /// element's).
    private var current: (token: SessionMessageToken, element: Element)?
    /// Or the report of undelivered messages handed out, kept in the store until it is taken.
    private var report: (tokens: [ReportToken], element: Element)?

    init(_ queue: BoundedQueue<Element>) { self.queue = queue }

    /// The app is handling `element` now, whose message is `message` (nil: nothing to handle).
    func handling(_ element: Element?, _ message: IncomingMessage?) {
        guard let element, let token = message?.sessionToken, token.isAutomatic else { return }
        current = (token, element)
    }

    /// The app is handling `element` now, a report of `messages` undelivered (those of a report
    /// kept in the store stay there until the app took it; one event can carry several reports).
    func handlingReport(_ element: Element, _ messages: [UndeliveredMessage]) {
        var tokens: [ReportToken] = []
        for message in messages {
            if let token = message.report, !tokens.contains(where: { $0 === token }) { tokens.append(token) }
        }
        guard !tokens.isEmpty else { return }
        report = (tokens, element)
    }

    /// The app is done with what it was handling: handled (a report: taken).
    func done() {
        if let (tokens, _) = report {
            report = nil
            for token in tokens { token.taken() }
        }
        guard let (token, _) = current else { return }
        current = nil
        token.handled(automatic: true)
    }

    deinit {
        if let (_, element) = current { queue.putBack(element) }
        if let (_, element) = report { queue.putBack(element) }
    }
}
