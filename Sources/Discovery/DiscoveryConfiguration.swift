#if canImport(Glibc)
    import Glibc
#endif

/// Which network interfaces discovery uses, by name.
///
/// A pattern is an interface name, or a prefix followed by `*` (`docker*`, `veth*`, `br-*`).
/// Both backends apply it: the embedded stack neither sends nor listens on a denied interface;
/// with Avahi, services are published on the permitted interfaces only and browse and resolve
/// results from other interfaces are dropped.
public struct InterfacePolicy: Sendable, Hashable, CustomStringConvertible {
    /// Only these interfaces; nil for every interface.
    public var allowed: [String]?
    /// Never these, even when allowed.
    public var denied: [String]

    public init(allowed: [String]? = nil, denied: [String] = []) {
        self.allowed = allowed
        self.denied = denied
    }

    /// Every interface.
    public static let all = InterfacePolicy()

    /// Whether an interface with this name may be used.
    public func permits(_ name: String) -> Bool {
        if denied.contains(where: { Self.matches($0, name) }) { return false }
        guard let allowed else { return true }
        return allowed.contains { Self.matches($0, name) }
    }

    /// Whether the policy excludes anything at all.
    public var isRestrictive: Bool { allowed != nil || !denied.isEmpty }

    static func matches(_ pattern: String, _ name: String) -> Bool {
        pattern.hasSuffix("*") ? name.hasPrefix(pattern.dropLast()) : name == pattern
    }

    public var description: String {
        var parts: [String] = []
        if let allowed { parts.append("allow \(allowed.joined(separator: ","))") }
        if !denied.isEmpty { parts.append("deny \(denied.joined(separator: ","))") }
        return parts.isEmpty ? "all interfaces" : parts.joined(separator: "; ")
    }
}

/// Settings of a ``ServiceDiscovery`` that apply to both backends.
///
/// Without a configuration in code, ``ServiceDiscovery`` reads one from the environment
/// (``fromEnvironment(_:)``), so a program can be steered without new command-line options.
public struct DiscoveryConfiguration: Sendable, Hashable {
    /// Which interfaces to use.
    public var interfaces: InterfacePolicy
    /// Publish and browse over IPv4, IPv6 or both. Calls that ask for the other version fail
    /// with `.invalidArgument`.
    public var ipVersion: IPVersion
    /// Addresses to advertise instead of the interfaces' own (for a container behind NAT:
    /// the address the other hosts can reach). Empty: the interfaces' own addresses.
    /// Embedded: the host name resolves to these on every interface. Avahi: services point at
    /// an extra host name, `<host>-nat.local`, published with these addresses.
    public var advertisedAddresses: [IPAddress]
    /// With ``DiscoveryBackendChoice/automatic``: how long to wait for the Avahi daemon to be
    /// reachable (its client running or registering) before using the embedded stack.
    public var avahiTimeout: Duration
    /// Embedded stack: most DNS records cached (a flood of answers evicts, it does not grow memory).
    public var cacheCapacity: Int
    /// Embedded stack: the host name to claim (`kitchen` → `kitchen.local`) instead of the
    /// kernel's (a container's is often a random id). Renamed `kitchen-2` on a conflict. Avahi
    /// uses its daemon's host name.
    public var hostName: String?
    /// Wide-area DNS-SD through a unicast DNS server: domains browsed beside the link, and
    /// publishing there with a TSIG key. On by default for browsing (the domains the network
    /// announces); publishing needs ``WideAreaConfiguration/key``.
    public var wideArea: WideAreaConfiguration

    public init(
        interfaces: InterfacePolicy = .all, ipVersion: IPVersion = .any, advertisedAddresses: [IPAddress] = [],
        avahiTimeout: Duration = .seconds(1), cacheCapacity: Int = 4096, hostName: String? = nil,
        wideArea: WideAreaConfiguration = WideAreaConfiguration()
    ) {
        self.wideArea = wideArea
        self.interfaces = interfaces
        self.ipVersion = ipVersion
        self.advertisedAddresses = advertisedAddresses
        self.avahiTimeout = avahiTimeout
        self.cacheCapacity = cacheCapacity
        self.hostName = hostName
    }

    /// A configuration from environment variables (each optional):
    /// - `LANMSG_DISCOVERY_INTERFACES=eth0,wlan*`: allowed interfaces
    /// - `LANMSG_DISCOVERY_DENY=docker*,veth*`: denied interfaces
    /// - `LANMSG_DISCOVERY_IP=4` or `6`: one IP version only
    /// - `LANMSG_DISCOVERY_ADVERTISE=192.0.2.7,2001:db8::7`: advertised addresses
    /// - `LANMSG_DISCOVERY_HOSTNAME=kitchen`: the embedded stack's host name
    /// - `LANMSG_WIDE_AREA=off`: no wide-area DNS-SD (no unicast DNS queries at all)
    /// - `LANMSG_WIDE_AREA_DOMAIN=lab.example.org`: a unicast domain to browse and publish in
    /// - `LANMSG_WIDE_AREA_KEY=/etc/lanmsg/host.key`: the TSIG key file to publish with
    /// - `LANMSG_WIDE_AREA_SERVER=10.0.0.53`: the server taking updates (else found from the zone)
    /// - `LANMSG_WIDE_AREA_POLL=10`, `LANMSG_WIDE_AREA_LEASE=100`: seconds (see ``WideAreaConfiguration``)
    /// Malformed values are ignored (and reported by ``ServiceDiscovery``'s log).
    public static func fromEnvironment(_ environment: [String: String]? = nil) -> (
        DiscoveryConfiguration, problems: [String]
    ) {
        let env = environment ?? currentEnvironment()
        var configuration = DiscoveryConfiguration()
        var problems: [String] = []
        func list(_ key: String) -> [String]? {
            env[key].map { $0.split(separator: ",").map { $0.trimmingCharactersInSet() }.filter { !$0.isEmpty } }
        }
        if let allowed = list("LANMSG_DISCOVERY_INTERFACES"), !allowed.isEmpty {
            configuration.interfaces.allowed = allowed
        }
        if let denied = list("LANMSG_DISCOVERY_DENY") { configuration.interfaces.denied = denied }
        switch env["LANMSG_DISCOVERY_IP"] {
        case nil, "": break
        case "4", "ipv4": configuration.ipVersion = .ipv4
        case "6", "ipv6": configuration.ipVersion = .ipv6
        case let other?: problems.append("LANMSG_DISCOVERY_IP=\(other) is not 4 or 6")
        }
        if let name = env["LANMSG_DISCOVERY_HOSTNAME"], !name.isEmpty {
            if name.utf8.count <= 63, !name.contains(".") {
                configuration.hostName = name
            } else {
                problems.append("LANMSG_DISCOVERY_HOSTNAME=\(name) is not one DNS label (1 to 63 bytes, no dot)")
            }
        }
        for text in list("LANMSG_DISCOVERY_ADVERTISE") ?? [] {
            if let address = IPAddress(text) {
                configuration.advertisedAddresses.append(address)
            } else {
                problems.append("LANMSG_DISCOVERY_ADVERTISE: '\(text)' is not an IP address")
            }
        }
        problems += configuration.wideArea.apply(environment: env)
        return (configuration, problems)
    }

    /// The IP version a call may use, or an error when it asks for one the configuration excludes.
    func effectiveVersion(_ requested: IPVersion) throws(DiscoveryError) -> IPVersion {
        switch (ipVersion, requested) {
        case (.any, _): return requested
        case (_, .any): return ipVersion
        case (let configured, let asked) where configured == asked: return asked
        default:
            throw DiscoveryError(
                .invalidArgument, "\(requested) was asked for, but discovery is configured for \(ipVersion) only")
        }
    }
}

/// The interface name of a kernel index (nil when it does not exist here).
func interfaceName(ofIndex index: Int32) -> String? {
    guard index > 0 else { return nil }
    var name = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
    guard if_indextoname(UInt32(index), &name) != nil else { return nil }
    return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// The process environment (without Foundation).
func currentEnvironment() -> [String: String] {
    var result: [String: String] = [:]
    var pointer = environ
    while let entry = pointer.pointee {
        let text = String(cString: entry)
        if let equals = text.firstIndex(of: "=") {
            result[String(text[..<equals])] = String(text[text.index(after: equals)...])
        }
        pointer += 1
    }
    return result
}

extension Substring {
    func trimmingCharactersInSet() -> String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }
}

extension IPAddress {
    /// Parses numeric text (`10.0.0.1`, `fe80::1`); nil when it is not an address.
    public init?(_ text: String) {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            let bytes = withUnsafeBytes(of: &v4) { Array($0) }
            self = .v4(bytes[0], bytes[1], bytes[2], bytes[3])
            return
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 {
            self = .v6(withUnsafeBytes(of: &v6) { Array($0) })
            return
        }
        return nil
    }

    /// Whether this is a loopback address (127/8, ::1).
    public var isLoopback: Bool {
        switch self {
        case .v4(let a, _, _, _): a == 127
        case .v6(let bytes): bytes == [UInt8](repeating: 0, count: 15) + [1]
        }
    }
}
