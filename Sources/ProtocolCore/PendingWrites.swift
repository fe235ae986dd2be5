/// Bytes waiting to be written: one allocation holding a whole encoded frame (or only its header),
/// or a large payload array written in place (no copy; its own buffer).
package final class WireBuffer {
    /// Payloads at least this large are not copied into the frame's buffer.
    package static let inPlacePayloadThreshold = 16 * 1024

    package let base: UnsafeRawPointer
    package let count: Int
    /// Bytes that go to the socket as they are (the preamble and handshake messages of version 2),
    /// not frames to encrypt.
    package let raw: Bool
    private let owned: UnsafeMutableRawBufferPointer?
    private let payload: [UInt8]?

    /// The whole frame (`includePayload`) or everything but its payload, in one allocation.
    init(frame: Frame, size: Int, includePayload: Bool) {
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 8)
        frame.write(into: bytes, includePayload: includePayload)
        owned = bytes
        payload = nil
        base = UnsafeRawPointer(bytes.baseAddress!)
        count = size
        raw = false
    }

    /// A payload written from the array's own storage (or raw bytes, `raw`). The array is kept
    /// alive and never mutated, so its storage (and `base`) stays valid for this object's lifetime.
    init(payload: [UInt8], raw: Bool = false) {
        self.payload = payload
        owned = nil
        base = payload.withUnsafeBytes { UnsafeRawPointer($0.baseAddress!) }
        count = payload.count
        self.raw = raw
    }

    deinit { owned?.deallocate() }
}

/// The outbound side of a connection, without I/O: numbers frames in the order they are queued,
/// encodes them into buffers, hands out the unwritten bytes (as many buffers as one vectored write
/// takes), accounts for partial writes, and keeps senders that must wait for room (FIFO) — one
/// structure for the direct write of a sender, a batch and the loop's flush.
///
/// Flow control: a sender may queue while at most ``highWaterMark`` bytes are unwritten; beyond
/// that it waits, and waiting senders are admitted, in order, once the unwritten bytes drop to
/// ``lowWaterMark``. While anyone waits, nobody overtakes them.
///
/// Who writes: the driver calls ``enqueue(_:size:bypassLimit:now:threadQuiet:)``, which says
/// whether the caller should write at once itself (nothing was unwritten and the sender is not
/// streaming: lowest latency), or schedule one flush on the loop (the first frame since the last
/// flush; later ones ride along), or nothing. Sequence numbers therefore always match the order of
/// the bytes on the wire.
///
/// Not thread-safe: the driver keeps it under one lock. Not generic on purpose: the driver calls it
/// for every frame from another module, where an unspecialized generic would cost metadata lookups.
package struct PendingWrites {
    /// A sender waiting for room: called with its frame's sequence number once admitted, or the error.
    package typealias Waiter = (Result<UInt64, TransportError>) -> Void

    /// What a sender should do after queuing.
    package enum Next: Equatable {
        /// Nothing was unwritten before and the sender is not streaming: write now, from this thread.
        case writeNow
        /// The first frame since the last flush: schedule one flush on the connection's loop.
        case scheduleFlush
        /// A flush is already scheduled (or the loop is waiting for the socket): it takes this frame along.
        case none
    }

    /// Why a frame was not queued.
    package enum Refusal: Error, Equatable {
        /// The frame is larger than the peer accepts (its `max_frame`): it must never be sent.
        case tooLarge(size: Int, limit: Int)
        /// Above the high-water mark, or senders are waiting: wait (``enqueueOrWait(_:size:bypassLimit:waiter:)``).
        case full
        /// The connection no longer accepts frames (not started, closing or closed).
        case closed
    }

    /// A sender that waited, now admitted: resume it with the sequence number of its frame.
    package struct Admitted {
        package let waiter: Waiter
        package let sequence: UInt64
    }

    // Field order and widths matter for memory (benchmark W5, idle connections): this struct
    // sits in every connection's send state. Word-sized fields first, then 32-bit ones (indexes,
    // marks and the peer's limit fit; their `Int` views are below), then the flags.
    private var buffers: [WireBuffer] = []
    private var sizes: [Int] = []
    private var waiters: [(frame: Frame, size: Int, waiter: Waiter)] = []
    /// Bytes of `buffers[head]` already written.
    private var headOffset = 0
    /// Bytes queued and not yet written.
    package private(set) var unwrittenBytes = 0
    /// The largest value ``unwrittenBytes`` had (tests of the bounded queue).
    package private(set) var maxUnwrittenBytes = 0
    /// The number the next queued frame gets (the first frame is 1).
    package private(set) var nextSequence: UInt64 = 1
    /// When a frame was last queued (uptime nanoseconds).
    private var lastEnqueue: UInt64 = 0
    private let storedHighWaterMark: UInt32
    private let storedLowWaterMark: UInt32
    private var storedHead: UInt32 = 0
    private var storedWaitersHead: UInt32 = 0
    /// Whether frames are accepted (the connection is open).
    package private(set) var isAccepting = false
    /// A flush is scheduled on the loop, or the loop waits for the socket to become writable.
    package private(set) var flushPending = false

    /// Senders wait while more than this many bytes are unwritten (at most 4 GiB).
    package var highWaterMark: Int { Int(storedHighWaterMark) }
    /// Waiting senders are admitted once the unwritten bytes drop to this.
    package var lowWaterMark: Int { Int(storedLowWaterMark) }
    /// A sender that queues again within this many nanoseconds is streaming: its frames are written
    /// in batches by the loop rather than one by one from the sender's thread.
    package static var streamingGap: UInt64 { 20_000 }
    private var head: Int {
        get { Int(storedHead) }
        set { storedHead = UInt32(newValue) }
    }
    private var waitersHead: Int {
        get { Int(storedWaitersHead) }
        set { storedWaitersHead = UInt32(newValue) }
    }
    package init(highWaterMark: Int, lowWaterMark: Int) {
        storedHighWaterMark = UInt32(clamping: highWaterMark)
        storedLowWaterMark = UInt32(clamping: min(lowWaterMark, highWaterMark))
    }

    /// Whether every queued byte is written.
    package var isEmpty: Bool { unwrittenBytes == 0 }
    /// Senders waiting for room.
    package var waitingCount: Int { waiters.count - waitersHead }

    // MARK: Opening and closing

    /// Starts accepting frames.
    package mutating func open() { isAccepting = true }

    /// Stops accepting frames (a graceful close flushes what is queued); returns the waiting
    /// senders, to be failed.
    package mutating func stopAccepting() -> [Waiter] {
        isAccepting = false
        return takeWaiters()
    }

    /// Drops everything (the connection is torn down); returns the waiting senders, to be failed.
    package mutating func discardAll() -> [Waiter] {
        isAccepting = false
        buffers = []
        sizes = []
        head = 0
        headOffset = 0
        unwrittenBytes = 0
        flushPending = false
        return takeWaiters()
    }

    private mutating func takeWaiters() -> [Waiter] {
        let taken = waiters[waitersHead...].map(\.waiter)
        waiters = []
        waitersHead = 0
        return taken
    }

    // MARK: Queuing

    /// Queues `frame` (numbering it) when the connection is open, nobody waits and — unless
    /// `bypassLimit` — at most the high-water mark is unwritten.
    /// - Parameters:
    ///   - size: The frame's encoded size (``Frame/validatedSize(_:)``).
    ///   - limit: The largest frame body the peer accepts (the connection holds it).
    ///   - now: The current uptime in nanoseconds.
    ///   - threadQuiet: The sending thread queued nothing on any connection within ``streamingGap``
    ///     (a broadcast loop sends to many connections back to back: each connection sees a gap,
    ///     the thread does not).
    /// - Returns: The frame's sequence number and what the caller does next.
    package mutating func enqueue(
        _ frame: Frame, size: Int, limit: Int = .max, bypassLimit: Bool = false, now: UInt64 = 0,
        threadQuiet: Bool = false
    ) throws(Refusal) -> (sequence: UInt64, next: Next) {
        guard isAccepting else { throw .closed }
        guard size - 4 <= limit else { throw .tooLarge(size: size - 4, limit: limit) }
        guard waitingCount == 0, bypassLimit || unwrittenBytes <= highWaterMark else { throw .full }
        let wasEmpty = unwrittenBytes == 0
        let streaming = now &- lastEnqueue < PendingWrites.streamingGap
        lastEnqueue = now
        let sequence = append(frame, size: size)
        if wasEmpty && !flushPending && !streaming && threadQuiet { return (sequence, .writeNow) }
        return (sequence, claimFlush())
    }

    /// Queues several frames as one batch, numbered consecutively, when the connection is open,
    /// nobody waits, at most the high-water mark is unwritten and the batch itself is not larger
    /// than the mark (so the queue exceeds the mark by at most one batch).
    package mutating func enqueue(batch frames: [Frame], sizes frameSizes: [Int], limit: Int = .max, now: UInt64 = 0)
        throws(Refusal) -> Next
    {
        guard isAccepting else { throw .closed }
        if let largest = frameSizes.max(), largest - 4 > limit {
            throw .tooLarge(size: largest - 4, limit: limit)
        }
        let total = frameSizes.reduce(0, +)
        guard waitingCount == 0, unwrittenBytes <= highWaterMark, total <= highWaterMark else { throw .full }
        let wasEmpty = unwrittenBytes == 0
        lastEnqueue = now
        for index in frames.indices { _ = append(frames[index], size: frameSizes[index]) }
        if wasEmpty && !flushPending { return .writeNow }
        return claimFlush()
    }

    /// The outcome of ``enqueueOrWait(_:size:bypassLimit:waiter:)``.
    package enum Queued {
        /// Queued with this sequence number; the caller does `next`.
        case queued(sequence: UInt64, next: Next)
        /// The sender waits: the loop's flush admits it (``didWrite(_:admitted:)``) or the close fails it.
        case waiting
    }

    /// Queues `frame` if it may go now; else keeps `waiter` with the frame until room is made
    /// (FIFO). Only the loop's flush admits waiters.
    package mutating func enqueueOrWait(
        _ frame: Frame, size: Int, limit: Int = .max, bypassLimit: Bool = false, waiter: @escaping Waiter
    ) throws(Refusal) -> Queued {
        guard isAccepting else { throw .closed }
        guard size - 4 <= limit else { throw .tooLarge(size: size - 4, limit: limit) }
        if bypassLimit || (waitingCount == 0 && unwrittenBytes <= highWaterMark) {
            let sequence = append(frame, size: size)
            return .queued(sequence: sequence, next: claimFlush())
        }
        waiters.append((frame, size, waiter))
        return .waiting
    }

    /// After a sender's own write left bytes unwritten: whether the caller must schedule the loop's
    /// flush (true unless one is pending already).
    package mutating func requestFlush() -> Bool { claimFlush() == .scheduleFlush }

    /// Queues bytes that go to the socket unchanged (version 2's preamble and handshake messages,
    /// written before any frame). Never written by the sender itself: the caller schedules the flush
    /// when told to.
    package mutating func enqueueRaw(_ bytes: [UInt8]) throws(Refusal) -> Next {
        guard isAccepting else { throw .closed }
        guard !bytes.isEmpty else { return .none }
        buffers.append(WireBuffer(payload: bytes, raw: true))
        sizes.append(bytes.count)
        unwrittenBytes += bytes.count
        maxUnwrittenBytes = max(maxUnwrittenBytes, unwrittenBytes)
        return claimFlush()
    }

    /// Whether the next unwritten buffer is raw (nil when nothing is unwritten).
    package var headIsRaw: Bool? { head < buffers.count ? buffers[head].raw : nil }

    private mutating func claimFlush() -> Next {
        if flushPending { return .none }
        flushPending = true
        return .scheduleFlush
    }

    private mutating func append(_ frame: Frame, size: Int) -> UInt64 {
        var frame = frame
        frame.sequence = nextSequence
        nextSequence &+= 1
        if frame.payload.count >= WireBuffer.inPlacePayloadThreshold {
            let header = size - frame.payload.count
            buffers.append(WireBuffer(frame: frame, size: header, includePayload: false))
            sizes.append(header)
            buffers.append(WireBuffer(payload: frame.payload))
            sizes.append(frame.payload.count)
        } else {
            buffers.append(WireBuffer(frame: frame, size: size, includePayload: true))
            sizes.append(size)
        }
        unwrittenBytes += size
        maxUnwrittenBytes = max(maxUnwrittenBytes, unwrittenBytes)
        return frame.sequence
    }

    // MARK: Writing

    /// Calls `body` with the start and length of each unwritten buffer, in order, at most
    /// `maxBuffers` of them (the first one without its already written part); returns how many.
    /// `sameKindOnly`: stop at the first buffer that is not raw when the first is, or the other way
    /// round (frames to encrypt and raw bytes are written separately). The memory stays valid until
    /// the next mutating call.
    package func forEachUnwritten(
        maxBuffers: Int, sameKindOnly: Bool = false, _ body: (Int, UnsafeRawPointer, Int) -> Void
    ) -> Int {
        var index = head
        var count = 0
        let kind = head < buffers.count ? buffers[head].raw : false
        while index < buffers.count && count < maxBuffers {
            if sameKindOnly && buffers[index].raw != kind { break }
            let skip = index == head ? headOffset : 0
            body(count, buffers[index].base + skip, sizes[index] - skip)
            index += 1
            count += 1
        }
        return count
    }

    /// What is left after a write.
    package enum AfterWrite: Equatable {
        /// Everything is written.
        case drained
        /// Bytes remain: write again (or wait for the socket when it would block).
        case more
    }

    /// Accounts for `written` bytes that the socket took, from the start of the unwritten bytes;
    /// admits waiting senders (in order, while room lasts) once at most the low-water mark is
    /// unwritten. Releases the storage when everything is written.
    package mutating func didWrite(_ written: Int, admitted: inout [Admitted]) -> AfterWrite {
        var remaining = written
        unwrittenBytes -= written
        while remaining > 0 {
            let left = sizes[head] - headOffset
            if remaining >= left {
                remaining -= left
                head += 1
                headOffset = 0
            } else {
                headOffset += remaining
                remaining = 0
            }
        }
        if head == buffers.count {
            // Released, not kept: an idle connection then holds no output storage.
            buffers = []
            sizes = []
            head = 0
        } else if head > 256 && head * 2 > buffers.count {
            buffers.removeSubrange(0..<head)
            sizes.removeSubrange(0..<head)
            head = 0
        }
        admitWaiters(into: &admitted)
        return unwrittenBytes == 0 ? .drained : .more
    }

    private mutating func admitWaiters(into admitted: inout [Admitted]) {
        guard waitersHead < waiters.count, unwrittenBytes <= lowWaterMark, isAccepting else { return }
        while waitersHead < waiters.count && unwrittenBytes <= highWaterMark {
            let entry = waiters[waitersHead]
            waitersHead += 1
            admitted.append(Admitted(waiter: entry.waiter, sequence: append(entry.frame, size: entry.size)))
        }
        if waitersHead == waiters.count {
            waiters = []
            waitersHead = 0
        }
    }

    /// The loop's flush starts: until everything is written, senders do not write themselves.
    package mutating func beginFlush() { flushPending = true }

    /// The loop's flush found the socket full: the flush stays pending until the socket is writable.
    /// When it found everything written, ``didWrite(_:admitted:)`` returned `.drained`: call
    /// ``flushDone()``.
    package mutating func flushDone() {
        if unwrittenBytes == 0 { flushPending = false }
    }

    /// Admits waiting senders now if there is room (when a flush had nothing to write).
    package mutating func admitIfRoom(_ admitted: inout [Admitted]) { admitWaiters(into: &admitted) }
}
