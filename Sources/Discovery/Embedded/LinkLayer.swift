import Dispatch
import MDNSCore
import SystemCalls

/// What the embedded backend needs of the machine: an mDNS socket per address family that wakes
/// it when datagrams wait, the interface list, and a watch that wakes it when interfaces change.
///
/// The system's (``SystemLinkLayer``: sockets on port 5353, `getifaddrs`, netlink), or a test's
/// simulated link, on which several backends in one process exchange datagrams in virtual time
/// (with a ``ManualScheduler`` as the backend's scheduler): the backend's own code — its browses,
/// resolves, timers, retries and rescans — runs unchanged on either.
protocol EmbeddedLinkLayer: Sendable {
    /// Opens a socket of `family`; `readable` runs on `queue` whenever datagrams wait, until the
    /// port is closed.
    func open(_ family: AddressFamily, queue: DispatchQueue, readable: @escaping @Sendable () -> Void) throws(DiscoveryError)
        -> any EmbeddedPort

    /// Every interface with its addresses, sorted by index.
    func interfaces() -> [InterfaceInfo]

    /// A watch whose `changed` runs on `queue` when links or addresses change; nil when there is
    /// none (then interfaces are scanned at start only).
    func watchInterfaces(queue: DispatchQueue, changed: @escaping @Sendable () -> Void) -> (any EmbeddedInterfaceWatch)?
}

/// One open mDNS socket. Used on the backend's queue only.
protocol EmbeddedPort: AnyObject, Sendable {
    /// Joins the mDNS group on an interface.
    func join(interface: Int32) -> Errno?
    func leave(interface: Int32)
    func send(_ bytes: [UInt8], interface: Int32, to destination: MDNSPacket.Destination) -> Errno?
    /// The next waiting datagram; nil datagram and nil error: none waits.
    func receive() -> (datagram: Datagram?, truncated: Bool, error: Errno?)
    /// Stops the wake-ups and closes the socket (once they can no longer run).
    func close()
}

/// A watch on the interfaces. Used on the backend's queue only.
protocol EmbeddedInterfaceWatch: AnyObject, Sendable {
    /// Takes the pending notifications (their content does not matter: any change means a rescan).
    func drain()
    func close()
}

/// The machine's: ``MDNSSocket``s and a ``NetlinkMonitor``, each with a Dispatch read source.
struct SystemLinkLayer: EmbeddedLinkLayer {
    func open(_ family: AddressFamily, queue: DispatchQueue, readable: @escaping @Sendable () -> Void) throws(DiscoveryError)
        -> any EmbeddedPort
    {
        let socket = try MDNSSocket.open(family)
        let source = DispatchSource.makeReadSource(fileDescriptor: socket.fd, queue: queue)
        source.setEventHandler(handler: readable)
        // The descriptor is closed only once the source is cancelled (no use after close).
        source.setCancelHandler { socket.close() }
        source.resume()
        return SystemPort(socket: socket, source: source)
    }

    func interfaces() -> [InterfaceInfo] { InterfaceInfo.scan() }

    func watchInterfaces(queue: DispatchQueue, changed: @escaping @Sendable () -> Void) -> (any EmbeddedInterfaceWatch)? {
        guard let monitor = NetlinkMonitor() else { return nil }
        let source = DispatchSource.makeReadSource(fileDescriptor: monitor.fd, queue: queue)
        source.setEventHandler(handler: changed)
        source.setCancelHandler { monitor.close() }
        source.resume()
        return SystemInterfaceWatch(monitor: monitor, source: source)
    }
}

private final class SystemPort: EmbeddedPort, @unchecked Sendable {  // used on the backend's queue only
    let socket: MDNSSocket
    let source: any DispatchSourceRead

    init(socket: MDNSSocket, source: any DispatchSourceRead) {
        self.socket = socket
        self.source = source
    }

    func join(interface: Int32) -> Errno? { socket.join(interface: interface) }
    func leave(interface: Int32) { socket.leave(interface: interface) }
    func send(_ bytes: [UInt8], interface: Int32, to destination: MDNSPacket.Destination) -> Errno? {
        socket.send(bytes, interface: interface, to: destination)
    }
    func receive() -> (datagram: Datagram?, truncated: Bool, error: Errno?) { socket.receive() }
    func close() { source.cancel() }
}

private final class SystemInterfaceWatch: EmbeddedInterfaceWatch, @unchecked Sendable {  // used on the backend's queue only
    let monitor: NetlinkMonitor
    let source: any DispatchSourceRead

    init(monitor: NetlinkMonitor, source: any DispatchSourceRead) {
        self.monitor = monitor
        self.source = source
    }

    func drain() { monitor.drain() }
    func close() { source.cancel() }
}
