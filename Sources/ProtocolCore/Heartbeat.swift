/// Liveness of the peer, without I/O: send a PING every `interval`, close the connection when
/// nothing arrived for `timeout`. Every received frame counts as a sign of life (the connection
/// keeps the time of the last one); while this side has paused reading on purpose (its consumer is
/// slow), the peer is not silent. Times are uptime nanoseconds.
package struct Heartbeat: Sendable {
    /// What to do when the heartbeat deadline passes.
    package enum Tick: Equatable, Sendable {
        /// Send a PING (the next tick is an interval later, or the paced interval: the caller arms it).
        case ping
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
        return .ping
    }

    /// How early this side's PING may go, so that peers' heartbeats share wakeups: a due time
    /// within an eighth of an interval (at most a second) may be handled now (``CoarseDeadlines``).
    package var slack: UInt64 { min(interval / 8, CoarseDeadlines.maxSlack) }

    /// A PING from the peer is being answered at `now` and this side's own is due at `due`: whether
    /// to send it now, in the same write as the PONG (it is due within half an interval); the
    /// heartbeat is then re-armed from `now`. One exchange of three frames gives both sides their
    /// round-trip sample, instead of two exchanges at unrelated times.
    package func pingsAlong(now: UInt64, due: UInt64) -> Bool { due <= now &+ interval / 2 }
}

// MARK: Pacing

extension Heartbeat {
    /// The longest pace honoured: a peer asking for more gets this (10 minutes).
    package static let maxPace: UInt64 = 600_000_000_000

    /// This heartbeat slowed to `pace` nanoseconds between pings (what the peer asked for, or a
    /// server's own under load), the timeout growing in proportion (5 s / 15 s paced to 40 s gives
    /// 40 s / 120 s); never faster than configured, never slower than ``maxPace``.
    package func paced(_ pace: UInt64) -> Heartbeat {
        guard pace > interval else { return self }
        let slower = min(pace, Self.maxPace)
        let timeout = UInt64((Double(self.timeout) * Double(slower) / Double(interval)).rounded(.up))
        return Heartbeat(interval: slower, timeout: timeout)
    }

    /// The pace a server holding `connections` asks for so that they exchange about `perSecond`
    /// heartbeats a second in all (issue 28: each exchange costs an idle server tens of
    /// microseconds of wakeups and system calls, so 19,000 connections pinging every 5 s took half
    /// a core). 0 when `interval` is already slow enough.
    package static func pace(connections: Int, perSecond: Int, interval: UInt64) -> UInt64 {
        guard perSecond > 0, connections > 0 else { return 0 }
        let pace = UInt64(connections) * 1_000_000_000 / UInt64(perSecond)
        return pace > interval ? min(pace, maxPace) : 0
    }
}

extension Frame {
    /// A PONG answering the PING `reference`; with `pace` (nanoseconds, > 0) it asks the peer not to
    /// ping more often than that: 4 bytes, big-endian milliseconds (docs/PROTOCOL.md, "Heartbeat
    /// pacing").
    package static func pong(reference: UInt64, pace: UInt64) -> Frame {
        guard pace > 0 else { return Frame(kind: .pong, reference: reference) }
        let milliseconds = UInt32(clamping: (pace + 999_999) / 1_000_000)
        let payload = (0..<4).map { UInt8(truncatingIfNeeded: milliseconds >> (24 - 8 * UInt32($0))) }
        return Frame(kind: .pong, reference: reference, payload: payload)
    }

    /// The pace a PONG asks for, in nanoseconds: 0 for an empty payload (no pacing) or any other
    /// length (ignored, as the spec says).
    package var pongPace: UInt64 {
        guard kind == .pong, payload.count == 4 else { return 0 }
        let milliseconds = payload.reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        return min(UInt64(milliseconds) * 1_000_000, Heartbeat.maxPace)
    }
}

/// Round-trip time from PING/PONG, smoothed as TCP does (RFC 6298: SRTT and RTTVAR with gains 1/8
/// and 1/4). Compact (24 bytes: microseconds and the PING's sequence in 32 bits) because every
/// connection holds one. Without I/O: the caller says when a PING left and when its PONG arrived.
package struct RTTEstimator: Sendable, Equatable {
    /// Smoothed RTT and its mean deviation, in microseconds; 0 before the first sample.
    package private(set) var smoothedMicros: UInt32 = 0
    package private(set) var variationMicros: UInt32 = 0
    package private(set) var lastMicros: UInt32 = 0
    /// Samples taken.
    package private(set) var samples: UInt32 = 0
    /// The outstanding PING: the low 32 bits of its sequence number (0: none) and of the uptime in
    /// microseconds when it was queued (differences wrap correctly for RTTs under 71 minutes).
    private var pingSequence: UInt32 = 0
    private var pingSentMicros: UInt32 = 0

    package init() {}

    /// A PING numbered `sequence` was queued at `now` (an earlier unanswered one is forgotten).
    package mutating func pingSent(sequence: UInt64, now: UInt64) {
        pingSequence = max(1, UInt32(truncatingIfNeeded: sequence))
        pingSentMicros = UInt32(truncatingIfNeeded: now / 1000)
    }

    /// A PONG answering `reference` arrived at `now`. Returns whether it was a sample.
    @discardableResult
    package mutating func pongReceived(reference: UInt64, now: UInt64) -> Bool {
        guard pingSequence != 0, max(1, UInt32(truncatingIfNeeded: reference)) == pingSequence else { return false }
        let sample = UInt32(truncatingIfNeeded: now / 1000) &- pingSentMicros
        pingSequence = 0
        lastMicros = sample
        if samples == 0 {
            smoothedMicros = sample
            variationMicros = sample / 2
        } else {
            let difference = smoothedMicros > sample ? smoothedMicros - sample : sample - smoothedMicros
            variationMicros = UInt32((UInt64(variationMicros) * 3 + UInt64(difference)) / 4)
            smoothedMicros = UInt32((UInt64(smoothedMicros) * 7 + UInt64(sample)) / 8)
        }
        samples &+= 1
        return true
    }
}
