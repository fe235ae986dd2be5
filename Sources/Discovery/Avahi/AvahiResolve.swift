import CAvahiClient
import Dispatch
import Scheduling

/// One resolve (one-shot or watching): service resolvers on every interface / IP version the service
/// was seen on, plus A/AAAA record browsers on its host to collect every address.
/// Confined to the core's queue.
final class ResolveSession: @unchecked Sendable {  // confined to core.queue
    enum Mode {
        case once(timeout: Duration, completion: @Sendable (Result<ResolvedService, DiscoveryError>) -> Void)
        case watch(AsyncStream<ResolvedService>.Continuation)
    }

    /// How long a one-shot resolve waits, after the first answer, for the other address families
    /// (it ends sooner once every resolver has answered and every wanted family has an address).
    static let grace: Duration = .milliseconds(250)

    unowned let core: AvahiBackend
    let identity: ServiceIdentity
    let initialSightings: [DiscoveredService.Sighting]
    let interface: Int32?
    let ipVersion: IPVersion
    let mode: Mode

    private struct Found {
        var hostName: String
        var port: UInt16
        var txt: TXTRecord
        var isLocal: Bool
        var order: Int
    }
    private struct RecordKey: Hashable {
        let interface: Int32
        let host: String
        let type: UInt16
    }

    private var resolvers: [Handle] = []
    private var recordBrowsers: [RecordKey: Handle] = [:]
    private var found: [Int: Found] = [:]  // by resolver id
    private var foundCounter = 0
    private var addresses: [ServiceAddress] = []
    private var failures = 0
    private var lastFailure: DiscoveryError?
    private var graceTimer: ScheduledWork?
    private var timeoutTimer: ScheduledWork?
    private var lastYielded: ResolvedService?
    private var done = false

    /// Userdata for one Avahi object of this session.
    final class Handle: @unchecked Sendable {  // confined to core.queue
        unowned let session: ResolveSession
        let id: Int
        let interface: Int32
        var pointer: OpaquePointer?
        init(session: ResolveSession, id: Int, interface: Int32) {
            self.session = session
            self.id = id
            self.interface = interface
        }
    }
    private var nextHandle = 0

    init(
        core: AvahiBackend, identity: ServiceIdentity, sightings: [DiscoveredService.Sighting], interface: Int32?,
        ipVersion: IPVersion, mode: Mode
    ) {
        self.core = core
        self.identity = identity
        self.initialSightings = sightings
        self.interface = interface
        self.ipVersion = ipVersion
        self.mode = mode
    }

    func armTimeout() {
        guard case .once(let timeout, _) = mode else { return }
        timeoutTimer = core.scheduler.schedule(after: timeout, on: core.queue) { [weak self] in
            guard let self else { return }
            if self.addresses.isEmpty {
                let hint = self.found.isEmpty
                    ? "no answer from \(self.identity) within \(timeout); is it still published, and is its host reachable?"
                    : "\(self.identity) answered but no address of its host arrived within \(timeout)"
                self.finish(.failure(DiscoveryError(.timedOut, hint)))
            } else {
                self.finish(.success(self.snapshot()))
            }
        }
    }

    func start() {
        guard !done, resolvers.isEmpty, let client = core.client else { return }
        var targets = Set(initialSightings).union(core.knownSightings(identity))
        if let interface { targets = targets.filter { $0.interfaceIndex == interface } }
        var pairs: [(Int32, Int32)] = targets.map { ($0.interfaceIndex, $0.ipVersion.avahiProtocol) }
        if pairs.isEmpty {
            let iface = interface ?? ifUnspec
            pairs = [(iface, protoInet6), (iface, protoInet)]
        }
        for (iface, proto) in pairs.sorted(by: { ($0.0, $0.1) < ($1.0, $1.1) }) {
            let aproto: Int32 =
                switch ipVersion {
                case .any: proto
                case .ipv4: protoInet
                case .ipv6: protoInet6
                }
            let handle = makeHandle(interface: iface)
            handle.pointer = avahi_service_resolver_new(
                client, iface, proto, identity.name, identity.type, identity.domain, aproto,
                AvahiLookupFlags(rawValue: 0), resolveCallback, Unmanaged.passUnretained(handle).toOpaque())
            if handle.pointer == nil {
                let error = avahi_client_errno(client)
                lastFailure = DiscoveryError(
                    .avahi, "cannot resolve \(identity): \(avahiMessage(error))", avahiErrorCode: error)
                failures += 1
            } else {
                resolvers.append(handle)
            }
        }
        if resolvers.isEmpty, let lastFailure { finish(.failure(lastFailure)) }
    }

    private func makeHandle(interface: Int32) -> Handle {
        nextHandle += 1
        return Handle(session: self, id: nextHandle, interface: interface)
    }

    func resolved(
        handle: Handle, interface: Int32, event: AvahiResolverEvent, hostName: String?,
        address: UnsafePointer<AvahiAddress>?, port: UInt16, txt: UnsafeMutablePointer<AvahiStringList>?,
        flags: AvahiLookupResultFlags
    ) {
        guard !done else { return }
        if event == AVAHI_RESOLVER_FAILURE {
            let error = core.client.map { avahi_client_errno($0) } ?? Int32(AVAHI_ERR_FAILURE)
            lastFailure = DiscoveryError(.avahi, "resolving \(identity) failed: \(avahiMessage(error))", avahiErrorCode: error)
            failures += 1
            core.logger.debug("resolver failure", metadata: ["service": "\(identity)", "error": "\(avahiMessage(error))"])
            if case .once = mode, failures >= resolvers.count, found.isEmpty, let lastFailure {
                finish(.failure(lastFailure))
            }
            return
        }
        guard event == AVAHI_RESOLVER_FOUND, let hostName else { return }
        foundCounter += 1
        found[handle.id] = Found(
            hostName: hostName, port: port, txt: TXTRecord(wireEntries: wireEntries(txt)),
            isLocal: flags.rawValue & AVAHI_LOOKUP_RESULT_LOCAL.rawValue != 0, order: foundCounter)
        if let address { add(address: address.pointee, interface: interface, port: port) }
        browseAddresses(of: hostName, interface: interface)
        changed()
    }

    private func browseAddresses(of host: String, interface: Int32) {
        guard let client = core.client else { return }
        var types: [UInt16] = []
        if ipVersion != .ipv6 { types.append(1) }  // A
        if ipVersion != .ipv4 { types.append(28) }  // AAAA
        for type in types {
            let key = RecordKey(interface: interface, host: host, type: type)
            guard recordBrowsers[key] == nil else { continue }
            let handle = makeHandle(interface: interface)
            handle.pointer = avahi_record_browser_new(
                client, interface, protoUnspec, host, 1, type, AvahiLookupFlags(rawValue: 0), recordCallback,
                Unmanaged.passUnretained(handle).toOpaque())
            recordBrowsers[key] = handle
        }
    }

    func record(handle: Handle, event: AvahiBrowserEvent, type: UInt16, rdata: UnsafeRawPointer?, size: Int) {
        guard !done, let rdata, event == AVAHI_BROWSER_NEW || event == AVAHI_BROWSER_REMOVE else { return }
        // A malformed record from the network is ignored.
        guard size == 4 || size == 16,
            let ip = IPAddress(recordType: type, rdata: Array(UnsafeRawBufferPointer(start: rdata, count: size)))
        else { return }
        guard let port = currentFound()?.port, core.permits(interface: handle.interface) else { return }
        let address = ServiceAddress(ip: ip, interfaceIndex: handle.interface, port: port)
        if event == AVAHI_BROWSER_NEW {
            if !addresses.contains(address) { addresses.append(address) }
        } else {
            addresses.removeAll { $0 == address }
        }
        changed()
    }

    private func add(address: AvahiAddress, interface: Int32, port: UInt16) {
        var address = address
        let ip: IPAddress
        if address.proto == protoInet {
            let raw = withUnsafeBytes(of: &address.data.ipv4.address) { Array($0) }
            ip = .v4(raw[0], raw[1], raw[2], raw[3])
        } else if address.proto == protoInet6 {
            ip = .v6(withUnsafeBytes(of: &address.data.ipv6.address) { Array($0) })
        } else {
            return
        }
        guard ipVersion == .any || ip.version == ipVersion, core.permits(interface: interface) else { return }
        let entry = ServiceAddress(ip: ip, interfaceIndex: interface, port: port)
        if !addresses.contains(entry) { addresses.append(entry) }
    }

    private func currentFound() -> Found? { found.values.max { $0.order < $1.order } }

    private func changed() {
        switch mode {
        case .once:
            guard !addresses.isEmpty else { return }
            if hasEverything {
                finish(.success(snapshot()))
                return
            }
            guard graceTimer == nil else { return }
            graceTimer = core.scheduler.schedule(after: Self.grace, on: core.queue) { [weak self] in
                guard let self else { return }
                self.finish(.success(self.snapshot()))
            }
        case .watch(let continuation):
            guard !addresses.isEmpty else { return }
            let current = snapshot()
            if current != lastYielded {
                lastYielded = current
                continuation.yield(current)
            }
        }
    }

    /// Whether waiting longer cannot add anything the grace period waits for: every resolver has
    /// answered (found or failed) and each wanted address family has an address.
    private var hasEverything: Bool {
        guard found.count + failures >= resolvers.count else { return false }
        let versions = Set(addresses.map(\.ip.version))
        switch ipVersion {
        case .any: return versions.contains(.ipv4) && versions.contains(.ipv6)
        case .ipv4, .ipv6: return versions.contains(ipVersion)
        }
    }

    private func snapshot() -> ResolvedService {
        let latest = currentFound()!
        let first = found.values.min { $0.order < $1.order }!
        let port = latest.port
        let sorted = addresses.map { ServiceAddress(ip: $0.ip, interfaceIndex: $0.interfaceIndex, port: port) }
            .enumerated().sorted { lhs, rhs in
                let l = (lhs.element.ip.version == .ipv6 ? 0 : 1, lhs.element.ip.isLinkLocal ? 1 : 0, lhs.offset)
                let r = (rhs.element.ip.version == .ipv6 ? 0 : 1, rhs.element.ip.isLinkLocal ? 1 : 0, rhs.offset)
                return l < r
            }.map(\.element)
        var unique: [ServiceAddress] = []
        for address in sorted where !unique.contains(address) { unique.append(address) }
        return ResolvedService(
            identity: identity, hostName: first.hostName, port: port, txt: latest.txt, addresses: unique,
            isLocal: found.values.contains { $0.isLocal })
    }

    private func finish(_ result: Result<ResolvedService, DiscoveryError>) {
        guard !done, case .once(_, let completion) = mode else { return }
        done = true
        completion(result)
        // Not from inside an Avahi callback: free the resolvers afterwards.
        core.queue.async { [self] in core.removeResolve(self) }
    }

    /// The client died: its resolvers and record browsers died with it.
    func clientLost() {
        resolvers.removeAll()
        recordBrowsers.removeAll()
        found.removeAll()
        addresses.removeAll()
        failures = 0
        graceTimer?.cancel()
        graceTimer = nil
    }

    func stop(error: DiscoveryError?) {
        for handle in resolvers { if let pointer = handle.pointer { avahi_service_resolver_free(pointer) } }
        for handle in recordBrowsers.values { if let pointer = handle.pointer { avahi_record_browser_free(pointer) } }
        resolvers.removeAll()
        recordBrowsers.removeAll()
        graceTimer?.cancel()
        graceTimer = nil
        timeoutTimer?.cancel()
        timeoutTimer = nil
        switch mode {
        case .once(_, let completion):
            if !done {
                done = true
                completion(.failure(error ?? DiscoveryError(.shutDown, "resolve of \(identity) was cancelled")))
            }
        case .watch(let continuation):
            done = true
            continuation.finish()
        }
    }
}

private func resolveCallback(
    _ resolver: OpaquePointer?, _ interface: AvahiIfIndex, _ proto: AvahiProtocol, _ event: AvahiResolverEvent,
    _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?,
    _ hostName: UnsafePointer<CChar>?, _ address: UnsafePointer<AvahiAddress>?, _ port: UInt16,
    _ txt: UnsafeMutablePointer<AvahiStringList>?, _ flags: AvahiLookupResultFlags, _ userdata: UnsafeMutableRawPointer?
) {
    guard let userdata else { return }
    let handle = Unmanaged<ResolveSession.Handle>.fromOpaque(userdata).takeUnretainedValue()
    handle.session.resolved(
        handle: handle, interface: interface, event: event, hostName: hostName.map { String(cString: $0) },
        address: address, port: port, txt: txt, flags: flags)
}

private func recordCallback(
    _ browser: OpaquePointer?, _ interface: AvahiIfIndex, _ proto: AvahiProtocol, _ event: AvahiBrowserEvent,
    _ name: UnsafePointer<CChar>?, _ clazz: UInt16, _ type: UInt16, _ rdata: UnsafeRawPointer?, _ size: Int,
    _ flags: AvahiLookupResultFlags, _ userdata: UnsafeMutableRawPointer?
) {
    guard let userdata else { return }
    let handle = Unmanaged<ResolveSession.Handle>.fromOpaque(userdata).takeUnretainedValue()
    handle.session.record(handle: handle, event: event, type: type, rdata: rdata, size: size)
}
