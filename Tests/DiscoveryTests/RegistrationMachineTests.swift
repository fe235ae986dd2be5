import Testing

@testable import Discovery
@testable import MDNSCore

/// The wide-area registration's decisions without a DNS server or a clock (issue 46, 1): each test
/// feeds the answers a server would give and checks what the machine does next — which update,
/// which wait. The BIND lab (WideAreaIntegrationTests) is the proof that the driver carries them
/// out against a real server.
@Suite struct RegistrationMachineTests {
    static let zone = DNSName("lab.home.arpa")!
    static let plan = RegistrationPlan(
        zone: UnicastDNS.Zone(name: zone, primary: DNSName("ns.lab.home.arpa")!, serial: 1),
        servers: [DNSServerAddress(.v4(10, 81, 3, 53))], host: DNSName("hosta.lab.home.arpa")!, addresses: [.v4(10, 81, 1, 10)])

    /// The records an update for `name` carries (what the driver answers with).
    static func records(_ name: String) -> RegisteredRecords {
        let instance = DNSName(instance: name, service: DNSName("_chat._tcp.lab.home.arpa")!)!
        return RegisteredRecords(
            name: name, zone: zone, servers: plan.servers,
            srv: ResourceRecord(name: instance, data: .srv(priority: 0, weight: 0, port: 4242, target: plan.host), ttl: 60))
    }

    /// The one action that needs an answer (the last one), and the reports before it.
    static func split(_ actions: [RegistrationMachine.Action]) -> (reports: [RegistrationMachine.Report], next: RegistrationMachine.Action?) {
        var reports: [RegistrationMachine.Report] = []
        for action in actions { if case .report(let report) = action { reports.append(report) } }
        let next = actions.last { if case .report = $0 { return false } else { return true } }
        return (reports, next)
    }

    /// A machine registered as `name` (start, located, register answered done).
    static func registered(_ name: String = "Lobby", lease: Duration = .seconds(100)) -> RegistrationMachine {
        var machine = RegistrationMachine(name: name, lease: lease)
        _ = machine.apply(.start)
        _ = machine.apply(.located(.success(plan)))
        _ = machine.apply(.answered(.success(.done), records: records(name)))
        return machine
    }

    @Test func aFreeNameIsRegisteredAndRefreshedAtHalfTheLease() {
        var machine = RegistrationMachine(name: "Lobby", lease: .seconds(100))
        #expect(machine.apply(.start) == [.locate])
        #expect(machine.apply(.located(.success(Self.plan))) == [.send(.register(name: "Lobby"), Self.plan)])
        let done = machine.apply(.answered(.success(.done), records: Self.records("Lobby")))
        #expect(done == [.report(.registered(name: "Lobby")), .wait(.seconds(50))])
        #expect(machine.isRegistered && machine.registered == Self.records("Lobby"))
        // The wait ends: the zone is looked up again, then the same records are refreshed on
        // condition that our SRV is still there.
        #expect(machine.apply(.woke) == [.locate])
        #expect(machine.apply(.located(.success(Self.plan))) == [.send(.refresh(Self.records("Lobby")), Self.plan)])
        #expect(machine.apply(.answered(.success(.done), records: Self.records("Lobby"))) == [.wait(.seconds(50))])
    }

    @Test func aNameTakenBySomeoneElseIsRenamedAndOurOwnStaleRecordsAreReplaced() {
        var machine = RegistrationMachine(name: "Lobby", lease: .seconds(100))
        _ = machine.apply(.start)
        _ = machine.apply(.located(.success(Self.plan)))
        #expect(machine.apply(.answered(.success(.nameExists), records: Self.records("Lobby"))) == [.readEarlier(name: "Lobby", Self.plan)])
        // Someone else's: the next name.
        #expect(
            machine.apply(.earlierRead(.success(nil)))
                == [.report(.renamed(from: "Lobby", to: "Lobby #2")), .send(.register(name: "Lobby #2"), Self.plan)])
        #expect(machine.name == "Lobby #2")
        // Taken too, but by our own earlier registration (a crash): replaced, name kept.
        _ = machine.apply(.answered(.success(.nameExists), records: Self.records("Lobby #2")))
        let earlier = [Self.records("Lobby #2").srv]
        #expect(machine.apply(.earlierRead(.success(earlier))) == [.send(.replace(name: "Lobby #2", earlier: earlier), Self.plan)])
        #expect(
            machine.apply(.answered(.success(.done), records: Self.records("Lobby #2")))
                == [.report(.replacedStale(name: "Lobby #2")), .wait(.seconds(50))])
        #expect(machine.registered?.name == "Lobby #2")
    }

    @Test func aNameThatStaysTakenIsACollisionRetriedWithBackOff() {
        var machine = RegistrationMachine(name: "Busy", lease: .seconds(100))
        _ = machine.apply(.start)
        var actions = machine.apply(.located(.success(Self.plan)))
        var renames = 0
        for _ in 0..<100 {
            guard case .send(.register, _)? = Self.split(actions).next else { break }
            actions = machine.apply(.answered(.success(.nameExists), records: Self.records(machine.name)))
            actions = machine.apply(.earlierRead(.success(nil)))
            renames += Self.split(actions).reports.filter { if case .renamed = $0 { true } else { false } }.count
        }
        #expect(renames == RegistrationMachine.maxAttempts)
        let (reports, next) = Self.split(actions)
        guard case .failed(let error, let wait)? = reports.last else {
            Issue.record("no failure reported: \(actions)")
            return
        }
        #expect(error.code == .collision && wait == .seconds(1))
        #expect(next == .wait(.seconds(1)))
    }

    @Test func aServerThatDoesNotAnswerIsRetriedWithDoublingBackOffSaidOnce() {
        var machine = RegistrationMachine(name: "Lobby", lease: .seconds(100))
        _ = machine.apply(.start)
        let down = DiscoveryError(.dnsUnreachable, "no answer within 3.0 seconds")
        var waits: [Duration] = []
        var said = 0
        for _ in 0..<8 {
            let actions = machine.apply(.located(.failure(down)))
            let (reports, next) = Self.split(actions)
            said += reports.count
            guard case .wait(let wait)? = next else {
                Issue.record("no wait after a failure: \(actions)")
                return
            }
            waits.append(wait)
            #expect(machine.apply(.woke) == [.locate])
        }
        // 1, 2, 4, 8, 16 s, then capped at a quarter of the lease (25 s; 60 s at most).
        #expect(waits == [1, 2, 4, 8, 16, 25, 25, 25].map { Duration.seconds($0) })
        #expect(said == 1, "the same failure is said once")
        // It answers again: registered, and the back-off starts over.
        _ = machine.apply(.located(.success(Self.plan)))
        _ = machine.apply(.answered(.success(.done), records: Self.records("Lobby")))
        #expect(machine.apply(.woke) == [.locate])
        #expect(Self.split(machine.apply(.located(.failure(down)))).next == .wait(.seconds(1)))
    }

    @Test func aRefusedKeyIsTriedAgainRarely() {
        var machine = RegistrationMachine(name: "Lobby", lease: .seconds(100))
        _ = machine.apply(.start)
        _ = machine.apply(.located(.success(Self.plan)))
        let refused = DiscoveryError(.updateRefused, "REFUSED", dnsRcode: 5)
        let actions = machine.apply(.answered(.failure(refused), records: Self.records("Lobby")))
        #expect(actions == [.report(.failed(refused, retryingIn: .seconds(300))), .wait(.seconds(300))])
        #expect(!machine.isRegistered)
    }

    /// A refresh fails (the server was down) and the publication says so; the next refresh, once
    /// the server answers, finds the records still there — and says the registration stands again,
    /// once (found by the wide-area simulation, seed 2: the host stayed "failed" for good).
    @Test func aRefreshThatSucceedsAfterAFailureSaysRegisteredAgain() {
        var machine = Self.registered()
        _ = machine.apply(.woke)
        let down = DiscoveryError(.dnsUnreachable, "no answer within 3.0 seconds")
        #expect(Self.split(machine.apply(.located(.failure(down)))).reports == [.failed(down, retryingIn: .seconds(1))])
        #expect(machine.apply(.woke) == [.locate])
        #expect(machine.apply(.located(.success(Self.plan))) == [.send(.refresh(Self.records("Lobby")), Self.plan)])
        let back = machine.apply(.answered(.success(.done), records: Self.records("Lobby")))
        #expect(back == [.report(.registered(name: "Lobby")), .wait(.seconds(50))])
        // The next refresh says nothing: nothing changed.
        _ = machine.apply(.woke)
        _ = machine.apply(.located(.success(Self.plan)))
        #expect(machine.apply(.answered(.success(.done), records: Self.records("Lobby"))) == [.wait(.seconds(50))])
    }

    @Test func recordsGoneAtARefreshAreRegisteredAgain() {
        var machine = Self.registered()
        _ = machine.apply(.woke)
        _ = machine.apply(.located(.success(Self.plan)))
        // The SRV prerequisite failed: deleted by someone, or the server lost its zone.
        let actions = machine.apply(.answered(.success(.prerequisiteFailed(8)), records: Self.records("Lobby")))
        #expect(actions == [.report(.recordsGone(name: "Lobby")), .send(.register(name: "Lobby"), Self.plan)])
        #expect(!machine.isRegistered)
    }

    @Test func stopDeletesWhatIsRegisteredOrWasAttemptedAndNothingElse() {
        // Registered: its records are deleted, conditionally, with their own zone and servers.
        var machine = Self.registered()
        #expect(machine.apply(.stop) == [.send(.delete(Self.records("Lobby")), nil)])
        #expect(machine.apply(.stop) == [], "a second stop changes nothing")
        #expect(machine.apply(.answered(.success(.done), records: nil)) == [.report(.removed(name: "Lobby")), .finished])
        #expect(!machine.isRegistered)

        // An update that got no answer may have landed: stop deletes those records too.
        var unanswered = RegistrationMachine(name: "Lobby", lease: .seconds(100))
        _ = unanswered.apply(.start)
        _ = unanswered.apply(.located(.success(Self.plan)))
        _ = unanswered.apply(.answered(.failure(DiscoveryError(.dnsUnreachable, "timeout")), records: Self.records("Lobby")))
        #expect(unanswered.apply(.stop) == [.send(.delete(Self.records("Lobby")), nil)])
        #expect(
            unanswered.apply(.answered(.success(.prerequisiteFailed(8)), records: nil)) == [.report(.alreadyGone(name: "Lobby")), .finished])

        // Nothing sent yet: nothing to delete.
        var fresh = RegistrationMachine(name: "Lobby", lease: .seconds(100))
        _ = fresh.apply(.start)
        #expect(fresh.apply(.stop) == [.finished])
        #expect(fresh.apply(.located(.success(Self.plan))) == [], "an answer after the stop starts nothing")
    }

    @Test func aFailedRemovalIsSaidWithTheRecordsLeft() {
        var machine = Self.registered()
        _ = machine.apply(.stop)
        let error = DiscoveryError(.dnsUnreachable, "no answer")
        #expect(machine.apply(.answered(.failure(error), records: nil)) == [.report(.removalFailed(name: "Lobby", error)), .finished])
    }

    @Test func aShortLeaseCapsTheBackOffAtAQuarterOfIt() {
        var machine = RegistrationMachine(name: "Brief", lease: .seconds(3))
        _ = machine.apply(.start)
        let down = DiscoveryError(.dnsUnreachable, "no answer")
        var waits: [Duration] = []
        for _ in 0..<3 {
            if case .wait(let wait)? = Self.split(machine.apply(.located(.failure(down)))).next { waits.append(wait) }
            _ = machine.apply(.woke)
        }
        #expect(waits == [.seconds(1), .milliseconds(750), .milliseconds(750)])
    }
}
