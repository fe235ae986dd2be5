import Dispatch
import FastJSON
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

extension MessageChannel {
    // MARK: Health

    /// The connection's health: round-trip time from the heartbeat and when the peer was last
    /// heard from. Any context (it asks the loop).
    public var health: ConnectionHealth {
        get async { await onLoop { self.healthOnLoop() } }
    }

    /// The connection's health after every round-trip sample (each heartbeat, by default every 5 s),
    /// the newest kept for a slow consumer; ends when the channel closes. Each access is a new stream.
    public var healthUpdates: AsyncStream<ConnectionHealth> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: ConnectionHealth.self, bufferingPolicy: .bufferingNewest(1))
        queue.async {
            guard self.driver.isOpen else { return continuation.finish() }
            let link = self.machine.makeLink()
            link.healthWatchers.append(continuation)
        }
        return stream
    }

    func healthOnLoop() -> ConnectionHealth {
        assertOnLoop()
        func duration(_ micros: UInt32) -> Duration? { rtt.samples == 0 ? nil : .microseconds(Int64(micros)) }
        let silence = driver.now &- driver.lastFrameTime
        var health = ConnectionHealth(
            smoothedRTT: duration(rtt.smoothedMicros), rttVariation: duration(rtt.variationMicros),
            lastRTT: duration(rtt.lastMicros), sinceLastHeard: .nanoseconds(Int64(clamping: silence)),
            samples: Int(rtt.samples))
        if let session = sessionLink?.session {
            (health.reconnects, health.resumes) = session.counts
        }
        return health
    }

    /// Sends a PING now for a first round-trip sample. Any context.
    func onLoopPing() { queue.async { self.ping() } }

    /// Sends a PING now (besides the heartbeat's), for a fresh round-trip sample. On the loop.
    func ping() {
        assertOnLoop()
        driver.enqueue(Frame(kind: .ping), bypassLimit: true) { [self] result in
            if case .success(let sequence) = result { rtt.pingSent(sequence: sequence, now: driver.now) }
        }
    }

    /// Answering the peer's PING: this side's own goes along in the same write when it is due soon
    /// (``Heartbeat/pingsAlong(now:due:)``: an idle server's CPU is its wakeups, issue 28). On the loop.
    func pingAlongIfDueSoon() {
        guard let beat = heartbeat, let due = driver.coarseDeadlines[.heartbeat] else { return }
        let now = driver.now
        guard beat.pingsAlong(now: now, due: due) else { return }
        ping()
        armHeartbeat(beat, from: now)
    }

    /// The heartbeat as configured, slowed to the peer's pace or this server's own
    /// (docs/PROTOCOL.md, "Heartbeat pacing"); nil without heartbeat.
    var heartbeat: Heartbeat? {
        guard let interval = configuration.pingInterval else { return nil }
        let configured = Heartbeat(interval: interval.nanoseconds, timeout: configuration.heartbeatTimeout.nanoseconds)
        let pace = max(UInt64(peerPaceCentiseconds) * 10_000_000, configuration.heartbeatPacer?.pace ?? 0)
        return configured.paced(pace)
    }

    /// The peer's PONG said how often it wants to be pinged (`pace` ns, 0: as configured). A new
    /// pace re-arms the heartbeat from now (the PONG is a sign of life) and lets the connection's
    /// idle check wait as long as the paced heartbeat's timeout. On the loop.
    func peerPaced(_ pace: UInt64) {
        let centiseconds = UInt16(clamping: (pace + 9_999_999) / 10_000_000)
        guard centiseconds != peerPaceCentiseconds else { return }
        peerPaceCentiseconds = centiseconds
        guard let beat = heartbeat else { return }
        if centiseconds > 0 { logger.debug("the peer asks to be pinged every \(Duration.nanoseconds(Int64(beat.interval)))") }
        armHeartbeat(beat, from: driver.now)
    }

    /// The next heartbeat `beat.interval` after `now`; a paced heartbeat also lets the connection's
    /// idle check (a server's 30 s without a complete frame) wait as long as its timeout, since a
    /// peer pinging at that pace sends frames less often. On the loop.
    func armHeartbeat(_ beat: Heartbeat, from now: UInt64) {
        driver.setDeadline(.heartbeat, at: now &+ beat.interval, slack: beat.slack)
        driver.idleTimeoutFloor = beat.interval > (configuration.pingInterval?.nanoseconds ?? 0) ? beat.timeout : 0
    }

    func heartbeatTick() {
        guard let beat = heartbeat else { return }
        switch beat.tick(now: driver.now, lastHeard: driver.lastFrameTime, readingPaused: driver.isReadPaused) {
        case .timedOut:
            logger.warning("peer sent nothing for \(Duration.nanoseconds(Int64(beat.timeout))); closing (heartbeat timeout)")
            driver.tearDown(.heartbeatTimeout)
        case .ping:
            ping()
            armHeartbeat(beat, from: driver.now)
        }
    }
}
