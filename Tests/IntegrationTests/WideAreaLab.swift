import Foundation
import TestWaits
import Testing

/// The routed lab of Tests/harness/widearea-harness.sh, seen from a test running inside host "a":
/// hosts a and c on one link, b on another subnet behind a router that forwards no multicast, and a
/// DNS namespace running BIND 9 for lab.home.arpa with per-host TSIG keys.
enum Lab {
    static let environment = ProcessInfo.processInfo.environment
    /// True when the tests run inside the lab (Tests/run.sh does that).
    static var isActive: Bool { environment["WIDEAREA_ZONE"] != nil }
    static let disabledReason: Comment = "needs the routed BIND lab: run Tests/run.sh"
    static var zone: String { environment["WIDEAREA_ZONE"] ?? "lab.home.arpa" }
    static var dnsServer: String { environment["WIDEAREA_DNS"] ?? "10.81.3.53" }
    static var state: String { environment["HARNESS_STATE"]! }
    static var script: String { environment["WIDEAREA_SCRIPT"]! }

    enum Host: String, CaseIterable {
        case a, b, c, dns
        var address: String {
            switch self {
            case .a: "10.81.1.10"
            case .b: "10.81.2.20"
            case .c: "10.81.1.30"
            case .dns: "10.81.3.53"
            }
        }
        var address6: String {
            switch self {
            case .a: "fd81:1::10"
            case .b: "fd81:2::20"
            case .c: "fd81:1::30"
            case .dns: "fd81:3::53"
            }
        }
        var hostName: String { "host\(rawValue).\(Lab.zone)" }
    }

    /// The key file of a host (`hosta.lab.home.arpa`, …), or of `guest` (known, granted nothing).
    static func keyFile(_ name: String) -> String { environment["WIDEAREA_KEYS"]! + "/\(name).key" }

    /// What enters a host (nothing for a: the tests run there).
    static func prefix(_ host: Host) -> [String] {
        guard host != .a else { return [] }
        let pid = environment[host == .dns ? "HARNESS_DNS_PID" : "HARNESS_HOST_\(host.rawValue.uppercased())_PID"]!
        return ["nsenter", "-t", pid, "-m", "-n", "-u", "--"]
    }

    /// The environment of our programs in the lab: the embedded mDNS stack (no avahi-daemon on a
    /// and b), 1-second polls, a private data directory.
    static func programEnvironment(_ extra: [String: String] = [:], data: String) -> [String] {
        var variables = [
            "LANMSG_DISCOVERY_BACKEND": "embedded", "LANMSG_WIDE_AREA_POLL": "1", "XDG_DATA_HOME": data,
        ]
        variables.merge(extra) { _, new in new }
        return ["/usr/bin/env"] + variables.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
    }

    /// A discovery-peer on `host`.
    static func peer(_ host: Host, _ extra: [String: String] = [:]) async throws -> Peer {
        let peer = try Peer(
            prefix: prefix(host),
            programEnvironment(extra, data: temporaryDirectory("peer-data")) + [Harness.binary("discovery-peer"), "embedded"])
        try await peer.wait("BACKEND embedded")
        return peer
    }

    /// Runs a command on `host` to completion (bounded).
    @discardableResult
    static func run(_ host: Host, _ arguments: [String], timeout: Duration = .seconds(30)) throws -> (status: Int32, output: String) {
        try Harness.run(prefix(host) + arguments, timeout: timeout)
    }

    /// `dig +short` asked of the lab's DNS server (from host b, across the router).
    static func dig(_ name: String, _ type: String) throws -> [String] {
        let result = try run(.b, ["dig", "+short", "+norecurse", "@\(dnsServer)", name, type], timeout: .seconds(10))
        return result.output.split(separator: "\n").map(String.init).filter { !$0.isEmpty && !$0.hasPrefix(";") }
    }

    /// The zone's SOA serial.
    static func serial() throws -> UInt32 {
        guard let soa = try dig(zone, "SOA").first, let serial = soa.split(separator: " ").dropFirst(2).first.flatMap({ UInt32($0) }) else {
            throw HarnessError("no SOA for \(zone)")
        }
        return serial
    }

    /// nsupdate from `host` with that host's key (`update` lines without `send`).
    static func nsupdate(_ host: Host, key: String, _ lines: [String]) throws {
        let script = temporaryDirectory("nsupdate") + "/update.txt"
        try (lines + ["send", ""]).joined(separator: "\n").write(toFile: script, atomically: true, encoding: .utf8)
        let result = try run(host, ["nsupdate", "-k", keyFile(key), script], timeout: .seconds(30))
        guard result.status == 0 else { throw HarnessError("nsupdate failed (\(result.status)): \(result.output)") }
    }

    /// A harness control command (named-stop, named-start, …).
    static func control(_ action: String, _ host: String? = nil) throws {
        let result = try Harness.run([script, action, state] + (host.map { [$0] } ?? []), timeout: .seconds(30))
        guard result.status == 0 else { throw HarnessError("\(action) failed (\(result.status)): \(result.output)") }
    }

    static func temporaryDirectory(_ label: String) -> String {
        let path = NSTemporaryDirectory() + "wa-\(label)-\(UUID().uuidString.prefix(8))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Polls `condition` every 50 ms (each check may ask BIND) until it holds or `timeout` passes
    /// (then throws): the tests' one poll (TestWaits).
    static func waitUntil(_ what: String, timeout: Duration = .seconds(15), _ condition: () throws -> Bool) async throws {
        try await TestWaits.waitUntil(what, timeout: timeout, every: .milliseconds(50), condition)
    }
}
