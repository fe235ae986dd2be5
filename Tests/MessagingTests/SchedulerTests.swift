import Dispatch
import Locks
import MDNSCore
import Scheduling
import TestWaits
import Testing

/// The package's one clock for timers: the manual one runs what comes due, in order, on its
/// queue, only when turned; the Dispatch one is real time.
@Suite struct SchedulerTests {
    @Test func aManualClockRunsWhatComesDueInDeadlineOrderOnlyWhenTurned() {
        let clock = ManualScheduler()
        let ran = Locked<[String]>([])
        let start = clock.now
        clock.schedule(after: .seconds(3)) { ran.withLock { $0.append("c at \(clock.now - start)") } }
        clock.schedule(after: .seconds(1)) { ran.withLock { $0.append("a at \(clock.now - start)") } }
        clock.schedule(after: .seconds(1)) { ran.withLock { $0.append("b at \(clock.now - start)") } }  // same deadline: scheduled later, runs later
        #expect(clock.pendingCount == 3)
        #expect(clock.nextDeadline == start + 1_000_000_000)
        clock.advance(by: .milliseconds(999))
        #expect(ran.withLock { $0 }.isEmpty)
        clock.advance(by: .milliseconds(1))
        #expect(ran.withLock { $0 } == ["a at 1000000000", "b at 1000000000"])
        clock.advance(by: .seconds(10))
        #expect(ran.withLock { $0 } == ["a at 1000000000", "b at 1000000000", "c at 3000000000"])
        #expect(clock.now - start == 11_000_000_000)
        #expect(clock.pendingCount == 0)
    }

    /// Work for an absolute time runs at that time; a time already past runs at the next turn,
    /// without the clock moving (a deadline the connection's timer or the loop's sweep arms late).
    @Test func workAtAnAbsoluteTimeRunsThenAndATimePastRunsAtOnce() {
        let clock = ManualScheduler()
        let start = clock.now
        let ran = Locked<[String]>([])
        clock.advance(by: .seconds(5))
        clock.schedule(at: start + 7_000_000_000, on: nil) { ran.withLock { $0.append("later at \(clock.now - start)") } }
        clock.schedule(at: start + 2_000_000_000, on: nil) { ran.withLock { $0.append("past at \(clock.now - start)") } }
        #expect(clock.nextDeadline == start + 5_000_000_000)
        clock.advance(by: .zero)
        #expect(ran.withLock { $0 } == ["past at 5000000000"])
        clock.advance(by: .milliseconds(1_999))
        #expect(ran.withLock { $0 }.count == 1)
        clock.advance(by: .milliseconds(1))
        #expect(ran.withLock { $0 } == ["past at 5000000000", "later at 7000000000"])
    }

    /// Work that schedules more work inside the window turned runs it too, at its own time.
    @Test func workScheduledByWorkRunsInTheSameTurnWhenDue() {
        let clock = ManualScheduler()
        let start = clock.now
        let times = Locked<[UInt64]>([])
        @Sendable func again(_ remaining: Int) {
            times.withLock { $0.append(clock.now - start) }
            if remaining > 0 { clock.schedule(after: .seconds(1)) { again(remaining - 1) } }
        }
        clock.schedule(after: .seconds(1)) { again(3) }
        clock.advance(by: .milliseconds(3_500))
        #expect(times.withLock { $0 } == [1_000_000_000, 2_000_000_000, 3_000_000_000])
        #expect(clock.pendingCount == 1)
        clock.advance(by: .seconds(1))
        #expect(times.withLock { $0 }.count == 4)
    }

    /// Work for a queue runs on that queue (a channel's loop), and the turn waits for it.
    /// A simulation's step: `runNext` runs one timer — the earliest; of several due at one
    /// instant, the one the seeded generator picks — and the same seed picks the same order, the
    /// same jitter. Unseeded, ties go in scheduling order.
    @Test func aSeededClockRunsOneTimerAtATimeInTheSeedsOrder() {
        func order(_ clock: ManualScheduler) -> (ran: [Int], jitter: Double, after: Bool) {
            let ran = Locked<[Int]>([])
            clock.schedule(after: .seconds(2)) { ran.withLock { $0.append(9) } }
            for n in 0..<6 { clock.schedule(after: .seconds(1)) { ran.withLock { $0.append(n) } } }
            var steps = 0
            let target = clock.now + 1_000_000_000  // the six, not the one due a second later
            while clock.runNext(through: target) { steps += 1 }
            #expect(steps == 6, "the timer due later ran early, or one ran twice")
            #expect(clock.now == 2_000_000_000, "the clock is not at the last timer's deadline")
            let jitter = clock.random(in: 0.8...1.0)
            #expect((0.8...1.0).contains(jitter))
            let ranSix = ran.withLock { $0 }
            return (ranSix, jitter, clock.runNext(through: target + 1_000_000_000) && ran.withLock { $0.last } == 9)
        }
        let first = order(ManualScheduler(start: 1_000_000_000, choosingWith: SplitMix64(seed: 3)))
        let again = order(ManualScheduler(start: 1_000_000_000, choosingWith: SplitMix64(seed: 3)))
        let other = order(ManualScheduler(start: 1_000_000_000, choosingWith: SplitMix64(seed: 4)))
        let unseeded = order(ManualScheduler(start: 1_000_000_000))
        #expect(first.ran.sorted() == Array(0..<6) && first.ran == again.ran && first.jitter == again.jitter)
        #expect(first.ran != other.ran || first.jitter != other.jitter, "the seed decides nothing")
        #expect(unseeded.ran == Array(0..<6))
        #expect(first.ran != unseeded.ran || other.ran != unseeded.ran, "the seed never reorders timers due at one instant")
        #expect(first.after && unseeded.after, "the later timer did not run at its own deadline")
    }

    @Test func workRunsOnItsQueue() {
        let clock = ManualScheduler()
        let queue = DispatchQueue(label: "loop")
        let onQueue = Locked<Bool?>(nil)
        clock.schedule(after: .seconds(5), on: queue) {
            dispatchPrecondition(condition: .onQueue(queue))
            onQueue.withLock { $0 = true }
        }
        clock.advance(by: .seconds(5))
        #expect(onQueue.withLock { $0 } == true)
    }

    /// A cancelled work never runs and lets go of what it captured at once.
    @Test func cancellingLetsGoOfTheWorkAtOnce() {
        final class Captured: Sendable {}
        let clock = ManualScheduler()
        weak var weakCaptured: Captured?
        let ran = Locked(false)
        let work: ScheduledWork = {
            let captured = Captured()
            weakCaptured = captured
            return clock.schedule(after: .seconds(3_600)) { _ = captured; ran.withLock { $0 = true } }
        }()
        #expect(weakCaptured != nil)
        work.cancel()
        #expect(weakCaptured == nil, "the cancelled work still holds what it captured")
        #expect(clock.pendingCount == 0)
        clock.advance(by: .seconds(7_200))
        #expect(!ran.withLock { $0 })
    }

    /// A sleep on the manual clock ends when the clock is turned past it (not before), or at once
    /// when its task is cancelled; `waitForPending` sees the sleep armed without polling.
    @Test func aSleepEndsWhenTheClockIsTurnedOrTheTaskCancelled() async {
        let clock = ManualScheduler()
        let woke = Locked(false)
        let sleeper = Task {
            await clock.sleep(for: .seconds(60))
            woke.withLock { $0 = true }
        }
        #expect(await clock.waitForPending(1))
        clock.advance(by: .seconds(59))
        #expect(!woke.withLock { $0 } && clock.pendingCount == 1)
        clock.advance(by: .seconds(1))
        await sleeper.value
        #expect(woke.withLock { $0 })

        let cancelled = Task { await clock.sleep(for: .seconds(3_600)) }
        #expect(await clock.waitForPending(1))
        cancelled.cancel()
        await cancelled.value  // ends without a turn of the clock
        #expect(clock.pendingCount == 0, "the cancelled sleep's timer was cancelled too")
    }

    /// A wait for no timer left is woken by the cancellation (or the run) that left none — on
    /// another thread, while the waiter sleeps — and not by the one before it. (The condition
    /// counts its checks: the first is made when the wait registers, in the same critical section,
    /// so a count of one means the waiter sleeps; every later one is a change re-checked.)
    @Test func aWaitForNoTimerLeftIsWokenByTheCancellationThatLeftNone() async throws {
        let clock = ManualScheduler()
        let first = clock.schedule(after: .seconds(1)) {}
        let second = clock.schedule(after: .seconds(2)) {}
        /// A wait for no timer left whose condition counts its checks in `checks`.
        func waitForNone(counting checks: Observed<Int>) -> Task<Bool, Never> {
            Task {
                await clock.waitForPending(within: .seconds(20)) { deadlines in
                    checks.signal()
                    return deadlines.isEmpty
                }
            }
        }
        let checks = Observed(0)
        let waiter = waitForNone(counting: checks)
        try await checks.wait("the wait registered") { $0 >= 1 }
        first.cancel()  // re-checked at once, on this thread: one timer left, the wait goes on
        #expect(checks.value == 2 && clock.pendingCount == 1)
        let cancelled = Task.detached { second.cancel() }  // another thread
        await cancelled.value
        #expect(await waiter.value, "the cancellation that left no timer did not wake the wait (it ran out)")
        #expect(checks.value == 3)
        first.cancel()  // a second cancel changes nothing
        #expect(checks.value == 3)

        let third = clock.schedule(after: .seconds(1)) {}
        let runChecks = Observed(0)
        let ran = waitForNone(counting: runChecks)
        try await runChecks.wait("the second wait registered") { $0 >= 1 }
        clock.advance(by: .seconds(1))
        #expect(await ran.value && !third.isPending, "the run that left no timer did not wake the wait")
        #expect(runChecks.value == 2)
    }

    /// `waitForPending` reports false when nothing is armed within its (real) time.
    @Test func waitingForTimersThatNeverComeEnds() async {
        let clock = ManualScheduler()
        #expect(await clock.waitForPending(1, within: .milliseconds(50)) == false)
    }

    /// Real time: the work runs after its delay on Dispatch's clock; a sleep cancelled ends at once.
    @Test func dispatchTimeRunsWorkAfterItsDelayAndEndsACancelledSleepAtOnce() async {
        let clock = DispatchScheduler()
        let start = clock.now
        let ranAt = await withCheckedContinuation { (continuation: CheckedContinuation<UInt64, Never>) in
            clock.schedule(after: .milliseconds(20)) { continuation.resume(returning: clock.now) }
        }
        #expect(ranAt - start >= 20_000_000)
        // Cancelled before its time; its queue held until then, so that the cancel never races the
        // work (with 1 ms to go and the queue free, a loaded machine — the TSan stage beside a CI
        // run — let it run first, once in 3 runs of the flake check). Its timer still fires,
        // after the cancel, and must run nothing: the later work on the same queue comes after it.
        let queue = DispatchQueue(label: "held until the cancel")
        queue.suspend()
        let cancelledWork = Locked(false)
        clock.schedule(after: .milliseconds(1), on: queue) { cancelledWork.withLock { $0 = true } }.cancel()
        queue.resume()
        await withCheckedContinuation { continuation in clock.schedule(after: .milliseconds(5), on: queue) { continuation.resume() } }
        #expect(!cancelledWork.withLock { $0 }, "a cancelled work ran")
        let sleeper = Task { await clock.sleep(for: .seconds(3_600)) }
        sleeper.cancel()
        await sleeper.value  // an hour's sleep, ended by the cancellation
    }

    /// A re-armable timer on a manual clock: armed, moved earlier and later, it fires once per
    /// arming at the last deadline it was given, on its queue; cancelled, it never fires again.
    @Test func aRearmableTimerFiresOnceAtItsLastDeadlineAndNotAfterItsCancel() {
        let clock = ManualScheduler()
        let start = clock.now
        let queue = DispatchQueue(label: "timer")
        let fired = Locked<[UInt64]>([])
        let timer = clock.makeTimer(on: queue) {
            dispatchPrecondition(condition: .onQueue(queue))
            fired.withLock { $0.append(clock.now - start) }
        }
        timer.arm(at: start + 5_000_000_000)
        timer.arm(at: start + 2_000_000_000)  // moved earlier
        timer.arm(at: start + 3_000_000_000)  // and later again
        #expect(clock.pendingCount == 1, "one armed deadline, not one per arming")
        clock.advance(by: .seconds(10))
        #expect(fired.withLock { $0 } == [3_000_000_000])
        timer.arm(at: start + 12_000_000_000)
        clock.advance(by: .seconds(5))
        #expect(fired.withLock { $0 } == [3_000_000_000, 12_000_000_000], "armed again after it fired")
        timer.arm(at: start + 20_000_000_000)
        timer.cancel()
        timer.arm(at: start + 21_000_000_000)
        #expect(clock.pendingCount == 0)
        clock.advance(by: .seconds(10))
        #expect(fired.withLock { $0 } == [3_000_000_000, 12_000_000_000], "fired after its cancel")
    }

    /// The same on Dispatch's clock (one timer source, moved in place): moved from an hour away to
    /// 20 ms, it fires once, not before its deadline, on its queue; cancelled while armed, never.
    @Test func aDispatchRearmableTimerIsMovedInPlaceAndFiresOnce() async {
        let clock = DispatchScheduler()
        let queue = DispatchQueue(label: "timer")
        let fired = Locked<[UInt64]>([])
        let waiter = Locked<CheckedContinuation<Void, Never>?>(nil)
        let timer = clock.makeTimer(on: queue) {
            dispatchPrecondition(condition: .onQueue(queue))
            fired.withLock { $0.append(clock.now) }
            waiter.withLock { continuation in
                continuation?.resume()
                continuation = nil
            }
        }
        let deadline = clock.now + 20_000_000
        await withCheckedContinuation { continuation in
            waiter.withLock { $0 = continuation }
            timer.arm(at: clock.now + 3_600_000_000_000)
            timer.arm(at: deadline)
        }
        let times = fired.withLock { $0 }
        #expect(times.count == 1 && times[0] >= deadline, "fired at \(times), deadline \(deadline)")
        let cancelled = clock.makeTimer(on: queue) { fired.withLock { $0.append(0) } }
        cancelled.arm(at: clock.now + 1_000_000)
        cancelled.cancel()
        // A later work on the same queue: the cancelled timer's deadline has passed by then.
        await withCheckedContinuation { continuation in clock.schedule(after: .milliseconds(10), on: queue) { continuation.resume() } }
        #expect(fired.withLock { $0.count } == 1, "a cancelled timer fired")
        timer.cancel()
    }

    /// A timer that re-arms itself with no delay would turn `advance` into a loop without end (a CI
    /// run held until its 90 minutes): after ``ManualScheduler/worksPerInstantLimit`` works at one
    /// instant the process stops, saying where. Work at many instants is not counted against it.
    @Test func aTimerReArmingItselfWithNoDelayStopsTheProcessWithAMessage() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let clock = ManualScheduler()
            @Sendable func again() { clock.schedule(after: .zero) { again() } }
            again()
            clock.advance(by: .seconds(1))
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("works ran at 1000000000 ns without the clock moving"), "\(stderr.suffix(500))")
        // Many more works than the limit, spread over instants: no livelock, advance returns.
        let clock = ManualScheduler()
        let runs = Locked(0)
        @Sendable func tick() {
            if runs.withLock({ count in count += 1; return count }) < ManualScheduler.worksPerInstantLimit + 10 {
                clock.schedule(after: .nanoseconds(1)) { tick() }
            }
        }
        tick()
        clock.advance(by: .seconds(1))
        #expect(runs.withLock { $0 } == ManualScheduler.worksPerInstantLimit + 10)
    }
}
