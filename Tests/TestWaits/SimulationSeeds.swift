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
