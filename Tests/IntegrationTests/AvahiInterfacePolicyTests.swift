import Foundation
import Testing

@testable import Discovery

/// The interface policy on the Avahi backend (avahi-daemon on both hosts, as in the main
/// integration run): publish on permitted interfaces only, drop results from others, one IP
/// version, advertised addresses.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct AvahiInterfacePolicyTests {
    let logger = Harness.logger("avahi-policy")

    /// avahi-browse on b, repeated (bounded) until `predicate` holds.
    func browseOnB(_ type: String, resolve: Bool, until predicate: ([[String]]) -> Bool) throws -> [[String]] {
        let deadline = ContinuousClock.now + .seconds(10)
        var lines: [[String]] = []
        repeat {
            let result = try Harness.run(
                ["nsenter", "-t", Harness.hostBPID, "-m", "-n", "--", "avahi-browse", resolve ? "-rpt" : "-pt", type])
            lines = result.output.split(separator: "\n").map {
                $0.split(separator: ";", omittingEmptySubsequences: false).map(String.init)
            }
            if predicate(lines) { return lines }
        } while ContinuousClock.now < deadline
        throw HarnessError("avahi-browse \(type) on b never showed what was expected; last: \(lines)")
    }

    @Test func publishOnPermittedInterfacesAndOneIPVersionOnly() async throws {
        let type = "_av-policy._tcp"
        let denied = ServiceDiscovery(
            logger: logger, backend: .avahi,
            configuration: DiscoveryConfiguration(interfaces: InterfacePolicy(denied: ["va"])))
        defer { Task { await denied.shutdown() } }
        let v4 = ServiceDiscovery(
            logger: logger, backend: .avahi, configuration: DiscoveryConfiguration(ipVersion: .ipv4))
        defer { Task { await v4.shutdown() } }
        let open = ServiceDiscovery(logger: logger, backend: .avahi)
        defer { Task { await open.shutdown() } }
        let hidden = try await denied.publish(name: "AvHidden", type: type, port: 4601)
        try await hidden.established()
        let v4Service = try await v4.publish(name: "AvV4", type: type, port: 4602)
        try await v4Service.established()
        let visible = try await open.publish(name: "AvVisible", type: type, port: 4603)
        try await visible.established()
        let lines = try browseOnB(type, resolve: true) { lines in
            lines.contains { $0.count > 7 && $0[0] == "=" && $0[3] == "AvVisible" }
                && lines.contains { $0.count > 7 && $0[0] == "=" && $0[3] == "AvV4" }
        }
        #expect(
            !lines.contains { $0.count > 3 && $0[3] == "AvHidden" },
            "b saw a service published on loopback only: \(lines)")
        let v4Lines = lines.filter { $0.count > 3 && $0[3] == "AvV4" }
        #expect(v4Lines.allSatisfy { $0[2] == "IPv4" }, "\(v4Lines)")
        // Avahi never puts a loopback address on the link either.
        let addresses = lines.filter { $0.count > 7 && $0[0] == "=" }.map { $0[7] }
        #expect(!addresses.contains { $0.hasPrefix("127.") || $0 == "::1" }, "\(addresses)")
        // Calls outside the policy are refused.
        #expect(throws: DiscoveryError.self) { _ = try denied.browse(type: type, interface: .named("va")) }
        #expect(throws: DiscoveryError.self) { _ = try v4.browse(type: type, ipVersion: .ipv6) }
    }

    @Test func browseAndResolveDropResultsFromDeniedInterfaces() async throws {
        let type = "_av-policy-browse._tcp"
        let peer = try Harness.spawn(onB: true, ["avahi-publish", "-s", "OnB", type, "4604"])
        defer { peer.stop() }
        try await peer.waitForOutput("Established")
        let open = ServiceDiscovery(logger: logger, backend: .avahi)
        defer { Task { await open.shutdown() } }
        let denied = ServiceDiscovery(
            logger: logger, backend: .avahi,
            configuration: DiscoveryConfiguration(interfaces: InterfacePolicy(allowed: ["lo"])))
        defer { Task { await denied.shutdown() } }
        let control = Collector(try open.browse(type: type))
        try await control.wait(timeout: .seconds(10), "OnB added") {
            if case .added(let s) = $0 { s.name == "OnB" } else { false }
        }
        let filtered = Collector(try denied.browse(type: type))
        try await filtered.wait(timeout: .seconds(10), "all for now") { $0 == .allForNow }
        #expect(
            !filtered.all.contains { if case .added(let s) = $0 { s.name == "OnB" } else { false } }, "\(filtered.all)")
        await #expect(throws: DiscoveryError.self) {
            _ = try await denied.resolve(ServiceIdentity(name: "OnB", type: type), timeout: .seconds(2))
        }
    }

    @Test func advertisedAddressesGetTheirOwnHostName() async throws {
        let type = "_av-policy-nat._tcp"
        let natted = ServiceDiscovery(
            logger: logger, backend: .avahi,
            configuration: DiscoveryConfiguration(advertisedAddresses: [IPAddress("192.0.2.9")!]))
        defer { Task { await natted.shutdown() } }
        let service = try await natted.publish(name: "AvNat", type: type, port: 4605)
        try await service.established()
        let lines = try browseOnB(type, resolve: true) { lines in
            lines.contains { $0.count > 7 && $0[0] == "=" && $0[3] == "AvNat" }
        }
        let resolved = lines.filter { $0.count > 7 && $0[0] == "=" && $0[3] == "AvNat" }
        #expect(resolved.allSatisfy { $0[6] == "alpha-nat.local" && $0[7] == "192.0.2.9" }, "\(resolved)")
    }
}
