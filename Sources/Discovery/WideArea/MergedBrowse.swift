import Locks
import Logging

/// One browse across the link and unicast DNS domains, in one event stream.
///
/// A service is one entry however many places it is found in: entries with the same `fp` TXT value
/// (the same server key) and the same port are merged, so a server seen on the link and in a
/// domain — even under another name there, after a rename — is one peer with several
/// ``DiscoveredService/locations`` (the link first); two services of one key (two rooms one user
/// hosts) stay two. An entry is removed only when every place removed it. While wide-area domains
/// may be involved, the link's services are resolved once (up to a second) to read `fp` and the
/// port before they are reported; without domains the link's events pass through untouched.
///
/// "All for now" is reported once the link said it, every link service being resolved was
/// reported, and every domain answered its first poll (a missing or unreachable domain counts as
/// answered) — or 2 s after the link said it.
final class MergedBrowse: Sendable {
    enum Source: Hashable, Sendable, Comparable {
        case link
        case domain(String)

        static func < (lhs: Source, rhs: Source) -> Bool {
            switch (lhs, rhs) {
            case (.link, .domain): true
            case (.domain(let a), .domain(let b)): a < b
            default: false
            }
        }
    }

    private struct Place: Sendable {
        var identity: ServiceIdentity
        var sightings: Set<DiscoveredService.Sighting>
        var isLocal: Bool
        var isOwn: Bool
    }

    private struct Entry {
        var mergeKey: String?
        var places: [Source: Place]
        var reported: DiscoveredService
    }

    private struct PlaceKey: Hashable {
        let source: Source
        let name: String
    }

    private struct State {
        var entries: [Int: Entry] = [:]
        var nextEntry = 0
        var byPlace: [PlaceKey: Int] = [:]
        var byMergeKey: [String: Int] = [:]
        /// Link services being resolved for `fp` and port, by name, with a generation number: a
        /// removal while resolving cancels the add.
        var resolving: [String: Int] = [:]
        var resolveTasks: [Int: Task<Void, Never>] = [:]
        var generation = 0
        /// Sources that have not said "all for now" yet; nil once it was reported.
        var pendingAllForNow: Set<Source>? = []
        var domainsKnown = false
        var linkAllForNow = false
        /// The link said "all for now" 2 s ago: domains still polling are not waited for.
        var graceOver = false
        var domains: [String: WideAreaBrowse] = [:]
        var tasks: [Task<Void, Never>] = []
        var stopLink: (@Sendable () -> Void)?
        var stopped = false
    }

    let type: String
    let includesLink: Bool
    let fixedDomains: [String]?
    let wideArea: WideArea?
    let continuation: AsyncStream<BrowseEvent>.Continuation
    let logger: Logger
    private let state = Locked(State())

    /// - Parameters:
    ///   - includesLink: Browse the link (mDNS through the backend).
    ///   - domains: The unicast domains to browse; nil: the configured and announced ones.
    init(
        type: String, includesLink: Bool, domains: [String]?, wideArea: WideArea?, logger: Logger,
        continuation: AsyncStream<BrowseEvent>.Continuation
    ) {
        self.type = type
        self.includesLink = includesLink
        self.fixedDomains = domains
        self.wideArea = wideArea
        self.logger = logger
        self.continuation = continuation
    }

    /// Starts the link browse through `backend` (when included) and the domain browses; nothing
    /// when the browse was already stopped (its consumer went away before the backend was chosen).
    func start(backend: (any DiscoveryBackend)?, request: BrowseRequest) {
        guard !state.withLock({ $0.stopped }) else { return }
        if includesLink, let backend {
            state.withLock { _ = $0.pendingAllForNow?.insert(.link) }
            let (linkEvents, linkContinuation) = AsyncStream.makeStream(of: BrowseEvent.self)
            let stop = backend.startBrowse(request, continuation: linkContinuation)
            let task = Task {
                for await event in linkEvents { self.link(event, backend: backend, request: request) }
            }
            let stopNow = state.withLock { state -> Bool in
                guard !state.stopped else { return true }
                state.stopLink = stop
                state.tasks.append(task)
                return false
            }
            if stopNow {
                stop()
                task.cancel()
                return
            }
        }
        guard let wideArea else {
            state.withLock { $0.domainsKnown = true }
            checkAllForNow()
            return
        }
        let task = Task {
            // The domains, then again every 15 minutes (new ones are browsed, vanished ones stopped).
            while !Task.isCancelled {
                if let fixedDomains {
                    self.setDomains(fixedDomains)
                    return
                }
                let found = await wideArea.domains()
                if Task.isCancelled { return }
                self.setDomains(found.browse)
                // When the DNS server did not answer, ask again soon.
                try? await Task.sleep(for: found.unanswered == nil ? .seconds(900) : max(.seconds(5), wideArea.settings.pollInterval * 3))
            }
        }
        let stopNow = state.withLock { state -> Bool in
            guard !state.stopped else { return true }
            state.tasks.append(task)
            return false
        }
        if stopNow { task.cancel() }
    }

    func stop() {
        let (stopLink, tasks, browses) = state.withLock { state in
            state.stopped = true
            defer {
                state.tasks = []
                state.resolveTasks = [:]
                state.domains = [:]
                state.stopLink = nil
            }
            return (state.stopLink, state.tasks + Array(state.resolveTasks.values), Array(state.domains.values))
        }
        stopLink?()
        for task in tasks { task.cancel() }
        for browse in browses { browse.stop() }
        continuation.finish()
    }

    /// Whether link adds wait for their `fp` (only while unicast domains may be involved).
    private var mergesLink: Bool {
        state.withLock { !($0.domainsKnown && $0.domains.isEmpty) }
    }

    // MARK: Domains

    private func setDomains(_ domains: [String]) {
        guard let wideArea else { return }
        let (started, stopped) = state.withLock { state -> ([WideAreaBrowse], [WideAreaBrowse]) in
            guard !state.stopped else { return ([], []) }
            var started: [WideAreaBrowse] = []
            for domain in domains where state.domains[domain] == nil {
                let browse = WideAreaBrowse(wideArea: wideArea, domain: domain, type: type) { [weak self] event in
                    self?.domainEvent(domain, event)
                }
                state.domains[domain] = browse
                if !state.domainsKnown { state.pendingAllForNow?.insert(.domain(domain)) }
                started.append(browse)
            }
            let gone = state.domains.keys.filter { !domains.contains($0) }
            let stopped = gone.compactMap { state.domains.removeValue(forKey: $0) }
            state.domainsKnown = true
            return (started, stopped)
        }
        for browse in stopped {
            browse.stop()
            for name in namesIn(.domain(browse.domain)) { remove(.domain(browse.domain), name: name) }
        }
        for browse in started { browse.start() }
        checkAllForNow()
    }

    private func namesIn(_ source: Source) -> [String] {
        state.withLock { state in state.byPlace.keys.filter { $0.source == source }.map(\.name) }
    }

    private func domainEvent(_ domain: String, _ event: WideAreaBrowseEvent) {
        switch event {
        case .added(let instance):
            add(
                .domain(domain),
                Place(identity: instance.identity, sightings: [], isLocal: false, isOwn: false),
                mergeKey: Self.mergeKey(fingerprint: instance.txt["fp"], port: instance.port))
        case .removed(let instance):
            remove(.domain(domain), name: instance.identity.name)
        case .allForNow:
            state.withLock { _ = $0.pendingAllForNow?.remove(.domain(domain)) }
            checkAllForNow()
        }
    }

    /// What makes two places one service: the same key and the same port.
    static func mergeKey(fingerprint: String?, port: UInt16?) -> String? {
        guard let fingerprint, let port else { return nil }
        return "\(fingerprint) \(port)"
    }

    // MARK: Link

    private func link(_ event: BrowseEvent, backend: any DiscoveryBackend, request: BrowseRequest) {
        switch event {
        case .added(let service):
            let place = Place(identity: service.identity, sightings: service.seenOn, isLocal: service.isLocal, isOwn: service.isOwn)
            guard mergesLink else {
                add(.link, place, mergeKey: nil)
                return
            }
            let generation = state.withLock { state -> Int in
                state.generation += 1
                state.resolving[service.name] = state.generation
                return state.generation
            }
            // Read its fp and port without holding up the other events.
            let task = Task {
                let resolved = await backend.resolve(
                    ResolveRequest(
                        identity: service.identity, sightings: Array(service.seenOn), interface: request.interface,
                        ipVersion: request.ipVersion),
                    timeout: .seconds(1))
                let found = try? resolved.get()
                self.add(.link, place, mergeKey: Self.mergeKey(fingerprint: found?.txt["fp"], port: found?.port), generation: generation)
            }
            let stopNow = state.withLock { state -> Bool in
                guard !state.stopped else { return true }
                if state.resolving[service.name] == generation { state.resolveTasks[generation] = task }
                return false
            }
            if stopNow { task.cancel() }
        case .removed(let service):
            let wasResolving = state.withLock { state -> Bool in
                guard let generation = state.resolving.removeValue(forKey: service.name) else { return false }
                state.resolveTasks.removeValue(forKey: generation)?.cancel()
                return true
            }
            if wasResolving { checkAllForNow() } else { remove(.link, name: service.name) }
        case .updated:
            break  // a backend never sends it
        case .allForNow:
            state.withLock { state in
                state.linkAllForNow = true
                _ = state.pendingAllForNow?.remove(.link)
            }
            checkAllForNow()
            // Domains still polling get 2 s more.
            let task = Task {
                try? await Task.sleep(for: .seconds(2))
                self.state.withLock { $0.graceOver = true }
                self.checkAllForNow()
            }
            let stopNow = state.withLock { state -> Bool in
                guard !state.stopped else { return true }
                state.tasks.append(task)
                return false
            }
            if stopNow { task.cancel() }
        case .failed(let error):
            continuation.yield(.failed(error))
        }
    }

    // MARK: Merging

    /// Adds a place; `generation` (a link service that was being resolved) is checked under the same
    /// lock as the add, so a removal that came meanwhile wins.
    private func add(_ source: Source, _ place: Place, mergeKey: String?, generation: Int? = nil) {
        let event = state.withLock { state -> BrowseEvent? in
            if let generation {
                guard state.resolving[place.identity.name] == generation else { return nil }
                state.resolving.removeValue(forKey: place.identity.name)
                state.resolveTasks.removeValue(forKey: generation)
            }
            guard !state.stopped else { return nil }
            let key = PlaceKey(source: source, name: place.identity.name)
            if let id = state.byPlace[key], var entry = state.entries[id] {  // already known there
                entry.places[source] = place
                entry.reported = Self.report(entry)
                state.entries[id] = entry
                return nil
            }
            if let mergeKey, let id = state.byMergeKey[mergeKey], var entry = state.entries[id], entry.places[source] == nil {
                entry.places[source] = place
                entry.reported = Self.report(entry)
                state.entries[id] = entry
                state.byPlace[key] = id
                return .updated(entry.reported)
            }
            state.nextEntry += 1
            let id = state.nextEntry
            var entry = Entry(mergeKey: mergeKey, places: [source: place], reported: Self.placeholder(place))
            entry.reported = Self.report(entry, primary: place.identity)
            state.entries[id] = entry
            state.byPlace[key] = id
            if let mergeKey, state.byMergeKey[mergeKey] == nil { state.byMergeKey[mergeKey] = id }
            return .added(entry.reported)
        }
        if let event { continuation.yield(event) }
        if generation != nil { checkAllForNow() }
    }

    private func remove(_ source: Source, name: String) {
        let event = state.withLock { state -> BrowseEvent? in
            let key = PlaceKey(source: source, name: name)
            guard let id = state.byPlace.removeValue(forKey: key), var entry = state.entries[id] else { return nil }
            entry.places.removeValue(forKey: source)
            if entry.places.isEmpty {
                state.entries.removeValue(forKey: id)
                if let mergeKey = entry.mergeKey, state.byMergeKey[mergeKey] == id {
                    state.byMergeKey.removeValue(forKey: mergeKey)
                }
                return .removed(entry.reported)
            }
            entry.reported = Self.report(entry)
            state.entries[id] = entry
            return .updated(entry.reported)
        }
        if let event { continuation.yield(event) }
    }

    private static func placeholder(_ place: Place) -> DiscoveredService {
        DiscoveredService(identity: place.identity, seenOn: place.sightings, isLocal: place.isLocal, isOwn: place.isOwn)
    }

    /// The service as reported: the identity it was first reported under, the link's sightings,
    /// every place (the link first).
    private static func report(_ entry: Entry, primary: ServiceIdentity? = nil) -> DiscoveredService {
        let ordered = entry.places.sorted { $0.key < $1.key }.map(\.value)
        let identity = primary ?? entry.reported.identity
        return DiscoveredService(
            identity: identity, seenOn: entry.places[.link]?.sightings ?? [],
            isLocal: ordered.contains { $0.isLocal }, isOwn: ordered.contains { $0.isOwn },
            locations: ordered.map(\.identity))
    }

    private func checkAllForNow() {
        let ready = state.withLock { state -> Bool in
            guard let pending = state.pendingAllForNow else { return false }
            let everyoneAnswered = pending.isEmpty && state.resolving.isEmpty && (state.domainsKnown || wideArea == nil)
            guard everyoneAnswered || state.graceOver else { return false }
            state.pendingAllForNow = nil
            return true
        }
        if ready { continuation.yield(.allForNow) }
    }
}
