/// Wide-area DNS-SD: services published in and browsed from a unicast DNS domain (RFC 6763) served
/// by an ordinary DNS server such as BIND 9, beside the link's mDNS. Part of ``DiscoveryConfiguration``.
///
/// Browsing needs nothing: the domains come from DNS-SD domain enumeration (RFC 6763 §11) under the
/// resolver's search domains and the host's subnets. Publishing needs a TSIG key the DNS server
/// accepts (``key``) and a domain (``domains``, or the default registration domain the network
/// announces). See docs/DISCOVERY.md for the server side.
public struct WideAreaConfiguration: Sendable, Hashable {
    /// Whether wide-area DNS-SD is used at all (environment: `LANMSG_WIDE_AREA=off` turns it off).
    public var isEnabled: Bool
    /// Browse the domains the network announces (`b`, `db` and `lb._dns-sd._udp` under each search
    /// domain and each subnet's reverse-mapping name) when browsing the default domain.
    public var enumeratesDomains: Bool
    /// Domains to use besides the announced ones: browsed, and the first one published in when a
    /// ``key`` is set (environment: `LANMSG_WIDE_AREA_DOMAIN`, comma-separated).
    public var domains: [String]
    /// The TSIG key that signs updates: set it to publish (environment: `LANMSG_WIDE_AREA_KEY=FILE`).
    /// Without ``domains``, services go to the network's default registration domain (`dr._dns-sd._udp`).
    public var key: TSIGKey?
    /// The server that takes updates; nil finds it (the zone's `_dns-update._udp` SRV, else the SOA
    /// primary). Also asked for the zone's records when browsing. (`LANMSG_WIDE_AREA_SERVER`)
    public var updateServer: DNSServerAddress?
    /// Resolvers to ask instead of those in the resolver configuration file.
    public var servers: [DNSServerAddress]
    /// The resolver configuration file (name servers and search domains).
    public var resolverConfigurationPath: String
    /// How often a browser asks the zone's SOA serial whether anything changed; each poll is
    /// jittered to between 80 and 100 % of it (`LANMSG_WIDE_AREA_POLL`, seconds).
    public var pollInterval: Duration
    /// How long a registration is valid without a refresh: published in TXT (`expires=`) so that
    /// browsers hide the records a crashed publisher left; refreshed at half of it. BIND ignores
    /// the Update Lease it is also sent (RFC 9664). Default 100 s: a crashed service is gone from
    /// browsers within 2 minutes (the lease and one poll), for 72 refreshes an hour per service
    /// (issue 45; it was 3,600 s: ghosts for up to an hour). (`LANMSG_WIDE_AREA_LEASE`, seconds)
    public var lease: Duration
    /// The TTL of the records published.
    public var recordTTL: UInt32
    /// How long one query may take, retransmissions included.
    public var queryTimeout: Duration
    /// How long one update may take.
    public var updateTimeout: Duration

    public init(
        isEnabled: Bool = true, enumeratesDomains: Bool = true, domains: [String] = [], key: TSIGKey? = nil,
        updateServer: DNSServerAddress? = nil, servers: [DNSServerAddress] = [],
        resolverConfigurationPath: String = "/etc/resolv.conf", pollInterval: Duration = .seconds(10),
        lease: Duration = .seconds(100), recordTTL: UInt32 = 60, queryTimeout: Duration = .seconds(3),
        updateTimeout: Duration = .seconds(5)
    ) {
        self.isEnabled = isEnabled
        self.enumeratesDomains = enumeratesDomains
        self.domains = domains
        self.key = key
        self.updateServer = updateServer
        self.servers = servers
        self.resolverConfigurationPath = resolverConfigurationPath
        self.pollInterval = pollInterval
        self.lease = lease
        self.recordTTL = recordTTL
        self.queryTimeout = queryTimeout
        self.updateTimeout = updateTimeout
    }

    /// Whether any domain can be browsed or published in.
    var isActive: Bool { isEnabled && (enumeratesDomains || !domains.isEmpty) }

    /// Reads the `LANMSG_WIDE_AREA*` variables into `self`; returns the problems found.
    mutating func apply(environment env: [String: String]) -> [String] {
        var problems: [String] = []
        switch env["LANMSG_WIDE_AREA"]?.lowercased() {
        case nil, "", "on", "1", "yes": break
        case "off", "0", "no": isEnabled = false
        case let other?: problems.append("LANMSG_WIDE_AREA=\(other) is not on or off")
        }
        if let text = env["LANMSG_WIDE_AREA_DOMAIN"], !text.isEmpty {
            for domain in text.split(separator: ",").map({ $0.trimmingCharactersInSet() }) where !domain.isEmpty {
                if let normalized = Self.normalize(domain) {
                    domains.append(normalized)
                } else {
                    problems.append("LANMSG_WIDE_AREA_DOMAIN: '\(domain)' is not a domain name")
                }
            }
        }
        if let path = env["LANMSG_WIDE_AREA_KEY"], !path.isEmpty {
            do {
                key = try TSIGKey(contentsOfFile: path)
            } catch {
                problems.append("LANMSG_WIDE_AREA_KEY: \(error.message)")
            }
        }
        if let text = env["LANMSG_WIDE_AREA_SERVER"], !text.isEmpty {
            if let server = DNSServerAddress(text) {
                updateServer = server
            } else {
                problems.append("LANMSG_WIDE_AREA_SERVER=\(text) is not an address (10.0.0.53, [fd00::53]:53)")
            }
        }
        func seconds(_ name: String) -> Duration? {
            guard let text = env[name], !text.isEmpty else { return nil }
            guard let value = Double(text), value >= 0.1, value <= 86_400 * 7 else {
                problems.append("\(name)=\(text) is not a number of seconds between 0.1 and 604800")
                return nil
            }
            return .milliseconds(Int64(value * 1000))
        }
        if let value = seconds("LANMSG_WIDE_AREA_POLL") { pollInterval = value }
        if let value = seconds("LANMSG_WIDE_AREA_LEASE") { lease = value }
        return problems
    }

    /// `Lab.Home.Arpa.` → `lab.home.arpa`; nil when it is not a domain name.
    static func normalize(_ domain: String) -> String? {
        var text = domain.lowercased()
        while text.hasSuffix(".") { text.removeLast() }
        guard !text.isEmpty, let name = DNSNameText.parse(text), !name.isEmpty else { return nil }
        return text
    }
}

/// Checks dotted domain text without depending on MDNSCore in the public signatures above.
enum DNSNameText {
    static func parse(_ text: String) -> [String]? {
        let labels = text.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard labels.allSatisfy({ !$0.isEmpty && $0.utf8.count <= 63 }), text.utf8.count <= 253 else { return nil }
        return labels
    }
}

extension DiscoveryConfiguration {
    /// What a program's command line and environment ask for: ``fromEnvironment(_:)``, with the
    /// wide-area options on top — `--wide-area-domain DOMAIN` (browsed, and published in when a key
    /// is given) and `--wide-area-key FILE` (a `tsig-keygen` key file; publishing needs it).
    /// - Throws: `.invalidKeyFile` for an unreadable or malformed key file, `.invalidArgument` for a
    ///   domain that is not a domain name (say it to the user: these are usage errors).
    public static func forProgram(
        wideAreaDomain: String? = nil, wideAreaKeyFile: String? = nil, environment: [String: String]? = nil
    ) throws(DiscoveryError) -> (DiscoveryConfiguration, problems: [String]) {
        var (configuration, problems) = fromEnvironment(environment)
        // A key named by the environment that cannot be used is as wrong as one named by a flag:
        // the user asked to publish, so say it now instead of publishing on the link only.
        let env = environment ?? currentEnvironment()
        if wideAreaKeyFile == nil, let path = env["LANMSG_WIDE_AREA_KEY"], !path.isEmpty, configuration.wideArea.key == nil {
            _ = try TSIGKey(contentsOfFile: path)  // throws the reason
        }
        if let wideAreaDomain {
            guard let domain = WideAreaConfiguration.normalize(wideAreaDomain) else {
                throw DiscoveryError(.invalidArgument, "--wide-area-domain '\(wideAreaDomain)' is not a domain name")
            }
            configuration.wideArea.domains.removeAll { $0 == domain }
            configuration.wideArea.domains.insert(domain, at: 0)
        }
        if let wideAreaKeyFile {
            configuration.wideArea.key = try TSIGKey(contentsOfFile: wideAreaKeyFile)
        }
        return (configuration, problems)
    }
}
