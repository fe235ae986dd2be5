import FastJSON
import Testing

import ProtocolCore

/// The session core without sockets: numbering, acknowledgement, resume and restart, the inbox's
/// acknowledgement pacing, and the RTT estimator.
@Suite struct SessionCoreTests {
    @Test func outboxNumbersKeepsAndReleases() {
        var outbox = SessionOutbox<String>(maxCount: 3, maxBytes: 100)
        let r1 = outbox.append("a", size: 10, transmitted: true)
        #expect(r1 == 1)
        let r2 = outbox.append("b", size: 10, transmitted: true)
        #expect(r2 == 2)
        let r3 = outbox.append("c", size: 10, transmitted: false)
        #expect(r3 == 3)
        #expect(!outbox.hasRoom(for: 1))  // three kept: a fourth waits
        let r4 = outbox.acknowledge(through: 2)
        #expect(r4 == 2)
        #expect(outbox.acknowledged == 2)
        #expect(outbox.count == 1 && outbox.bytes == 10)
        #expect(outbox.hasRoom(for: 90))
        #expect(!outbox.hasRoom(for: 91))
        let r5 = outbox.acknowledge(through: 1)
        #expect(r5 == 0)  // stale: nothing more
        let r6 = outbox.acknowledge(through: 4)
        #expect(r6 == nil)  // beyond what was sent: a violation
    }

    @Test func aLargeMessageIsAdmittedAlone() {
        var outbox = SessionOutbox<Int>(maxCount: 10, maxBytes: 100)
        #expect(outbox.hasRoom(for: 1_000))
        outbox.append(1, size: 1_000, transmitted: true)
        #expect(!outbox.hasRoom(for: 1))
    }

    @Test func resumeResendsExactlyWhatThePeerMissed() throws {
        var outbox = SessionOutbox<Int>(maxCount: 100, maxBytes: 1 << 20)
        for n in 1...10 { outbox.append(n, size: 1, transmitted: n <= 7) }
        _ = outbox.acknowledge(through: 3)
        let resumed = outbox.resume(peerReceived: 5)
        let resend = try #require(resumed)
        #expect(resend.map(\.number) == [6, 7, 8, 9, 10])
        #expect(resend.allSatisfy { $0.transmitted })
        #expect(outbox.acknowledged == 5)
        // A peer claiming less than it acknowledged lost its state; more than was sent is a lie.
        let r7 = outbox.resume(peerReceived: 4)
        #expect(r7 == nil)
        let r8 = outbox.resume(peerReceived: 11)
        #expect(r8 == nil)
    }

    @Test func restartReportsTransmittedAndKeepsTheRest() {
        var outbox = SessionOutbox<String>(maxCount: 100, maxBytes: 1 << 20)
        outbox.append("sent-1", size: 1, transmitted: true)
        outbox.append("sent-2", size: 1, transmitted: true)
        _ = outbox.acknowledge(through: 1)
        outbox.append("typed-offline", size: 1, transmitted: false)
        let (lost, kept) = outbox.restart()
        #expect(lost.map(\.item) == ["sent-2"])
        #expect(lost.map(\.number) == [2])
        #expect(kept.map(\.item) == ["typed-offline"])
        #expect(kept.map(\.number) == [1])  // renumbered in the new session
        #expect(outbox.nextNumber == 2 && outbox.count == 1)
    }

    /// Only what the app handled is acknowledged: every `ackEvery` at once, otherwise by the
    /// deadline (armed once); an ACK sent by count leaves the deadline armed.
    @Test func inboxAcknowledgesOnlyWhatWasHandledEveryNOrByTheDeadline() {
        var inbox = SessionInbox(ackEvery: 4)
        let numbers = (0..<5).map { _ in inbox.receive() }
        #expect(numbers == [1, 2, 3, 4, 5])
        let r1 = inbox.ackStep()
        #expect(r1 == .nothing, "arrived is not handled")
        let r2 = inbox.takeAck()
        #expect(r2 == nil)
        var steps: [SessionInbox.AckStep] = []
        for number in UInt64(1)...4 {
            let r3 = inbox.handle(number)
            #expect(r3)
            inbox.store(through: number)
            steps.append(inbox.ackStep())
        }
        #expect(steps == [.armDeadline, .nothing, .nothing, .sendNow])
        let r4 = inbox.ackStep()
        #expect(r4 == .nothing, "an ACK is queued already")
        let r5 = inbox.takeAck()
        #expect(r5 == 4)
        let r6 = inbox.takeAck()
        #expect(r6 == nil)
        let r7 = inbox.handle(5)
        #expect(r7)
        inbox.store(through: 5)
        let r8 = inbox.ackStep()
        #expect(r8 == .nothing, "the deadline is still armed")
        inbox.deadlinePassed()
        let r9 = inbox.takeAck()
        #expect(r9 == 5)
        let r10 = inbox.handle(5)
        #expect(!r10, "handled twice: nothing")
        let r11 = inbox.handle(6)
        #expect(!r11, "never delivered: nothing")
    }

    /// Handled out of order: the count advances over what is contiguous; the store holds back what
    /// the peer may hear.
    @Test func inboxHandledOutOfOrderAndStoredAdvanceContiguously() {
        var inbox = SessionInbox(ackEvery: 32)
        for _ in 0..<5 { _ = inbox.receive() }
        let r12 = inbox.handle(3)
        #expect(!r12)
        let r13 = inbox.handle(2)
        #expect(!r13)
        #expect(inbox.handled == 0)
        let r14 = inbox.handle(1)
        #expect(r14)
        #expect(inbox.handled == 3)
        inbox.store(through: 2)  // only 2 are in the store so far
        #expect(inbox.stored == 2)
        inbox.store(through: 9)  // never beyond what was handled
        #expect(inbox.stored == 3)
        let r15 = inbox.takeAck()
        #expect(r15 == 3)
    }

    /// After a reconnect the peer hears what was stored and resends from there: the messages that
    /// waited in the app (delivered, not handled) come again and are recognised, new ones delivered.
    @Test func inboxRecognisesResentMessagesTheAppHasAlready() {
        var inbox = SessionInbox(ackEvery: 32)
        for _ in 0..<6 { _ = inbox.receive() }
        _ = inbox.handle(1)
        _ = inbox.handle(2)
        inbox.store(through: 2)
        let r16 = inbox.reconnected()
        #expect(r16 == 2, "the SESSION frame says 2")
        #expect(!inbox.ackPending)
        let again = (0..<4).map { _ in inbox.receive() }  // the peer resends 3…6
        #expect(again == [nil, nil, nil, nil])
        let r17 = inbox.receive()
        #expect(r17 == 7)
        for number in UInt64(3)...7 { _ = inbox.handle(number) }
        inbox.store(through: 7)
        let r18 = inbox.takeAck()
        #expect(r18 == 7)
        let restored = SessionInbox(restoredThrough: 7)
        #expect(restored.stored == 7 && restored.delivered == 7 && !restored.ackPending)
        inbox.reset()
        #expect(inbox.delivered == 0 && inbox.stored == 0)
    }

    @Test func ackFramesRoundTripAndSessionMessagesAreOneWay() {
        let frame = Frame.ack(0x0102_0304_0506_0708)
        #expect(frame.payload == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(frame.acknowledgedCount == 0x0102_0304_0506_0708)
        #expect(Frame(kind: .ack, payload: [1, 2]).acknowledgedCount == nil)
        #expect(Frame(kind: .message, typeID: "x").isSessionMessage)
        var request = Frame(kind: .message, typeID: "x")
        request.expectsReply = true
        #expect(!request.isSessionMessage)
        #expect(!Frame(kind: .message, typeID: "x", reference: 3).isSessionMessage)
    }

    /// The SESSION and ACK frames of docs/PROTOCOL.md ("Session test vectors", computed from the
    /// spec in Python), byte for byte.
    @Test func documentedSessionVectors() throws {
        func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
        let id = "00112233445566778899aabbccddeeff"
        var client = HandshakeStateMachine.jsonFrame(.session, SessionHello(id: id, received: 4))
        client.sequence = 2
        var server = HandshakeStateMachine.jsonFrame(.session, SessionHello(id: id, received: 7, resumed: true))
        server.sequence = 2
        var ack = Frame.ack(5)
        ack.sequence = 9
        #expect(
            hex(try client.encoded())
                == "000000421401000000000000000000027b226964223a22303031313232333334343535363637373838393961"
                + "6162626363646465656666222c227265636569766564223a347d")
        #expect(
            hex(try server.encoded())
                == "000000511401000000000000000000027b226964223a22303031313232333334343535363637373838393961"
                + "6162626363646465656666222c227265636569766564223a372c22726573756d6564223a747275657d")
        #expect(hex(try ack.encoded()) == "000000141500000000000000000000090000000000000005")
        // With the optional fields (issue 53): the same exchange, epoch token and counts added, keys
        // in alphabetical order.
        let epoch = "ffeeddccbbaa99887766554433221100"
        let withFields = HandshakeStateMachine.jsonFrame(.session, SessionHello(id: id, received: 4, epoch: epoch, sent: 10))
        #expect(String(decoding: withFields.payload, as: UTF8.self) == #"{"epoch":"\#(epoch)","id":"\#(id)","received":4,"sent":10}"#)
        let answer = HandshakeStateMachine.jsonFrame(.session, SessionHello(id: id, received: 7, resumed: true, epoch: epoch, sent: 9))
        #expect(
            String(decoding: answer.payload, as: UTF8.self)
                == #"{"epoch":"\#(epoch)","id":"\#(id)","received":7,"resumed":true,"sent":9}"#)
        // A peer may send them in any order, or not at all.
        let parsed = try Array(#"{"sent":3,"received":1,"id":"\#(id)","epoch":"\#(epoch)"}"#.utf8).withUnsafeBytes {
            try FastJSONDecoder().decode(SessionHello.self, from: $0)
        }
        #expect(parsed == SessionHello(id: id, received: 1, epoch: epoch, sent: 3) && parsed.isWellFormed)
    }

    @Test func sessionHelloIsCheckedAndKeepsItsShape() throws {
        #expect(SessionHello(id: String(repeating: "a1", count: 16), received: 0).isWellFormed)
        #expect(!SessionHello(id: "A1", received: 0).isWellFormed)
        #expect(!SessionHello(id: String(repeating: "g", count: 32), received: 0).isWellFormed)
        #expect(!SessionHello(id: String(repeating: "a1", count: 16), received: 0, epoch: "xyz").isWellFormed)
    }

    @Test func rttFollowsRFC6298() {
        var rtt = RTTEstimator()
        rtt.pingSent(sequence: 7, now: 1_000_000)
        let r15 = rtt.pongReceived(reference: 6, now: 2_000_000)
        #expect(!r15)  // not our ping
        let r16 = rtt.pongReceived(reference: 7, now: 3_000_000)
        #expect(r16)  // 2 ms
        #expect(rtt.smoothedMicros == 2_000 && rtt.variationMicros == 1_000)
        let r17 = rtt.pongReceived(reference: 7, now: 4_000_000)
        #expect(!r17)  // answered already
        rtt.pingSent(sequence: 9, now: 10_000_000)
        let r18 = rtt.pongReceived(reference: 9, now: 10_000_000 + 10_000_000)
        #expect(r18)  // 10 ms
        // SRTT = 7/8·2000 + 1/8·10000 = 3000; RTTVAR = 3/4·1000 + 1/4·8000 = 2750.
        #expect(rtt.smoothedMicros == 3_000 && rtt.variationMicros == 2_750)
        #expect(rtt.samples == 2 && rtt.lastMicros == 10_000)
    }
}
