import Foundation
import TestWaits

@testable import Messaging

/// A deterministic simulation of a ``MessageServer``'s start and stop (issue 54, 3 — the server's
/// part, beside ``ClientSimulation`` and ``SessionSimulation``): the real ``ServerLifecycle``
/// driven the way `start()` and `stop()` drive it, each of their critical sections and awaits a
/// step, so that a seed picks how up to two `start()` calls and two `stop()` calls interleave —
/// a `stop()` may come in before the listener opened, while the service is being published, or
/// after — and where a step of `start()` fails (the identity, the store, the listener, the
/// publication).
///
/// Checked after every step: a running server holds an open listener, its live publication and
/// its unfinished work. Checked when a `stop()` returns — the first, or one that came in while it
/// ran and waited for it: nothing of the server is left (listener, publication, work, store),
/// unless a `start()` is still under way (it undoes its own steps once it sees the stop: its
/// publish may still be awaited). Checked once every call returned: each listener opened was
/// stopped (a second stop of the same listener is idempotent, and counted), each publication was
/// withdrawn exactly once (never live behind a stopped server), each background work was finished,
/// the store closed; a `start()` returned normally exactly when the server ran, and a second
/// `start()` said `.alreadyStarted`; the events ended once a `stop()` ran; a server that ran and
/// was stopped ends stopped. At the end, a server still running is stopped and the same checks
/// hold.
final class ServerSimulation {
    final class Resource: CustomStringConvertible {
        let name: String
        var releases = 0
        init(_ name: String) { self.name = name }
        var description: String { name }
    }
    typealias Machine = ServerLifecycle<Resource, Resource, Resource>

    struct Outcome: SimulationOutcome {
        var failure: String?
        var trace: [String] = []
        var steps = 0
        var counts: [String: Int] = [:]
    }

    /// One call of `start()` or `stop()`: where it stands.
    final class Call {
        let name: String
        let isStart: Bool
        var pc = 0
        var done = false
        // start()'s locals
        var listener: Resource?
        var publication: Resource?
        var running = false
        var result: String?
        // stop()'s locals
        var captured: (listener: Resource?, publication: Resource?, work: Resource?)
        init(name: String, isStart: Bool) {
            self.name = name
            self.isStart = isStart
        }
    }

    let seed: UInt64
    var random: SeededRandom
    var machine = Machine()
    var outcome = Outcome()
    let publishes: Bool
    let hasStore: Bool
    /// The server's state besides the lifecycle: its store (`withState { $0.opened/closedStore }`).
    var store: Resource?
    var listeners: [Resource] = []
    var publications: [Resource] = []
    var works: [Resource] = []
    var eventsFinished = 0
    var calls: [Call] = []

    init(seed: UInt64) {
        self.seed = seed
        random = SeededRandom(seed)
        publishes = Int.random(in: 0..<4, using: &random) != 0
        hasStore = Bool.random(using: &random)
    }

    static func run(seed: UInt64) -> Outcome {
        let simulation = ServerSimulation(seed: seed)
        simulation.run()
        return simulation.outcome
    }

    func fail(_ text: String) {
        if outcome.failure == nil { outcome.failure = text }
    }

    func count(_ kind: String) { outcome.counts[kind, default: 0] += 1 }

    func note(_ call: Call, _ text: String) {
        outcome.trace.append("\(call.name): \(text) | \(machine.phase)")
    }

    /// A step of `start()` fails here with probability 1/12.
    func fails() -> Bool { Int.random(in: 0..<12, using: &random) == 0 }

    func run() {
        outcome.trace.append("seed \(seed): \(publishes ? "publishes" : "no publisher"), \(hasStore ? "a session store" : "no store")")
        calls.append(Call(name: "start", isStart: true))
        if Int.random(in: 0..<5, using: &random) == 0 { calls.append(Call(name: "start#2", isStart: true)) }
        let stops = Int.random(in: 0...2, using: &random)
        for index in 0..<stops { calls.append(Call(name: "stop#\(index + 1)", isStart: false)) }
        // Calls begin at steps the seed picks: a stop may come before, during or after the start.
        var begun = [calls[0]]
        var waiting = Array(calls.dropFirst())
        for _ in 0..<200 {
            guard outcome.failure == nil else { return }
            let live = begun.filter { !$0.done }
            if live.isEmpty && waiting.isEmpty { break }
            if !waiting.isEmpty && (live.isEmpty || Int.random(in: 0..<3, using: &random) == 0) {
                begun.append(waiting.removeFirst())
                continue
            }
            let call = live[Int.random(in: 0..<live.count, using: &random)]
            if call.isStart { startStep(call) } else { stopStep(call) }
            outcome.steps += 1
            check()
        }
        guard outcome.failure == nil else { return }
        if !calls.allSatisfy(\.done) { return fail("calls still running after 200 steps") }
        checkSettled(finalStop: false)
        if machine.isRunning {
            let stop = Call(name: "final stop", isStart: false)
            calls.append(stop)
            while !stop.done { stopStep(stop) }
            checkSettled(finalStop: true)
        }
        outcome.trace.append("settled | \(machine.phase)")
    }

    // MARK: start(), a critical section or an await at a time

    func startStep(_ call: Call) {
        switch call.pc {
        case 0:
            guard machine.startRequested() else {
                call.result = "alreadyStarted"
                call.done = true
                note(call, "already started")
                count("second start refused")
                return
            }
            call.pc = 1
            note(call, "start requested")
        case 1:
            if fails() { return startThrows(call, "unusableIdentity") }
            call.pc = 2
        case 2:
            if hasStore {
                if fails() { return startThrows(call, "sessionStoreUnusable") }
                let opened = Resource("store")
                store = opened  // withState { $0.opened(journal) }
                note(call, "store opened")
            }
            call.pc = 3
        case 3:
            if fails() { return startThrows(call, "listenFailed") }
            let listener = Resource("listener \(listeners.count + 1)")
            listeners.append(listener)
            call.listener = listener
            call.pc = 4
            note(call, "listening")
        case 4:
            guard machine.listening(call.listener!) else {
                release(call.listener!)
                count("stop before listening")
                return startThrows(call, "stopped")
            }
            call.pc = 5
            note(call, "listening kept")
        case 5:
            // `await publisher.publishService(…)`: other calls run meanwhile (the seed's steps).
            if publishes {
                if fails() {
                    release(call.listener!)
                    return startThrows(call, "publishFailed")
                }
                let publication = Resource("publication \(publications.count + 1)")
                publications.append(publication)
                call.publication = publication
                note(call, "published")
            }
            call.pc = 6
        default:
            let work = Resource("work \(works.count + 1)")
            works.append(work)
            guard machine.started(call.listener!, call.publication, work) else {
                release(work)
                if let publication = call.publication { release(publication) }
                release(call.listener!)
                count("stop during the publish")
                return startThrows(call, "stopped")
            }
            call.running = true
            call.result = "ok"
            call.done = true
            note(call, "running")
            count("started")
        }
    }

    /// `start()` throws: its defers run (the store closed unless running, then `startFailed`).
    func startThrows(_ call: Call, _ error: String) {
        if call.pc >= 3 { closeStore() }  // `defer { if !running { closeStore() } }`, armed once openStore returned
        machine.startFailed()
        call.result = error
        call.done = true
        note(call, "throws \(error)")
        count("start threw \(error)")
    }

    // MARK: stop()

    func stopStep(_ call: Call) {
        switch call.pc {
        case 0:
            switch machine.stopRequested() {
            case .none:
                // Another stop runs: this one waits until it returned (resumed at its end).
                call.pc = 10
                note(call, "another stop is under way: waits for it")
                count("stop while stopping")
            case .finishEvents:
                eventsFinished += 1
                call.done = true
                note(call, "nothing to stop")
                count("stop with nothing to stop")
            case .stop(let listener, let publication, let work):
                call.captured = (listener, publication, work)
                if let work { release(work) }  // work?.finish()
                call.pc = 1
                note(call, "stopping \(listener.map { "\($0)" } ?? "no listener"), \(publication.map { "\($0)" } ?? "no publication")")
            }
        case 10:
            guard machine.isStopped else { return }  // still waiting
            stopReturned(call)
            note(call, "returns after the other stop")
        case 1:
            if let publication = call.captured.publication { release(publication) }  // await unpublish
            call.pc = 2
        case 2:
            if let listener = call.captured.listener { release(listener) }
            call.pc = 3  // the connections close; `await running?.cancel()`
        default:
            closeStore()
            machine.stopped()
            eventsFinished += 1
            stopReturned(call)
            note(call, "stopped")
            count("stopped")
        }
    }

    /// A `stop()` returns: nothing of the server runs — unless a `start()` is still under way
    /// (it undoes its own steps when it sees the stop; checked once everything returned).
    func stopReturned(_ call: Call) {
        call.done = true
        guard calls.allSatisfy({ !$0.isStart || $0.done }) else {
            count("stop returned while a start runs")
            return
        }
        if let open = listeners.first(where: { $0.releases == 0 }) { fail("\(call.name) returned with \(open) open") }
        if let live = publications.first(where: { $0.releases == 0 }) { fail("\(call.name) returned with \(live) published") }
        if let work = works.first(where: { $0.releases == 0 }) { fail("\(call.name) returned with \(work) running") }
        if store != nil { fail("\(call.name) returned with the store open") }
        if !machine.isStopped { fail("\(call.name) returned, the server is \(machine.phase)") }
    }

    // MARK: Resources

    func release(_ resource: Resource) {
        resource.releases += 1
        if resource.releases > 1 { count("\(resource.name.split(separator: " ")[0]) released again") }
    }

    /// `closeStore()`: takes the store out of the state (once) and closes it.
    func closeStore() {
        guard let open = store else { return }
        store = nil
        release(open)
    }

    // MARK: Checking

    func check() {
        if let (listener, work) = machine.running {
            if listener.releases > 0 { fail("running with \(listener) stopped") }
            if work.releases > 0 { fail("running with \(work) finished") }
            if let publication = machine.publication, publication.releases > 0 { fail("running with \(publication) withdrawn") }
            if publishes && machine.publication == nil { fail("running unpublished though a publisher was given") }
        }
    }

    func checkSettled(finalStop: Bool) {
        let running = machine.isRunning
        let started = calls.filter { $0.isStart && $0.result == "ok" }
        if started.count > 1 { fail("\(started.count) starts returned normally") }
        let stopped = calls.contains { !$0.isStart && $0.done && $0.pc >= 3 && $0.pc != 10 }
        if !started.isEmpty && !running && !stopped { fail("start returned normally but the server is not running") }
        if started.isEmpty && running { fail("the server runs though no start returned normally") }
        if calls.filter(\.isStart).count > 1 && !calls.contains(where: { $0.result == "alreadyStarted" }) {
            fail("a second start did not say alreadyStarted")
        }
        let stopCalls = calls.filter { !$0.isStart }
        if !stopCalls.isEmpty && eventsFinished == 0 { fail("stop() ran but the events never ended") }
        if !stopCalls.isEmpty && !machine.isStopped { fail("stop() returned, the server is \(machine.phase)") }
        if !running {
            for listener in listeners where listener.releases == 0 { fail("\(listener) left open") }
            for work in works where work.releases == 0 { fail("\(work) never finished") }
            for publication in publications where publication.releases == 0 { fail("\(publication) left published") }
            if store != nil { fail("the store left open") }
        }
        for publication in publications where publication.releases > 1 { fail("\(publication) withdrawn \(publication.releases) times") }
        if finalStop { count("stopped at the end") }
    }
}
