import Testing

@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

@Suite struct SocketAddressTests {
    @Test func parsing() throws {
        let v4 = try SocketAddress(ipAddress: "10.0.0.1", port: 4000)
        #expect(v4.family == .ipv4 && v4.description == "10.0.0.1:4000")
        let v6 = try SocketAddress(ipAddress: "fe80::1%3", port: 80)
        #expect(v6.family == .ipv6 && v6.scopeID == 3 && v6.isLinkLocalIPv6 && v6.description == "[fe80::1%3]:80")
        let explicit = try SocketAddress(ipAddress: "fe80::1", port: 80, scopeID: 3)
        #expect(explicit == v6)
        #expect(try SocketAddress(ipAddress: "::1", port: 1) == .ipv6Loopback(port: 1))
        #expect(try SocketAddress(ipAddress: "127.0.0.1", port: 1) == .ipv4Loopback(port: 1))
        #expect(throws: TransportError.self) { try SocketAddress(ipAddress: "example.com", port: 1) }
        #expect(throws: TransportError.self) { try SocketAddress(ipAddress: "fe80::1%nosuchif0", port: 1) }
    }

    @Test func interleavesFamiliesIPv6First() throws {
        let a4 = try SocketAddress(ipAddress: "10.0.0.1", port: 1)
        let b4 = try SocketAddress(ipAddress: "10.0.0.2", port: 1)
        let a6 = try SocketAddress(ipAddress: "fd00::1", port: 1)
        let b6 = try SocketAddress(ipAddress: "fd00::2", port: 1)
        #expect(TCPConnector.interleave([a4, b4, a6, b6]) == [a6, a4, b6, b4])
        #expect(TCPConnector.interleave([a4, b4, a6]) == [a6, a4, b4])
    }
}
