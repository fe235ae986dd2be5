import Discovery
import ProtocolCore
import Transport

/// Where a client connects: a fixed host and port, or a service found by discovery.
public enum ServiceTarget: Sendable, CustomStringConvertible {
    /// A host name or numeric address (IPv6 may carry `%scope`) and a port.
    case host(String, port: UInt16)
    /// A DNS-SD service of `type`, by instance name; nil name: the only one there is. Without a
    /// name the client must see the whole network's answer first (Avahi's "all for now", about a
    /// second on a quiet network) to know the service is the only one; with a name it connects the
    /// moment that service is seen.
    case service(name: String?, type: String, discovery: ServiceDiscovery)

    public var description: String {
        switch self {
        case .host(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .service(let name, let type, _): name.map { "'\($0)' (\(type))" } ?? "the \(type) service"
        }
    }
}
