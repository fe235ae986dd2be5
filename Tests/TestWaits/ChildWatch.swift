import Dispatch
import Glibc

/// pidfd_open(2) (Linux 5.3, glibc 2.36): a descriptor that becomes readable once the process has
/// exited. Looked up at run time — Swift's Glibc module has no `sys/pidfd.h`, and cannot call the
/// variadic syscall(2). -1 with errno set on failure (ENOSYS when the C library lacks it).
func pidfdOpen(_ pid: pid_t) -> Int32 {
    typealias Open = @convention(c) (pid_t, UInt32) -> Int32
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "pidfd_open") else {  // RTLD_DEFAULT
        errno = ENOSYS
        return -1
    }
    return unsafeBitCast(symbol, to: Open.self)(pid, 0)
}

/// What a test waits for in a child process it started — more output in its file, its exit — as
/// events, not polls: inotify on the output file (every write), and a pidfd (readable once the
/// process has exited). Each event signals `changes`; a wait re-checks its condition then.
///
/// Where the kernel or C library has no pidfd (Linux before 5.3, glibc before 2.36, a seccomp
/// filter), the exit is looked for every 20 ms instead: `changes` is signalled on that timer.
package final class ChildWatch: @unchecked Sendable {  // immutable after init; the sources are thread-safe
    package let changes = Observed<Int>()
    private let exitSeen = Observed(false)
    private let output: any DispatchSourceRead
    private let exit: any DispatchSourceProtocol
    /// The queue the sources' handlers run on, and where they are cancelled.
    private let queue: DispatchQueue

    /// Whether the process's exit was seen (its pidfd turned readable) — before whoever reaps it
    /// (a `Foundation.Process`) says so. Never true on the 20-ms fallback.
    package var exited: Bool { exitSeen.value }

    /// `outputPath` must exist (the parent creates it before the spawn). A process that has already
    /// exited and been reaped (a `Foundation.Process` reaps its own) has no pidfd: the watch then
    /// signals once, at once, and the waiter's condition sees the exit.
    package init(pid: pid_t, outputPath: String) throws {
        let queue = DispatchQueue(label: "itest.child-watch")
        self.queue = queue
        let changes = changes
        let notify = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard notify >= 0, inotify_add_watch(notify, outputPath, UInt32(IN_MODIFY | IN_CLOSE_WRITE)) >= 0 else {
            let reason = String(cString: strerror(errno))
            if notify >= 0 { close(notify) }
            throw ChildWatchError(description: "cannot watch \(outputPath) (inotify): \(reason)")
        }
        output = DispatchSource.makeReadSource(fileDescriptor: notify, queue: queue)
        output.setEventHandler {
            var events = [UInt8](repeating: 0, count: 4_096)
            while read(notify, &events, events.count) > 0 {}  // drained: one signal per wake-up
            changes.signal()
        }
        output.setCancelHandler { close(notify) }
        var pidfd = pidfdOpen(pid)
        if pidfd < 0, errno == ESRCH {
            // gone already: a descriptor readable at once (a pipe whose writer is closed)
            var ends: [Int32] = [-1, -1]
            if pipe(&ends) == 0 {
                close(ends[1])
                _ = fcntl(ends[0], F_SETFD, FD_CLOEXEC)
                pidfd = ends[0]
            }
        }
        if pidfd >= 0 {
            let exit = DispatchSource.makeReadSource(fileDescriptor: pidfd, queue: queue)
            let exitSeen = exitSeen
            exit.setEventHandler {
                exitSeen.update { $0 = true }
                changes.signal()
                exit.cancel()  // a pidfd stays readable: once is enough
            }
            exit.setCancelHandler { close(pidfd) }
            self.exit = exit
        } else {  // no pidfd here: look for the exit every 20 ms
            let timer = DispatchSource.makeTimerSource(queue: queue)
            timer.schedule(deadline: .now() + .milliseconds(20), repeating: .milliseconds(20))
            timer.setEventHandler { changes.signal() }
            self.exit = timer
        }
        output.resume()
        exit.resume()
    }

    deinit {
        // Cancelled on the sources' own queue, where the exit handler cancels the exit source
        // itself: never two threads tearing one source down at once. (Cancelled from here while
        // that handler ran, libdispatch's epoll backend once trapped in the long chaos run —
        // "_dispatch_source_refs_finalize_unregistration", the source finalized twice.)
        let sources = Sources(output: output, exit: exit)
        queue.async { sources.cancel() }
    }

    /// The two sources, handed to their queue to be cancelled there (Dispatch's sources are
    /// thread-safe; Swift does not know it).
    private struct Sources: @unchecked Sendable {
        let output: any DispatchSourceRead
        let exit: any DispatchSourceProtocol
        func cancel() {
            output.cancel()
            exit.cancel()
        }
    }
}

/// Waits (bounded) for `pid` — a child of ours, not yet reaped — to exit, woken by its pidfd
/// (poll(2) on it), then reaps it through `reap`; nil if it still runs at the deadline.
package func waitForExit(_ pid: pid_t, timeout: Duration, reap: () -> Int32?) -> Int32? {
    if let status = reap() { return status }
    let deadline = ContinuousClock.now + timeout
    let pidfd = pidfdOpen(pid)
    guard pidfd >= 0 else {
        if errno == ESRCH { return reap() }  // gone already (reaped by `reap` meanwhile)
        while ContinuousClock.now < deadline {  // no pidfd here: look every 5 ms
            if let status = reap() { return status }
            usleep(5_000)
        }
        return reap()
    }
    defer { close(pidfd) }
    while true {
        let left = deadline - ContinuousClock.now
        guard left > .zero else { return reap() }
        var entry = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(clamping: left.components.seconds * 1_000 + left.components.attoseconds / 1_000_000_000_000_000 + 1)
        let ready = poll(&entry, 1, milliseconds)
        if ready > 0 { return reap() }
        if ready < 0 && errno != EINTR { return reap() }
    }
}

/// A child process that cannot be watched.
package struct ChildWatchError: Error, CustomStringConvertible {
    package let description: String
}
