import Testing

@testable import Discovery
@testable import MDNSCore

/// A unicast browse's decisions without a DNS server or a clock (issue 46, 1): the answers a
/// server would give go in, the queries, events and waits come out. The BIND lab proves the driver.
@Suite struct UnicastBrowseMachineTests {
    static let servers = [DNSServerAddress(.v4(10, 81, 3, 53))]

    static func instance(_ name: String, expires: UInt64?) -> WideAreaInstance {
        var txt = TXTRecord()
        if let expires { txt["expires"] = String(expires) }
        return WideAreaInstance(identity: ServiceIdentity(name: name, type: "_chat._tcp", domain: "lab.home.arpa"), txt: txt, expires: expires, port: 4242)
    }

    static func serial(_ value: UInt32, now: UInt64 = 1_000) -> UnicastBrowseMachine.Input {
        .serial(.success(.init(serial: value, servers: servers)), now: now)
    }

    /// A machine whose first poll (serial 7, at 1,000 s) found and shows `instance`.
    static func showing(_ instance: WideAreaInstance) -> UnicastBrowseMachine {
        var machine = UnicastBrowseMachine()
        _ = machine.apply(.start)
        _ = machine.apply(serial(7, now: 1_000))
        _ = machine.apply(.names(.success([instance.identity.name])))
        _ = machine.apply(.read(.init(found: [instance.identity.name: instance], failed: [])))
        return machine
    }

    @Test func theFirstPollReadsEverythingAndEndsInAllForNow() {
        var machine = UnicastBrowseMachine()
        #expect(machine.apply(.start) == [.askSerial])
        #expect(machine.apply(Self.serial(7)) == [.readNames(servers: Self.servers)])
        #expect(machine.apply(.names(.success(["Lobby", "Den"]))) == [.readInstances(["Den", "Lobby"], servers: Self.servers)])
        let lobby = Self.instance("Lobby", expires: 2_000)
        let den = Self.instance("Den", expires: nil)
        let actions = machine.apply(.read(.init(found: ["Lobby": lobby, "Den": den], failed: [])))
        #expect(actions == [.added(den), .added(lobby), .allForNow, .wait])
        #expect(machine.lastSerial == 7)
    }

    @Test func anUnchangedSerialCostsOneQueryPerPoll() {
        var machine = UnicastBrowseMachine()
        _ = machine.apply(.start)
        _ = machine.apply(Self.serial(7))
        _ = machine.apply(.names(.success([])))
        for _ in 0..<5 {
            #expect(machine.apply(.woke) == [.askSerial])
            #expect(machine.apply(Self.serial(7)) == [.wait], "no PTR read while the serial stays")
        }
    }

    @Test func aChangedSerialShowsWhatCameAndWhatWent() {
        var machine = UnicastBrowseMachine()
        let lobby = Self.instance("Lobby", expires: 2_000)
        let den = Self.instance("Den", expires: 2_000)
        _ = machine.apply(.start)
        _ = machine.apply(Self.serial(7))
        _ = machine.apply(.names(.success(["Lobby"])))
        _ = machine.apply(.read(.init(found: ["Lobby": lobby], failed: [])))
        _ = machine.apply(.woke)
        _ = machine.apply(Self.serial(8))
        // Lobby went, Den came: Lobby is removed at once, Den is read.
        #expect(machine.apply(.names(.success(["Den"]))) == [.removed(lobby), .readInstances(["Den"], servers: Self.servers)])
        #expect(machine.apply(.read(.init(found: ["Den": den], failed: []))) == [.added(den), .wait])
    }

    @Test func anExpiredInstanceIsHiddenAndShownAgainWhenRefreshed() {
        var machine = UnicastBrowseMachine()
        _ = machine.apply(.start)
        _ = machine.apply(Self.serial(7, now: 1_000))
        _ = machine.apply(.names(.success(["Ghost"])))
        // Expired when first read: hidden, not added.
        #expect(machine.apply(.read(.init(found: ["Ghost": Self.instance("Ghost", expires: 900)], failed: []))) == [.allForNow, .wait])
        #expect(machine.hidden["Ghost"] != nil && machine.visible.isEmpty)
        // Registered again (a new expiry, a new serial): shown.
        _ = machine.apply(.woke)
        _ = machine.apply(Self.serial(8, now: 1_010))
        #expect(machine.apply(.names(.success(["Ghost"]))) == [.readInstances(["Ghost"], servers: Self.servers)])
        let fresh = Self.instance("Ghost", expires: 1_100)
        #expect(machine.apply(.read(.init(found: ["Ghost": fresh], failed: []))) == [.added(fresh), .wait])
    }

    @Test func aShownInstanceWhoseExpiryPassesIsReadAgainAndRemovedUnlessRefreshed() {
        let room = Self.instance("Room", expires: 1_100)
        var machine = Self.showing(room)
        // Later, same serial (nobody refreshed), past the expiry: read again.
        _ = machine.apply(.woke)
        #expect(machine.apply(Self.serial(7, now: 1_200)) == [.readInstances(["Room"], servers: Self.servers)])
        // The server did not answer for it: kept, asked again next poll.
        #expect(machine.apply(.read(.init(found: [:], failed: ["Room"]))) == [.wait])
        _ = machine.apply(.woke)
        _ = machine.apply(Self.serial(7, now: 1_210))
        // Still expired (its publisher crashed): removed, and hidden.
        #expect(machine.apply(.read(.init(found: ["Room": room], failed: []))) == [.removed(room), .wait])
        #expect(machine.visible.isEmpty && machine.hidden["Room"] != nil)
    }

    /// A shown instance read again at its expiry: refreshed as it was (only `expires` moved), it
    /// is kept silently; changed meanwhile (its TXT, or another host took the name within one
    /// poll), it is said gone and then new, so that the app does not keep the old one (found by
    /// the wide-area simulation, seed 20).
    @Test func aShownInstanceThatChangedIsSaidRemovedThenAddedWhenReadAgain() {
        let room = Self.instance("Room", expires: 1_100)
        var machine = Self.showing(room)
        // Refreshed, nothing else changed: no event.
        let refreshed = Self.instance("Room", expires: 1_300)
        _ = machine.apply(.woke)
        _ = machine.apply(Self.serial(7, now: 1_200))
        #expect(machine.apply(.read(.init(found: ["Room": refreshed], failed: []))) == [.wait])
        // Another owner (another fp) under the same name, refreshed past the old expiry.
        var taken = Self.instance("Room", expires: 1_500)
        taken.txt["fp"] = "someone-else"
        _ = machine.apply(.woke)
        _ = machine.apply(Self.serial(7, now: 1_400))
        #expect(machine.apply(.read(.init(found: ["Room": taken], failed: []))) == [.removed(refreshed), .added(taken), .wait])
        #expect(machine.visible["Room"] == taken)
    }

    @Test func aServerThatDoesNotAnswerKeepsWhatWasSeenAndIsSaidOnce() {
        var machine = UnicastBrowseMachine()
        let lobby = Self.instance("Lobby", expires: nil)
        _ = machine.apply(.start)
        _ = machine.apply(Self.serial(7))
        _ = machine.apply(.names(.success(["Lobby"])))
        _ = machine.apply(.read(.init(found: ["Lobby": lobby], failed: [])))
        let down = DiscoveryError(.dnsUnreachable, "no answer within 3.0 seconds")
        _ = machine.apply(.woke)
        #expect(machine.apply(.serial(.failure(down), now: 1_000)) == [.pollFailed(down, firstTime: true), .wait])
        _ = machine.apply(.woke)
        #expect(machine.apply(.serial(.failure(down), now: 1_010)) == [.pollFailed(down, firstTime: false), .wait])
        #expect(machine.visible["Lobby"] == lobby, "nothing removed while the server is away")
        // Back, same serial: nothing to read.
        _ = machine.apply(.woke)
        #expect(machine.apply(Self.serial(7)) == [.wait])
    }

    @Test func anInstanceThatCouldNotBeReadIsReadAtTheNextPoll() {
        var machine = UnicastBrowseMachine()
        let den = Self.instance("Den", expires: nil)
        _ = machine.apply(.start)
        _ = machine.apply(Self.serial(7))
        _ = machine.apply(.names(.success(["Den"])))
        #expect(machine.apply(.read(.init(found: [:], failed: ["Den"]))) == [.allForNow, .wait])
        #expect(machine.lastSerial == nil, "the serial is not taken as seen")
        _ = machine.apply(.woke)
        #expect(machine.apply(Self.serial(7)) == [.readNames(servers: Self.servers)])
        _ = machine.apply(.names(.success(["Den"])))
        #expect(machine.apply(.read(.init(found: ["Den": den], failed: []))) == [.added(den), .wait])
        #expect(machine.lastSerial == 7)
    }

    @Test func aMissingDomainIsAllForNowWithNothingInIt() {
        var machine = UnicastBrowseMachine()
        _ = machine.apply(.start)
        let missing = DiscoveryError(.dnsFailure, "NXDOMAIN")
        #expect(machine.apply(.serial(.failure(missing), now: 1_000)) == [.pollFailed(missing, firstTime: true), .allForNow, .wait])
        #expect(machine.apply(.names(.success(["Late"]))) == [], "an answer nobody asked for changes nothing")
    }
}
