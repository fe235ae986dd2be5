import Logging
import Scheduling
import Synchronization
import TestWaits
import Testing

@testable import Discovery

/// `ServiceDiscovery.services(ofType:timeout:until:)` — the snapshot a "list" command takes — in
/// virtual time (issue 54, 1): it returns at its timeout on the discovery object's clock (not a
/// moment before) with what the browse showed then, or at once when `until` says so, and its
/// browse and its timer end with it. The link is a backend whose browse events the test sends.
@Suite struct ServicesSnapshotTests {
    final class BrowsedLink: StubLink {
        private let browse = Mutex<AsyncStream<BrowseEvent>.Continuation?>(nil)
        /// Browses started and stopped, as waits can see them change.
        let started = Observed(0)
        let stopped = Observed(0)

        var isBrowsing: Bool { browse.withLock { $0 != nil } }
        func send(_ event: BrowseEvent) { _ = browse.withLock { $0 }?.yield(event) }

        func startBrowse(_ request: BrowseRequest, continuation: AsyncStream<BrowseEvent>.Continuation) -> @Sendable () -> Void {
            browse.withLock { $0 = continuation }
            started.update { $0 += 1 }
            return {
                self.stopped.update { $0 += 1 }
                continuation.finish()
            }
        }
    }

    static let type = "_chat._tcp"

    static func service(_ name: String) -> DiscoveredService {
        DiscoveredService(identity: ServiceIdentity(name: name, type: type), seenOn: [], isLocal: false, isOwn: false)
    }

    static func discovery(_ link: BrowsedLink, _ clock: ManualScheduler) -> ServiceDiscovery {
        ServiceDiscovery(
            logger: Logger(label: "services-snapshot"), configuration: DiscoveryConfiguration(), backend: link, wideArea: nil,
            scheduler: clock)
    }

    /// A count shared with a task: the events `until` was asked about (each after the snapshot took
    /// the event in), the snapshot's end.
    final class Count: Sendable {
        let count = Observed(0)  // a wait is woken by each change, not polled
        var value: Int { count.value }
        func add() { count.update { $0 += 1 } }
    }

    @Test func theSnapshotIsWhatTheBrowseShowedAtTheTimeout() async throws {
        let clock = ManualScheduler()
        let link = BrowsedLink()
        let discovery = Self.discovery(link, clock)
        let asked = Count()
        let ended = Count()
        let snapshot = Task {
            defer { ended.add() }
            return try await discovery.services(ofType: Self.type, timeout: .seconds(3)) { _, _ in
                asked.add()
                return false
            }
        }
        try await link.started.wait("the browse started") { $0 >= 1 }
        try #require(await clock.waitForPending(1), "the timeout was never armed")
        let start = clock.now
        #expect(clock.pendingDeadlines == [start + 3_000_000_000])
        for event: BrowseEvent in [.added(Self.service("Lobby")), .added(Self.service("Attic")), .removed(Self.service("Lobby")),
            .added(Self.service("Cellar")), .allForNow]
        {
            link.send(event)
        }
        try await asked.count.wait("the five events taken in") { $0 == 5 }
        clock.advance(by: .milliseconds(2_999))
        #expect(clock.pendingCount == 1 && ended.value == 0, "the snapshot ended before its timeout")
        clock.advance(by: .milliseconds(1))
        let services = try await value(of: Task { try? await snapshot.value }, "the snapshot")
        #expect(services?.map(\.name) == ["Attic", "Cellar"], "what the browse showed at the timeout, by name")
        try await link.stopped.wait("the browse stopped") { $0 == 1 }
        #expect(clock.pendingCount == 0)
        await discovery.shutdown()
    }

    @Test func untilEndsItAtOnceAndStopsTheTimer() async throws {
        let clock = ManualScheduler()
        let link = BrowsedLink()
        let discovery = Self.discovery(link, clock)
        let snapshot = Task { try await discovery.services(ofType: Self.type, timeout: .seconds(3)) { _, allForNow in allForNow } }
        try await link.started.wait("the browse started") { $0 >= 1 }
        try #require(await clock.waitForPending(1), "the timeout was never armed")
        link.send(.added(Self.service("Lobby")))
        link.send(.allForNow)
        let services = try await value(of: Task { try? await snapshot.value }, "the snapshot")
        #expect(services?.map(\.name) == ["Lobby"])
        #expect(clock.pendingCount == 0, "the timeout's timer outlived the snapshot: \(clock.pendingDeadlines)")
        try await link.stopped.wait("the browse stopped") { $0 == 1 }
        await discovery.shutdown()
    }
}
