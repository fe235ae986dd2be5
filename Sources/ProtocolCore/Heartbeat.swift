/// Liveness of the peer, without I/O: send a PING every `interval`, close the connection when
/// nothing arrived for `timeout`. Every received frame counts as a sign of life (the connection
/// keeps the time of the last one); while this side has paused reading on purpose (its consumer is
/// slow), the peer is not silent. Times are uptime nanoseconds.
package struct Heartbeat: Sendable {
    /// What to do when the heartbeat deadline passes.
    package enum Tick: Equatable, Sendable {
        /// Send a PING; the next tick is due at the given time.
        case ping(next: UInt64)
        /// Nothing arrived for the timeout: close with ``CloseReason/heartbeatTimeout``.
        case timedOut
    }

    package let interval: UInt64
    package let timeout: UInt64

    /// - Parameters:
    ///   - interval: Nanoseconds between pings.
    ///   - timeout: Nanoseconds of silence after which the peer is considered gone.
    package init(interval: UInt64, timeout: UInt64) {
        self.interval = max(interval, 1)
        self.timeout = timeout
    }

    /// The heartbeat deadline passed. `lastHeard`: when the last frame arrived; `readingPaused`:
    /// this side stopped reading on purpose.
    package func tick(now: UInt64, lastHeard: UInt64, readingPaused: Bool) -> Tick {
        if !readingPaused && now &- lastHeard > timeout { return .timedOut }
        return .ping(next: now &+ interval)
    }
}
