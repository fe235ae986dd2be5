import FastJSON
import Testing

import ProtocolCore
@testable import Messaging

/// ``ChannelStateMachine`` alone: frames in, what the channel must do out. Strings stand for the
/// requests' continuations and the transfers' sinks, a small class for the session link; no
/// sockets, no loop, no clock but the numbers given.
@Suite struct ChannelStateMachineTests {
    final class Link: SessionLinking {
        var gate: SessionGate<String, String>
        var hasSession = false
        init(gate: SessionGate<String, String>) { self.gate = gate }
    }
    typealias Machine = ChannelStateMachine<Link, String, String>
    static let peer = PeerInfo(name: "Lobby")

    static func message(_ sequence: UInt64, replyTo: UInt64? = nil, expectsReply: Bool = false) -> Frame {
        var frame = Frame(kind: .message, typeID: "chat", sequence: sequence, reference: replyTo, payload: Array("{}".utf8))
        frame.expectsReply = expectsReply
        return frame
    }

    static func start(_ id: UInt64, size: UInt64) -> Frame {
        let header = try! FastJSONEncoder().encode(TransferHeader(size: size, metadata: [:]))
        return Frame(kind: .streamStart, typeID: "file", sequence: id, payload: header)
    }

    /// What a frame asks, as a word (the cases carry waiters and entries the tests look at apart).
    static func word(_ received: Machine.Received) -> String {
        switch received {
        case .message: "message"
        case .reply(let request): "reply(\(request.token))"
        case .lateReply(let sequence): "late(\(sequence))"
        case .sessionMessage: "sessionMessage"
        case .ping: "ping"
        case .pong: "pong"
        case .sessionAnswer(let waiter, _): "answer(\(waiter))"
        case .sessionHello(let waiter, _): "hello(\(waiter))"
        case .sessionKept: "kept"
        case .lateSessionAnswer: "lateAnswer"
        case .ack(let count): "ack(\(count))"
        case .goodbye(let reason): "goodbye(\(reason))"
        case .startTransfer(let header): "start(\(header.size))"
        case .chunk(let stream, let bytes): "chunk(\(stream.sink), \(bytes.count), \(stream.received))"
        case .transferCompleted(let stream): "completed(\(stream.sink))"
        case .transferFailed(let stream, _): "failed(\(stream.sink))"
        case .violation(let text): "violation: \(text)"
        }
    }

    func receive(_ machine: inout Machine, _ frame: Frame) -> String { Self.word(machine.received(frame, from: Self.peer)) }

    /// A reply resumes its request once; a second reply with the same reference is an ordinary
    /// message; a reply to a request that timed out or was cancelled is dropped; a message that
    /// refers to nothing this side asked is the app's.
    @Test func repliesFindTheirRequestsOnceAndLateRepliesAreDropped() {
        var machine = Machine()
        #expect(receive(&machine, Self.message(1, replyTo: 7)) == "message")  // no request ever sent
        #expect(machine.requestSent(7, typeID: "ask", now: 0, timeout: 100, token: "seven") == 100)
        #expect(machine.requestSent(8, typeID: "ask", now: 0, timeout: 50, token: "eight") == 50)  // earlier: re-arm
        #expect(machine.requestSent(9, typeID: "ask", now: 0, timeout: 500, token: "nine") == nil)  // later: keep
        #expect(receive(&machine, Self.message(2, replyTo: 7)) == "reply(seven)")
        #expect(receive(&machine, Self.message(3, replyTo: 7)) == "message")

        let (expired, next) = machine.requestsExpired(now: 60)
        #expect(expired.map(\.token) == ["eight"] && next == 500)
        #expect(receive(&machine, Self.message(4, replyTo: 8)) == "late(8)")
        #expect(machine.requestCancelled(9)?.token == "nine")
        #expect(machine.requestCancelled(9) == nil)
        #expect(receive(&machine, Self.message(5, replyTo: 9)) == "late(9)")
        machine.requestAbandoned(10)  // cancelled while it was being sent
        #expect(receive(&machine, Self.message(6, replyTo: 10)) == "late(10)")
        #expect(machine.requestsExpired(now: 1_000).expired.isEmpty)
    }

    /// A session message goes to the session only while one runs on the connection (when to
    /// acknowledge it is the session's: SessionCoreTests).
    @Test func sessionMessagesAndTheirAcknowledgement() {
        var machine = Machine()
        #expect(receive(&machine, Self.message(1)) == "message")  // no link
        let link = machine.makeLink()
        #expect(machine.makeLink() === link)
        #expect(receive(&machine, Self.message(2)) == "message")  // a link, no session yet
        link.hasSession = true
        #expect(receive(&machine, Self.message(3)) == "sessionMessage")
        #expect(receive(&machine, Self.message(4, expectsReply: true)) == "message")  // a request is not a session message

        #expect(receive(&machine, Frame.ack(3)) == "ack(3)")
        #expect(receive(&machine, Frame(kind: .ack, payload: [1, 2])).hasPrefix("violation: an ACK must carry"))
        link.hasSession = false
        #expect(receive(&machine, Frame.ack(3)) == "violation: ACK without a session")
    }

    /// A server that accepted the client's offer of a session lets only SESSION, PING, PONG and
    /// GOODBYE through before the client's SESSION, which it keeps until asked; a malformed or
    /// unexpected SESSION is a protocol error naming the peer.
    @Test func theSessionGateAndSessionFrames() throws {
        let hello = try FastJSONEncoder().encode(SessionHello(id: String(repeating: "a", count: 32), received: 0))
        var server = Machine(awaitsClientSession: true)
        #expect(receive(&server, Self.message(1)).contains("sent message before its SESSION frame"))
        #expect(receive(&server, Frame(kind: .ping, sequence: 2)) == "ping")
        #expect(receive(&server, Frame(kind: .session, payload: Array("{}".utf8))).hasPrefix("violation: malformed SESSION"))
        #expect(receive(&server, Frame(kind: .session, payload: hello)) == "kept")
        #expect(receive(&server, Self.message(3)) == "message")  // the gate opened

        var waiting = Machine(awaitsClientSession: true)
        guard case .waiting = waiting.makeLink().gate.waitForHello("server") else { Issue.record("did not wait"); return }
        #expect(receive(&waiting, Frame(kind: .session, payload: hello)) == "hello(server)")

        var client = Machine()
        #expect(receive(&client, Frame(kind: .session, payload: hello)).contains("'Lobby' did not offer message sessions"))
        let clientWaits = client.makeLink().gate.waitForAnswer("client")
        #expect(clientWaits)
        #expect(receive(&client, Frame(kind: .session, payload: hello)) == "answer(client)")
    }

    /// A transfer: start (the stream id free), chunks counted up to the announced size, the end;
    /// chunks beyond it, unknown streams and a reused id are protocol errors; an end with a reason,
    /// or before all bytes came, fails the transfer.
    @Test func transfersAreCountedAndEnded() {
        var machine = Machine()
        #expect(receive(&machine, Self.start(5, size: 6)) == "start(6)")
        machine.transferStarted(Self.start(5, size: 6), header: TransferHeader(size: 6, metadata: [:]), sink: "five")
        #expect(receive(&machine, Self.start(5, size: 6)) == "violation: STREAM_START #5 reuses an open stream id")
        #expect(receive(&machine, Frame(kind: .streamStart, sequence: 6, payload: [0x7B])).contains("malformed header"))
        #expect(receive(&machine, Frame(kind: .streamChunk, reference: 5, payload: [1, 2, 3, 4])) == "chunk(five, 4, 4)")
        #expect(receive(&machine, Frame(kind: .streamChunk, reference: 5, payload: [5, 6])) == "chunk(five, 2, 6)")
        #expect(receive(&machine, Frame(kind: .streamChunk, reference: 5, payload: [7])).contains("more than the announced 6"))
        #expect(receive(&machine, Frame(kind: .streamEnd, reference: 5)) == "completed(five)")
        #expect(receive(&machine, Frame(kind: .streamChunk, reference: 5, payload: [1])).contains("STREAM_CHUNK for unknown stream 5"))

        machine.transferStarted(Self.start(7, size: 10), header: TransferHeader(size: 10, metadata: [:]), sink: "seven")
        #expect(receive(&machine, Frame(kind: .streamEnd, reference: 7)) == "failed(seven)")  // 0 of 10 bytes
        machine.transferStarted(Self.start(8, size: 10), header: TransferHeader(size: 10, metadata: [:]), sink: "eight")
        #expect(receive(&machine, Frame(kind: .streamEnd, reference: 8, payload: Array("disk full".utf8))) == "failed(eight)")
    }

    /// The hello's frames never come after it; GOODBYE carries its reason; the close hands back
    /// every waiting request, open transfer and SESSION waiter, once.
    @Test func strayFramesGoodbyeAndTheClose() {
        var machine = Machine()
        for kind in [FrameKind.hello, .helloAck, .refuse, .auth, .authOK] {
            #expect(receive(&machine, Frame(kind: kind)) == "violation: unexpected \(kind) frame after the hello exchange")
        }
        #expect(receive(&machine, Frame(kind: .goodbye, payload: Array("bye".utf8))) == "goodbye(bye)")
        #expect(receive(&machine, Frame(kind: .pong, reference: 1)) == "pong")

        _ = machine.requestSent(1, typeID: "ask", now: 0, timeout: 10, token: "one")
        _ = machine.requestSent(2, typeID: "ask", now: 0, timeout: 10, token: "two")
        machine.transferStarted(Self.start(3, size: 1), header: TransferHeader(size: 1, metadata: [:]), sink: "three")
        let waits = machine.makeLink().gate.waitForAnswer("answer")
        #expect(waits)
        let closed = machine.closed()
        #expect(closed.requests.map(\.token) == ["one", "two"])
        #expect(closed.transfers.map(\.sink) == ["three"])
        #expect(closed.answer == "answer" && closed.hello == nil)
        let again = machine.closed()
        #expect(again.requests.isEmpty && again.transfers.isEmpty && again.answer == nil)
    }
}
