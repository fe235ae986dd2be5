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
    @inlinable public mutating func resume(peerReceived: UInt64) -> [Entry]? {
        guard peerReceived >= acknowledged, acknowledge(through: peerReceived) != nil else { return nil }
        for index in head..<entries.count { entries[index].transmitted = true }
        return Array(entries[head...])
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

/// The receiving half of a session: counts one-way messages and decides when to acknowledge.
package struct SessionInbox: Sendable, Equatable {
    /// Messages received in the session (the number of the last one).
    package private(set) var received: UInt64 = 0
    /// The count last acknowledged to the peer.
    package private(set) var acknowledged: UInt64 = 0
    /// Acknowledge at once after this many unacknowledged messages.
    package let ackEvery: UInt64

    package init(ackEvery: UInt64 = 32) { self.ackEvery = max(1, ackEvery) }

    /// A session message arrived. Returns whether to acknowledge now (else within the ack delay).
    package mutating func receive() -> Bool {
        received += 1
        return received - acknowledged >= ackEvery
    }

    /// Whether received messages wait for an acknowledgement.
    package var ackPending: Bool { received > acknowledged }

    /// The count to acknowledge now, or nil when everything is acknowledged.
    package mutating func takeAck() -> UInt64? {
        guard received > acknowledged else { return nil }
        acknowledged = received
        return received
    }

    /// Starts over (a new session).
    package mutating func reset() {
        received = 0
        acknowledged = 0
    }

    /// A new connection: what the peer will hear about is what was received (the SESSION frame
    /// carries it), so nothing is pending.
    package mutating func reconnected() { acknowledged = received }
}

/// The SESSION frame's payload (JSON). The client sends `id` and `received`; the server answers
/// with the same `id`, its own `received` and `resumed`.
package struct SessionHello: Codable, Sendable, Equatable {
    // Declared in sorted order (the encoder writes keys in declaration order).
    /// 32 hex digits: the session's id, chosen at random by the client.
    package var id: String
    /// How many session messages this side received from the other.
    package var received: UInt64
    /// Server only: true when the session was known and continues; false when it is new.
    package var resumed: Bool?

    package init(id: String, received: UInt64, resumed: Bool? = nil) {
        self.id = id
        self.received = received
        self.resumed = resumed
    }

    /// Whether `id` is 32 lowercase hex digits.
    package var isWellFormed: Bool {
        id.utf8.count == 32 && id.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
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
