import Testing

@testable import MDNSCore

/// The responder and querier state machines on a simulated link with a fake clock.
struct EngineTests {
    static let type = DNSName.make("_chat._tcp.local")

    func service(_ name: String, port: UInt16 = 4242, txt: [String] = ["v=1"]) -> MDNSService {
        MDNSService(instance: name, type: Self.type, port: port, txt: txt.map { Array($0.utf8) })
    }

    func instance(_ name: String) -> DNSName { DNSName(instance: name, service: Self.type)! }

    func established(_ net: FakeNetwork, _ node: Int) -> [String] {
        net.events(of: node).compactMap { if case .publicationEstablished(_, let name) = $0 { name } else { nil } }
    }

    @Test func probesThreeTimesThenAnnouncesThreeTimes() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        net.run(forMilliseconds: 2000)  // host name claimed first
        #expect(net.events(of: a).contains(.hostNameEstablished("alpha")))
        let start = net.now
        let id = net.with(a) { $0.publish(service("Lobby"), now: $1) }
        net.run(forMilliseconds: 6000)
        let name = instance("Lobby")
        let sent = net.messages(sentBy: a).filter { $0.at >= start }
        let probes = sent.filter { !$0.message.isResponse && $0.message.questions.contains { $0.name == name } }
        #expect(probes.count == 3)
        #expect(probes.allSatisfy { $0.message.questions.first { $0.name == name }?.type == DNSType.any })
        #expect(probes.allSatisfy { $0.message.authorities.contains { $0.name == name && $0.type == DNSType.srv } })
        let gaps = zip(probes.dropFirst(), probes).map { $0.at.milliseconds(since: $1.at) }
        #expect(gaps == [250, 250])
        #expect(probes[0].at.milliseconds(since: start) <= 250)
        let announcements = sent.filter { $0.message.isResponse && $0.message.answers.contains { $0.name == name } }
        #expect(announcements.count == 3)
        let announceGaps = zip(announcements.dropFirst(), announcements).map { $0.at.milliseconds(since: $1.at) }
        #expect(announceGaps == [1000, 2000])
        #expect(announcements[0].at.milliseconds(since: probes[2].at) == 250)
        // The announcement carries SRV + TXT (cache-flush) and PTRs (shared), the host address in additionals.
        let first = announcements[0].message
        #expect(first.answers.contains { $0.type == DNSType.srv && $0.cacheFlush })
        #expect(first.answers.contains { $0.type == DNSType.ptr && !$0.cacheFlush && $0.name == Self.type })
        #expect(first.answers.contains { $0.name == .serviceTypeEnumeration })
        #expect(first.additionals.contains { $0.data == .a([10, 0, 0, 1]) })
        #expect(established(net, a) == ["Lobby"])
        let current = net.with(a) { engine, _ in engine.publicationName(id) }
        #expect(current == "Lobby")
    }

    /// An empty TXT record goes out as one empty string and comes back parsed that way: our own
    /// probe, looped back, must still compare equal (else we lose every tie-break to ourselves).
    @Test func aServiceWithoutTXTFinishesProbingDespiteItsOwnEcho() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        _ = net.with(a) { $0.publish(service("Bare", txt: []), now: $1) }
        net.run(forMilliseconds: 3000)
        #expect(established(net, a) == ["Bare"])
    }

    /// A host-name claim with other addresses from this host (a second stack here, e.g. with
    /// other interfaces) is not a conflict; the same claim from another host is.
    @Test func hostNameClaimsFromThisHostDoNotRenameButFromOthersDo() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        net.run(forMilliseconds: 3000)
        let claim = DNSMessage(
            flags: 0x8400,
            answers: [
                ResourceRecord(
                    name: .make("alpha.local"), data: .aaaa([0xfe, 0x80] + [UInt8](repeating: 7, count: 14)), ttl: 120,
                    cacheFlush: true)
            ]
        ).encoded()
        net.inject(claim, to: a, isLocal: true)
        net.run(forMilliseconds: 2000)
        #expect(!net.events(of: a).contains { if case .hostNameRenamed = $0 { true } else { false } })
        net.inject(claim, to: a, isLocal: false)
        net.run(forMilliseconds: 2000)
        #expect(net.events(of: a).contains(.hostNameRenamed(from: "alpha", to: "alpha-2")))
    }

    /// After a host rename, our own looped-back records under the old name are forgotten: a
    /// resolve of the new owner's service must not mix our addresses in.
    @Test func ownRecordsUnderTheOldHostNameAreForgottenAfterARename() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        net.run(forMilliseconds: 3000)
        let oldName = DNSName.make("alpha.local")
        let cached = net.with(a) { engine, _ in
            engine.cache.records(on: FakeNetwork.link, name: oldName, type: DNSType.a)
        }
        #expect(cached.contains { $0.isLocal }, "its own A record should have looped back into its cache")
        let claim = DNSMessage(
            flags: 0x8400,
            answers: [ResourceRecord(name: oldName, data: .a([10, 9, 9, 9]), ttl: 120, cacheFlush: true)]
        ).encoded()
        net.inject(claim, to: a)
        let after = net.with(a) { engine, _ in
            engine.cache.records(on: FakeNetwork.link, name: oldName, type: DNSType.a)
        }
        #expect(after.map(\.record.data) == [.a([10, 9, 9, 9])], "\(after)")
    }

    /// A service announced, then waiting for its renamed host, still owes goodbyes when withdrawn.
    @Test func unpublishAfterAHostRenameStillSaysGoodbye() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        net.run(forMilliseconds: 2000)
        let id = net.with(a) { $0.publish(service("Owed"), now: $1) }
        net.run(forMilliseconds: 5000)
        let claim = DNSMessage(
            flags: 0x8400,
            answers: [ResourceRecord(name: .make("alpha.local"), data: .a([10, 9, 9, 9]), ttl: 120, cacheFlush: true)]
        ).encoded()
        net.inject(claim, to: a)
        let before = net.nodes[a].sent.count
        net.with(a) { $0.unpublish(id, now: $1) }
        let goodbyes = net.messages(sentBy: a).suffix(from: before).flatMap(\.message.answers).filter { $0.ttl == 0 }
        #expect(goodbyes.contains { $0.name == instance("Owed") && $0.type == DNSType.srv })
    }

    @Test func sameNameOnTwoHostsTheLaterIsRenamedAndBothAreBrowsed() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        let b = net.add(host: "bravo")
        let c = net.add(host: "charlie")
        net.run(forMilliseconds: 2000)
        _ = net.with(a) { $0.publish(service("Clash", port: 1), now: $1) }
        net.run(forMilliseconds: 3000)
        _ = net.with(b) { $0.publish(service("Clash", port: 2), now: $1) }
        net.run(forMilliseconds: 5000)
        #expect(established(net, a) == ["Clash"])
        #expect(
            net.events(of: b).contains {
                if case .publicationRenamed(_, "Clash", "Clash #2") = $0 { true } else { false }
            })
        #expect(established(net, b) == ["Clash #2"])
        let browse = net.with(c) { $0.startBrowse(type: Self.type, links: .all, now: $1) }
        net.run(forMilliseconds: 2000)
        let added = net.events(of: c).compactMap {
            if case .browseAdded(browse, let name, _, _) = $0 { name.firstLabelText } else { nil }
        }
        #expect(Set(added) == ["Clash", "Clash #2"])
        #expect(net.events(of: c).contains(.browseAllForNow(browse)))
    }

    @Test func simultaneousProbesTheLexicographicallyLaterWins() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        let b = net.add(host: "bravo")
        net.run(forMilliseconds: 2000)
        // Same name, same moment; port 2 > port 1 makes b's SRV data later: b wins, a defers and renames.
        _ = net.with(a) { $0.publish(service("Twin", port: 1), now: $1) }
        _ = net.with(b) { $0.publish(service("Twin", port: 2), now: $1) }
        net.run(forMilliseconds: 8000)
        #expect(established(net, b) == ["Twin"])
        #expect(established(net, a) == ["Twin #2"])
    }

    @Test func hostNameConflictRenamesTheHostAndServicesFollow() throws {
        var net = FakeNetwork()
        let a = net.add(host: "same")
        net.run(forMilliseconds: 2000)
        let b = net.add(host: "same")
        _ = net.with(b) { $0.publish(service("On B"), now: $1) }
        net.run(forMilliseconds: 5000)
        #expect(net.events(of: a).contains(.hostNameEstablished("same")))
        #expect(net.events(of: b).contains(.hostNameRenamed(from: "same", to: "same-2")))
        #expect(net.events(of: b).contains(.hostNameEstablished("same-2")))
        // A resolve on a finds b's service pointing at same-2.local with b's address.
        let resolve = net.with(a) { $0.startResolve(instance: instance("On B"), links: .all, now: $1) }
        net.run(forMilliseconds: 1000)
        let found = try #require(net.with(a) { engine, _ in engine.resolution(resolve) })
        #expect(found.target == DNSName.make("same-2.local"))
        #expect(found.addresses.map(\.bytes) == [[10, 0, 0, 2]])
    }

    @Test func answersQueriesWithKnownAnswerSuppressionQUAndLegacyUnicast() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        net.run(forMilliseconds: 2000)
        _ = net.with(a) { $0.publish(service("Answering"), now: $1) }
        net.run(forMilliseconds: 6000)  // announced; 1 s rate limit passed
        let name = instance("Answering")

        // 1. A PTR query (QM): answered by multicast after 20–120 ms, with SRV/TXT/A as additionals.
        var before = net.nodes[a].sent.count
        let query = DNSMessage(questions: [DNSQuestion(name: Self.type, type: DNSType.ptr)]).encoded()
        let asked = net.now
        net.inject(query, to: a)
        net.run(forMilliseconds: 200)
        var replies = net.messages(sentBy: a).suffix(from: before)
        let reply = try #require(replies.first)
        #expect(reply.packet.destination == .multicast)
        let delay = reply.at.milliseconds(since: asked)
        #expect(delay >= 20 && delay <= 120)
        #expect(reply.message.answers.map(\.data) == [.ptr(name)])
        #expect(Set(reply.message.additionals.map(\.type)) == [DNSType.srv, DNSType.txt, DNSType.a])

        // 2. The same query with the PTR as a known answer (full TTL): no reply.
        net.run(forMilliseconds: 2000)
        before = net.nodes[a].sent.count
        let known = DNSMessage(
            questions: [DNSQuestion(name: Self.type, type: DNSType.ptr)],
            answers: [ResourceRecord(name: Self.type, data: .ptr(name), ttl: 4000)]
        ).encoded()
        net.inject(known, to: a)
        net.run(forMilliseconds: 500)
        #expect(net.nodes[a].sent.count == before)
        // With less than half the TTL left it is answered again.
        let stale = DNSMessage(
            questions: [DNSQuestion(name: Self.type, type: DNSType.ptr)],
            answers: [ResourceRecord(name: Self.type, data: .ptr(name), ttl: 2000)]
        ).encoded()
        net.inject(stale, to: a)
        net.run(forMilliseconds: 500)
        #expect(net.nodes[a].sent.count == before + 1)

        // 3. QU for the SRV, just multicast: unicast reply to the querier at once.
        before = net.nodes[a].sent.count
        net.inject(
            DNSMessage(questions: [DNSQuestion(name: name, type: DNSType.srv, unicastResponse: true)]).encoded(), to: a)
        replies = net.messages(sentBy: a).suffix(from: before)
        #expect(
            replies.count == 1 && replies.first?.packet.destination == .unicast(address: [10, 0, 0, 99], port: 5353))

        // 4. Legacy unicast (source port 40000): id and question echoed, TTL ≤ 10, no cache-flush bit.
        before = net.nodes[a].sent.count
        var legacy = DNSMessage(id: 0x4242, questions: [DNSQuestion(name: name, type: DNSType.srv)])
        net.inject(legacy.encoded(), to: a, port: 40000)
        replies = net.messages(sentBy: a).suffix(from: before)
        let answer = try #require(replies.first)
        #expect(answer.packet.destination == .unicast(address: [10, 0, 0, 99], port: 40000))
        #expect(answer.message.id == 0x4242 && answer.message.questions == legacy.questions)
        #expect(answer.message.answers.allSatisfy { $0.ttl <= 10 && !$0.cacheFlush })
        #expect(answer.message.answers.first?.type == DNSType.srv)
        legacy.id = 0
    }

    @Test func browseQueriesBackOffExponentiallyAndStayQuiet() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        net.run(forMilliseconds: 5000)
        let start = net.now
        let before = net.nodes[a].sent.count
        _ = net.with(a) { $0.startBrowse(type: DNSName.make("_none._tcp.local"), links: .all, now: $1) }
        net.run(forMilliseconds: 70_000)
        let queries = net.messages(sentBy: a).suffix(from: before).filter { !$0.message.isResponse }
        let times = queries.map { $0.at.milliseconds(since: start) }
        #expect(times.count == 7, "\(times)")  // ~0.1, 1, 3, 7, 15, 31, 63 s
        #expect(times.first.map { $0 >= 20 && $0 <= 120 } == true)
        let gaps = zip(times.dropFirst(), times).map { $0 - $1 }
        #expect(gaps == [1000, 2000, 4000, 8000, 16_000, 32_000])
        // The next query is 64 s after the last one.
        let next = net.with(a) { engine, _ in engine.questions.values.map(\.next) }
        #expect(next.map { $0.milliseconds(since: start) } == [times.last! + 64_000])
    }

    @Test func cachedAnswersAreRefreshedBeforeExpiryAndRemovedWhenTheyStop() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha") { $0.otherRecordTTL = 100 }
        let b = net.add(host: "bravo")
        net.run(forMilliseconds: 2000)
        _ = net.with(a) { $0.publish(service("Refreshed"), now: $1) }
        net.run(forMilliseconds: 4000)
        let browse = net.with(b) { $0.startBrowse(type: Self.type, links: .all, now: $1) }
        net.run(forMilliseconds: 2000)
        #expect(net.events(of: b).contains { if case .browseAdded(browse, _, _, _) = $0 { true } else { false } })
        // a stops answering: b's refresh queries go unanswered and the PTR (TTL 100 s) expires.
        let received = try #require(
            net.with(b) { engine, _ in
                engine.cache.records(on: FakeNetwork.link, name: Self.type, type: DNSType.ptr).first
            })
        net.muted = [a]
        let before = net.nodes[b].sent.count
        net.run(until: received.received.adding(milliseconds: 101_000))
        let refreshTimes = net.messages(sentBy: b).suffix(from: before)
            .filter { !$0.message.isResponse && $0.message.questions.contains { $0.name == Self.type } }
            .map { Double($0.at.milliseconds(since: received.received)) / 1000 }
        // Back-off queries of the browse (at ~63 s) plus the four refreshes at 80–97 %.
        let refreshes = refreshTimes.filter { $0 >= 80 }
        #expect(refreshes.count == 4, "\(refreshTimes)")
        for (index, time) in refreshes.enumerated() {
            let low = 80.0 + 5 * Double(index)
            #expect(time >= low && time <= low + 2, "refresh \(index) at \(time) s")
        }
        #expect(net.events(of: b).contains { if case .browseRemoved(browse, _, _) = $0 { true } else { false } })
    }

    @Test func unpublishSendsGoodbyesAndRemoteBrowsersRemoveWithinASecond() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        let b = net.add(host: "bravo")
        net.run(forMilliseconds: 2000)
        let id = net.with(a) { $0.publish(service("Leaving"), now: $1) }
        net.run(forMilliseconds: 4000)
        let browse = net.with(b) { $0.startBrowse(type: Self.type, links: .all, now: $1) }
        net.run(forMilliseconds: 2000)
        let before = net.nodes[a].sent.count
        let at = net.now
        net.with(a) { $0.unpublish(id, now: $1) }
        let goodbye = try #require(net.messages(sentBy: a).suffix(from: before).first?.message)
        #expect(goodbye.answers.allSatisfy { $0.ttl == 0 })
        #expect(Set(goodbye.answers.map(\.type)) == [DNSType.ptr, DNSType.srv, DNSType.txt])
        net.run(forMilliseconds: 1500)
        let removed = try #require(
            net.nodes[b].events.first { if case .browseRemoved(browse, _, _) = $0.event { true } else { false } })
        #expect(removed.at.milliseconds(since: at) <= 1001)
    }

    @Test func txtUpdateReachesAResolver() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        let b = net.add(host: "bravo")
        net.run(forMilliseconds: 2000)
        let id = net.with(a) { $0.publish(service("Changing", txt: ["rev=1"]), now: $1) }
        net.run(forMilliseconds: 4000)
        let resolve = net.with(b) { $0.startResolve(instance: instance("Changing"), links: .all, now: $1) }
        net.run(forMilliseconds: 500)
        let first = net.with(b) { engine, _ in engine.resolution(resolve)?.txt }
        #expect(first == [Array("rev=1".utf8)])
        net.with(a) { $0.updateTXT(id, txt: [Array("rev=2".utf8)], now: $1) }
        net.run(forMilliseconds: 1500)
        let second = net.with(b) { engine, _ in engine.resolution(resolve)?.txt }
        #expect(second == [Array("rev=2".utf8)])
    }

    @Test func loopbackAddressesStayOnLoopbackAndTheOverrideReplacesAddresses() throws {
        let lo = LinkID(interfaceIndex: 1, family: .v4)
        let lo6 = LinkID(interfaceIndex: 1, family: .v6)
        let eth = FakeNetwork.link
        let eth6 = LinkID(interfaceIndex: 2, family: .v6)
        let v6: [UInt8] = [0xfe, 0x80] + [UInt8](repeating: 0, count: 13) + [1]
        let loop6: [UInt8] = [UInt8](repeating: 0, count: 15) + [1]
        var engine = MDNSEngine(
            configuration: MDNSConfiguration(hostName: "alpha"), now: MDNSInstant(nanoseconds: 0), seed: 1)
        engine.setLinks(
            [
                MDNSLink(id: lo, name: "lo", addresses: [[127, 0, 0, 1], loop6]),
                MDNSLink(id: lo6, name: "lo", addresses: [[127, 0, 0, 1], loop6]),
                MDNSLink(id: eth, name: "eth0", addresses: [[10, 0, 0, 1], v6]),
                MDNSLink(id: eth6, name: "eth0", addresses: [[10, 0, 0, 1], v6]),
            ], now: MDNSInstant(nanoseconds: 0))
        #expect(Set(engine.hostRecords(on: lo).map(\.data)) == [.a([127, 0, 0, 1]), .aaaa(loop6)])
        #expect(Set(engine.hostRecords(on: eth).map(\.data)) == [.a([10, 0, 0, 1]), .aaaa(v6)])
        #expect(Set(engine.hostRecords(on: eth6).map(\.data)) == [.aaaa(v6)])  // no A over IPv6
        var overridden = MDNSConfiguration(hostName: "alpha")
        overridden.advertisedAddresses = [[192, 0, 2, 7]]
        var nat = MDNSEngine(configuration: overridden, now: MDNSInstant(nanoseconds: 0), seed: 1)
        nat.setLinks([MDNSLink(id: eth, name: "eth0", addresses: [[172, 17, 0, 2]])], now: MDNSInstant(nanoseconds: 0))
        #expect(nat.hostRecords(on: eth).map(\.data) == [.a([192, 0, 2, 7])])
    }

    @Test func duplicateAnswersFromAnotherResponderAreSuppressed() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        net.run(forMilliseconds: 2000)
        _ = net.with(a) { $0.publish(service("Dup"), now: $1) }
        net.run(forMilliseconds: 6000)
        let name = instance("Dup")
        let before = net.nodes[a].sent.count
        net.inject(DNSMessage(questions: [DNSQuestion(name: Self.type, type: DNSType.ptr)]).encoded(), to: a)
        // Before a's delayed answer goes, someone else multicasts the same PTR with a full TTL.
        net.inject(
            DNSMessage(flags: 0x8400, answers: [ResourceRecord(name: Self.type, data: .ptr(name), ttl: 4500)])
                .encoded(), to: a)
        net.run(forMilliseconds: 500)
        #expect(net.nodes[a].sent.count == before)
    }

    @Test func idleEngineSchedulesNothingButCacheExpiry() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        _ = net.with(a) { $0.publish(service("Idle"), now: $1) }
        net.run(forMilliseconds: 10_000)
        // Probing and announcing over, no browse: the only thing left is the expiry of the cached
        // copies of its own records (looped back), after their 120 s TTL.
        let deadline = net.with(a) { engine, _ in engine.nextDeadline() }
        #expect(deadline.map { $0.milliseconds(since: net.now) >= 100_000 } ?? true, "\(String(describing: deadline))")
        let before = net.nodes[a].sent.count
        net.run(forMilliseconds: 100_000)
        #expect(net.nodes[a].sent.count == before)
    }

    @Test func shutdownSaysGoodbyeForServicesAndHost() throws {
        var net = FakeNetwork()
        let a = net.add(host: "alpha")
        _ = net.with(a) { $0.publish(service("Bye"), now: $1) }
        net.run(forMilliseconds: 5000)
        let before = net.nodes[a].sent.count
        net.with(a) { $0.shutdown(now: $1) }
        let goodbyes = net.messages(sentBy: a).suffix(from: before).flatMap(\.message.answers)
        #expect(goodbyes.allSatisfy { $0.ttl == 0 })
        #expect(Set(goodbyes.map(\.type)) == [DNSType.ptr, DNSType.srv, DNSType.txt, DNSType.a])
        let deadline = net.with(a) { engine, _ in engine.nextDeadline() }
        #expect(deadline == nil)
    }
}
