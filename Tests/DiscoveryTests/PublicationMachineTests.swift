import Testing

@testable import Discovery

/// ``PublicationMachine`` alone (issue 54, 4): waiters and registrations are plain strings; what
/// the machine decides — who is resumed, with what, which registrations go — is read off its
/// results. The carrier's timers and continuations are `PublicationWaitTests`'.
@Suite struct PublicationMachineTests {
    typealias Machine = PublicationMachine<String, String>

    static func machine() -> Machine { Machine(name: "Lobby", txt: TXTRecord()) }

    @Test func aWaitForTheAnnouncementIsSettledAtOnceOrByTheEventThatSettlesIt() {
        var machine = Self.machine()
        let a = machine.newWaiter()
        let b = machine.newWaiter()
        #expect(a != b)
        #expect(machine.wait(.established, id: a, "a", cancelled: false) == nil, "settled before anything happened")
        #expect(machine.wait(.established, id: b, "b", cancelled: false) == nil)
        // A rename or a suspension settles nothing; the name follows the rename.
        #expect(machine.record(.renamed(from: "Lobby", to: "Lobby #2")).waiters.isEmpty)
        #expect(machine.name == "Lobby #2" && !machine.established)
        #expect(machine.record(.suspended).waiters.isEmpty)
        // Nor does a wide-area event end a wait for the link.
        #expect(machine.record(.registered(name: "Lobby", domain: "example.org")).waiters.isEmpty)
        // The announcement ends both waits, with its name.
        let announced = machine.record(.established(name: "Lobby #2"))
        #expect(Set(announced.waiters) == ["a", "b"])
        #expect(announced.outcome.flatMap { try? $0.get() } == "Lobby #2")
        #expect(machine.end(.established, a) == nil, "a waiter was kept after its outcome")
        // From now on, at once.
        #expect(machine.wait(.established, id: machine.newWaiter(), "c", cancelled: false).flatMap { try? $0.get() } == "Lobby #2")
        // A failure: the next wait gets it at once; an announcement clears it.
        #expect(machine.record(.failed(DiscoveryError(.collision, "taken"))).waiters.isEmpty)
        guard case .failure(let error) = machine.wait(.established, id: machine.newWaiter(), "d", cancelled: false) else {
            Issue.record("a failed publication kept a caller waiting")
            return
        }
        #expect(error.code == .collision)
        _ = machine.record(.established(name: "Lobby"))
        #expect(machine.failure == nil && machine.established)
    }

    @Test func aFailureEndsTheWaitsWithItsError() {
        var machine = Self.machine()
        #expect(machine.wait(.established, id: machine.newWaiter(), "a", cancelled: false) == nil)
        let failed = machine.record(.failed(DiscoveryError(.avahi, "refused")))
        #expect(failed.waiters == ["a"])
        guard case .failure(let error) = failed.outcome else { Issue.record("no failure: \(String(describing: failed.outcome))"); return }
        #expect(error.code == .avahi)
    }

    @Test func aCancelledCallerDoesNotWaitAndEndingAWaitHandsItBackOnce() {
        var machine = Self.machine()
        guard case .failure(let error) = machine.wait(.established, id: machine.newWaiter(), "a", cancelled: true) else {
            Issue.record("a cancelled caller waits")
            return
        }
        #expect(error.code == .shutDown && error.message.contains("announced was cancelled"), "\(error)")
        let id = machine.newWaiter()
        #expect(machine.wait(.established, id: id, "b", cancelled: false) == nil)
        #expect(machine.update(.established, id) { $0 += "+timer" })
        #expect(machine.end(.established, id) == "b+timer")
        #expect(machine.end(.established, id) == nil, "ended twice")
        #expect(!machine.update(.established, id) { _ in }, "a timer set on a wait that ended")
        #expect(machine.record(.established(name: "Lobby")).waiters.isEmpty, "an ended waiter was resumed again")
    }

    @Test func aWaitForTheRegistrationSaysNotPublishedWithoutOneAndEndsAtItsOutcome() {
        var machine = Self.machine()
        guard case .failure(let none) = machine.wait(.registered, id: machine.newWaiter(), "a", cancelled: false) else {
            Issue.record("waits for a registration there is none of")
            return
        }
        #expect(none.code == .notPublished)
        machine.attach(["example.org"])
        #expect(machine.wait(.registered, id: machine.newWaiter(), "b", cancelled: false) == nil)
        let link = machine.newWaiter()
        #expect(machine.wait(.established, id: link, "link", cancelled: false) == nil)
        // A rename in the domain settles nothing; the registration does, for its waiters only.
        #expect(machine.record(.registrationRenamed(domain: "example.org", from: "Lobby", to: "Lobby (2)")).waiters.isEmpty)
        let registered = machine.record(.registered(name: "Lobby (2)", domain: "example.org"))
        #expect(registered.waiters == ["b"])
        #expect(registered.outcome.flatMap { try? $0.get() } == "Lobby (2)")
        #expect(machine.wideAreaStatus["example.org"].flatMap { try? $0.get() } == "Lobby (2)")
        #expect(machine.end(.established, link) == "link", "the link's waiter was taken by the wide area's outcome")
        // A failure in the domain is the outcome too (for the registration's waiters only).
        var fresh = Self.machine()
        fresh.attach(["example.org"])
        #expect(fresh.wait(.registered, id: fresh.newWaiter(), "c", cancelled: false) == nil)
        #expect(fresh.wait(.established, id: fresh.newWaiter(), "link", cancelled: false) == nil)
        let refused = fresh.record(.registrationFailed(domain: "example.org", DiscoveryError(.keyRejected, "no")))
        #expect(refused.waiters == ["c"])
        let failed = machine.record(.registrationFailed(domain: "example.org", DiscoveryError(.keyRejected, "no")))
        #expect(failed.waiters.isEmpty)
        guard case .failure(let rejected) = machine.settled(.registered) else { Issue.record("no outcome"); return }
        #expect(rejected.code == .keyRejected)
    }

    @Test func unpublishingHandsOverTheRegistrationsThenEndsTheirWaitersWithNotPublished() {
        var machine = Self.machine()
        machine.attach(["example.org", "example.net"])
        #expect(machine.wait(.registered, id: machine.newWaiter(), "a", cancelled: false) == nil)
        #expect(machine.unpublishWideArea() == ["example.org", "example.net"])
        #expect(machine.wideArea.isEmpty)
        let stopped = machine.wideAreaStopped()
        #expect(stopped.waiters == ["a"])
        guard case .failure(let error) = stopped.outcome else { Issue.record("unpublished: no failure"); return }
        #expect(error.code == .notPublished && error.message.contains("unpublished"))
        guard case .failure(let later) = machine.wait(.registered, id: machine.newWaiter(), "b", cancelled: false) else {
            Issue.record("a caller waits for the registration of an unpublished service")
            return
        }
        #expect(later.code == .notPublished)
        // The discovery object going away hands them over without unpublishing.
        var other = Self.machine()
        other.attach(["example.org"])
        #expect(other.detachWideArea() == ["example.org"] && other.wideArea.isEmpty && !other.wideAreaUnpublished)
    }

    @Test func theTXTAndTheStallRetriesAreTheBackendsToSay() {
        var machine = Self.machine()
        var txt = TXTRecord()
        txt["v"] = "2"
        machine.txtChanged(txt)
        machine.stallRetried()
        machine.stallRetried()
        #expect(machine.txt["v"] == "2" && machine.stallRetries == 2)
    }
}
