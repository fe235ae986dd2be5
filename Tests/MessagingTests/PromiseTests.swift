import Dispatch
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
        #expect(promise.isCompleted)
        #expect(try await promise.value() == 1)
    }

    @Test func aWaiterIsResumedByTheCompletionOnAnotherThread() async throws {
        let promise = Promise<String>()
        #expect(!promise.isCompleted)
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

    @Test func theDeadlineFailsOnlyAnUncompletedPromise() async throws {
        let queue = DispatchQueue(label: "promise-tests")
        let late = Promise<Int>()
        let expired = Promise<Bool>()
        late.fail(after: .milliseconds(10), on: queue, with: { Boom() }, expired: { expired.succeed(true) })
        await #expect(throws: Boom.self) { try await late.value() }
        #expect(try await expired.value())

        // Completed in time: the deadline neither fails it nor runs its `expired`.
        let prompt = Promise<Int>()
        let ranExpired = Promise<Bool>()
        prompt.fail(after: .milliseconds(10), on: queue, with: { Boom() }, expired: { ranExpired.succeed(true) })
        prompt.succeed(7)
        #expect(try await prompt.value() == 7)
        // The deadline's turn on the queue comes after 10 ms; anything it ran would be ahead of this.
        queue.asyncAfter(deadline: .now() + .milliseconds(50)) { ranExpired.succeed(false) }
        #expect(try await ranExpired.value() == false)
    }
}
