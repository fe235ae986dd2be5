import ProtocolCore
import Foundation

/// A single- or multi-consumer async buffer with a soft limit, used for every inbound stream.
///
/// When a push brings the count to `limit`, `onFull` runs (the channel pauses reading the socket);
/// when consumers drain it to half the limit, `onDrained` runs (reading resumes). So a consumer that
/// does not keep up stops the socket instead of growing memory.
///
/// `@unchecked Sendable`: every mutable field is guarded by `lock`.
final class BoundedBuffer<Element: Sendable>: @unchecked Sendable {
    private let lock = Lock()
    private var finished = false  // (the two flags share one word)
    private var overLimit = false
    private var items: [Element] = []
    private var head = 0
    private var waiters: [(id: UInt64, continuation: CheckedContinuation<Element?, any Error>)] = []
    private var nextWaiterID: UInt64 = 0
    private var failure: (any Error)?
    private let limit: Int
    private let onFull: @Sendable () -> Void
    private let onDrained: @Sendable () -> Void

    init(limit: Int, onFull: @escaping @Sendable () -> Void, onDrained: @escaping @Sendable () -> Void) {
        self.limit = max(1, limit)
        self.onFull = onFull
        self.onDrained = onDrained
    }

    /// Number of buffered elements.
    var count: Int { lock.withLock { items.count - head } }

    /// Adds an element (dropped after `finish`). Calls `onFull` synchronously when the limit is reached.
    func push(_ element: Element) {
        var waiter: CheckedContinuation<Element?, any Error>?
        var full = false
        lock.withLock {
            guard !finished else { return }
            if !waiters.isEmpty {
                waiter = waiters.removeFirst().continuation
                return
            }
            items.append(element)
            if items.count - head >= limit && !overLimit {
                overLimit = true
                full = true
            }
        }
        waiter?.resume(returning: element)
        if full { onFull() }
    }

    /// Ends the buffer: consumers get the remaining elements, then nil (or `error`).
    func finish(throwing error: (any Error)? = nil) {
        let pending: [CheckedContinuation<Element?, any Error>] = lock.withLock {
            guard !finished else { return [] }
            finished = true
            failure = error
            defer { waiters.removeAll() }
            return waiters.map(\.continuation)
        }
        for waiter in pending {
            if let error { waiter.resume(throwing: error) } else { waiter.resume(returning: nil) }
        }
    }

    /// Drops everything buffered and ignores later pushes.
    func discard() {
        let drained: Bool = lock.withLock {
            items.removeAll()
            head = 0
            finished = true
            defer { overLimit = false }
            return overLimit
        }
        finish()
        if drained { onDrained() }
    }

    private enum Poll {
        case element(Element, drained: Bool)
        case end((any Error)?)
        case empty
    }

    private func poll() -> Poll {
        guard head < items.count else { return finished ? .end(failure) : .empty }
        let element = items[head]
        head += 1
        if head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 64 && head * 2 > items.count {
            items.removeSubrange(0..<head)
            head = 0
        }
        var drained = false
        if overLimit && items.count - head <= limit / 2 {
            overLimit = false
            drained = true
        }
        return .element(element, drained: drained)
    }

    /// The next element; nil at the end; throws the finishing error or `CancellationError`.
    func next() async throws -> Element? {
        switch lock.withLock({ poll() }) {
        case .element(let element, let drained):
            if drained { onDrained() }
            return element
        case .end(let error):
            if let error { throw error }
            return nil
        case .empty:
            break
        }
        let id = lock.withLock {
            nextWaiterID += 1
            return nextWaiterID
        }
        let value = try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Element?, any Error>) in
                let result: Poll? = lock.withLock {
                    let polled = poll()
                    if case .empty = polled {
                        if Task.isCancelled { return .end(CancellationError()) }
                        waiters.append((id, continuation))
                        return nil
                    }
                    return polled
                }
                switch result {
                case nil: break
                case .element(let element, let drained)?:
                    if drained { onDrained() }
                    continuation.resume(returning: element)
                case .end(let error)?:
                    if let error { continuation.resume(throwing: error) } else { continuation.resume(returning: nil) }
                case .empty?: break
                }
            }
        } onCancel: {
            let waiter: CheckedContinuation<Element?, any Error>? = lock.withLock {
                guard let index = waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return waiters.remove(at: index).continuation
            }
            waiter?.resume(throwing: CancellationError())
        }
        // A continuation resumed before this task suspended hands over without any synchronization
        // ThreadSanitizer can see; taking the lock the pusher released makes the hand-off visible.
        lock.withLock {}
        return value
    }
}
