import CoreMetrics

/// Discovery's metrics through swift-metrics: `lanmsg_discovery_events_total{event}` and
/// `lanmsg_discovery_daemon_state{state}` (1 for the current state, 0 for the others). Made when
/// a ``ServiceDiscovery`` is created, with `MetricsSystem.factory` at that moment; nil (nothing
/// counted) with swift-metrics' no-op factory. Events are rare, so metrics are looked up when they
/// happen (the back end keeps one per label and dimensions).
final class DiscoveryMetrics: Sendable {
    /// The `event` dimension's values.
    enum Event: String {
        case published, publishFailed = "publish_failed"
        case browseAdded = "browse_added", browseRemoved = "browse_removed", browseFailed = "browse_failed"
        case resolved, resolveFailed = "resolve_failed"
    }
    static let eventsLabel = "lanmsg_discovery_events_total"
    static let stateLabel = "lanmsg_discovery_daemon_state"
    static let states = ["connecting", "registering", "running", "failed", "stopped"]

    let factory: any MetricsFactory

    static func make() -> DiscoveryMetrics? {
        let factory = MetricsSystem.factory
        return factory is NOOPMetricsHandler ? nil : DiscoveryMetrics(factory: factory)
    }

    init(factory: any MetricsFactory) { self.factory = factory }

    func count(_ event: Event) {
        Counter(label: Self.eventsLabel, dimensions: [("event", event.rawValue)], factory: factory).increment()
    }

    func browsed(_ event: BrowseEvent) {
        switch event {
        case .added: count(.browseAdded)
        case .removed: count(.browseRemoved)
        case .failed: count(.browseFailed)
        case .allForNow, .updated: break
        }
    }

    func daemon(_ state: DaemonState) {
        let current: String
        switch state {
        case .connecting: current = "connecting"
        case .registering: current = "registering"
        case .running: current = "running"
        case .failed: current = "failed"
        case .stopped: current = "stopped"
        }
        for name in Self.states {
            Gauge(label: Self.stateLabel, dimensions: [("state", name)], factory: factory).record(name == current ? 1 : 0)
        }
    }
}
