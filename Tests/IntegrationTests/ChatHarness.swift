import Foundation
import Synchronization
import TestWaits

/// A process started by a chat test with a pipe on its stdin (so a test can type into a scripted
/// `bonjour-chat`), output to a file. Stopped by PID when the test ends — also on failure, via deinit.
final class ChatProcess: Sendable {
    let pid: pid_t
    let arguments: [String]
    let outputPath: String
    private let input: Mutex<Int32>
    private let exitStatus = Mutex<Int32?>(nil)
    /// Its output and its exit, as events.
    let watch: ChildWatch

    /// Starts `arguments` on host "b" (through nsenter) or here, on host "a".
    convenience init(onB: Bool, _ arguments: [String]) throws {
        try self.init(prefix: onB ? ["nsenter", "-t", Harness.hostBPID, "-m", "-n", "--"] : [], arguments)
    }

    /// Starts `prefix + arguments` (the prefix enters another host, e.g. `nsenter -t PID -m -n -u --`).
    init(prefix: [String], _ arguments: [String]) throws {
        signal(SIGPIPE, SIG_IGN)  // a child that exits must not take the test runner with it
        self.arguments = prefix + arguments
        outputPath = NSTemporaryDirectory() + "chat-itest-\(UUID().uuidString).out"
        guard FileManager.default.createFile(atPath: outputPath, contents: nil) else {
            throw HarnessError("cannot create \(outputPath)")
        }
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw HarnessError("pipe: \(String(cString: strerror(errno)))") }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, fds[0], 0)  // dup2 clears O_CLOEXEC on fd 0
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        let argv = (["/usr/bin/env"] + self.arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var child: pid_t = 0
        let result = spawnWithCleanSignals(&child, "/usr/bin/env", &actions, argv)
        close(fds[0])
        guard result == 0 else {
            close(fds[1])
            throw HarnessError("cannot start \(arguments): \(String(cString: strerror(result)))")
        }
        pid = child
        input = Mutex(fds[1])
        do {
            watch = try ChildWatch(pid: child, outputPath: outputPath)
        } catch {
            close(fds[1])
            terminate(child) {
                var raw: Int32 = 0
                return waitpid(child, &raw, WNOHANG) == child ? exitCode(waitStatus: raw) : nil
            }
            throw error
        }
    }

    var text: String { (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "" }
    var lines: [String] { text.split(separator: "\n").map(String.init) }

    /// Types one line into the process's stdin.
    func send(_ line: String) throws {
        try input.withLock { fd in
            guard fd >= 0 else { throw HarnessError("stdin of \(arguments) is closed") }
            let bytes = Array((line + "\n").utf8)
            var offset = 0
            while offset < bytes.count {
                let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress!, $0.count) }
                if written < 0 {
                    if errno == EINTR { continue }
                    throw HarnessError("write to \(arguments): \(String(cString: strerror(errno)))")
                }
                offset += written
            }
        }
    }

    /// Closes stdin (end of input).
    func closeInput() {
        input.withLock { fd in
            if fd >= 0 { close(fd) }
            fd = -1
        }
    }

    /// Waits (bounded) until the output contains `needle`; fails early if the process exits first.
    @discardableResult
    func waitForOutput(_ needle: String, timeout: Duration = .seconds(15)) async throws -> String {
        try await waitForOutput(needle, timeout: timeout) { $0.contains(needle) }
    }

    /// Waits (bounded) until a whole line of output satisfies `predicate`, woken by each write and
    /// by the exit; returns that line.
    @discardableResult
    func waitForOutput(_ what: String, timeout: Duration = .seconds(15), where predicate: (String) -> Bool) async throws
        -> String
    {
        // whole lines only (a write can end mid-line), or everything once the process exited
        func finished() -> [String] {
            let exited = poll() != nil  // before the text: a line written before the exit is in it
            return completeLines(of: text, exited: exited).split(separator: "\n").map(String.init)
        }
        var found: String?
        try? await waitUntil(what, timeout: timeout, wokenBy: watch.changes) {
            found = finished().first(where: predicate)
            return found != nil || poll() != nil
        }
        if let line = found ?? finished().first(where: predicate) { return line }
        let exited = poll()
        throw HarnessError(
            "no '\(what)' from \(arguments) within \(timeout)"
                + "\(exited.map { " (it exited: \($0))" } ?? ""); output:\n\(text)"
        )
    }

    /// Reaps the child if it exited; returns its status (128 + signal when killed).
    @discardableResult
    func poll() -> Int32? {
        exitStatus.withLock { status in
            if status != nil { return status }
            var raw: Int32 = 0
            if waitpid(pid, &raw, WNOHANG) == pid { status = exitCode(waitStatus: raw) }
            return status
        }
    }

    /// Waits (bounded) for the exit status; nil if still running at the deadline.
    func waitForExit(timeout: Duration) async -> Int32? {
        try? await waitUntil("\(arguments) exited", timeout: timeout, wokenBy: watch.changes) { poll() != nil }
        return poll()
    }

    /// Sends a signal to this PID only.
    func deliver(signal number: Int32) {
        if poll() == nil { kill(pid, number) }
    }

    /// SIGTERM, then SIGKILL if it does not go within 5 s. Only this PID.
    func stop() {
        closeInput()
        terminate(pid, poll: poll)
    }

    deinit {
        stop()
        unlink(outputPath)
    }
}

/// A tmux server of its own (private socket) running one command in a 120×30 window.
final class TmuxSession: Sendable {
    let socket: String
    /// A directory of its own where tmux copies the pane's output (`pipe-pane`): each write wakes a
    /// wait for the screen. tmux parses the program's output into its screen when it reads it and
    /// only queues the copy, written to the pipe on a later turn of its event loop: a capture taken
    /// when the file changed shows that output. (nil: the pipe did not open; the waits poll.)
    private let outputDirectory: String
    private let outputWatch: DirectoryWatch?

    init(_ command: [String]) throws {
        let line = command.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
        let socket = "chat-itest-\(UUID().uuidString.prefix(8))"
        let directory = NSTemporaryDirectory() + "chat-itest-pane-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try Self.tmux(socket, ["new-session", "-d", "-x", "120", "-y", "30", "-s", "chat", line])
        // (Output before the pipe opens is on the screen already: a wait checks the screen first.)
        _ = try? Self.tmux(socket, ["pipe-pane", "-o", "-t", "chat", "cat >> '\(directory)/pane'"])
        let piped = (try? Self.tmux(socket, ["display-message", "-p", "-t", "chat", "#{pane_pipe}"]))?.hasPrefix("1") ?? false
        self.socket = socket
        outputDirectory = directory
        outputWatch = piped ? try? DirectoryWatch([directory]) : nil
    }

    @discardableResult
    func tmux(_ arguments: [String]) throws -> String { try Self.tmux(socket, arguments) }

    @discardableResult
    static func tmux(_ socket: String, _ arguments: [String]) throws -> String {
        let result = try Harness.run(["tmux", "-L", socket] + arguments, timeout: .seconds(10))
        guard result.status == 0 else {
            throw HarnessError("tmux \(arguments) failed (\(result.status)): \(result.output)")
        }
        return result.output
    }

    /// Types text literally (no key names).
    func type(_ text: String) throws { try tmux(["send-keys", "-t", "chat", "-l", text]) }
    /// Presses keys by name (`Enter`, `C-c`).
    func press(_ keys: String...) throws { try tmux(["send-keys", "-t", "chat"] + keys) }

    /// The visible screen, one string per row (trailing blank rows dropped); `escapes` keeps colours.
    func screen(escapes: Bool = false) throws -> [String] {
        var rows = try tmux(["capture-pane", "-p", "-t", "chat"] + (escapes ? ["-e"] : []))
            .split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        while let last = rows.last, last.trimmingCharacters(in: .whitespaces).isEmpty { rows.removeLast() }
        return rows
    }

    /// Waits (bounded) until the screen satisfies `predicate`.
    @discardableResult
    func waitForScreen(_ what: String, timeout: Duration = .seconds(15), _ predicate: ([String]) -> Bool) async throws
        -> [String]
    {
        // Checked now and at each write of the pane's output (its copy in `outputDirectory`, told by
        // inotify), not on a timer; were the copy not watched, every 50 ms.
        var rows: [String] = []
        do {
            if let outputWatch {
                try await waitUntil("the screen shows \(what)", timeout: timeout, wokenBy: outputWatch.changes) {
                    rows = (try? screen()) ?? []
                    return predicate(rows)
                }
            } else {
                try await waitUntil("the screen shows \(what)", timeout: timeout, every: .milliseconds(50)) {
                    rows = (try? screen()) ?? []
                    return predicate(rows)
                }
            }
        } catch is WaitTimedOut {
            throw HarnessError("screen never showed \(what) within \(timeout); screen:\n\(rows.joined(separator: "\n"))")
        }
        return rows
    }

    /// Ends this tmux server (its own socket only) and removes the copy of its output.
    func kill() {
        _ = try? Harness.run(["tmux", "-L", socket, "kill-server"], timeout: .seconds(10))
        try? FileManager.default.removeItem(atPath: outputDirectory)
    }

    deinit { kill() }
}
