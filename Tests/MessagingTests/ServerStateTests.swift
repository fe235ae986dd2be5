import ProtocolCore
import Testing
import Transport

@testable import Messaging

/// ``ServerState`` alone: admitting a connection takes the lifecycle, the registry and the handshake
/// admission together. Strings stand for the listener, the publication and the work.
@Suite struct ServerStateTests {
    final class Connection {}
    typealias State = ServerState<String, String, String, Connection, String>

    static let source = HandshakeAdmission.Source(SocketAddress(numeric: "192.0.2.1", port: 1)!)
    static let other = HandshakeAdmission.Source(SocketAddress(numeric: "192.0.2.2", port: 1)!)

    /// A server's state before `start()`.
    func idle(inFlight: Int = 100, perSource: Int = 100, blockAfter: Int? = nil) -> State {
        State(
            admission: HandshakeAdmission(
                limits: .init(
                    inFlight: inFlight, inFlightPerSource: perSource, perSecond: nil, perSecondPerSource: nil,
                    blockAfterRefusals: blockAfter),
                now: 0))
    }

    /// A running server's state.
    func running(inFlight: Int = 100, perSource: Int = 100, blockAfter: Int? = nil) -> State {
        var state = idle(inFlight: inFlight, perSource: perSource, blockAfter: blockAfter)
        _ = state.lifecycle.startRequested()
        _ = state.lifecycle.listening("listener")
        _ = state.lifecycle.started("listener", nil, "work")
        return state
    }

    func admitted(_ admission: State.Admission) -> String? {
        if case .admitted(let work) = admission { return work }
        return nil
    }

    @Test func nothingIsAdmittedUnlessRunning() {
        var state = idle()
        guard case .full = state.admit(Self.source, limit: 10, now: 0, blockBase: 1) else {
            Issue.record("admitted before start")
            return
        }
        #expect(state.registry.pending == 0 && state.admission.inFlight == 0)
    }

    @Test func anAdmittedConnectionHoldsAPlaceAndAHandshakeSlotUntilItEnds() {
        var state = running()
        #expect(admitted(state.admit(Self.source, limit: 2, now: 0, blockBase: 1)) == "work")
        #expect(state.registry.pending == 1 && state.admission.inFlight == 1)
        // Its handshake completed: the slot is free, the place held until it registers.
        state.handshakeSucceeded(Self.source)
        #expect(state.registry.pending == 1 && state.admission.inFlight == 0)
        #expect(admitted(state.admit(Self.other, limit: 2, now: 0, blockBase: 1)) == "work")
        // The connection limit counts places in handshakes: the third is closed, not refused busy.
        guard case .full = state.admit(Self.source, limit: 2, now: 0, blockBase: 1) else {
            Issue.record("a third connection was admitted under a limit of 2")
            return
        }
        state.handshakeAbandoned(Self.other)
        #expect(state.registry.pending == 1 && state.admission.inFlight == 0)
        #expect(admitted(state.admit(Self.source, limit: 2, now: 0, blockBase: 1)) != nil)
    }

    @Test func overAHandshakeBoundIsBusyAndAFloodIsBlockedOnce() {
        var state = running(inFlight: 1, blockAfter: 3)
        #expect(admitted(state.admit(Self.source, limit: 100, now: 0, blockBase: 10_000_000_000)) != nil)
        var blocks: [State.Block] = []
        for attempt in 1...4 {
            guard case .busy(let why, _, let block) = state.admit(Self.source, limit: 100, now: UInt64(attempt), blockBase: 10_000_000_000)
            else {
                Issue.record("attempt \(attempt) over the in-flight bound was not refused busy")
                return
            }
            #expect(why.contains("in their handshake"))
            if let block { blocks.append(block) }
        }
        // The third refusal in the second blocks the source, on the running listener, for the base.
        #expect(blocks.count == 1)
        #expect(blocks.first?.listener == "listener" && blocks.first?.duration == .seconds(10) && blocks.first?.again == false)
        // Busy refusals hold no place.
        #expect(state.registry.pending == 1)
    }

    @Test func aHandshakeThatCompletesAfterTheStopIsNotRegisteredAndFreesItsPlace() {
        var state = running()
        #expect(admitted(state.admit(Self.source, limit: 2, now: 0, blockBase: 1)) != nil)
        #expect(admitted(state.admit(Self.other, limit: 2, now: 0, blockBase: 1)) != nil)
        state.handshakeSucceeded(Self.source)
        guard case .new = state.register(session: "s", owner: "key", make: { _ in Connection() }) else {
            Issue.record("a running server did not register a new connection")
            return
        }
        #expect(state.registry.count == 1 && state.registry.pending == 1)
        _ = state.lifecycle.stopRequested()
        state.handshakeSucceeded(Self.other)
        var made = 0
        let late = state.register(session: nil, owner: nil) { _ in
            made += 1
            return Connection()
        }
        #expect(late == nil && made == 0)
        #expect(state.registry.count == 1 && state.registry.pending == 0)
    }

    @Test func refusalsAreCountedAndNumberedPerSecond() {
        var state = running()
        #expect(state.refused(now: 1_000_000_000) == 1)
        #expect(state.refused(now: 1_500_000_000) == 2)
        #expect(state.refused(now: 2_000_000_000) == 1)
        #expect(state.refusals == 3)
    }
}
