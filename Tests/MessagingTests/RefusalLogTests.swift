import Foundation
import Logging
import Scheduling
import TestWaits
import Testing

import Locks
@testable import Messaging
import ProtocolCore
import Transport

/// Log lines kept in memory.
final class CapturedLog: Sendable {
    struct Line: Sendable {
        let level: Logger.Level
        let message: String
    }
    private let storage = Locked<[Line]>([])
    var lines: [Line] { storage.withLock { $0 } }

    func logger(_ label: String = "captured") -> Logger {
        var logger = Logger(label: label) { _ in Handler(log: self) }
        logger.logLevel = .debug
        return logger
    }

    fileprivate func append(_ line: Line) { storage.withLock { $0.append(line) } }

    struct Handler: LogHandler {
        let log: CapturedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .debug
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            log.append(Line(level: event.level, message: "\(event.message)"))
        }
    }
}

/// Refusals are logged as a summary, not one line per attempt (issue 28: a flood of failed
/// handshakes wrote 1.8 MB of log in 10 s).
@Suite(.serialized) struct RefusalLogTests {
    /// 200 peers that speak another protocol: every one is refused (counted; an event each, up to
    /// 100 a second), the log has the first in full and then one summary line with the count and
    /// the source.
    @Test func aFloodOfFailedHandshakesIsLoggedAsASummary() async throws {
        let log = CapturedLog()
        let harness = try await LoopbackServer(
            security: .encrypted(identity: .ephemeral(), trust: .anyKey), logger: log.logger(),
            configure: { $0.refusalLogInterval = .seconds(3600) })  // one interval: the summary comes at stop()
        let (server, events, port) = (harness.server, harness.events, harness.port)
        let attempts = 200
        await offThePool {
            for _ in 0..<attempts {
                guard let peer = try? HostilePeer(port: port) else { continue }
                peer.write(Array("GET / HTTP/1.1\r\n\r\n".utf8))  // not the version-2 preamble
                _ = peer.serverClosed()  // (closed when `peer` goes)
            }
        }
        try await waitUntil("all \(attempts) refused") { server.admissionCounts.refusals >= attempts }
        // Events: every one, or 100 a second at most (a flood must not cost the app a wake-up each).
        try await events.waitForCount("their events", min(attempts, MessageServer.refusedEventsPerSecond)) {
            if case .refused = $0 { true } else { false }
        }
        harness.pump.cancel()
        await server.stop()  // ends the interval: the summary
        let loud = log.lines.filter { $0.level >= .notice }
        #expect(loud.count <= 3, "\(loud.count) lines at notice or above: \(loud.prefix(5).map(\.message))")
        let summary = loud.first { $0.message.hasPrefix("refused \(attempts) connections") }
        #expect(summary != nil, "no summary among \(loud.map(\.message))")
        #expect(summary?.message.contains("127.0.0.1 \(attempts)") == true)
        #expect(summary?.message.contains("handshake: versionMismatch \(attempts)") == true)
    }

    /// The summary is logged when the interval ends — not a moment before — without another
    /// refusal to trigger it (on a manual clock: the interval is ten minutes, the test instant).
    @Test func theSummaryComesWhenTheIntervalEnds() async throws {
        let log = CapturedLog()
        let clock = ManualScheduler()
        let refusals = RefusalLog(logger: log.logger(), interval: .seconds(600), scheduler: clock)
        let source = try SocketAddress(ipAddress: "192.0.2.7", port: 5)
        for _ in 0..<3 { refusals.record(reason: "busy", source: source, detail: "refusing connection: busy") }
        clock.advance(by: .seconds(599))
        #expect(log.lines.map(\.message) == ["refusing connection: busy"])
        clock.advance(by: .seconds(1))
        #expect(log.lines.map(\.message) == [
            "refusing connection: busy",
            "refused 3 connections in the last 600.0 seconds (2 not logged one by one): by reason busy 3; by source 192.0.2.7 3",
        ])
    }

    /// The summary names the most frequent sources first and says how many more there were.
    @Test func theSummaryCountsByReasonAndSource() async throws {
        let log = CapturedLog()
        let refusals = RefusalLog(logger: log.logger(), interval: .seconds(3600))
        for index in 0..<8 {
            let source = try SocketAddress(ipAddress: "10.0.0.\(index + 1)", port: 40_000)
            for _ in 0...index { refusals.record(reason: "handshake: helloFailed", source: source, detail: "bad hello") }
        }
        refusals.record(reason: "connection limit", source: try SocketAddress(ipAddress: "::1", port: 1), detail: "full")
        refusals.flush()
        let messages = log.lines.map(\.message)
        #expect(messages.count == 3, "\(messages)")  // the first of each reason, then the summary
        #expect(messages.first == "bad hello")
        #expect(messages.dropFirst().first == "full")
        let summary = messages.last ?? ""
        #expect(summary.hasPrefix("refused 37 connections in the last 3600.0 seconds (35 not logged one by one)"), "\(summary)")
        #expect(summary.contains("by reason handshake: helloFailed 36, connection limit 1"), "\(summary)")
        #expect(summary.contains("by source 10.0.0.8 8, 10.0.0.7 7, 10.0.0.6 6, 10.0.0.5 5, 10.0.0.4 4 and 4 more addresses"), "\(summary)")
        refusals.flush()
        #expect(log.lines.count == 3)  // nothing more to say
    }
}

/// Admission: connections in their handshake are bounded, in all and per source address; one over
/// the bound gets REFUSE `busy` at once, before any key agreement (issue 28).
@Suite(.serialized) struct AdmissionTests {
    func server(total: Int, perAddress: Int) async throws -> LoopbackServer {
        try await LoopbackServer(
            security: .encrypted(identity: .ephemeral(), trust: .anyKey),
            configure: {
                $0.maxPendingHandshakes = total
                $0.maxPendingHandshakesPerAddress = perAddress
                $0.channel.helloTimeout = .seconds(30)  // the stalled peers hold their slots
            })
    }

    /// One connection attempt with the server's security: nil when it got in (then closed).
    func attempt(_ harness: LoopbackServer) async -> TransportError? {
        var configuration = ChannelConfiguration(name: "latecomer")
        configuration.security = harness.security
        do {
            let channel = try await MessageChannel.connect(
                to: [.ipv4Loopback(port: harness.port)], configuration: configuration, logger: testLogger())
            channel.close()
            return nil
        } catch let error as TransportError {
            return error
        } catch {
            return TransportError(.connectFailed, "\(error)")
        }
    }

    /// Waits until the server holds `count` connections in their handshake.
    func handshakes(_ harness: LoopbackServer, _ count: Int) async throws {
        try await waitUntil("\(count) handshakes in progress") { harness.server.admissionCounts.handshakesInProgress == count }
    }

    /// Peers that connect and say nothing hold handshake slots; the next client, version 2, is
    /// refused busy with a clear error, and the bytes on the wire are a version-1 REFUSE frame with
    /// code "busy" sent before the client said anything. Once the slots are free, it gets in.
    @Test func overTheBoundIsRefusedBusyBeforeTheHandshake() async throws {
        let harness = try await server(total: 3, perAddress: 100)
        let stalled = try (0..<3).map { _ in try HostilePeer(port: harness.port) }
        try await handshakes(harness, 3)  // their handshakes wait for their first bytes
        let refused = await attempt(harness)
        #expect(refused?.code == .serverBusy, "\(String(describing: refused))")
        #expect(refused?.message.contains("busy") == true && refused?.message.contains("try again") == true)
        // A raw peer that sends nothing reads the refusal: a v1 REFUSE frame, code busy.
        let silent = try HostilePeer(port: harness.port)
        let bytes = await offThePool { silent.readAll() }
        var decoder = FrameDecoder(maxFrameSize: 65_535, checkSequence: false)
        decoder.append(contentsOf: bytes)
        let frame = try #require(try decoder.next())
        #expect(bytes.prefix(2) == [0, 0])  // what a version-2 client takes for message 2's length
        // docs/PROTOCOL.md, "Busy": REFUSE, JSON, no flags, no type id, sequence 1.
        #expect(Array(bytes.dropFirst(4).prefix(12)) == [0x03, 0x01, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 1])
        #expect(String(decoding: bytes.dropFirst(16), as: UTF8.self).hasPrefix(#"{"code":"busy","message":"busy: "#))
        #expect(frame.kind == .refuse)
        let refusal = try JSONDecoder().decode(Refusal.self, from: Data(frame.payload))
        #expect(refusal.code == "busy")
        try await harness.events.waitForCount("the second busy refusal", 2) { if case .refused(_, let reason) = $0 { reason.hasPrefix("busy") } else { false } }
        // Slots free again: the latecomer gets in.
        for peer in stalled { peer.reset() }
        try await handshakes(harness, 0)
        let admitted = await attempt(harness)
        #expect(admitted == nil, "still refused: \(String(describing: admitted))")
        await harness.server.stop()
    }

    /// One address holds at most its share: beyond it that address is refused busy.
    @Test func oneAddressCannotTakeEverySlot() async throws {
        let harness = try await server(total: 100, perAddress: 2)
        let stalled = try (0..<2).map { _ in try HostilePeer(port: harness.port) }
        try await handshakes(harness, 2)
        let refused = await attempt(harness)
        #expect(refused?.code == .serverBusy, "\(String(describing: refused))")
        #expect(refused?.message.contains("from 127.0.0.1") == true, "\(String(describing: refused?.message))")
        _ = stalled
        await harness.server.stop()
    }

    /// Handshakes started per second from one address are bounded too: over the rate, a client is
    /// refused busy with the server's retry hint (REFUSE `retry_ms`), and gets in once it is due —
    /// not before. On the server's clock turned by hand: the hint is exact, no sleep.
    @Test func overTheRateIsRefusedWithARetryHint() async throws {
        let clock = ManualScheduler()
        let harness = try await LoopbackServer(
            security: .encrypted(identity: .ephemeral(), trust: .anyKey),
            configure: {
                $0.maxHandshakesPerSecondPerAddress = 2
                $0.channel.scheduler = clock
            })
        #expect(await attempt(harness) == nil)
        clock.advance(by: .milliseconds(100))
        #expect(await attempt(harness) == nil)
        let refused = await attempt(harness)
        #expect(refused?.code == .serverBusy, "\(String(describing: refused))")
        #expect(refused?.message.contains("127.0.0.1 started 2 handshakes in the last second") == true, "\(String(describing: refused?.message))")
        // 2 a second: a token every 500 ms; 100 ms of them passed.
        let hint = try #require(refused?.retryAfter)
        #expect(hint == .milliseconds(400), "\(hint)")
        clock.advance(by: hint - .milliseconds(1))
        let early = await attempt(harness)
        #expect(early?.code == .serverBusy, "a millisecond before the hint: \(String(describing: early))")
        clock.advance(by: .milliseconds(1))
        let admitted = await attempt(harness)
        #expect(admitted == nil, "refused at the hint: \(String(describing: admitted))")
        await harness.server.stop()
    }

    /// docs/PROTOCOL.md's "Busy" bytes are exactly what this server writes for such a refusal.
    @Test func theSpecsBusyBytesAreWhatTheServerWrites() throws {
        let refusal = Refusal(
            code: "busy",
            message: "busy: 127.0.0.1 started 256 handshakes in the last second, the most this server takes from one source; "
                + "try again in 100 ms",
            retryMilliseconds: 100)
        let encoded = try refusal.frameBeforeHandshake.encoded().map { String(format: "%02x", $0) }.joined()
        let spec = try String(
            contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../docs/PROTOCOL.md"),
            encoding: .utf8)
        #expect(spec.contains(encoded), "docs/PROTOCOL.md, \"Busy\", lacks the bytes \(encoded)")
    }

    /// A version-1 client over the bound reads the REFUSE as the answer to its hello.
    @Test func aVersionOneClientReadsTheBusyRefusal() async throws {
        let harness = try await LoopbackServer(
            security: .plaintext,
            configure: {
                $0.maxPendingHandshakes = 1
                $0.channel.helloTimeout = .seconds(30)
            })
        let stalled = try HostilePeer(port: harness.port)
        try await handshakes(harness, 1)
        let refused = await attempt(harness)
        #expect(refused?.code == .serverBusy, "\(String(describing: refused))")
        _ = stalled
        await harness.server.stop()
    }
}
