import Foundation
import Logging
import Synchronization
import SystemCalls
import TestWaits
import Testing

/// The avahi namespace harness (Tests/harness/avahi-harness.sh), seen from a test running inside host "a".
enum Harness {
    static let environment = ProcessInfo.processInfo.environment
    /// True when the tests run inside the harness (Tests/run.sh does that).
    static var isActive: Bool { environment["HARNESS_STATE"] != nil }
    static var state: String { environment["HARNESS_STATE"]! }
    static var script: String { environment["HARNESS_SCRIPT"]! }
    static var hostBPID: String { environment["HARNESS_HOST_B_PID"]! }
    static let disabledReason: Comment = "needs real avahi-daemons in network namespaces: run Tests/run.sh"

    /// Repository root (for the built binaries).
    static var repoRoot: URL {
        var url = URL(fileURLWithPath: #filePath)
        while url.path != "/" {
            url.deleteLastPathComponent()
            if FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) { return url }
        }
        fatalError("no Package.swift above \(#filePath)")
    }

    /// The directory of the built products (the directory of the running test binary, so a
    /// `--scratch-path` build finds its own executables).
    static var binDir: URL {
        let executable = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = executable.deletingLastPathComponent()
        // On Linux the test binary is <bin>/<Package>PackageTests.xctest
        if directory.lastPathComponent.hasSuffix(".xctest") { directory.deleteLastPathComponent() }
        return directory
    }

    /// The programs, built by their own package (Demo/Package.swift): its debug products, or
    /// `LANMSG_PROGRAMS_DIR` (Tests/run.sh sets it).
    static let programs: Set = ["bonjour-chat", "discovery-demo", "lanmsg", "lanmsg-echo", "preview-push", "preview-server"]
    static var programsDir: URL {
        if let directory = environment["LANMSG_PROGRAMS_DIR"] { return URL(fileURLWithPath: directory) }
        return repoRoot.appendingPathComponent("Demo/.build/debug")
    }

    /// Path of a built executable, e.g. `binary("bonjour-chat")`: a program from Demo's package, a
    /// test helper (discovery-peer, readme-board, session-chaos) from this one.
    static func binary(_ name: String) -> String {
        (programs.contains(name) ? programsDir : binDir).appendingPathComponent(name).path
    }

    /// Runs a harness control command (avahi-kill, avahi-start, dbus-restart, ...) and waits for it.
    static func control(_ action: String, host: String) throws {
        let result = try run([script, action, state, host])
        guard result.status == 0 else {
            throw HarnessError("harness \(action) \(host) failed (\(result.status)): \(result.output)")
        }
    }

    /// Runs a command to completion (bounded by `timeout`), returning exit status and combined output.
    @discardableResult
    static func run(_ arguments: [String], timeout: Duration = .seconds(30)) throws -> (status: Int32, output: String) {
        let child = try Background(arguments)
        let status = child.wait(timeout: timeout)
        return (status ?? -1, child.text)
    }

    /// Runs `arguments` on host "b" (or here, for host "a") in the background; stop it with `stop()`.
    static func spawn(onB: Bool, _ arguments: [String]) throws -> Background {
        let prefix = onB ? ["nsenter", "-t", hostBPID, "-m", "-n", "--"] : []
        return try Background(prefix + arguments)
    }

    static func logger(_ label: String) -> Logger {
        var logger = Logger(label: label) { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = environment["TEST_LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? .warning
        return logger
    }

    /// Prints a measured figure in a greppable form (Tests/run.sh collects these lines).
    static func measured(_ what: String, _ duration: Duration) {
        measured(what, Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15, "ms")
    }

    /// Prints a measured figure with its unit (Tests/run.sh collects these lines).
    static func measured(_ what: String, _ value: Double, _ unit: String) {
        print("MEASURED \(what): \(String(format: "%.1f", value)) \(unit)")
    }
}

/// `posix_spawn` of `path` with a child that starts with no signal blocked and every signal at its
/// default action (``withDefaultSignalsSpawnAttributes(_:)``). A child inherits the spawning
/// thread's signal mask and the signals the runner ignores (SIGPIPE, below); one that started with
/// SIGTERM blocked or ignored sat out ``terminate(_:poll:)``'s SIGTERM until its SIGKILL 5 s later.
func spawnWithCleanSignals(
    _ child: inout pid_t, _ path: String, _ actions: inout posix_spawn_file_actions_t, _ argv: [UnsafeMutablePointer<CChar>?]
) -> Int32 {
    withDefaultSignalsSpawnAttributes { posix_spawn(&child, path, &actions, $0, argv, environ) }
}

/// SIGTERM to `pid` (only that one), then SIGKILL if `poll` reports no exit within 5 s.
func terminate(_ pid: pid_t, poll: () -> Int32?) {
    guard poll() == nil else { return }
    kill(pid, SIGTERM)
    if waitForExit(pid, timeout: .seconds(5), reap: poll) == nil {
        kill(pid, SIGKILL)
        _ = waitForExit(pid, timeout: .seconds(5), reap: poll)
    }
}

/// `text` up to its last newline — the lines a process has finished writing — or all of it once the
/// process exited.
func completeLines(of text: String, exited: Bool) -> Substring {
    exited ? text[...] : text[..<(text.lastIndex(of: "\n") ?? text.startIndex)]
}

/// A `waitpid` status as a shell would report it: the exit code, or 128 + the signal.
func exitCode(waitStatus raw: Int32) -> Int32 {
    raw & 0x7f == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
}

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A process started by a test (posix_spawn, output to a file), stopped by PID when the test ends —
/// also on failure, via deinit.
final class Background: @unchecked Sendable {  // pid is immutable; `exited` is locked
    let pid: pid_t
    let arguments: [String]
    let outputPath: String
    let exitStatus = Locked<Int32?>(nil)
    /// The child's peak resident set size in KiB (`wait4` rusage), once it exited.
    let peakRSSKiB = Locked<Int?>(nil)
    /// Its output and its exit, as events.
    let watch: ChildWatch

    init(_ arguments: [String]) throws {
        self.arguments = arguments
        outputPath = NSTemporaryDirectory() + "itest-\(UUID().uuidString).out"
        guard FileManager.default.createFile(atPath: outputPath, contents: nil) else {
            throw HarnessError("cannot create \(outputPath)")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        let argv = (["/usr/bin/env"] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var child: pid_t = 0
        let result = spawnWithCleanSignals(&child, "/usr/bin/env", &actions, argv)
        guard result == 0 else { throw HarnessError("cannot start \(arguments): \(String(cString: strerror(result)))") }
        pid = child
        do {
            watch = try ChildWatch(pid: child, outputPath: outputPath)
        } catch {
            terminate(child) { Self.reap(child) }
            throw error
        }
    }

    var text: String { (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "" }

    /// Waits (bounded) until a whole line of the output (one its newline ended; any text once the
    /// process exited) contains `needle`, woken by each write and by the exit; throws at once if the
    /// process exited without it. Whole lines: a write can end mid-line ("PORT " before its number).
    func waitForOutput(_ needle: String, timeout: Duration = .seconds(10)) async throws {
        do {
            try await waitUntil("'\(needle)' in the output", timeout: timeout, wokenBy: watch.changes) {
                let exited = poll() != nil
                return completeLines(of: text, exited: exited).contains(needle) || exited
            }
        } catch {}
        let exited = poll() != nil  // before the text: a line written before the exit is in it
        guard completeLines(of: text, exited: exited).contains(needle) else {
            let status = poll().map { " (it exited: \($0))" } ?? ""
            throw HarnessError("no '\(needle)' from \(arguments) within \(timeout)\(status); output: \(text)")
        }
    }

    private static func reap(_ pid: pid_t) -> Int32? {
        var raw: Int32 = 0
        return waitpid(pid, &raw, WNOHANG) == pid ? exitCode(waitStatus: raw) : nil
    }

    /// Reaps the child if it exited; returns its status.
    @discardableResult
    func poll() -> Int32? {
        exitStatus.value.withLock { status in
            if status != nil { return status }
            var raw: Int32 = 0
            var usage = rusage()
            if wait4(pid, &raw, WNOHANG, &usage) == pid {
                status = exitCode(waitStatus: raw)
                peakRSSKiB.value.withLock { $0 = Int(usage.ru_maxrss) }
            }
            return status
        }
    }

    /// Waits for exit (bounded); nil if still running at the deadline.
    func wait(timeout: Duration) -> Int32? { waitForExit(pid, timeout: timeout, reap: poll) }

    /// SIGTERM, then SIGKILL if it does not go within 5 s. Only this PID.
    func stop() { terminate(pid, poll: poll) }

    deinit {
        stop()
        unlink(outputPath)
    }
}

/// Collects the elements of an async sequence in the background, so a test can wait (with a
/// deadline) for the next element that matches, several times over one sequence — woken by each
/// element, not by a poll.
final class Collector<Element: Sendable>: Sendable {
    let items = Observed<[Element]>([])
    let task: Task<Void, Never>

    init<S: AsyncSequence & Sendable>(_ sequence: S) where S.Element == Element {
        let items = self.items
        task = Task {
            do {
                for try await element in sequence { items.update { $0.append(element) } }
            } catch {}
        }
    }

    var all: [Element] { items.value }
    var count: Int { items.read { $0.count } }

    /// Waits for an element at index ≥ `start` that matches; returns it and its index.
    @discardableResult
    func wait(
        from start: Int = 0, timeout: Duration = .seconds(10), _ what: String = "event",
        where predicate: (Element) -> Bool
    ) async throws -> (element: Element, index: Int) {
        do {
            let snapshot = try await items.wait(what, timeout: timeout) { items in
                start < items.count && items[start...].contains(where: predicate)
            }
            let index = snapshot[start...].firstIndex(where: predicate)!
            return (snapshot[index], index)
        } catch is WaitTimedOut {
            throw HarnessError("no \(what) within \(timeout); saw: \(all)")
        }
    }

    func cancel() { task.cancel() }

    deinit { cancel() }
}

/// A lock-protected value in a class, so closures can share it.
final class Locked<Value: Sendable>: Sendable {
    let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
}
