import Locks

/// A value (or an error) that arrives once, for one task that awaits it: what Messaging awaits
/// from a connection's loop or a timer (the hello and secure exchanges, a SESSION frame, a client's
/// next connection, a session's drain). Like NIO's `EventLoopPromise`, the first completion wins
/// and the later ones are ignored, so a reply racing its deadline or a close needs no claim of its
/// own (a deadline is a timer that completes it too); and the waiting task is resumed exactly
/// once, whichever comes first — the completion or the wait.
///
/// The task reads the result under the promise's lock after it resumes: whatever the completing
/// thread wrote before completing (a channel built on its loop) is visible to it, and to
/// ThreadSanitizer (a continuation resumed before its task suspended synchronizes only through the
/// runtime's atomics, which TSan does not see).
final class Promise<Value: Sendable>: Sendable {
    private enum State {
        case pending
        case waiting(CheckedContinuation<Void, Never>)
        case completed(Result<Value, any Error>)
        /// The waiter took the result.
        case taken
    }

    private let state = Locked(State.pending)

    init() {}

    /// Completes the promise; returns false (and changes nothing) when it was completed before.
    @discardableResult
    func complete(_ result: Result<Value, any Error>) -> Bool {
        let (won, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Void, Never>?) in
            switch state {
            case .pending:
                state = .completed(result)
                return (true, nil)
            case .waiting(let waiter):
                state = .completed(result)
                return (true, waiter)
            case .completed, .taken:
                return (false, nil)
            }
        }
        waiter?.resume()
        return won
    }

    @discardableResult
    func succeed(_ value: Value) -> Bool { complete(.success(value)) }

    @discardableResult
    func fail(_ error: any Error) -> Bool { complete(.failure(error)) }

    /// Waits for the result. Awaited once (a second wait is a programming error).
    func value() async throws -> Value {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                switch state {
                case .pending:
                    state = .waiting(continuation)
                    return false
                case .completed:
                    return true
                case .waiting, .taken:
                    preconditionFailure("a Promise is awaited once")
                }
            }
            if ready { continuation.resume() }
        }
        let result = state.withLock { state -> Result<Value, any Error> in
            guard case .completed(let result) = state else { preconditionFailure("resumed before completion") }
            state = .taken
            return result
        }
        return try result.get()
    }
}
