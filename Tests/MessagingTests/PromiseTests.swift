import Dispatch
import Locks
import Testing

@testable import Messaging

/// ``Promise``: the first completion wins, whether it comes before or after the wait, and a
/// deadline only fails a promise nobody completed.
@Suite struct PromiseTests {
    struct Boom: Error, Equatable {}

    @Test func aValueCompletedBeforeTheWaitIsReturned() async throws {
        let promise = Promise<Int>()
        #expect(promise.succeed(1))
        #expect(!promise.succeed(2))  // later completions change nothing
        #expect(!promise.fail(Boom()))
        #expect(try await promise.value() == 1)
    }

    @Test func aWaiterIsResumedByTheCompletionOnAnotherThread() async throws {
        let promise = Promise<String>()
        DispatchQueue.global().async {
            promise.succeed("from the loop")
            promise.fail(Boom())
        }
        #expect(try await promise.value() == "from the loop")
    }

    @Test func aFailureIsThrown() async {
        let promise = Promise<Int>()
        DispatchQueue.global().async { promise.fail(Boom()) }
        await #expect(throws: Boom.self) { try await promise.value() }
    }

    /// A completion and a deadline (a timer on another thread) at the same moment: exactly one
    /// wins, and the waiter gets the winner's result.
    @Test func exactlyOneOfTwoRacingCompletionsWins() async throws {
        var disagreements = 0
        for round in 0..<500 {
            let promise = Promise<Int>()
            let wins = Locked([Int]())
            DispatchQueue.concurrentPerform(iterations: 2) { side in
                if promise.succeed(side) { wins.withLock { $0.append(side) } }
            }
            let winners = wins.withLock { $0 }
            let value = try await promise.value()
            if winners != [value] { disagreements += 1 }
            _ = round
        }
        #expect(disagreements == 0, "\(disagreements) of 500 races had no winner, two, or a waiter told another")
    }
}
