import Foundation
import Testing

@testable import Messaging

/// The durable session as one deterministic simulation (``SessionSimulation``): a client and a
/// server with their real session machines and real journals on simulated disks, a connection in
/// memory, and a seed that picks every step — sends, arrivals, handling, syncs, acknowledgement
/// deadlines, cuts, `kill -9` and power losses with what a disk may keep. The invariants are
/// checked after every step and once everything settled (see ``SessionSimulation``).
///
/// `LANMSG_SESSION_SIM_SEEDS` (default 200) seeds from `LANMSG_SESSION_SIM_FIRST_SEED` (default 1);
/// one seed with its whole trace: `LANMSG_SESSION_SIM_SEED=n`. The long run:
/// `LANMSG_SESSION_SIM_SEEDS=20000 .build/debug/swift-lan-messagingPackageTests.xctest
/// --testing-library swift-testing --filter SessionSimulationTests/everySeed` (docs/DURABILITY in
/// the README's tests section).
@Suite struct SessionSimulationTests {
    @Test func everySeedKeepsTheInvariants() async throws {
        let environment = ProcessInfo.processInfo.environment
        let seeds: [UInt64]
        if let one = environment["LANMSG_SESSION_SIM_SEED"].flatMap(UInt64.init) {
            seeds = [one]
        } else {
            let first = environment["LANMSG_SESSION_SIM_FIRST_SEED"].flatMap(UInt64.init) ?? 1
            let count = environment["LANMSG_SESSION_SIM_SEEDS"].flatMap(UInt64.init) ?? 200
            seeds = Array(first..<(first + count))
        }
        let started = ContinuousClock.now
        var steps = 0
        var counts: [String: Int] = [:]
        for seed in seeds {
            let run = await SessionSimulation.run(seed: seed)
            steps += run.steps
            counts.merge(run.counts, uniquingKeysWith: +)
            if let failure = run.failure {
                Issue.record(
                    """
                    seed \(seed) failed: \(failure)
                    replay: LANMSG_SESSION_SIM_SEED=\(seed) .build/debug/swift-lan-messagingPackageTests.xctest \
                    --testing-library swift-testing --filter SessionSimulationTests/everySeed
                    trace (\(seeds.count == 1 ? "all" : "the last 30") of \(run.trace.count) lines):
                    \(run.trace.suffix(seeds.count == 1 ? run.trace.count : 30).joined(separator: "\n"))
                    """)
                return
            }
            if seeds.count == 1 { print(run.trace.joined(separator: "\n")) }
        }
        let seconds = (ContinuousClock.now - started) / .seconds(1)
        let kinds = counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        print(
            "MEASURED session simulation: \(seeds.count) seeds, \(steps) steps in "
                + String(format: "%.2f s: %.1f seeds/s", seconds, Double(seeds.count) / seconds) + " (\(kinds))")
        if seeds.count >= 50 {
            // A run that proves something: the seeds reached each kind of event.
            for kind in ["killed", "power loss", "cut", "store may have lost records", "server started anew", "client renewed its session"] {
                #expect(counts[kind, default: 0] > 0, "no seed reached '\(kind)'")
            }
        }
    }

    /// One seed run twice gives the same trace, line for line — and another seed another one.
    @Test func aSeedReplaysEventForEvent() async throws {
        let first = await SessionSimulation.run(seed: 54)
        let second = await SessionSimulation.run(seed: 54)
        let other = await SessionSimulation.run(seed: 55)
        #expect(first.failure == nil && second.failure == nil && other.failure == nil)
        #expect(first.trace.count > 300, "a run of \(first.trace.count) lines proves little")
        #expect(
            first.trace == second.trace,
            "seed 54 gave two runs: first difference at line \(zip(first.trace, second.trace).enumerated().first { $0.element.0 != $0.element.1 }?.offset ?? -1)")
        #expect(first.trace != other.trace)
    }
}
