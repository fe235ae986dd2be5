import Foundation
import TestWaits
import Testing

@testable import Discovery

/// The embedded backend's own behaviour in the namespace harness: the automatic choice, the
/// interface policy, idle wakeups, a hostile responder. No avahi-daemon unless a test starts one.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct EmbeddedBehaviourTests {
    let logger = EmbeddedHarness.logger("embedded-behaviour")

    init() throws {
        try EmbeddedHarness.setAvahi(on: "a", running: false)
        try EmbeddedHarness.setAvahi(on: "b", running: false)
    }

    @Test func automaticChoosesEmbeddedWithoutADaemonAndAvahiWithOne() async throws {
        // The system bus runs on host a, avahi-daemon does not: the client stays "connecting".
        var start = ContinuousClock.now
        let without = ServiceDiscovery(logger: logger)
        #expect(await without.backend() == .embedded)
        Harness.measured("automatic choice without avahi-daemon (bus up) → embedded", ContinuousClock.now - start)
        #expect(without.activeBackend == .embedded)
        let service = try await without.publish(name: "Automatic", type: "_auto._tcp", port: 1)
        #expect(try await service.established() == "Automatic")
        await without.shutdown()
        #expect(without.daemonState == .stopped)

        try EmbeddedHarness.setAvahi(on: "a", running: true)
        defer { try? EmbeddedHarness.setAvahi(on: "a", running: false) }
        start = ContinuousClock.now
        let with = ServiceDiscovery(logger: logger)
        #expect(await with.backend() == .avahi)
        Harness.measured("automatic choice with avahi-daemon → avahi", ContinuousClock.now - start)
        await with.shutdown()
        // Forced in code: no waiting at all.
        let forced = ServiceDiscovery(logger: logger, backend: .embedded)
        #expect(forced.activeBackend == .embedded)
        await forced.shutdown()
    }

    /// A resolve whose task is cancelled ends then, not at its timeout (issue 54, 4).
    @Test func aCancelledResolveEndsThenNotAtItsTimeout() async throws {
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        let backend = try #require(await discovery.selector.backend() as? EmbeddedBackend)
        await checkThatACancelledResolveEndsThen(discovery) { await backend.resolvesRunning() }
    }

    /// Without a system bus at all, the automatic choice takes the embedded stack and says so once;
    /// it does not warn "is the system D-Bus running? retrying in 0.25 seconds" (issue 45, 7: it did,
    /// on every run, though nothing retried).
    @Test func withoutABusTheAutomaticChoiceDoesNotWarnOfARetry() async throws {
        let echo = try Harness.spawn(
            onB: true,
            ["env", "DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent/bus", Harness.binary("lanmsg-echo"), "--name", "No Bus Echo",
                "--type", "_nobus._tcp", "--log-level", "notice",
                "--identity", NSTemporaryDirectory() + "nobus-\(UUID().uuidString)/identity"])
        defer { echo.stop() }
        try await echo.waitForOutput("published as")
        #expect(echo.text.contains("discovery backend: embedded mDNS"), "\(echo.text)")
        #expect(!echo.text.contains("retrying in") && !echo.text.contains("is the system D-Bus running"), "\(echo.text)")
    }

    /// Each stack here claims a host name of its own (distinct from b's), so that what b resolves
    /// for a service is exactly what that stack advertises.
    func configuration(_ hostName: String, _ change: (inout DiscoveryConfiguration) -> Void = { _ in })
        -> DiscoveryConfiguration
    {
        var configuration = DiscoveryConfiguration(hostName: hostName)
        change(&configuration)
        return configuration
    }

    @Test func interfacePolicyIPVersionLoopbackAndAdvertisedAddresses() async throws {
        let type = "_emb-policy._tcp"
        let peer = try await Peer.discovery(onB: true, backend: "embedded", hostName: "bravo")
        defer { peer.stop() }
        try peer.send("browse \(type)")
        // Denied the link to b: published on loopback only.
        let loopbackOnly = ServiceDiscovery(
            logger: logger, backend: .embedded,
            configuration: configuration("pol-lo") { $0.interfaces = InterfacePolicy(denied: ["va"]) })
        defer { Task { await loopbackOnly.shutdown() } }
        let hidden = try await loopbackOnly.publish(name: "Hidden", type: type, port: 4501)
        try await hidden.established()
        // IPv4 only.
        let v4Only = ServiceDiscovery(
            logger: logger, backend: .embedded, configuration: configuration("pol-v4") { $0.ipVersion = .ipv4 })
        defer { Task { await v4Only.shutdown() } }
        let v4Service = try await v4Only.publish(name: "V4Only", type: type, port: 4502)
        try await v4Service.established()
        // Unrestricted, published last: once b has resolved it, it would have seen the others.
        let open = ServiceDiscovery(logger: logger, backend: .embedded, configuration: configuration("pol-open"))
        defer { Task { await open.shutdown() } }
        let visible = try await open.publish(name: "Visible", type: type, port: 4503)
        try await visible.established()

        let resolvedVisible = try await peer.wait("RESOLVED Visible").text
        #expect(
            resolvedVisible.contains("pol-open.local") && resolvedVisible.contains("10.77.0.1")
                && resolvedVisible.contains("fe80::"), "\(resolvedVisible)")
        #expect(
            !resolvedVisible.contains("127.0.0.1") && !resolvedVisible.contains(" ::1"),
            "loopback leaked: \(resolvedVisible)")
        let resolvedV4 = try await peer.wait("RESOLVED V4Only").text
        #expect(
            resolvedV4.contains("pol-v4.local") && resolvedV4.contains("10.77.0.1") && !resolvedV4.contains("fe80::"),
            "\(resolvedV4)")
        #expect(!peer.lines.contains { $0.text.contains("Hidden") }, "b saw a service published on loopback only")
        // On this host, over loopback, the loopback addresses are the answer.
        let local = try await loopbackOnly.resolve(ServiceIdentity(name: "Visible", type: type))
        #expect(!local.addresses.isEmpty && local.addresses.allSatisfy { $0.ip.isLoopback }, "\(local)")
        // Calls outside the policy are refused.
        #expect(throws: DiscoveryError.self) { _ = try loopbackOnly.browse(type: type, interface: .named("va")) }
        #expect(throws: DiscoveryError.self) { _ = try v4Only.browse(type: type, ipVersion: .ipv6) }
        // An advertised address replaces the interfaces' own.
        let natted = ServiceDiscovery(
            logger: logger, backend: .embedded,
            configuration: configuration("pol-nat") { $0.advertisedAddresses = [IPAddress("192.0.2.7")!] })
        defer { Task { await natted.shutdown() } }
        let service = try await natted.publish(name: "Natted", type: type, port: 4504)
        try await service.established()
        let resolvedNat = try await peer.wait("RESOLVED Natted").text
        #expect(
            resolvedNat.hasSuffix("pol-nat.local 4504  | 192.0.2.7")
                || resolvedNat.contains("pol-nat.local 4504  | 192.0.2.7"), "\(resolvedNat)")
        #expect(resolvedNat.hasSuffix("| 192.0.2.7"), "\(resolvedNat)")
    }

    @Test func anIdleStackDoesNotWakeUp() async throws {
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        let service = try await discovery.publish(name: "Idle", type: "_emb-idle._tcp", port: 1)
        try await service.established()
        // Announcements over: nothing scheduled for at least a minute (the next thing is the
        // expiry of its own looped-back records after their TTL).
        // (the engine tells no one of its schedule: the tests' one poll, TestWaits, every 100 ms)
        do {
            try await waitUntil("nothing scheduled within a minute", timeout: .seconds(10), every: .milliseconds(100)) {
                (await discovery.embeddedDiagnostics?.nextDeadline).map { $0 >= 60_000 } ?? true
            }
        } catch {
            Issue.record("still scheduled in \(String(describing: await discovery.embeddedDiagnostics?.nextDeadline)) ms after 10 s")
            return
        }
        let before = try #require(await discovery.embeddedDiagnostics)
        let ticks = ownCPUTicks()
        try await Task.sleep(for: .seconds(3))  // an observation window, not a wait for a condition
        let after = try #require(await discovery.embeddedDiagnostics)
        Harness.measured(
            "embedded idle (one service published): CPU of the test process over 3 s", Double(ownCPUTicks() - ticks),
            "ticks")
        Harness.measured(
            "embedded idle (one service published): wakeups over 3 s", Double(after.wakeups - before.wakeups), "")
        #expect(after.wakeups == before.wakeups, "woke \(after.wakeups - before.wakeups) times while idle")
        // With a browse: the scheduled queries (back-off 1 s, 2 s, 4 s...) and nothing else.
        let browse = Collector(try discovery.browse(type: "_emb-idle._tcp"))
        try await browse.wait(timeout: .seconds(5), "all for now") { $0 == .allForNow }
        let browsing = try #require(await discovery.embeddedDiagnostics)
        let browsingTicks = ownCPUTicks()
        try await Task.sleep(for: .seconds(5))  // observation window
        let later = try #require(await discovery.embeddedDiagnostics)
        Harness.measured(
            "embedded browsing, 1–6 s after start: wakeups (queries at ~3 s, ~7 s of back-off)",
            Double(later.wakeups - browsing.wakeups), "")
        Harness.measured(
            "embedded browsing, 1–6 s after start: CPU of the test process", Double(ownCPUTicks() - browsingTicks),
            "ticks")
        // One query in this window (at ~3.1 s) and its looped-back copy; answers are suppressed by
        // the known answer. Bounded well below anything that polls.
        #expect(later.wakeups - browsing.wakeups <= 10, "\(later.wakeups - browsing.wakeups) wakeups")
        browse.cancel()
        await discovery.shutdown()
        let final = try #require(await discovery.embeddedDiagnostics)
        #expect(final.liveSources == 0, "Dispatch sources left after shutdown: \(final.liveSources)")
    }

    @Test func aHostileResponderNeitherHangsNorGrowsMemory() async throws {
        let type = "_flood._tcp"
        let capacity = 2048
        let discovery = ServiceDiscovery(
            logger: logger, backend: .embedded, configuration: DiscoveryConfiguration(cacheCapacity: capacity))
        defer { Task { await discovery.shutdown() } }
        // A browse for the flooded type, consumed (counted, not stored).
        let counts = Locked<(added: Int, removed: Int, allForNow: Bool)>((0, 0, false))
        let browser = try discovery.browse(type: type)
        let consumer = Task {
            for await event in browser {
                counts.value.withLock { count in
                    switch event {
                    case .added: count.added += 1
                    case .removed: count.removed += 1
                    case .allForNow: count.allForNow = true
                    case .failed, .updated: break
                    }
                }
            }
        }
        defer { consumer.cancel() }
        let flood = [
            "python3", Harness.repoRoot.appendingPathComponent("Tests/harness/mdns-flood.py").path, "10.77.0.2", type,
            "3",
        ]
        let rssStart = residentKiB()
        var rssAfter: [Int] = []
        for round in 1...2 {
            let flooder = try Harness.spawn(onB: true, flood)
            #expect(flooder.wait(timeout: .seconds(30)) == 0, "flooder: \(flooder.text)")
            // The diagnostics call is queued behind every datagram already read: when it returns,
            // the stack has worked through the flood (it did not hang).
            let diagnostics = try #require(await discovery.embeddedDiagnostics)
            #expect(
                diagnostics.cacheCount <= capacity,
                "cache holds \(diagnostics.cacheCount) records (capacity \(capacity))")
            rssAfter.append(residentKiB())
            print(
                "MEASURED hostile flood round \(round): \(flooder.text.trimmingCharacters(in: .whitespacesAndNewlines)); "
                    + "received \(diagnostics.engine.received) datagrams, \(diagnostics.engine.malformed) malformed, "
                    + "cache \(diagnostics.cacheCount) records, \(diagnostics.cacheEvictions) evicted")
        }
        let final = try #require(await discovery.embeddedDiagnostics)
        #expect(final.engine.malformed > 0, "the malformed packets were not counted")
        #expect(final.cacheEvictions > 0, "the flood never reached the cache bound")
        let seen = counts.value.withLock { $0 }
        print("MEASURED hostile flood: browse events added \(seen.added), removed \(seen.removed)")
        Harness.measured("hostile flood: RSS before", Double(rssStart) / 1024, "MiB")
        Harness.measured("hostile flood: RSS after round 1", Double(rssAfter[0]) / 1024, "MiB")
        Harness.measured("hostile flood: RSS after round 2", Double(rssAfter[1]) / 1024, "MiB")
        // Bounded: the second flood, as large as the first, adds no lasting memory of its own.
        #expect(rssAfter[1] - rssAfter[0] < 16 * 1024, "RSS grew \(rssAfter[1] - rssAfter[0]) KiB in round 2")
        // Still responsive: a real service on b is found and resolved.
        let peer = try await Peer.discovery(onB: true, backend: "embedded")
        defer { peer.stop() }
        try peer.send("publish Legit _legit._tcp 4600 ok=1")
        try await peer.wait("PUBLISHED Legit")
        let resolved = try await discovery.resolve(
            ServiceIdentity(name: "Legit", type: "_legit._tcp"), timeout: .seconds(5))
        #expect(resolved.port == 4600 && resolved.txt["ok"] == "1")
    }
}
