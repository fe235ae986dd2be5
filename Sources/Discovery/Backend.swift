import Locks
import Dispatch
import Logging
import Glibc

/// Which DNS-SD implementation a ``ServiceDiscovery`` uses.
public enum DiscoveryBackendKind: String, Sendable, Hashable, CustomStringConvertible {
    /// The Avahi daemon, over D-Bus (libavahi-client).
    case avahi
    /// Our own mDNS responder and querier on UDP port 5353 (no daemon needed).
    case embedded

    public var description: String { rawValue }
}

/// What ``ServiceDiscovery`` is asked to use.
public enum DiscoveryBackendChoice: String, Sendable, Hashable, CustomStringConvertible {
    /// Avahi when its daemon answers within ``DiscoveryConfiguration/avahiTimeout``, the embedded
    /// stack otherwise. Decided once, when the ``ServiceDiscovery`` is created. The environment
    /// variable `LANMSG_DISCOVERY_BACKEND` (`avahi`, `embedded`) overrides this choice.
    case automatic
    /// Always Avahi (waits and retries while the daemon is away).
    case avahi
    /// Always the embedded mDNS stack.
    case embedded

    public var description: String { rawValue }
}

/// The requests a backend serves (validated by ``ServiceDiscovery`` first).
struct PublishRequest: Sendable {
    var name: String?
    var type: String
    var domain: String?
    var port: UInt16
    var txt: TXTRecord
    var interface: Int32?
    var ipVersion: IPVersion
}

struct BrowseRequest: Sendable {
    var type: String
    var domain: String?
    var interface: Int32?
    var ipVersion: IPVersion
}

struct ResolveRequest: Sendable {
    var identity: ServiceIdentity
    var sightings: [DiscoveredService.Sighting]
    var interface: Int32?
    var ipVersion: IPVersion
}

/// A DNS-SD implementation behind ``ServiceDiscovery``. Every method may be called from any thread.
protocol DiscoveryBackend: AnyObject, Sendable {
    var kind: DiscoveryBackendKind { get }
    var currentState: DaemonState { get }
    var currentHostName: String { get }
    /// The current state first, then every change, until shutdown.
    func stateUpdates() -> AsyncStream<DaemonState>
    func publish(_ request: PublishRequest) async -> Result<PublishedService, DiscoveryError>
    /// Starts a browse feeding `continuation`; returns what stops it.
    func startBrowse(_ request: BrowseRequest, continuation: AsyncStream<BrowseEvent>.Continuation)
        -> @Sendable () -> Void
    func resolve(_ request: ResolveRequest, timeout: Duration) async -> Result<ResolvedService, DiscoveryError>
    /// Starts a watching resolve feeding `continuation`; returns what stops it.
    func startWatch(_ request: ResolveRequest, continuation: AsyncStream<ResolvedService>.Continuation)
        -> @Sendable () -> Void
    func shutdown() async
    /// Starts shutting down without waiting (the owning ``ServiceDiscovery`` went away).
    func beginShutdown()
}

/// What a backend does for one of its published services (``PublishedService`` calls it).
protocol PublicationOwner: AnyObject, Sendable {
    /// The serial queue the backend's state lives on.
    var queue: DispatchQueue { get }
    /// On `queue`: replace the TXT record.
    func updateTXT(_ txt: TXTRecord, of service: PublishedService) -> Result<Void, DiscoveryError>
    /// On `queue`: withdraw the service.
    func unpublish(_ service: PublishedService)
    /// On `queue`: why the service is not established yet, for a timeout message.
    func notEstablishedMessage(_ service: PublishedService, timeout: Duration) -> String
}

/// Holds the backend once it is decided, and what waits for that decision.
final class BackendSelector: Sendable {
    private enum Phase {
        case deciding([@Sendable (any DiscoveryBackend) -> Void])
        case decided(any DiscoveryBackend)
    }
    private let phase = Locked<Phase>(.deciding([]))

    /// The backend, once decided.
    var current: (any DiscoveryBackend)? {
        phase.withLock { if case .decided(let backend) = $0 { backend } else { nil } }
    }

    /// Runs `body` with the backend: at once when decided, else when it is.
    func whenDecided(_ body: @escaping @Sendable (any DiscoveryBackend) -> Void) {
        let backend: (any DiscoveryBackend)? = phase.withLock { phase in
            switch phase {
            case .decided(let backend): return backend
            case .deciding(var waiters):
                waiters.append(body)
                phase = .deciding(waiters)
                return nil
            }
        }
        if let backend { body(backend) }
    }

    /// The backend, waiting for the decision if needed.
    func backend() async -> any DiscoveryBackend {
        if let current { return current }
        return await withCheckedContinuation { continuation in
            whenDecided { continuation.resume(returning: $0) }
        }
    }

    /// Why the backend was chosen (nil while deciding).
    var reason: String? { reasonText.withLock { $0 } }
    private let reasonText = Locked<String?>(nil)

    /// Sets the backend (once), tells the process-wide observer, runs what waited for it, outside the lock.
    func decide(_ backend: any DiscoveryBackend, reason: String) {
        let waiters: [@Sendable (any DiscoveryBackend) -> Void]? = phase.withLock { phase in
            guard case .deciding(let waiters) = phase else { return nil }
            phase = .decided(backend)
            return waiters
        }
        guard let waiters else { return }
        reasonText.withLock { $0 = reason }
        BackendSelector.observer.withLock { $0 }?(backend.kind, reason)
        for waiter in waiters { waiter(backend) }
    }

    /// See ``ServiceDiscovery/onBackendChosen(_:)``.
    static let observer = Locked<(@Sendable (DiscoveryBackendKind, String) -> Void)?>(nil)
}

/// Stops something started later (a browse or watch that waits for the backend decision), also
/// when the consumer goes away first.
final class DeferredStop: Sendable {
    private let state = Locked<(cancelled: Bool, stop: (@Sendable () -> Void)?)>((false, nil))

    /// Records the stop action; runs it at once if already cancelled.
    func set(_ stop: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state -> Bool in
            if state.cancelled { return true }
            state.stop = stop
            return false
        }
        if runNow { stop() }
    }

    func cancel() {
        let stop = state.withLock { state -> (@Sendable () -> Void)? in
            state.cancelled = true
            defer { state.stop = nil }
            return state.stop
        }
        stop?()
    }
}

/// The kernel's host name (`gethostname`): every backend's starting point for its own.
func kernelHostName() -> String {
    var buffer = [CChar](repeating: 0, count: 256)
    gethostname(&buffer, buffer.count)
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
