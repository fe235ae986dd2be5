/// The responder half: probing, announcing, answering, conflicts (RFC 6762 §6–§9).
extension MDNSEngine {
    /// Three probes 250 ms apart (§8.1), announcements at 0, 1 and 3 s (Avahi's announce.c).
    static let probeCount = 3
    static let announcementDelays: [Int64] = [1000, 2000]
    /// Records we sent within this long are our own when they come back (multicast loopback).
    static let ownEchoWindow: Int64 = 5000

    enum ProbeItem: Hashable {
        case host
        case service(Int)
    }

    // MARK: Probing and announcing

    mutating func stepHost(now: MDNSInstant) {
        if case .probing(let sent, let next) = hostPhase, next <= now {
            if sent < Self.probeCount {
                dueProbes.append(.host)
                hostPhase = .probing(sent: sent + 1, next: now.adding(milliseconds: Self.probeInterval))
            } else {
                hostPhase = .announcing(sent: 0, next: now)
                output.append(.event(.hostNameEstablished(hostLabel)))
                for id in services.keys.sorted() where services[id]!.phase == .waitingForHost {
                    services[id]!.phase = .announcing(sent: 0, next: now)
                    output.append(.event(.publicationEstablished(id, name: services[id]!.label)))
                }
            }
        }
        if case .announcing(let sent, let next) = hostPhase, next <= now {
            for link in links.keys.sorted() {
                let records = hostRecords(on: link)
                sendResponse(on: link, answers: records, additionals: [], now: now)
            }
            hostPhase = nextAnnouncement(after: sent, now: now)
        }
    }

    mutating func stepService(_ id: Int, now: MDNSInstant) {
        guard var service = services[id] else { return }
        if case .probing(let sent, let next) = service.phase, next <= now {
            if sent < Self.probeCount {
                dueProbes.append(.service(id))
                service.phase = .probing(sent: sent + 1, next: now.adding(milliseconds: Self.probeInterval))
            } else if hostPhase.isLive {
                service.phase = .announcing(sent: 0, next: now)
                output.append(.event(.publicationEstablished(id, name: service.label)))
            } else {
                service.phase = .waitingForHost
            }
        }
        if case .announcing(let sent, let next) = service.phase, next <= now {
            service.announced = true
            for link in activeLinks(service.spec.links).sorted() {
                sendResponse(
                    on: link, answers: serviceRecords(service, on: link), additionals: hostRecords(on: link), now: now)
            }
            service.phase = nextAnnouncement(after: sent, now: now)
        }
        services[id] = service
    }

    func nextAnnouncement(after sent: Int, now: MDNSInstant) -> Phase {
        sent < Self.announcementDelays.count
            ? .announcing(sent: sent + 1, next: now.adding(milliseconds: Self.announcementDelays[sent])) : .established
    }

    /// The records a probe proposes for a name on a link (its unique records).
    func proposedRecords(_ item: ProbeItem, on link: LinkID) -> (name: DNSName, records: [ResourceRecord])? {
        switch item {
        case .host:
            return (hostDomainName, hostRecords(on: link))
        case .service(let id):
            guard let service = services[id], service.spec.links.matches(link) else { return nil }
            return (service.name, serviceRecords(service, on: link).filter { $0.cacheFlush })
        }
    }

    /// One probe packet per link for everything due: questions "name ANY", our proposed records
    /// in the authority section (§8.1, §8.2). Queries are QM: the port is shared, so a unicast
    /// answer might reach another socket.
    mutating func sendProbes(now: MDNSInstant) {
        guard !dueProbes.isEmpty else { return }
        let items = dueProbes
        dueProbes.removeAll()
        for link in links.keys.sorted() {
            var writer = MessageWriter(id: 0, flags: 0, maxSize: configuration.maxPacketSize)
            var authorities: [ResourceRecord] = []
            var any = false
            for item in items {
                guard let (name, records) = proposedRecords(item, on: link) else { continue }
                if writer.add(DNSQuestion(name: name, type: DNSType.any)) { any = true }
                authorities += records.map { record in
                    var record = record
                    record.cacheFlush = false
                    return record
                }
            }
            guard any else { continue }
            for record in authorities where !writer.add(record, to: .authority) { break }
            emit(writer.finish(), on: link, to: .multicast)
        }
    }

    // MARK: Queries

    mutating func handleQuery(_ message: DNSMessage, from source: MDNSSource, now: MDNSInstant) {
        let link = source.link
        if !message.authorities.isEmpty { breakTies(message.authorities, on: link, now: now) }
        let known = message.answers
        guard !message.questions.isEmpty else {
            // The rest of a truncated query's known answers (§7.2).
            suppressPending(on: link, by: known, halfTTL: true)
            return
        }
        let legacy = source.port != mdnsPort
        let live = liveRecords(on: link)
        var multicast: [ResourceRecord] = []
        var unicast: [ResourceRecord] = []
        var isProbe = false
        for question in message.questions {
            var answers = live.filter { question.isAnswered(by: $0) }
            // Known-answer suppression (§7.1): they hold it with at least half our TTL.
            answers.removeAll { ours in
                known.contains { $0.sameRecord(as: ours) && UInt64($0.ttl) * 2 >= UInt64(ours.ttl) }
            }
            guard !answers.isEmpty else { continue }
            counters.queriesAnswered += 1
            if legacy {
                unicast += answers
                continue
            }
            if message.authorities.contains(where: { $0.name == question.name }) { isProbe = true }
            // QU (§5.4): unicast only what was multicast here within a quarter of its TTL.
            if question.unicastResponse,
                answers.allSatisfy({ wasMulticast($0, on: link, within: Int64($0.ttl) * 250, now: now) })
            {
                unicast += answers
            } else {
                multicast += answers
            }
        }
        if legacy, !unicast.isEmpty {
            // Legacy unicast (§6.7): same id, the question repeated, TTL at most 10 s, no cache-flush bit.
            func legacyForm(_ record: ResourceRecord) -> ResourceRecord {
                var record = record
                record.ttl = min(record.ttl, 10)
                record.cacheFlush = false
                return record
            }
            sendResponse(
                on: link, answers: unique(unicast).map(legacyForm),
                additionals: additionalRecords(for: unicast, on: link).map(legacyForm), now: now, noteMulticast: false,
                destination: .unicast(address: source.address, port: source.port), id: message.id,
                questions: message.questions)
            return
        }
        if !unicast.isEmpty {
            sendResponse(
                on: link, answers: unique(unicast), additionals: additionalRecords(for: unicast, on: link), now: now,
                destination: .unicast(address: source.address, port: source.port))
        }
        guard !multicast.isEmpty else { return }
        // Unique answers and probe defence at once; shared answers after 20–120 ms (§6); a
        // truncated query after 400–500 ms, so its remaining known answers can arrive (§7.2).
        let allUnique = multicast.allSatisfy(\.cacheFlush)
        let delay: Int64 =
            message.isTruncated ? jitter(400...500) : (isProbe || allUnique) ? 0 : jitter(20...120)
        for record in multicast {
            var due = now.adding(milliseconds: delay)
            // At most once a second per record and link; 250 ms when defending against a probe (§6).
            if let last = lastMulticast[link]?[RecordKey(record)] {
                due = max(due, last.adding(milliseconds: isProbe ? 250 : 1000))
            }
            schedule(record, on: link, due: due)
        }
    }

    func wasMulticast(_ record: ResourceRecord, on link: LinkID, within milliseconds: Int64, now: MDNSInstant) -> Bool {
        guard let last = lastMulticast[link]?[RecordKey(record)] else { return false }
        return now.milliseconds(since: last) <= milliseconds
    }

    mutating func schedule(_ record: ResourceRecord, on link: LinkID, due: MDNSInstant) {
        var answers = pending[link] ?? []
        if let index = answers.firstIndex(where: { $0.record.sameRecord(as: record) }) {
            answers[index].due = min(answers[index].due, due)
        } else {
            answers.append(PendingAnswer(record: record, due: due))
        }
        pending[link] = answers
    }

    /// Drops pending answers that another responder (or the querier's known answers) already gave:
    /// duplicate-answer suppression (§7.4) needs their TTL ≥ ours, known answers ≥ half ours.
    mutating func suppressPending(on link: LinkID, by records: [ResourceRecord], halfTTL: Bool) {
        guard var answers = pending[link], !answers.isEmpty, !records.isEmpty else { return }
        answers.removeAll { answer in
            records.contains {
                $0.sameRecord(as: answer.record)
                    && UInt64($0.ttl) * (halfTTL ? 2 : 1) >= UInt64(answer.record.ttl)
            }
        }
        pending[link] = answers
    }

    mutating func sendDueAnswers(now: MDNSInstant) {
        for link in pending.keys.sorted() {
            guard let answers = pending[link], answers.contains(where: { $0.due <= now }) else { continue }
            pending[link] = answers.filter { $0.due > now }
            let live = Set(liveRecords(on: link).map(RecordKey.init))
            let due = unique(answers.filter { $0.due <= now }.map(\.record)).filter { live.contains(RecordKey($0)) }
            sendResponse(on: link, answers: due, additionals: additionalRecords(for: due, on: link), now: now)
        }
    }

    func unique(_ records: [ResourceRecord]) -> [ResourceRecord] {
        var seen: Set<RecordKey> = []
        return records.filter { seen.insert(RecordKey($0)).inserted }
    }

    /// What a querier will want next (RFC 6763 §12): SRV + TXT + addresses with a PTR answer,
    /// addresses with an SRV answer, the other address family with an address (RFC 6762 §6.2).
    func additionalRecords(for answers: [ResourceRecord], on link: LinkID) -> [ResourceRecord] {
        let live = liveRecords(on: link)
        var out: [ResourceRecord] = []
        func addresses(of host: DNSName) -> [ResourceRecord] {
            live.filter { $0.name == host && ($0.type == DNSType.a || $0.type == DNSType.aaaa) }
        }
        for answer in answers {
            switch answer.data {
            case .ptr(let instance) where answer.name != DNSName.serviceTypeEnumeration:
                let records = live.filter { $0.name == instance && ($0.type == DNSType.srv || $0.type == DNSType.txt) }
                out += records
                for record in records {
                    if case .srv(_, _, _, let target) = record.data { out += addresses(of: target) }
                }
            case .srv(_, _, _, let target):
                out += addresses(of: target)
            case .a, .aaaa:
                out += addresses(of: answer.name)
            default:
                break
            }
        }
        let answered = Set(answers.map(RecordKey.init))
        return unique(out).filter { !answered.contains(RecordKey($0)) }
    }

    // MARK: Conflicts

    /// Simultaneous probes (§8.2): the lexicographically later record set wins; the loser waits a
    /// second and probes again. Our own probe, looped back, compares equal and changes nothing.
    mutating func breakTies(_ authorities: [ResourceRecord], on link: LinkID, now: MDNSInstant) {
        let names = Set(authorities.map(\.name))
        for name in names {
            let theirs = authorities.filter { $0.name == name }
            if hostPhase.isProbing, name == hostDomainName {
                let ours = hostRecords(on: link)
                if !ours.isEmpty, Self.compareForTieBreak(ours, theirs) < 0 {
                    hostPhase = .probing(sent: 0, next: now.adding(milliseconds: 1000))
                }
            }
            for id in services.keys.sorted() where services[id]!.phase.isProbing && services[id]!.name == name {
                guard let (_, ours) = proposedRecords(.service(id), on: link), !ours.isEmpty else { continue }
                if Self.compareForTieBreak(ours, theirs) < 0 {
                    services[id]!.phase = .probing(sent: 0, next: now.adding(milliseconds: 1000))
                }
            }
        }
    }

    /// Negative when `ours` sorts before `theirs` (we lose), zero when identical (§8.2).
    static func compareForTieBreak(_ ours: [ResourceRecord], _ theirs: [ResourceRecord]) -> Int {
        func key(_ record: ResourceRecord) -> [UInt8] {
            [
                UInt8(record.recordClass >> 8), UInt8(record.recordClass & 0xff), UInt8(record.type >> 8),
                UInt8(record.type & 0xff),
            ] + record.data.canonicalBytes
        }
        let a = Set(ours.map(key)).sorted(by: { $0.lexicographicallyPrecedes($1) })
        let b = Set(theirs.map(key)).sorted(by: { $0.lexicographicallyPrecedes($1) })
        for (x, y) in zip(a, b) where x != y {
            return x.lexicographicallyPrecedes(y) ? -1 : 1
        }
        return a.count - b.count
    }

    /// A response record for a name we claim, with data we do not have, is a conflict (§9):
    /// while probing any such record; once live, one of the types we own. Records we sent in the
    /// last seconds (our own packets looped back, an older TXT) and goodbyes are not claims.
    mutating func checkConflict(_ record: ResourceRecord, on link: LinkID, fromLocal: Bool, now: MDNSInstant) {
        guard record.ttl > 0 else { return }
        // Another stack on this very host (a second process, avahi-daemon) claiming our host name
        // describes the same host, perhaps with other interfaces: not a conflict for a host name.
        if record.name == hostDomainName, hostPhase != .waitingForHost, !fromLocal {
            let ours = links.keys.flatMap { hostRecords(on: $0) }
            let relevant = hostPhase.isProbing || record.type == DNSType.a || record.type == DNSType.aaaa
            if relevant, !ours.contains(where: { $0.sameRecord(as: record) }), !isOwnEcho(record, on: link, now: now) {
                hostConflict(now: now)
            }
        }
        for id in services.keys.sorted() {
            guard let service = services[id], service.name == record.name, service.phase != .waitingForHost else {
                continue
            }
            let ours = links.keys.flatMap { serviceRecords(service, on: $0) }
            let relevant = service.phase.isProbing || record.type == DNSType.srv || record.type == DNSType.txt
            if relevant, !ours.contains(where: { $0.sameRecord(as: record) }), !isOwnEcho(record, on: link, now: now) {
                serviceConflict(id, now: now)
            }
        }
    }

    func isOwnEcho(_ record: ResourceRecord, on link: LinkID, now: MDNSInstant) -> Bool {
        wasMulticast(record, on: link, within: Self.ownEchoWindow, now: now)
    }

    /// When to probe again after a conflict: at once, but 5 s later after 15 conflicts in 10 s (§8.1).
    mutating func probeAgainAfterConflict(_ history: inout [MDNSInstant], now: MDNSInstant) -> MDNSInstant {
        history.append(now)
        history.removeAll { now.milliseconds(since: $0) > 10_000 }
        return now.adding(milliseconds: history.count >= 15 ? 5000 : jitter(0...250))
    }

    mutating func hostConflict(now: MDNSInstant) {
        counters.conflicts += 1
        let old = hostLabel
        let oldName = hostDomainName
        hostLabel = alternativeName(for: old, isHost: true)
        output.append(.event(.hostNameRenamed(from: old, to: hostLabel)))
        // Our own records under the old name, cached when they looped back, are stale now: a
        // resolve of whoever owns that name must not find our addresses with theirs.
        apply(cache.removeLocal(name: oldName), now: now)
        var history = hostConflicts
        hostPhase = .probing(sent: 0, next: probeAgainAfterConflict(&history, now: now))
        hostConflicts = history
        for link in pending.keys { pending[link]!.removeAll { $0.record.name == oldName } }
        // Services wait for the new host name, then announce SRV records pointing at it.
        for id in services.keys where services[id]!.phase.isLive { services[id]!.phase = .waitingForHost }
    }

    mutating func serviceConflict(_ id: Int, now: MDNSInstant) {
        guard var service = services[id] else { return }
        counters.conflicts += 1
        let old = service.label
        let oldName = service.name
        service.label = alternativeName(for: old, isHost: false)
        service.announced = false  // the old name is someone else's now: no goodbyes for it
        var history = service.conflicts
        service.phase = .probing(sent: 0, next: probeAgainAfterConflict(&history, now: now))
        service.conflicts = history
        services[id] = service
        output.append(.event(.publicationRenamed(id, from: old, to: service.label)))
        for link in pending.keys { pending[link]!.removeAll { $0.record.name == oldName } }
    }

    // MARK: Responses

    mutating func handleResponse(_ message: DNSMessage, from source: MDNSSource, now: MDNSInstant) {
        let link = source.link
        let records = message.answers + message.additionals
        for record in records { checkConflict(record, on: link, fromLocal: source.isLocal, now: now) }
        suppressPending(on: link, by: message.answers, halfTTL: false)
        var changes: [RecordCache.Change] = []
        for record in records where record.recordClass == dnsClassIN {
            changes += cache.insert(
                record, link: link, isLocal: source.isLocal, now: now, jitterPermille: Int(jitter(0...20)))
        }
        apply(changes, now: now)
    }
}
