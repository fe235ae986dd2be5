import CoreMetrics
import Locks
import ProtocolCore

/// The traffic counters of every connection made with one configuration, reported through
/// swift-metrics. The messaging layer makes one per server or client when a metrics back end is
/// bootstrapped; with none (swift-metrics' no-op factory) there is none, and a connection pays one
/// nil check per frame.
///
/// Counted where it happens: frames and message type ids when a frame is queued or decoded, bytes
/// when a system call moved them, a send-queue wait when a sender suspends for room.
package final class TransportMetrics: Sendable {
    let framesIn: Counter
    let framesOut: Counter
    let bytesIn: Counter
    let bytesOut: Counter
    let sendWaits: Counter
    let sendWaitTime: Timer
    let messagesIn: BoundedLabels<Counter>
    let messagesOut: BoundedLabels<Counter>

    /// - Parameters:
    ///   - role: `server` or `client`: the `role` dimension of every metric.
    ///   - factory: Where the metrics go (captured now: later bootstraps do not move them).
    package init(role: String, factory: any MetricsFactory) {
        let dimensions = [("role", role)]
        framesIn = Counter(label: MetricNames.framesReceived, dimensions: dimensions, factory: factory)
        framesOut = Counter(label: MetricNames.framesSent, dimensions: dimensions, factory: factory)
        bytesIn = Counter(label: MetricNames.bytesReceived, dimensions: dimensions, factory: factory)
        bytesOut = Counter(label: MetricNames.bytesSent, dimensions: dimensions, factory: factory)
        sendWaits = Counter(label: MetricNames.sendQueueWaits, dimensions: dimensions, factory: factory)
        sendWaitTime = Timer(label: MetricNames.sendQueueWaitSeconds, dimensions: dimensions, factory: factory)
        messagesIn = .counters(MetricNames.messagesReceived, by: "type", dimensions: dimensions, factory: factory)
        messagesOut = .counters(MetricNames.messagesSent, by: "type", dimensions: dimensions, factory: factory)
    }

    /// A frame was queued for sending.
    @inline(__always)
    func sent(_ frame: Frame) {
        framesOut.increment()
        if frame.kind == .message { messagesOut[frame.typeID].increment() }
    }

    /// A frame was decoded.
    @inline(__always)
    func received(_ frame: Frame) {
        framesIn.increment()
        if frame.kind == .message { messagesIn[frame.typeID].increment() }
    }
}

/// The metric names, one place (the README and the DocC "Metrics" article list them).
package enum MetricNames {
    package static let framesReceived = "lanmsg_frames_received_total"
    package static let framesSent = "lanmsg_frames_sent_total"
    package static let bytesReceived = "lanmsg_bytes_received_total"
    package static let bytesSent = "lanmsg_bytes_sent_total"
    package static let messagesReceived = "lanmsg_messages_received_total"
    package static let messagesSent = "lanmsg_messages_sent_total"
    package static let sendQueueWaits = "lanmsg_send_queue_waits_total"
    package static let sendQueueWaitSeconds = "lanmsg_send_queue_wait_seconds"
    package static let connectionsOpen = "lanmsg_connections_open"
    package static let connectionsAccepted = "lanmsg_connections_accepted_total"
    package static let connectionsRefused = "lanmsg_connections_refused_total"
    package static let connectionsClosed = "lanmsg_connections_closed_total"
    package static let handshakeFailures = "lanmsg_handshake_failures_total"
    package static let requestSeconds = "lanmsg_request_duration_seconds"
    package static let requestTimeouts = "lanmsg_request_timeouts_total"
    package static let sourcesBlocked = "lanmsg_sources_blocked_total"
    package static let heartbeatPace = "lanmsg_heartbeat_pace_seconds"
    package static let discoveryEvents = "lanmsg_discovery_events_total"
    package static let discoveryDaemonState = "lanmsg_discovery_daemon_state"
}

/// One metric per label value, for values that come from peers (message type ids): the first
/// ``limit`` distinct values get their own metric, every later one shares `other`, so a peer
/// inventing type ids cannot grow the metric set (or a Prometheus scrape) without bound.
package final class BoundedLabels<Metric: Sendable>: Sendable {
    /// Distinct values with their own metric (then `other`).
    package static var limit: Int { 64 }
    private let make: @Sendable (String) -> Metric
    private let table = Locked<[String: Metric]>([:])

    package init(make: @escaping @Sendable (String) -> Metric) { self.make = make }

    /// Counters named `label` with `dimensions` plus one whose name is `dimension`.
    package static func counters(
        _ label: String, by dimension: String, dimensions: [(String, String)], factory: any MetricsFactory
    ) -> BoundedLabels<Counter> where Metric == Counter {
        BoundedLabels<Counter> { value in
            Counter(label: label, dimensions: dimensions + [(dimension, value)], factory: factory)
        }
    }

    package subscript(value: String) -> Metric {
        table.withLock { table in
            if let metric = table[value] { return metric }
            let key = table.count < Self.limit ? value : "other"
            if let metric = table[key] { return metric }
            let metric = make(key)
            table[key] = metric
            return metric
        }
    }
}
