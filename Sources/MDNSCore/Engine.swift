/// Settings of one engine.
public struct MDNSConfiguration: Sendable, Hashable {
    /// The host label to claim (`alpha` → `alpha.local`); renamed `alpha-2` on a conflict.
    public var hostName: String
    /// Most records cached (all links together).
    public var cacheCapacity = 4096
    /// Most records cached for one (link, name, type).
    public var maxRecordsPerSet = 256
    /// Largest datagram built (IPv6 minimum MTU path: 1500 − 40 − 8, less a margin).
    public var maxPacketSize = 1440
    /// When not empty: the addresses to advertise for the host on every link instead of the
    /// interfaces' own (a NAT'd container advertising its host's address).
    public var advertisedAddresses: [[UInt8]] = []
    /// TTL of host-name-bound records (A, AAAA, SRV), RFC 6762 §10: 120 s.
    public var hostRecordTTL: UInt32 = 120
    /// TTL of other records (PTR, TXT), RFC 6762 §10: 75 minutes.
    public var otherRecordTTL: UInt32 = 4500

    public init(hostName: String) {
        self.hostName = hostName
    }
}

/// A service to publish.
public struct MDNSService: Hashable, Sendable {
    /// The instance name (one label, any UTF-8 up to 63 bytes).
    public var instance: String
    /// The service type with its domain: `_chat._tcp.local`.
    public var type: DNSName
    public var port: UInt16
    /// TXT character-strings (each ≤ 255 bytes).
    public var txt: [[UInt8]]
    /// Where to publish.
    public var links: LinkFilter

    public init(instance: String, type: DNSName, port: UInt16, txt: [[UInt8]], links: LinkFilter = .all) {
        self.instance = instance
        self.type = type
        self.port = port
        self.txt = txt
        self.links = links
    }
}

/// What the engine tells the driver besides packets.
public enum MDNSEvent: Hashable, Sendable {
    /// The host name was claimed (probing done).
    case hostNameEstablished(String)
    /// The host name collided and is being claimed under a new name.
    case hostNameRenamed(from: String, to: String)
    /// A publication finished probing and was announced under `name`.
    case publicationEstablished(Int, name: String)
    /// A publication's name collided; it probes again as `to`.
    case publicationRenamed(Int, from: String, to: String)
    /// A browse saw an instance on a link (once per link).
    case browseAdded(Int, instance: DNSName, link: LinkID, isLocal: Bool)
    /// An instance went away from a link (goodbye, expiry, link gone, eviction).
    case browseRemoved(Int, instance: DNSName, link: LinkID)
    /// One second after a browse's first query: what answers quickly has answered.
    case browseAllForNow(Int)
    /// Records a resolve uses changed; read ``MDNSEngine/resolution(_:)``.
    case resolveChanged(Int)
}

/// Either a packet to send or an event.
public enum MDNSOutput: Hashable, Sendable {
    case send(MDNSPacket)
    case event(MDNSEvent)
}

/// Counters for tests and diagnostics.
public struct MDNSCounters: Hashable, Sendable {
    public var received = 0
    /// Datagrams that did not parse (dropped).
    public var malformed = 0
    /// Datagrams ignored for a non-zero opcode/rcode or a response from a port other than 5353.
    public var ignored = 0
    public var sent = 0
    public var conflicts = 0
    public var queriesAnswered = 0
}

/// What a resolve found so far.
public struct MDNSResolution: Hashable, Sendable {
    public struct Address: Hashable, Sendable {
        /// 4 or 16 bytes.
        public var bytes: [UInt8]
        /// The link the address record was heard on (its interface is the IPv6 scope).
        public var link: LinkID
    }
    public var target: DNSName
    public var port: UInt16
    /// nil until a TXT record was heard.
    public var txt: [[UInt8]]?
    public var addresses: [Address]
    /// The SRV record came from this host.
    public var isLocal: Bool
    /// Links the SRV record was heard on.
    public var links: Set<LinkID>
}

/// The mDNS / DNS-SD protocol (RFC 6762, RFC 6763) without I/O: a responder (probing,
/// announcing, answering, conflicts, goodbyes) and a querier (continuous querying with back-off,
/// known answers, a bounded cache refreshed before expiry).
///
/// The driver feeds it datagrams, link changes and calls from the app, each with the current time;
/// the engine queues packets to send and events (``drainOutput()``) and tells when it next needs
/// to run (``nextDeadline``). Nothing in it blocks, sleeps or reads a clock.
public struct MDNSEngine: Sendable {
    // MARK: State

    enum Phase: Hashable {
        /// `sent` probes went out; the next step is at `next`.
        case probing(sent: Int, next: MDNSInstant)
        /// Probed, waiting for the host name to be claimed (services only).
        case waitingForHost
        /// `sent` announcements went out; the next one is at `next`.
        case announcing(sent: Int, next: MDNSInstant)
        case established

        var isProbing: Bool { if case .probing = self { true } else { false } }
        /// Records are ours to answer with.
        var isLive: Bool {
            switch self {
            case .announcing, .established: true
            default: false
            }
        }
        var deadline: MDNSInstant? {
            switch self {
            case .probing(_, let next), .announcing(_, let next): next
            default: nil
            }
        }
    }

    struct Service {
        var spec: MDNSService
        var label: String
        var phase: Phase
        var conflicts: [MDNSInstant] = []
        /// Announced at least once under its current name: others may cache it (goodbyes owed).
        var announced = false
        var name: DNSName { DNSName(checkedLabels: [Array(label.utf8)] + spec.type.labels) }
    }

    struct RecordKey: Hashable {
        var name: DNSName
        var data: RecordData
        init(_ record: ResourceRecord) {
            name = record.name
            data = record.data
        }
    }

    struct PendingAnswer {
        var record: ResourceRecord
        var due: MDNSInstant
    }

    struct QuestionKey: Hashable {
        var name: DNSName
        var type: UInt16
        var filter: LinkFilter
    }

    struct QuestionState {
        var refs: Int
        var next: MDNSInstant
        /// The interval after the next query (1 s, doubling to an hour: RFC 6762 §5.2).
        var interval: UInt64
    }

    struct Browse {
        var type: DNSName
        var filter: LinkFilter
        var allForNowAt: MDNSInstant?
    }

    struct Resolve {
        var instance: DNSName
        var filter: LinkFilter
        var questions: Set<QuestionKey> = []
    }

    public let configuration: MDNSConfiguration
    var random: SplitMix64
    public internal(set) var links: [LinkID: MDNSLink] = [:]
    public internal(set) var cache: RecordCache
    public internal(set) var counters = MDNSCounters()

    var hostLabel: String
    var hostPhase: Phase
    var hostConflicts: [MDNSInstant] = []
    var services: [Int: Service] = [:]
    var nextID = 0
    var pending: [LinkID: [PendingAnswer]] = [:]
    var lastMulticast: [LinkID: [RecordKey: MDNSInstant]] = [:]
    var questions: [QuestionKey: QuestionState] = [:]
    var browses: [Int: Browse] = [:]
    var resolves: [Int: Resolve] = [:]
    var output: [MDNSOutput] = []
    var dueProbes: [ProbeItem] = []
    var stopped = false

    public static let probeInterval: Int64 = 250
    public static let maxQueryInterval: UInt64 = 3_600_000_000_000

    public init(configuration: MDNSConfiguration, now: MDNSInstant, seed: UInt64) {
        self.configuration = configuration
        random = SplitMix64(seed: seed)
        cache = RecordCache(capacity: configuration.cacheCapacity, maxPerSet: configuration.maxRecordsPerSet)
        var label = String(configuration.hostName.prefix { $0 != "." })
        if label.isEmpty { label = "host" }
        while label.utf8.count > DNSName.maxLabelBytes { label.removeLast() }
        hostLabel = label
        hostPhase = .probing(sent: 0, next: now)  // replaced below, once `random` can be used
        hostPhase = .probing(sent: 0, next: now.adding(milliseconds: jitter(0...250)))
    }

    // MARK: Public API

    /// The host label currently claimed or being claimed (`alpha`).
    public var hostName: String { hostLabel }
    /// The host's full name (`alpha.local`).
    public var hostDomainName: DNSName { DNSName(checkedLabels: [Array(hostLabel.utf8)] + DNSName.local.labels) }
    /// Whether the host name is claimed (probing over).
    public var hostIsEstablished: Bool { hostPhase.isLive }

    /// Packets and events produced since the last call, in order.
    public mutating func drainOutput() -> [MDNSOutput] {
        defer { output.removeAll(keepingCapacity: true) }
        return output
    }

    /// Replaces the set of links (interfaces × IP versions) with their addresses.
    public mutating func setLinks(_ newLinks: [MDNSLink], now: MDNSInstant) {
        let updated = Dictionary(newLinks.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        var changed = false
        for (id, _) in links where updated[id] == nil {
            links[id] = nil
            pending[id] = nil
            lastMulticast[id] = nil
            apply(cache.remove(link: id), now: now)
            changed = true
        }
        var added = false
        for (id, link) in updated {
            if let old = links[id] {
                if old.addresses != link.addresses { changed = true }
            } else {
                added = true
            }
            links[id] = link
        }
        if added || changed {
            // Tell the (new) links what we have; ask our questions there soon.
            if hostPhase.isLive {
                hostPhase = .announcing(sent: 0, next: now.adding(milliseconds: jitter(20...120)))
                for id in services.keys where services[id]!.phase.isLive {
                    services[id]!.phase = .announcing(sent: 0, next: now.adding(milliseconds: jitter(20...120)))
                }
            }
            if added {
                for key in questions.keys {
                    questions[key]!.next = min(questions[key]!.next, now.adding(milliseconds: jitter(20...120)))
                    questions[key]!.interval = 1_000_000_000
                }
            }
        }
        advance(now: now)
    }

    /// Starts publishing a service (probing first). Returns its id.
    public mutating func publish(_ service: MDNSService, now: MDNSInstant) -> Int {
        var service = service
        // An empty TXT record is one empty string on the wire (RFC 6763 §6.1); keep that form so
        // our records compare equal to their own copies coming back.
        if service.txt.isEmpty { service.txt = [[]] }
        nextID += 1
        var label = service.instance
        while label.utf8.count > DNSName.maxLabelBytes { label.removeLast() }
        // Two publications of ours with one name: the later one is renamed at once (Avahi does the same).
        while services.values.contains(where: { $0.label == label && $0.spec.type == service.type }) {
            let old = label
            label = alternativeName(for: label, isHost: false)
            output.append(.event(.publicationRenamed(nextID, from: old, to: label)))
        }
        services[nextID] = Service(
            spec: service, label: label, phase: .probing(sent: 0, next: now.adding(milliseconds: jitter(0...250))))
        advance(now: now)
        return nextID
    }

    /// The current instance name of a publication.
    public func publicationName(_ id: Int) -> String? { services[id]?.label }

    /// Instance names (full) of our own publications, for "is this ours".
    public func isOwnInstance(_ name: DNSName) -> Bool { services.values.contains { $0.name == name } }

    /// Replaces a publication's TXT record and announces it again.
    public mutating func updateTXT(_ id: Int, txt: [[UInt8]], now: MDNSInstant) {
        guard var service = services[id] else { return }
        let name = service.name
        service.spec.txt = txt.isEmpty ? [[]] : txt
        if service.phase.isLive {
            for link in pending.keys {
                pending[link]!.removeAll { $0.record.name == name && $0.record.type == DNSType.txt }
            }
            service.phase = .announcing(sent: 0, next: now)
        }
        services[id] = service
        advance(now: now)
    }

    /// Stops publishing: goodbye packets (TTL 0) for what was announced.
    public mutating func unpublish(_ id: Int, now: MDNSInstant) {
        guard let service = services.removeValue(forKey: id) else { return }
        let name = service.name
        for link in pending.keys { pending[link]!.removeAll { $0.record.name == name } }
        if service.announced {
            for link in activeLinks(service.spec.links) {
                var records = serviceRecords(service, on: link).map { record -> ResourceRecord in
                    var record = record
                    record.ttl = 0
                    return record
                }
                // The type enumeration record stays while another service of the type is ours.
                if services.values.contains(where: { $0.spec.type == service.spec.type && $0.phase.isLive }) {
                    records.removeAll { $0.name == DNSName.serviceTypeEnumeration }
                }
                sendResponse(on: link, answers: records, additionals: [], now: now, noteMulticast: false)
                for record in records { lastMulticast[link]?[RecordKey(record)] = nil }
            }
        }
        advance(now: now)
    }

    /// Starts browsing for a service type (`_chat._tcp.local`): continuous PTR queries.
    public mutating func startBrowse(type: DNSName, links filter: LinkFilter, now: MDNSInstant) -> Int {
        nextID += 1
        let id = nextID
        browses[id] = Browse(type: type, filter: filter, allForNowAt: now.adding(milliseconds: 1000))
        addQuestion(QuestionKey(name: type, type: DNSType.ptr, filter: filter), now: now, delay: jitter(20...120))
        // What the cache knows already.
        for link in activeLinks(filter).sorted() {
            for entry in cache.records(on: link, name: type, type: DNSType.ptr) {
                if case .ptr(let instance) = entry.record.data {
                    output.append(.event(.browseAdded(id, instance: instance, link: link, isLocal: entry.isLocal)))
                }
            }
        }
        advance(now: now)
        return id
    }

    public mutating func stopBrowse(_ id: Int) {
        guard let browse = browses.removeValue(forKey: id) else { return }
        removeQuestion(QuestionKey(name: browse.type, type: DNSType.ptr, filter: browse.filter))
    }

    /// Starts resolving an instance: SRV, TXT, then the addresses of the SRV target, queried
    /// until ``stopResolve(_:)``. Emits ``MDNSEvent/resolveChanged(_:)`` at once and on every change.
    public mutating func startResolve(instance: DNSName, links filter: LinkFilter, now: MDNSInstant) -> Int {
        nextID += 1
        let id = nextID
        resolves[id] = Resolve(instance: instance, filter: filter)
        updateResolveQuestions(id, now: now)
        output.append(.event(.resolveChanged(id)))
        advance(now: now)
        return id
    }

    public mutating func stopResolve(_ id: Int) {
        guard let resolve = resolves.removeValue(forKey: id) else { return }
        for key in resolve.questions { removeQuestion(key) }
    }

    /// What the cache knows about a resolve's instance: the freshest SRV, its TXT and the target's
    /// addresses on every link. nil until an SRV record was heard.
    public func resolution(_ id: Int) -> MDNSResolution? {
        guard let resolve = resolves[id] else { return nil }
        return resolution(instance: resolve.instance, filter: resolve.filter)
    }

    /// The same for any instance (no resolve needed).
    public func resolution(instance: DNSName, filter: LinkFilter) -> MDNSResolution? {
        let linkIDs = activeLinks(filter).sorted()
        var srv: CachedRecord?
        var srvLinks: Set<LinkID> = []
        var txt: CachedRecord?
        for link in linkIDs {
            for entry in cache.records(on: link, name: instance, type: DNSType.srv) {
                srvLinks.insert(link)
                if srv == nil || entry.received > srv!.received { srv = entry }
            }
            for entry in cache.records(on: link, name: instance, type: DNSType.txt)
            where txt == nil || entry.received > txt!.received {
                txt = entry
            }
        }
        guard let srv, case .srv(_, _, let port, let target) = srv.record.data else { return nil }
        var addresses: [MDNSResolution.Address] = []
        for link in linkIDs {
            for type in [DNSType.a, DNSType.aaaa] {
                for entry in cache.records(on: link, name: target, type: type).sorted(by: { $0.received < $1.received })
                {
                    switch entry.record.data {
                    case .a(let bytes), .aaaa(let bytes):
                        let address = MDNSResolution.Address(bytes: bytes, link: link)
                        if !addresses.contains(address) { addresses.append(address) }
                    default: break
                    }
                }
            }
        }
        var strings: [[UInt8]]?
        if let txt, case .txt(let value) = txt.record.data { strings = value }
        return MDNSResolution(
            target: target, port: port, txt: strings, addresses: addresses, isLocal: srv.isLocal, links: srvLinks)
    }

    /// Handles one datagram received at `now`.
    public mutating func receive(_ datagram: [UInt8], from source: MDNSSource, now: MDNSInstant) {
        counters.received += 1
        guard !stopped, links[source.link] != nil else { return }
        let message: DNSMessage
        do {
            message = try DNSMessage(parsing: datagram)
        } catch {
            counters.malformed += 1
            return
        }
        guard message.opcode == 0, message.rcode == 0 else {
            counters.ignored += 1
            return
        }
        if message.isResponse {
            // RFC 6762 §6: responses not from port 5353 are ignored.
            guard source.port == mdnsPort else {
                counters.ignored += 1
                return
            }
            handleResponse(message, from: source, now: now)
        } else {
            handleQuery(message, from: source, now: now)
        }
        advance(now: now)
    }

    /// Runs whatever is due at `now`.
    public mutating func advance(now: MDNSInstant) {
        guard !stopped else { return }
        apply(cache.expire(now: now), now: now)
        stepHost(now: now)
        for id in services.keys.sorted() { stepService(id, now: now) }
        sendProbes(now: now)
        sendDueAnswers(now: now)
        sendDueQuestions(now: now)
        sendDueRefreshes(now: now)
        for id in browses.keys.sorted() {
            if let at = browses[id]!.allForNowAt, at <= now {
                browses[id]!.allForNowAt = nil
                output.append(.event(.browseAllForNow(id)))
            }
        }
    }

    /// When ``advance(now:)`` must run next; nil when nothing is scheduled.
    public mutating func nextDeadline() -> MDNSInstant? {
        guard !stopped else { return nil }
        var deadline = cache.nextExpiry()
        func consider(_ instant: MDNSInstant?) {
            guard let instant else { return }
            deadline = min(deadline ?? instant, instant)
        }
        consider(hostPhase.deadline)
        for service in services.values {
            consider(service.phase.deadline)
        }
        for answers in pending.values { for answer in answers { consider(answer.due) } }
        for state in questions.values { consider(state.next) }
        for browse in browses.values { consider(browse.allForNowAt) }
        for (key, _) in questions {
            for link in activeLinks(key.filter) {
                for entry in interestingRecords(key, on: link) { consider(entry.nextRefresh) }
            }
        }
        return deadline
    }

    /// Goodbyes for everything published (host records included); the engine stops.
    public mutating func shutdown(now: MDNSInstant) {
        guard !stopped else { return }
        for id in services.keys.sorted() { unpublish(id, now: now) }
        if hostPhase.isLive {
            for link in links.keys.sorted() {
                let records = hostRecords(on: link).map { record -> ResourceRecord in
                    var record = record
                    record.ttl = 0
                    return record
                }
                sendResponse(on: link, answers: records, additionals: [], now: now, noteMulticast: false)
            }
        }
        stopped = true
        pending.removeAll()
        questions.removeAll()
    }

    // MARK: Helpers

    mutating func jitter(_ range: ClosedRange<Int64>) -> Int64 {
        Int64.random(in: range, using: &random)
    }

    func activeLinks(_ filter: LinkFilter) -> [LinkID] {
        links.keys.filter { filter.matches($0) }
    }

    /// The host's address records on a link: A on IPv4 links only, AAAA on both (Avahi's
    /// publish-a-on-ipv6=no, publish-aaaa-on-ipv4=yes). Loopback addresses only exist on loopback.
    func hostRecords(on link: LinkID) -> [ResourceRecord] {
        guard let info = links[link] else { return [] }
        let addresses = configuration.advertisedAddresses.isEmpty ? info.addresses : configuration.advertisedAddresses
        let name = hostDomainName
        var records: [ResourceRecord] = []
        for address in addresses {
            if address.count == 4, link.family == .v4 {
                records.append(
                    ResourceRecord(name: name, data: .a(address), ttl: configuration.hostRecordTTL, cacheFlush: true))
            } else if address.count == 16 {
                records.append(
                    ResourceRecord(name: name, data: .aaaa(address), ttl: configuration.hostRecordTTL, cacheFlush: true)
                )
            }
        }
        return records
    }

    /// A service's records on a link: SRV and TXT (unique), PTR and the type enumeration PTR (shared).
    func serviceRecords(_ service: Service, on link: LinkID) -> [ResourceRecord] {
        guard service.spec.links.matches(link), links[link] != nil else { return [] }
        let name = service.name
        return [
            ResourceRecord(
                name: name, data: .srv(priority: 0, weight: 0, port: service.spec.port, target: hostDomainName),
                ttl: configuration.hostRecordTTL, cacheFlush: true),
            ResourceRecord(
                name: name, data: .txt(service.spec.txt), ttl: configuration.otherRecordTTL, cacheFlush: true),
            ResourceRecord(name: service.spec.type, data: .ptr(name), ttl: configuration.otherRecordTTL),
            ResourceRecord(
                name: .serviceTypeEnumeration, data: .ptr(service.spec.type), ttl: configuration.otherRecordTTL),
        ]
    }

    /// Every record we may answer with on a link.
    func liveRecords(on link: LinkID) -> [ResourceRecord] {
        guard hostPhase.isLive else { return [] }
        var records = hostRecords(on: link)
        var seenTypes: Set<DNSName> = []
        for id in services.keys.sorted() where services[id]!.phase.isLive {
            for record in serviceRecords(services[id]!, on: link) {
                if record.name == .serviceTypeEnumeration, case .ptr(let type) = record.data {
                    guard seenTypes.insert(type).inserted else { continue }
                }
                records.append(record)
            }
        }
        return records
    }

    /// Sends a response, split over as many packets as needed (additionals only where they fit).
    mutating func sendResponse(
        on link: LinkID, answers: [ResourceRecord], additionals: [ResourceRecord], now: MDNSInstant,
        noteMulticast: Bool = true, destination: MDNSPacket.Destination = .multicast, id: UInt16 = 0,
        questions echoed: [DNSQuestion] = []
    ) {
        guard !answers.isEmpty else { return }
        let flags = DNSMessage.responseFlag | DNSMessage.authoritativeFlag
        let maxSize = configuration.maxPacketSize
        func fresh() -> MessageWriter {
            var writer = MessageWriter(id: id, flags: flags, maxSize: maxSize)
            for question in echoed { _ = writer.add(question) }
            return writer
        }
        var writer = fresh()
        var inWriter = 0
        for record in answers {
            if writer.add(record, to: .answer) {
                inWriter += 1
                continue
            }
            guard inWriter > 0 else { continue }  // larger than any packet: left out
            emit(writer.finish(), on: link, to: destination)
            writer = fresh()
            inWriter = writer.add(record, to: .answer) ? 1 : 0
        }
        let inAnswers = Set(answers.map(RecordKey.init))
        for record in additionals where !inAnswers.contains(RecordKey(record)) {
            if !writer.add(record, to: .additional) { break }  // additionals are optional
        }
        if inWriter > 0 { emit(writer.finish(), on: link, to: destination) }
        if noteMulticast, destination == .multicast {
            for record in answers + additionals { lastMulticast[link, default: [:]][RecordKey(record)] = now }
        }
    }

    mutating func emit(_ bytes: [UInt8], on link: LinkID, to destination: MDNSPacket.Destination) {
        counters.sent += 1
        output.append(.send(MDNSPacket(link: link, destination: destination, bytes: bytes)))
    }

    /// Applies cache changes: browse and resolve events.
    mutating func apply(_ changes: [RecordCache.Change], now: MDNSInstant) {
        guard !changes.isEmpty else { return }
        var touchedResolves: Set<Int> = []
        for change in changes {
            let (entry, added) =
                switch change {
                case .added(let entry): (entry, true)
                case .removed(let entry): (entry, false)
                }
            let record = entry.record
            if record.type == DNSType.ptr, case .ptr(let instance) = record.data {
                for id in browses.keys.sorted() {
                    let browse = browses[id]!
                    guard browse.type == record.name, browse.filter.matches(entry.link) else { continue }
                    output.append(
                        .event(
                            added
                                ? .browseAdded(id, instance: instance, link: entry.link, isLocal: entry.isLocal)
                                : .browseRemoved(id, instance: instance, link: entry.link)))
                }
            }
            for (id, resolve) in resolves where resolve.filter.matches(entry.link) {
                if record.name == resolve.instance && (record.type == DNSType.srv || record.type == DNSType.txt) {
                    touchedResolves.insert(id)
                } else if record.type == DNSType.a || record.type == DNSType.aaaa,
                    resolve.questions.contains(where: { $0.name == record.name })
                {
                    touchedResolves.insert(id)
                }
            }
        }
        for id in touchedResolves.sorted() {
            updateResolveQuestions(id, now: now)
            output.append(.event(.resolveChanged(id)))
        }
    }

    // MARK: Questions

    mutating func addQuestion(_ key: QuestionKey, now: MDNSInstant, delay: Int64) {
        if questions[key] != nil {
            questions[key]!.refs += 1
            return
        }
        questions[key] = QuestionState(refs: 1, next: now.adding(milliseconds: delay), interval: 1_000_000_000)
    }

    mutating func removeQuestion(_ key: QuestionKey) {
        guard let state = questions[key] else { return }
        if state.refs <= 1 { questions[key] = nil } else { questions[key]!.refs -= 1 }
    }

    mutating func updateResolveQuestions(_ id: Int, now: MDNSInstant) {
        guard var resolve = resolves[id] else { return }
        var wanted: Set<QuestionKey> = [
            QuestionKey(name: resolve.instance, type: DNSType.srv, filter: resolve.filter),
            QuestionKey(name: resolve.instance, type: DNSType.txt, filter: resolve.filter),
        ]
        for link in activeLinks(resolve.filter) {
            for entry in cache.records(on: link, name: resolve.instance, type: DNSType.srv) {
                if case .srv(_, _, _, let target) = entry.record.data {
                    wanted.insert(QuestionKey(name: target, type: DNSType.a, filter: resolve.filter))
                    wanted.insert(QuestionKey(name: target, type: DNSType.aaaa, filter: resolve.filter))
                }
            }
        }
        for key in wanted.subtracting(resolve.questions) {
            // Answered from the cache when possible; else asked at once.
            addQuestion(key, now: now, delay: 0)
        }
        for key in resolve.questions.subtracting(wanted) { removeQuestion(key) }
        resolve.questions = wanted
        resolves[id] = resolve
    }

    /// Cached records that answer a question on a link.
    func interestingRecords(_ key: QuestionKey, on link: LinkID) -> [CachedRecord] {
        cache.records(on: link, name: key.name, type: key.type)
    }

    /// Known answers for a question: cached answers with more than half their TTL left (§7.1).
    func knownAnswers(_ key: QuestionKey, on link: LinkID, now: MDNSInstant) -> [ResourceRecord] {
        interestingRecords(key, on: link).compactMap { entry in
            let remaining = entry.remainingTTL(at: now)
            guard remaining * 2 > entry.record.ttl else { return nil }
            var record = entry.record
            record.ttl = remaining
            record.cacheFlush = false
            return record
        }
    }

    mutating func sendDueQuestions(now: MDNSInstant) {
        let due = questions.filter { $0.value.next <= now }.map(\.key)
        guard !due.isEmpty else { return }
        var perLink: [LinkID: [QuestionKey]] = [:]
        for key in due {
            for link in activeLinks(key.filter) { perLink[link, default: []].append(key) }
            var state = questions[key]!
            state.next = now.adding(nanoseconds: state.interval)
            state.interval = min(state.interval * 2, Self.maxQueryInterval)
            questions[key] = state
        }
        for link in perLink.keys.sorted() {
            sendQuery(on: link, questions: perLink[link]!, now: now)
        }
    }

    mutating func sendDueRefreshes(now: MDNSInstant) {
        var perLink: [LinkID: [QuestionKey]] = [:]
        for key in questions.keys {
            for link in activeLinks(key.filter) {
                var asked = false
                for entry in interestingRecords(key, on: link) {
                    guard let at = entry.nextRefresh, at <= now else { continue }
                    cache.noteRefreshSent(entry)
                    if !asked {
                        perLink[link, default: []].append(key)
                        asked = true
                    }
                }
            }
        }
        for link in perLink.keys.sorted() { sendQuery(on: link, questions: perLink[link]!, now: now) }
    }

    /// A query with known answers; when they do not fit, TC is set and they continue in more packets.
    mutating func sendQuery(on link: LinkID, questions keys: [QuestionKey], now: MDNSInstant) {
        var unique: [DNSQuestion] = []
        var seen: Set<DNSQuestion> = []
        var known: [ResourceRecord] = []
        for key in keys {
            let question = DNSQuestion(name: key.name, type: key.type)
            guard seen.insert(question).inserted else { continue }
            unique.append(question)
            known += knownAnswers(key, on: link, now: now)
        }
        var packets: [MessageWriter] = []
        var writer = MessageWriter(id: 0, flags: 0, maxSize: configuration.maxPacketSize)
        for question in unique where !writer.add(question) {
            packets.append(writer)
            writer = MessageWriter(id: 0, flags: 0, maxSize: configuration.maxPacketSize)
            _ = writer.add(question)
        }
        for record in known where !writer.add(record, to: .answer) {
            packets.append(writer)
            writer = MessageWriter(id: 0, flags: 0, maxSize: configuration.maxPacketSize)
            _ = writer.add(record, to: .answer)
        }
        packets.append(writer)
        for (index, packet) in packets.enumerated() {
            var bytes = packet.finish()
            if index < packets.count - 1 { bytes[2] |= UInt8(DNSMessage.truncatedFlag >> 8) }
            emit(bytes, on: link, to: .multicast)
        }
    }
}
