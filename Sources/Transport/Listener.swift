import ProtocolCore
import Dispatch
import Locks
import Logging
import Scheduling

import Glibc

/// A freshly accepted TCP socket, owned until handed to `MessageChannel.accept(_:configuration:logger:)`.
///
/// If nobody takes it, the socket is closed when this object is released.
public final class AcceptedSocket: Sendable, CustomStringConvertible {
    private let fd: Locked<FileDescriptor?>
    /// The peer's address.
    public let remoteAddress: SocketAddress?
    /// The local address the peer connected to.
    public let localAddress: SocketAddress?

    init(fd: FileDescriptor, remoteAddress: SocketAddress?) {
        self.fd = Locked(fd)
        self.remoteAddress = remoteAddress
        self.localAddress = SocketOps.localAddress(fd)
    }

    /// Takes ownership of the fd (once); nil when already taken or closed.
    package func take() -> FileDescriptor? {
        fd.withLock { fd in
            defer { fd = nil }
            return fd
        }
    }

    /// Closes the socket if it has not been handed on.
    public func close() { take()?.close() }

    /// `"accepted <remote>"`.
    public var description: String { "accepted \(remoteAddress.map { "\($0)" } ?? "?")" }

    deinit { close() }
}

/// A TCP listener on IPv4 and IPv6 with the same port.
///
/// With port 0 it binds IPv4 to a kernel-assigned port, then IPv6 (`IPV6_V6ONLY`) to that same port,
/// retrying with a fresh pair when the IPv6 port is taken. Without IPv6 support it listens on IPv4 only.
/// Accepting runs on a Dispatch read source until EAGAIN; when the process runs out of file
/// descriptors (EMFILE/ENFILE) accepting pauses with an exponential back-off instead of spinning.
///
/// `@unchecked Sendable`: every mutable field is confined to the private serial queue.
public final class Listener: @unchecked Sendable {
    /// Listener settings.
    public struct Configuration: Sendable {
        /// The port to listen on; 0 (default) lets the kernel choose one port for both families.
        public var port: UInt16 = 0
        /// Listen on the loopback addresses (127.0.0.1, ::1) only instead of all interfaces.
        public var loopbackOnly: Bool = false
        /// Listen on this one address only (one socket, of its family, on its port; port 0 lets the
        /// kernel choose), instead of ``port``, ``loopbackOnly`` and ``families``: for example a
        /// metrics endpoint on one interface's address.
        public var address: SocketAddress?
        /// Which families to try. IPv6 is skipped silently-with-a-log when unavailable.
        public var families: Set<SocketAddress.Family> = [.ipv4, .ipv6]
        /// The `listen` backlog: connections the kernel completes before they are accepted. Past
        /// it, the kernel drops new connection attempts and their clients retry only after a
        /// second; under a flood of connection attempts 128 overflowed and a legitimate connect
        /// took 2 s (the kernel caps it at `net.core.somaxconn`, 4,096 by default).
        public var backlog: Int32 = 1024
        /// How many fresh port pairs to try when the IPv6 side of a kernel-assigned port is taken.
        public var maxPortPairAttempts: Int = 16
        /// First pause after EMFILE/ENFILE; doubles up to ``maxAcceptBackoff``.
        public var initialAcceptBackoff: Duration = .milliseconds(10)
        /// Longest pause after EMFILE/ENFILE.
        public var maxAcceptBackoff: Duration = .seconds(1)

        /// Creates the default configuration (kernel-assigned port, all interfaces, both families).
        public init() {}
    }

    private struct Socket {
        let fd: FileDescriptor
        let family: SocketAddress.Family
        let port: UInt16
        var source: (any DispatchSourceRead)?
    }

    private let queue: DispatchQueue
    private let logger: Logger
    private let configuration: Configuration
    private let onAccept: @Sendable (AcceptedSocket) -> Void
    private var sockets: [Socket] = []
    private var stopped = false
    private var acceptSuspended = false
    private var backoff: Duration
    /// The accept call (tests pass one that fails with EMFILE).
    private let acceptCall: AcceptCall
    /// The clock of the back-off and the blocks' expiry (tests: a `ManualScheduler`).
    private let scheduler: any Scheduler
    /// Resumes accepting after an EMFILE/ENFILE pause.
    private var backoffTimer: ScheduledWork?
    /// Number of times accepting was paused for lack of file descriptors (for tests and metrics).
    private(set) var acceptPauses = 0
    /// Sources whose connection attempts the kernel drops (``block(_:for:)``), until a time of the
    /// scheduler's clock in nanoseconds.
    private var blocked: [HandshakeAdmission.Source: UInt64] = [:]
    private var unblockTimer: ScheduledWork?

    /// The port the listener is bound to (the same for both families).
    public let port: UInt16
    /// The families that are listening.
    public let families: Set<SocketAddress.Family>
    /// The bound addresses, one per family (for tests and logging).
    public let boundAddresses: [SocketAddress]

    /// Binds, listens and starts accepting.
    ///
    /// - Parameters:
    ///   - configuration: Port, interfaces, families.
    ///   - logger: Where to log (bind results, accept failures, back-off).
    ///   - onAccept: Called on the listener's queue for every accepted socket. Hand the socket on quickly,
    ///     for example to `MessageChannel.accept` in a task.
    /// - Throws: `TransportError` with `TransportError.Code.listenerFailed` or
    ///   `TransportError.Code.syscallFailed`.
    public convenience init(
        configuration: Configuration = .init(), logger: Logger,
        onAccept: @escaping @Sendable (AcceptedSocket) -> Void
    ) throws(TransportError) {
        try self.init(configuration: configuration, logger: logger, acceptCall: Listener.systemAccept, onAccept: onAccept)
    }

    /// The accept system call's shape (`accept4` with nonblocking, close-on-exec flags).
    package typealias AcceptCall =
        @Sendable (Int32, UnsafeMutablePointer<sockaddr>, UnsafeMutablePointer<socklen_t>) -> Int32

    /// ``init(configuration:logger:onAccept:)`` with another accept call (tests simulate EMFILE) and
    /// the clock of its timers (the server's; tests: a `ManualScheduler`).
    package init(
        configuration: Configuration = .init(), logger: Logger, acceptCall: @escaping AcceptCall,
        scheduler: any Scheduler = DispatchScheduler(), onAccept: @escaping @Sendable (AcceptedSocket) -> Void
    ) throws(TransportError) {
        self.acceptCall = acceptCall
        self.scheduler = scheduler
        self.configuration = configuration
        self.logger = logger
        self.onAccept = onAccept
        self.backoff = configuration.initialAcceptBackoff
        self.queue = DispatchQueue(label: "transport.listener")
        let bound = try Listener.bindSockets(configuration: configuration, logger: logger)
        self.sockets = bound
        self.port = bound[0].port
        self.families = Set(bound.map(\.family))
        self.boundAddresses = bound.compactMap { SocketOps.localAddress($0.fd) }
        logger.info("listening on port \(port) (\(boundAddresses.map { "\($0)" }.joined(separator: ", ")))")
        queue.setSpecific(key: Listener.onQueueKey, value: ObjectIdentifier(self))
        queue.sync { self.startSources() }
    }

    deinit {
        // A listener released without stop(): cancel its sources (their cancel handlers close the fds).
        for socket in sockets {
            guard let source = socket.source else {
                socket.fd.close()
                continue
            }
            if !stopped {
                source.cancel()
                if acceptSuspended { source.resume() }
            }
        }
    }

    // MARK: Binding

    private static func bindSockets(configuration: Configuration, logger: Logger) throws(TransportError) -> [Socket] {
        if let address = configuration.address { return [try listeningSocket(on: address, backlog: configuration.backlog)] }
        let wantV4 = configuration.families.contains(.ipv4)
        let wantV6 = configuration.families.contains(.ipv6)
        guard wantV4 || wantV6 else {
            throw TransportError(.listenerFailed, "no address family requested; include .ipv4 and/or .ipv6")
        }
        if !wantV4 {
            return [try bindOne(.ipv6, port: configuration.port, configuration: configuration)]
        }
        var lastError: TransportError?
        for attempt in 1...max(1, configuration.maxPortPairAttempts) {
            let v4 = try bindOne(.ipv4, port: configuration.port, configuration: configuration)
            guard wantV6 else { return [v4] }
            do {
                let v6 = try bindOne(.ipv6, port: v4.port, configuration: configuration)
                return [v4, v6]
            } catch {
                switch error.errno {
                case EADDRINUSE where configuration.port == 0:
                    logger.debug("IPv6 port \(v4.port) is taken (attempt \(attempt)); trying a fresh port pair")
                    v4.fd.close()
                    lastError = error
                    continue
                case EAFNOSUPPORT, EADDRNOTAVAIL, EPROTONOSUPPORT:
                    logger.notice("IPv6 is not available (\(error.message)); listening on IPv4 only, port \(v4.port)")
                    return [v4]
                default:
                    v4.fd.close()
                    throw error
                }
            }
        }
        throw TransportError(
            .listenerFailed,
            "could not find a port free on both IPv4 and IPv6 after \(configuration.maxPortPairAttempts) tries "
                + "(\(lastError?.message ?? "")); retry or pass a fixed port")
    }

    private static func bindOne(
        _ family: SocketAddress.Family, port: UInt16, configuration: Configuration
    ) throws(TransportError) -> Socket {
        let address: SocketAddress
        switch (family, configuration.loopbackOnly) {
        case (.ipv4, true): address = .ipv4Loopback(port: port)
        case (.ipv4, false): address = SocketAddress(storage: .v4(address: 0, port: port))
        case (.ipv6, true): address = .ipv6Loopback(port: port)
        case (.ipv6, false):
            address = SocketAddress(storage: .v6(address: [UInt8](repeating: 0, count: 16), port: port, scopeID: 0))
        }
        return try listeningSocket(on: address, backlog: configuration.backlog)
    }

    /// A listening socket bound to `address`.
    private static func listeningSocket(on address: SocketAddress, backlog: Int32) throws(TransportError) -> Socket {
        let family = address.family
        let fd = try SocketOps.makeSocket(domain: address.domain)
        do throws(TransportError) {
            try SocketOps.setOption(fd, SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR")
            if family == .ipv6 {
                try SocketOps.setOption(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 1, "IPV6_V6ONLY")
            }
            _ = try address.withSockAddr { (sa, len) throws(TransportError) in
                try syscallValue("bind(\(address))") { bind(fd.rawValue, sa, len) }
            }
            try syscallValue("listen") { listen(fd.rawValue, backlog) }
            guard let local = SocketOps.localAddress(fd) else {
                throw TransportError.syscall("getsockname", errno: errno)
            }
            return Socket(fd: fd, family: family, port: local.port)
        } catch {
            fd.close()
            throw error
        }
    }

    // MARK: Accepting

    private typealias Accept4 =
        @convention(c) (
            Int32, UnsafeMutablePointer<sockaddr>?, UnsafeMutablePointer<socklen_t>?, Int32
        ) -> Int32

    /// `accept4` is not exported by the Swift Glibc module (it needs _GNU_SOURCE); look it up once.
    private static let accept4Function: Accept4? = {
        #if os(Linux)
            guard let symbol = dlsym(nil, "accept4") else { return nil }
            return unsafeBitCast(symbol, to: Accept4.self)
        #else
            return nil
        #endif
    }()

    /// accept4(SOCK_NONBLOCK | SOCK_CLOEXEC), or accept + fcntl where accept4 is missing.
    package static func systemAccept(
        _ fd: Int32, _ address: UnsafeMutablePointer<sockaddr>, _ length: UnsafeMutablePointer<socklen_t>
    ) -> Int32 {
        #if os(Linux)
            if let accept4 = accept4Function {
                return accept4(fd, address, length, Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue))
            }
        #endif
        let client = accept(fd, address, length)
        if client >= 0 {
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
        }
        return client
    }

    private func startSources() {
        for index in sockets.indices {
            let fd = sockets[index].fd
            let source = DispatchSource.makeReadSource(fileDescriptor: fd.rawValue, queue: queue)
            source.setEventHandler { [weak self] in self?.acceptAll(fd: fd) }
            source.setCancelHandler { fd.close() }
            sockets[index].source = source
            source.resume()
        }
    }

    private func acceptAll(fd: FileDescriptor) {
        while !stopped && !acceptSuspended {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let result: IOResult<Int32>
            do {
                result = try withUnsafeMutablePointer(to: &storage) {
                    (pointer) throws(TransportError) -> IOResult<Int32> in
                    try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        (sa) throws(TransportError) -> IOResult<Int32> in
                        try syscall("accept4", nonblocking: true) { acceptCall(fd.rawValue, sa, &length) }
                    }
                }
            } catch {
                switch error.errno {
                case EMFILE, ENFILE, ENOBUFS, ENOMEM:
                    pauseAccepting(error)
                    return
                case ECONNABORTED, EPROTO, EPERM:
                    logger.debug("accept: \(error.message); continuing")
                    continue
                default:
                    logger.error("accept failed: \(error.message)")
                    return
                }
            }
            switch result {
            case .wouldBlock:
                return
            case .processed(let clientFD):
                backoff = configuration.initialAcceptBackoff
                let socket = AcceptedSocket(fd: FileDescriptor(clientFD), remoteAddress: SocketAddress(storage: storage))
                logger.debug("accepted \(socket.remoteAddress.map { "\($0)" } ?? "?")")
                onAccept(socket)
            }
        }
    }

    private func pauseAccepting(_ error: TransportError) {
        acceptPauses += 1
        let delay = backoff
        backoff = min(backoff * 2, configuration.maxAcceptBackoff)
        logger.warning(
            "accept: \(error.message); pausing accepts for \(delay) (raise the fd limit or close connections)")
        acceptSuspended = true
        for socket in sockets { socket.source?.suspend() }
        backoffTimer?.cancel()
        backoffTimer = scheduler.schedule(after: delay, on: queue) { [weak self] in self?.resumeAccepting() }
    }

    private func resumeAccepting() {
        guard acceptSuspended else { return }
        acceptSuspended = false
        guard !stopped else { return }
        for socket in sockets { socket.source?.resume() }
    }

    private static let onQueueKey = DispatchSpecificKey<ObjectIdentifier>()

    /// Runs `body` on the queue, also when already on it (for example `stop()` from `onAccept`).
    private func onQueue<T>(_ body: () -> T) -> T {
        DispatchQueue.getSpecific(key: Listener.onQueueKey) == ObjectIdentifier(self)
            ? body() : queue.sync(execute: body)
    }

    /// Stops listening and closes the listening sockets. Idempotent; established connections are unaffected.
    /// Callable from any context, including `onAccept`.
    public func stop() {
        onQueue {
            guard !stopped else { return }
            stopped = true
            for socket in sockets {
                // Refuse new connections now; the fd is closed when its source's cancel handler runs.
                _ = shutdown(socket.fd.rawValue, Int32(SHUT_RDWR))
                socket.source?.cancel()
                if acceptSuspended { socket.source?.resume() }
            }
            acceptSuspended = false
            backoffTimer?.cancel()
            backoffTimer = nil
            unblockTimer?.cancel()
            unblockTimer = nil
            logger.info("stopped listening on port \(port)")
        }
    }

    /// Accept pauses so far (EMFILE/ENFILE back-offs). Callable from any context.
    package var acceptPauseCount: Int { onQueue { acceptPauses } }

    // MARK: Blocking sources

    /// Has the kernel drop connection attempts from `source` (an IPv4 address or IPv6 /64) for
    /// `duration`, before they become connections (``SourceFilter``): for a host flooding the
    /// server with attempts it refuses anyway. At most ``SourceFilter/capacity`` sources at once
    /// (the ones blocked longest are let go first). Callable from any context.
    package func block(_ source: HandshakeAdmission.Source, for duration: Duration) {
        guard source != .unknown else { return }
        let until = scheduler.now &+ duration.nanoseconds
        queue.async { [self] in
            guard !stopped else { return }
            blocked[source] = until
            while blocked.count > SourceFilter.capacity, let first = blocked.min(by: { $0.value < $1.value }) {
                blocked[first.key] = nil
            }
            applyBlocks()
        }
    }

    /// The sources blocked now. Callable from any context.
    package var blockedSources: [HandshakeAdmission.Source] { onQueue { Array(blocked.keys) } }

    /// Installs the filters for what is blocked now and arms the timer for the next expiry. On the queue.
    private func applyBlocks() {
        let now = scheduler.now
        blocked = blocked.filter { $0.value > now }
        let sources = Array(blocked.keys)
        for socket in sockets where !SourceFilter.apply(sources, to: socket.fd, family: socket.family) {
            logger.warning("cannot install the socket filter that blocks flooding sources on \(socket.fd): errno \(errno)")
        }
        guard let next = blocked.values.min() else {
            unblockTimer?.cancel()
            unblockTimer = nil
            return
        }
        unblockTimer?.cancel()
        unblockTimer = scheduler.schedule(at: next, on: queue) { [weak self] in self?.applyBlocks() }
    }
}
