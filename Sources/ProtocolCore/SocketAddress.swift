import Glibc

/// An IPv4 or IPv6 socket address (a value: no socket is involved) (numeric host + port, plus a scope id for link-local IPv6).
///
/// Build one from a numeric string, for example from a DNS-SD resolve result:
/// ```swift
/// let a = try SocketAddress(ipAddress: "10.0.0.1", port: 4000)
/// let b = try SocketAddress(ipAddress: "fe80::1%3", port: 4000)          // scope in the string
/// let c = try SocketAddress(ipAddress: "fe80::1", port: 4000, scopeID: 3) // explicit interface index
/// ```
public struct SocketAddress: Sendable, Hashable, CustomStringConvertible {
    /// The address family.
    public enum Family: Sendable, Hashable, CustomStringConvertible {
        /// IPv4 (`AF_INET`).
        case ipv4
        /// IPv6 (`AF_INET6`).
        case ipv6

        /// `"IPv4"` or `"IPv6"`.
        public var description: String { self == .ipv4 ? "IPv4" : "IPv6" }
    }

    package enum Storage: Hashable, Sendable {
        case v4(address: UInt32, port: UInt16)  // address in network byte order, port in host order
        case v6(address: [UInt8], port: UInt16, scopeID: UInt32)
    }

    package let storage: Storage

    /// The address family.
    public var family: Family {
        if case .v4 = storage { return .ipv4 }
        return .ipv6
    }

    /// The port, in host byte order.
    public var port: UInt16 {
        switch storage {
        case .v4(_, let port), .v6(_, let port, _): port
        }
    }

    /// The IPv6 scope id (interface index); 0 for IPv4 and for global IPv6 addresses.
    public var scopeID: UInt32 {
        if case .v6(_, _, let scope) = storage { return scope }
        return 0
    }

    /// Whether this is an IPv6 link-local address (`fe80::/10`), which needs a ``scopeID`` to connect.
    public var isLinkLocalIPv6: Bool {
        if case .v6(let bytes, _, _) = storage { return bytes[0] == 0xFE && (bytes[1] & 0xC0) == 0x80 }
        return false
    }

    /// The IPv4 loopback address `127.0.0.1` with this port.
    public static func ipv4Loopback(port: UInt16) -> SocketAddress {
        SocketAddress(storage: .v4(address: UInt32(0x7F00_0001).bigEndian, port: port))
    }

    /// The IPv6 loopback address `::1` with this port.
    public static func ipv6Loopback(port: UInt16) -> SocketAddress {
        var bytes = [UInt8](repeating: 0, count: 16)
        bytes[15] = 1
        return SocketAddress(storage: .v6(address: bytes, port: port, scopeID: 0))
    }

    package init(storage: Storage) { self.storage = storage }

    /// An IPv4 address from its 4 bytes (network order) or an IPv6 address from its 16 bytes.
    /// - Returns: nil for any other length.
    @_spi(Programs) public init?(bytes: [UInt8], port: UInt16, scopeID: UInt32 = 0) {
        switch bytes.count {
        case 4:
            let address = bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }
            storage = .v4(address: address, port: port)
        case 16:
            storage = .v6(address: bytes, port: port, scopeID: scopeID)
        default:
            return nil
        }
    }

    /// Parses a numeric IPv4 or IPv6 address with an optional numeric `%scope`; nil if it is not one.
    package init?(numeric text: String, port: UInt16, scopeID: UInt32? = nil) {
        var host = text
        var scope: UInt32 = 0
        if let percent = host.firstIndex(of: "%") {
            guard let index = UInt32(host[host.index(after: percent)...]) else { return nil }
            scope = index
            host = String(host[..<percent])
            var v4 = in_addr()
            if inet_pton(AF_INET, host, &v4) == 1 { return nil }  // IPv4 has no scope
        }
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            if let scopeID, scopeID != 0 { return nil }
            storage = .v4(address: v4.s_addr, port: port)
            return
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, host, &v6) == 1 else { return nil }
        let bytes = withUnsafeBytes(of: &v6) { Array($0) }
        storage = .v6(address: bytes, port: port, scopeID: scopeID ?? scope)
    }

    /// The same address with another port.
    public func withPort(_ port: UInt16) -> SocketAddress {
        switch storage {
        case .v4(let a, _): SocketAddress(storage: .v4(address: a, port: port))
        case .v6(let a, _, let s): SocketAddress(storage: .v6(address: a, port: port, scopeID: s))
        }
    }

    /// The numeric host part: `"10.0.0.1"`, `"fe80::1%3"`.
    public var host: String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        switch storage {
        case .v4(let a, _):
            var addr = in_addr(s_addr: a)
            _ = inet_ntop(AF_INET, &addr, &buffer, socklen_t(buffer.count))
            return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        case .v6(let bytes, _, let scope):
            var addr = in6_addr()
            withUnsafeMutableBytes(of: &addr) { $0.copyBytes(from: bytes) }
            _ = inet_ntop(AF_INET6, &addr, &buffer, socklen_t(buffer.count))
            let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            return scope == 0 ? text : "\(text)%\(scope)"
        }
    }

    /// `"10.0.0.1:4000"` or `"[fe80::1%3]:4000"`.
    public var description: String {
        family == .ipv4 ? "\(host):\(port)" : "[\(host)]:\(port)"
    }

}
