import ProtocolCore

import Glibc

extension SocketAddress {
    /// Parses a numeric IPv4 (`"10.0.0.1"`) or IPv6 (`"::1"`, `"fe80::1%3"`, `"fe80::1%eth0"`) address.
    ///
    /// - Parameters:
    ///   - ipAddress: The numeric address. An IPv6 address may carry a `%scope` suffix (interface index or name).
    ///   - port: The port in host byte order.
    ///   - scopeID: An explicit IPv6 scope id (interface index); overrides a `%scope` suffix when non-nil.
    /// - Throws: `TransportError.Code.invalidAddress` when the string is not a numeric address.
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
        if let parsed = SocketAddress(numeric: host, port: port, scopeID: scopeID ?? (scope == 0 ? nil : scope)) {
            self = parsed
            return
        }
        if scopeID != nil && scopeID != 0, SocketAddress(numeric: host, port: port) != nil {
            throw TransportError(.invalidAddress, "a scope id was given for IPv4 address '\(ipAddress)'")
        }
        throw TransportError(
            .invalidAddress,
            "'\(ipAddress)' is not a numeric IPv4 or IPv6 address; pass a resolved address, not a host name")
    }

    /// Calls `body` with a `sockaddr` pointer and length for this address.
    @_spi(Programs) public func withSockAddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) throws(TransportError) -> R)
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
    package init?(storage ss: sockaddr_storage) {
        var ss = ss
        switch Int32(ss.ss_family) {
        case AF_INET:
            let sin = withUnsafeBytes(of: &ss) { $0.load(as: sockaddr_in.self) }
            self.init(storage: .v4(address: sin.sin_addr.s_addr, port: UInt16(bigEndian: sin.sin_port)))
        case AF_INET6:
            var sin6 = withUnsafeBytes(of: &ss) { $0.load(as: sockaddr_in6.self) }
            let bytes = withUnsafeBytes(of: &sin6.sin6_addr) { Array($0) }
            self.init(storage: .v6(address: bytes, port: UInt16(bigEndian: sin6.sin6_port), scopeID: sin6.sin6_scope_id))
        default:
            return nil
        }
    }

    package var domain: Int32 { family == .ipv4 ? AF_INET : AF_INET6 }
}


/// Socket helpers shared by the listener and outbound connects.
package enum SocketOps {
    /// `SOCK_STREAM` as `getaddrinfo`'s hints take it.
    package static var plainStreamType: Int32 {
        #if os(Linux)
            Int32(SOCK_STREAM.rawValue)
        #else
            SOCK_STREAM
        #endif
    }

    static let streamType: Int32 = {
        #if os(Linux)
            Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        #else
            SOCK_STREAM
        #endif
    }()

    /// Creates a nonblocking, close-on-exec TCP socket.
    package static func makeSocket(domain: Int32) throws(TransportError) -> FileDescriptor {
        let fd = FileDescriptor(try syscallValue("socket") { socket(domain, streamType, 0) })
        #if !os(Linux)
            _ = fcntl(fd.rawValue, F_SETFD, FD_CLOEXEC)
            _ = fcntl(fd.rawValue, F_SETFL, fcntl(fd.rawValue, F_GETFL) | O_NONBLOCK)
            var one: Int32 = 1
            _ = setsockopt(fd.rawValue, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif
        return fd
    }

    package static func setOption(_ fd: FileDescriptor, _ level: Int32, _ name: Int32, _ value: Int32, _ label: String)
        throws(TransportError)
    {
        var value = value
        try syscallValue("setsockopt(\(label))") {
            setsockopt(fd.rawValue, level, name, &value, socklen_t(MemoryLayout<Int32>.size))
        }
    }

    package static func localAddress(_ fd: FileDescriptor) -> SocketAddress? {
        var ss = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &ss) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd.rawValue, $0, &len) }
        }
        return rc == 0 ? SocketAddress(storage: ss) : nil
    }

    package static func remoteAddress(_ fd: FileDescriptor) -> SocketAddress? {
        var ss = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &ss) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd.rawValue, $0, &len) }
        }
        return rc == 0 ? SocketAddress(storage: ss) : nil
    }

    package static func socketError(_ fd: FileDescriptor) -> Int32 {
        var err: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(fd.rawValue, SOL_SOCKET, SO_ERROR, &err, &len) != 0 { return errno }
        return err
    }
}
