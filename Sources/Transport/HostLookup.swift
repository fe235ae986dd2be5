import ProtocolCore

import Glibc

/// Host names to socket addresses (`getaddrinfo`), for connecting by name.
package enum HostLookup {
    /// The addresses of `host` (a numeric address is returned as is), IPv6 first as `getaddrinfo`
    /// orders them, without duplicates.
    /// - Throws: `TransportError.Code.connectFailed` when the name does not resolve.
    package static func addresses(host: String, port: UInt16) throws(TransportError) -> [SocketAddress] {
        if let numeric = try? SocketAddress(ipAddress: host, port: port) { return [numeric] }
        var hints = addrinfo()
        hints.ai_socktype = SocketOps.plainStreamType
        var info: UnsafeMutablePointer<addrinfo>?
        let result = getaddrinfo(host, String(port), &hints, &info)
        guard result == 0, let info else {
            throw TransportError(
                .connectFailed, "cannot resolve host '\(host)': \(String(cString: gai_strerror(result)))")
        }
        defer { freeaddrinfo(info) }
        var found: [SocketAddress] = []
        var node: UnsafeMutablePointer<addrinfo>? = info
        while let current = node {
            var storage = sockaddr_storage()
            withUnsafeMutableBytes(of: &storage) { raw in
                raw.copyMemory(
                    from: UnsafeRawBufferPointer(start: current.pointee.ai_addr, count: Int(current.pointee.ai_addrlen)))
            }
            if let address = SocketAddress(storage: storage), !found.contains(address) { found.append(address) }
            node = current.pointee.ai_next
        }
        guard !found.isEmpty else {
            throw TransportError(.connectFailed, "host '\(host)' has no IPv4 or IPv6 address")
        }
        return found
    }
}
