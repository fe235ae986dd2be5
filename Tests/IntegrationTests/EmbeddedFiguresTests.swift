import Foundation
import Testing

@testable import Discovery

/// The figures of both backends side by side, in the same harness: two discovery-peer processes
/// (publisher on host b, browser on host a), avahi-daemon on both hosts for the Avahi figures and
/// on neither for the embedded ones. Printed as MEASURED lines, not asserted (beyond "it worked").
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct EmbeddedFiguresTests {
    static let rounds = 3

    func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

    func milliseconds(_ from: UInt64, _ to: UInt64) -> Double { Double(Int64(bitPattern: to &- from)) / 1e6 }

    func avahiRSS(on host: String) -> Int? {
        let holder = host == "a" ? EmbeddedHarness.hostAPID : Harness.hostBPID
        guard let text = try? String(contentsOfFile: "/proc/\(holder)/root/run/avahi-daemon/pid", encoding: .utf8),
            let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)),
            let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
        else { return nil }
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }

    @Test(arguments: ["avahi", "embedded"])
    func figures(backend: String) async throws {
        let avahi = backend == "avahi"
        try EmbeddedHarness.setAvahi(on: "a", running: avahi)
        try EmbeddedHarness.setAvahi(on: "b", running: avahi)
        defer {
            try? EmbeddedHarness.setAvahi(on: "a", running: false)
            try? EmbeddedHarness.setAvahi(on: "b", running: false)
        }
        let type = "_fig-\(backend)._tcp"
        let staticType = "_fig-static-\(backend)._tcp"
        let publisher = try await Peer.discovery(onB: true, backend: backend)
        defer { publisher.stop() }
        let browser = try await Peer.discovery(onB: false, backend: backend)
        defer { browser.stop() }
        try browser.send("browse \(type)")
        try await browser.wait("ALLFORNOW")

        var visible: [Double] = []
        var ready: [Double] = []
        var resolved: [Double] = []
        var removed: [Double] = []
        for round in 1...Self.rounds {
            let name = "Fig\(round)"
            let published = monotonicNanoseconds()
            try publisher.send("publish \(name) \(type) \(4700 + round) round=\(round)")
            let added = try await browser.wait("ADDED \(name)")
            let resolution = try await browser.wait("RESOLVED \(name)") {
                $0.contains("round=\(round)") && $0.contains("10.77.0.2")
            }
            try await publisher.wait("PUBLISHED \(name)")
            visible.append(milliseconds(published, added.time))
            ready.append(milliseconds(published, resolution.time))
            resolved.append(milliseconds(added.time, resolution.time))
            let withdrawn = monotonicNanoseconds()
            try publisher.send("unpublish")
            let gone = try await browser.wait("REMOVED \(name)")
            removed.append(milliseconds(withdrawn, gone.time))
        }
        // A fresh browse for a service published a while ago: browse → resolved.
        try publisher.send("publish Static \(staticType) 4799 s=1")
        try await publisher.wait("PUBLISHED Static")
        let browsed = monotonicNanoseconds()
        try browser.send("browse \(staticType)")
        let staticResolved = try await browser.wait("RESOLVED Static")
        let coldResolve = milliseconds(browsed, staticResolved.time)

        try publisher.send("rss")
        let publisherRSS = Int(try await publisher.wait("RSS ").text.dropFirst(4)) ?? 0
        try browser.send("rss")
        let browserRSS = Int(try await browser.wait("RSS ").text.dropFirst(4)) ?? 0

        let label = "figures [\(backend)]"
        func list(_ values: [Double]) -> String { values.map { String(format: "%.0f", $0) }.joined(separator: ", ") }
        print(
            "MEASURED \(label) publish → visible on the other host: median \(String(format: "%.1f", median(visible))) ms (rounds: \(list(visible)))"
        )
        print(
            "MEASURED \(label) publish → resolved on the other host: median \(String(format: "%.1f", median(ready))) ms (rounds: \(list(ready)))"
        )
        print(
            "MEASURED \(label) added → resolved: median \(String(format: "%.1f", median(resolved))) ms (rounds: \(list(resolved)))"
        )
        print(
            "MEASURED \(label) unpublish → removed on the other host: median \(String(format: "%.1f", median(removed))) ms (rounds: \(list(removed)))"
        )
        Harness.measured("\(label) new browse → resolved (service published earlier)", coldResolve, "ms")
        Harness.measured("\(label) RSS of the publishing process", Double(publisherRSS) / 1024, "MiB")
        Harness.measured("\(label) RSS of the browsing process", Double(browserRSS) / 1024, "MiB")
        if avahi {
            Harness.measured(
                "\(label) RSS of avahi-daemon on the publishing host", Double(avahiRSS(on: "b") ?? 0) / 1024, "MiB")
        }
        #expect(visible.count == Self.rounds && removed.count == Self.rounds)
    }
}
