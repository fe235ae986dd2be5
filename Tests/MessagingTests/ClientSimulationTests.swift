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
    @Test func everySeedKeepsTheInvariants() {
        let chosen = SimulationSeeds("LANMSG_CLIENT_SIM", default: 500)
        let started = ContinuousClock.now
        var steps = 0
        var counts: [String: Int] = [:]
        for seed in chosen.seeds {
            let run = ClientSimulation.run(seed: seed)
            steps += run.steps
            counts.merge(run.counts, uniquingKeysWith: +)
            if let failure = run.failure {
                Issue.record(
                    Comment(rawValue: chosen.failure(seed: seed, failure, trace: run.trace, filter: "ClientSimulationTests/everySeed", tail: 30)))
                return
            }
            if chosen.single { print(run.trace.joined(separator: "\n")) }
        }
        let seconds = (ContinuousClock.now - started) / .seconds(1)
        let kinds = counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        print(
            "MEASURED client simulation: \(chosen.seeds.count) seeds, \(steps) steps in "
                + String(format: "%.2f s: %.0f seeds/s", seconds, Double(chosen.seeds.count) / seconds) + " (\(kinds))")
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
    @Test func everySeedReleasesWhatItOpened() {
        let chosen = SimulationSeeds("LANMSG_SERVER_SIM", default: 2_000)
        let started = ContinuousClock.now
        var counts: [String: Int] = [:]
        for seed in chosen.seeds {
            let run = ServerSimulation.run(seed: seed)
            counts.merge(run.counts, uniquingKeysWith: +)
            if let failure = run.failure {
                Issue.record(
                    Comment(rawValue: chosen.failure(seed: seed, failure, trace: run.trace, filter: "ServerSimulationTests/everySeed", tail: 30)))
                return
            }
            if chosen.single { print(run.trace.joined(separator: "\n")) }
        }
        let seconds = (ContinuousClock.now - started) / .seconds(1)
        let kinds = counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        print(
            "MEASURED server simulation: \(chosen.seeds.count) seeds in "
                + String(format: "%.2f s: %.0f seeds/s", seconds, Double(chosen.seeds.count) / seconds) + " (\(kinds))")
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
