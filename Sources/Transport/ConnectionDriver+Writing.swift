import CLanmsgAEAD
import Dispatch
import ProtocolCore
import SystemCalls

import Glibc

/// Sending: every path queues through ``PendingWrites`` under the driver's lock; the bytes are
/// written either by the sender itself (idle connection, not streaming) or by one flush on the loop.
extension ConnectionDriver {
    /// How many buffers one `sendmsg` takes.
    static let maxIOVecs = 64

    /// What ``submit(_:size:bypassLimit:)`` did.
    enum Submitted {
        case sent(UInt64)
        case full
        case refused(TransportError)
    }

    /// Queues (or writes) `frame` without waiting. Any context.
    private func submit(_ frame: Frame, size: Int, bypassLimit: Bool) -> Submitted {
        let now = uptimeNanoseconds()
        // On the connection's own loop (a handler answering), never write at once: the loop is
        // busy delivering a batch of frames, and one flush after it writes every answer together
        // (as NIO flushes in channelReadComplete).
        // (The loop check is the dearer one: made only for a sender that would write itself.)
        let threadQuiet = now &- SendPacing.exchange(now) >= PendingWrites.streamingGap && !loop.isCurrent
        let limit = peerMaxFrameSize
        var flush = false
        let outcome = send.withLock { state -> Submitted in
            do throws(PendingWrites.Refusal) {
                let (sequence, next) = try state.writes.enqueue(
                    frame, size: size, limit: limit, bypassLimit: bypassLimit, now: now, threadQuiet: threadQuiet)
                switch next {
                case .writeNow: flush = writeDirectly(&state, maxBuffers: 2)
                case .scheduleFlush: flush = true
                case .none: break
                }
                return .sent(sequence)
            } catch .full {
                return .full
            } catch {
                return .refused(Self.error(for: error, state.closeReason))
            }
        }
        if flush { scheduleFlush() }
        if let metrics = configuration.metrics, case .sent = outcome { metrics.sent(frame) }
        return outcome
    }

    static func error(for refusal: PendingWrites.Refusal, _ reason: CloseReason?) -> TransportError {
        switch refusal {
        case .closed:
            reason.map(TransportError.closed)
                ?? TransportError(.connectionClosed, "the connection is not open (not started, or closing)")
        case .tooLarge(let size, let limit):
            TransportError(
                .frameTooLarge,
                "a frame of \(size) bytes exceeds the peer's limit of \(limit) bytes (its max_frame); "
                    + "nothing was sent — send large data as a transfer (sendFile/startTransfer) or in smaller messages")
        case .full:
            TransportError(.invalidArgument, "the send queue is full")
        }
    }

    /// The fast path of ``send(_:bypassLimit:)``, not `async`: queues `frame` if there is room and
    /// returns its sequence number; nil when the caller must wait (call `send` then). Any context.
    @inline(__always)
    package func sendNow(_ frame: Frame, bypassLimit: Bool = false) throws(TransportError) -> UInt64? {
        switch submit(frame, size: try Frame.validatedSize(frame), bypassLimit: bypassLimit) {
        case .sent(let sequence): return sequence
        case .refused(let error): throw error
        case .full: return nil
        }
    }

    /// Sends `frame`: at once when there is room, else waits (FIFO) until the queue drains below
    /// the low-water mark. Returns the frame's sequence number. Any context.
    package func send(_ frame: Frame, bypassLimit: Bool = false) async throws(TransportError) -> UInt64 {
        let size = try Frame.validatedSize(frame)
        switch submit(frame, size: size, bypassLimit: bypassLimit) {
        case .sent(let sequence): return sequence
        case .refused(let error): throw error
        case .full: break
        }
        let metrics = configuration.metrics
        metrics?.sendWaits.increment()  // counted when it begins: a wait that never ends shows too
        let waitStart = metrics == nil ? 0 : uptimeNanoseconds()
        let result: Result<UInt64, TransportError> = await withCheckedContinuation { continuation in
            enqueue(frame, size: size, bypassLimit: bypassLimit) { continuation.resume(returning: $0) }
        }
        if let metrics {
            metrics.sendWaitTime.recordNanoseconds(Int64(clamping: uptimeNanoseconds() &- waitStart))
        }
        return try result.get()
    }

    /// Queues `frame` or, when the queue is full, keeps `completion` waiting with it; `completion`
    /// gets the sequence number once the frame is queued (at once or when admitted by the flush).
    /// Any context.
    package func enqueue(_ frame: Frame, bypassLimit: Bool = false, completion: @escaping Waiter) {
        do {
            enqueue(frame, size: try Frame.validatedSize(frame), bypassLimit: bypassLimit, completion: completion)
        } catch {
            completion(.failure(error))
        }
    }

    private func enqueue(_ frame: Frame, size: Int, bypassLimit: Bool, completion: @escaping Waiter) {
        let limit = peerMaxFrameSize
        var flush = false
        let outcome = send.withLock { state -> Result<UInt64, TransportError>? in
            do throws(PendingWrites.Refusal) {
                switch try state.writes.enqueueOrWait(
                    frame, size: size, limit: limit, bypassLimit: bypassLimit, waiter: completion)
                {
                case .queued(let sequence, let next):
                    flush = next == .scheduleFlush
                    return .success(sequence)
                case .waiting:
                    return nil
                }
            } catch {
                return .failure(Self.error(for: error, state.closeReason))
            }
        }
        if flush { scheduleFlush() }
        if let metrics = configuration.metrics {
            switch outcome {
            case .success?, nil: metrics.sent(frame)  // queued, or waiting to be (it will go)
            case .failure?: break
            }
        }
        if let outcome { completion(outcome) }
    }

    /// Queues `frame` if there is room; false (nothing sent) when the queue is full. Any context.
    /// - Throws: `TransportError.Code.connectionClosed`, `TransportError.Code.frameTooLarge`,
    ///   `TransportError.Code.invalidArgument`.
    package func trySend(_ frame: Frame) throws(TransportError) -> Bool {
        switch submit(frame, size: try Frame.validatedSize(frame), bypassLimit: false) {
        case .sent: return true
        case .full: return false
        case .refused(let error): throw error
        }
    }

    /// Sends `frames` in order: as one batch when the queue is below the high-water mark and the
    /// batch not larger than it (the sender writes it itself when nothing else is unwritten), else
    /// one by one like ``send(_:bypassLimit:)``. Nothing is sent if one frame cannot be encoded.
    package func send(contentsOf frames: [Frame]) async throws(TransportError) {
        guard !frames.isEmpty else { return }
        var sizes: [Int] = []
        sizes.reserveCapacity(frames.count)
        for frame in frames { sizes.append(try Frame.validatedSize(frame)) }
        let now = uptimeNanoseconds()
        _ = SendPacing.exchange(now)
        let limit = peerMaxFrameSize
        var flush = false
        let outcome = send.withLock { state -> Submitted in
            do throws(PendingWrites.Refusal) {
                switch try state.writes.enqueue(batch: frames, sizes: sizes, limit: limit, now: now) {
                case .writeNow: flush = writeDirectly(&state, maxBuffers: Self.maxIOVecs)
                case .scheduleFlush: flush = true
                case .none: break
                }
                return .sent(0)
            } catch .full {
                return .full
            } catch {
                return .refused(Self.error(for: error, state.closeReason))
            }
        }
        if flush { scheduleFlush() }
        switch outcome {
        case .sent:
            if let metrics = configuration.metrics { for frame in frames { metrics.sent(frame) } }
            return
        case .refused(let error): throw error
        case .full: for frame in frames { _ = try await send(frame) }
        }
    }

    /// One nonblocking `sendmsg` of the start of the queue, by the sender, with the lock held and
    /// nothing else unwritten before this frame; returns whether the loop's flush must be scheduled
    /// for the rest. Would-block and errors write nothing here: the flush meets them again and
    /// handles them (write source, teardown).
    private func writeDirectly(_ state: inout SendState, maxBuffers: Int) -> Bool {
        if state.encrypted { return sealDirectly(&state, maxBuffers: maxBuffers) }
        let written = withUnsafeTemporaryAllocation(of: iovec.self, capacity: maxBuffers) { vecs -> Int in
            let count = state.writes.forEachUnwritten(maxBuffers: maxBuffers) { index, base, length in
                vecs[index] = iovec(iov_base: UnsafeMutableRawPointer(mutating: base), iov_len: length)
            }
            return sendDirectly(UnsafeMutableBufferPointer(rebasing: vecs[0..<count]))
        }
        var admitted: [PendingWrites.Admitted] = []
        if written > 0, state.writes.didWrite(written, admitted: &admitted) == .drained {
            assert(admitted.isEmpty)  // nobody waits while nothing was unwritten
            return false
        }
        return state.writes.requestFlush()
    }

    /// A sender's one nonblocking `sendmsg`: the bytes written, 0 on would-block or an error (the
    /// flush meets the error again and handles it).
    func sendDirectly(_ vecs: UnsafeMutableBufferPointer<iovec>) -> Int {
        var message = msghdr()
        message.msg_iov = vecs.baseAddress
        message.msg_iovlen = numericCast(vecs.count)
        guard case .success(let written) = retryingInterrupts({ sendmsg(fd.rawValue, &message, Int32(MSG_NOSIGNAL)) })
        else { return 0 }
        if written > 0 { configuration.metrics?.bytesOut.increment(by: written) }
        return written
    }

    func scheduleFlush() { queue.async { self.flush() } }

    /// Writes as much queued output as the socket takes: `sendmsg` with up to 64 buffers. On the
    /// loop. The lock is not held during the system call: other senders keep queuing meanwhile, and
    /// none writes itself while the flush is pending.
    func flush() {
        guard lifecycle.isReading else { return }  // not started, or torn down
        send.withLock { $0.writes.beginFlush() }
        if let secure, secure.receiver != nil { return flushEncrypted(secure) }
        withUnsafeTemporaryAllocation(of: iovec.self, capacity: Self.maxIOVecs) { vecs in flush(using: vecs) }
    }

    private func flush(using vecs: UnsafeMutableBufferPointer<iovec>) {
        while !isClosed {
            var admitted: [PendingWrites.Admitted] = []
            let count = send.withLock { state -> Int in
                let count = state.writes.forEachUnwritten(maxBuffers: vecs.count) { index, base, length in
                    vecs[index] = iovec(iov_base: UnsafeMutableRawPointer(mutating: base), iov_len: length)
                }
                if count == 0 {
                    state.writes.admitIfRoom(&admitted)
                    if admitted.isEmpty { state.writes.flushDone() }
                }
                return count
            }
            if count == 0 {
                if admitted.isEmpty { return drained() }
                resume(admitted)  // their frames are queued now: write them too
                continue
            }
            let result: IOResult<Int>
            do {
                result = try syscall("sendmsg", nonblocking: true) { () -> Int in
                    var message = msghdr()
                    message.msg_iov = vecs.baseAddress
                    message.msg_iovlen = numericCast(count)
                    return sendmsg(fd.rawValue, &message, Int32(MSG_NOSIGNAL))
                }
            } catch {
                return tearDown(Self.reason(for: error))
            }
            guard case .processed(let written) = result else {
                return resumeWriteSource()  // the flush stays pending until the socket is writable
            }
            configuration.metrics?.bytesOut.increment(by: written)
            let drainedNow = send.withLock { state -> Bool in
                guard state.writes.didWrite(written, admitted: &admitted) == .drained, admitted.isEmpty else {
                    return false
                }
                state.writes.flushDone()
                return true
            }
            resume(admitted)
            if drainedNow { return drained() }
        }
    }

    func resume(_ admitted: [PendingWrites.Admitted]) {
        for entry in admitted { entry.waiter(.success(entry.sequence)) }
    }

    /// Everything is written: no write source until the socket is full again; a graceful close
    /// shuts down the write side now.
    func drained() {
        if writeSourceResumed, let writeSource {
            writeSourceResumed = false
            writeSource.suspend()
        }
        perform(lifecycle.outputDrained())
    }

    func resumeWriteSource() {
        guard !writeSourceResumed, readSlot >= 0 else { return }  // no sources before start / after teardown
        let source: any DispatchSourceWrite
        if let writeSource {
            source = writeSource
        } else {
            source = DispatchSource.makeWriteSource(fileDescriptor: fd.rawValue, queue: queue)
            source.setEventHandler { [unowned self] in self.flush() }
            writeSource = source
        }
        writeSourceResumed = true
        source.resume()
    }

    /// Whether frames are still accepted (open, not closing or closed). Any context.
    package var acceptsFrames: Bool { send.withLock { $0.writes.isAccepting } }

    // MARK: Diagnostics

    /// Bytes queued and not yet written. Any context.
    package var queuedBytes: Int { send.withLock { $0.writes.unwrittenBytes } }
    /// The most bytes that were ever queued at once. Any context.
    package var maxQueuedBytes: Int { send.withLock { $0.writes.maxUnwrittenBytes } }
    /// The sequence number the next frame gets. Any context.
    package var nextSequence: UInt64 { send.withLock { $0.writes.nextSequence } }
}
