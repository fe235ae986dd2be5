import Foundation

/// The seeds a seeded simulation test runs, and what it says when one fails (the wide-area and
/// the session simulations read and report them alike): `<prefix>_SEED=n` runs that seed alone and
/// shows its whole trace; else `<prefix>_SEEDS` seeds (default `count`) from `<prefix>_FIRST_SEED`
/// (default 1).
package struct SimulationSeeds: Sendable {
    package let prefix: String
    package let seeds: [UInt64]
    /// One seed asked for by name: its whole trace is shown.
    package var single: Bool { seeds.count == 1 }

    package init(_ prefix: String, default count: UInt64) {
        self.prefix = prefix
        let environment = ProcessInfo.processInfo.environment
        if let one = environment[prefix + "_SEED"].flatMap(UInt64.init) {
            seeds = [one]
        } else {
            let first = environment[prefix + "_FIRST_SEED"].flatMap(UInt64.init) ?? 1
            let count = environment[prefix + "_SEEDS"].flatMap(UInt64.init) ?? count
            seeds = Array(first..<(first + count))
        }
    }

    /// What a failing seed reports: the failure, the command that replays it (`filter`: the
    /// test's), and its trace — all of it for a single seed, else the last `tail` lines.
    package func failure(seed: UInt64, _ failure: String, trace: [String], filter: String, tail: Int) -> String {
        let shown = single ? trace : Array(trace.suffix(tail))
        return """
            seed \(seed) failed: \(failure)
            replay: \(prefix)_SEED=\(seed) .build/debug/swift-lan-messagingPackageTests.xctest \
            --testing-library swift-testing --filter \(filter)
            trace (\(single ? "all" : "the last \(tail)") of \(trace.count) lines):
            \(shown.joined(separator: "\n"))
            """
    }
}

/// What one seeded run reports (the session, client, server and wide-area simulations).
package protocol SimulationOutcome {
    /// The first invariant the run broke (nil: none).
    var failure: String? { get }
    /// The run, a line per step (what a failing seed shows, and what a replay must repeat).
    var trace: [String] { get }
    var steps: Int { get }
    /// What the run did, by kind (the seeds' coverage).
    var counts: [String: Int] { get }
}

/// The seeds' totals, once every seed ran without a failure.
package struct SimulationTotals: Sendable {
    package let seeds: Int
    package let steps: Int
    package let counts: [String: Int]
    package let seconds: Double

    /// The figure a run prints: "MEASURED <name>: N seeds, S steps in T s: R seeds/s (kinds)".
    package func measured(_ name: String) -> String {
        let kinds = counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        return "MEASURED \(name): \(seeds) seeds, \(steps) steps in "
            + String(format: "%.2f s: %.1f seeds/s", seconds, Double(seeds) / seconds) + (kinds.isEmpty ? "" : " (\(kinds))")
    }
}

extension SimulationSeeds {
    /// Runs every seed in order. The first failing seed ends it: its report (``failure(seed:_:trace:filter:tail:)``,
    /// with the command that replays it) is returned; else the totals. A seed asked for by name
    /// prints its whole trace.
    package func runEach<Outcome: SimulationOutcome>(
        filter: String, tail: Int, _ run: (UInt64) async -> Outcome
    ) async -> (totals: SimulationTotals?, failure: String?) {
        let started = ContinuousClock.now
        var steps = 0
        var counts: [String: Int] = [:]
        for seed in seeds {
            let outcome = await run(seed)
            steps += outcome.steps
            counts.merge(outcome.counts, uniquingKeysWith: +)
            if let failure = outcome.failure {
                return (nil, self.failure(seed: seed, failure, trace: outcome.trace, filter: filter, tail: tail))
            }
            if single { print(outcome.trace.joined(separator: "\n")) }
        }
        let seconds = (ContinuousClock.now - started) / .seconds(1)
        return (SimulationTotals(seeds: seeds.count, steps: steps, counts: counts, seconds: seconds), nil)
    }
}
