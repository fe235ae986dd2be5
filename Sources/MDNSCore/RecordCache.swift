/// A record heard on a link, with its timing.
public struct CachedRecord: Hashable, Sendable {
    /// The record as received (its TTL is the original one).
    public var record: ResourceRecord
    public var link: LinkID
    public var received: MDNSInstant
    public var expiry: MDNSInstant
    /// Whether it came from one of this host's own addresses.
    public var isLocal: Bool
    /// Refresh queries sent for it since it was last received (0...4, at 80/85/90/95 % of its TTL).
    public var refreshesSent: Int
    /// Per-record jitter of the refresh points, 0...20 ‰ of the TTL (RFC 6762 §5.2: 2 %).
    var jitterPermille: Int

    /// When the next refresh query is due, nil after the fourth (RFC 6762 §5.2).
    public var nextRefresh: MDNSInstant? {
        guard refreshesSent < 4, record.ttl > 0 else { return nil }
        let permille = UInt64(800 + 50 * refreshesSent + jitterPermille)
        return received.adding(nanoseconds: UInt64(record.ttl) * 1_000_000 * permille)
    }

    /// Seconds of TTL left at `now`.
    public func remainingTTL(at now: MDNSInstant) -> UInt32 {
        guard expiry > now else { return 0 }
        return UInt32(min(UInt64(UInt32.max), (expiry.nanoseconds - now.nanoseconds) / 1_000_000_000))
    }
}

/// The records heard from the network, per link, bounded in size.
///
/// RFC 6762 §10: a record lives for its TTL; a goodbye (TTL 0) or a cache-flush announcement of
/// other data ends it one second later; re-receiving it renews it. The cache holds at most
/// `capacity` records and `maxPerSet` per (link, name, type): a responder flooding answers
/// evicts the records closest to expiry (counted in ``evictions``), it cannot grow memory.
public struct RecordCache: Sendable {
    struct Key: Hashable {
        var link: LinkID
        var name: DNSName
        var type: UInt16
    }

    public enum Change: Hashable, Sendable {
        case added(CachedRecord)
        case removed(CachedRecord)
    }

    public let capacity: Int
    public let maxPerSet: Int
    private var sets: [Key: [CachedRecord]] = [:]
    public private(set) var count = 0
    /// Records dropped to stay within the bounds.
    public private(set) var evictions = 0
    private var cachedEarliest: MDNSInstant?
    private var earliestIsValid = true

    public init(capacity: Int = 4096, maxPerSet: Int = 256) {
        self.capacity = max(1, capacity)
        self.maxPerSet = max(1, min(maxPerSet, capacity))
    }

    /// Records of one name and type on one link.
    public func records(on link: LinkID, name: DNSName, type: UInt16) -> [CachedRecord] {
        sets[Key(link: link, name: name, type: type)] ?? []
    }

    /// Every cached record (tests and diagnostics).
    public var all: [CachedRecord] { sets.values.flatMap { $0 } }

    /// Adds or renews a record heard at `now`. Returns what appeared or went.
    public mutating func insert(
        _ record: ResourceRecord, link: LinkID, isLocal: Bool, now: MDNSInstant, jitterPermille: Int
    ) -> [Change] {
        let key = Key(link: link, name: record.name, type: record.type)
        var set = sets[key] ?? []
        let oneSecondLater = now.adding(milliseconds: 1000)
        if record.ttl == 0 {
            // Goodbye: gone in one second (RFC 6762 §10.1).
            if let index = set.firstIndex(where: { $0.record.sameRecord(as: record) }) {
                set[index].expiry = min(set[index].expiry, oneSecondLater)
                set[index].refreshesSent = 4
                sets[key] = set
                earliestIsValid = false
            }
            return []
        }
        if record.cacheFlush {
            // Cache flush: other data of this name and type heard over a second ago goes (§10.2).
            for index in set.indices
            where !set[index].record.sameRecord(as: record)
                && set[index].received < now.adding(milliseconds: -1000) && set[index].expiry > oneSecondLater
            {
                set[index].expiry = oneSecondLater
                set[index].refreshesSent = 4
                earliestIsValid = false
            }
        }
        let expiry = now.adding(milliseconds: Int64(record.ttl) * 1000)
        if let index = set.firstIndex(where: { $0.record.sameRecord(as: record) }) {
            set[index].record = record
            set[index].received = now
            set[index].expiry = expiry
            set[index].isLocal = isLocal
            set[index].refreshesSent = 0
            sets[key] = set
            earliestIsValid = false
            return []
        }
        var changes: [Change] = []
        if set.count >= maxPerSet, let oldest = set.indices.min(by: { set[$0].received < set[$1].received }) {
            changes.append(.removed(set.remove(at: oldest)))
            count -= 1
            evictions += 1
            earliestIsValid = false
        }
        let entry = CachedRecord(
            record: record, link: link, received: now, expiry: expiry, isLocal: isLocal, refreshesSent: 0,
            jitterPermille: jitterPermille)
        set.append(entry)
        sets[key] = set
        count += 1
        if earliestIsValid { cachedEarliest = min(cachedEarliest ?? expiry, expiry) }
        changes.append(.added(entry))
        if count > capacity { changes += makeRoom(now: now, keep: key) }
        return changes
    }

    /// Drops the records nearest to expiry (an eighth of the capacity at once, so that a flood
    /// costs one sort per `capacity / 8` records, not one scan per record).
    private mutating func makeRoom(now: MDNSInstant, keep: Key) -> [Change] {
        var changes = expire(now: now)
        guard count > capacity else { return changes }
        var candidates: [(expiry: MDNSInstant, key: Key, received: MDNSInstant)] = []
        candidates.reserveCapacity(count)
        for (key, set) in sets {
            for entry in set { candidates.append((entry.expiry, key, entry.received)) }
        }
        candidates.sort { $0.expiry < $1.expiry }
        let target = capacity - max(1, capacity / 8)
        var index = 0
        while count > target, index < candidates.count {
            let victim = candidates[index]
            index += 1
            guard var set = sets[victim.key],
                let position = set.firstIndex(where: { $0.expiry == victim.expiry && $0.received == victim.received })
            else { continue }
            changes.append(.removed(set.remove(at: position)))
            sets[victim.key] = set.isEmpty ? nil : set
            count -= 1
            evictions += 1
        }
        earliestIsValid = false
        return changes
    }

    /// Removes every record whose time is up.
    public mutating func expire(now: MDNSInstant) -> [Change] {
        if earliestIsValid, let earliest = cachedEarliest, earliest > now { return [] }
        if earliestIsValid, cachedEarliest == nil { return [] }
        var changes: [Change] = []
        var earliest: MDNSInstant?
        for (key, set) in sets {
            var kept = set
            kept.removeAll { entry in
                if entry.expiry <= now {
                    changes.append(.removed(entry))
                    return true
                }
                return false
            }
            for entry in kept { earliest = min(earliest ?? entry.expiry, entry.expiry) }
            if kept.count != set.count { sets[key] = kept.isEmpty ? nil : kept }
        }
        count -= changes.count
        cachedEarliest = earliest
        earliestIsValid = true
        return changes
    }

    /// Forgets a link (its interface went away).
    public mutating func remove(link: LinkID) -> [Change] {
        var changes: [Change] = []
        for (key, set) in sets where key.link == link {
            changes += set.map { .removed($0) }
            sets[key] = nil
        }
        count -= changes.count
        earliestIsValid = false
        return changes
    }

    /// Forgets the records of one name that came from this host (our own, looped back): after our
    /// host name changed they describe a name that is no longer ours.
    public mutating func removeLocal(name: DNSName) -> [Change] {
        var changes: [Change] = []
        for (key, set) in sets where key.name == name {
            let kept = set.filter { !$0.isLocal }
            changes += set.filter(\.isLocal).map { .removed($0) }
            sets[key] = kept.isEmpty ? nil : kept
        }
        count -= changes.count
        earliestIsValid = false
        return changes
    }

    /// The earliest expiry, or nil when empty.
    public mutating func nextExpiry() -> MDNSInstant? {
        if !earliestIsValid {
            var earliest: MDNSInstant?
            for set in sets.values { for entry in set { earliest = min(earliest ?? entry.expiry, entry.expiry) } }
            cachedEarliest = earliest
            earliestIsValid = true
        }
        return cachedEarliest
    }

    /// Records that a refresh query for this record was sent.
    public mutating func noteRefreshSent(_ entry: CachedRecord) {
        let key = Key(link: entry.link, name: entry.record.name, type: entry.record.type)
        guard var set = sets[key], let index = set.firstIndex(where: { $0.record.sameRecord(as: entry.record) }) else {
            return
        }
        set[index].refreshesSent += 1
        sets[key] = set
    }
}
