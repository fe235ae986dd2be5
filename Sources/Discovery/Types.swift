#if canImport(Glibc)
import Glibc
#endif

/// Which IP version(s) to publish on or browse for.
public enum IPVersion: Sendable, Hashable, CustomStringConvertible {
    case any, ipv4, ipv6

    public var description: String {
        switch self {
        case .any: "any"
        case .ipv4: "IPv4"
        case .ipv6: "IPv6"
        }
    }
}

/// Which network interface(s) to publish on or browse on.
public enum InterfaceSelection: Sendable, Hashable, CustomStringConvertible {
    /// Every interface Avahi uses.
    case any
    /// One interface, by kernel index.
    case index(Int32)
    /// One interface, by name (e.g. `eth0`); looked up when used.
    case named(String)

    /// The kernel index, or nil for `.any`; throws when a named interface does not exist.
    func resolvedIndex() throws(DiscoveryError) -> Int32? {
        switch self {
        case .any: return nil
        case .index(let index): return index
        case .named(let name):
            let index = if_nametoindex(name)
            guard index != 0 else {
                throw DiscoveryError(.invalidArgument, "no network interface named '\(name)'; see `ip link` for the names")
            }
            return Int32(index)
        }
    }

    public var description: String {
        switch self {
        case .any: "any interface"
        case .index(let index): "interface #\(index)"
        case .named(let name): "interface \(name)"
        }
    }
}

/// The daemon connection's state, as the app can observe it.
public enum DaemonState: Sendable, Hashable, CustomStringConvertible {
    /// Waiting for the Avahi daemon (or the system bus) to appear; publications and browses resume
    /// by themselves when it does.
    case connecting
    /// The daemon is registering its host name (after start or a host-name collision).
    case registering
    /// Connected; services are published and browses run.
    case running
    /// Connection failed; retrying on a back-off timer. The error says why.
    case failed(DiscoveryError)
    /// ``ServiceDiscovery/shutdown()`` was called.
    case stopped

    public var description: String {
        switch self {
        case .connecting: "connecting"
        case .registering: "registering"
        case .running: "running"
        case .failed(let error): "failed (\(error.message))"
        case .stopped: "stopped"
        }
    }
}

/// An IP address as discovery reports it.
public enum IPAddress: Sendable, Hashable, CustomStringConvertible {
    /// Four bytes, network order.
    case v4(UInt8, UInt8, UInt8, UInt8)
    /// Sixteen bytes, network order.
    case v6([UInt8])

    /// The address bytes in network order (4 or 16).
    public var bytes: [UInt8] {
        switch self {
        case .v4(let a, let b, let c, let d): [a, b, c, d]
        case .v6(let bytes): bytes
        }
    }

    /// Whether this is an IPv6 link-local address (fe80::/10), which needs a scope id to be used.
    public var isLinkLocal: Bool {
        switch self {
        case .v4(let a, let b, _, _): a == 169 && b == 254
        case .v6(let bytes): bytes[0] == 0xfe && (bytes[1] & 0xc0) == 0x80
        }
    }

    /// The IP version of this address.
    public var version: IPVersion {
        if case .v4 = self { return .ipv4 }
        return .ipv6
    }

    /// Numeric text form, without scope (`10.0.0.1`, `fe80::1`).
    public var description: String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        var raw = bytes
        let family = raw.count == 4 ? AF_INET : AF_INET6
        inet_ntop(family, &raw, &buffer, socklen_t(buffer.count))
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// One address of a resolved service, with the interface it was found on.
public struct ServiceAddress: Sendable, Hashable, CustomStringConvertible {
    /// The IP address.
    public let ip: IPAddress
    /// Index of the interface the address was found on (in the Avahi daemon's network namespace).
    public let interfaceIndex: Int32
    /// Name of that interface, when it exists in this process's network namespace.
    public let interfaceName: String?
    /// The port of the service.
    public let port: UInt16

    /// The IPv6 scope id to put in `sin6_scope_id`: the interface index for link-local addresses,
    /// 0 otherwise. Without it, `connect()` to a link-local address fails with EINVAL.
    public var scopeID: UInt32 { ip.isLinkLocal && ip.version == .ipv6 ? UInt32(interfaceIndex) : 0 }

    /// Text that `getaddrinfo` accepts as a numeric host: `10.0.0.1`, `fd00::1`, `fe80::1%3`.
    public var numericHost: String {
        scopeID != 0 ? "\(ip)%\(scopeID)" : ip.description
    }

    public var description: String {
        let host = scopeID != 0 ? "\(ip)%\(interfaceName ?? String(interfaceIndex))" : ip.description
        return ip.version == .ipv6 ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    public init(ip: IPAddress, interfaceIndex: Int32, port: UInt16) {
        self.ip = ip
        self.interfaceIndex = interfaceIndex
        self.port = port
        var name = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
        if interfaceIndex > 0, if_indextoname(UInt32(interfaceIndex), &name) != nil {
            self.interfaceName = String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        } else {
            self.interfaceName = nil
        }
    }
}

/// What identifies a DNS-SD service instance: name, type and domain.
public struct ServiceIdentity: Sendable, Hashable, CustomStringConvertible {
    /// The instance name (e.g. `Lobby`), any UTF-8 up to 63 bytes.
    public var name: String
    /// The service type (e.g. `_bonjour-chat._tcp`).
    public var type: String
    /// The domain (`local` unless wide-area DNS-SD is in use).
    public var domain: String

    public init(name: String, type: String, domain: String = "local") {
        self.name = name
        self.type = type
        self.domain = domain
    }

    public var description: String { "'\(name)' (\(type).\(domain))" }
}

/// A service found by a browse.
public struct DiscoveredService: Sendable, Hashable, CustomStringConvertible {
    /// Name, type and domain.
    public let identity: ServiceIdentity
    /// The (interface index, IP version) pairs on which the service was seen so far.
    public let seenOn: Set<Sighting>
    /// Published by a process on this host.
    public let isLocal: Bool
    /// Published by this very ``ServiceDiscovery`` object.
    public let isOwn: Bool
    /// Everywhere this service was found: the link (domain `local`) first, then each unicast DNS
    /// domain, with the name it has there. One entry unless wide-area DNS-SD found the same service
    /// (the same `fp` TXT value — the same server key — and the same port) in several places;
    /// ``identity`` is the first place it was seen. A resolve asks every place and returns the
    /// link's addresses first.
    public let locations: [ServiceIdentity]

    init(
        identity: ServiceIdentity, seenOn: Set<Sighting>, isLocal: Bool, isOwn: Bool, locations: [ServiceIdentity]? = nil
    ) {
        self.identity = identity
        self.seenOn = seenOn
        self.isLocal = isLocal
        self.isOwn = isOwn
        self.locations = locations ?? [identity]
    }

    /// Where the service was found, for listings: `link`, a domain, or both (`link, lab.home.arpa`).
    public var foundIn: String {
        locations.map { $0.domain == "local" ? "link" : $0.domain }.joined(separator: ", ")
    }

    /// One place a service was seen: an interface and the IP version of the mDNS packets.
    public struct Sighting: Sendable, Hashable {
        public let interfaceIndex: Int32
        public let ipVersion: IPVersion
    }

    public var name: String { identity.name }
    public var type: String { identity.type }
    public var domain: String { identity.domain }

    public var description: String {
        var flags: [String] = []
        if isOwn { flags.append("own") } else if isLocal { flags.append("local") }
        return flags.isEmpty ? identity.description : "\(identity.description) [\(flags.joined(separator: ","))]"
    }
}

/// What a resolve found: where the service is and its TXT record.
public struct ResolvedService: Sendable, Hashable, CustomStringConvertible {
    /// Name, type and domain.
    public let identity: ServiceIdentity
    /// The target host name (e.g. `alpha.local`).
    public let hostName: String
    /// The service port.
    public let port: UInt16
    /// The TXT record (Avahi's private cookie entry removed).
    public let txt: TXTRecord
    /// Every address found, IPv6 and IPv4, each with its interface. Link-local IPv6 addresses carry
    /// their scope id (``ServiceAddress/scopeID``).
    public let addresses: [ServiceAddress]
    /// Published by a process on this host.
    public let isLocal: Bool

    public var name: String { identity.name }

    public var description: String {
        "\(identity) at \(hostName):\(port) [\(addresses.map(\.description).joined(separator: ", "))] txt: \(txt)"
    }
}

/// An event of a browse.
public enum BrowseEvent: Sendable, Hashable, CustomStringConvertible {
    /// A service appeared (reported once, however many interfaces and IP versions it is seen on).
    case added(DiscoveredService)
    /// A service went away (its last sighting was removed), or the daemon connection was lost.
    case removed(DiscoveredService)
    /// A service already reported was found in one more place, or lost one of several (wide-area:
    /// the link and a unicast domain); ``DiscoveredService/locations`` says where it is now.
    case updated(DiscoveredService)
    /// Avahi thinks no more services will show up soon (sent once per daemon connection).
    case allForNow
    /// The browse failed; it restarts by itself when the daemon comes back.
    case failed(DiscoveryError)

    public var description: String {
        switch self {
        case .added(let service): "added \(service)"
        case .removed(let service): "removed \(service)"
        case .updated(let service): "updated \(service) (found in \(service.foundIn))"
        case .allForNow: "all for now"
        case .failed(let error): "failed: \(error)"
        }
    }
}

/// Events of a published service.
public enum PublicationEvent: Sendable, Hashable, CustomStringConvertible {
    /// The service is announced on the network under this name.
    case established(name: String)
    /// The name collided with another service; the service is being re-published under `to`.
    case renamed(from: String, to: String)
    /// The daemon connection was lost; the service will be re-published when it returns.
    case suspended
    /// Avahi refused the service; it is not published.
    case failed(DiscoveryError)
    /// Wide-area: the service is registered in the unicast DNS domain `domain` under `name`
    /// (after a first registration, a re-registration, or a rename there).
    case registered(name: String, domain: String)
    /// Wide-area: the name was taken in `domain` by another service; registering as `to` there
    /// (the link keeps its own name).
    case registrationRenamed(domain: String, from: String, to: String)
    /// Wide-area: registering in `domain` failed; the error says why and what to do. The link
    /// publication is not affected; the registration is retried (soon while the DNS server does not
    /// answer, every 5 minutes after a refusal).
    case registrationFailed(domain: String, DiscoveryError)

    public var description: String {
        switch self {
        case .established(let name): "established as '\(name)'"
        case .renamed(let from, let to): "renamed '\(from)' → '\(to)'"
        case .suspended: "suspended (daemon lost)"
        case .failed(let error): "failed: \(error)"
        case .registered(let name, let domain): "registered as '\(name)' in \(domain)"
        case .registrationRenamed(let domain, let from, let to): "renamed '\(from)' → '\(to)' in \(domain)"
        case .registrationFailed(let domain, let error): "registration in \(domain) failed: \(error)"
        }
    }
}
