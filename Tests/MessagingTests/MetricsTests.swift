import CoreMetrics
import Foundation
import Locks
import MetricsTestKit
import TestWaits
import Testing

@testable import Discovery
@testable import Messaging
import ProtocolCore
import Transport

/// The library's swift-metrics instrumentation, read through swift-metrics' own test back end
/// (`TestMetrics`), bound per test with `withMetricsFactory` around the server's, client's or
/// discovery's creation.
@Suite(.serialized) struct MetricsTests {
    struct KV: Codable, Sendable, Equatable {
        var key: String
        var value: String?
    }

    /// Waits (deadline-bounded) until `condition` holds; the metrics are counted on the
    /// connections' loops, after the event the test saw.
    func eventually(_ what: String, timeout: Duration = .seconds(10), _ condition: () -> Bool) async throws {
        try await waitUntil(what, timeout: timeout) { condition() }
    }

    func total(_ metrics: TestMetrics, _ label: String, _ dimensions: [(String, String)]) -> Int64 {
        metrics.counterTotal(label: label, dimensions: dimensions)
    }

    func meter(_ metrics: TestMetrics, _ label: String, role: String) -> Double? {
        try? metrics.expectMeter(label, [("role", role)]).lastValue
    }

    /// A server and a client: connections open and accepted, frames, bytes and messages by type in
    /// both directions, request latency per type, and the close by reason.
    @Test func connectionsFramesMessagesAndRequestsAreCounted() async throws {
        let metrics = TestMetrics()
        let (harness, client) = try await withMetricsFactory(metrics) {
            let harness = try await LoopbackServer(handle: { _, event in
                guard case .received(let connection, let message) = event, message.expectsReply else { return }
                try? await connection.reply(to: message, with: KV(key: "k", value: "v"), type: "kv.ok")
            })
            return (harness, try await harness.client("counted"))
        }
        for _ in 0..<5 { _ = try await client.request(KV(key: "k"), type: "kv.get", expecting: KV.self) }
        for _ in 0..<3 { try await client.send(KV(key: "k"), type: "kv.note") }
        let server = [("role", "server")]
        let clientRole = [("role", "client")]
        // A frame sent is counted once its write returned: the client can have the server's last
        // reply before the server counted it (TSan's slower run once read 4).
        try await eventually("the server counted 3 kv.note and its 5 replies") {
            total(metrics, MetricNames.messagesReceived, server + [("type", "kv.note")]) == 3
                && total(metrics, MetricNames.messagesSent, server + [("type", "kv.ok")]) == 5
        }
        #expect(total(metrics, MetricNames.messagesReceived, server + [("type", "kv.get")]) == 5)
        #expect(total(metrics, MetricNames.messagesReceived, clientRole + [("type", "kv.ok")]) == 5)
        #expect(total(metrics, MetricNames.messagesSent, clientRole + [("type", "kv.get")]) == 5)
        #expect(total(metrics, MetricNames.connectionsAccepted, server) == 1)
        #expect(meter(metrics, MetricNames.connectionsOpen, role: "server") == 1)
        #expect(meter(metrics, MetricNames.connectionsOpen, role: "client") == 1)
        // Frames include the hello, pings and ACKs; bytes are what the system calls moved.
        #expect(total(metrics, MetricNames.framesReceived, server) >= 8)
        #expect(total(metrics, MetricNames.framesSent, clientRole) >= 8)
        #expect(total(metrics, MetricNames.bytesReceived, server) > 8 * 20)
        #expect(total(metrics, MetricNames.bytesSent, clientRole) == total(metrics, MetricNames.bytesReceived, server))
        let latency = try metrics.expectTimer(MetricNames.requestSeconds, clientRole + [("type", "kv.get")])
        #expect(latency.values.count == 5 && latency.values.allSatisfy { $0 > 0 })

        await client.close()
        try await eventually("the server counted the close") {
            total(metrics, MetricNames.connectionsClosed, server + [("reason", "goodbye")]) == 1
        }
        #expect(meter(metrics, MetricNames.connectionsOpen, role: "server") == 0)
        #expect(meter(metrics, MetricNames.connectionsOpen, role: "client") == 0)
        await harness.server.stop()
    }

    /// Refusals by reason (connection limit, a failed hello) and handshake failures by reason.
    @Test func refusalsAndHandshakeFailuresAreCountedByReason() async throws {
        let metrics = TestMetrics()
        let harness = try await withMetricsFactory(metrics) {
            try await LoopbackServer(security: .plaintext, configure: { $0.maxConnections = 1 })
        }
        let first = try await harness.client("first")
        // The second connection is over the limit: refused before its hello.
        let second = try HostilePeer(port: harness.port)
        second.hello()
        #expect(second.serverClosed())
        // A hello of another protocol version: refused after its hello, once the first has gone.
        await first.close()
        try await harness.events.wait("the first closed") { if case .closed = $0 { true } else { false } }
        let old = try HostilePeer(port: harness.port)
        old.hello(version: 0)
        #expect(old.serverClosed())
        let server = [("role", "server")]
        try await eventually("both refusals counted") {
            total(metrics, MetricNames.connectionsRefused, server + [("reason", "connection_limit")]) == 1
                && total(metrics, MetricNames.connectionsRefused, server + [("reason", "handshake")]) == 1
        }
        #expect(total(metrics, MetricNames.handshakeFailures, server + [("reason", "version_mismatch")]) == 1)
        #expect(total(metrics, MetricNames.connectionsAccepted, server) == 1)
        await harness.server.stop()
    }

    /// Type ids come from peers: the first 64 get their own metric, the rest share `other`.
    @Test func messageTypeLabelsAreBounded() async throws {
        let metrics = TestMetrics()
        let (harness, client) = try await withMetricsFactory(metrics) {
            let harness = try await LoopbackServer()
            return (harness, try await harness.client("inventive"))
        }
        for index in 0..<100 { try await client.send(KV(key: "\(index)"), type: "made.up.\(index)") }
        let server = [("role", "server")]
        try await eventually("100 messages counted") {
            metrics.counters(label: MetricNames.messagesReceived).filter { $0.dimensions.contains { $0 == ("role", "server") } }
                .reduce(0) { $0 + $1.totalValue } == 100
        }
        let labels = Set(
            metrics.counters(label: MetricNames.messagesReceived)
                .filter { $0.dimensions.contains { $0 == ("role", "server") } }
                .compactMap { $0.dimensions.first { $0.0 == "type" }?.1 })
        #expect(labels.count == BoundedLabels<Counter>.limit + 1)
        #expect(labels.contains("other"))
        #expect(total(metrics, MetricNames.messagesReceived, server + [("type", "other")]) == Int64(100 - BoundedLabels<Counter>.limit))
        await client.close()
        await harness.server.stop()
    }

    /// A request nobody answers counts a timeout, not a latency.
    @Test func requestTimeoutsAreCounted() async throws {
        let metrics = TestMetrics()
        let (harness, client) = try await withMetricsFactory(metrics) {
            let harness = try await LoopbackServer()
            return (harness, try await harness.client("impatient"))
        }
        await #expect(throws: TransportError.self) {
            _ = try await client.request(KV(key: "k"), type: "kv.never", expecting: KV.self, timeout: .milliseconds(100))
        }
        #expect(total(metrics, MetricNames.requestTimeouts, [("role", "client")]) == 1)
        #expect(metrics.timers(label: MetricNames.requestSeconds).isEmpty)
        await client.close()
        await harness.server.stop()
    }

    /// A peer that stops reading makes the server's sender wait for room: the wait is counted when
    /// it begins, and its duration when it ends (here: when the peer resets).
    @Test func sendQueueWaitsAreCounted() async throws {
        let metrics = TestMetrics()
        let harness = try await withMetricsFactory(metrics) { try await LoopbackServer(security: .plaintext) }
        let peer = try HostilePeer(port: harness.port)
        peer.hello()
        let accepted = try await harness.events.wait("accepted") { if case .accepted = $0 { true } else { false } }
        guard case .accepted(let connection) = accepted else { return }
        let sender = Task {
            let chunk = [UInt8](repeating: 7, count: 64 * 1024)
            for _ in 0..<1_000 {  // 64 MiB at most: more than any socket buffer takes
                do { try await connection.channel.sendRaw(chunk, type: "bulk") } catch { return }
            }
        }
        let server = [("role", "server")]
        try await eventually("a send-queue wait") { total(metrics, MetricNames.sendQueueWaits, server) >= 1 }
        peer.reset()
        await sender.value
        let waits = try metrics.expectTimer(MetricNames.sendQueueWaitSeconds, server)
        #expect(waits.values.count >= 1)
        await harness.server.stop()
    }

    /// Discovery: the daemon state as a gauge (in the unit tests no D-Bus, so `failed`; `running`
    /// where a daemon answers), one state at 1 and the others at 0, and events by kind.
    @Test func discoveryReportsTheDaemonState() async throws {
        let metrics = TestMetrics()
        let discovery = withMetricsFactory(metrics) { ServiceDiscovery(logger: testLogger(), backend: .avahi) }
        func gauge(_ state: String) -> Double? {
            try? metrics.expectGauge(DiscoveryMetrics.stateLabel, [("state", state)]).lastValue
        }
        try await eventually("the daemon state gauge says failed or running") { gauge("failed") == 1 || gauge("running") == 1 }
        let current: String
        switch discovery.daemonState {
        case .failed: current = "failed"
        case .running: current = "running"
        default: current = "\(discovery.daemonState)"
        }
        for state in DiscoveryMetrics.states { #expect(gauge(state) == (state == current ? 1 : 0), "state \(state)") }
        await #expect(throws: DiscoveryError.self) {
            _ = try await discovery.resolve(
                ServiceIdentity(name: "nothing", type: "_none._tcp", domain: "local"), timeout: .milliseconds(200))
        }
        #expect(total(metrics, DiscoveryMetrics.eventsLabel, [("event", "resolve_failed")]) == 1)
        await discovery.shutdown()
    }

    /// The README's table lists every metric the library makes, with every close reason.
    @Test func theReadmeListsEveryMetric() throws {
        let readme = try ReadmeTests.read("README.md")
        let labels = [
            MetricNames.framesReceived, MetricNames.framesSent, MetricNames.bytesReceived, MetricNames.bytesSent,
            MetricNames.messagesReceived, MetricNames.messagesSent, MetricNames.sendQueueWaits,
            MetricNames.sendQueueWaitSeconds, MetricNames.connectionsOpen, MetricNames.connectionsAccepted,
            MetricNames.connectionsRefused, MetricNames.connectionsClosed, MetricNames.handshakeFailures,
            MetricNames.requestSeconds, MetricNames.requestTimeouts, DiscoveryMetrics.eventsLabel,
            DiscoveryMetrics.stateLabel,
        ]
        for label in labels { #expect(readme.contains("`\(label)`"), "README lacks \(label)") }
        let reasons: [CloseReason] = [
            .closedByPeer, .goodbye(""), .reset, .frameTooLarge(size: 0, limit: 0), .protocolError(""), .idleTimeout,
            .heartbeatTimeout, .helloFailed(""), .localClose, .error(0), .sessionExpired, .superseded,
        ]
        for reason in reasons {
            let label = MessagingMetrics.label(reason)
            #expect(readme.contains("`\(label)`"), "README lacks the close reason \(label)")
        }
    }

    /// With swift-metrics' no-op factory (nothing bootstrapped) nothing is made.
    @Test func noBackEndMeansNoMetrics() {
        #expect(withMetricsFactory(NOOPMetricsHandler.instance) { MessagingMetrics.make(role: "server") } == nil)
        #expect(withMetricsFactory(NOOPMetricsHandler.instance) { DiscoveryMetrics.make() } == nil)
    }
}
