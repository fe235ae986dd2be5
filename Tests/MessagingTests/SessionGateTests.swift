import Testing

import ProtocolCore
@testable import Messaging

/// ``SessionGate`` alone: strings stand for the waiters (no continuations, no sockets).
/// The gate before the client's SESSION, every way a SESSION frame can arrive, the waits and
/// their timeouts, the close, and the acknowledgement deadline.
@Suite struct SessionGateTests {
    typealias Machine = SessionGate<String, String>
    static let hello = SessionHello(id: String(repeating: "a", count: 32), received: 0)

    func frame(_ machine: inout Machine, offered: Bool = true, name: String = "peer") -> Machine.SessionFrame {
        machine.sessionFrame(Self.hello, peerOfferedSessions: offered, peerName: name)
    }

    @Test func onlySessionPingPongAndGoodbyeComeBeforeTheClientsSession() {
        var machine = Machine(awaitsClientSession: true)
        let allowed = FrameKind.allCases.filter { machine.violation(receiving: $0) == nil }
        #expect(Set(allowed) == [.session, .ping, .pong, .goodbye])
        #expect(machine.violation(receiving: .message)?.contains("sent message before its SESSION frame") == true)
        // Once the SESSION came, every kind passes the gate (the handlers judge the rest).
        guard case .kept = frame(&machine) else { Issue.record("the early SESSION was not kept"); return }
        #expect(FrameKind.allCases.allSatisfy { machine.violation(receiving: $0) == nil })
        // Without a session offered there is no gate at all.
        #expect(FrameKind.allCases.allSatisfy { Machine().violation(receiving: $0) == nil })
    }

    /// Server: the client's SESSION before the server asks is kept and handed over at the ask; a
    /// second one is a protocol error.
    @Test func anEarlySessionIsKeptForTheServer() {
        var machine = Machine(awaitsClientSession: true)
        guard case .kept = frame(&machine) else { Issue.record("not kept"); return }
        #expect(machine.helloArrived)
        guard case .violation("a second SESSION frame") = frame(&machine) else { Issue.record("a second SESSION passed"); return }
        guard case .arrived(let hello) = machine.waitForHello("server") else { Issue.record("not handed over"); return }
        #expect(hello == Self.hello && !machine.helloArrived)
        // The exchange is over: one more SESSION is unexpected.
        guard case .violation(let text) = frame(&machine), text.contains("unexpected SESSION") else {
            Issue.record("a SESSION after the exchange passed"); return
        }
    }

    /// Server: waiting first, the SESSION goes to the waiter; a timeout takes the waiter back (and
    /// the gate stays shut); the close fails a waiter still waiting.
    @Test func theServerWaitsForTheClientsSession() {
        var machine = Machine(awaitsClientSession: true)
        guard case .waiting = machine.waitForHello("first") else { Issue.record("did not wait"); return }
        guard case .notExpected = machine.waitForHello("second") else { Issue.record("two waiters"); return }
        guard case .hello("first") = frame(&machine) else { Issue.record("the waiter did not get it"); return }
        let result1 = machine.helloTimedOut()
        #expect(result1 == nil)  // answered: the timer finds nobody

        machine = Machine(awaitsClientSession: true)
        _ = machine.waitForHello("late")
        let result2 = machine.helloTimedOut()
        #expect(result2 == "late")
        let result3 = machine.helloTimedOut()
        #expect(result3 == nil)
        #expect(machine.violation(receiving: .message) != nil)  // still no SESSION: the gate holds

        machine = Machine(awaitsClientSession: true)
        _ = machine.waitForHello("closing")
        let result4 = machine.closed()
        #expect(result4.hello == "closing")
        let result5 = machine.closed()
        #expect(result5.hello == nil)
        // No client SESSION expected: asking for one fails at once instead of waiting out a timeout.
        var plain = Machine()
        guard case .notExpected = plain.waitForHello("nobody") else { Issue.record("waited for nothing"); return }
    }

    /// Client: the server's SESSION answers the one waiter; without a wait it is unexpected, and
    /// the error says whether the peer offered sessions at all.
    @Test func theClientsWaitForTheAnswer() {
        var machine = Machine()
        let result6 = machine.waitForAnswer("client")
        #expect(result6)
        let result7 = machine.waitForAnswer("again")
        #expect(!result7)
        guard case .answer("client") = frame(&machine) else { Issue.record("the answer went astray"); return }
        let result8 = machine.answerTimedOut()
        #expect(result8 == nil)
        guard case .violation(let unexpected) = frame(&machine), unexpected.contains("unexpected SESSION") else {
            Issue.record("a second answer passed"); return
        }
        guard case .violation(let notOffered) = frame(&machine, offered: false, name: "Lobby"),
            notOffered.contains("'Lobby' did not offer message sessions")
        else { Issue.record("the error does not say the peer did not offer sessions"); return }

        machine = Machine()
        _ = machine.waitForAnswer("slow")
        let result9 = machine.answerTimedOut()
        #expect(result9 == "slow")
        // Timed out, the connection closes: an answer now is late, dropped without a protocol
        // error (the next connection resumes the session); no second wait on this connection.
        let again = machine.waitForAnswer("again")
        #expect(!again)
        guard case .lateAnswer = frame(&machine) else { Issue.record("a late answer was taken for a protocol error"); return }
        guard case .violation = frame(&machine) else { Issue.record("a second late answer passed"); return }

        machine = Machine()
        _ = machine.waitForAnswer("closing")
        let result10 = machine.closed()
        #expect(result10.answer == "closing")
    }
}
