import CLanmsgAEAD
import Dispatch
import ProtocolCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

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
        var flush = false
        let outcome = send.withLock { state -> Submitted in
            do throws(PendingWrites.Refusal) {
                let (sequence, next) = try state.writes.enqueue(
                    frame, size: size, bypassLimit: bypassLimit, now: now, threadQuiet: threadQuiet)
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
        var flush = false
        let outcome = send.withLock { state -> Result<UInt64, TransportError>? in
            do throws(PendingWrites.Refusal) {
                switch try state.writes.enqueueOrWait(frame, size: size, bypassLimit: bypassLimit, waiter: completion) {
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
        var flush = false
        let outcome = send.withLock { state -> Submitted in
            do throws(PendingWrites.Refusal) {
                switch try state.writes.enqueue(batch: frames, sizes: sizes, now: now) {
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
    private func sendDirectly(_ vecs: UnsafeMutableBufferPointer<iovec>) -> Int {
        var message = msghdr()
        message.msg_iov = vecs.baseAddress
        message.msg_iovlen = numericCast(vecs.count)
        var result: Int
        repeat {
            result = sendmsg(fd.rawValue, &message, Int32(MSG_NOSIGNAL))
        } while result < 0 && errno == EINTR
        let written = max(result, 0)
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

    /// The most plaintext a sender seals and writes itself (larger batches go to the loop's flush).
    static let directSealLimit = 4 * SecureProtocol.maxPlaintext

    /// Version 2's ``writeDirectly(_:maxBuffers:)``: the sender seals its frame with the connection's
    /// sealer, under the lock (nothing else is unwritten and no flush is pending, so the nonce order
    /// is the byte order) and writes it with one `send`. What the socket does not take goes to the
    /// loop's flush as sealed bytes. Returns whether the flush must be scheduled.
    private func sealDirectly(_ state: inout SendState, maxBuffers: Int) -> Bool {
        guard var sealer = state.sealer, state.sealedRemainder.isEmpty, state.writes.headIsRaw == false else {
            return state.writes.requestFlush()
        }
        return withUnsafeTemporaryAllocation(of: lanmsg_span.self, capacity: maxBuffers) { spans -> Bool in
            var used = 0
            var total = 0
            _ = state.writes.forEachUnwritten(maxBuffers: maxBuffers, sameKindOnly: true) { _, base, length in
                spans[used] = lanmsg_span(base: base.assumingMemoryBound(to: UInt8.self), length: length)
                used += 1
                total += length
            }
            guard total > 0, total <= Self.directSealLimit else { return state.writes.requestFlush() }
            let size = Self.sealedSize(total)
            let scratch = ThreadScratch.write.buffer(minimumSize: size)
            do throws(NoiseError) {
                try Self.seal(UnsafeBufferPointer(rebasing: spans[0..<used]), total: total, with: &sealer, into: scratch.baseAddress!)
            } catch {
                return state.writes.requestFlush()  // nothing sealed (the flush meets the error again)
            }
            state.sealer = sealer
            var vec = iovec(iov_base: scratch.baseAddress, iov_len: size)
            let written = withUnsafeMutablePointer(to: &vec) { sendDirectly(UnsafeMutableBufferPointer(start: $0, count: 1)) }
            var admitted: [PendingWrites.Admitted] = []
            let after = state.writes.didWrite(total, admitted: &admitted)
            assert(admitted.isEmpty)  // nobody waits while nothing was unwritten
            if written < size {
                // The socket is full (or failed): the flush writes the rest, and meets any error.
                state.sealedRemainder = Array(UnsafeRawBufferPointer(rebasing: scratch[written..<size]))
                return state.writes.requestFlush()
            }
            return after == .drained ? false : state.writes.requestFlush()
        }
    }

    /// The wire size of `total` plaintext bytes cut into transport messages.
    static func sealedSize(_ total: Int) -> Int {
        let messages = max(1, (total + SecureProtocol.maxPlaintext - 1) / SecureProtocol.maxPlaintext)
        return total + messages * SecureSender.sealedSize(0)
    }

    /// Seals the concatenation of `spans` (`total` bytes) as transport messages of up to
    /// ``SecureProtocol/maxPlaintext`` bytes each, written one after the other at `out` (room for
    /// ``sealedSize(_:)``): no copy of the plaintext first.
    static func seal(
        _ spans: UnsafeBufferPointer<lanmsg_span>, total: Int, with sealer: inout SecureSender, into out: UnsafeMutableRawPointer
    ) throws(NoiseError) {
        var failure: NoiseError?
        withUnsafeTemporaryAllocation(of: lanmsg_span.self, capacity: spans.count + 1) { message in
            var index = 0  // the span being sealed
            var offset = 0  // how much of it is sealed
            var cursor = out
            var left = total
            while left > 0 {
                let size = min(left, SecureProtocol.maxPlaintext)
                var count = 0
                var filled = 0
                while filled < size {
                    let span = spans[index]
                    let take = min(span.length - offset, size - filled)
                    message[count] = lanmsg_span(base: span.base! + offset, length: take)
                    count += 1
                    filled += take
                    offset += take
                    if offset == span.length {
                        index += 1
                        offset = 0
                    }
                }
                do throws(NoiseError) {
                    try sealer.seal(UnsafeBufferPointer(rebasing: message[0..<count]), plaintextCount: size, into: cursor)
                } catch {
                    failure = error
                    return
                }
                cursor += SecureSender.sealedSize(size)
                left -= size
            }
        }
        if let failure { throw failure }
    }

    /// Version 2's flush: takes up to about 1 MiB of queued frames, seals it into transport messages
    /// straight from the queued buffers (raw handshake bytes still queued go as they are), writes,
    /// repeats.
    private func flushEncrypted(_ secure: SecureState) {
        while !isClosed {
            if !secure.sealedPending {
                guard refillSealed(secure) else { return }
                continue
            }
            let result: IOResult<Int>
            do {
                // send with MSG_NOSIGNAL, not write: a peer that reset the connection must give
                // EPIPE, not a SIGPIPE that kills the process.
                result = try syscall("send", nonblocking: true) { () -> Int in
                    Glibc.send(
                        fd.rawValue, secure.sealedStorage!.baseAddress! + secure.sealedOffset,
                        secure.sealedCount - secure.sealedOffset, Int32(MSG_NOSIGNAL))
                }
            } catch {
                return tearDown(Self.reason(for: error))
            }
            guard case .processed(let written) = result else { return resumeWriteSource() }
            configuration.metrics?.bytesOut.increment(by: written)
            secure.sealedOffset += written
        }
    }

    /// Fills `secure`'s sealed bytes: a sender's unwritten remainder, raw handshake bytes, or up to
    /// 1 MiB of queued frames sealed with the sealer (taken out of the send state while it seals,
    /// outside the lock: only the flush consumes queued buffers, so they stay put). False when
    /// there is nothing more (drained) or the connection closed.
    private func refillSealed(_ secure: SecureState) -> Bool {
        let budget = 16 * SecureProtocol.maxPlaintext
        return withUnsafeTemporaryAllocation(of: lanmsg_span.self, capacity: Self.maxIOVecs) { spans -> Bool in
            var admitted: [PendingWrites.Admitted] = []
            var used = 0
            var total = 0
            var sealer: SecureSender?
            var filled = false  // bytes to write as they are are in `secure`'s storage
            let drainedNow = send.withLock { state -> Bool in
                if !state.sealedRemainder.isEmpty {
                    state.sealedRemainder.withUnsafeBytes { secure.hold(CollectionOfOne($0)) }
                    state.sealedRemainder = []
                    filled = true
                    return false
                }
                let raw = state.writes.headIsRaw ?? false
                _ = state.writes.forEachUnwritten(maxBuffers: Self.maxIOVecs, sameKindOnly: true) { _, base, length in
                    let take = min(length, budget - total)
                    guard take > 0 else { return }
                    spans[used] = lanmsg_span(base: base.assumingMemoryBound(to: UInt8.self), length: take)
                    used += 1
                    total += take
                }
                if total > 0 {
                    if raw {
                        secure.hold(spans[0..<used].lazy.map { UnsafeRawBufferPointer(start: $0.base, count: $0.length) })
                        _ = state.writes.didWrite(total, admitted: &admitted)
                        filled = true
                    } else {
                        sealer = state.sealer
                        state.sealer = nil
                    }
                    return false
                }
                state.writes.admitIfRoom(&admitted)
                if admitted.isEmpty { state.writes.flushDone() }
                return admitted.isEmpty
            }
            if filled {
                resume(admitted)
                return true
            }
            guard total > 0 else {
                resume(admitted)
                if drainedNow {
                    secure.releaseSealed()  // idle: hold no storage
                    drained()
                }
                return !drainedNow
            }
            guard var sealing = sealer else {
                tearDown(.protocolError("cannot encrypt: the transport has no sealer"))
                return false
            }
            let size = Self.sealedSize(total)
            do throws(NoiseError) {
                try Self.seal(UnsafeBufferPointer(rebasing: spans[0..<used]), total: total, with: &sealing, into: secure.sealedSpace(size))
            } catch {
                tearDown(.protocolError("cannot encrypt: \(error)"))
                return false
            }
            send.withLock { state in
                state.sealer = sealing
                _ = state.writes.didWrite(total, admitted: &admitted)
            }
            resume(admitted)
            secure.sealedOffset = 0
            secure.sealedCount = size
            return true
        }
    }

    private func resume(_ admitted: [PendingWrites.Admitted]) {
        for entry in admitted { entry.waiter(.success(entry.sequence)) }
    }

    /// Everything is written: no write source until the socket is full again; a graceful close
    /// shuts down the write side now.
    private func drained() {
        if writeSourceResumed, let writeSource {
            writeSourceResumed = false
            writeSource.suspend()
        }
        perform(lifecycle.outputDrained())
    }

    private func resumeWriteSource() {
        guard !writeSourceResumed, readSource != nil else { return }  // no sources before start / after teardown
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
