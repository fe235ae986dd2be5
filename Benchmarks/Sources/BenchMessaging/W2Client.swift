import BenchCommon
import Messaging

/// How long W2's handler client runs: a number of round trips, or a time.
public enum RoundTripsUntil: Sendable {
    case count(Int)
    case seconds(Double)
}

/// W2's handler client (bench-ours' default, and bench-siege's established client under a flood):
/// the reply is handled by an `on(type:)` handler on the channel's queue, which sends the next
/// request with `trySend` (like the NIO peer's client, which sends the next from channelRead).
/// After ``Workload/w2Warmup`` round trips, returns each round trip's nanoseconds.
public func handlerRoundTrips(_ channel: MessageChannel, until end: RoundTripsUntil) async throws -> [UInt64] {
    let sample = Sample.make(42)
    let finished = AsyncStream<[UInt64]>.makeStream()
    final class State: @unchecked Sendable {  // touched only by the handler (serial) and before it runs
        var latencies: [UInt64] = []
        var warm = 0
        var t0: UInt64 = 0
        var deadline: UInt64 = 0  // .seconds: set when the warm-up ends
    }
    let state = State()
    if case .count(let n) = end { state.latencies.reserveCapacity(n) } else { state.latencies.reserveCapacity(200_000) }
    channel.on(type: "s", as: Sample.self) { back, _ in
        guard back == sample else { fail("W2: bad reply") }
        let t = nowNanos()
        if state.warm < Workload.w2Warmup {
            state.warm += 1
            if state.warm == Workload.w2Warmup, case .seconds(let seconds) = end { state.deadline = t + UInt64(seconds * 1e9) }
        } else {
            state.latencies.append(t - state.t0)
        }
        let done: Bool
        switch end {
        case .count(let n): done = state.latencies.count == n
        case .seconds: done = state.deadline != 0 && t >= state.deadline
        }
        if done {
            finished.continuation.yield(state.latencies)
            return
        }
        state.t0 = nowNanos()
        guard (try? channel.trySend(sample, type: "s")) == true else { fail("W2: send queue full") }
    }
    state.t0 = nowNanos()
    try await channel.send(sample, type: "s")
    var results = finished.stream.makeAsyncIterator()
    guard let latencies = await results.next() else { fail("W2: no result") }
    return latencies
}
