import Dispatch

/// A one-shot operation of a backend (a resolve), cancelled with the task that awaits it: the
/// task's cancellation handler marks it on the backend's queue and stops the operation if it has
/// started; an operation that starts after the mark is stopped at once. So a cancelled resolve
/// ends now (its completion reports it stopped), not at its timeout.
///
/// State on `queue` only (the backend's serial queue): `@unchecked Sendable` for that reason.
final class QueueCancellation: @unchecked Sendable {
    private let queue: DispatchQueue
    private var cancelled = false
    private var stop: (() -> Void)?

    init(queue: DispatchQueue) { self.queue = queue }

    /// On `queue`: the operation started; `stop` ends it (at once when already cancelled).
    func started(_ stop: @escaping () -> Void) {
        dispatchPrecondition(condition: .onQueue(queue))
        if cancelled { stop() } else { self.stop = stop }
    }

    /// Any thread: stops the operation (on `queue`), now or when it starts.
    func cancel() {
        queue.async {
            self.cancelled = true
            let stop = self.stop
            self.stop = nil
            stop?()
        }
    }
}
