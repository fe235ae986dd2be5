import Testing

@testable import Discovery

/// The merged link + domain browse's decisions without a backend, a DNS server or a clock (issue
/// 46, 1): events of the link and the domains go in, reports, resolves, browses and timers come out.
/// The BIND lab and the Avahi harness prove the driver.
@Suite struct MergeMachineTests {
    static let domain = "lab.home.arpa"

    static func link(_ name: String) -> DiscoveredService {
        DiscoveredService(identity: ServiceIdentity(name: name, type: "_chat._tcp"), seenOn: [], isLocal: false, isOwn: false)
    }

    static func unicast(_ name: String, fp: String?, port: UInt16? = 4242) -> WideAreaInstance {
        var txt = TXTRecord()
        if let fp { txt["fp"] = fp }
        return WideAreaInstance(
            identity: ServiceIdentity(name: name, type: "_chat._tcp", domain: domain), txt: txt, expires: nil, port: port)
    }

    /// A machine that enumerates the domains, after `.start` and the domains' answer.
    static func started(domains: [String] = [domain], link: Bool = true) -> MergeMachine {
        var machine = MergeMachine(includesLink: link, hasWideArea: true, fixedDomains: nil, domainRetry: .seconds(5))
        _ = machine.apply(.start(linkAvailable: true))
        _ = machine.apply(.domains(domains, unanswered: false))
        return machine
    }

    static func reports(_ actions: [MergeMachine.Action]) -> [BrowseEvent] {
        actions.compactMap { if case .report(let event) = $0 { event } else { nil } }
    }

    @Test func startBrowsesTheLinkAndAsksTheDomainsThenBrowsesEachAndAsksAgainIn15Minutes() {
        var machine = MergeMachine(includesLink: true, hasWideArea: true, fixedDomains: nil, domainRetry: .seconds(5))
        #expect(machine.apply(.start(linkAvailable: true)) == [.startLink, .enumerateDomains])
        #expect(machine.apply(.start(linkAvailable: true)) == [], "started once")
        #expect(
            machine.apply(.domains(["a.example", "b.example"], unanswered: false))
                == [.startDomain("a.example"), .startDomain("b.example"), .armDomainRefresh(.seconds(900))])
        #expect(machine.apply(.domainsDue) == [.enumerateDomains])
    }

    @Test func anUnansweredEnumerationIsAskedAgainSoon() {
        var machine = MergeMachine(includesLink: false, hasWideArea: true, fixedDomains: nil, domainRetry: .seconds(30))
        #expect(machine.apply(.start(linkAvailable: false)) == [.enumerateDomains])
        #expect(machine.apply(.domains([], unanswered: true)) == [.armDomainRefresh(.seconds(30)), .report(.allForNow)])
    }

    @Test func fixedDomainsAreBrowsedAtOnceAndNeverEnumerated() {
        var machine = MergeMachine(includesLink: false, hasWideArea: true, fixedDomains: [Self.domain], domainRetry: .seconds(5))
        #expect(machine.apply(.start(linkAvailable: false)) == [.startDomain(Self.domain)])
        #expect(machine.apply(.domainsDue) == [])
        #expect(machine.apply(.domain(Self.domain, .allForNow)) == [.report(.allForNow)])
    }

    @Test func aLinkServiceIsResolvedForItsKeyBeforeItIsReportedAndMergedWithTheDomainsPlace() {
        var machine = Self.started()
        let lobby = Self.link("Lobby")
        #expect(machine.apply(.link(.added(lobby))) == [.resolve(lobby, generation: 1)], "not reported before its fp is known")
        let added = Self.reports(machine.apply(.resolved(lobby, generation: 1, mergeKey: "k1 4242")))
        #expect(added.count == 1)
        guard case .added(let service)? = added.first else {
            Issue.record("expected an add, got \(added)")
            return
        }
        #expect(service.foundIn == "link")
        // The same key and port in the domain, under another name (renamed there): one service.
        let updated = Self.reports(machine.apply(.domain(Self.domain, .added(Self.unicast("Lobby (2)", fp: "k1")))))
        guard case .updated(let merged)? = updated.first, updated.count == 1 else {
            Issue.record("expected one update, got \(updated)")
            return
        }
        #expect(merged.name == "Lobby", "reported under the name it was first seen with")
        #expect(merged.foundIn == "link, \(Self.domain)")
        // Removed only when every place removed it.
        let linkGone = Self.reports(machine.apply(.link(.removed(lobby))))
        guard case .updated(let left)? = linkGone.first else {
            Issue.record("expected an update, got \(linkGone)")
            return
        }
        #expect(left.foundIn == Self.domain)
        let allGone = Self.reports(machine.apply(.domain(Self.domain, .removed(Self.unicast("Lobby (2)", fp: "k1")))))
        guard case .removed? = allGone.first else {
            Issue.record("expected a removal, got \(allGone)")
            return
        }
        #expect(machine.reported.isEmpty)
    }

    @Test func twoServicesOfOneKeyOnTwoPortsStayTwo() {
        var machine = Self.started()
        _ = machine.apply(.domain(Self.domain, .added(Self.unicast("Lobby", fp: "k1", port: 4242))))
        let second = Self.reports(machine.apply(.domain(Self.domain, .added(Self.unicast("Den", fp: "k1", port: 4343)))))
        guard case .added? = second.first else {
            Issue.record("expected an add, got \(second)")
            return
        }
        #expect(machine.reported.map(\.name) == ["Den", "Lobby"])
    }

    @Test func aServiceRemovedWhileBeingResolvedIsNeverReported() {
        var machine = Self.started()
        let lobby = Self.link("Lobby")
        _ = machine.apply(.link(.added(lobby)))
        #expect(machine.apply(.link(.removed(lobby))) == [.cancelResolve(generation: 1)])
        #expect(machine.apply(.resolved(lobby, generation: 1, mergeKey: "k1 4242")) == [], "the late answer is dropped")
        #expect(machine.reported.isEmpty)
    }

    @Test func withoutDomainsTheLinksEventsPassThroughUnresolved() {
        var machine = Self.started(domains: [])
        let lobby = Self.link("Lobby")
        #expect(machine.apply(.link(.added(lobby))) == [.report(.added(lobby))])
        #expect(machine.apply(.link(.removed(lobby))) == [.report(.removed(lobby))])
    }

    @Test func allForNowWaitsForTheLinkTheResolvesAndEveryDomainOrTheGrace() {
        var machine = Self.started(domains: ["a.example", "b.example"])
        let lobby = Self.link("Lobby")
        _ = machine.apply(.link(.added(lobby)))
        #expect(machine.apply(.link(.allForNow)) == [.armGrace(.seconds(2))], "a resolve and two domains are still out")
        #expect(Self.reports(machine.apply(.resolved(lobby, generation: 1, mergeKey: nil))).count == 1)
        #expect(machine.apply(.domain("a.example", .allForNow)) == [])
        #expect(machine.apply(.domain("b.example", .allForNow)) == [.report(.allForNow)])
        #expect(machine.apply(.graceOver) == [], "said once")

        var slow = Self.started(domains: ["a.example"])
        _ = slow.apply(.link(.allForNow))
        #expect(slow.apply(.graceOver) == [.report(.allForNow)], "a domain still polling is not waited for past the grace")
    }

    @Test func aVanishedDomainIsStoppedAndItsServicesRemoved() {
        var machine = Self.started(domains: ["a.example"])
        _ = machine.apply(.domain("a.example", .added(Self.unicast("Lobby", fp: "k1"))))
        let actions = machine.apply(.domains([], unanswered: false))
        #expect(actions.first == .stopDomain("a.example"))
        #expect(Self.reports(actions).count == 1)
        #expect(machine.reported.isEmpty)
        #expect(machine.apply(.domain("a.example", .added(Self.unicast("Den", fp: "k2")))) == [], "a stopped browse's late event is dropped")

        // A domain that vanishes before its first answer is not waited for.
        var waiting = Self.started(domains: ["a.example"])
        #expect(waiting.apply(.link(.allForNow)) == [.armGrace(.seconds(2))])
        #expect(Self.reports(waiting.apply(.domains([], unanswered: false))) == [.allForNow])
    }

    @Test func afterStopNothingIsDecided() {
        var machine = Self.started()
        #expect(machine.apply(.stop) == [.stopAll])
        #expect(machine.apply(.link(.added(Self.link("Lobby")))) == [])
        #expect(machine.apply(.domainsDue) == [])
        #expect(machine.apply(.start(linkAvailable: true)) == [])
    }
}
