/// The decisions of one browse across the link and unicast DNS domains, without I/O.
///
/// A service is one entry however many places it is found in: entries with the same `fp` TXT value
/// (the same server key) and the same port are merged, so a server seen on the link and in a
/// domain — even under another name there, after a rename — is one peer with several
/// ``DiscoveredService/locations`` (the link first); two services of one key (two rooms one user
/// hosts) stay two. An entry is removed only when every place removed it. While wide-area domains
/// may be involved, the link's services are resolved once (the driver bounds it to a second) to
/// read `fp` and the port before they are reported; without domains the link's events pass
/// through untouched.
///
/// The domains are the fixed ones, or the configured and announced ones enumerated again every 15
/// minutes (sooner when the DNS server did not answer); a domain that vanished is stopped and its
/// places removed.
///
/// "All for now" is reported once the link said it, every link service being resolved was
/// reported, and every domain answered its first poll (a missing or unreachable domain counts as
/// answered) — or 2 s after the link said it.
///
/// `MergedBrowse` carries out the actions (the link browse, resolves, domain browses, timers) on one
/// queue and feeds back what they report.
struct MergeMachine: Sendable {
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

    enum Input: Sendable {
        /// Start; `linkAvailable`: a backend to browse the link with was found.
        case start(linkAvailable: Bool)
        /// An event of the link's browse.
        case link(BrowseEvent)
        /// A link service's resolve ended (`mergeKey` nil when it failed or has no `fp`).
        case resolved(DiscoveredService, generation: Int, mergeKey: String?)
        /// The domains to browse now; `unanswered`: some enumeration query got no answer.
        case domains([String], unanswered: Bool)
        /// An event of one domain's browse.
        case domain(String, WideAreaBrowseEvent)
        /// Time to enumerate the domains again.
        case domainsDue
        /// The grace after the link's "all for now" is over.
        case graceOver
        case stop
    }

    enum Action: Sendable, Equatable {
        case report(BrowseEvent)
        /// Start browsing the link (feed its events as `.link`).
        case startLink
        /// Resolve a link service for its `fp` and port (answer `.resolved` with this generation).
        case resolve(DiscoveredService, generation: Int)
        /// A resolve is no longer wanted (the service went away meanwhile).
        case cancelResolve(generation: Int)
        /// Enumerate the domains (answer `.domains`).
        case enumerateDomains
        /// Answer `.domainsDue` after this delay.
        case armDomainRefresh(Duration)
        case startDomain(String)
        case stopDomain(String)
        /// Answer `.graceOver` after this delay.
        case armGrace(Duration)
        /// Stop everything: the link browse, resolves, domain browses, timers; end the stream.
        case stopAll
    }

    /// How often the announced domains are asked again, and how soon after a DNS server did not answer.
    static let domainRefresh: Duration = .seconds(900)
    static let grace: Duration = .seconds(2)

    private struct Place: Sendable {
        var identity: ServiceIdentity
        var sightings: Set<DiscoveredService.Sighting>
        var isLocal: Bool
        var isOwn: Bool
    }

    private struct Entry: Sendable {
        var mergeKey: String?
        var places: [Source: Place]
        var reported: DiscoveredService
    }

    private struct PlaceKey: Hashable, Sendable {
        let source: Source
        let name: String
    }

    let includesLink: Bool
    let hasWideArea: Bool
    let fixedDomains: [String]?
    /// The wait before the domains are asked again after a DNS server did not answer.
    let domainRetry: Duration

    private var entries: [Int: Entry] = [:]
    private var nextEntry = 0
    private var byPlace: [PlaceKey: Int] = [:]
    private var byMergeKey: [String: Int] = [:]
    /// Link services being resolved for `fp` and port, by name, with a generation number: a
    /// removal while resolving cancels the add.
    private var resolving: [String: Int] = [:]
    private var generation = 0
    /// Sources that have not said "all for now" yet; nil once it was reported.
    private var pendingAllForNow: Set<Source>? = []
    private var domainsKnown = false
    /// The link said "all for now" 2 s ago: domains still polling are not waited for.
    private var graceOver = false
    private var domains: Set<String> = []
    private var started = false
    private var stopped = false

    /// - Parameters:
    ///   - includesLink: Browse the link (mDNS through the backend).
    ///   - hasWideArea: Unicast domains may be browsed at all.
    ///   - fixedDomains: The unicast domains to browse; nil: the configured and announced ones.
    init(includesLink: Bool, hasWideArea: Bool, fixedDomains: [String]?, domainRetry: Duration) {
        self.includesLink = includesLink
        self.hasWideArea = hasWideArea
        self.fixedDomains = fixedDomains
        self.domainRetry = domainRetry
    }

    /// Whether link adds wait for their `fp` (only while unicast domains may be involved).
    var mergesLink: Bool { !(domainsKnown && domains.isEmpty) }

    /// The services reported and not removed (for tests).
    var reported: [DiscoveredService] { entries.values.map(\.reported).sorted { $0.name < $1.name } }

    mutating func apply(_ input: Input) -> [Action] {
        if stopped { return [] }
        var actions: [Action] = []
        switch input {
        case .start(let linkAvailable):
            guard !started else { return [] }
            started = true
            if includesLink, linkAvailable {
                pendingAllForNow?.insert(.link)
                actions.append(.startLink)
            }
            if !hasWideArea {
                domainsKnown = true
            } else if let fixedDomains {
                setDomains(fixedDomains, &actions)
            } else {
                actions.append(.enumerateDomains)
            }
        case .link(let event):
            link(event, &actions)
        case .resolved(let service, let generation, let mergeKey):
            guard resolving[service.name] == generation else { return [] }  // removed meanwhile
            resolving.removeValue(forKey: service.name)
            add(.link, Self.place(service), mergeKey: mergeKey, &actions)
        case .domains(let found, let unanswered):
            guard fixedDomains == nil else { return [] }
            setDomains(found, &actions)
            // When the DNS server did not answer, ask again soon.
            actions.append(.armDomainRefresh(unanswered ? domainRetry : Self.domainRefresh))
        case .domainsDue:
            guard fixedDomains == nil else { return [] }
            actions.append(.enumerateDomains)
        case .domain(let domain, let event):
            guard domains.contains(domain) else { return [] }  // an event of a browse already stopped
            switch event {
            case .added(let instance):
                add(
                    .domain(domain), Place(identity: instance.identity, sightings: [], isLocal: false, isOwn: false),
                    mergeKey: Self.mergeKey(fingerprint: instance.txt["fp"], port: instance.port), &actions)
            case .removed(let instance):
                remove(.domain(domain), name: instance.identity.name, &actions)
            case .allForNow:
                pendingAllForNow?.remove(.domain(domain))
            }
        case .graceOver:
            graceOver = true
        case .stop:
            stopped = true
            return [.stopAll]
        }
        checkAllForNow(&actions)
        return actions
    }

    /// What makes two places one service: the same key and the same port.
    static func mergeKey(fingerprint: String?, port: UInt16?) -> String? {
        guard let fingerprint, let port else { return nil }
        return "\(fingerprint) \(port)"
    }

    // MARK: Steps

    private mutating func setDomains(_ found: [String], _ actions: inout [Action]) {
        let gone = domains.filter { !found.contains($0) }.sorted()
        for domain in gone {
            domains.remove(domain)
            pendingAllForNow?.remove(.domain(domain))  // no answer is coming from it
            actions.append(.stopDomain(domain))
            for key in byPlace.keys where key.source == .domain(domain) {
                remove(.domain(domain), name: key.name, &actions)
            }
        }
        for domain in found where !domains.contains(domain) {
            domains.insert(domain)
            if !domainsKnown { pendingAllForNow?.insert(.domain(domain)) }
            actions.append(.startDomain(domain))
        }
        domainsKnown = true
    }

    private mutating func link(_ event: BrowseEvent, _ actions: inout [Action]) {
        switch event {
        case .added(let service):
            guard mergesLink else {
                add(.link, Self.place(service), mergeKey: nil, &actions)
                return
            }
            generation += 1
            if let earlier = resolving.updateValue(generation, forKey: service.name) {
                actions.append(.cancelResolve(generation: earlier))
            }
            actions.append(.resolve(service, generation: generation))
        case .removed(let service):
            if let generation = resolving.removeValue(forKey: service.name) {
                actions.append(.cancelResolve(generation: generation))
            } else {
                remove(.link, name: service.name, &actions)
            }
        case .updated:
            break  // a backend never sends it
        case .allForNow:
            pendingAllForNow?.remove(.link)
            // Domains still polling get 2 s more.
            actions.append(.armGrace(Self.grace))
        case .failed(let error):
            actions.append(.report(.failed(error)))
        }
    }

    private static func place(_ service: DiscoveredService) -> Place {
        Place(identity: service.identity, sightings: service.seenOn, isLocal: service.isLocal, isOwn: service.isOwn)
    }

    private mutating func add(_ source: Source, _ place: Place, mergeKey: String?, _ actions: inout [Action]) {
        let key = PlaceKey(source: source, name: place.identity.name)
        if let id = byPlace[key], var entry = entries[id] {  // already known there
            entry.places[source] = place
            entry.reported = Self.report(entry)
            entries[id] = entry
            return
        }
        if let mergeKey, let id = byMergeKey[mergeKey], var entry = entries[id], entry.places[source] == nil {
            entry.places[source] = place
            entry.reported = Self.report(entry)
            entries[id] = entry
            byPlace[key] = id
            actions.append(.report(.updated(entry.reported)))
            return
        }
        nextEntry += 1
        let id = nextEntry
        var entry = Entry(
            mergeKey: mergeKey, places: [source: place],
            reported: DiscoveredService(identity: place.identity, seenOn: place.sightings, isLocal: place.isLocal, isOwn: place.isOwn))
        entry.reported = Self.report(entry, primary: place.identity)
        entries[id] = entry
        byPlace[key] = id
        if let mergeKey, byMergeKey[mergeKey] == nil { byMergeKey[mergeKey] = id }
        actions.append(.report(.added(entry.reported)))
    }

    private mutating func remove(_ source: Source, name: String, _ actions: inout [Action]) {
        guard let id = byPlace.removeValue(forKey: PlaceKey(source: source, name: name)), var entry = entries[id] else { return }
        entry.places.removeValue(forKey: source)
        if entry.places.isEmpty {
            entries.removeValue(forKey: id)
            if let mergeKey = entry.mergeKey, byMergeKey[mergeKey] == id { byMergeKey.removeValue(forKey: mergeKey) }
            actions.append(.report(.removed(entry.reported)))
            return
        }
        entry.reported = Self.report(entry)
        entries[id] = entry
        actions.append(.report(.updated(entry.reported)))
    }

    /// The service as reported: the identity it was first reported under, the link's sightings,
    /// every place (the link first).
    private static func report(_ entry: Entry, primary: ServiceIdentity? = nil) -> DiscoveredService {
        let ordered = entry.places.sorted { $0.key < $1.key }.map(\.value)
        return DiscoveredService(
            identity: primary ?? entry.reported.identity, seenOn: entry.places[.link]?.sightings ?? [],
            isLocal: ordered.contains { $0.isLocal }, isOwn: ordered.contains { $0.isOwn },
            locations: ordered.map(\.identity))
    }

    private mutating func checkAllForNow(_ actions: inout [Action]) {
        guard let pending = pendingAllForNow else { return }
        let everyoneAnswered = pending.isEmpty && resolving.isEmpty && (domainsKnown || !hasWideArea)
        guard everyoneAnswered || graceOver else { return }
        pendingAllForNow = nil
        actions.append(.report(.allForNow))
    }
}
