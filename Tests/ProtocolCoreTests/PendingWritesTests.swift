import Testing

import ProtocolCore

/// The outbound queue with plain bytes: numbering, who writes, partial writes, water marks.
@Suite struct PendingWritesTests {
    typealias Writes = PendingWrites

    /// Waiters that record their name when called.
    final class Log: @unchecked Sendable {
        var names: [String] = []
        func waiter(_ name: String) -> Writes.Waiter { { _ in self.names.append(name) } }
        /// Calls `waiters` and returns their names, in order.
        func names(of waiters: [Writes.Waiter]) -> [String] {
            names = []
            for waiter in waiters { waiter(.success(0)) }
            return names
        }
    }

    static func frame(_ text: String, payload: Int = 0) -> (Frame, Int) {
        let frame = Frame(kind: .message, codecID: 0, typeID: text, payload: [UInt8](repeating: 7, count: payload))
        return (frame, try! Frame.validatedSize(frame))
    }

    /// The unwritten bytes, as one array (what a vectored write would send).
    static func unwritten(_ writes: Writes, maxBuffers: Int = 64) -> [UInt8] {
        var out: [UInt8] = []
        _ = writes.forEachUnwritten(maxBuffers: maxBuffers) { _, base, count in
            out += UnsafeRawBufferPointer(start: base, count: count)
        }
        return out
    }

    @Test func closedQueueRefuses() {
        var writes = Writes(highWaterMark: 100, lowWaterMark: 10)
        let (frame, size) = Self.frame("a")
        #expect(throws: Writes.Refusal.closed) { _ = try writes.enqueue(frame, size: size) }
        writes.open()
        #expect((try? writes.enqueue(frame, size: size))?.sequence == 1)
        _ = writes.stopAccepting()
        #expect(throws: Writes.Refusal.closed) { _ = try writes.enqueue(frame, size: size) }
    }

    @Test func framesAreNumberedInQueueOrderAndEncodedOnTheWire() throws {
        var writes = Writes(highWaterMark: 1 << 20, lowWaterMark: 1 << 18)
        writes.open()
        var expected: [UInt8] = []
        for index in 0..<5 {
            let (frame, size) = Self.frame("t\(index)", payload: index * 10)
            let (sequence, _) = try writes.enqueue(frame, size: size)
            #expect(sequence == UInt64(index + 1))
            var numbered = frame
            numbered.sequence = sequence
            expected += try numbered.encoded()
        }
        // A large payload travels in its own buffer (no copy): still the same bytes.
        let (big, bigSize) = Self.frame("big", payload: WireBuffer.inPlacePayloadThreshold)
        let (bigSequence, _) = try writes.enqueue(big, size: bigSize)
        var numbered = big
        numbered.sequence = bigSequence
        expected += try numbered.encoded()
        #expect(Self.unwritten(writes) == expected)
        #expect(writes.unwrittenBytes == expected.count)
        #expect(writes.forEachUnwritten(maxBuffers: 64) { _, _, _ in } == 7)
    }

    @Test func anIdleQuietSenderWritesItselfAStreamingOneSchedulesOneFlush() throws {
        var writes = Writes(highWaterMark: 1 << 20, lowWaterMark: 1 << 18)
        writes.open()
        let (frame, size) = Self.frame("a")
        let gap = Writes.streamingGap
        // Idle, quiet thread, long since the last send: write now.
        #expect(try writes.enqueue(frame, size: size, now: 10 * gap, threadQuiet: true).next == .writeNow)
        var admitted: [Writes.Admitted] = []
        #expect(writes.didWrite(size, admitted: &admitted) == .drained)
        // Again within the streaming gap: the loop flushes (once), later frames ride along.
        #expect(try writes.enqueue(frame, size: size, now: 10 * gap + 1, threadQuiet: true).next == .scheduleFlush)
        #expect(try writes.enqueue(frame, size: size, now: 10 * gap + 2, threadQuiet: true).next == .none)
        // A busy thread (broadcast loop) never writes itself.
        var other = Writes(highWaterMark: 1 << 20, lowWaterMark: 1 << 18)
        other.open()
        #expect(try other.enqueue(frame, size: size, now: 10 * gap, threadQuiet: false).next == .scheduleFlush)
    }

    @Test func partialWritesAdvanceThroughBuffers() throws {
        var writes = Writes(highWaterMark: 1 << 20, lowWaterMark: 1 << 18)
        writes.open()
        for index in 0..<3 {
            let (frame, size) = Self.frame("x\(index)", payload: 100)
            _ = try writes.enqueue(frame, size: size)
        }
        let all = Self.unwritten(writes)
        var admitted: [Writes.Admitted] = []
        var offset = 0
        for step in [1, 50, 70, 3, 200] where offset < all.count {
            let written = min(step, all.count - offset)
            _ = writes.didWrite(written, admitted: &admitted)
            offset += written
            #expect(Self.unwritten(writes) == Array(all[offset...]))
        }
        #expect(writes.didWrite(all.count - offset, admitted: &admitted) == .drained)
        #expect(writes.isEmpty && writes.forEachUnwritten(maxBuffers: 64) { _, _, _ in } == 0)
    }

    @Test func waitersAreAdmittedInOrderBelowTheLowWaterMark() throws {
        var writes = Writes(highWaterMark: 300, lowWaterMark: 100)
        writes.open()
        let (frame, size) = Self.frame("w", payload: 183)  // 200 bytes each
        #expect(size == 200)
        _ = try writes.enqueue(frame, size: size)
        _ = try writes.enqueue(frame, size: size)  // 400 > 300 now
        #expect(throws: Writes.Refusal.full) { _ = try writes.enqueue(frame, size: size) }
        let log = Log()
        for name in ["first", "second", "third"] {
            guard case .waiting = try writes.enqueueOrWait(frame, size: size, waiter: log.waiter(name)) else {
                Issue.record("\(name) should wait")
                return
            }
        }
        // Nobody overtakes the waiters, not even below the mark.
        var admitted: [Writes.Admitted] = []
        _ = writes.didWrite(150, admitted: &admitted)  // 250 left: above the low-water mark
        #expect(admitted.isEmpty)
        #expect(throws: Writes.Refusal.full) { _ = try writes.enqueue(frame, size: size) }
        _ = writes.didWrite(200, admitted: &admitted)  // 50 left: admit while ≤ 300
        #expect(log.names(of: admitted.map(\.waiter)) == ["first", "second"])
        #expect(admitted.map(\.sequence) == [3, 4])
        #expect(writes.waitingCount == 1)
        // Control frames bypass the limit (and the waiters).
        let bypass = try writes.enqueueOrWait(frame, size: size, bypassLimit: true, waiter: log.waiter("pong"))
        guard case .queued(let sequence, _) = bypass else {
            Issue.record("a bypassing frame must not wait")
            return
        }
        #expect(sequence == 5)
        #expect(log.names(of: writes.stopAccepting()) == ["third"])
        #expect(writes.maxUnwrittenBytes <= 300 + 2 * 200 + 200)
    }

    @Test func batchesAreNumberedTogetherAndBoundedByTheMark() throws {
        var writes = Writes(highWaterMark: 1000, lowWaterMark: 100)
        writes.open()
        let pairs = (0..<4).map { Self.frame("b\($0)") }
        #expect(try writes.enqueue(batch: pairs.map(\.0), sizes: pairs.map(\.1)) == .writeNow)
        #expect(writes.nextSequence == 5)
        let huge = (0..<100).map { Self.frame("h\($0)", payload: 20) }
        #expect(throws: Writes.Refusal.full) {
            _ = try writes.enqueue(batch: huge.map(\.0), sizes: huge.map(\.1))
        }
        #expect(writes.nextSequence == 5)  // nothing of a refused batch is numbered
    }

    @Test func theFlushStaysPendingUntilEverythingIsWritten() throws {
        var writes = Writes(highWaterMark: 1 << 20, lowWaterMark: 1 << 18)
        writes.open()
        let (frame, size) = Self.frame("f")
        #expect(try writes.enqueue(frame, size: size).next == .scheduleFlush)
        // The flush wrote part; the socket was full: still pending (the loop waits for writability).
        var admitted: [Writes.Admitted] = []
        #expect(writes.didWrite(3, admitted: &admitted) == .more)
        writes.flushDone()
        #expect(writes.flushPending)
        #expect(try writes.enqueue(frame, size: size).next == .none)
        #expect(writes.didWrite(2 * size - 3, admitted: &admitted) == .drained)
        writes.flushDone()
        #expect(!writes.flushPending)
        // A sender's own write that left bytes: it requests the flush once.
        _ = try writes.enqueue(frame, size: size, now: 1 << 40, threadQuiet: true)
        let r1 = writes.requestFlush()
        #expect(r1)
        let r2 = writes.requestFlush()
        #expect(!r2)
    }

    @Test func discardDropsEverythingAndFailsWaiters() throws {
        var writes = Writes(highWaterMark: 10, lowWaterMark: 5)
        writes.open()
        let (frame, size) = Self.frame("d")
        _ = try writes.enqueue(frame, size: size)
        let log = Log()
        _ = try writes.enqueueOrWait(frame, size: size, waiter: log.waiter("w"))
        #expect(log.names(of: writes.discardAll()) == ["w"])
        #expect(writes.isEmpty && !writes.flushPending && !writes.isAccepting)
    }
}
