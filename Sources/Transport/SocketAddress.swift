#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// An IPv4 or IPv6 socket address (numeric host + port, plus a scope id for link-local IPv6).
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

    enum Storage: Hashable, Sendable {
        case v4(address: UInt32, port: UInt16)  // address in network byte order, port in host order
        case v6(address: [UInt8], port: UInt16, scopeID: UInt32)
    }

    let storage: Storage

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

    /// Parses a numeric IPv4 (`"10.0.0.1"`) or IPv6 (`"::1"`, `"fe80::1%3"`, `"fe80::1%eth0"`) address.
    ///
    /// - Parameters:
    ///   - ipAddress: The numeric address. An IPv6 address may carry a `%scope` suffix (interface index or name).
    ///   - port: The port in host byte order.
    ///   - scopeID: An explicit IPv6 scope id (interface index); overrides a `%scope` suffix when non-nil.
    /// - Throws: ``TransportError/Code/invalidAddress`` when the string is not a numeric address.
    public init(ipAddress: String, port: UInt16, scopeID: UInt32? = nil) throws(TransportError) {
        var host = ipAddress
        var scope: UInt32 = 0
        if let percent = host.firstIndex(of: "%") {
            let suffix = String(host[host.index(after: percent)...])
            host = String(host[..<percent])
            if let index = UInt32(suffix) {
                scope = index
            } else {
                scope = if_nametoindex(suffix)
                if scope == 0 {
                    throw TransportError(
                        .invalidAddress,
                        "unknown interface '\(suffix)' in address '\(ipAddress)'; use an interface index")
                }
            }
        }
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1, !host.contains("%") {
            if scopeID != nil && scopeID != 0 {
                throw TransportError(.invalidAddress, "a scope id was given for IPv4 address '\(ipAddress)'")
            }
            storage = .v4(address: v4.s_addr, port: port)
            return
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 {
            let bytes = withUnsafeBytes(of: &v6) { Array($0) }
            storage = .v6(address: bytes, port: port, scopeID: scopeID ?? scope)
            return
        }
        throw TransportError(
            .invalidAddress,
            "'\(ipAddress)' is not a numeric IPv4 or IPv6 address; pass a resolved address, not a host name")
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

    init(storage: Storage) { self.storage = storage }

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

    /// Calls `body` with a `sockaddr` pointer and length for this address.
    func withSockAddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws(TransportError) -> R)
        throws(TransportError) -> R
    {
        switch storage {
        case .v4(let a, let port):
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            sin.sin_addr = in_addr(s_addr: a)
            return try withUnsafePointer(to: &sin) { (p) throws(TransportError) -> R in
                try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { (sp) throws(TransportError) -> R in
                    try body(sp, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        case .v6(let bytes, let port, let scope):
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            sin6.sin6_scope_id = scope
            withUnsafeMutableBytes(of: &sin6.sin6_addr) { $0.copyBytes(from: bytes) }
            return try withUnsafePointer(to: &sin6) { (p) throws(TransportError) -> R in
                try p.withMemoryRebound(to: sockaddr.self, capacity: 1) { (sp) throws(TransportError) -> R in
                    try body(sp, socklen_t(MemoryLayout<sockaddr_in6>.size))
                }
            }
        }
    }

    /// Reads an address from `sockaddr_storage` (as filled by accept/getsockname/getpeername).
    init?(storage ss: sockaddr_storage) {
        var ss = ss
        switch Int32(ss.ss_family) {
        case AF_INET:
            let sin = withUnsafeBytes(of: &ss) { $0.load(as: sockaddr_in.self) }
            self.storage = .v4(address: sin.sin_addr.s_addr, port: UInt16(bigEndian: sin.sin_port))
        case AF_INET6:
            var sin6 = withUnsafeBytes(of: &ss) { $0.load(as: sockaddr_in6.self) }
            let bytes = withUnsafeBytes(of: &sin6.sin6_addr) { Array($0) }
            self.storage = .v6(address: bytes, port: UInt16(bigEndian: sin6.sin6_port), scopeID: sin6.sin6_scope_id)
        default:
            return nil
        }
    }

    var domain: Int32 { family == .ipv4 ? AF_INET : AF_INET6 }
}

/// Socket helpers shared by the listener and outbound connects.
enum SocketOps {
    static let streamType: Int32 = {
        #if os(Linux)
            Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        #else
            SOCK_STREAM
        #endif
    }()

    /// Creates a nonblocking, close-on-exec TCP socket.
    static func makeSocket(domain: Int32) throws(TransportError) -> Int32 {
        let fd = try syscallValue("socket") { socket(domain, streamType, 0) }
        #if !os(Linux)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            var one: Int32 = 1
            _ = setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif
        return fd
    }

    static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32, _ label: String)
        throws(TransportError)
    {
        var value = value
        try syscallValue("setsockopt(\(label))") {
            setsockopt(fd, level, name, &value, socklen_t(MemoryLayout<Int32>.size))
        }
    }

    static func localAddress(_ fd: Int32) -> SocketAddress? {
        var ss = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &ss) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        return rc == 0 ? SocketAddress(storage: ss) : nil
    }

    static func remoteAddress(_ fd: Int32) -> SocketAddress? {
        var ss = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &ss) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &len) }
        }
        return rc == 0 ? SocketAddress(storage: ss) : nil
    }

    static func socketError(_ fd: Int32) -> Int32 {
        var err: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 { return errno }
        return err
    }
}
