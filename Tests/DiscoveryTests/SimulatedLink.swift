import Dispatch
import Glibc
import Locks
import Logging
import Scheduling
import SystemCalls

@_spi(Programs) @testable import Discovery
@testable import MDNSCore

/// One simulated Ethernet segment for embedded backends in one process, in virtual time (issue 54,
/// 2): each host has one interface, `sim0` (index 2), with the IPv4 address 10.0.0.N and the
/// link-local IPv6 address fe80::N (or, for a world whose programs connect for real, 127.0.0.N and
/// no IPv6 address: addresses this machine's loopback answers, and nothing a TCP connection could
/// take off the machine). A multicast datagram reaches every socket of its family that
/// joined the group on that interface — the sender's own too, as `IP_MULTICAST_LOOP` makes the real
/// sockets do — a unicast one the socket of the host with that address; each `delay` later, on the
/// shared ``ManualScheduler``, on the receiving backend's queue. A host cut off (power lost)
/// neither sends nor receives; a host whose cable is pulled does not either, and its interface
/// loses its carrier — its backend's interface watch is told, as netlink tells the real one. A
/// host can be told to fail its next socket opens.
///
/// The backends are the real `EmbeddedBackend`s — engine, browses, resolves, timers, retries —
/// with only the sockets and the interface scan replaced (`EmbeddedLinkLayer`). The Avahi and
/// embedded labs (IntegrationTests) stay the proof against real sockets and daemons.
final class SimulatedLink: Sendable {
    let scheduler: ManualScheduler
    let delay: Duration
    /// The hosts' IPv4 network (/24): host N is its .N.
    let ipv4Network: [UInt8]
    /// Whether the hosts have their link-local IPv6 address.
    let hasIPv6: Bool

    private struct Host {
        var connected = true
        var carrier = true
        var failOpens = 0
        var ports: [AddressFamily: SimulatedPort] = [:]
        var watch: SimulatedWatch?
    }
    private struct State {
        var hosts: [UInt8: Host] = [:]
        var delivered = 0
    }
    private let state = Locked(State())

    init(scheduler: ManualScheduler, delay: Duration = .milliseconds(1), ipv4Network: [UInt8] = [10, 0, 0], hasIPv6: Bool = true) {
        precondition(ipv4Network.count == 3, "a /24: three bytes")
        self.scheduler = scheduler
        self.delay = delay
        self.ipv4Network = ipv4Network
        self.hasIPv6 = hasIPv6
    }

    static let interfaceIndex: Int32 = 2
    func ipv4(_ host: UInt8) -> [UInt8] { ipv4Network + [host] }
    static func ipv6(_ host: UInt8) -> [UInt8] { [0xfe, 0x80] + [UInt8](repeating: 0, count: 13) + [host] }

    /// Host `number`'s view of the link (its sockets and its one interface).
    func layer(for number: UInt8) -> any EmbeddedLinkLayer {
        state.withLock { state in
            if state.hosts[number] == nil { state.hosts[number] = Host() }
        }
        return Layer(link: self, host: number)
    }

    /// Cuts host `number` off the link, or puts it back.
    func setConnected(_ number: UInt8, _ connected: Bool) {
        state.withLock { $0.hosts[number]?.connected = connected }
    }

    /// Pulls host `number`'s cable (or plugs it back): it is cut off, its interface loses its
    /// carrier (IFF_RUNNING), and its interface watch is told a moment later.
    func setCarrier(_ number: UInt8, _ up: Bool) {
        let watch = state.withLock { state -> SimulatedWatch? in
            state.hosts[number]?.connected = up
            state.hosts[number]?.carrier = up
            return state.hosts[number]?.watch
        }
        guard let watch else { return }
        scheduler.schedule(after: delay, on: watch.queue) { watch.notify() }
    }

    /// Host `number`'s next `count` socket opens fail.
    func failOpens(_ number: UInt8, count: Int) {
        state.withLock { state in
            if state.hosts[number] == nil { state.hosts[number] = Host() }
            state.hosts[number]?.failOpens = count
        }
    }

    /// Datagrams handed to a receiving socket so far.
    var delivered: Int { state.withLock { $0.delivered } }

    fileprivate func open(
        host: UInt8, family: AddressFamily, queue: DispatchQueue, readable: @escaping @Sendable () -> Void
    ) throws(DiscoveryError) -> SimulatedPort {
        let port = SimulatedPort(link: self, host: host, family: family, queue: queue, readable: readable)
        let failed = state.withLock { state -> Bool in
            if let failing = state.hosts[host]?.failOpens, failing > 0 {
                state.hosts[host]?.failOpens = failing - 1
                return true
            }
            state.hosts[host]?.ports[family] = port
            return false
        }
        if failed { throw DiscoveryError(.network, "simulated: no socket for \(family) on host \(host)") }
        return port
    }

    fileprivate func send(_ bytes: [UInt8], from sender: SimulatedPort, to destination: MDNSPacket.Destination) {
        let source = sender.family == .v4 ? ipv4(sender.host) : Self.ipv6(sender.host)
        let receivers = state.withLock { state -> [SimulatedPort] in
            guard state.hosts[sender.host]?.connected == true else { return [] }
            return state.hosts.filter { $0.value.connected }.compactMap { number, host -> SimulatedPort? in
                guard let port = host.ports[sender.family], port.isOpen else { return nil }
                switch destination {
                case .multicast:
                    return port.hasJoined(Self.interfaceIndex) ? port : nil
                case .unicast(let address, _):
                    return address == (sender.family == .v4 ? ipv4(number) : Self.ipv6(number)) ? port : nil
                }
            }.sorted { $0.host < $1.host }
        }
        for receiver in receivers {
            let datagram = Datagram(bytes: bytes, address: source, port: mdnsPort, interfaceIndex: Self.interfaceIndex)
            scheduler.schedule(after: delay, on: receiver.queue) { [self] in
                let connected = state.withLock { state -> Bool in
                    guard state.hosts[receiver.host]?.connected == true, receiver.isOpen else { return false }
                    state.delivered += 1
                    return true
                }
                if connected { receiver.deliver(datagram) }
            }
        }
    }

    fileprivate func interfaces(of host: UInt8) -> [InterfaceInfo] {
        let carrier = state.withLock { $0.hosts[host]?.carrier ?? false }
        return [
            InterfaceInfo(
                name: "sim0", index: Self.interfaceIndex,
                flags: UInt32(IFF_UP) | (carrier ? UInt32(IFF_RUNNING) : 0) | UInt32(IFF_MULTICAST) | UInt32(IFF_BROADCAST),
                ipv4: [ipv4(host)], ipv6: hasIPv6 ? [Self.ipv6(host)] : [])
        ]
    }

    fileprivate func watch(host: UInt8, queue: DispatchQueue, changed: @escaping @Sendable () -> Void) -> SimulatedWatch {
        let watch = SimulatedWatch(queue: queue, changed: changed)
        state.withLock { $0.hosts[host]?.watch = watch }
        return watch
    }

    private struct Layer: EmbeddedLinkLayer {
        let link: SimulatedLink
        let host: UInt8

        func open(_ family: AddressFamily, queue: DispatchQueue, readable: @escaping @Sendable () -> Void) throws(DiscoveryError)
            -> any EmbeddedPort
        {
            try link.open(host: host, family: family, queue: queue, readable: readable)
        }

        func interfaces() -> [InterfaceInfo] { link.interfaces(of: host) }

        func watchInterfaces(queue: DispatchQueue, changed: @escaping @Sendable () -> Void) -> (any EmbeddedInterfaceWatch)? {
            link.watch(host: host, queue: queue, changed: changed)
        }
    }
}

/// One host's socket of one family on a ``SimulatedLink``.
final class SimulatedPort: EmbeddedPort, Sendable {
    let link: SimulatedLink
    let host: UInt8
    let family: AddressFamily
    let queue: DispatchQueue
    private let readable: @Sendable () -> Void
    private struct State {
        var inbox: [Datagram] = []
        var joined: Set<Int32> = []
        var open = true
    }
    private let state = Locked(State())

    fileprivate init(link: SimulatedLink, host: UInt8, family: AddressFamily, queue: DispatchQueue, readable: @escaping @Sendable () -> Void) {
        self.link = link
        self.host = host
        self.family = family
        self.queue = queue
        self.readable = readable
    }

    var isOpen: Bool { state.withLock { $0.open } }
    func hasJoined(_ interface: Int32) -> Bool { state.withLock { $0.joined.contains(interface) } }

    /// On the receiving backend's queue: the datagram waits, the backend is woken.
    fileprivate func deliver(_ datagram: Datagram) {
        state.withLock { $0.inbox.append(datagram) }
        readable()
    }

    func join(interface: Int32) -> Errno? {
        state.withLock { _ = $0.joined.insert(interface) }
        return nil
    }

    func leave(interface: Int32) {
        state.withLock { _ = $0.joined.remove(interface) }
    }

    func send(_ bytes: [UInt8], interface: Int32, to destination: MDNSPacket.Destination) -> Errno? {
        guard interface == SimulatedLink.interfaceIndex, isOpen else { return Errno(ENETUNREACH) }
        link.send(bytes, from: self, to: destination)
        return nil
    }

    func receive() -> (datagram: Datagram?, truncated: Bool, error: Errno?) {
        (state.withLock { $0.inbox.isEmpty ? nil : $0.inbox.removeFirst() }, false, nil)
    }

    func close() {
        state.withLock { $0.open = false }
    }
}

/// One host's interface watch (netlink's part): told of a carrier change on the backend's queue.
final class SimulatedWatch: EmbeddedInterfaceWatch, Sendable {
    let queue: DispatchQueue
    private let changed: @Sendable () -> Void
    private let open = Locked(true)

    fileprivate init(queue: DispatchQueue, changed: @escaping @Sendable () -> Void) {
        self.queue = queue
        self.changed = changed
    }

    fileprivate func notify() {
        if open.withLock({ $0 }) { changed() }
    }

    func drain() {}
    func close() { open.withLock { $0 = false } }
}

/// Events of a stream, read up to now: `take()` puts a marker behind what was yielded so far and
/// reads up to it — everything the backend yielded before (on its queue, which the clock's turns
/// wait for) and nothing after. No wait on a condition, no poll.
struct StreamReader<Element: Sendable & Equatable> {
    let continuation: AsyncStream<Element>.Continuation
    var iterator: AsyncStream<Element>.Iterator
    let marker: Element

    init(marker: Element) {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self)
        self.continuation = continuation
        self.iterator = stream.makeAsyncIterator()
        self.marker = marker
    }

    mutating func take() async -> [Element] {
        continuation.yield(marker)
        var taken: [Element] = []
        while let next = await iterator.next(), next != marker { taken.append(next) }
        return taken
    }
}
