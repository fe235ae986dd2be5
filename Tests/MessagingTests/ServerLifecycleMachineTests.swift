import Testing

@testable import Messaging

/// ``ServerLifecycle`` alone: no sockets, no discovery, no tasks. Strings stand for the listener,
/// the publication and the work; every `stop()` that can come in between `start()`'s steps.
@Suite struct ServerLifecycleMachineTests {
    typealias Machine = ServerLifecycle<String, String, String>

    func stopped(_ action: Machine.StopAction) -> (String?, String?, String?)? {
        if case .stop(let listener, let publication, let work) = action { return (listener, publication, work) }
        return nil
    }

    @Test func startRunsOnceAndStopHandsBackWhatRuns() {
        var machine = Machine()
        #expect(machine.listener == nil && !machine.isRunning)
        let step1 = machine.startRequested()
        #expect(step1)
        let again = machine.startRequested()
        #expect(!again)  // a second start() is refused
        let step2 = machine.listening("listener")
        #expect(step2)
        #expect(machine.listener == "listener" && machine.publication == nil && !machine.isRunning)
        let step3 = machine.started("listener", "publication", "work")
        #expect(step3)
        #expect(machine.isRunning && machine.running?.work == "work" && machine.publication == "publication")
        let action = stopped(machine.stopRequested())
        #expect(action?.0 == "listener" && action?.1 == "publication" && action?.2 == "work")
        #expect(machine.isStopping && machine.listener == nil && machine.running == nil)
        // A second stop() while the first runs does nothing; the first ends the events.
        guard case .none = machine.stopRequested() else { Issue.record("a second stop() acted"); return }
        machine.stopped()
        #expect(machine.isStopped)
        // After the stop: stop() again only ends the events (idempotent); start() is refused.
        guard case .finishEvents = machine.stopRequested() else { Issue.record("stop() after stopped"); return }
        let step4 = machine.startRequested()
        #expect(!step4)
    }

    @Test func aStopBeforeAnyStartStopsForGood() {
        var machine = Machine()
        guard case .finishEvents = machine.stopRequested() else { Issue.record("stop() when idle"); return }
        #expect(machine.isStopped)
        let step5 = machine.startRequested()
        #expect(!step5)
    }

    /// stop() during start(): whatever start() made after the stop came in is its own to undo —
    /// the machine refuses its next step, and stop() hands back only what existed then.
    @Test func aStopDuringStartLeavesTheRestToStart() {
        // Before the listener opened.
        var machine = Machine()
        let step6 = machine.startRequested()
        #expect(step6)
        let early = stopped(machine.stopRequested())
        #expect(early != nil && early?.0 == nil && early?.1 == nil && early?.2 == nil)
        let listening = machine.listening("listener")
        #expect(!listening)  // start() closes the listener itself
        machine.startFailed()  // does not undo the stop's phase
        #expect(machine.isStopping)

        // While publishing: stop() closes the listener, start() unpublishes and ends the work.
        machine = Machine()
        let step7 = machine.startRequested()
        #expect(step7)
        let step8 = machine.listening("listener")
        #expect(step8)
        let late = stopped(machine.stopRequested())
        #expect(late?.0 == "listener" && late?.1 == nil && late?.2 == nil)
        let step9 = machine.started("listener", "publication", "work")
        #expect(!step9)
        #expect(machine.running == nil)
    }

    @Test func aFailedStartEndsStopped() {
        var machine = Machine()
        let step10 = machine.startRequested()
        #expect(step10)
        let step11 = machine.listening("listener")
        #expect(step11)
        machine.startFailed()
        #expect(machine.isStopped && machine.listener == nil)
        let step12 = machine.startRequested()
        #expect(!step12)
    }
}
