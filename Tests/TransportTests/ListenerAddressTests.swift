import Dispatch
import Logging
import Testing

@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// `Listener.Configuration.address`: one socket on exactly that address (what preview-server's
/// metrics endpoint listens on), instead of both families on every interface.
@Suite struct ListenerAddressTests {
    /// A connection to `address` from this process (blocking; loopback only): whether it connected.
    func connects(to address: SocketAddress) -> Bool {
        let fd = socket(address.domain, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return (try? address.withSockAddr { sa, length in connect(fd, sa, length) }) == 0
    }

    @Test(arguments: ["127.0.0.1", "::1"])
    func listensOnThatAddressOnly(ip: String) async throws {
        var configuration = Listener.Configuration()
        configuration.address = try SocketAddress(ipAddress: ip, port: 0)
        let accepted = AsyncStream.makeStream(of: SocketAddress?.self)
        let listener = try Listener(configuration: configuration, logger: Logger(label: "test")) { socket in
            accepted.continuation.yield(socket.localAddress)
            socket.close()
        }
        defer { listener.stop() }
        let family: SocketAddress.Family = ip.contains(":") ? .ipv6 : .ipv4
        #expect(listener.families == [family])
        #expect(listener.boundAddresses == [try SocketAddress(ipAddress: ip, port: listener.port)])
        #expect(listener.port != 0)  // the kernel's choice
        #expect(connects(to: try SocketAddress(ipAddress: ip, port: listener.port)))
        var iterator = accepted.stream.makeAsyncIterator()
        let local = await iterator.next()
        #expect(local == (try SocketAddress(ipAddress: ip, port: listener.port)))
        // Not the other family's loopback on that port (the default configuration would listen there).
        let other = ip.contains(":") ? "127.0.0.1" : "::1"
        #expect(!connects(to: try SocketAddress(ipAddress: other, port: listener.port)))
    }
}
