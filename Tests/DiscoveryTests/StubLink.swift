@testable import Discovery

/// A link backend for tests of what sits above it (`ServiceDiscovery`'s resolve, snapshot and
/// merged browse): a test's backend writes only what it does — browse, resolve — and gets the
/// rest from here: a running embedded stack that publishes nothing, browses and watches nothing
/// (their streams end when stopped) and answers no resolve.
protocol StubLink: DiscoveryBackend {}

extension StubLink {
    var kind: DiscoveryBackendKind { .embedded }
    var currentState: DaemonState { .running }
    var currentHostName: String { "stub" }
    func stateUpdates() -> AsyncStream<DaemonState> { AsyncStream { $0.finish() } }
    func publish(_ request: PublishRequest) async -> Result<PublishedService, DiscoveryError> {
        .failure(DiscoveryError(.shutDown, "this test's link publishes nothing"))
    }
    func startBrowse(_ request: BrowseRequest, continuation: AsyncStream<BrowseEvent>.Continuation) -> @Sendable () -> Void {
        { continuation.finish() }
    }
    func resolve(_ request: ResolveRequest, timeout: Duration) async -> Result<ResolvedService, DiscoveryError> {
        .failure(DiscoveryError(.timedOut, "this test's link answers no resolve"))
    }
    func startWatch(_ request: ResolveRequest, continuation: AsyncStream<ResolvedService>.Continuation) -> @Sendable () -> Void {
        { continuation.finish() }
    }
    func shutdown() async {}
    func beginShutdown() {}
}
