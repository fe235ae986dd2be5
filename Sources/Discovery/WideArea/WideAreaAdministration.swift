import Logging
import MDNSCore

#if canImport(Glibc)
    import Glibc
#endif

/// What an administrator (or `lanmsg doctor` and `lanmsg wide-area`) asks of the wide-area set-up:
/// the resolver's search domains, the domains the network announces, the update server, whether a
/// key is accepted and the clocks agree, whether the server takes unsigned updates, the instances
/// registered in a domain and their expiry, and removing the expired ones a crash left behind.
public struct WideAreaAdministration: Sendable {
    let wideArea: WideArea

    /// - Parameters:
    ///   - configuration: Its ``DiscoveryConfiguration/wideArea`` settings are used (servers,
    ///     resolver file, domains, key); wide-area is used here even when turned off for browsing.
    ///   - logger: Where the DNS exchanges log (debug level).
    public init(configuration: DiscoveryConfiguration, logger: Logger) {
        var settings = configuration
        settings.wideArea.isEnabled = true
        wideArea = WideArea(configuration: settings, logger: logger, hostLabel: EmbeddedBackend.hostLabel())
    }

    /// The resolver configuration's search domains.
    public var searchDomains: [String] { wideArea.dns.searchDomains().map(\.description) }

    /// The resolvers asked (configured, else the resolver configuration's name servers).
    public var resolvers: [DNSServerAddress] { wideArea.dns.resolvers() }

    /// The reverse-mapping names of this host's subnets, under which a network may announce domains.
    public var subnetNames: [String] { WideAreaHost.subnetNames(wideArea.configuration).map(\.description) }

    /// The browse and registration domains: configured ones first, then the announced ones.
    public func domains() async -> (browse: [String], registration: [String]) {
        let found = await wideArea.domains(maxAge: .zero)
        return (found.browse, found.registration)
    }

    /// The zone holding `domain`, and the servers that take its updates.
    public func updateServers(for domain: String) async throws(DiscoveryError) -> (zone: String, servers: [DNSServerAddress]) {
        let zone = try await wideArea.dns.zone(of: try Self.name(domain))
        return (zone.name.description, try await wideArea.dns.updateServers(for: zone))
    }

    /// What a signed no-op update (a prerequisite on the zone's apex, no change) says of `key`.
    public struct KeyCheck: Sendable {
        /// The server that answered.
        public var server: DNSServerAddress
        /// Seconds this host's clock is ahead of the server's (negative: behind), from the time in
        /// the server's signed reply.
        public var clockSkew: Int64
        /// The round trip.
        public var roundTrip: Duration
    }

    /// Checks `key` the way publishing uses it: first a signed update that changes nothing (the key
    /// and the clocks: the server does not consult its update policy for it), then a probe the
    /// policy must allow — a TXT record added under `_lanmsg-doctor._tcp.<zone>` and removed at once.
    /// - Throws: `.keyRejected` (BADSIG, BADKEY), `.clockSkew` (BADTIME), `.updateRefused` (the
    ///   policy does not let the key register services), `.dnsUnreachable`, …
    public func checkKey(_ key: TSIGKey, domain: String) async throws(DiscoveryError) -> KeyCheck {
        let zone = try await wideArea.dns.zone(of: try Self.name(domain))
        let servers = try await wideArea.dns.updateServers(for: zone)
        let started = ContinuousClock.now
        let update = DNSMessage.update(id: DNSClient.randomID(), zone: zone.name, prerequisites: [.nameInUse(zone.name)], updates: [])
        let (outcome, reply) = try await wideArea.dns.sendReturningReply(update, key: key, servers: servers, describing: "a no-op update of \(zone.name)")
        let roundTrip = ContinuousClock.now - started
        if case .prerequisiteFailed(let rcode) = outcome {
            throw DiscoveryError(.dnsFailure, "\(reply.server) answered the no-op update with \(DNSRcode.name(rcode))", dnsRcode: rcode)
        }
        let serverTime = reply.signed.tsig?.timeSigned ?? UnicastDNS.now()
        // The update policy: what a registration needs (a record under _tcp of the zone).
        guard let service = zone.name.prepending("_lanmsg-doctor._tcp"),
            let probe = DNSName(instance: "lanmsg doctor \(getpid())", service: service)
        else { throw DiscoveryError(.invalidArgument, "the zone name \(zone.name) is too long to probe") }
        let add = DNSMessage.update(
            id: DNSClient.randomID(), zone: zone.name, prerequisites: [.nameNotInUse(probe)],
            updates: [ResourceRecord(name: probe, data: .txt([Array("lanmsg doctor probe".utf8)]), ttl: 1)])
        _ = try await wideArea.dns.send(add, key: key, servers: servers, describing: "a probe record under \(service)")
        let remove = DNSMessage.update(id: DNSClient.randomID(), zone: zone.name, prerequisites: [], updates: [.deleteName(probe)])
        _ = try? await wideArea.dns.send(remove, key: key, servers: servers, describing: "the removal of the probe")
        return KeyCheck(
            server: reply.server, clockSkew: Int64(bitPattern: UnicastDNS.now()) - Int64(bitPattern: serverTime),
            roundTrip: roundTrip)
    }

    /// Whether the zone's server lets anyone change it: an unsigned update adding a TXT record under
    /// `_lanmsg-doctor-probe.<zone>` (removed again at once if it was accepted). true: it was accepted.
    public func acceptsUnsignedUpdates(domain: String) async throws(DiscoveryError) -> Bool {
        let zone = try await wideArea.dns.zone(of: try Self.name(domain))
        let servers = try await wideArea.dns.updateServers(for: zone)
        guard let probe = zone.name.prepending("_lanmsg-doctor-probe") else { return false }
        let record = ResourceRecord(name: probe, data: .txt([Array("unsigned update probe".utf8)]), ttl: 1)
        let add = DNSMessage.update(id: DNSClient.randomID(), zone: zone.name, prerequisites: [.nameNotInUse(probe)], updates: [record])
        let rcode = try await wideArea.dns.sendUnsigned(add, servers: servers)
        guard rcode == DNSRcode.noError else { return false }
        let remove = DNSMessage.update(id: DNSClient.randomID(), zone: zone.name, prerequisites: [], updates: [.deleteName(probe)])
        _ = try? await wideArea.dns.sendUnsigned(remove, servers: servers)
        return true
    }

    /// One instance registered in a unicast domain.
    public struct Instance: Sendable, Hashable {
        public var name: String
        public var type: String
        public var domain: String
        public var txt: TXTRecord
        /// The `expires` time (seconds since the epoch), when the publisher set one.
        public var expires: UInt64?
        /// Whether `expires` has passed (a crashed publisher's records).
        public var isExpired: Bool
        /// The host its SRV record names (nil when it has none).
        public var host: String?
        /// The port its SRV record names (nil when it has none).
        public var port: UInt16?
    }

    /// The instances of `type` in `domain`, asked of the zone's own servers.
    public func instances(type: String, domain: String) async throws(DiscoveryError) -> [Instance] {
        let domainName = try Self.name(domain)
        guard let typeName = DNSName(type), let service = DNSName(labels: typeName.labels + domainName.labels) else {
            throw DiscoveryError(.invalidArgument, "'\(type)' is not a service type")
        }
        let (_, servers) = try await wideArea.zone(of: domainName)
        let pointers = try await wideArea.dns.records(service, DNSType.ptr, servers: servers, recursion: false)
        let now = UnicastDNS.now()
        var result: [Instance] = []
        for record in pointers {
            guard case .ptr(let target) = record.data, target.parent == service else { continue }
            let name = target.firstLabelText
            let txtRecords = (try? await wideArea.dns.records(target, DNSType.txt, servers: servers, recursion: false)) ?? []
            var txt = TXTRecord()
            if case .txt(let strings)? = txtRecords.first?.data { txt = TXTRecord(wireEntries: strings) }
            let expires = txt[expiresKey].flatMap { UInt64($0) }
            var host: String?
            var port: UInt16?
            let srv = (try? await wideArea.dns.records(target, DNSType.srv, servers: servers, recursion: false)) ?? []
            if case .srv(_, _, let value, let hostName)? = srv.first?.data {
                port = value
                host = hostName.description
            }
            result.append(Instance(
                name: name, type: type, domain: domain, txt: txt, expires: expires, isExpired: expires.map { $0 < now } ?? false,
                host: host, port: port))
        }
        return result.sorted { $0.name < $1.name }
    }

    /// The addresses of an instance's host (its A and AAAA records, asked of the zone's servers
    /// first, then of the resolvers for a host outside the zone). Empty when it has no SRV record
    /// or its host no address.
    public func addresses(of instance: Instance) async -> [IPAddress] {
        guard let host = instance.host, let hostName = DNSName(host), let domainName = try? Self.name(instance.domain) else { return [] }
        if let (_, servers) = try? await wideArea.zone(of: domainName) {
            let found = await wideArea.dns.addresses(of: hostName, servers: servers, recursion: false)
            if !found.isEmpty { return found }
        }
        return await wideArea.dns.addresses(of: hostName)
    }

    /// Removes one instance (its SRV and TXT, and its PTR by value), on condition that its TXT is
    /// still the one read in ``instances(type:domain:)`` — a publisher that refreshed or registered
    /// again meanwhile keeps its records, and a live publisher whose records were removed by
    /// mistake registers them again at its next refresh (half its lease).
    /// - Returns: Whether the instance was removed (false: it changed meanwhile, nothing removed).
    /// - Throws: `.keyRejected`, `.updateRefused`, `.dnsUnreachable` and the like, as the update
    ///   server answered.
    public func remove(_ instance: Instance, key: TSIGKey) async throws(DiscoveryError) -> Bool {
        let domainName = try Self.name(instance.domain)
        guard let typeName = DNSName(instance.type), let service = DNSName(labels: typeName.labels + domainName.labels),
            let name = DNSName(instance: instance.name, service: service)
        else {
            throw DiscoveryError(.invalidArgument, "'\(instance.type)' is not a service type")
        }
        let zone = try await wideArea.dns.zone(of: domainName)
        let servers = try await wideArea.dns.updateServers(for: zone)
        let txt = ResourceRecord(name: name, data: .txt(instance.txt.wireEntries), ttl: 0)
        let update = DNSMessage.update(
            id: DNSClient.randomID(), zone: zone.name, prerequisites: [.rrsetEquals(txt)],
            updates: [.deleteRecord(ResourceRecord(name: service, data: .ptr(name), ttl: 0)), .deleteName(name)])
        let outcome = try await wideArea.dns.send(update, key: key, servers: servers, describing: "the removal of '\(instance.name)'")
        return outcome == .done
    }

    /// Removes the instances of `type` in `domain` whose expiry passed: SRV and TXT, and their PTR
    /// by value — each on condition that its TXT is still the expired one (a publisher that
    /// refreshed meanwhile keeps its records). Returns the names removed.
    public func removeExpired(type: String, domain: String, key: TSIGKey) async throws(DiscoveryError) -> [String] {
        var removed: [String] = []
        for instance in try await instances(type: type, domain: domain) where instance.isExpired {
            if try await remove(instance, key: key) { removed.append(instance.name) }
        }
        return removed
    }

    static func name(_ domain: String) throws(DiscoveryError) -> DNSName {
        guard let normalized = WideAreaConfiguration.normalize(domain), let name = DNSName(normalized) else {
            throw DiscoveryError(.invalidArgument, "'\(domain)' is not a domain name")
        }
        return name
    }
}

extension TSIGKey {
    /// Whether the key file can be read by users other than its owner (it should not be).
    public static func isReadableByOthers(path: String) -> Bool {
        var info = stat()
        guard stat(path, &info) == 0 else { return false }
        return info.st_mode & 0o044 != 0
    }
}
