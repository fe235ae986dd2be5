import CoreMetrics
import ProtocolCore
import Transport

/// The connection, handshake and request metrics of one ``MessageServer`` or ``MessageClient``,
/// reported through swift-metrics (the app bootstraps the back end: Prometheus, StatsD,
/// OpenTelemetry…). Every metric has a `role` dimension (`server` or `client`); the names are
/// listed in the README's "Metrics" section.
///
/// Made when the server or client is created, with `MetricsSystem.factory` at that moment (the
/// bootstrapped back end, or one bound with `withMetricsFactory`). With swift-metrics' no-op factory
/// nothing is made and nothing is counted.
package final class MessagingMetrics: Sendable {
    let transport: TransportMetrics
    let open: Meter
    let accepted: Counter
    let requestTimeouts: Counter
    /// Sources blocked by the listener's filter after flooding (``ServerConfiguration/floodBlockThreshold``).
    let sourcesBlocked: Counter
    /// The server's heartbeat pace in seconds, 0 when it does not pace (``ServerConfiguration/heartbeatsPerSecond``).
    let heartbeatPace: Gauge
    private let refusals: BoundedLabels<Counter>
    private let closes: BoundedLabels<Counter>
    private let handshakeFailures: BoundedLabels<Counter>
    private let requestTimers: BoundedLabels<Timer>

    /// Why a server refused a connection (the `reason` dimension; a fixed set).
    enum Refusal: String {
        /// ``ServerConfiguration/maxConnections`` reached, or the server was stopping.
        case connectionLimit = "connection_limit"
        /// The hello or the secure handshake failed (``handshakeFailed(_:)`` says how).
        case handshake
        /// The SESSION exchange failed or named another identity's session.
        case session
        /// Too many connections in their handshake (``ServerConfiguration/maxPendingHandshakes``, in
        /// all or from one address): refused with REFUSE `busy` before any key agreement.
        case busy
    }

    /// Metrics for `role` in the current factory; nil when that is the no-op factory.
    static func make(role: String) -> MessagingMetrics? {
        let factory = MetricsSystem.factory
        if factory is NOOPMetricsHandler { return nil }
        return MessagingMetrics(role: role, factory: factory)
    }

    init(role: String, factory: any MetricsFactory) {
        transport = TransportMetrics(role: role, factory: factory)
        let dimensions = [("role", role)]
        open = Meter(label: MetricNames.connectionsOpen, dimensions: dimensions, factory: factory)
        accepted = Counter(label: MetricNames.connectionsAccepted, dimensions: dimensions, factory: factory)
        requestTimeouts = Counter(label: MetricNames.requestTimeouts, dimensions: dimensions, factory: factory)
        sourcesBlocked = Counter(label: MetricNames.sourcesBlocked, dimensions: dimensions, factory: factory)
        heartbeatPace = Gauge(label: MetricNames.heartbeatPace, dimensions: dimensions, factory: factory)
        refusals = .counters(MetricNames.connectionsRefused, by: "reason", dimensions: dimensions, factory: factory)
        closes = .counters(MetricNames.connectionsClosed, by: "reason", dimensions: dimensions, factory: factory)
        handshakeFailures = .counters(MetricNames.handshakeFailures, by: "reason", dimensions: dimensions, factory: factory)
        requestTimers = BoundedLabels { type in
            Timer(label: MetricNames.requestSeconds, dimensions: dimensions + [("type", type)], factory: factory)
        }
    }

    func refused(_ reason: Refusal) { refusals[reason.rawValue].increment() }

    /// A connection that completed its hello closed.
    func closed(_ reason: CloseReason) {
        open.decrement()
        closes[Self.label(reason)].increment()
    }

    /// The hello or secure handshake failed with `error`.
    func handshakeFailed(_ error: any Error) {
        let reason: String
        if let error = error as? TransportError {
            switch error.code {
            case .versionMismatch: reason = "version_mismatch"
            case .helloRefused: reason = "refused"
            case .authenticationFailed: reason = "authentication"
            case .untrustedKey: reason = "untrusted_key"
            case .connectionClosed: reason = "connection_lost"
            default: reason = "failed"  // timed out, malformed, or the connection failed
            }
        } else {
            reason = "failed"
        }
        handshakeFailures[reason].increment()
    }

    /// A reply to a request of type `type` arrived `nanoseconds` after the request was queued.
    func requestAnswered(type: String, nanoseconds: UInt64) {
        requestTimers[type].recordNanoseconds(Int64(clamping: nanoseconds))
    }

    /// The `reason` dimension of a close (a fixed set: the case, without its text).
    static func label(_ reason: CloseReason) -> String {
        switch reason {
        case .closedByPeer: "closed_by_peer"
        case .goodbye: "goodbye"
        case .reset: "reset"
        case .frameTooLarge: "frame_too_large"
        case .protocolError: "protocol_error"
        case .idleTimeout: "idle_timeout"
        case .heartbeatTimeout: "heartbeat_timeout"
        case .helloFailed: "hello_failed"
        case .localClose: "local_close"
        case .error: "error"
        case .sessionExpired: "session_expired"
        case .superseded: "superseded"
        }
    }
}
