import Dispatch
import Foundation
import TestWaits
import Testing

/// The tests' own waits: woken by the change they wait for, not by a poll, and bounded.
@Suite struct TestWaitsTests {
    /// A condition is checked once at the start and once per change — three changes, at most four
    /// checks (a poll every 5 ms would check it about 60 times in the 300 ms the changes take) —
    /// and the change that makes it true ends the wait.
    @Test func aWaitOnAnObservedValueIsWokenByItsChangesOnly() async throws {
        let value = Observed(0)
        let checks = Observed(0)
        for step in 1...3 {
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(100 * step)) { value.update { $0 = step } }
        }
        let started = ContinuousClock.now
        let seen = try await value.wait("three", timeout: .seconds(30)) { current in
            checks.update { $0 += 1 }
            return current == 3
        }
        #expect(seen == 3)
        // (woken by the change at 300 ms, not by the deadline at 30 s, which would re-check too)
        #expect(ContinuousClock.now - started < .seconds(15), "woken by the change, not the deadline")
        #expect(checks.value <= 4, "the condition was checked \(checks.value) times for 3 changes")
    }

    /// A wait that is never satisfied throws at its deadline (not before), saying what it waited
    /// for and the last value.
    @Test func aWaitThatIsNeverSatisfiedThrowsAtItsDeadline() async throws {
        let value = Observed("start")
        let started = ContinuousClock.now
        do {
            try await value.wait("the end", timeout: .milliseconds(200)) { $0 == "end" }
            Issue.record("the wait returned")
        } catch let error as WaitTimedOut {
            #expect(ContinuousClock.now - started >= .milliseconds(200))
            #expect(error.description.contains("the end") && error.description.contains("start"), "\(error)")
        }
    }

    /// Cancelling the task that waits ends the wait at once (it throws, saying so), not at its
    /// deadline.
    @Test func aCancelledWaitEndsAtOnce() async throws {
        let value = Observed(0)
        let checked = Observed(false)
        let started = ContinuousClock.now
        let waiting = Task { () -> String in
            do {
                try await value.wait("a value nobody sets", timeout: .seconds(30)) { current in
                    defer { checked.update { $0 = true } }
                    return current == 1
                }
                return "returned"
            } catch {
                return "\(error)"
            }
        }
        try await checked.wait("the first check", timeout: .seconds(10)) { $0 }
        waiting.cancel()
        let outcome = await waiting.value
        #expect(outcome.contains("cancelled"), "\(outcome)")
        #expect(ContinuousClock.now - started < .seconds(15), "ended by the cancellation, not the 30-s deadline")
    }

    /// A child process's output and exit wake a wait on its `ChildWatch`: its line is seen after
    /// a handful of checks (one per write, one for the exit), and its exit status is reaped.
    @Test func aChildsOutputAndExitAreEvents() async throws {
        let path = NSTemporaryDirectory() + "testwaits-\(UUID().uuidString).out"
        #expect(FileManager.default.createFile(atPath: path, contents: nil))
        defer { unlink(path) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, path, O_WRONLY | O_TRUNC, 0o644)
        let words: [String] = ["/bin/sh", "-c", "sleep 0.3; echo hello; sleep 0.3; exit 3"]
        let argv = words.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        #expect(posix_spawn(&pid, "/bin/sh", &actions, nil, argv, environ) == 0)
        let child = pid
        let reaped = Observed<Int32?>(nil)
        let reap: @Sendable () -> Int32? = {
            reaped.update { status in
                var raw: Int32 = 0
                if status == nil, waitpid(child, &raw, WNOHANG) == child { status = (raw >> 8) & 0xff }
                return status
            }
        }
        defer { if reap() == nil { kill(child, SIGKILL); _ = waitForExit(child, timeout: .seconds(5), reap: reap) } }
        let watch = try ChildWatch(pid: child, outputPath: path)

        let checks = Observed(0)
        try await waitUntil("hello", timeout: .seconds(10), wokenBy: watch.changes) {
            checks.update { $0 += 1 }
            return ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").contains("hello")
        }
        #expect(checks.value <= 3, "checked \(checks.value) times for one write")
        #expect(reap() == nil, "still running after its line")
        try await waitUntil("exited", timeout: .seconds(10), wokenBy: watch.changes) { reap() != nil }
        #expect(reap() == 3)
    }

    /// Changes in a watched directory wake a wait on its `DirectoryWatch` — also in a directory
    /// created in it after the watch began (a server's hidden directory of partial transfers).
    @Test func filesInAWatchedDirectoryAreEvents() async throws {
        let root = NSTemporaryDirectory() + "testwaits-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let watch = try DirectoryWatch([root])
        let file = root + "/.partial/data"
        let checks = Observed(0)
        let waiter = Task {
            try await waitUntil("the file in the new directory", timeout: .seconds(30), wokenBy: watch.changes) {
                checks.update { $0 += 1 }
                return FileManager.default.fileExists(atPath: file)
            }
        }
        // The directory appears once the wait has checked; the file once the directory's event
        // was taken (its watch is added before the wait is woken): only that watch sees the file.
        try await checks.wait("the first check") { $0 >= 1 }
        try FileManager.default.createDirectory(atPath: root + "/.partial", withIntermediateDirectories: false)
        try await checks.wait("the check after the new directory") { $0 >= 2 }
        let signalled = watch.changes.value
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        // Only the new directory's watch sees the file: the watch must signal (a wait with a
        // deadline, not a timed assertion — the waiter's own deadline check cannot tell, as it
        // checks its condition once more when its deadline ends it). Then the waiter, woken, is done.
        // (How many checks: one per batch of events the queue read — FileManager writes through a
        // temporary file, in as many batches as the timing makes: 5 under ThreadSanitizer. Not a
        // bound worth asserting.)
        try await watch.changes.wait("the watch saw the file in the new directory", timeout: .seconds(10)) { $0 > signalled }
        try await waiter.value
    }

    /// The synchronous wait for an exit (used when a test's process is stopped) returns at the exit,
    /// not at its deadline, and nil at the deadline for a process that keeps running.
    @Test func theSynchronousExitWaitReturnsAtTheExit() throws {
        var pid: pid_t = 0
        let words: [String] = ["/bin/sh", "-c", "sleep 0.2"]
        let argv = words.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        #expect(posix_spawn(&pid, "/bin/sh", nil, nil, argv, environ) == 0)
        let reap: () -> Int32? = {
            var raw: Int32 = 0
            return waitpid(pid, &raw, WNOHANG) == pid ? raw : nil
        }
        #expect(waitForExit(pid, timeout: .milliseconds(50), reap: reap) == nil, "still running at 50 ms")
        let started = ContinuousClock.now
        #expect(waitForExit(pid, timeout: .seconds(10), reap: reap) == 0)
        #expect(ContinuousClock.now - started < .seconds(5), "returned at the exit, not at the deadline")
    }
}
