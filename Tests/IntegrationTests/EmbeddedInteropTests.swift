import Foundation
import Testing

@testable import Discovery

// The embedded mDNS backend against real peers across the veth link: avahi-daemon, a second
// embedded stack, python-zeroconf. Tests/run.sh runs these suites (names starting "Embedded") in a
// harness whose hosts start without avahi-daemon (`--avahi none`); each test starts or stops
// avahi on a host as it needs. The test process is host "a".

/// Embedded (host a, no avahi-daemon there) ↔ avahi-daemon (host b).
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct EmbeddedAvahiInteropTests {
    let logger = EmbeddedHarness.logger("embedded-avahi")

    init() throws {
        try EmbeddedHarness.setAvahi(on: "a", running: false)
        try EmbeddedHarness.setAvahi(on: "b", running: true)
    }

    @Test func embeddedPublishIsResolvedByAvahiUpdatedAndRemoved() async throws {
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        #expect(discovery.activeBackend == .embedded)
        let type = "_emb-to-avahi._tcp"
        let service = try await discovery.publish(
            name: "Embedded Pub", type: type, port: 4711, txt: ["path": "/docs", "v": "3"])
        #expect(try await service.established() == "Embedded Pub")
        let resolved = try EmbeddedHarness.avahiBrowse(type, resolve: true) { lines in
            lines.contains { $0.count > 9 && $0[0] == "=" && $0[3] == "Embedded\\032Pub" && $0[9].contains("\"v=3\"") }
        }.filter { $0.count > 9 && $0[0] == "=" && $0[3] == "Embedded\\032Pub" }
        #expect(resolved.allSatisfy { $0[8] == "4711" && $0[9].contains("\"path=/docs\"") })
        let addresses = Set(resolved.map { $0[7] })
        #expect(addresses.contains("10.77.0.1"), "\(addresses)")
        #expect(addresses.contains { $0.hasPrefix("fe80::") }, "\(addresses)")
        // Never a loopback address on another link.
        #expect(!addresses.contains { $0.hasPrefix("127.") || $0 == "::1" }, "\(addresses)")
        // TXT update: avahi's cache takes the new record (cache-flush announcement).
        try await service.updateTXT(["path": "/docs", "v": "4"])
        try EmbeddedHarness.avahiBrowse(type, resolve: true) { lines in
            lines.contains { $0.count > 9 && $0[3] == "Embedded\\032Pub" && $0[9].contains("\"v=4\"") }
                && !lines.contains { $0.count > 9 && $0[3] == "Embedded\\032Pub" && $0[9].contains("\"v=3\"") }
        }
        // Removal: goodbye packets; avahi forgets it about a second later.
        await service.unpublish()
        try EmbeddedHarness.avahiBrowse(type, resolve: false) { lines in
            !lines.contains { $0.count > 3 && $0[3] == "Embedded\\032Pub" }
        }
    }

    @Test func avahiPublishIsBrowsedResolvedWatchedAndRemovedByEmbedded() async throws {
        let type = "_avahi-to-emb._tcp"
        let avahi = try await Peer.discovery(onB: true, backend: "avahi")
        try avahi.send("publish AvahiPub \(type) 5151 k=v flag")
        defer { avahi.stop() }
        try await avahi.wait("PUBLISHED AvahiPub")
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        let events = Collector(try discovery.browse(type: type))
        let (added, _) = try await events.wait(timeout: .seconds(10), "added") {
            if case .added(let s) = $0 { s.name == "AvahiPub" } else { false }
        }
        guard case .added(let found) = added else { return }
        #expect(!found.isOwn && !found.isLocal)
        let resolved = try await discovery.resolve(found)
        #expect(resolved.port == 5151)
        #expect(resolved.hostName == "bravo.local")
        #expect(resolved.txt["k"] == "v" && resolved.txt.contains("flag"))
        #expect(resolved.addresses.contains { $0.ip.description == "10.77.0.2" }, "\(resolved)")
        let va = UInt32(if_nametoindex("va"))
        #expect(resolved.addresses.contains { $0.ip.isLinkLocal && $0.scopeID == va }, "\(resolved)")
        // A TXT update on the Avahi side reaches an embedded watcher.
        let watcher = Collector(try discovery.watch(ServiceIdentity(name: "AvahiPub", type: type)))
        try await watcher.wait(timeout: .seconds(10), "k=v") { $0.txt["k"] == "v" }
        try avahi.send("txt k=w")
        try await avahi.wait("TXT-UPDATED")
        try await watcher.wait(timeout: .seconds(10), "k=w") { $0.txt["k"] == "w" }
        // Removal.
        try avahi.send("unpublish")
        try await events.wait(timeout: .seconds(10), "removed") {
            if case .removed(let s) = $0 { s.name == "AvahiPub" } else { false }
        }
    }

    @Test func sameNameIsRenamedEitherWayBetweenEmbeddedAndAvahi() async throws {
        let type = "_emb-clash._tcp"
        // Avahi has it first: the embedded publication becomes "Clash #2".
        let avahi = try Harness.spawn(onB: true, ["avahi-publish", "-s", "Clash", type, "7001"])
        defer { avahi.stop() }
        try await avahi.waitForOutput("Established")
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        let ours = try await discovery.publish(name: "Clash", type: type, port: 7002)
        let events = Collector(ours.events)
        try await events.wait(timeout: .seconds(10), "renamed") { $0 == .renamed(from: "Clash", to: "Clash #2") }
        #expect(try await ours.established() == "Clash #2")
        // Embedded has it first: avahi-publish renames its own.
        let held = try await discovery.publish(name: "Held", type: type, port: 7003)
        #expect(try await held.established() == "Held")
        let late = try Harness.spawn(onB: true, ["avahi-publish", "-s", "Held", type, "7004"])
        defer { late.stop() }
        try await late.waitForOutput("Established under name 'Held #2'")
        // Avahi on b sees all four.
        try EmbeddedHarness.avahiBrowse(type, resolve: false) { lines in
            let names = Set(lines.filter { $0.count > 3 }.map { $0[3] })
            // avahi-browse -p escapes ' ' as \032 and '#' as \035.
            return names.isSuperset(of: ["Clash", "Clash\\032\\0352", "Held", "Held\\032\\0352"])
        }
    }
}

/// Embedded ↔ embedded: the test process on a, discovery-peer on b; no avahi-daemon anywhere.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct EmbeddedPeerInteropTests {
    let logger = EmbeddedHarness.logger("embedded-peer")

    init() throws {
        try EmbeddedHarness.setAvahi(on: "a", running: false)
        try EmbeddedHarness.setAvahi(on: "b", running: false)
    }

    @Test func embeddedToEmbeddedInBothDirections() async throws {
        let type = "_emb-emb._tcp"
        let peer = try await Peer.discovery(onB: true, backend: "embedded")
        defer { peer.stop() }
        try peer.send("browse \(type)")
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        // a → b: publish, resolve with TXT, TXT update, removal.
        let service = try await discovery.publish(name: "FromA", type: type, port: 4100, txt: ["rev": "1"])
        try await service.established()
        let resolvedOnB = try await peer.wait("RESOLVED FromA")
        #expect(
            resolvedOnB.text.contains(" 4100 rev=1 |") && resolvedOnB.text.contains("10.77.0.1"), "\(resolvedOnB.text)")
        #expect(!resolvedOnB.text.contains("127.0.0.1"), "\(resolvedOnB.text)")
        try peer.send("watch FromA \(type)")
        try await peer.wait("WATCH FromA rev=1")
        try await service.updateTXT(["rev": "2"])
        try await peer.wait("WATCH FromA rev=2")
        await service.unpublish()
        try await peer.wait("REMOVED FromA")
        // b → a.
        let events = Collector(try discovery.browse(type: type))
        try peer.send("publish FromB \(type) 4200 rev=1")
        try await peer.wait("PUBLISHED FromB")
        let (added, _) = try await events.wait(timeout: .seconds(10), "FromB added") {
            if case .added(let s) = $0 { s.name == "FromB" } else { false }
        }
        guard case .added(let found) = added else { return }
        let resolved = try await discovery.resolve(found)
        #expect(resolved.port == 4200 && resolved.txt["rev"] == "1")
        #expect(resolved.addresses.contains { $0.ip.description == "10.77.0.2" }, "\(resolved)")
        // Both hosts have the same kernel host name here: one of them claimed "<name>-2".
        #expect(resolved.hostName != "\(discovery.hostName).local", "both claimed \(resolved.hostName)")
        let watcher = Collector(try discovery.watch(found.identity))
        try await watcher.wait(timeout: .seconds(10), "rev=1") { $0.txt["rev"] == "1" }
        try peer.send("txt rev=2")
        try await watcher.wait(timeout: .seconds(10), "rev=2") { $0.txt["rev"] == "2" }
        try peer.send("unpublish")
        try await events.wait(timeout: .seconds(10), "FromB removed") {
            if case .removed(let s) = $0 { s.name == "FromB" } else { false }
        }
    }

    @Test func sameNameOnTwoEmbeddedHostsIsRenamed() async throws {
        let type = "_emb-twin._tcp"
        let peer = try await Peer.discovery(onB: true, backend: "embedded")
        defer { peer.stop() }
        try peer.send("publish Twin \(type) 4300")
        try await peer.wait("PUBLISHED Twin")
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        let ours = try await discovery.publish(name: "Twin", type: type, port: 4301)
        #expect(try await ours.established() == "Twin #2")
        // Two of our own on one host with one name: the second is renamed at once.
        let first = try await discovery.publish(name: "Solo", type: type, port: 1)
        let second = try await discovery.publish(name: "Solo", type: type, port: 2)
        #expect(try await first.established() == "Solo")
        #expect(try await second.established() == "Solo #2")
    }
}

/// Embedded (host a) ↔ python-zeroconf (host b), no avahi-daemon anywhere.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct EmbeddedZeroconfInteropTests {
    let logger = EmbeddedHarness.logger("embedded-zeroconf")

    init() throws {
        try EmbeddedHarness.setAvahi(on: "a", running: false)
        try EmbeddedHarness.setAvahi(on: "b", running: false)
    }

    @Test func zeroconfPublishIsBrowsedResolvedUpdatedAndRemoved() async throws {
        let type = "_zc-to-emb._tcp"
        let zeroconf = try await Peer.zeroconf(onB: true)
        defer { zeroconf.stop() }
        try zeroconf.send("publish Zeroconf \(type) 5000 a=1")
        try await zeroconf.wait("PUBLISHED Zeroconf")
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        let events = Collector(try discovery.browse(type: type))
        let (added, _) = try await events.wait(timeout: .seconds(10), "added") {
            if case .added(let s) = $0 { s.name == "Zeroconf" } else { false }
        }
        guard case .added(let found) = added else { return }
        let resolved = try await discovery.resolve(found)
        #expect(resolved.port == 5000 && resolved.txt["a"] == "1" && resolved.hostName == "zcpeer.local", "\(resolved)")
        #expect(resolved.addresses.contains { $0.ip.description == "10.77.0.2" }, "\(resolved)")
        let watcher = Collector(try discovery.watch(found.identity))
        try await watcher.wait(timeout: .seconds(10), "a=1") { $0.txt["a"] == "1" }
        try zeroconf.send("txt a=2")
        try await watcher.wait(timeout: .seconds(10), "a=2") { $0.txt["a"] == "2" }
        try zeroconf.send("unpublish")
        try await events.wait(timeout: .seconds(10), "removed") {
            if case .removed(let s) = $0 { s.name == "Zeroconf" } else { false }
        }
    }

    @Test func embeddedPublishIsSeenByZeroconfUpdatedAndRemoved() async throws {
        let type = "_emb-to-zc._tcp"
        let zeroconf = try await Peer.zeroconf(onB: true)
        defer { zeroconf.stop() }
        try zeroconf.send("browse \(type)")
        let discovery = ServiceDiscovery(logger: logger, backend: .embedded)
        defer { Task { await discovery.shutdown() } }
        let service = try await discovery.publish(name: "ForZeroconf", type: type, port: 6000, txt: ["x": "1"])
        try await service.established()
        let resolved = try await zeroconf.wait("RESOLVED ForZeroconf")
        #expect(resolved.text.contains(" 6000 x=1 |") && resolved.text.contains("10.77.0.1"), "\(resolved.text)")
        try await service.updateTXT(["x": "2"])
        try await zeroconf.wait("RESOLVED ForZeroconf", after: resolved.time) { $0.contains(" x=2 ") }
        await service.unpublish()
        try await zeroconf.wait("REMOVED ForZeroconf")
    }
}
