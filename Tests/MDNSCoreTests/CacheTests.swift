import Testing

@testable import MDNSCore

/// The record cache: TTLs, goodbyes, cache flush, refresh points, and its bounds.
struct CacheTests {
    let link = LinkID(interfaceIndex: 2, family: .v4)
    let t0 = MDNSInstant(nanoseconds: 5_000_000_000)
    let host = DNSName.make("bravo.local")

    func a(_ last: UInt8, ttl: UInt32 = 120, flush: Bool = false) -> ResourceRecord {
        ResourceRecord(name: host, data: .a([10, 0, 0, last]), ttl: ttl, cacheFlush: flush)
    }

    @Test func recordsExpireAtTheirTTLAndRenewalsExtendThem() {
        var cache = RecordCache()
        #expect(cache.insert(a(1), link: link, isLocal: false, now: t0, jitterPermille: 0).count == 1)
        #expect(
            cache.insert(a(1), link: link, isLocal: false, now: t0.adding(milliseconds: 60_000), jitterPermille: 0)
                .isEmpty)
        #expect(cache.expire(now: t0.adding(milliseconds: 179_999)).isEmpty)
        #expect(cache.nextExpiry() == t0.adding(milliseconds: 180_000))
        let removed = cache.expire(now: t0.adding(milliseconds: 180_000))
        #expect(removed.count == 1 && cache.count == 0)
    }

    @Test func goodbyeRemovesAfterOneSecond() {
        var cache = RecordCache()
        _ = cache.insert(a(1), link: link, isLocal: false, now: t0, jitterPermille: 0)
        _ = cache.insert(a(1, ttl: 0), link: link, isLocal: false, now: t0.adding(milliseconds: 10), jitterPermille: 0)
        #expect(cache.expire(now: t0.adding(milliseconds: 1009)).isEmpty)
        #expect(cache.expire(now: t0.adding(milliseconds: 1010)).count == 1)
        // A goodbye for something not cached adds nothing.
        #expect(cache.insert(a(2, ttl: 0), link: link, isLocal: false, now: t0, jitterPermille: 0).isEmpty)
        #expect(cache.count == 0)
    }

    @Test func cacheFlushRetiresOlderDataOfTheSameNameAndType() {
        var cache = RecordCache()
        _ = cache.insert(a(1), link: link, isLocal: false, now: t0, jitterPermille: 0)
        _ = cache.insert(a(2), link: link, isLocal: false, now: t0, jitterPermille: 0)
        // 2 s later a cache-flush A record with other data: both old ones go 1 s later.
        let later = t0.adding(milliseconds: 2000)
        _ = cache.insert(a(3, flush: true), link: link, isLocal: false, now: later, jitterPermille: 0)
        let removed = cache.expire(now: later.adding(milliseconds: 1000))
        let removedData: [RecordData] = removed.map { change -> RecordData in
            if case .removed(let entry) = change { return entry.record.data }
            return .a([])
        }
        #expect(Set(removedData) == [.a([10, 0, 0, 1]), .a([10, 0, 0, 2])])
        #expect(cache.records(on: link, name: host, type: DNSType.a).map(\.record.data) == [.a([10, 0, 0, 3])])
        // Records heard within the last second (a burst of one responder) are not flushed.
        _ = cache.insert(
            a(4, flush: true), link: link, isLocal: false, now: later.adding(milliseconds: 500), jitterPermille: 0)
        #expect(cache.expire(now: later.adding(milliseconds: 5000)).isEmpty)
        #expect(cache.count == 2)
    }

    @Test func refreshPointsAreAt80To95PercentOfTheTTL() {
        var cache = RecordCache()
        _ = cache.insert(a(1, ttl: 100), link: link, isLocal: false, now: t0, jitterPermille: 10)
        var entry = cache.records(on: link, name: host, type: DNSType.a)[0]
        var points: [Int64] = []
        while let at = entry.nextRefresh {
            points.append(at.milliseconds(since: t0))
            cache.noteRefreshSent(entry)
            entry = cache.records(on: link, name: host, type: DNSType.a)[0]
        }
        #expect(points == [81_000, 86_000, 91_000, 96_000])
    }

    @Test func aFloodOfDistinctRecordsStaysWithinTheCapacity() {
        var cache = RecordCache(capacity: 512, maxPerSet: 64)
        let type = DNSName.make("_flood._tcp.local")
        var now = t0
        for index in 0..<20_000 {
            now = now.adding(milliseconds: 1)
            let instance = DNSName(instance: "x\(index)", service: type)!
            // Half into one set (bounded per set), half under distinct names.
            let name = index % 2 == 0 ? type : DNSName(instance: "n\(index)", service: type)!
            _ = cache.insert(
                ResourceRecord(name: name, data: .ptr(instance), ttl: 4500), link: link, isLocal: false, now: now,
                jitterPermille: 0)
            #expect(cache.count <= 512)
        }
        #expect(cache.records(on: link, name: type, type: DNSType.ptr).count <= 64)
        #expect(cache.evictions >= 20_000 - 512)
        #expect(cache.all.count == cache.count)
    }
}
