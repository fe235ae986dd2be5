/// The life of one connection, without I/O: open, closing gracefully (flushing what is queued),
/// half-closed (our side shut down, waiting briefly for the peer's end of file), closed with a
/// reason. Each event returns what the driver must do; a closed connection ignores every event.
///
/// ```
/// idle ──start──▶ open ──close──▶ closing ──output drained──▶ halfClosed ──EOF / linger──▶ closed
///   │               │   (nothing queued: straight to halfClosed)                            ▲
///   └───────────────┴──────────── teardown (error, timeout, abort, EOF) ────────────────────┘
/// ```
package struct ConnectionLifecycle: Sendable {
    /// The states; `closing` and `halfClosed` carry the reason the peer gave for closing (its
    /// GOODBYE), reported when the connection ends.
    package enum State: Sendable, Equatable {
        case idle, open
        case closing(CloseReason?)
        case halfClosed(CloseReason?)
        case closed(CloseReason)
    }

    /// What the driver does after an event.
    package enum Action: Sendable, Equatable {
        /// Nothing.
        case none
        /// Stop accepting frames (fail waiting senders); keep flushing what is queued.
        case stopAccepting
        /// Stop accepting frames, shut down the write side now and start the linger timer.
        case stopAcceptingAndShutDownWrite
        /// Shut down the write side (everything is written) and start the linger timer.
        case shutDownWrite
        /// Close now with this reason: drop what is queued, cancel sources and timers, report.
        case tearDown(CloseReason)
    }

    package private(set) var state = State.idle

    package init() {}

    package var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }

    package var closeReason: CloseReason? {
        if case .closed(let reason) = state { return reason }
        return nil
    }

    /// Whether bytes may still be read and frames delivered (open, closing or half-closed).
    package var isReading: Bool {
        switch state {
        case .open, .closing, .halfClosed: true
        case .idle, .closed: false
        }
    }

    /// Starts the connection; false when it was not idle.
    package mutating func start() -> Bool {
        guard case .idle = state else { return false }
        state = .open
        return true
    }

    /// A graceful close: flush what is queued, then shut down writing. `reason` (for example the
    /// peer's GOODBYE) is what the connection reports when it ends.
    package mutating func closeGracefully(reason: CloseReason? = nil, outputEmpty: Bool) -> Action {
        switch state {
        case .idle:
            return tearDown(reason ?? .localClose)
        case .open:
            if outputEmpty {
                state = .halfClosed(reason)
                return .stopAcceptingAndShutDownWrite
            }
            state = .closing(reason)
            return .stopAccepting
        case .closing(nil) where reason != nil:
            state = .closing(reason)
            return .none
        case .halfClosed(nil) where reason != nil:
            state = .halfClosed(reason)
            return .none
        case .closing, .halfClosed, .closed:
            return .none
        }
    }

    /// Everything queued is written.
    package mutating func outputDrained() -> Action {
        guard case .closing(let reason) = state else { return .none }
        state = .halfClosed(reason)
        return .shutDownWrite
    }

    /// The linger time after shutting down our side passed without the peer's end of file.
    package mutating func lingerExpired() -> Action {
        guard case .halfClosed(let reason) = state else { return .none }
        return tearDown(reason ?? .localClose)
    }

    /// The peer closed its side. `partialFrameBytes`: bytes of an incomplete frame still buffered.
    package mutating func endOfFile(partialFrameBytes: Int) -> Action {
        if partialFrameBytes > 0 {
            return tearDown(
                .protocolError(
                    "peer closed the connection in the middle of a frame (\(partialFrameBytes) bytes buffered)"))
        }
        switch state {
        case .halfClosed(let reason): return tearDown(reason ?? .localClose)
        case .closing(let reason): return tearDown(reason ?? .closedByPeer)
        default: return tearDown(.closedByPeer)
        }
    }

    /// Closes now (an error, a timeout, an abort). Returns `.none` when already closed.
    package mutating func tearDown(_ reason: CloseReason) -> Action {
        if case .closed = state { return .none }
        state = .closed(reason)
        return .tearDown(reason)
    }
}
