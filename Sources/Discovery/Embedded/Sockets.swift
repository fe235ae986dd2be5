import MDNSCore
import SystemCalls

#if canImport(Glibc)
    import Glibc
#endif

/// One datagram received on port 5353.
struct Datagram {
    var bytes: [UInt8]
    /// Source address, 4 or 16 bytes.
    var address: [UInt8]
    var port: UInt16
    /// Interface it arrived on (IP_PKTINFO / IPV6_PKTINFO); 0 when the kernel did not say.
    var interfaceIndex: Int32
}

/// A UDP socket bound to port 5353 for one address family, sharing the port with other mDNS
/// stacks (SO_REUSEADDR + SO_REUSEPORT, as avahi-daemon and python-zeroconf do), joined to the
/// mDNS group per interface, sending per interface with a packet-info control message.
///
/// Used on the embedded backend's queue only; the descriptor is closed by ``close()`` (the
/// backend calls it from its read source's cancel handler).
final class MDNSSocket: @unchecked Sendable {  // every field is used on the backend's queue only
    let fd: Int32
    let family: AddressFamily
    /// Receive buffers, allocated once: payload (9,000 bytes + 1 to see truncation), control
    /// messages, source address, iovec and msghdr.
    private let payload: UnsafeMutableRawBufferPointer
    private let control: UnsafeMutableRawBufferPointer
    private let name: UnsafeMutablePointer<sockaddr_storage>
    private let vector: UnsafeMutablePointer<iovec>
    private let header: UnsafeMutablePointer<msghdr>
    private var closed = false

    static let maxDatagram = 9000
    static let ipv4Group: [UInt8] = [224, 0, 0, 251]
    static let ipv6Group: [UInt8] = [0xff, 0x02] + [UInt8](repeating: 0, count: 13) + [0xfb]

    private init(fd: Int32, family: AddressFamily) {
        self.fd = fd
        self.family = family
        payload = .allocate(byteCount: Self.maxDatagram + 1, alignment: 16)
        control = .allocate(byteCount: 256, alignment: 16)
        name = .allocate(capacity: 1)
        vector = .allocate(capacity: 1)
        header = .allocate(capacity: 1)
    }

    deinit {
        close()
        payload.deallocate()
        control.deallocate()
        name.deallocate()
        vector.deallocate()
        header.deallocate()
    }

    func close() {
        guard !closed else { return }
        closed = true
        _ = Glibc.close(fd)
    }

    /// Opens, configures and binds the socket.
    static func open(_ family: AddressFamily) throws(DiscoveryError) -> MDNSSocket {
        let domain = family == .v4 ? AF_INET : AF_INET6
        let fd = socket(
            domain, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure("socket(\(family))", errno) }
        let socket = MDNSSocket(fd: fd, family: family)
        func set(_ level: Int32, _ option: Int32, _ value: Int32, _ what: String) throws(DiscoveryError) {
            var value = value
            if setsockopt(fd, level, option, &value, socklen_t(MemoryLayout<Int32>.size)) != 0 {
                throw failure("setsockopt(\(what))", errno)
            }
        }
        try set(SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR")
        try set(SOL_SOCKET, SO_REUSEPORT, 1, "SO_REUSEPORT")
        if family == .v4 {
            try set(Int32(IPPROTO_IP), IP_PKTINFO, 1, "IP_PKTINFO")
            try set(Int32(IPPROTO_IP), IP_MULTICAST_TTL, 255, "IP_MULTICAST_TTL")
            try set(Int32(IPPROTO_IP), IP_TTL, 255, "IP_TTL")
            try set(Int32(IPPROTO_IP), IP_MULTICAST_LOOP, 1, "IP_MULTICAST_LOOP")
            // Only the groups this socket joined, not every group any socket of the host joined.
            try set(Int32(IPPROTO_IP), IP_MULTICAST_ALL, 0, "IP_MULTICAST_ALL")
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = mdnsPort.bigEndian
            let result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard result == 0 else { throw failure("bind(0.0.0.0:5353)", errno) }
        } else {
            try set(Int32(IPPROTO_IPV6), IPV6_V6ONLY, 1, "IPV6_V6ONLY")
            try set(Int32(IPPROTO_IPV6), IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO")
            try set(Int32(IPPROTO_IPV6), IPV6_MULTICAST_HOPS, 255, "IPV6_MULTICAST_HOPS")
            try set(Int32(IPPROTO_IPV6), IPV6_UNICAST_HOPS, 255, "IPV6_UNICAST_HOPS")
            try set(Int32(IPPROTO_IPV6), IPV6_MULTICAST_LOOP, 1, "IPV6_MULTICAST_LOOP")
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = mdnsPort.bigEndian
            let result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
                }
            }
            guard result == 0 else { throw failure("bind([::]:5353)", errno) }
        }
        return socket
    }

    private static func failure(_ call: String, _ code: Int32) -> DiscoveryError {
        DiscoveryError(
            .network, "\(call) failed for the embedded mDNS stack: \(Errno(code))", systemErrno: code)
    }

    /// Joins 224.0.0.251 / ff02::fb on one interface. Returns nil or the error.
    func join(interface: Int32) -> Errno? {
        membership(interface: interface, join: true)
    }

    /// Leaves the group on one interface (errors ignored: the interface may be gone).
    func leave(interface: Int32) {
        _ = membership(interface: interface, join: false)
    }

    private func membership(interface: Int32, join: Bool) -> Errno? {
        let result: Int32
        if family == .v4 {
            var request = ip_mreqn()
            request.imr_multiaddr.s_addr = UInt32(224 << 24 | 251).bigEndian
            request.imr_ifindex = interface
            result = setsockopt(
                fd, Int32(IPPROTO_IP), join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &request,
                socklen_t(MemoryLayout<ip_mreqn>.size))
        } else {
            var request = ipv6_mreq()
            withUnsafeMutableBytes(of: &request.ipv6mr_multiaddr) { $0.copyBytes(from: Self.ipv6Group) }
            request.ipv6mr_interface = UInt32(interface)
            result = setsockopt(
                fd, Int32(IPPROTO_IPV6), join ? IPV6_JOIN_GROUP : IPV6_LEAVE_GROUP, &request,
                socklen_t(MemoryLayout<ipv6_mreq>.size))
        }
        if result == 0 || errno == EADDRINUSE { return nil }
        return Errno(errno)
    }

    /// Sends one datagram out of one interface: to the group, or to one querier.
    func send(_ bytes: [UInt8], interface: Int32, to destination: MDNSPacket.Destination) -> Errno? {
        var storage = sockaddr_storage()
        let length: Int
        let (address, port): ([UInt8], UInt16) =
            switch destination {
            case .multicast: (family == .v4 ? Self.ipv4Group : Self.ipv6Group, mdnsPort)
            case .unicast(let address, let port): (address, port)
            }
        guard address.count == (family == .v4 ? 4 : 16) else { return Errno(EAFNOSUPPORT) }
        if family == .v4 {
            length = MemoryLayout<sockaddr_in>.size
            withUnsafeMutableBytes(of: &storage) { raw in
                let pointer = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in.self)
                pointer.pointee.sin_family = sa_family_t(AF_INET)
                pointer.pointee.sin_port = port.bigEndian
                withUnsafeMutableBytes(of: &pointer.pointee.sin_addr) { $0.copyBytes(from: address) }
            }
        } else {
            length = MemoryLayout<sockaddr_in6>.size
            withUnsafeMutableBytes(of: &storage) { raw in
                let pointer = raw.baseAddress!.assumingMemoryBound(to: sockaddr_in6.self)
                pointer.pointee.sin6_family = sa_family_t(AF_INET6)
                pointer.pointee.sin6_port = port.bigEndian
                pointer.pointee.sin6_scope_id = UInt32(interface)
                withUnsafeMutableBytes(of: &pointer.pointee.sin6_addr) { $0.copyBytes(from: address) }
            }
        }
        // A packet-info control message picks the outgoing interface (multicast and unicast alike).
        var controlBytes = [UInt8](repeating: 0, count: 64)
        let controlLength = Self.writePacketInfo(into: &controlBytes, family: family, interface: interface)
        var payloadBytes = bytes
        let result: Result<Int, Errno> = payloadBytes.withUnsafeMutableBytes { data in
            controlBytes.withUnsafeMutableBytes { controlBuffer in
                withUnsafeMutablePointer(to: &storage) { namePointer in
                    var io = iovec(iov_base: data.baseAddress, iov_len: data.count)
                    return withUnsafeMutablePointer(to: &io) { ioPointer in
                        var message = msghdr()
                        message.msg_name = UnsafeMutableRawPointer(namePointer)
                        message.msg_namelen = socklen_t(length)
                        message.msg_iov = ioPointer
                        message.msg_iovlen = 1
                        message.msg_control = controlBuffer.baseAddress
                        message.msg_controllen = controlLength
                        return retryingInterrupts { sendmsg(fd, &message, Int32(MSG_NOSIGNAL)) }
                    }
                }
            }
        }
        if case .failure(let error) = result { return error }
        return nil
    }

    /// `cmsghdr` + `in_pktinfo` (IPv4) or `in6_pktinfo` (IPv6, laid out by hand: glibc hides the
    /// struct without _GNU_SOURCE). Returns the control length (CMSG_SPACE).
    static func writePacketInfo(into buffer: inout [UInt8], family: AddressFamily, interface: Int32) -> Int {
        let headerSize = MemoryLayout<cmsghdr>.size
        let dataSize = family == .v4 ? MemoryLayout<in_pktinfo>.size : 20
        let space = headerSize + align(dataSize)
        buffer.withUnsafeMutableBytes { raw in
            let header = raw.baseAddress!.assumingMemoryBound(to: cmsghdr.self)
            header.pointee.cmsg_len = headerSize + dataSize
            header.pointee.cmsg_level = family == .v4 ? Int32(IPPROTO_IP) : Int32(IPPROTO_IPV6)
            header.pointee.cmsg_type = family == .v4 ? IP_PKTINFO : IPV6_PKTINFO
            if family == .v4 {
                raw.storeBytes(of: interface, toByteOffset: headerSize, as: Int32.self)  // ipi_ifindex
            } else {
                raw.storeBytes(of: UInt32(interface), toByteOffset: headerSize + 16, as: UInt32.self)  // ipi6_ifindex
            }
        }
        return space
    }

    static func align(_ size: Int) -> Int {
        let unit = MemoryLayout<Int>.size
        return (size + unit - 1) & ~(unit - 1)
    }

    /// Receives one datagram; nil when none is waiting (or on an error, which is returned in
    /// `error`). Truncated datagrams (over 9,000 bytes) are dropped and reported as such.
    func receive() -> (datagram: Datagram?, truncated: Bool, error: Errno?) {
        vector.pointee = iovec(iov_base: payload.baseAddress, iov_len: payload.count)
        header.pointee = msghdr()
        header.pointee.msg_name = UnsafeMutableRawPointer(name)
        header.pointee.msg_namelen = socklen_t(MemoryLayout<sockaddr_storage>.size)
        header.pointee.msg_iov = vector
        header.pointee.msg_iovlen = 1
        header.pointee.msg_control = control.baseAddress
        header.pointee.msg_controllen = control.count
        switch retryingInterrupts({ recvmsg(fd, header, 0) }) {
        case .failure(let error):
            return (nil, false, error.wouldBlock ? nil : error)
        case .success(let count):
            if count > Self.maxDatagram || header.pointee.msg_flags & Int32(MSG_TRUNC) != 0 { return (nil, true, nil) }
            let bytes = Array(UnsafeRawBufferPointer(rebasing: payload[0..<count]))
            var address: [UInt8] = []
            var port: UInt16 = 0
            let raw = UnsafeRawPointer(name)
            if family == .v4 {
                let source = raw.assumingMemoryBound(to: sockaddr_in.self).pointee
                address = withUnsafeBytes(of: source.sin_addr) { Array($0) }
                port = UInt16(bigEndian: source.sin_port)
            } else {
                let source = raw.assumingMemoryBound(to: sockaddr_in6.self).pointee
                address = withUnsafeBytes(of: source.sin6_addr) { Array($0) }
                port = UInt16(bigEndian: source.sin6_port)
            }
            let datagram = Datagram(
                bytes: bytes, address: address, port: port,
                interfaceIndex: Self.interfaceIndex(control: control, length: Int(header.pointee.msg_controllen)))
            return (datagram, false, nil)
        }
    }

    /// The interface index from an IP_PKTINFO / IPV6_PKTINFO control message.
    static func interfaceIndex(control: UnsafeMutableRawBufferPointer, length: Int) -> Int32 {
        let headerSize = MemoryLayout<cmsghdr>.size
        var offset = 0
        while offset + headerSize <= min(length, control.count) {
            let header = control.baseAddress!.advanced(by: offset).assumingMemoryBound(to: cmsghdr.self).pointee
            let messageLength = Int(header.cmsg_len)
            guard messageLength >= headerSize, offset + messageLength <= control.count else { break }
            if header.cmsg_level == Int32(IPPROTO_IP), header.cmsg_type == IP_PKTINFO, messageLength >= headerSize + 4 {
                return control.load(fromByteOffset: offset + headerSize, as: Int32.self)
            }
            if header.cmsg_level == Int32(IPPROTO_IPV6), header.cmsg_type == IPV6_PKTINFO,
                messageLength >= headerSize + 20
            {
                return Int32(bitPattern: control.load(fromByteOffset: offset + headerSize + 16, as: UInt32.self))
            }
            offset += align(messageLength)
        }
        return 0
    }
}
