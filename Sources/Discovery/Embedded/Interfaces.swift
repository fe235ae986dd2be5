import MDNSCore

#if canImport(Glibc)
    import Glibc
#endif

/// One network interface as `getifaddrs` shows it: the package's one interface scan, used by the
/// embedded mDNS stack to choose its links and by `lanmsg doctor` to check them (so the doctor sees
/// what the stack sees: IPv4 aliases folded into their interface, the flags of every entry).
@_spi(Programs) public struct InterfaceInfo: Hashable, Sendable {
    public var name: String
    public var index: Int32
    public var flags: UInt32
    /// Addresses in network byte order: 4 bytes each, 16 bytes each.
    public var ipv4: [[UInt8]] = []
    public var ipv6: [[UInt8]] = []
    /// Each address's prefix length (from its netmask), for the subnet it is on.
    public var prefixLengths: [[UInt8]: Int] = [:]

    /// Up and running (has a carrier): what the stack uses.
    public var isUp: Bool { isAdministrativelyUp && hasCarrier }
    /// Configured up (IFF_UP), with or without a carrier.
    public var isAdministrativelyUp: Bool { flags & UInt32(IFF_UP) != 0 }
    /// The link has a carrier (IFF_RUNNING).
    public var hasCarrier: Bool { flags & UInt32(IFF_RUNNING) != 0 }
    public var isLoopback: Bool { flags & UInt32(IFF_LOOPBACK) != 0 }
    public var canMulticast: Bool { flags & UInt32(IFF_MULTICAST) != 0 }
    public var isPointToPoint: Bool { flags & UInt32(IFF_POINTOPOINT) != 0 }

    /// Every interface with its addresses, sorted by index.
    public static func scan() -> [InterfaceInfo] {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return [] }
        defer { freeifaddrs(list) }
        var byName: [String: InterfaceInfo] = [:]
        var entry: UnsafeMutablePointer<ifaddrs>? = first
        while let current = entry {
            defer { entry = current.pointee.ifa_next }
            guard let rawName = current.pointee.ifa_name else { continue }
            // An IPv4 alias is labelled "eth0:1": its address belongs to eth0.
            let name = String(String(cString: rawName).prefix { $0 != ":" })
            var info =
                byName[name]
                ?? InterfaceInfo(name: name, index: Int32(if_nametoindex(name)), flags: current.pointee.ifa_flags)
            info.flags |= current.pointee.ifa_flags
            if let address = current.pointee.ifa_addr {
                switch Int32(address.pointee.sa_family) {
                case AF_INET:
                    let value = UnsafeRawPointer(address).assumingMemoryBound(to: sockaddr_in.self).pointee.sin_addr
                    let bytes = withUnsafeBytes(of: value) { Array($0) }
                    info.ipv4.append(bytes)
                    if let mask = current.pointee.ifa_netmask {
                        let raw = UnsafeRawPointer(mask).assumingMemoryBound(to: sockaddr_in.self).pointee.sin_addr
                        info.prefixLengths[bytes] = withUnsafeBytes(of: raw) { $0.reduce(0) { $0 + $1.nonzeroBitCount } }
                    }
                case AF_INET6:
                    let value = UnsafeRawPointer(address).assumingMemoryBound(to: sockaddr_in6.self).pointee.sin6_addr
                    let bytes = withUnsafeBytes(of: value) { Array($0) }
                    info.ipv6.append(bytes)
                    if let mask = current.pointee.ifa_netmask {
                        let raw = UnsafeRawPointer(mask).assumingMemoryBound(to: sockaddr_in6.self).pointee.sin6_addr
                        info.prefixLengths[bytes] = withUnsafeBytes(of: raw) { $0.reduce(0) { $0 + $1.nonzeroBitCount } }
                    }
                default:
                    break
                }
            }
            byName[name] = info
        }
        return byName.values.filter { $0.index > 0 }.sorted { $0.index < $1.index }
    }

    /// The links the embedded stack uses: interfaces that are up, can multicast, are not
    /// point-to-point and are permitted by the policy; per IP version that is allowed, has an open
    /// socket and an address on the interface (loopback: IPv4 only). An IPv4 link advertises the interface's IPv4 and
    /// IPv6 addresses, an IPv6 link its IPv6 addresses (the engine makes A records on IPv4 only).
    static func links(
        from interfaces: [InterfaceInfo], configuration: DiscoveryConfiguration, families: Set<AddressFamily>
    ) -> [MDNSLink] {
        var links: [MDNSLink] = []
        for interface in interfaces where interface.isUp && interface.canMulticast && !interface.isPointToPoint {
            guard configuration.interfaces.permits(interface.name) else { continue }
            let v4 = configuration.ipVersion == .ipv6 ? [] : interface.ipv4
            let v6 = configuration.ipVersion == .ipv4 ? [] : interface.ipv6
            if families.contains(.v4), !v4.isEmpty {
                links.append(
                    MDNSLink(
                        id: LinkID(interfaceIndex: interface.index, family: .v4), name: interface.name,
                        addresses: v4 + v6))
            }
            // No IPv6 link on loopback: Linux has no IPv6 multicast route there (ENETUNREACH); the
            // IPv4 link on loopback carries ::1 too.
            if families.contains(.v6), !v6.isEmpty, !interface.isLoopback {
                links.append(
                    MDNSLink(
                        id: LinkID(interfaceIndex: interface.index, family: .v6), name: interface.name, addresses: v6))
            }
        }
        return links
    }
}

/// A netlink socket that wakes the backend when links or addresses change (RTMGRP_LINK,
/// RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR), so interfaces are rescanned on change, never polled.
/// Used on the backend's queue only.
final class NetlinkMonitor: @unchecked Sendable {  // fd is immutable; used on the backend's queue only
    let fd: Int32
    private var closed = false

    /// Opens and binds the socket; nil when netlink is not available (then no monitoring).
    init?() {
        // AF_NETLINK = 16, NETLINK_ROUTE = 0; sockaddr_nl is laid out by hand (not imported):
        // family (u16), pad (u16), pid (u32), groups (u32).
        let fd = socket(
            AF_NETLINK, Int32(SOCK_RAW.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = [UInt8](repeating: 0, count: 12)
        let family = UInt16(AF_NETLINK)
        let groups: UInt32 = 0x1 | 0x10 | 0x100  // RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
        address.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: family, toByteOffset: 0, as: UInt16.self)
            raw.storeBytes(of: groups, toByteOffset: 8, as: UInt32.self)
        }
        let bound = address.withUnsafeBytes { raw in
            bind(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), 12)
        }
        guard bound == 0 else {
            _ = Glibc.close(fd)
            return nil
        }
        self.fd = fd
    }

    /// Reads and discards every pending notification (the content does not matter: any change
    /// triggers a rescan). Bounded: at most 256 messages per call.
    func drain() {
        var buffer = [UInt8](repeating: 0, count: 8192)
        for _ in 0..<256 {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
        }
    }

    func close() {
        guard !closed else { return }
        closed = true
        _ = Glibc.close(fd)
    }

    deinit { close() }
}
