import Synchronization
import DemoTestWaits
import Testing

@testable import PreviewKit

/// The service's work and waits without sleeping tasks: a push job cancelled alone, a timer's
/// wait that a cancellation ends at once.
@Suite struct PreviewWorkTests {
    /// A job is a child of the root: `cancel()` cancels its task (it sees `Task.isCancelled`),
    /// `ended()` returns once it ended, and the other jobs run on.
    @Test func aJobIsCancelledAloneAndItsEndIsAwaited() async throws {
        let work = PreviewWork()
        let sawCancel = Atomic<Bool>(false)
        let otherRan = Atomic<Bool>(false)
        let job = PreviewWork.Job {
            await timerSleep(for: .seconds(60))
            sawCancel.store(Task.isCancelled, ordering: .relaxed)
        }
        #expect(work.run(job))
        #expect(work.run { otherRan.store(true, ordering: .relaxed) })
        try await waitUntil("the other job ran") { otherRan.load(ordering: .relaxed) }
        job.cancel()
        let ended = Atomic<Bool>(false)
        let waiting = Task {
            await job.ended()
            ended.store(true, ordering: .relaxed)
        }
        try await waitUntil("the cancelled job ended", timeout: .seconds(10)) { ended.load(ordering: .relaxed) }
        let cancelled = sawCancel.load(ordering: .relaxed)
        #expect(cancelled)
        await waiting.value
        work.finish()
        #expect(!work.run {}, "a finished work takes no more jobs")
        await work.ended()
    }

    /// A timer's wait ends at once when its task is cancelled (not after its 60 s).
    @Test func aCancelledTimerSleepEndsAtOnce() async throws {
        let done = Atomic<Bool>(false)
        let sleeper = Task {
            await timerSleep(for: .seconds(60))
            done.store(true, ordering: .relaxed)
        }
        sleeper.cancel()
        try await waitUntil("the cancelled wait ended", timeout: .seconds(10)) { done.load(ordering: .relaxed) }
    }
}
