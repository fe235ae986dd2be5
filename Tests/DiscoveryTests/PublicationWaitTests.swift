import Dispatch
import Scheduling
import TestWaits
import Testing

@testable import Discovery

/// `PublishedService.established(timeout:)` and `registered(timeout:)` in virtual time (issue 54,
/// 1): each wait ends once — with the outcome the publication records, at its deadline (a timer of
/// the publication's scheduler, here a manual clock), or at once when the caller's task is
/// cancelled — and leaves no timer behind.
@Suite struct PublicationWaitTests {
    typealias Outcome = Result<String, DiscoveryError>

    /// A publication on a manual clock, owned by nobody (a world's `NoBackend`, whose message for a
    /// service not announced is empty: replaced here by one the test recognises).
    final class Owner: PublicationOwner {
        let queue = DispatchQueue(label: "publication-wait-owner")
        func updateTXT(_ txt: TXTRecord, of service: PublishedService) -> Result<Void, DiscoveryError> { .success(()) }
        func unpublish(_ service: PublishedService) {}
        func notEstablishedMessage(_ service: PublishedService, timeout: Duration) -> String {
            dispatchPrecondition(condition: .onQueue(queue))
            return "'\(service.name)' was not announced within \(timeout): probing"
        }
    }

    static func publication(_ clock: ManualScheduler) -> PublishedService {
        PublishedService(owner: Owner(), name: "Lobby", type: "_chat._tcp", port: 4242, txt: TXTRecord(), scheduler: clock)
    }

    static func established(_ service: PublishedService) -> Task<Outcome, Never> {
        Task {
            do throws(DiscoveryError) { return .success(try await service.established(timeout: .seconds(10))) } catch { return .failure(error) }
        }
    }

    static func registered(_ service: PublishedService) -> Task<Outcome, Never> {
        Task {
            do throws(DiscoveryError) { return .success(try await service.registered(timeout: .seconds(10))) } catch { return .failure(error) }
        }
    }

    @Test func aWaitForTheAnnouncementFailsAtItsDeadlineWithTheOwnersReason() async throws {
        let clock = ManualScheduler()
        let service = Self.publication(clock)
        let start = clock.now
        let wait = Self.established(service)
        try #require(await clock.waitForPending(1), "no deadline was armed")
        #expect(clock.pendingDeadlines == [start + 10_000_000_000])
        clock.advance(by: .seconds(10))
        guard case .failure(let error) = await wait.value else { Issue.record("established with nothing recorded"); return }
        #expect(error.code == .timedOut && error.message == "'Lobby' was not announced within 10.0 seconds: probing", "\(error)")
    }

    @Test func theAnnouncementEndsEveryWaitWithTheNameAndStopsTheirTimers() async throws {
        let clock = ManualScheduler()
        let service = Self.publication(clock)
        let waits = [Self.established(service), Self.established(service)]
        try #require(await clock.waitForPending(2))
        service.record(.established(name: "Lobby #2"))
        for wait in waits { #expect(try await wait.value.get() == "Lobby #2") }
        #expect(clock.pendingCount == 0, "a deadline was left: \(clock.pendingDeadlines)")
        #expect(try await service.established(timeout: .seconds(10)) == "Lobby #2", "established: at once")
        #expect(clock.pendingCount == 0)
        // A failure ends the next wait with the failure.
        service.record(.failed(DiscoveryError(.collision, "taken")))
        await #expect(throws: DiscoveryError.self) { try await service.established(timeout: .seconds(10)) }
    }

    @Test func aCancelledWaitEndsAtOnceWithShutDown() async throws {
        let clock = ManualScheduler()
        let service = Self.publication(clock)
        let wait = Self.established(service)
        try #require(await clock.waitForPending(1))
        wait.cancel()
        guard case .failure(let error) = try await value(of: wait, "the cancelled wait") else { Issue.record("established after its cancellation"); return }
        #expect(error.code == .shutDown && error.message.contains("was cancelled"), "\(error)")
        #expect(clock.pendingCount == 0, "the cancelled wait's deadline was left: \(clock.pendingDeadlines)")
        // Cancelled before it waited: at once, no timer armed.
        let early = Task { () -> Outcome in
            withUnsafeCurrentTask { $0?.cancel() }
            do throws(DiscoveryError) { return .success(try await service.established(timeout: .seconds(10))) } catch { return .failure(error) }
        }
        guard case .failure(let second) = try await value(of: early, "the wait cancelled before it began") else { Issue.record("established after its cancellation"); return }
        #expect(second.code == .shutDown, "\(second)")
        #expect(clock.pendingCount == 0)
    }

    @Test func aWaitForTheRegistrationEndsAtItsOutcomeItsDeadlineOrItsCancellation() async throws {
        let world = WideAreaWorld()
        let clock = world.clock
        let service = Self.publication(clock)
        // Not published in a unicast domain: at once.
        guard case .failure(let none) = await Self.registered(service).value else { Issue.record("registered nowhere"); return }
        #expect(none.code == .notPublished, "\(none)")
        // A registration (never started: the test records its outcome).
        let registration = WideAreaRegistration(
            wideArea: world.wideArea(label: "hosta", index: 0, link: world.server), domain: WideAreaWorld.zoneName, name: "Lobby",
            type: "_chat._tcp", port: 4242, txt: TXTRecord(), key: WideAreaWorld.key(for: "hosta"), handle: service, logger: world.logger)
        service.attachWideArea([registration], start: false)

        let timesOut = Self.registered(service)
        try #require(await clock.waitForPending(1))
        clock.advance(by: .seconds(10))
        guard case .failure(let late) = await timesOut.value else { Issue.record("registered with nothing recorded"); return }
        #expect(late.code == .timedOut && late.message.contains("within 10.0 seconds"), "\(late)")

        let cancelled = Self.registered(service)
        try #require(await clock.waitForPending(1))
        cancelled.cancel()
        guard case .failure(let stopped) = try await value(of: cancelled, "the cancelled wait") else { Issue.record("registered after its cancellation"); return }
        #expect(stopped.code == .shutDown, "\(stopped)")

        let answered = Self.registered(service)
        try #require(await clock.waitForPending(1))
        service.record(.registered(name: "Lobby", domain: WideAreaWorld.zoneName))
        #expect(try await answered.value.get() == "Lobby")
        #expect(clock.pendingCount == 0, "a deadline was left: \(clock.pendingDeadlines)")
    }
}
