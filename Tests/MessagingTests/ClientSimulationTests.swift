import Foundation
import TestWaits
import Testing

@testable import Messaging

/// The client's connection lifecycle as one deterministic simulation (``ClientSimulation``): the
/// real ``ClientLifecycle`` driven as `MessageClient` drives it, in virtual time on a
/// ``ManualScheduler``, a seed picking every step — callers waiting for the connection, attempts
/// that connect or fail in seven ways, drops, late closes, the app's close, the timers. The
/// invariants are checked after every step and once everything settled (see ``ClientSimulation``).
///
/// `LANMSG_CLIENT_SIM_SEEDS` (default 500) seeds from `LANMSG_CLIENT_SIM_FIRST_SEED` (default
/// 1); one seed with its whole trace: `LANMSG_CLIENT_SIM_SEED=n`. The long run:
/// `LANMSG_CLIENT_SIM_SEEDS=200000 .build/debug/swift-lan-messagingPackageTests.xctest
/// --testing-library swift-testing --filter ClientSimulationTests/everySeed`.
@Suite struct ClientSimulationTests {
    @Test func everySeedKeepsTheInvariants() async {
        let chosen = SimulationSeeds("LANMSG_CLIENT_SIM", default: 500)
        let result = await chosen.runEach(filter: "ClientSimulationTests/everySeed", tail: 30) { ClientSimulation.run(seed: $0) }
        guard let totals = result.totals else {
            Issue.record(Comment(rawValue: result.failure ?? ""))
            return
        }
        print(totals.measured("client simulation"))
        let counts = totals.counts
        if chosen.seeds.count >= 500 {
            // A run that proves something: the seeds reached each kind of event.
            for kind in [
                "connected", "connected after close", "dropped", "retry", "gave up", "closed", "finished", "first connect failed",
                "caller waits", "caller refused", "caller answered", "caller after close", "stop", "give-up after close",
            ] {
                #expect(counts[kind, default: 0] > 0, "no seed reached '\(kind)'")
            }
        }
    }

    /// One seed run twice gives the same trace, line for line — and another seed another one.
    @Test func aSeedReplaysEventForEvent() {
        let first = ClientSimulation.run(seed: 54)
        let second = ClientSimulation.run(seed: 54)
        let other = ClientSimulation.run(seed: 55)
        #expect(first.failure == nil && second.failure == nil && other.failure == nil)
        #expect(first.trace.count > 50, "a run of \(first.trace.count) lines proves little")
        let same = first.trace == second.trace  // (not in the expectation: it would print both traces)
        #expect(
            same,
            "seed 54 gave two runs: first difference at line \(zip(first.trace, second.trace).enumerated().first { $0.element.0 != $0.element.1 }?.offset ?? -1)")
        let different = first.trace != other.trace
        #expect(different)
    }
}

/// A server's `start()` and `stop()` as one deterministic simulation (``ServerSimulation``): the
/// real ``ServerLifecycle`` driven as `MessageServer` drives it, up to two starts and two stops
/// interleaved at every critical section and await, a seed picking the order and which step of
/// `start()` fails. `LANMSG_SERVER_SIM_SEEDS` (default 2,000), `LANMSG_SERVER_SIM_SEED=n` for one
/// seed with its trace.
@Suite struct ServerSimulationTests {
    @Test func everySeedReleasesWhatItOpened() async {
        let chosen = SimulationSeeds("LANMSG_SERVER_SIM", default: 2_000)
        let result = await chosen.runEach(filter: "ServerSimulationTests/everySeed", tail: 30) { ServerSimulation.run(seed: $0) }
        guard let totals = result.totals else {
            Issue.record(Comment(rawValue: result.failure ?? ""))
            return
        }
        print(totals.measured("server simulation"))
        let counts = totals.counts
        if chosen.seeds.count >= 1_000 {
            for kind in [
                "started", "stopped", "stop before listening", "stop during the publish", "stop while stopping", "second start refused",
                "start threw publishFailed", "start threw listenFailed", "stopped at the end",
            ] {
                #expect(counts[kind, default: 0] > 0, "no seed reached '\(kind)'")
            }
        }
    }
}
