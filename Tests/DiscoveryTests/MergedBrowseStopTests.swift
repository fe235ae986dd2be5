import Dispatch
import Scheduling
import Synchronization
import Testing

@testable import Discovery

/// A merged browse's stop can be awaited (issue 54, 4): `stopped()` returns once every task the
/// browse started has ended — not only been cancelled — so that `ServiceDiscovery.shutdown()`
/// leaves nothing of a browse running.
@Suite struct MergedBrowseStopTests {
    /// A link with one service on it, whose resolve takes `resolveTime` of real time and ignores
    /// its cancellation (as a backend may: Avahi's resolve ends at its own timeout).
    final class SlowLink: StubLink {
        let resolveTime: Duration
        let resolving = Atomic<Int>(0)
        let resolveStarted: AsyncStream<Void>
        private let started: AsyncStream<Void>.Continuation

        init(resolveTime: Duration) {
            self.resolveTime = resolveTime
            (resolveStarted, started) = AsyncStream.makeStream(of: Void.self)
        }

        func startBrowse(_ request: BrowseRequest, continuation: AsyncStream<BrowseEvent>.Continuation) -> @Sendable () -> Void {
            continuation.yield(
                .added(DiscoveredService(identity: ServiceIdentity(name: "Lobby", type: request.type), seenOn: [], isLocal: false, isOwn: false)))
            return { continuation.finish() }
        }
        func resolve(_ request: ResolveRequest, timeout: Duration) async -> Result<ResolvedService, DiscoveryError> {
            resolving.add(1, ordering: .sequentiallyConsistent)
            started.yield()
            // Real time, not cancellable: a `DispatchScheduler` wait in a continuation.
            await withCheckedContinuation { continuation in
                DispatchScheduler().schedule(after: resolveTime) { continuation.resume() }
            }
            resolving.subtract(1, ordering: .sequentiallyConsistent)
            return .failure(DiscoveryError(.timedOut, "no answer"))
        }
    }

    @Test func aStopIsAwaitedUntilTheLastTaskOfTheBrowseEnded() async throws {
        let world = WideAreaWorld()
        let link = SlowLink(resolveTime: .milliseconds(100))
        let (browse, events) = world.mergedBrowse(link: link)
        browse.start(backend: link, request: BrowseRequest(type: WideAreaWorld.type, domain: nil, interface: nil, ipVersion: .any))
        // The link's service is being resolved (for its key, to merge it with the zone's).
        var started = link.resolveStarted.makeAsyncIterator()
        _ = await started.next()
        #expect(link.resolving.load(ordering: .sequentiallyConsistent) == 1)
        await browse.stopped()
        // Without awaiting, `stopped()` would return at once, the resolve still running for 100 ms.
        #expect(
            link.resolving.load(ordering: .sequentiallyConsistent) == 0,
            "stopped() returned while a task of the browse (the link service's resolve) still ran")
        for await _ in events {}  // the stream ended at the stop
        #expect(world.clock.pendingCount == 0, "a timer of the browse was left: \(world.clock.pendingCount)")
        await browse.stopped()  // again: at once
    }
}
