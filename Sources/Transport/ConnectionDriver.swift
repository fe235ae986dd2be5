import Dispatch
import Locks
import Logging
import ProtocolCore
import Scheduling
import Synchronization

import Glibc

/// What a connection reports to its owner (the hello exchange, then the channel). Called on the
/// connection's loop.
package protocol ConnectionHandler: AnyObject {
    /// A complete frame arrived.
    func connection(_ connection: ConnectionDriver, received frame: Frame)
    /// A deadline the owner set (``ConnectionDriver/setDeadline(_:at:)``) passed.
    func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind)
    /// The connection closed; no other call follows.
    func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason)
    /// Bytes arrived while the connection reads raw bytes (the version-2 handshake,
    /// ``ConnectionDriver/startRaw(handler:)``).
    func connection(_ connection: ConnectionDriver, receivedBytes bytes: [UInt8])
}

extension ConnectionHandler {
    package func connection(_ connection: ConnectionDriver, receivedBytes bytes: [UInt8]) {}
}

/// One nonblocking TCP connection carried out on Dispatch: it performs what the core's state
/// machines decide (``PendingWrites``, ``ConnectionLifecycle``, ``Deadlines``) and nothing else.
///
/// One loop (a serial queue shared with other connections) whose one epoll set and read source
/// tell the connection when to read (``LoopReadiness``), a write source made only when the socket
/// is full, one timer for every deadline; the fd is closed after it left the epoll set and after
/// the write source's cancel handler ran (the GCDAsyncSocket pattern).
///
/// Senders on any thread queue frames under one lock; an idle, non-streaming sender writes its frame
/// itself (no thread hop), everything else is written by one flush on the loop per batch.
///
/// `@unchecked Sendable`: `send` is guarded by its lock; every other mutable field is confined to
/// ``loop``.
package final class ConnectionDriver: @unchecked Sendable {
    /// A sender waiting for room: resumed with its frame's sequence number, or the error.
    package typealias Waiter = PendingWrites.Waiter

    struct SendState {
        var writes: PendingWrites
        /// Set at teardown: what a refused sender is told.
        var closeReason: CloseReason?
        /// Version 2's transport is on: every byte written is sealed.
        var encrypted = false
        /// The socket's descriptor was closed (``localAddress`` asks it no more).
        var descriptorClosed = false
        /// Version 2's sealing half: used by a sender that writes its own frame (under this lock),
        /// or taken out by the loop's flush while it seals (then nil; no sender writes meanwhile).
        var sealer: SecureSender?
        /// Sealed bytes a sender could not write at once, handed to the loop's flush (written
        /// before anything else).
        var sealedRemainder: [UInt8] = []
    }

    // Field order matters for memory (benchmark W5): small fields sit together.
    package let loop: Loop
    package let fd: FileDescriptor
    var readPauseCount: Int32 = 0
    /// The socket's `SO_RCVLOWAT` (1 unless a large payload is being received).
    package internal(set) var receiveLowWater: Int32 = 1
    /// This connection's place in the loop's sweep (-1: not in it). Kept by ``LoopSweep``.
    package internal(set) var sweepIndex: Int32 = -1
    /// This connection's slot in its loop's ``LoopReadiness`` (-1: not reading: before start or
    /// after teardown).
    var readSlot: Int32 = -1
    /// The largest frame body the peer accepts (its `max_frame`, learnt in the hello; `UInt32.max`,
    /// the most a length field says, until then): the one place the limit is held. Read without a lock by every sender
    /// (``PendingWrites`` refuses larger frames) and by a session before it keeps a message.
    private let peerFrameLimit = Atomic<UInt32>(.max)
    /// The idle check waits at least this long (milliseconds; 0: the configured
    /// ``ConnectionConfiguration/idleTimeout`` alone) while no partial frame is buffered: a channel
    /// whose heartbeat is paced (docs/PROTOCOL.md, "Heartbeat pacing") hears a frame less often than
    /// the check's usual timeout. On the loop.
    private var idleFloorMilliseconds: UInt32 = 0
    var writeSourceResumed = false
    var lifecycle = ConnectionLifecycle()
    package let configuration: ConnectionConfiguration
    package let remoteAddress: SocketAddress?
    private let baseLogger: Logger
    let send: Locked<SendState>
    var decoder: FrameDecoder
    /// Strong: the owner holds the driver too; the cycle ends at close (the handler is dropped).
    var handler: (any ConnectionHandler)?
    var writeSource: (any DispatchSourceWrite)?
    /// The fine deadlines (handshake, requests, acks) and their one timer, made when the first is set
    /// and released when none is left: an idle connection holds no timer state of its own.
    private final class Timing {
        var deadlines = Deadlines()
        /// When `timer` fires (ns on the connection's clock); 0 when it is not armed.
        var armed: UInt64 = 0
        /// The connection's scheduler's (``ConnectionConfiguration/scheduler``): on Dispatch's, one
        /// timer source moved in place.
        var timer: (any RearmableTimer)?
    }
    private var timing: Timing?
    /// The heartbeat, the idle check and the linger, served by the loop's one timer (``LoopSweep``).
    package private(set) var coarseDeadlines = CoarseDeadlines()
    /// See `idleFloorMilliseconds` (nanoseconds here). On the loop.
    package var idleTimeoutFloor: UInt64 {
        get { UInt64(idleFloorMilliseconds) * 1_000_000 }
        set { idleFloorMilliseconds = UInt32(clamping: newValue / 1_000_000) }
    }
    /// When the last complete frame arrived (``now``).
    package internal(set) var lastFrameTime: UInt64 = 0
    /// Callers of ``closed()`` and ``closed(within:)``, told the reason at close.
    private var closeWaiters: [(CloseReason) -> Void] = []
    /// Version 2 (nil for a plaintext connection).
    var secure: SecureState?

    /// This connection's logger: the given one with `peer` metadata. Built on each use: copying the
    /// metadata costs about 450 bytes, too much to keep for each of thousands of idle connections.
    package var logger: Logger {
        var logger = baseLogger
        logger[metadataKey: "peer"] = "\(remoteAddress.map { "\($0)" } ?? "?")"
        return logger
    }

    package init(fd: FileDescriptor, loop: Loop, configuration: ConnectionConfiguration, logger: Logger) {
        self.fd = fd
        self.loop = loop
        self.configuration = configuration
        remoteAddress = SocketOps.remoteAddress(fd)
        baseLogger = logger
        decoder = FrameDecoder(maxFrameSize: configuration.maxFrameSize)
        send = Locked(
            SendState(
                writes: PendingWrites(
                    highWaterMark: configuration.sendHighWaterMark, lowWaterMark: configuration.sendLowWaterMark)))
        var one: Int32 = 1
        _ = setsockopt(fd.rawValue, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    package var queue: DispatchQueue { loop.queue }

    /// Now on the connection's clock, in nanoseconds: Dispatch's uptime, or the virtual clock a
    /// test turns (``ConnectionConfiguration/scheduler``). Every deadline of the connection, and
    /// ``lastFrameTime``, is on it.
    @inline(__always)
    package var now: UInt64 { configuration.virtualClock?.now ?? uptimeNanoseconds() }

    /// The loop's sweep for this connection's clock (the loop's own for Dispatch's). On the loop.
    private var sweep: LoopSweep {
        guard let clock = configuration.virtualClock else { return loop.sweep }
        return loop.sweep(for: clock)
    }

    /// The address this end is bound to, asked of the socket (not kept: 16 bytes in each of
    /// thousands of idle connections, for a value few ever read); nil once its descriptor is
    /// closed. Any context: asked under the send lock, where the descriptor's close is recorded
    /// before it happens, so a descriptor number reused by another connection is never asked.
    package var localAddress: SocketAddress? {
        send.withLock { state in state.descriptorClosed ? nil : SocketOps.localAddress(fd) }
    }

    /// Closes the socket's descriptor, recorded first (``localAddress``).
    private func closeDescriptor() {
        send.withLock { $0.descriptorClosed = true }
        fd.close()
    }
    package var isClosed: Bool { lifecycle.isClosed }

    /// Debug builds: stops the process when `owner`'s loop-confined state is touched off this
    /// connection's loop (a wrong thread fails at once, not only under ThreadSanitizer). Compiled
    /// out in release builds.
    @inline(__always)
    package func assertOnLoop(_ owner: StaticString, _ function: StaticString = #function) {
        assert(loop.isCurrent, "\(owner).\(function) must run on the connection's loop")
    }
    package var closeReason: CloseReason? { lifecycle.closeReason }
    package var isReadPaused: Bool { readPauseCount > 0 }
    /// Bytes of a frame not yet complete, buffered (tests: a peer trickling a frame). On the loop.
    package var partialFrameByteCount: Int { decoder.bufferedByteCount }
    package var isOpen: Bool { lifecycle.state == .open }

    // MARK: Lifecycle

    /// Starts reading and accepting frames; reports to `handler`. On the loop, once. A connection
    /// closed before it started reports its close to `handler` at once.
    package func start(handler: any ConnectionHandler) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard lifecycle.start() else {
            // Closed before it started (aborted from another context: a cancelled handshake's
            // task, a stopping server): the handler hears it at once. It used to hear nothing,
            // and a handshake awaiting it waited forever (a server's stop() hung under TSan).
            if let reason = closeReason { handler.connection(self, closedWith: reason) }
            return
        }
        self.handler = handler
        send.withLock { $0.writes.open() }
        lastFrameTime = now
        // The loop's one epoll set tells when to read (``LoopReadiness``), not a read source of
        // this connection's own: that cost ~500 bytes for the connection's whole life.
        do throws(TransportError) {
            readSlot = try loop.readiness.add(self)
        } catch {
            logger.warning("cannot watch the socket for reading: \(error)")
            return tearDown(.error(error.errno ?? EIO))
        }
        if let idle = configuration.idleTimeout?.nanoseconds {
            setDeadline(.idleCheck, at: lastFrameTime &+ idle, slack: idle / 8)
        }
    }

    /// Hands the connection to another owner (the hello exchange hands over to the channel). On the loop.
    package func setHandler(_ handler: any ConnectionHandler) {
        dispatchPrecondition(condition: .onQueue(queue))
        if !isClosed { self.handler = handler }
    }

    /// The largest frame body the peer accepts (learnt in the hello; 4 GiB − 1, what a frame's
    /// 32-bit length can say, until then): larger frames are refused before they are queued.
    package var peerMaxFrameSize: Int { Int(peerFrameLimit.load(ordering: .acquiring)) }

    /// Sets ``peerMaxFrameSize`` (the channel does, when it is made from the hello).
    package func setPeerMaxFrameSize(_ size: Int) { peerFrameLimit.store(UInt32(clamping: size), ordering: .releasing) }

    /// Waits until the connection is closed and returns why. Any context.
    package func closed() async -> CloseReason {
        await withCheckedContinuation { continuation in
            queue.async {
                if let reason = self.closeReason {
                    continuation.resume(returning: reason)
                } else {
                    self.closeWaiters.append { continuation.resume(returning: $0) }
                }
            }
        }
    }

    /// Waits until the connection has closed and returns why, or nil when it is still open after
    /// `timeout` (a timer on the loop from the configuration's scheduler, not a sleeping task).
    package func closed(within timeout: Duration) async -> CloseReason? {
        await withCheckedContinuation { continuation in
            queue.async {
                if let reason = self.closeReason { return continuation.resume(returning: reason) }
                let outcome = RaceOutcome()
                // (Both on the loop: the timer cannot fire before the waiter is added; a close
                // first cancels it, so it does not hold the continuation for the whole timeout.)
                let timer = self.configuration.scheduler.schedule(after: timeout, on: self.queue) {
                    if outcome.expire() { continuation.resume(returning: nil) }
                }
                self.closeWaiters.append { reason in
                    if outcome.finish() {
                        timer.cancel()
                        continuation.resume(returning: reason)
                    }
                }
            }
        }
    }

    /// Graceful close: stop accepting frames, flush what is queued, shut down writing, wait briefly
    /// for the peer's end of file, then close. `reason` (the peer's GOODBYE, a protocol error) is what
    /// the connection reports. On the loop.
    package func closeGracefully(reason: CloseReason? = nil) {
        dispatchPrecondition(condition: .onQueue(queue))
        let (action, waiters) = send.withLock { state -> (ConnectionLifecycle.Action, [Waiter]) in
            let action = lifecycle.closeGracefully(
                reason: reason,
                outputEmpty: state.writes.isEmpty && state.sealedRemainder.isEmpty && !(secure?.sealedPending ?? false))
            switch action {
            case .stopAccepting, .stopAcceptingAndShutDownWrite:
                state.closeReason = reason ?? .localClose
                return (action, state.writes.stopAccepting())
            default:
                return (action, [])
            }
        }
        let error = TransportError.closed(reason ?? .localClose)
        for waiter in waiters { waiter(.failure(error)) }
        perform(action)
    }

    /// Closes now, dropping what is queued. Idempotent. On the loop.
    package func tearDown(_ reason: CloseReason) { perform(lifecycle.tearDown(reason)) }

    /// Closes from any context: refuses further frames at once (waiting senders fail), then tears
    /// down on the loop.
    package func abort(_ reason: CloseReason) {
        let waiters = send.withLock { state -> [Waiter] in
            if state.closeReason == nil { state.closeReason = reason }
            return state.writes.stopAccepting()
        }
        let error = TransportError.closed(reason)
        for waiter in waiters { waiter(.failure(error)) }
        queue.async { self.tearDown(reason) }
    }

    func perform(_ action: ConnectionLifecycle.Action) {
        switch action {
        case .none, .stopAccepting:
            break
        case .shutDownWrite, .stopAcceptingAndShutDownWrite:
            _ = shutdown(fd.rawValue, Int32(SHUT_WR))
            let linger = configuration.closeLinger.nanoseconds
            setDeadline(.linger, at: now &+ linger, slack: linger / 8)
        case .tearDown(let reason):
            closeNow(reason)
        }
    }

    private func closeNow(_ reason: CloseReason) {
        switch reason {
        // A failed hello is its caller's to say (the client's error, the server's refusal summary):
        // said here too, a key-change warning was logged twice (issue 43, 7).
        case .localClose, .goodbye, .closedByPeer, .helloFailed: logger.debug("connection closed: \(reason)")
        default: logger.info("connection closed: \(reason)")
        }
        let waiters = send.withLock { state -> [Waiter] in
            state.closeReason = reason
            return state.writes.discardAll()
        }
        let error = TransportError.closed(reason)
        for waiter in waiters { waiter(.failure(error)) }
        timing?.timer?.cancel()
        timing = nil
        coarseDeadlines.clearAll()
        sweep.remove(self)
        if readSlot >= 0 {
            loop.readiness.remove(readSlot, fd: fd.rawValue, watched: readPauseCount == 0)
            readSlot = -1
        }
        if let write = writeSource {
            // Setting a cancel handler on an active source is allowed; Dispatch runs it after the
            // cancellation is processed. The fd is closed then, not before: Dispatch may still be
            // watching it.
            write.setCancelHandler { [self] in closeDescriptor() }
            write.cancel()
            if !writeSourceResumed { write.resume() }  // a suspended source never runs its cancel handler
            writeSource = nil
        } else {
            closeDescriptor()
        }
        let owner = handler
        handler = nil
        owner?.connection(self, closedWith: reason)
        let waiting = closeWaiters
        closeWaiters = []
        for waiter in waiting { waiter(reason) }
    }

    // MARK: Deadlines (one timer)

    /// Sets (or clears, with nil) a deadline in uptime nanoseconds; the owner is told when it passes.
    /// The heartbeat, the idle check and the linger are coarse (``CoarseDeadlines``): served by the loop's one
    /// timer, possibly up to `slack` early (at most a second), together with other connections'.
    /// On the loop.
    package func setDeadline(_ kind: Deadlines.Kind, at time: UInt64?, slack: UInt64 = 0) {
        guard !isClosed else { return }
        if CoarseDeadlines.holds(kind) {
            coarseDeadlines.set(kind, at: time, slack: slack)
            sweep.update(self)
            return
        }
        if time == nil && timing == nil { return }
        let timing = self.timing ?? Timing()
        self.timing = timing
        timing.deadlines[kind] = time
        armTimer()
    }

    private func armTimer() {
        guard let timing else { return }
        guard let earliest = timing.deadlines.earliest else {
            // No deadline left (an idle connection without heartbeat): no timer either, it costs
            // a few hundred bytes per connection.
            timing.timer?.cancel()
            self.timing = nil
            return
        }
        guard earliest != timing.armed else { return }
        let timer: any RearmableTimer
        if let existing = timing.timer {
            timer = existing
        } else {
            // On Dispatch's clock unowned: the timer is cancelled (on this queue) before the driver
            // can go away, and a weak reference would give every connection a side table for its
            // whole life. On a test's clock weak: its work may outlive a driver a test dropped. No
            // leeway: the deadlines fire as they did before they came through the scheduler.
            let fired: @Sendable () -> Void
            if configuration.virtualClock == nil {
                fired = { [unowned self] in self.timerFired() }
            } else {
                fired = { [weak self] in self?.timerFired() }
            }
            timer = configuration.scheduler.makeTimer(on: queue, leeway: .zero, fired)
            timing.timer = timer
        }
        timing.armed = earliest
        timer.arm(at: earliest)
    }

    private func timerFired() {
        guard let timing else { return }
        timing.armed = 0
        for kind in timing.deadlines.expire(now: now) {
            guard !isClosed else { return }
            switch kind {
            case .handshake, .request, .ack: handler?.connection(self, deadlinePassed: kind)
            case .idleCheck, .heartbeat, .linger: break  // never here: coarse, see sweepFired(now:)
            }
        }
        armTimer()
    }

    /// The loop's sweep found a coarse deadline's window open. On the loop.
    func sweepFired(now: UInt64) {
        for kind in coarseDeadlines.expire(now: now) {
            guard !isClosed else { return }
            switch kind {
            case .idleCheck: checkIdle(now: now)
            case .linger: perform(lifecycle.lingerExpired())
            default: handler?.connection(self, deadlinePassed: kind)
            }
        }
        if !isClosed { sweep.update(self) }
    }

    private func checkIdle(now: UInt64) {
        guard let configured = configuration.idleTimeout?.nanoseconds else { return }
        // The floor is for a quiet peer only: one holding part of a frame (a slowloris) is
        // closed after the configured time, paced or not.
        let idle = decoder.bufferedByteCount > 0 ? configured : max(configured, idleTimeoutFloor)
        if readPauseCount > 0 { lastFrameTime = now }  // we stopped reading on purpose
        if now &- lastFrameTime >= idle {
            logger.warning(
                "closing: no complete frame for \(Duration.nanoseconds(idle)) (\(decoder.bufferedByteCount) bytes of a partial frame buffered)")
            tearDown(.idleTimeout)
        } else {
            setDeadline(.idleCheck, at: lastFrameTime &+ idle, slack: idle / 8)
        }
    }

    package static func reason(for error: TransportError) -> CloseReason {
        switch error.errno {
        case ECONNRESET, EPIPE: .reset
        case let code?: .error(code)
        case nil: error.closeReason ?? .protocolError(error.message)
        }
    }
}
