import Locks
import Synchronization

/// The package's one bounded async queue: a channel's incoming messages, transfers and chunks, and
/// the server's and client's events.
///
/// Two ways to add, one limit, and no producer ever suspends:
/// - ``push(_:)`` never waits. When the count reaches the limit it calls `onFull` once (a channel
///   pauses reading its socket); when consumers drain it to half the limit, `onDrained` (reading
///   resumes). So a consumer that does not keep up stops the socket instead of growing memory.
/// - ``push(_:from:)`` never waits either, for a producer that can stop (a channel reading its
///   socket): at the limit it returns false and the producer stops until the queue, drained to half
///   the limit, calls its ``QueueProducer/resumeProducing()``. So one queue bounds what many
///   producers hand it, each stopping on its own, without a task per producer.
///
/// Consumers call ``next()`` (several may wait; cancellation ends a wait). After ``finish(throwing:)``
/// pushes are dropped and consumers drain what is left, then get nil (or the error).
final class BoundedQueue<Element: Sendable>: Sendable {
    private struct Waiter {
        let id: UInt64
        let continuation: CheckedContinuation<Element?, any Error>
    }

    private struct State {
        var items: [Element] = []
        var head = 0
        var finished = false
        var overLimit = false
        var consumers: [Waiter] = []
        /// Producers stopped by ``push(_:from:)``, to resume when the queue drains.
        var stopped: [ObjectIdentifier: any QueueProducer] = [:]
        /// Elements taken by consumers so far.
        var taken: UInt64 = 0
        var failure: (any Error)?
        /// A consumer asked for an element at least once.
        var consumed = false
        /// ``taken`` when the consumer was last found not reading (``markStalled(at:)``).
        var stalledAt: UInt64?
        /// Elements removed by ``push(_:from:evictingOldestWhere:)`` to make room.
        var evicted = 0
        var count: Int { items.count - head }
    }

    private let state = Locked(State())
    /// The last id given to a waiting consumer (what its cancellation looks for).
    private let lastWaiterID = Atomic<UInt64>(0)
    let limit: Int
    private let onFull: (@Sendable () -> Void)?
    private let onDrained: (@Sendable () -> Void)?

    init(limit: Int, onFull: (@Sendable () -> Void)? = nil, onDrained: (@Sendable () -> Void)? = nil) {
        self.limit = max(1, limit)
        self.onFull = onFull
        self.onDrained = onDrained
    }

    /// Elements waiting for a consumer.
    var count: Int { state.withLock { $0.count } }
    /// Whether anyone has ever asked for an element (someone reads the queue).
    var hasConsumer: Bool { state.withLock { $0.consumed } }
    /// Elements consumers took so far (a consumer that stopped reading takes none).
    var taken: UInt64 { state.withLock { $0.taken } }

    /// Adds an element without waiting (dropped after `finish`); calls `onFull` when the limit is
    /// reached. Returns false when the element was dropped.
    @discardableResult
    func push(_ element: Element) -> Bool {
        switch push(element, atLimit: .signal) {
        case .finished, .dropped: false
        case .pushed, .full: true
        }
    }

    /// Adds an element without waiting (dropped after `finish`). Returns false when the queue now
    /// holds its limit or more: `producer` must stop until its ``QueueProducer/resumeProducing()``.
    func push(_ element: Element, from producer: any QueueProducer) -> Bool {
        if case .pushed(.stop) = push(element, atLimit: .stop(producer)) { return false }
        return true
    }

    /// Adds an element unless the queue is at its limit (or finished): for what may be dropped
    /// when the consumer does not keep up. Returns whether it was added.
    @discardableResult
    func pushBelowLimit(_ element: Element) -> Bool {
        switch push(element, atLimit: .drop) {
        case .finished, .dropped: false
        case .pushed, .full: true
        }
    }

    /// What ``push(_:from:evictingOldestWhere:)`` did.
    enum Pushed {
        /// Added; the producer goes on.
        case added
        /// Added, and the queue holds its limit: the producer stops until resumed (as with
        /// ``push(_:from:)``); `taken` is what consumers had taken by then.
        case stop(taken: UInt64)
        /// Added after removing the oldest evictable element (the `evicted`-th so far), returned.
        case evicted(Int, Element)
    }

    /// Adds an element of a producer that can stop, for consumers that may stop reading: while the
    /// queue is read (a consumer asked for an element, and took one since ``markStalled(at:)``),
    /// like ``push(_:from:)``; otherwise at the limit the oldest element `evictable` accepts makes
    /// room, and the producer never stops (a client's replies travel on the connection its
    /// unsolicited messages would stop).
    func push(_ element: Element, from producer: any QueueProducer, evictingOldestWhere evictable: (Element) -> Bool) -> Pushed {
        if case .pushed(let pushed) = push(element, atLimit: .evict(producer), evictable: evictable) { return pushed }
        return .added  // finished: dropped, and the producer goes on (nothing will resume it)
    }

    /// What a push does when the queue holds its limit: the four ways to add, above.
    private enum AtLimit {
        /// Adds anyway; `onFull` is called once (``push(_:)``).
        case signal
        /// Adds, and the producer stops until resumed (``push(_:from:)``).
        case stop(any QueueProducer)
        /// Drops the element (``pushBelowLimit(_:)``).
        case drop
        /// While the queue is read, `.stop`; otherwise the oldest evictable element makes room.
        case evict(any QueueProducer)
    }

    /// What a push did: ``Pushed`` when the element went in (to a consumer or the queue), else
    /// why not; `full` when it went in and the queue just reached its limit (`.signal`).
    private enum Outcome {
        case pushed(Pushed)
        case full, finished, dropped
    }

    /// Every push, in one critical section: after `finish` the element is dropped; a waiting
    /// consumer gets it at once; otherwise it is added, and `atLimit` says what the limit does.
    private func push(_ element: Element, atLimit: AtLimit, evictable: (Element) -> Bool = { _ in false }) -> Outcome {
        let (outcome, consumer) = state.withLock { state -> (Outcome, CheckedContinuation<Element?, any Error>?) in
            guard !state.finished else { return (.finished, nil) }
            if !state.consumers.isEmpty { return (.pushed(.added), state.consumers.removeFirst().continuation) }
            var policy = atLimit
            if case .evict(let producer) = policy, state.consumed && state.stalledAt != state.taken { policy = .stop(producer) }
            switch policy {
            case .drop:
                guard state.count < limit else { return (.dropped, nil) }
                state.items.append(element)
                return (.pushed(.added), nil)
            case .signal:
                state.items.append(element)
                guard state.count >= limit && !state.overLimit else { return (.pushed(.added), nil) }
                state.overLimit = true
                return (.full, nil)
            case .stop(let producer):
                state.items.append(element)
                guard state.count >= limit else { return (.pushed(.added), nil) }
                state.stopped[ObjectIdentifier(producer)] = producer
                return (.pushed(.stop(taken: state.taken)), nil)
            case .evict:
                var pushed = Pushed.added
                if state.count >= limit, let index = state.items[state.head...].firstIndex(where: evictable) {
                    let removed = state.items.remove(at: index)
                    state.evicted += 1
                    pushed = .evicted(state.evicted, removed)
                }
                state.items.append(element)
                return (.pushed(pushed), nil)
            }
        }
        consumer?.resume(returning: element)
        if case .full = outcome { onFull?() }
        return outcome
    }

    /// Puts `element` back in front, for the next consumer (one an iterator handed out and nobody
    /// handled: its loop ended first). Past the limit and after `finish` too: it was in the queue.
    func putBack(_ element: Element) {
        let consumer = state.withLock { state -> CheckedContinuation<Element?, any Error>? in
            if !state.consumers.isEmpty { return state.consumers.removeFirst().continuation }
            if state.head > 0 {
                state.head -= 1
                state.items[state.head] = element
            } else {
                state.items.insert(element, at: 0)
            }
            return nil
        }
        consumer?.resume(returning: element)
    }

    /// Consumers took `taken` elements and no more for a while: they stopped reading, and
    /// ``push(_:from:evictingOldestWhere:)`` evicts instead of stopping its producer until they take
    /// one again.
    func markStalled(at taken: UInt64) { state.withLock { $0.stalledAt = taken } }

    /// Elements evicted to make room so far.
    var evictedCount: Int { state.withLock { $0.evicted } }

    /// Forgets `producer` if it is stopped (it closed: nothing to resume, nothing to keep).
    func forget(_ producer: any QueueProducer) {
        _ = state.withLock { $0.stopped.removeValue(forKey: ObjectIdentifier(producer)) }
    }

    /// Ends the queue: consumers get the remaining elements, then nil (or `error`); stopped
    /// producers are resumed.
    func finish(throwing error: (any Error)? = nil) {
        let (consumers, stopped) = state.withLock { state -> ([Waiter], [any QueueProducer]) in
            guard !state.finished else { return ([], []) }
            state.finished = true
            state.failure = error
            defer {
                state.consumers = []
                state.stopped = [:]
            }
            return (state.count == 0 ? state.consumers : [], Array(state.stopped.values))
        }
        for producer in stopped { producer.resumeProducing() }
        for consumer in consumers {
            if let error { consumer.continuation.resume(throwing: error) } else { consumer.continuation.resume(returning: nil) }
        }
    }

    /// Takes every buffered element at once (a channel handing its backlog to a server's events);
    /// the queue stays open. Producers stopped by ``push(_:from:)`` are not resumed (its users
    /// have none).
    func takeAll() -> [Element] {
        let (elements, wasOver) = state.withLock { state -> ([Element], Bool) in
            let elements = Array(state.items[state.head...])
            state.taken += UInt64(elements.count)
            state.items = []
            state.head = 0
            defer { state.overLimit = false }
            return (elements, state.overLimit)
        }
        if wasOver { onDrained?() }
        return elements
    }

    /// Drops everything buffered and ignores later pushes.
    func discard() {
        let wasOver = state.withLock { state -> Bool in
            state.items = []
            state.head = 0
            defer { state.overLimit = false }
            return state.overLimit
        }
        finish()
        if wasOver { onDrained?() }
    }

    private enum Poll {
        case element(Element, drained: Bool, stopped: [any QueueProducer])
        case end((any Error)?)
        case empty
    }

    private func poll(_ state: inout State) -> Poll {
        guard state.head < state.items.count else { return state.finished ? .end(state.failure) : .empty }
        let element = state.items[state.head]
        state.head += 1
        state.taken += 1
        if state.head == state.items.count {
            state.items.removeAll(keepingCapacity: state.items.count <= 64)
            state.head = 0
        } else if state.head > 64 && state.head * 2 > state.items.count {
            state.items.removeSubrange(0..<state.head)
            state.head = 0
        }
        var drained = false
        if state.overLimit && state.count <= limit / 2 {
            state.overLimit = false
            drained = true
        }
        var stopped: [any QueueProducer] = []
        if !state.stopped.isEmpty && state.count <= limit / 2 {
            stopped = Array(state.stopped.values)
            state.stopped = [:]
        }
        return .element(element, drained: drained, stopped: stopped)
    }

    private func deliver(_ polled: Poll) -> Element? {
        if case .element(let element, let drained, let stopped) = polled {
            if drained { onDrained?() }
            for producer in stopped { producer.resumeProducing() }
            return element
        }
        return nil
    }

    /// The next element; nil at the end; throws the finishing error or `CancellationError`.
    func next() async throws -> Element? {
        let polled = state.withLock { state -> Poll in
            state.consumed = true
            return poll(&state)
        }
        switch polled {
        case .element:
            return deliver(polled)
        case .end(let error):
            if let error { throw error }
            return nil
        case .empty:
            break
        }
        let id = lastWaiterID.add(1, ordering: .relaxed).newValue
        let value = try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Element?, any Error>) in
                let polled = state.withLock { state -> Poll? in
                    let polled = poll(&state)
                    guard case .empty = polled else { return polled }
                    if Task.isCancelled { return .end(CancellationError()) }
                    state.consumers.append(Waiter(id: id, continuation: continuation))
                    return nil
                }
                switch polled {
                case nil, .empty?: break
                case .element?: continuation.resume(returning: deliver(polled!))
                case .end(let error)?:
                    if let error { continuation.resume(throwing: error) } else { continuation.resume(returning: nil) }
                }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.consumers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.consumers.remove(at: index)
            }
            waiter?.continuation.resume(throwing: CancellationError())
        }
        // A continuation resumed before this task suspended hands over without any synchronization
        // ThreadSanitizer can see; taking the lock the pusher released makes the hand-off visible.
        state.withLock { _ in }
        return value
    }
}

/// A producer that stops while a ``BoundedQueue`` is full (``BoundedQueue/push(_:from:)``).
protocol QueueProducer: AnyObject, Sendable {
    /// The queue has room again (drained to half its limit, or finished): produce again.
    func resumeProducing()
}

extension BoundedQueue.Pushed: Equatable where Element: Equatable {}
