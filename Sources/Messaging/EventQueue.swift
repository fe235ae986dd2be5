
/// A bounded multi-producer, single-consumer async queue.
///
/// `push` suspends while `limit` events are waiting, so a consumer that does not keep up slows the
/// producers down (and, behind them, the sockets) instead of growing memory. After `finish()`,
/// pushes are dropped and consumers drain what is left, then get nil.
final class EventQueue<Element: Sendable>: Sendable {
    private struct State {
        var buffer: [Element] = []
        var head = 0
        var consumer: CheckedContinuation<Element?, Never>?
        var producers: [CheckedContinuation<Void, Never>] = []
        var finished = false
        var count: Int { buffer.count - head }
    }

    private enum PushStep {
        case done(CheckedContinuation<Element?, Never>?)
        case wait
    }

    private let state = Locked(State())
    let limit: Int

    init(limit: Int) { self.limit = max(1, limit) }

    /// Adds an event; suspends while the queue is full. Returns at once after `finish()`.
    func push(_ element: Element) async {
        while true {
            let step: PushStep = state.withLock { state in
                if state.finished { return .done(nil) }
                if let consumer = state.consumer {
                    state.consumer = nil
                    return .done(consumer)
                }
                if state.count < limit {
                    state.buffer.append(element)
                    return .done(nil)
                }
                return .wait
            }
            switch step {
            case .done(let consumer):
                consumer?.resume(returning: element)
                return
            case .wait:
                await withCheckedContinuation { continuation in
                    let resumeNow = state.withLock { state -> Bool in
                        if state.finished || state.count < limit { return true }
                        state.producers.append(continuation)
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            }
        }
    }

    /// Adds an event without waiting (for lifecycle events that must not be lost or block).
    func pushNow(_ element: Element) {
        let consumer: CheckedContinuation<Element?, Never>? = state.withLock { state in
            if state.finished { return nil }
            if let consumer = state.consumer {
                state.consumer = nil
                return consumer
            }
            state.buffer.append(element)
            return nil
        }
        consumer?.resume(returning: element)
    }

    /// The next event, or nil once finished and drained.
    func next() async -> Element? {
        await withCheckedContinuation { continuation in
            let (element, producer, done): (Element?, CheckedContinuation<Void, Never>?, Bool) = state.withLock { state in
                if state.count > 0 {
                    let element = state.buffer[state.head]
                    state.head += 1
                    if state.head > 64 && state.head * 2 > state.buffer.count {
                        state.buffer.removeFirst(state.head)
                        state.head = 0
                    }
                    let producer = state.producers.isEmpty ? nil : state.producers.removeFirst()
                    return (element, producer, true)
                }
                if state.finished { return (nil, nil, true) }
                state.consumer = continuation
                return (nil, nil, false)
            }
            producer?.resume()
            if done { continuation.resume(returning: element) }
        }
    }

    /// Producers suspended because the queue is full (for tests).
    var suspendedProducers: Int { state.withLock { $0.producers.count } }

    /// Ends the queue: waiting producers return, the consumer drains the rest, then gets nil.
    func finish() {
        let (consumer, producers) = state.withLock { state in
            state.finished = true
            let consumer = state.count == 0 ? state.consumer : nil
            if consumer != nil { state.consumer = nil }
            let producers = state.producers
            state.producers = []
            return (consumer, producers)
        }
        consumer?.resume(returning: nil)
        for producer in producers { producer.resume() }
    }
}
