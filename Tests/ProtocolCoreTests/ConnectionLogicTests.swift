import Testing

import ProtocolCore

/// The connection's lifecycle, deadlines, heartbeat, requests and transfers, with a fake clock.
@Suite struct ConnectionLifecycleTests {
    @Test func gracefulCloseFlushesThenShutsDownThenLingers() {
        var life = ConnectionLifecycle()
        let r1 = life.start()
        #expect(r1)
        let r2 = life.start()
        #expect(!r2)
        #expect(life.closeGracefully(outputEmpty: false) == .stopAccepting)
        #expect(life.state == .closing(nil))
        #expect(life.closeGracefully(outputEmpty: false) == .none)  // idempotent
        #expect(life.outputDrained() == .shutDownWrite)
        #expect(life.state == .halfClosed(nil))
        #expect(life.endOfFile(partialFrameBytes: 0) == .tearDown(.localClose))
        #expect(life.isClosed && life.tearDown(.reset) == .none)
    }

    @Test func nothingQueuedShutsDownAtOnceAndTheLingerEndsIt() {
        var life = ConnectionLifecycle()
        _ = life.start()
        #expect(life.closeGracefully(outputEmpty: true) == .stopAcceptingAndShutDownWrite)
        #expect(life.lingerExpired() == .tearDown(.localClose))
    }

    @Test func thePeersGoodbyeIsTheReasonReported() {
        var life = ConnectionLifecycle()
        _ = life.start()
        _ = life.closeGracefully(reason: .goodbye("bye"), outputEmpty: true)
        #expect(life.endOfFile(partialFrameBytes: 0) == .tearDown(.goodbye("bye")))
    }

    @Test func endOfFileInsideAFrameIsAProtocolError() {
        var life = ConnectionLifecycle()
        _ = life.start()
        guard case .tearDown(.protocolError(let text)) = life.endOfFile(partialFrameBytes: 12) else {
            Issue.record("expected a protocol error")
            return
        }
        #expect(text.contains("12 bytes"))
        var other = ConnectionLifecycle()
        _ = other.start()
        #expect(other.endOfFile(partialFrameBytes: 0) == .tearDown(.closedByPeer))
    }

    @Test func closingBeforeStartTearsDown() {
        var life = ConnectionLifecycle()
        #expect(life.closeGracefully(outputEmpty: true) == .tearDown(.localClose))
        let r3 = life.start()
        #expect(!r3)
    }
}

@Suite struct DeadlinesTests {
    @Test func oneTimerServesEveryDeadline() {
        var deadlines = Deadlines()
        #expect(deadlines.earliest == nil)
        deadlines[.ack] = 500
        deadlines[.handshake] = 300
        deadlines[.request] = 900
        #expect(deadlines.earliest == 300)
        #expect(deadlines.expire(now: 299) == [])
        #expect(deadlines.expire(now: 600) == [.handshake, .ack])
        #expect(deadlines.earliest == 900)
        deadlines[.request] = nil
        #expect(deadlines.earliest == nil)
        deadlines[.ack] = 0  // "now" is still a deadline
        #expect(deadlines.expire(now: 1) == [.ack])
        #expect(deadlines[.heartbeat] == nil)  // coarse kinds live in CoarseDeadlines
    }
}

@Suite struct CoarseDeadlinesTests {
    @Test func aDeadlineMayBeHandledWithinItsSlackAndNoEarlier() {
        var coarse = CoarseDeadlines()
        #expect(coarse.earliest == nil && !coarse.isDue(now: .max))
        let ms: UInt64 = 1_000_000
        coarse.set(.heartbeat, at: 1_000 * ms, slack: 100 * ms)
        coarse.set(.idleCheck, at: 5_000 * ms, slack: 800 * ms)
        #expect(coarse.earliest == 1_000 * ms)
        #expect(!coarse.isDue(now: 900 * ms - 1) && coarse.expire(now: 900 * ms - 1) == [])
        #expect(coarse.isDue(now: 900 * ms))
        // The idle check's window opened at 4,200 ms; the heartbeat's at 900 ms.
        #expect(coarse.expire(now: 4_200 * ms) == [.idleCheck, .heartbeat])
        coarse.set(.linger, at: 10 * ms, slack: 2 * ms + 999)  // slack kept in whole milliseconds
        #expect(!coarse.isDue(now: 8 * ms - 1) && coarse.isDue(now: 8 * ms))
        #expect(coarse.expire(now: 10 * ms) == [.linger])
        #expect(coarse.earliest == nil && coarse[.heartbeat] == nil)
    }

    @Test func slackIsCappedAtASecondAndClearingWorks() {
        var coarse = CoarseDeadlines()
        coarse.set(.heartbeat, at: 10_000_000_000, slack: 5_000_000_000)
        #expect(!coarse.isDue(now: 8_999_999_999))  // a second early at most, not five
        #expect(coarse.isDue(now: 9_000_000_000))
        coarse.set(.heartbeat, at: nil, slack: 0)
        #expect(coarse.earliest == nil)
        coarse.set(.idleCheck, at: 0, slack: 0)  // "now" is still a deadline
        #expect(coarse.expire(now: 1) == [.idleCheck])
        #expect(CoarseDeadlines.holds(.heartbeat) && CoarseDeadlines.holds(.idleCheck) && CoarseDeadlines.holds(.linger))
        #expect(!CoarseDeadlines.holds(.request) && !CoarseDeadlines.holds(.handshake))
    }
}

@Suite struct HeartbeatTests {
    @Test func ownPingGoesAlongWithThePongOnlyWhenDueWithinHalfAnInterval() {
        let beat = Heartbeat(interval: 1_000, timeout: 3_000)
        #expect(beat.pingsAlong(now: 100, due: 600))  // due in 500: along
        #expect(!beat.pingsAlong(now: 100, due: 601))  // due in 501: waits for its time
        #expect(beat.pingsAlong(now: 700, due: 600))  // overdue
        #expect(beat.slack == 125)
        #expect(Heartbeat(interval: 60_000_000_000, timeout: 1).slack == CoarseDeadlines.maxSlack)
    }

    @Test func pingsWhileHeardAndTimesOutWhenSilent() {
        let beat = Heartbeat(interval: 5, timeout: 15)
        #expect(beat.tick(now: 5, lastHeard: 0, readingPaused: false) == .ping)
        #expect(beat.tick(now: 20, lastHeard: 9, readingPaused: false) == .ping)
        #expect(beat.tick(now: 25, lastHeard: 9, readingPaused: false) == .timedOut)
    }

    @Test func pausedReadingIsNotSilence() {
        let beat = Heartbeat(interval: 5, timeout: 15)
        #expect(beat.tick(now: 100, lastHeard: 0, readingPaused: true) == .ping)
    }
}

@Suite struct RequestTrackerTests {
    @Test func aReplyEndsItsRequestAndNothingStaysBehind() {
        var tracker = RequestTracker<Int>()
        let r4 = tracker.add(sequence: 1, typeID: "a", now: 0, timeout: 100, token: 1)
        #expect(r4)
        let r5 = tracker.add(sequence: 2, typeID: "b", now: 10, timeout: 100, token: 2)
        #expect(!r5)
        #expect(tracker.nextDeadline == 100)
        #expect(tracker.reply(to: 1)?.token == 1)
        #expect(tracker.reply(to: 1) == nil)
        #expect(tracker.nextDeadline == 110)
        #expect(tracker.count == 1)
    }

    @Test func timeoutsExpireInDeadlineOrderAndLateRepliesAreRecognized() {
        var tracker = RequestTracker<String>()
        tracker.add(sequence: 5, typeID: "slow", now: 0, timeout: 300, token: "five")
        tracker.add(sequence: 6, typeID: "fast", now: 0, timeout: 100, token: "six")
        tracker.add(sequence: 7, typeID: "mid", now: 0, timeout: 200, token: "seven")
        #expect(tracker.expire(now: 99).isEmpty)
        #expect(tracker.expire(now: 250).map(\.token) == ["six", "seven"])
        #expect(tracker.isAbandoned(6) && tracker.isAbandoned(7) && !tracker.isAbandoned(5))
        #expect(tracker.reply(to: 6) == nil)
        #expect(tracker.cancel(5)?.token == "five")
        #expect(tracker.isAbandoned(5))
        #expect(tracker.expire(now: 1000).isEmpty)
    }

    /// A million requests answered in time with 100 outstanding: the stored deadlines stay bounded
    /// (what a timer per request would not do), and the remembered late ones too.
    @Test func storageStaysBoundedOverAMillionRequests() {
        var tracker = RequestTracker<UInt64>()
        var sequence: UInt64 = 0
        var maxStored = 0
        for round in 0..<10_000 {
            for _ in 0..<100 {
                sequence += 1
                tracker.add(sequence: sequence, typeID: "r", now: UInt64(round), timeout: 10_000_000, token: sequence)
            }
            for answered in (sequence - 99)...sequence { _ = tracker.reply(to: answered) }
            maxStored = max(maxStored, tracker.storedDeadlines)
        }
        #expect(tracker.count == 0)
        #expect(maxStored <= 2 * 100 + 32 + 1)
        for late in 1...3000 as ClosedRange<UInt64> { tracker.abandon(late) }
        #expect(!tracker.isAbandoned(1) && tracker.isAbandoned(3000))
    }

    @Test func removeAllReturnsEveryWaitingRequest() {
        var tracker = RequestTracker<Int>()
        for index in 1...3 { tracker.add(sequence: UInt64(index), typeID: "x", now: 0, timeout: 10, token: index) }
        #expect(tracker.removeAll().map(\.token) == [1, 2, 3])
        #expect(tracker.nextDeadline == nil)
    }
}

@Suite struct TransferReceiverTests {
    static func start(_ id: UInt64, size: UInt64) -> Frame {
        HandshakeStateMachine.jsonFrame(.streamStart, TransferHeader(size: size, metadata: ["name": "f"]))
            .with(sequence: id, typeID: "file")
    }

    @Test func chunksAddUpAndTheEndCompletes() {
        var receiver = TransferReceiver<String>()
        let frame = Self.start(3, size: 10)
        guard case .success(let header) = TransferReceiver<String>.header(of: frame) else {
            Issue.record("header")
            return
        }
        #expect(header.size == 10 && header.metadata == ["name": "f"])
        #expect(receiver.start(frame, header: header, sink: "sink") == nil)
        #expect(receiver.start(frame, header: header, sink: "again") != nil)
        guard case .deliver(let stream, let bytes) = receiver.chunk(Frame(kind: .streamChunk, reference: 3, payload: [1, 2, 3, 4])) else {
            Issue.record("chunk")
            return
        }
        #expect(stream.sink == "sink" && stream.received == 4 && bytes == [1, 2, 3, 4])
        _ = receiver.chunk(Frame(kind: .streamChunk, reference: 3, payload: [UInt8](repeating: 0, count: 6)))
        guard case .completed(let done) = receiver.end(Frame(kind: .streamEnd, reference: 3)) else {
            Issue.record("end")
            return
        }
        #expect(done.received == 10 && receiver.count == 0)
    }

    @Test func violationsAndFailures() {
        var receiver = TransferReceiver<Int>()
        if case .violation = receiver.chunk(Frame(kind: .streamChunk, reference: 9, payload: [1])) {} else {
            Issue.record("unknown stream must be a violation")
        }
        let frame = Self.start(1, size: 2)
        _ = receiver.start(frame, header: TransferHeader(size: 2, metadata: [:]), sink: 1)
        if case .violation(let text) = receiver.chunk(Frame(kind: .streamChunk, reference: 1, payload: [1, 2, 3])) {
            #expect(text.contains("more than the announced 2"))
        } else {
            Issue.record("oversize must be a violation")
        }
        _ = receiver.start(Self.start(2, size: 5), header: TransferHeader(size: 5, metadata: [:]), sink: 2)
        if case .failed(_, let text) = receiver.end(Frame(kind: .streamEnd, reference: 2)) {
            #expect(text.contains("after 0 of 5"))
        } else {
            Issue.record("a short stream must fail")
        }
        if case .failed(_, let text) = receiver.end(Frame(kind: .streamEnd, reference: 1, payload: Array("disk full".utf8))) {
            #expect(text.contains("disk full"))
        } else {
            Issue.record("an abort must fail")
        }
        if case .failure = TransferReceiver<Int>.header(of: Frame(kind: .streamStart, payload: Array("{".utf8))) {} else {
            Issue.record("a malformed header must fail")
        }
    }
}

extension Frame {
    func with(sequence: UInt64, typeID: String) -> Frame {
        var copy = self
        copy.sequence = sequence
        copy.typeID = typeID
        return copy
    }
}
