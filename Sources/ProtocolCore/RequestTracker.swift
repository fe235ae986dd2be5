/// The requests of one channel that wait for a reply, without I/O or timers of their own: the
/// channel arms one timer for ``nextDeadline`` and calls ``expire(now:)`` when it fires. A reply
/// removes its request at once (nothing stays behind until the timeout), and requests that timed
/// out or were cancelled are remembered (the last 1,024) so that their late replies are dropped
/// instead of surfacing as unsolicited messages.
///
/// `Token` is whatever the channel resumes (a continuation). Times are uptime nanoseconds.
///
/// Public and inlinable throughout, so that the channel's module specializes it for its token:
/// unspecialized, every request looked up the generic metadata of its tables (about 3 % of W6's
/// client in perf). `package` would not do: Swift 6.3 inlines no `package` declaration into another
/// module, `@inlinable` or not (checked with a two-module package). ProtocolCore is no product, so
/// apps still cannot name it.
public struct RequestTracker<Token> {
    /// One waiting request.
    public struct Entry {
        public let sequence: UInt64
        public let typeID: String
        public let sentAt: UInt64
        public let deadline: UInt64
        public let token: Token

        @usableFromInline
        init(sequence: UInt64, typeID: String, sentAt: UInt64, deadline: UInt64, token: Token) {
            (self.sequence, self.typeID, self.sentAt, self.deadline, self.token) = (sequence, typeID, sentAt, deadline, token)
        }
    }

    @usableFromInline var pending: [UInt64: Entry] = [:]
    /// Min-heap of (deadline, sequence). Entries of completed requests stay until they reach the top
    /// or the heap is rebuilt (when more than half of it is stale), so its size stays within about
    /// twice the number of waiting requests.
    @usableFromInline var heap: [(deadline: UInt64, sequence: UInt64)] = []
    @usableFromInline var late: Set<UInt64> = []
    @usableFromInline var lateOrder: [UInt64] = []
    @usableFromInline var lateHead = 0
    /// How many abandoned requests are remembered for dropping their late replies.
    public static var lateReplyMemory: Int { 1024 }

    @inlinable public init() {}

    /// Requests waiting for a reply.
    @inlinable public var count: Int { pending.count }
    /// Heap entries held (for tests: stays bounded by about twice ``count``).
    @inlinable public var storedDeadlines: Int { heap.count }

    /// The earliest deadline of a waiting request.
    @inlinable public var nextDeadline: UInt64? {
        mutating get {
            dropStaleTop()
            return heap.first?.deadline
        }
    }

    /// Starts tracking a request; returns true when its deadline is the new earliest (re-arm the timer).
    @discardableResult
    @inlinable public mutating func add(sequence: UInt64, typeID: String, now: UInt64, timeout: UInt64, token: Token) -> Bool {
        let deadline = now &+ max(timeout, 1)
        let earliest = nextDeadline
        pending[sequence] = Entry(sequence: sequence, typeID: typeID, sentAt: now, deadline: deadline, token: token)
        push((deadline, sequence))
        compactIfStale()
        return earliest.map { deadline < $0 } ?? true
    }

    /// A message referring to `sequence` arrived: the waiting request, if any (it stops waiting).
    @inlinable public mutating func reply(to sequence: UInt64) -> Entry? {
        guard let entry = pending.removeValue(forKey: sequence) else { return nil }
        compactIfStale()
        return entry
    }

    /// Whether `sequence` is a request that timed out or was cancelled (its reply is late: drop it).
    @inlinable public func isAbandoned(_ sequence: UInt64) -> Bool { late.contains(sequence) }

    /// The caller stopped waiting (task cancelled): the request, if it still waited.
    @inlinable public mutating func cancel(_ sequence: UInt64) -> Entry? {
        guard let entry = pending.removeValue(forKey: sequence) else { return nil }
        remember(sequence)
        compactIfStale()
        return entry
    }

    /// Remembers `sequence` as abandoned without it having been tracked (cancelled before it was sent).
    @inlinable public mutating func abandon(_ sequence: UInt64) { remember(sequence) }

    /// The requests whose deadline passed at `now` (they stop waiting), earliest first.
    @inlinable public mutating func expire(now: UInt64) -> [Entry] {
        var expired: [Entry] = []
        while let top = heap.first, top.deadline <= now {
            popTop()
            if let entry = pending[top.sequence], entry.deadline == top.deadline {
                pending.removeValue(forKey: top.sequence)
                remember(top.sequence)
                expired.append(entry)
            }
        }
        return expired
    }

    /// Every waiting request (the channel closed); nothing is remembered.
    @inlinable public mutating func removeAll() -> [Entry] {
        let all = pending.values.sorted { $0.sequence < $1.sequence }
        pending = [:]
        heap = []
        return all
    }

    @inlinable mutating func remember(_ sequence: UInt64) {
        late.insert(sequence)
        lateOrder.append(sequence)
        if lateOrder.count - lateHead > Self.lateReplyMemory {
            late.remove(lateOrder[lateHead])
            lateHead += 1
            if lateHead * 2 > lateOrder.count {
                lateOrder.removeSubrange(0..<lateHead)
                lateHead = 0
            }
        }
    }

    @inlinable mutating func dropStaleTop() {
        while let top = heap.first, pending[top.sequence]?.deadline != top.deadline { popTop() }
    }

    @inlinable mutating func compactIfStale() {
        guard heap.count > 2 * pending.count + 32 else { return }
        heap = pending.values.map { ($0.deadline, $0.sequence) }
        // Heapify bottom-up.
        var index = heap.count / 2
        while index > 0 {
            index -= 1
            siftDown(index)
        }
        if pending.isEmpty { heap = [] }
    }

    // MARK: Binary heap on (deadline, sequence)

    @inlinable static func less(_ a: (deadline: UInt64, sequence: UInt64), _ b: (deadline: UInt64, sequence: UInt64)) -> Bool {
        a.deadline != b.deadline ? a.deadline < b.deadline : a.sequence < b.sequence
    }

    @inlinable mutating func push(_ element: (deadline: UInt64, sequence: UInt64)) {
        heap.append(element)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard Self.less(heap[child], heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    @inlinable mutating func popTop() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        siftDown(0)
    }

    @inlinable mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count && Self.less(heap[left], heap[smallest]) { smallest = left }
            if right < heap.count && Self.less(heap[right], heap[smallest]) { smallest = right }
            guard smallest != parent else { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
