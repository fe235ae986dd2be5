import Testing

import ProtocolCore

/// Admission before the handshake (issue 28), with a fake clock: in-flight bounds, per-source and
/// total rates, how sources are counted, and the table's bound under many sources.
@Suite struct HandshakeAdmissionTests {
    static let second: UInt64 = 1_000_000_000
    static let a = HandshakeAdmission.Source(SocketAddress(numeric: "192.0.2.1", port: 1)!)
    static let b = HandshakeAdmission.Source(SocketAddress(numeric: "192.0.2.2", port: 1)!)

    /// 256 handshakes a second from one source, blocked after 1,024 refusals in a second.
    static func blockingAdmission() -> HandshakeAdmission {
        HandshakeAdmission(
            limits: .init(inFlight: 1_000, inFlightPerSource: 1_000, perSecond: nil, perSecondPerSource: 256, blockAfterRefusals: 1_024),
            now: 0)
    }

    /// Whether a verdict names its source a flooder (block it).
    static func named(_ verdict: HandshakeAdmission.Verdict) -> Bool {
        if case .busy(_, _, let block) = verdict { return block }
        return false
    }

    func admission(
        inFlight: Int = 1_000, perSource: Int = 1_000, perSecond: Int? = nil, perSecondPerSource: Int? = nil
    ) -> HandshakeAdmission {
        HandshakeAdmission(
            limits: .init(inFlight: inFlight, inFlightPerSource: perSource, perSecond: perSecond, perSecondPerSource: perSecondPerSource),
            now: 0)
    }

    func isBusy(_ verdict: HandshakeAdmission.Verdict) -> Bool {
        if case .busy = verdict { return true }
        return false
    }

    @Test func inFlightBoundsInAllAndPerSource() {
        var admission = admission(inFlight: 3, perSource: 2)
        #expect(admission.admit(Self.a, now: 0) == .admitted)
        #expect(admission.admit(Self.a, now: 0) == .admitted)
        let third = admission.admit(Self.a, now: 0)
        guard case .busy(let reason, let retry, _) = third else { Issue.record("admitted a third from a"); return }
        #expect(reason.contains("from 192.0.2.1"), "\(reason)")
        #expect(retry == HandshakeAdmission.minimumRetryMilliseconds)
        #expect(admission.admit(Self.b, now: 0) == .admitted)  // another source still gets in
        #expect(isBusy(admission.admit(Self.b, now: 0)))  // the total is reached
        #expect(admission.inFlight == 3 && admission.highWater == 3)
        admission.ended(Self.a)
        #expect(admission.admit(Self.b, now: 0) == .admitted)
        // Ending more than was admitted changes nothing.
        for _ in 0..<5 { admission.ended(Self.a) }
        #expect(admission.inFlight == 2)
    }

    /// A source gets its rate per second, a burst of one second's worth at once; then one
    /// handshake each 1/rate seconds, with a retry hint that says when.
    @Test func aSourceGetsItsRateAndAHintWhenOver() {
        var admission = admission(perSecondPerSource: 10)
        for _ in 0..<10 {
            #expect(admission.admit(Self.a, now: 0) == .admitted)
            admission.ended(Self.a)  // done at once: only the rate bounds it
        }
        guard case .busy(let reason, let retry, _) = admission.admit(Self.a, now: 0) else {
            Issue.record("an eleventh handshake in the same instant")
            return
        }
        #expect(reason.contains("192.0.2.1 started 10 handshakes"), "\(reason)")
        #expect(retry == 100)  // 1/10 s until the next token (and the floor is 100 ms)
        #expect(admission.admit(Self.b, now: 0) == .admitted)  // other sources are not affected
        #expect(isBusy(admission.admit(Self.a, now: Self.second / 20)))  // half a token
        #expect(admission.admit(Self.a, now: Self.second / 10) == .admitted)  // one token
        // After a quiet second the whole burst is back, not more.
        admission.ended(Self.a)
        var admitted = 0
        while admitted < 20, admission.admit(Self.a, now: 3 * Self.second) == .admitted {
            admission.ended(Self.a)
            admitted += 1
        }
        #expect(admitted == 10)
    }

    @Test func theTotalRateBoundsManySources() {
        var admission = admission(perSecond: 5, perSecondPerSource: 100)
        var admitted = 0
        for i in 0..<20 {
            let source = HandshakeAdmission.Source(SocketAddress(numeric: "10.0.0.\(i)", port: 1)!)
            if admission.admit(source, now: 0) == .admitted { admitted += 1 }
        }
        #expect(admitted == 5)
        guard case .busy(let reason, let retry, _) = admission.admit(Self.a, now: 0) else { Issue.record("admitted"); return }
        #expect(reason.contains("5 handshakes started in the last second"), "\(reason)")
        #expect(retry == 200)  // 1/5 s
    }

    /// A refused attempt takes no token: a source refused because the total is spent keeps its own.
    @Test func aRefusalTakesNoToken() {
        var admission = admission(perSecond: 2, perSecondPerSource: 1)
        let c = HandshakeAdmission.Source(SocketAddress(numeric: "192.0.2.3", port: 1)!)
        #expect(admission.admit(Self.a, now: 0) == .admitted)
        #expect(admission.admit(Self.b, now: 0) == .admitted)
        #expect(isBusy(admission.admit(c, now: 0)))  // the total's two tokens are gone
        // Half a second later the total has one token again; c still has its own (charged, it
        // would have half of one).
        #expect(admission.admit(c, now: Self.second / 2) == .admitted)
    }

    /// IPv6 sources count per /64: one host's many addresses share one share; an IPv4-mapped
    /// address counts as its IPv4 address.
    @Test func sourcesAreIPv4AddressesAndIPv6Prefixes() {
        let x = HandshakeAdmission.Source(SocketAddress(numeric: "2001:db8:0:1::5", port: 1)!)
        let y = HandshakeAdmission.Source(SocketAddress(numeric: "2001:db8:0:1:aaaa:bbbb:cccc:dddd", port: 2)!)
        let z = HandshakeAdmission.Source(SocketAddress(numeric: "2001:db8:0:2::5", port: 1)!)
        #expect(x == y && x != z)
        #expect(x.description == "2001:db8:0:1::/64")
        let mapped = HandshakeAdmission.Source(SocketAddress(numeric: "::ffff:192.0.2.1", port: 9)!)
        #expect(mapped == Self.a && mapped.description == "192.0.2.1")
        #expect(HandshakeAdmission.Source(nil) == .unknown)
        var admission = admission(perSource: 1)
        #expect(admission.admit(x, now: 0) == .admitted)
        #expect(isBusy(admission.admit(y, now: 0)))
        #expect(admission.admit(z, now: 0) == .admitted)
    }

    /// A flood from ever new sources: the table stays bounded, finished entries are pruned, and
    /// past the bound new sources are refused until entries can go.
    @Test func theSourceTableStaysBounded() {
        var admission = admission(perSecondPerSource: 1)
        var refused = 0
        for i in 0..<(HandshakeAdmission.maxTrackedSources + 5_000) {
            let source = HandshakeAdmission.Source.ipv4(UInt32(i))
            if admission.admit(source, now: 0) == .admitted { admission.ended(source) } else { refused += 1 }
            #expect(admission.trackedSources <= HandshakeAdmission.maxTrackedSources)
        }
        #expect(refused == 5_000)  // every bucket is empty in the same instant: none can go
        // A second later every bucket is full again: the next new source prunes them all.
        #expect(admission.admit(.ipv4(UInt32.max), now: 2 * Self.second) == .admitted)
        #expect(admission.trackedSources == 1)
        // Without rates an entry lives only while its handshake does.
        var plain = self.admission()
        #expect(plain.admit(Self.a, now: 0) == .admitted)
        #expect(plain.trackedSources == 1)
        plain.ended(Self.a)
        #expect(plain.trackedSources == 0)
    }

    /// A source refused `blockAfterRefusals` times within one second is named once to be blocked;
    /// the count starts again each second, and a source within its share is never named.
    @Test func aFloodingSourceIsNamedOncePerSecond() {
        var admission = HandshakeAdmission(
            limits: .init(inFlight: 1_000, inFlightPerSource: 1_000, perSecond: nil, perSecondPerSource: 2, blockAfterRefusals: 5),
            now: 0)
        func blocks(_ verdict: HandshakeAdmission.Verdict) -> Bool {
            if case .busy(_, _, let block) = verdict { return block }
            return false
        }
        // 20 attempts in the same instant: 2 admitted (its rate), then refusals; the fifth names it.
        let named = (0..<20).filter { _ in blocks(admission.admit(Self.a, now: 0)) }
        #expect(named == [6])
        // Another source refused four times in that second is not named.
        #expect((0..<6).filter { _ in blocks(admission.admit(Self.b, now: 0)) }.isEmpty)
        // The next second counts from zero: named again, once, at its fifth refusal there.
        #expect((0..<20).filter { _ in blocks(admission.admit(Self.a, now: Self.second + Self.second / 2)) }.count == 1)
    }
}

extension HandshakeAdmissionTests {
    /// A source blocked for flooding: its blocks double while it comes back within twice its last
    /// block (up to 32 times the first), and in that time it is on probation — no burst when the
    /// block ends (its bucket starts empty then) and named again at a sixteenth of the threshold.
    /// Quiet long enough, it starts afresh.
    /// What a blocked source's attempts leave behind (connections accepted before the kernel began
    /// dropping them, drained later) is refused but does not count: it neither blocks the source
    /// again, twice as long, nor counts toward its next detection once the block ended.
    @Test func leftoversOfABlockedSourceDoNotBlockItAgain() {
        let s = Self.second
        var admission = Self.blockingAdmission()
        let named = Self.named
        #expect((0..<1_400).map { _ in admission.admit(Self.a, now: 0) }.contains(where: named))
        #expect(admission.block(Self.a, now: 0, base: 10 * s) == 10 * s)
        #expect(admission.isBlocked(Self.a, now: 10 * s - 1) && !admission.isBlocked(Self.a, now: 10 * s))
        // Each second of the block, more than the probation threshold (64) of leftovers: refused, never named.
        for second in 1..<10 {
            let verdicts = (0..<100).map { _ in admission.admit(Self.a, now: UInt64(second) * s) }
            #expect(!verdicts.contains(where: named) && !verdicts.contains(.admitted), "second \(second)")
        }
        // After the block, a flood again is named at its 64th refusal, counted from the block's end.
        let after = (0..<100).map { _ in admission.admit(Self.a, now: 10 * s) }
        #expect(after.firstIndex(where: named) == 63)
    }

    @Test func aSourceBlockedBeforeIsOnProbation() {
        let s = Self.second
        var admission = Self.blockingAdmission()
        let named = Self.named
        // First detection: 256 admitted at once (the bucket's burst), named at the 1,024th refusal.
        var verdicts = (0..<1_400).map { _ in admission.admit(Self.a, now: 0) }
        #expect(verdicts.filter { $0 == .admitted }.count == 256)
        #expect(verdicts.firstIndex(where: named) == 256 + 1_023)
        #expect(!admission.isOnProbation(Self.a, now: 0))
        #expect(admission.block(Self.a, now: 0, base: 10 * s) == 10 * s)
        #expect(admission.isOnProbation(Self.a, now: 29 * s) && !admission.isOnProbation(Self.a, now: 30 * s))
        // The block ends at 10 s: no burst (one token in 1/256 s), named at the 64th refusal.
        verdicts = (0..<100).map { _ in admission.admit(Self.a, now: 10 * s) }
        #expect(verdicts.filter { $0 == .admitted }.isEmpty)
        #expect(verdicts.firstIndex(where: named) == 63)
        #expect(admission.admit(Self.a, now: 10 * s + s / 128) == .admitted)  // the bucket refills at its rate
        // Blocked again while on probation: twice as long, doubling up to 32 times the first.
        #expect(admission.block(Self.a, now: 10 * s, base: 10 * s) == 20 * s)
        var now = 30 * s
        var durations: [UInt64] = []
        for _ in 0..<6 {
            let duration = admission.block(Self.a, now: now, base: 10 * s)
            durations.append(duration / s)
            now += duration
        }
        #expect(durations == [40, 80, 160, 320, 320, 320])
        // Quiet for twice its last block after it ended: a first block again, a full burst, the full threshold.
        now += 2 * 320 * s
        #expect(!admission.isOnProbation(Self.a, now: now))
        verdicts = (0..<1_400).map { _ in admission.admit(Self.a, now: now) }
        #expect(verdicts.filter { $0 == .admitted }.count == 256)
        #expect(verdicts.firstIndex(where: named) == 256 + 1_023)
        #expect(admission.block(Self.a, now: now, base: 10 * s) == 10 * s)
        // Another source is not on probation for it.
        #expect(!admission.isOnProbation(Self.b, now: now))
    }
}

@Suite struct PerSecondCountTests {
    @Test func countsWithinTheSecondAndStartsAgainInTheNext() {
        var count = PerSecondCount()
        #expect(count.isEmpty && count.current(now: 5) == 0)
        #expect(count.add(now: 1_000_000_000) == 1)
        #expect(count.add(now: 1_999_999_999) == 2)
        #expect(count.current(now: 1_500_000_000) == 2)
        #expect(count.current(now: 2_000_000_000) == 0)  // a new second: nothing yet
        #expect(count.add(now: 2_000_000_000) == 1)
        #expect(!count.isEmpty)
    }
}
