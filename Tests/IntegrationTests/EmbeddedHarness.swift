import Foundation
import Logging
import Testing

@testable import Discovery

/// Helpers for the embedded-backend tests (Tests/run.sh runs them in a harness started with
/// `--avahi none`: dbus on both hosts, avahi-daemon only where a test starts it).
enum EmbeddedHarness {
    static var hostAPID: String { Harness.environment["HARNESS_HOST_A_PID"]! }

    /// The python of the venv with python-zeroconf (Tests/harness/install-zeroconf.sh).
    static var zeroconfPython: String {
        Harness.environment["ZEROCONF_PYTHON"]
            ?? Harness.repoRoot.appendingPathComponent(".build/zeroconf-venv/bin/python").path
    }

    static var zeroconfPeerScript: String {
        Harness.repoRoot.appendingPathComponent("Tests/harness/zeroconf-peer.py").path
    }

    /// Whether avahi-daemon runs on a host (its pid file names a live process).
    static func avahiRuns(on host: String) -> Bool {
        let holder = host == "a" ? hostAPID : Harness.hostBPID
        guard let text = try? String(contentsOfFile: "/proc/\(holder)/root/run/avahi-daemon/pid", encoding: .utf8),
            let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines))
        else { return false }
        return kill(pid, 0) == 0
    }

    /// Starts or stops avahi-daemon on a host, so that it runs exactly when `running`.
    static func setAvahi(on host: String, running: Bool) throws {
        guard avahiRuns(on: host) != running else { return }
        try Harness.control(running ? "avahi-start" : "avahi-stop", host: host)
    }

    /// avahi-browse on host b (`-rpt` resolves, `-pt` lists): parsed lines.
    static func avahiBrowse(_ type: String, resolve: Bool) throws -> [[String]] {
        let result = try Harness.run(
            ["nsenter", "-t", Harness.hostBPID, "-m", "-n", "--", "avahi-browse", resolve ? "-rpt" : "-pt", type],
            timeout: .seconds(15))
        return result.output.split(separator: "\n").map {
            $0.split(separator: ";", omittingEmptySubsequences: false).map(String.init)
        }
    }

    /// Repeats `avahiBrowse` (bounded) until `predicate` holds for the lines.
    @discardableResult
    static func avahiBrowse(
        _ type: String, resolve: Bool, timeout: Duration = .seconds(10), until predicate: ([[String]]) -> Bool
    ) throws -> [[String]] {
        let deadline = ContinuousClock.now + timeout
        var lines: [[String]] = []
        repeat {
            lines = try avahiBrowse(type, resolve: resolve)
            if predicate(lines) { return lines }
        } while ContinuousClock.now < deadline
        throw HarnessError("avahi-browse \(type) on b never showed what was expected within \(timeout); last: \(lines)")
    }

    static func logger(_ label: String) -> Logger { Harness.logger(label) }
}

/// A scripted peer process (discovery-peer or zeroconf-peer.py) on host a or b: commands on its
/// stdin, one timestamped line per event on its stdout.
final class Peer: Sendable {
    let process: ChatProcess

    init(onB: Bool, _ arguments: [String]) throws {
        process = try ChatProcess(onB: onB, arguments)
    }

    init(prefix: [String], _ arguments: [String]) throws {
        process = try ChatProcess(prefix: prefix, arguments)
    }

    /// discovery-peer with a backend (and, for the embedded one, a host name other than the kernel's).
    static func discovery(onB: Bool, backend: String, hostName: String? = nil) async throws -> Peer {
        let environment = hostName.map { ["/usr/bin/env", "LANMSG_DISCOVERY_HOSTNAME=\($0)"] } ?? []
        let peer = try Peer(onB: onB, environment + [Harness.binary("discovery-peer"), backend])
        try await peer.wait("BACKEND \(backend == "automatic" ? "" : backend)")
        return peer
    }

    /// python-zeroconf.
    static func zeroconf(onB: Bool) async throws -> Peer {
        let peer = try Peer(onB: onB, [EmbeddedHarness.zeroconfPython, EmbeddedHarness.zeroconfPeerScript])
        try await peer.wait("BACKEND zeroconf")
        return peer
    }

    func send(_ command: String) throws { try process.send(command) }

    /// Waits for a line whose text (after the timestamp) starts with `prefix` and satisfies
    /// `predicate`; returns the monotonic time of the line (ns) and its text.
    @discardableResult
    func wait(
        _ prefix: String, after: UInt64 = 0, timeout: Duration = .seconds(15),
        where predicate: (String) -> Bool = { _ in true }
    ) async throws -> (time: UInt64, text: String) {
        let line = try await process.waitForOutput(prefix, timeout: timeout) { line in
            guard let (time, text) = Self.split(line) else { return false }
            return time >= after && text.hasPrefix(prefix) && predicate(text)
        }
        return Self.split(line)!
    }

    /// Lines so far (timestamp, text).
    var lines: [(time: UInt64, text: String)] { process.lines.compactMap(Self.split) }

    static func split(_ line: String) -> (UInt64, String)? {
        guard let space = line.firstIndex(of: " "), let time = UInt64(line[..<space]) else { return nil }
        return (time, String(line[line.index(after: space)...]))
    }

    func stop() {
        try? send("quit")
        process.closeInput()
        _ = process.poll()
        process.stop()
    }

    deinit { stop() }
}

/// CLOCK_MONOTONIC in nanoseconds (the peers' line timestamps use it too).
func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

/// utime + stime of this process, in clock ticks.
func ownCPUTicks() -> Int { cpuTicks(pid: getpid()) }
