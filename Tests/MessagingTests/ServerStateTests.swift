import Foundation
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
        guard case .notRunning = state.admit(Self.source, limit: 10, now: 0, blockBase: 1) else {
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
        // The connection limit counts places in handshakes: the third is over the limit (refused busy).
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

    /// A store in `directory` opened again after a process wrote one session to it (opened by `owner`).
    static func storeKeepingOneSession(in directory: String, owner: String) throws -> SessionJournal {
        let written = try SessionStoreTests.open(directory)
        try written.append(
            .session(Journal.Snapshot(key: SessionStoreTests.key, positionID: SessionStoreTests.position, owner: owner)))
        written.close()
        return try SessionStoreTests.open(directory)
    }

    /// A session the store kept from before a restart is taken once, by the key that opened it;
    /// another key (or none) is refused and leaves it in place.
    @Test func aRestoredSessionIsTakenOnceByItsOwnKey() throws {
        let directory = SessionStoreTests.directory("decision")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try Self.storeKeepingOneSession(in: directory, owner: "aaaa")
        var state = idle()
        state.opened(journal)
        let id = SessionStoreTests.key.hex
        guard case .refused(let reason) = state.takeRestored(id, owner: "bbbb") else { Issue.record("another key took it"); return }
        #expect(reason.contains("belongs to another identity key"))
        guard case .refused = state.takeRestored(id, owner: nil) else { Issue.record("a key-less client took it"); return }
        guard case .restored(let found) = state.takeRestored(id, owner: "aaaa") else { Issue.record("its own key could not"); return }
        #expect(found.snapshot.key == SessionStoreTests.key)
        guard case .none = state.takeRestored(id, owner: "aaaa") else { Issue.record("taken twice"); return }
        #expect(state.closedStore() === journal && state.store == nil)
        journal.close()
    }

    /// A restored session given back (its connection closed before it attached) is taken again by
    /// the next resume; after the grace period took the unclaimed ones, none is given back; with
    /// the store closed (the server stopped), it stays in the store's file: kept, not given back.
    @Test func aRestoredSessionGivenBackIsTakenAgainUntilTheGracePeriodsEnd() throws {
        let directory = SessionStoreTests.directory("give-back")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try Self.storeKeepingOneSession(in: directory, owner: "aaaa")
        defer { journal.close() }
        var state = idle()
        state.opened(journal)
        let id = SessionStoreTests.key.hex
        guard case .restored(let found) = state.takeRestored(id, owner: "aaaa") else { Issue.record("not restored"); return }
        let givenBack = state.returnRestored(found)
        #expect(givenBack)
        guard case .restored(let again) = state.takeRestored(id, owner: "aaaa") else { Issue.record("not given back"); return }
        #expect(again.snapshot == found.snapshot)
        _ = state.takeUnclaimed()
        let afterTheEnd = state.returnRestored(again)
        #expect(!afterTheEnd, "given back after the grace period's end")
        guard case .none = state.takeRestored(id, owner: "aaaa") else { Issue.record("taken after the grace period's end"); return }
        _ = state.closedStore()
        let afterTheStop = state.returnRestored(again)
        #expect(afterTheStop, "the server stopped: it stays in the file")
        guard case .none = state.takeRestored(id, owner: "aaaa") else { Issue.record("taken from a closed store"); return }
    }
}
