import Foundation
import TestWaits
import Testing

@testable import Messaging

/// The durable session as one deterministic simulation (``SessionSimulation``): a client (or
/// three) and a server with their real session machines and real journals on simulated disks,
/// connections in memory, and a seed that picks every step — sends, arrivals, handling, syncs,
/// acknowledgement deadlines, cuts, `kill -9` and power losses with what a disk may keep. The
/// invariants are checked after every step and once everything settled (see ``SessionSimulation``).
///
/// `LANMSG_SESSION_SIM_SEEDS` (default 200) seeds from `LANMSG_SESSION_SIM_FIRST_SEED` (default 1);
/// one seed with its whole trace: `LANMSG_SESSION_SIM_SEED=n`. The long run:
/// `LANMSG_SESSION_SIM_SEEDS=20000 .build/debug/swift-lan-messagingPackageTests.xctest
/// --testing-library swift-testing --filter SessionSimulationTests/everySeed` (the DocC article
/// "Message sessions", "The store on disk").
@Suite struct SessionSimulationTests {
    @Test func everySeedKeepsTheInvariants() async throws {
        let chosen = SimulationSeeds("LANMSG_SESSION_SIM", default: 200)
        let result = await chosen.runEach(filter: "SessionSimulationTests/everySeed", tail: 30) { await SessionSimulation.run(seed: $0) }
        guard let totals = result.totals else {
            Issue.record(Comment(rawValue: result.failure ?? ""))
            return
        }
        print(totals.measured("session simulation"))
        let (seeds, counts) = (chosen.seeds, totals.counts)
        if seeds.count >= 50 {
            // A run that proves something: the seeds reached each kind of event.
            for kind in [
                "killed", "power loss", "cut", "store may have lost records", "server started anew", "client renewed its session",
                "half-open cut", "resumed over a connection lost unnoticed", "server noticed a half-open connection",
                "a frame arrived on a half-open connection", "a hello arrived on a half-open connection",
                "reports made again after a restart",
            ] {
                #expect(counts[kind, default: 0] > 0, "no seed reached '\(kind)'")
            }
        }
    }

    /// Three clients share the server: its one store holds their sessions side by side, a
    /// server's crash or power loss takes all their connections and may lose the tail of any of
    /// them, and a client's own losses must leave the others' sessions whole. Each seed runs 600
    /// steps (the same invariants; a message reaches the app it was sent to, and no other).
    /// `LANMSG_SESSIONS_SIM_SEEDS` (default 40: 9 s of the unit stage), `LANMSG_SESSIONS_SIM_SEED=n`
    /// for one seed with its trace.
    @Test func severalClientsShareTheServersStore() async throws {
        let chosen = SimulationSeeds("LANMSG_SESSIONS_SIM", default: 40)
        let result = await chosen.runEach(filter: "SessionSimulationTests/severalClients", tail: 30) {
            await SessionSimulation.run(seed: $0, steps: 600, clients: 3)
        }
        guard let totals = result.totals else {
            Issue.record(Comment(rawValue: result.failure ?? ""))
            return
        }
        print(totals.measured("sessions simulation, 3 clients"))
        if chosen.seeds.count >= 40 {
            for kind in [
                "server power loss holding several clients' sessions", "server killed holding several clients' sessions", "both power loss",
                "store may have lost records", "server started anew", "client renewed its session", "half-open cut",
                "resumed over a connection lost unnoticed", "a hello arrived on a half-open connection",
            ] {
                #expect(totals.counts[kind, default: 0] > 0, "no seed reached '\(kind)'")
            }
        }
        let first = await SessionSimulation.run(seed: 54, steps: 600, clients: 3)
        let second = await SessionSimulation.run(seed: 54, steps: 600, clients: 3)
        #expect(first.trace == second.trace, "seed 54 with three clients gave two runs")
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
