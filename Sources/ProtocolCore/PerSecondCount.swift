/// Events counted in the current whole second of uptime, starting again at each new second: the
/// "at most N a second" of refusals, their events and lingering replies. Without I/O: the caller
/// passes the time (uptime nanoseconds).
package struct PerSecondCount: Sendable, Equatable {
    private var second: UInt64 = 0
    private var count = 0

    package init() {}

    /// Counts one event at `now` and returns how many this second has had, this one included.
    @discardableResult
    package mutating func add(now: UInt64) -> Int {
        let thisSecond = now / 1_000_000_000
        if thisSecond != second {
            second = thisSecond
            count = 0
        }
        count += 1
        return count
    }

    /// Whether nothing was ever counted.
    package var isEmpty: Bool { count == 0 }

    /// How many events the second of `now` has had so far.
    package func current(now: UInt64) -> Int { now / 1_000_000_000 == second ? count : 0 }
}
