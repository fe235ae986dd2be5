/// Message sessions without I/O: exactly-once, in-order delivery of one-way messages across
/// reconnects (docs/PROTOCOL.md, "Sessions").
///
/// Each side numbers the one-way MESSAGE frames it sends in a session 1, 2, 3, … — implicitly, by
/// their order: the numbers never go on the wire. The receiver counts them and acknowledges the
/// count (ACK frames, cumulative). The sender keeps every message until it is acknowledged. When a
/// connection is replaced, the SESSION exchange tells each side how many messages the other
/// received, and each resends exactly the ones after that: so the receiver never sees a duplicate,
/// and the count on both sides stays equal without numbering anything on the wire.
///
/// Requests and replies are not session messages: they belong to one connection (a request whose
/// connection drops fails, and may be retried by the app).

/// The sending half of a session: numbers, keeps and releases one-way messages.
///
/// Public and inlinable, like ``RequestTracker``, so that Messaging specializes it for its frames:
/// as a `package` generic it ran unspecialized (Swift 6.3 inlines no `package` declaration into
/// another module), and every session send looked up its generic metadata (about 5 % of W7's
/// client in perf). ProtocolCore is no product: apps cannot name it.
public struct SessionOutbox<Item>: Sendable where Item: Sendable {
    public struct Entry: Sendable {
        /// The message's number in the session (1, 2, …).
        public let number: UInt64
        public let item: Item
        public let size: Int
        /// Whether it went on some connection (a message never transmitted cannot have arrived).
        public var transmitted: Bool

        @inlinable init(number: UInt64, item: Item, size: Int, transmitted: Bool) {
            self.number = number
            self.item = item
            self.size = size
            self.transmitted = transmitted
        }
    }

    /// Most messages kept unacknowledged; a sender waits beyond it.
    public let maxCount: Int
    /// Most bytes kept unacknowledged (one message larger than this is admitted when nothing else is kept).
    public let maxBytes: Int

    @usableFromInline var entries: [Entry] = []
    @usableFromInline var head = 0
    /// The number the next message gets.
    @inlinable public var nextNumber: UInt64 { _nextNumber }
    @usableFromInline var _nextNumber: UInt64 = 1
    /// Bytes of the kept messages.
    @inlinable public var bytes: Int { _bytes }
    @usableFromInline var _bytes = 0

    @inlinable public init(maxCount: Int, maxBytes: Int) {
        self.maxCount = max(1, maxCount)
        self.maxBytes = max(1, maxBytes)
    }

    /// Messages kept (sent or waiting, not yet acknowledged).
    @inlinable public var count: Int { entries.count - head }
    /// The highest number the peer acknowledged.
    @inlinable public var acknowledged: UInt64 { nextNumber - 1 - UInt64(count) }
    /// Whether a new message of `size` bytes may be kept now.
    @inlinable public func hasRoom(for size: Int) -> Bool {
        count == 0 || (count < maxCount && bytes + size <= maxBytes)
    }
    /// The kept messages, oldest first.
    @inlinable public var kept: ArraySlice<Entry> { entries[head...] }

    /// Keeps a new message and returns its number. The caller checked ``hasRoom(for:)`` (or
    /// overrides the bound on purpose).
    @discardableResult
    @inlinable public mutating func append(_ item: Item, size: Int, transmitted: Bool) -> UInt64 {
        let number = nextNumber
        _nextNumber += 1
        entries.append(Entry(number: number, item: item, size: size, transmitted: transmitted))
        _bytes += size
        return number
    }

    /// The peer's cumulative acknowledgement: it received every message up to `number`.
    /// - Returns: How many messages were released; nil when `number` is beyond what was sent
    ///   (a protocol violation). An older acknowledgement releases nothing.
    @inlinable public mutating func acknowledge(through number: UInt64) -> Int? {
        guard number < nextNumber else { return nil }
        var released = 0
        while head < entries.count, entries[head].number <= number {
            _bytes -= entries[head].size
            head += 1
            released += 1
        }
        if head > 64 && head * 2 > entries.count {
            entries.removeFirst(head)
            head = 0
        }
        return released
    }

    /// A new connection of a resumed session: the peer received up to `peerReceived`.
    /// - Returns: The messages to send again, in order (now marked transmitted); nil when the peer
    ///   claims more than was sent, or less than it already acknowledged (it lost its state: the
    ///   session cannot resume).
    /// - Parameter transmittable: Only messages up to this number go on the wire now (the others
    ///   wait until a session store has synced them: ``transmit(from:through:_:)``).
    @inlinable public mutating func resume(peerReceived: UInt64, transmittable: UInt64 = .max) -> [Entry]? {
        guard peerReceived >= acknowledged, acknowledge(through: peerReceived) != nil else { return nil }
        var resend: [Entry] = []
        for index in head..<entries.count where entries[index].number <= transmittable {
            entries[index].transmitted = true
            resend.append(entries[index])
        }
        return resend
    }

    /// Messages numbered `from` through `number` may go on the wire now: `send` is called for each
    /// one kept and not transmitted yet, in order, and says whether it went. (Only that range is
    /// looked at: a sync that lets a few go must not walk thousands kept before them.)
    @inlinable public mutating func transmit(from lowest: UInt64 = 0, through number: UInt64, _ send: (Item) -> Bool) {
        transmitEntries(from: lowest, through: number) { send($0.item) }
    }

    /// ``transmit(from:through:_:)`` with each message's number.
    @inlinable package mutating func transmitEntries(from lowest: UInt64 = 0, through number: UInt64, _ send: (Entry) -> Bool) {
        guard head < entries.count else { return }
        // Numbers are contiguous: entry i holds number entries[head].number + (i - head).
        let first = entries[head].number
        guard number >= first, number >= lowest else { return }
        let start = head + Int(max(lowest, first) - first)
        let last = min(entries.count - 1, head + Int(number - first))
        guard start <= last else { return }
        for index in start...last where !entries[index].transmitted {
            entries[index].transmitted = send(entries[index])
        }
    }

    /// Message `number`, counted transmitted when it was handed to a connection, did not go (the
    /// connection was closing): a new session sends it instead of reporting it undelivered.
    @inlinable package mutating func markUntransmitted(_ number: UInt64) {
        guard head < entries.count, number >= entries[head].number else { return }
        let index = head + Int(number - entries[head].number)
        if index < entries.count { entries[index].transmitted = false }
    }

    /// Starts from a session store: `items` are the kept messages numbered from `firstNumber`;
    /// the next message gets `nextNumber`.
    @inlinable public mutating func restore(_ items: [(item: Item, size: Int)], firstNumber: UInt64, nextNumber: UInt64, transmitted: Bool) {
        entries = []
        head = 0
        _bytes = 0
        _nextNumber = firstNumber
        for (item, size) in items { append(item, size: size, transmitted: transmitted) }
        _nextNumber = max(_nextNumber, nextNumber)
    }

    /// The peer does not know the session (it restarted, or its grace period expired): starts a new
    /// session. Messages that were transmitted may or may not have arrived; they are returned as
    /// `unacknowledged` and not sent again (no duplicates). Messages never transmitted stay, renumbered
    /// from 1, to go in the new session.
    @inlinable public mutating func restart() -> (unacknowledged: [Entry], kept: [Entry]) {
        let old = Array(entries[head...])
        entries = []
        head = 0
        _bytes = 0
        _nextNumber = 1
        var lost: [Entry] = []
        var kept: [Entry] = []
        for entry in old {
            if entry.transmitted {
                lost.append(entry)
            } else {
                append(entry.item, size: entry.size, transmitted: false)
                kept.append(entries[entries.count - 1])
            }
        }
        return (lost, kept)
    }

    /// Removes the newest kept messages, those numbered above `number` (never transmitted: a store
    /// did not take them); the next message gets `number + 1` again. Returns how many.
    @inlinable package mutating func removeNewest(after number: UInt64) -> Int {
        var removed = 0
        while entries.count > head, entries[entries.count - 1].number > number {
            _bytes -= entries.removeLast().size
            removed += 1
        }
        if removed > 0 { _nextNumber = number + 1 }
        return removed
    }

    /// Removes every kept message (the session ends) and returns them.
    @inlinable public mutating func removeAll() -> [Entry] {
        defer {
            entries = []
            head = 0
            _bytes = 0
        }
        return Array(entries[head...])
    }
}

/// The receiving half of a session: counts one-way messages as they arrive, learns which ones the
/// app has handled, and decides when to acknowledge — only what was handled (and, with a session
/// store, kept there): an acknowledged message is one the sender may forget.
///
/// Three counts, each never above the one before it:
/// - ``delivered``: the highest number handed to the app (each number once);
/// - ``handled``: the app handled every message up to it (it may handle out of order; the count
///   advances over what is contiguous);
/// - ``stored``: what may be told to the peer — ``handled``, once it is in the session store at the
///   configured level (at once without a store).
///
/// The peer hears ``stored`` in ACK frames and in the SESSION frame of a new connection, so after a
/// reconnect it resends everything above it: the messages still waiting in this process (delivered,
/// not handled) come again and are recognised by their number (``receive()`` says "duplicate").
package struct SessionInbox: Sendable, Equatable {
    /// Session messages counted on the current connection: the next one is number `counted + 1`.
    package private(set) var counted: UInt64 = 0
    /// The highest number handed to the app.
    package private(set) var delivered: UInt64 = 0
    /// The app handled every message up to this number.
    package private(set) var handled: UInt64 = 0
    /// Handled out of order, above ``handled``.
    private var handledAhead: Set<UInt64> = []
    /// What may be acknowledged: handled and kept in the store (``handled`` without one).
    package private(set) var stored: UInt64 = 0
    /// The count last told to the peer (ACK or SESSION).
    package private(set) var acknowledged: UInt64 = 0
    /// Acknowledge at once after this many unacknowledged messages.
    package let ackEvery: UInt64
    /// The acknowledgement deadline is armed on the connection.
    package private(set) var deadlineArmed = false
    /// An ACK was asked of the connection at once and has not been taken yet.
    package private(set) var ackQueued = false

    package init(ackEvery: UInt64 = 32) { self.ackEvery = max(1, ackEvery) }

    /// Starts from a session store: everything up to `handled` was handled and stored.
    package init(restoredThrough handled: UInt64, ackEvery: UInt64 = 32) {
        self.init(ackEvery: ackEvery)
        counted = handled
        delivered = handled
        self.handled = handled
        stored = handled
        acknowledged = handled
    }

    /// A session message arrived: its number, or nil when it is a duplicate of one delivered
    /// before (resent after a reconnect because it was not handled yet).
    package mutating func receive() -> UInt64? {
        counted += 1
        guard counted > delivered else { return nil }
        delivered = counted
        return counted
    }

    /// The app handled message `number` (again: nothing). Returns whether ``handled`` advanced.
    package mutating func handle(_ number: UInt64) -> Bool {
        guard number > handled, number <= delivered else { return false }
        guard number == handled + 1 else {
            handledAhead.insert(number)
            return false
        }
        handled = number
        while handledAhead.remove(handled + 1) != nil { handled += 1 }
        return true
    }

    /// Everything handled up to `number` is kept in the store (or no store keeps anything).
    package mutating func store(through number: UInt64) {
        stored = max(stored, min(number, handled))
    }

    /// What the connection does for the acknowledgement after ``stored`` advanced.
    package enum AckStep: Equatable, Sendable {
        /// Send the ACK now (``takeAck()``).
        case sendNow
        /// Arm the acknowledgement deadline (the ACK goes when it passes).
        case armDeadline
        /// Nothing: nothing new, or an ACK or the deadline is on its way.
        case nothing
    }

    /// Whether to acknowledge now (``ackEvery`` waiting), arm the deadline, or nothing.
    package mutating func ackStep() -> AckStep {
        guard stored > acknowledged else { return .nothing }
        if stored - acknowledged >= ackEvery {
            if ackQueued { return .nothing }
            ackQueued = true
            return .sendNow
        }
        if deadlineArmed { return .nothing }
        deadlineArmed = true
        return .armDeadline
    }

    /// Whether stored messages wait for an acknowledgement.
    package var ackPending: Bool { stored > acknowledged }

    /// The count to acknowledge now, or nil when everything is acknowledged.
    package mutating func takeAck() -> UInt64? {
        ackQueued = false
        guard stored > acknowledged else { return nil }
        acknowledged = stored
        return stored
    }

    /// The acknowledgement deadline passed (the connection cleared it): the next step arms it again.
    package mutating func deadlinePassed() { deadlineArmed = false }

    /// Starts over (a new session).
    package mutating func reset() { self = SessionInbox(ackEvery: ackEvery) }

    /// A new connection: the SESSION frame tells the peer ``stored``, which is what it resends
    /// from; nothing is pending on the new connection. Returns that count.
    package mutating func reconnected() -> UInt64 {
        counted = stored
        acknowledged = stored
        deadlineArmed = false
        ackQueued = false
        return stored
    }
}

/// The SESSION frame's payload (JSON). The client sends `id` and `received`; the server answers
/// with the same `id`, its own `received` and `resumed`. Both may add `sent` and `epoch`, which
/// let the other side see that one of them lost part of the session's state (a store that lost
/// records) before numbers are reused (docs/PROTOCOL.md, "Sessions": both optional; a peer that
/// does not send them gets the checks of `received` alone).
package struct SessionHello: Codable, Sendable, Equatable {
    // Declared in sorted order (the encoder writes keys in declaration order).
    /// The server's token of the session's current epoch (32 hex digits): sent by the server in its
    /// answer, and by a client that resumes, the token it was given. A server that finds another
    /// token than its own cannot continue the session as the client knows it.
    package var epoch: String?
    /// 32 hex digits: the session's id, chosen at random by the client.
    package var id: String
    /// How many session messages this side received from the other.
    package var received: UInt64
    /// Server only: true when the session was known and continues; false when it is new.
    package var resumed: Bool?
    /// The highest number of a session message this side handed to a connection in this epoch:
    /// the other side cannot have counted more of its messages. (Messages numbered since and not
    /// sent yet — after a restart, before the first connection — are not counted: a peer that
    /// counted one of those numbers counted a message this side no longer has.)
    package var sent: UInt64?

    package init(id: String, received: UInt64, resumed: Bool? = nil, epoch: String? = nil, sent: UInt64? = nil) {
        self.epoch = epoch
        self.id = id
        self.received = received
        self.resumed = resumed
        self.sent = sent
    }

    /// Whether `id` (and `epoch`, when present) is 32 lowercase hex digits.
    package var isWellFormed: Bool { Self.isHex32(id) && (epoch.map(Self.isHex32) ?? true) }

    private static func isHex32(_ text: String) -> Bool {
        text.utf8.count == 32 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}

extension Frame {
    /// An ACK frame acknowledging `count` session messages.
    package static func ack(_ count: UInt64) -> Frame {
        var payload = [UInt8](repeating: 0, count: 8)
        for index in 0..<8 { payload[index] = UInt8(truncatingIfNeeded: count >> (56 - 8 * UInt64(index))) }
        return Frame(kind: .ack, payload: payload)
    }

    /// The count an ACK frame acknowledges; nil when its payload is not 8 bytes.
    package var acknowledgedCount: UInt64? {
        guard kind == .ack, payload.count == 8 else { return nil }
        return payload.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// Whether this frame is a session message: a one-way MESSAGE (not a request, not a reply).
    package var isSessionMessage: Bool { kind == .message && reference == nil && !expectsReply }
}
