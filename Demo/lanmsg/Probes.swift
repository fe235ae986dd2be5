@_spi(Programs) import Discovery
import Dispatch
import Glibc
import MDNSCore
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport
import SystemCalls

// Low-level probes of the host for `lanmsg doctor`: interfaces, the D-Bus socket, who holds UDP
// port 5353, and whether an mDNS packet sent on an interface comes back. Each returns what it saw;
// Doctor.swift turns that into findings with advice.

/// Every interface with its flags and addresses, in index order: the embedded mDNS stack's own
/// scan (`InterfaceInfo.scan()`), so that the doctor checks the interfaces as the stack sees them.
func readInterfaces() -> [InterfaceInfo] { InterfaceInfo.scan() }

/// What the doctor prints of an interface's addresses.
extension InterfaceInfo {
    var ipv4Text: [String] { ipv4.map { bytes in ntop(AF_INET, bytes.withUnsafeBytes { $0.loadUnaligned(as: in_addr.self) }) } }
    /// IPv6 link-local addresses with their zone (`fe80::1%eth0`).
    var ipv6LinkLocal: [String] {
        ipv6.filter(Self.isLinkLocal).map { "\(ntop(AF_INET6, $0.withUnsafeBytes { $0.loadUnaligned(as: in6_addr.self) }))%\(name)" }
    }
    var ipv6Other: [String] {
        ipv6.filter { !Self.isLinkLocal($0) }.map { ntop(AF_INET6, $0.withUnsafeBytes { $0.loadUnaligned(as: in6_addr.self) }) }
    }

    private static func isLinkLocal(_ bytes: [UInt8]) -> Bool { bytes[0] == 0xfe && bytes[1] & 0xc0 == 0x80 }
}

private func ntop(_ family: Int32, _ address: in_addr) -> String {
    var address = address
    var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
    guard inet_ntop(family, &address, &buffer, socklen_t(buffer.count)) != nil else { return "?" }
    return cString(buffer)
}

private func ntop(_ family: Int32, _ address: in6_addr) -> String {
    var address = address
    var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
    guard inet_ntop(family, &address, &buffer, socklen_t(buffer.count)) != nil else { return "?" }
    return cString(buffer)
}

/// The text before the first NUL of a C buffer.
func cString(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// The system bus socket's path: DBUS_SYSTEM_BUS_ADDRESS's `unix:path=`, else the default.
func systemBusPath() -> String {
    if let address = getenv("DBUS_SYSTEM_BUS_ADDRESS").map({ String(cString: $0) }) {
        for part in address.split(separator: ";") {
            for field in part.split(separator: ",") {
                let text = field.hasPrefix("unix:") ? field.dropFirst(5) : field
                if text.hasPrefix("path=") { return String(text.dropFirst(5)) }
            }
        }
    }
    return "/run/dbus/system_bus_socket"
}

/// Connects to a Unix stream socket; nil on success, else errno.
func connectUnix(_ path: String) -> Int32? {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return errno }
    defer { close(fd) }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return ENAMETOOLONG }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (index, byte) in bytes.enumerated() { raw[index] = byte }
    }
    let result = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    return result == 0 ? nil : errno
}

/// A process holding a UDP socket on the port.
struct PortHolder: Hashable {
    var pid: Int32
    var command: String
}

/// The UDP sockets bound to `port` (IPv4 and IPv6, from /proc/net) and the processes holding them
/// (those whose /proc/PID/fd this process can read: all of them as root).
func udpPortHolders(_ port: UInt16) -> (sockets: Int, holders: [PortHolder]) {
    let inodes = udpSocketInodes(port)
    var holders = Set<PortHolder>()
    if !inodes.isEmpty, let processes = opendir("/proc") {
        defer { closedir(processes) }
        while let entry = readdir(processes) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard let pid = Int32(name) else { continue }
            guard let fds = opendir("/proc/\(pid)/fd") else { continue }
            defer { closedir(fds) }
            while let fd = readdir(fds) {
                let fdName = withUnsafeBytes(of: fd.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                var target = [CChar](repeating: 0, count: 64)
                let count = readlink("/proc/\(pid)/fd/\(fdName)", &target, target.count - 1)
                guard count > 0 else { continue }
                let link = String(decoding: target[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
                guard link.hasPrefix("socket:["), inodes.contains(String(link.dropFirst(8).dropLast())) else { continue }
                let command = readText("/proc/\(pid)/comm")?.split(separator: "\n").first.map(String.init) ?? "?"
                holders.insert(PortHolder(pid: pid, command: command))
            }
        }
    }
    // Sockets closed meanwhile (a program that just exited) are not counted.
    return (inodes.intersection(udpSocketInodes(port)).count, holders.sorted { $0.pid < $1.pid })
}

/// The inodes of the UDP sockets (IPv4 and IPv6) bound to `port`, from /proc/net.
func udpSocketInodes(_ port: UInt16) -> Set<String> {
    var inodes = Set<String>()
    let hexPort = String(port, radix: 16, uppercase: true)
    let suffix = ":" + String(repeating: "0", count: max(0, 4 - hexPort.count)) + hexPort
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        guard let text = readText(table) else { continue }
        for line in text.split(separator: "\n").dropFirst() {
            let columns = line.split(separator: " ", omittingEmptySubsequences: true)
            guard columns.count > 9, columns[1].hasSuffix(suffix) else { continue }
            inodes.insert(String(columns[9]))
        }
    }
    return inodes
}

func readText(_ path: String) -> String? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = fread(&buffer, 1, buffer.count, file)
        if count <= 0 { break }
        bytes += buffer[0..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// What the multicast round trip on one interface saw.
enum LoopResult {
    /// Our query came back after this many microseconds.
    case cameBack(micros: Int)
    /// It was sent but did not come back within the timeout.
    case silent
    /// A step failed: which, and errno.
    case failed(step: String, errno: Int32)
}

/// Sends an mDNS query (for a name only this probe uses) to the mDNS group on one interface, from a
/// socket bound to port 5353 and joined to the group there (what an mDNS stack does), with
/// multicast loopback on, and waits for the same packet to arrive on that socket. A packet that
/// does not come back was dropped on this host: by a firewall (the looped copy passes the INPUT
/// hook), or because the interface cannot send multicast.
func multicastRoundTrip(_ interface: InterfaceInfo, ipv6: Bool, timeoutMilliseconds: Int32) -> LoopResult {
    let fd = socket(ipv6 ? AF_INET6 : AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
    guard fd >= 0 else { return .failed(step: "socket", errno: errno) }
    defer { close(fd) }
    func option<T>(_ level: Int32, _ name: Int32, _ value: T) -> Bool {
        withUnsafeBytes(of: value) { setsockopt(fd, level, name, $0.baseAddress, socklen_t($0.count)) == 0 }
    }
    let index = interface.index
    _ = option(SOL_SOCKET, SO_REUSEADDR, Int32(1))
    _ = option(SOL_SOCKET, SO_REUSEPORT, Int32(1))
    let any: SocketAddress
    let group: SocketAddress
    do {
        any = try SocketAddress(ipAddress: ipv6 ? "::" : "0.0.0.0", port: 5353)
        group = try SocketAddress(ipAddress: ipv6 ? "ff02::fb" : "224.0.0.251", port: 5353, scopeID: ipv6 ? UInt32(interface.index) : nil)
    } catch {
        return .failed(step: "address", errno: EINVAL)
    }
    if ipv6 { _ = option(Int32(IPPROTO_IPV6), IPV6_V6ONLY, Int32(1)) }
    let bound = (try? any.withSockAddr { address, length in bind(fd, address, length) }) ?? -1
    guard bound == 0 else { return .failed(step: "bind \(any)", errno: errno) }
    if ipv6 {
        var request = ipv6_mreq()
        inet_pton(AF_INET6, "ff02::fb", &request.ipv6mr_multiaddr)
        request.ipv6mr_interface = UInt32(index)
        guard option(Int32(IPPROTO_IPV6), IPV6_ADD_MEMBERSHIP, request) else { return .failed(step: "join ff02::fb", errno: errno) }
        guard option(Int32(IPPROTO_IPV6), IPV6_MULTICAST_IF, index) else { return .failed(step: "IPV6_MULTICAST_IF", errno: errno) }
        _ = option(Int32(IPPROTO_IPV6), IPV6_MULTICAST_LOOP, Int32(1))
        _ = option(Int32(IPPROTO_IPV6), IPV6_MULTICAST_HOPS, Int32(255))
    } else {
        var request = ip_mreqn()
        inet_pton(AF_INET, "224.0.0.251", &request.imr_multiaddr)
        request.imr_ifindex = index
        guard option(Int32(IPPROTO_IP), IP_ADD_MEMBERSHIP, request) else { return .failed(step: "join 224.0.0.251", errno: errno) }
        guard option(Int32(IPPROTO_IP), IP_MULTICAST_IF, request) else { return .failed(step: "IP_MULTICAST_IF", errno: errno) }
        _ = option(Int32(IPPROTO_IP), IP_MULTICAST_LOOP, Int32(1))
        _ = option(Int32(IPPROTO_IP), IP_MULTICAST_TTL, Int32(255))
    }
    // A standard query (RFC 6762) for "lanmsg-doctor-<random>.local" TXT, with a random id,
    // encoded by MDNSCore: what comes back must be this very packet.
    let token = UInt16.random(in: 0...UInt16.max)
    guard let name = DNSName("lanmsg-doctor-\(String(UInt32.random(in: 0...UInt32.max), radix: 16)).local") else {
        return .failed(step: "query name", errno: EINVAL)
    }
    let packet = DNSMessage(id: token, questions: [DNSQuestion(name: name, type: DNSType.txt)]).encoded()
    let started = DispatchTime.now().uptimeNanoseconds
    let sent = (try? group.withSockAddr { address, length in sendto(fd, packet, packet.count, 0, address, length) }) ?? -1
    guard sent == packet.count else { return .failed(step: "send to the mDNS group", errno: errno) }
    var buffer = [UInt8](repeating: 0, count: 9000)
    let deadline = started + UInt64(timeoutMilliseconds) * 1_000_000
    // Bounded: at most 1,000 packets read (other mDNS traffic) and the timeout.
    for _ in 0..<1_000 {
        let now = DispatchTime.now().uptimeNanoseconds
        guard deadline > now + 1_000_000 else { return .silent }
        let left = (deadline - now) / 1_000_000
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard case .success(let ready) = retryingInterrupts({ poll(&poller, 1, Int32(left)) }), ready > 0 else { return .silent }
        let count = recv(fd, &buffer, buffer.count, 0)
        if count == packet.count, Array(buffer[0..<count]) == packet {
            return .cameBack(micros: Int((DispatchTime.now().uptimeNanoseconds - started) / 1_000))
        }
    }
    return .silent
}

func errnoText(_ code: Int32) -> String { String(cString: strerror(code)) }
