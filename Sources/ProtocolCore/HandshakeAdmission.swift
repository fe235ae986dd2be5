/// Which accepted connections may start a handshake now (no I/O, no clock: the caller passes the
/// time in uptime nanoseconds).
///
/// A version-2 handshake costs the server three X25519 operations before it knows who is talking,
/// and an attacker pays only 42 bytes for each. Four bounds keep that work from taking the loops
/// that serve established connections, each checked before any key agreement:
/// - connections **in their handshake at once**, in all and per source;
/// - handshakes **started per second**, in all and per source (token buckets holding one second's
///   worth, so a burst up to the rate passes at once).
///
/// A *source* is an IPv4 address, or an IPv6 /64 (one host usually owns a whole /64, so counting
/// its addresses one by one would let it multiply its share by 2^64). TCP's own handshake proves
/// that a source can receive at its address before the server sees the connection, so a source
/// cannot be spoofed here: the role that cookies play for WireGuard's UDP.
///
/// A source refused ``Limits/blockAfterRefusals`` times within a second is flooding: the verdict says
/// so, and the caller blocks it (``block(_:now:base:)``: the kernel drops its attempts). A source
/// blocked before is *on probation* until it has been quiet for twice its last block after that
/// ended: no burst when its block ends (its bucket starts empty) and blocked again at a sixteenth of
/// the threshold, so that a flood that outlasts its block reaches the server for milliseconds, not
/// for the quarter of a second the first detection takes.
///
/// Memory stays bounded under a flood from many sources: a source's entry lives while it has
/// handshakes in flight or its bucket is not full again, and past ``maxTrackedSources`` new
/// sources are refused.
package struct HandshakeAdmission: Sendable {
    package struct Limits: Sendable, Equatable {
        /// Connections in their handshake at once, in all and from one source.
        package var inFlight: Int
        package var inFlightPerSource: Int
        /// Handshakes started per second, in all and from one source; nil: no rate bound.
        package var perSecond: Int?
        package var perSecondPerSource: Int?
        /// A source refused this many times within one second is flooding: the verdict says to
        /// block it (``Verdict/busy(reason:retryAfterMilliseconds:block:)``). nil: never.
        package var blockAfterRefusals: Int?

        package init(
            inFlight: Int, inFlightPerSource: Int, perSecond: Int?, perSecondPerSource: Int?, blockAfterRefusals: Int? = nil
        ) {
            self.inFlight = inFlight
            self.inFlightPerSource = inFlightPerSource
            self.perSecond = perSecond
            self.perSecondPerSource = perSecondPerSource
            self.blockAfterRefusals = blockAfterRefusals
        }
    }

    /// Where a connection comes from, as the bounds count it: an IPv4 address or an IPv6 /64
    /// (an IPv4-mapped IPv6 address counts as its IPv4 address).
    package enum Source: Hashable, Sendable, CustomStringConvertible {
        case ipv4(UInt32)  // network byte order, as in SocketAddress
        case ipv6Prefix(UInt64)  // the first 8 bytes, big-endian
        case unknown

        package init(_ address: SocketAddress?) {
            switch address?.storage {
            case .v4(let a, _)?:
                self = .ipv4(a)
            case .v6(let bytes, _, _)? where bytes.count == 16:
                if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF {
                    // ::ffff:a.b.c.d (a dual-stack socket's IPv4 peer): its IPv4 address, in network order.
                    self = .ipv4(bytes[12..<16].withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) })
                } else {
                    self = .ipv6Prefix(bytes[0..<8].reduce(0) { $0 << 8 | UInt64($1) })
                }
            default:
                self = .unknown
            }
        }

        /// `"192.0.2.1"`, `"2001:db8:0:1::/64"`.
        package var description: String {
            switch self {
            case .ipv4(let a):
                return withUnsafeBytes(of: a) { $0.map { String($0) }.joined(separator: ".") }
            case .ipv6Prefix(let p):
                let groups = (0..<4).map { String((p >> (48 - 16 * UInt64($0))) & 0xFFFF, radix: 16) }
                return groups.joined(separator: ":") + "::/64"
            case .unknown:
                return "?"
            }
        }
    }

    package enum Verdict: Sendable, Equatable {
        case admitted
        /// Over a bound: refuse before any handshake work. `reason` names the bound; the client
        /// may try again after `retryAfterMilliseconds`. `block`: this refusal made the source's
        /// count in this second reach ``Limits/blockAfterRefusals`` (said once per second).
        case busy(reason: String, retryAfterMilliseconds: Int, block: Bool = false)
    }

    /// A token bucket holding at most one second's worth of `rate` tokens.
    private struct Bucket: Sendable {
        var tokens: Double
        var updated: UInt64

        init(rate: Int, now: UInt64) {
            tokens = Double(rate)
            updated = now
        }

        init(tokens: Double, updated: UInt64) {
            self.tokens = tokens
            self.updated = updated
        }

        mutating func refill(rate: Int, now: UInt64) {
            guard now > updated else { return }
            tokens = min(Double(rate), tokens + Double(now - updated) * Double(rate) / 1e9)
            updated = now
        }

        /// Milliseconds until one token is there.
        func wait(rate: Int) -> Int { Int(((1 - tokens) * 1000 / Double(rate)).rounded(.up)) }
    }

    /// A source's last block: how long it was and when it ends (uptime nanoseconds).
    private struct Block: Sendable {
        var duration: UInt64
        var until: UInt64
        /// Still remembered: the source floods again within twice its block after it ended.
        func onProbation(now: UInt64) -> Bool { now < until &+ 2 &* duration }
    }

    private struct Entry: Sendable {
        var inFlight = 0
        var bucket: Bucket?
        /// Refusals this second; counted only with a block threshold.
        var refused = PerSecondCount()
    }

    /// More sources than this with an entry: new ones are refused (an attacker spraying sources
    /// cannot grow the table without bound; the total rate bounds their work anyway).
    package static let maxTrackedSources = 16_384
    /// The shortest retry hint: a handshake takes a few milliseconds on a LAN, a retry sooner
    /// would most likely meet the same bound.
    package static let minimumRetryMilliseconds = 100
    /// A source on probation (blocked before, see above) is blocked again at this fraction of
    /// ``Limits/blockAfterRefusals``.
    package static let probationDivisor = 16
    /// A block is at most this many times the first (it doubles while the flood comes back).
    package static let longestBlockFactor: UInt64 = 32

    package let limits: Limits
    private var total: Bucket?
    private var sources: [Source: Entry] = [:]
    /// Prune finished entries when the table grows past this (doubles with what stays).
    private var pruneAt = 1_024
    /// With the table full: no pruning before then (uptime nanoseconds).
    private var noPruneBefore: UInt64 = 0
    /// Sources blocked for flooding, remembered while on probation.
    private var blocks: [Source: Block] = [:]
    /// Connections in their handshake now, and the most there ever were at once.
    package private(set) var inFlight = 0
    package private(set) var highWater = 0

    package init(limits: Limits, now: UInt64) {
        self.limits = limits
        total = limits.perSecond.map { Bucket(rate: $0, now: now) }
    }

    /// Sources with an entry now (tests: the table stays bounded).
    package var trackedSources: Int { sources.count }

    /// Admits a connection from `source` (its handshake starts; call ``ended(_:)`` when it is done
    /// or failed) or says which bound it is over.
    package mutating func admit(_ source: Source, now: UInt64) -> Verdict {
        let entry = sources[source]
        if inFlight >= limits.inFlight {
            return refuse(
                source, entry, now, "\(inFlight) connections are in their handshake, the most this server takes at once")
        }
        if entry == nil && sources.count >= pruneAt {
            if now >= noPruneBefore { prune(now: now) }
            if sources.count >= Self.maxTrackedSources {
                // Pruning again for every new source would cost a scan of the table each:
                // new sources wait a moment instead.
                noPruneBefore = now &+ 100_000_000
                return busy("\(sources.count) sources are starting handshakes, the most this server tracks")
            }
        }
        var current = entry ?? Entry()
        if current.inFlight >= limits.inFlightPerSource {
            return refuse(
                source, current, now,
                "\(current.inFlight) connections from \(source) are in their handshake, the most this server takes from one source")
        }
        if let rate = limits.perSecondPerSource {
            var bucket = current.bucket ?? Bucket(rate: rate, now: now)
            bucket.refill(rate: rate, now: now)
            current.bucket = bucket
            if bucket.tokens < 1 {
                return refuse(
                    source, current, now,
                    "\(source) started \(rate) handshakes in the last second, the most this server takes from one source",
                    after: bucket.wait(rate: rate))
            }
        }
        if let rate = limits.perSecond, var bucket = total {
            bucket.refill(rate: rate, now: now)
            total = bucket
            if bucket.tokens < 1 {
                return refuse(
                    source, current, now, "\(rate) handshakes started in the last second, the most this server takes",
                    after: bucket.wait(rate: rate))
            }
            total?.tokens -= 1
        }
        current.bucket?.tokens -= 1
        current.inFlight += 1
        sources[source] = current
        inFlight += 1
        highWater = max(highWater, inFlight)
        return .admitted
    }

    /// A refusal of `source`: counted toward its block threshold when there is one (its entry
    /// kept for that, and for a bucket the check above refilled) and its block is not in force.
    /// While it is, what still arrives was accepted before the kernel began dropping its attempts
    /// (a backlog a slow server may take more than a second to drain): counting it would block
    /// the source again, twice as long, for attempts it made before its block.
    private mutating func refuse(
        _ source: Source, _ entry: Entry?, _ now: UInt64, _ reason: String, after milliseconds: Int = 0
    ) -> Verdict {
        var block = false
        if var entry = entry ?? (limits.blockAfterRefusals != nil ? Entry() : nil) {
            if let threshold = blockThreshold(for: source, now: now), !isBlocked(source, now: now) {
                block = entry.refused.add(now: now) == threshold
            }
            sources[source] = entry
        }
        return .busy(
            reason: reason, retryAfterMilliseconds: max(milliseconds, Self.minimumRetryMilliseconds), block: block)
    }

    /// `source` was found flooding (a verdict's `block`): how long to block it, in nanoseconds.
    /// `base` the first time; doubled (up to ``longestBlockFactor`` times `base`) when it was on
    /// probation, so a flood that never stops reaches the server for moments in minutes. Its bucket
    /// is emptied as of the block's end: no burst of handshakes when the block ends.
    package mutating func block(_ source: Source, now: UInt64, base: UInt64) -> UInt64 {
        var duration = base
        if let last = blocks[source], last.onProbation(now: now) {
            duration = min(last.duration &* 2, base &* Self.longestBlockFactor)
        }
        let until = now &+ duration
        blocks[source] = Block(duration: duration, until: until)
        if blocks.count > 256 {  // forget the sources that have been quiet long enough
            blocks = blocks.filter { $0.value.onProbation(now: now) }
        }
        if limits.perSecondPerSource != nil {
            var entry = sources[source] ?? Entry()
            entry.bucket = Bucket(tokens: 0, updated: until)
            sources[source] = entry
        }
        return duration
    }

    /// The refusals within one second that make `source` a flooder now: ``Limits/blockAfterRefusals``,
    /// or a sixteenth of it while the source is on probation; nil: never blocked.
    package func blockThreshold(for source: Source, now: UInt64) -> Int? {
        guard let threshold = limits.blockAfterRefusals else { return nil }
        return isOnProbation(source, now: now) ? max(1, threshold / Self.probationDivisor) : threshold
    }

    /// Whether `source`'s block is in force at `now` (the listener drops its attempts).
    package func isBlocked(_ source: Source, now: UInt64) -> Bool { blocks[source].map { now < $0.until } ?? false }

    /// Whether `source` was blocked for flooding and is on probation now (tests, metrics).
    package func isOnProbation(_ source: Source, now: UInt64) -> Bool {
        blocks[source]?.onProbation(now: now) ?? false
    }

    /// A handshake admitted from `source` ended (done or failed): its slot is free.
    package mutating func ended(_ source: Source) {
        guard var entry = sources[source], entry.inFlight > 0 else { return }
        entry.inFlight -= 1
        inFlight -= 1
        if entry.inFlight == 0 && entry.bucket == nil && entry.refused.isEmpty {
            sources[source] = nil
        } else {
            sources[source] = entry
        }
    }

    private func busy(_ reason: String, after milliseconds: Int = 0) -> Verdict {
        .busy(reason: reason, retryAfterMilliseconds: max(milliseconds, Self.minimumRetryMilliseconds))
    }

    /// Drops the entries that say nothing any more: no handshake in flight and a full bucket.
    private mutating func prune(now: UInt64) {
        let rate = limits.perSecondPerSource
        sources = sources.filter { _, entry in
            guard entry.inFlight == 0, entry.refused.current(now: now) == 0 else { return true }
            guard let rate, var bucket = entry.bucket else { return false }
            bucket.refill(rate: rate, now: now)
            return bucket.tokens < Double(rate)
        }
        pruneAt = min(max(1_024, sources.count * 2), Self.maxTrackedSources)
    }
}
