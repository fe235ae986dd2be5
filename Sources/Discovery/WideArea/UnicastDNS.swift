import Logging
import MDNSCore

#if canImport(Glibc)
    import Glibc
#endif

/// Queries and signed updates against unicast DNS servers, on top of ``DNSClient``: the
/// operations the wide-area registrar, browser and domain enumeration share.
final class UnicastDNS: Sendable {
    /// The queue the wide-area sources run on (its own exchanges too, over the network).
    let client: DNSClient
    /// Where messages go: `client`, or a test's server in memory.
    let exchanger: any DNSExchanging
    let settings: WideAreaConfiguration
    let logger: Logger
    /// How long one query may take (retransmissions included).
    let queryTimeout: Duration
    /// Seconds since the epoch, for signatures (``now()``; a test's fake clock).
    let clock: @Sendable () -> UInt64

    init(
        settings: WideAreaConfiguration, logger: Logger, client: DNSClient = DNSClient(),
        exchanger: (any DNSExchanging)? = nil, clock: @escaping @Sendable () -> UInt64 = UnicastDNS.now
    ) {
        self.settings = settings
        self.logger = logger
        self.client = client
        self.exchanger = exchanger ?? client
        self.queryTimeout = settings.queryTimeout
        self.clock = clock
    }

    /// The resolvers to ask: the configured ones, else the system's (re-read every time, so an
    /// edited `/etc/resolv.conf` takes effect).
    func resolvers() -> [DNSServerAddress] {
        if !settings.servers.isEmpty { return settings.servers }
        return ResolverConfiguration.read(path: settings.resolverConfigurationPath).nameservers
    }

    /// The search domains of the resolver configuration.
    func searchDomains() -> [DNSName] {
        ResolverConfiguration.read(path: settings.resolverConfigurationPath).searchDomains
    }

    /// Seconds since the epoch (TSIG times, TXT expiries).
    static func now() -> UInt64 { UInt64(max(0, time(nil))) }

    // MARK: Queries

    /// Asks one question; the reply, whatever its RCODE. `servers` nil: the resolvers.
    func query(
        _ name: DNSName, _ type: UInt16, servers: [DNSServerAddress]? = nil, recursion: Bool = true, tcp: Bool = false
    ) async throws(DiscoveryError) -> DNSReply {
        let targets = servers ?? resolvers()
        let id = DNSClient.randomID()
        var message = DNSMessage.query(id: id, name: name, type: type, recursionDesired: recursion)
        message.additionals = [.opt(payloadSize: 1232)]
        let result = await exchanger.exchange(message.encoded(maxSize: 512), id: id, servers: targets, timeout: queryTimeout, tcp: tcp)
        switch result {
        case .success(let reply):
            guard reply.message.isResponse else {
                throw DiscoveryError(.dnsFailure, "\(reply.server) sent a query instead of a reply")
            }
            return reply
        case .failure(let error):
            throw DiscoveryError(.dnsUnreachable, "DNS query for \(name) \(typeText(type)): \(error)")
        }
    }

    /// The records of `type` owned by `name` in the answer section (empty for NXDOMAIN/NODATA).
    /// - Throws: `.dnsUnreachable`, or `.dnsFailure` for SERVFAIL, REFUSED and the like.
    func records(
        _ name: DNSName, _ type: UInt16, servers: [DNSServerAddress]? = nil, recursion: Bool = true
    ) async throws(DiscoveryError) -> [ResourceRecord] {
        let reply = try await query(name, type, servers: servers, recursion: recursion)
        switch reply.rcode {
        case DNSRcode.noError:
            return reply.message.answers.filter { $0.type == type && $0.name == name }
        case DNSRcode.nxDomain:
            return []
        default:
            throw DiscoveryError(
                .dnsFailure, "\(reply.server) answered \(DNSRcode.name(reply.rcode)) for \(name) \(typeText(type))",
                dnsRcode: reply.rcode)
        }
    }

    /// IPv4 and IPv6 addresses of a host name (A and AAAA, asked at once).
    func addresses(of host: DNSName, servers: [DNSServerAddress]? = nil, recursion: Bool = true) async -> [IPAddress] {
        async let v4 = try? records(host, DNSType.a, servers: servers, recursion: recursion)
        async let v6 = try? records(host, DNSType.aaaa, servers: servers, recursion: recursion)
        var result: [IPAddress] = []
        for record in (await v6 ?? []) + (await v4 ?? []) {
            switch record.data {
            case .a(let b): result.append(.v4(b[0], b[1], b[2], b[3]))
            case .aaaa(let b): result.append(.v6(b))
            default: break
            }
        }
        return result
    }

    // MARK: Zones and servers

    /// A zone, as its SOA tells: its name, primary server name and serial.
    struct Zone: Sendable, Hashable {
        let name: DNSName
        let primary: DNSName
        let serial: UInt32
    }

    /// The zone that holds `name` (RFC 2136 §4.3: ask for the SOA of the name; the SOA comes back
    /// in the answer when the name is the zone's apex, in the authority section otherwise).
    func zone(of name: DNSName, servers: [DNSServerAddress]? = nil) async throws(DiscoveryError) -> Zone {
        let reply = try await query(name, DNSType.soa, servers: servers)
        guard reply.rcode == DNSRcode.noError || reply.rcode == DNSRcode.nxDomain else {
            throw DiscoveryError(
                .dnsFailure,
                "\(reply.server) answered \(DNSRcode.name(reply.rcode)) when asked for the zone of \(name); is the domain served by this DNS server?",
                dnsRcode: reply.rcode)
        }
        let candidates = reply.message.answers + reply.message.authorities
        guard let record = candidates.first(where: { $0.type == DNSType.soa }), let soa = record.soa,
            name.hasSuffix(record.name)
        else {
            throw DiscoveryError(
                .dnsFailure,
                "\(reply.server) knows no zone holding \(name) (no SOA in its answer); check the domain name and the resolver (\(settings.resolverConfigurationPath))")
        }
        return Zone(name: record.name, primary: soa.primary, serial: soa.serial)
    }

    /// Where the zone's authoritative data is: the primary's addresses, else the resolvers.
    func authoritativeServers(of zone: Zone) async -> [DNSServerAddress] {
        if let server = settings.updateServer { return [server] }
        let addresses = await addresses(of: zone.primary)
        return addresses.isEmpty ? resolvers() : addresses.map { DNSServerAddress($0) }
    }

    /// The servers that accept updates for `zone`, found as a DNS-SD client should (RFC 6763 §11,
    /// RFC 2136 §4): the configured server, else the zone's `_dns-update._udp` SRV targets, else the
    /// SOA's primary name.
    func updateServers(for zone: Zone) async throws(DiscoveryError) -> [DNSServerAddress] {
        if let server = settings.updateServer { return [server] }
        var found: [DNSServerAddress] = []
        if let srvName = zone.name.prepending("_dns-update._udp"),
            let records = try? await records(srvName, DNSType.srv)
        {
            let targets = records.compactMap { record -> (UInt16, DNSName, UInt16)? in
                if case .srv(let priority, _, let port, let target) = record.data, !target.labels.isEmpty {
                    return (priority, target, port)
                }
                return nil
            }.sorted { $0.0 < $1.0 }
            for (_, target, port) in targets {
                for address in await addresses(of: target) { found.append(DNSServerAddress(address, port: port)) }
            }
        }
        if found.isEmpty {
            found = await addresses(of: zone.primary).map { DNSServerAddress($0) }
        }
        guard !found.isEmpty else {
            throw DiscoveryError(
                .dnsUnreachable,
                "no address found for the update server of \(zone.name) (no _dns-update._udp SRV, and the SOA's primary \(zone.primary) has no address); set the update server with LANMSG_WIDE_AREA_SERVER (WideAreaConfiguration.updateServer)")
        }
        return found
    }

    // MARK: Updates

    /// What a signed update achieved.
    enum UpdateOutcome: Sendable, Equatable {
        case done
        /// YXDOMAIN: a "name must not exist" prerequisite failed.
        case nameExists
        /// NXDOMAIN, NXRRSET, YXRRSET: another prerequisite failed.
        case prerequisiteFailed(UInt16)
    }

    /// Signs `update` with `key`, sends it, verifies the reply's signature and maps every refusal
    /// to an error that says what to do.
    func send(
        _ update: DNSMessage, key: TSIGKey, servers: [DNSServerAddress], describing what: String
    ) async throws(DiscoveryError) -> UpdateOutcome {
        try await sendReturningReply(update, key: key, servers: servers, describing: what).outcome
    }

    /// An update without a signature (for the doctor's check that the server refuses those): the RCODE.
    func sendUnsigned(_ update: DNSMessage, servers: [DNSServerAddress]) async throws(DiscoveryError) -> UInt16 {
        let result = await exchanger.exchange(
            update.encoded(maxSize: 65535), id: update.id, servers: servers, timeout: settings.updateTimeout, tcp: false)
        switch result {
        case .success(let reply): return reply.rcode
        case .failure(let error): throw DiscoveryError(.dnsUnreachable, "an unsigned update got no answer: \(error)")
        }
    }

    /// ``send(_:key:servers:describing:)`` with the verified reply.
    func sendReturningReply(
        _ update: DNSMessage, key: TSIGKey, servers: [DNSServerAddress], describing what: String
    ) async throws(DiscoveryError) -> (outcome: UpdateOutcome, reply: DNSReply) {
        let now = clock()
        let (bytes, requestMAC) = key.sign(update.encoded(maxSize: 65535), id: update.id, time: now)
        let result = await exchanger.exchange(bytes, id: update.id, servers: servers, timeout: settings.updateTimeout, tcp: bytes.count > 1232)
        let reply: DNSReply
        switch result {
        case .success(let value): reply = value
        case .failure(let error):
            throw DiscoveryError(.dnsUnreachable, "the update of \(what) got no answer: \(error)")
        }
        let server = reply.server
        let tsigError = reply.signed.tsig?.error ?? 0
        // A reply with a TSIG error is not signed (BADKEY, BADSIG) or signed with the time check
        // skipped (BADTIME): read its error first.
        switch tsigError {
        case 0: break
        case DNSRcode.badSig:
            throw DiscoveryError(
                .keyRejected,
                "\(server) rejected the signature of \(key) (BADSIG): the secret does not match the server's key of that name. Copy the key file the administrator made with tsig-keygen again.",
                dnsRcode: tsigError)
        case DNSRcode.badKey:
            throw DiscoveryError(
                .keyRejected,
                "\(server) does not know \(key) (BADKEY): the key name is not in its configuration. Ask the administrator to add the key to named.conf, or use the key file the administrator gave you.",
                dnsRcode: tsigError)
        case DNSRcode.badTime:
            // Signed with the time check skipped (RFC 8945 §5.2.3): believed only when the MAC verifies.
            if key.verify(reply.signed, requestMAC: requestMAC, now: now, checkTime: false).isFailure {
                throw DiscoveryError(
                    .dnsFailure, "\(server) answered BADTIME without a valid signature; the answer was ignored (it could be forged)")
            }
            let serverTime = reply.signed.tsig?.serverTime ?? reply.signed.tsig?.timeSigned ?? 0
            let skew = Int64(bitPattern: now) - Int64(bitPattern: serverTime)
            throw DiscoveryError(
                .clockSkew,
                "\(server) refused the update because the clocks differ (BADTIME): this host's clock is \(skew > 0 ? "\(skew) s ahead of" : "\(-skew) s behind") the server's, more than the 300 s a signature allows. Set the clock (NTP, e.g. systemd-timesyncd or chrony).",
                dnsRcode: tsigError)
        default:
            throw DiscoveryError(
                .keyRejected, "\(server) rejected \(key) with TSIG error \(DNSRcode.name(tsigError))", dnsRcode: tsigError)
        }
        switch key.verify(reply.signed, requestMAC: requestMAC, now: now) {
        case .success: break
        case .failure(.unsigned):
            // A server signs every answer to a request whose signature it verified (RFC 8945 §5.3).
            // An unsigned answer is believed only as an error report (a server that refused before
            // looking at the signature); an unsigned success or prerequisite outcome could be forged,
            // and acting on it would rename or keep records on an attacker's word: ignored, retried.
            let errorReports = [DNSRcode.refused, DNSRcode.notAuth, DNSRcode.formErr, DNSRcode.notImp, DNSRcode.servFail]
            guard errorReports.contains(reply.rcode) else {
                throw DiscoveryError(
                    .dnsFailure,
                    "\(server) answered the update of \(what) with an unsigned \(DNSRcode.name(reply.rcode)); the answer was ignored (it could be forged) and the update will be sent again")
            }
        case .failure(.badTime(let serverTime, let skew)):
            throw DiscoveryError(
                .clockSkew,
                "the reply from \(server) was signed at \(serverTime), \(abs(skew)) s from this host's clock; set the clock (NTP)")
        case .failure(let failure):
            throw DiscoveryError(
                .keyRejected, "the reply from \(server) to the update of \(what) did not verify (\(failure)); it was ignored")
        }
        switch reply.rcode {
        case DNSRcode.noError: return (.done, reply)
        case DNSRcode.yxDomain: return (.nameExists, reply)
        case DNSRcode.nxDomain, DNSRcode.nxRRSet, DNSRcode.yxRRSet: return (.prerequisiteFailed(reply.rcode), reply)
        case DNSRcode.refused:
            if let zone = update.questions.first?.name, !key.dnsName.hasSuffix(zone) || key.dnsName == zone {
                // The usual cause (issue 45, 7): policies grant keys named after their host in the
                // zone (`*.ZONE.`, `self`), and this one is not — granting it more is not the fix.
                throw DiscoveryError(
                    .updateRefused,
                    "\(server) refused the update of \(what) (REFUSED): the key is named '\(key.name)', which is not a host name in the zone \(zone): update policies grant keys named HOST.\(zone) (and `self` lets a key change only its own name). Make the key with `tsig-keygen -a hmac-sha256 HOST.\(zone)` (docs/DISCOVERY.md, \"Keys\").",
                    dnsRcode: reply.rcode)
            }
            throw DiscoveryError(
                .updateRefused,
                "\(server) refused the update of \(what) (REFUSED): its update-policy does not allow \(key) to change these names. Ask the administrator to grant the key the service type and its own host name (docs/DISCOVERY.md, \"Update policy\").",
                dnsRcode: reply.rcode)
        case DNSRcode.notAuth:
            throw DiscoveryError(
                .updateRefused,
                "\(server) is not authoritative for the zone of \(what) (NOTAUTH); point LANMSG_WIDE_AREA_SERVER (WideAreaConfiguration.updateServer) at the zone's primary server",
                dnsRcode: reply.rcode)
        case DNSRcode.notZone:
            throw DiscoveryError(
                .dnsFailure, "\(server) says the names of \(what) are outside the zone (NOTZONE)", dnsRcode: reply.rcode)
        default:
            throw DiscoveryError(
                .dnsFailure, "\(server) answered the update of \(what) with \(DNSRcode.name(reply.rcode))",
                dnsRcode: reply.rcode)
        }
    }
}

func typeText(_ type: UInt16) -> String {
    switch type {
    case DNSType.a: "A"
    case DNSType.aaaa: "AAAA"
    case DNSType.ptr: "PTR"
    case DNSType.srv: "SRV"
    case DNSType.txt: "TXT"
    case DNSType.soa: "SOA"
    default: "TYPE\(type)"
    }
}
