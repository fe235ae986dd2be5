import CoreMetrics
import Foundation
import MetricsTestKit
import TestWaits
import Testing

import Locks
@testable import Messaging
import ProtocolCore
import Transport

/// A handshake flooder on loopback: threads that connect from `source` (another loopback
/// address than the legitimate clients' 127.0.0.1), send the version-2 preamble and a Noise
/// message 1 with a random key, read the first bytes of the answer, and reset. An attempt whose
/// connect or answer takes longer than 200 ms is abandoned (a blocked source's SYNs are dropped).
final class Flooder: Sendable {
    struct Counts: Sendable {
        var attempts = 0
        var answered = 0  // message 2: the server did the handshake work
        var busy = 0  // REFUSE busy, before any handshake work
        var unanswered = 0  // no connection or no answer within 200 ms
    }

    /// A test's wait on them is woken by each attempt's outcome, not polled.
    let counts = Observed(Counts())
    private let stopped = Locked(false)
    private let done = DispatchGroup()

    init(port: UInt16, source: String = "127.0.0.2", threads: Int = 3, maxAttempts: Int = 20_000, deadline: Duration = .seconds(20)) {
        let end = ContinuousClock.now + deadline
        for _ in 0..<threads {
            done.enter()
            DispatchQueue.global().async { [counts, stopped, done] in
                defer { done.leave() }
                while !stopped.withLock({ $0 }), ContinuousClock.now < end {
                    let outcome = Self.attempt(port: port, source: source)
                    let total = counts.update { counts -> Int in
                        counts.attempts += 1
                        switch outcome {
                        case .answered: counts.answered += 1
                        case .busy: counts.busy += 1
                        case .unanswered: counts.unanswered += 1
                        }
                        return counts.attempts
                    }
                    if total >= maxAttempts { break }
                }
            }
        }
    }

    var current: Counts { counts.value }

    /// Stops the threads and waits for them (bounded: each attempt takes at most 400 ms).
    func stop() async -> Counts {
        stopped.withLock { $0 = true }
        await offThePool { [done] in _ = done.wait(timeout: .now() + 10) }
        return current
    }

    private enum Outcome { case answered, busy, unanswered }

    private static func attempt(port: UInt16, source: String) -> Outcome {
        let fd = loopbackSocket(port: port, from: source, nonblocking: true)
        guard fd >= 0 else { return .unanswered }
        defer { close(fd) }
        var abortive = linger(l_onoff: 1, l_linger: 0)  // reset on close: no TIME_WAIT, ports last
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, socklen_t(MemoryLayout<linger>.size))
        var poll = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        guard Glibc.poll(&poll, 1, 200) == 1, poll.revents & Int16(POLLOUT) != 0 else { return .unanswered }
        var message = Array("LANMSG/2".utf8) + [0, 32]
        message += (0..<32).map { _ in UInt8.random(in: 0...255) }
        guard send(fd, message, message.count, Int32(MSG_NOSIGNAL)) == message.count else { return .unanswered }
        poll = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard Glibc.poll(&poll, 1, 200) == 1 else { return .unanswered }
        var first = [UInt8](repeating: 0, count: 2)
        guard recv(fd, &first, 2, Int32(MSG_WAITALL)) == 2 else { return .unanswered }
        return first == [0, 0] ? .busy : .answered
    }
}

/// Admission under a handshake flood from one host (issue 28), in a short form (the full one,
/// with its figures, is `Benchmarks/flood.sh`): the server holds its bounds, stays quiet in its
/// log, blocks the flooding source at the socket, and serves everyone else meanwhile.
@Suite(.serialized) struct FloodTests {
    @Test func aFloodFromOneHostIsBlockedWhileOthersAreServed() async throws {
        let log = CapturedLog()
        let metrics = TestMetrics()
        let harness = try await withMetricsFactory(metrics) { try await LoopbackServer(
            security: .encrypted(identity: .ephemeral(), trust: .anyKey), logger: log.logger("flooded"),
            configure: { configuration in
                configuration.listener.families = [.ipv4]
                configuration.maxPendingHandshakes = 16
                configuration.maxPendingHandshakesPerAddress = 8
                configuration.maxHandshakesPerSecondPerAddress = 20
                configuration.floodBlockThreshold = 200
                configuration.floodBlockDuration = .seconds(2)
                configuration.refusalLogInterval = .seconds(3600)  // one interval: the summary comes at stop()
            },
            handle: { _, event in
                if case .received(let connection, let message) = event, message.typeID == "echo" {
                    try? await connection.channel.replyRaw(to: message, bytes: message.payload, type: "echo")
                }
            })
        }
        let server = harness.server
        let port = harness.port
        var clientConfiguration = ChannelConfiguration(name: "established")
        clientConfiguration.security = harness.security
        func connect() async throws -> MessageChannel {
            try await MessageChannel.connect(to: [.ipv4Loopback(port: port)], configuration: clientConfiguration, logger: testLogger())
        }
        let established = try await connect()

        let flooder = Flooder(port: port)
        // The flood is refused, then blocked: the kernel drops the source's attempts.
        try await waitUntil("127.0.0.2 blocked", timeout: .seconds(20)) { server.blockedSources == [.ipv4(UInt32(0x7F00_0002).bigEndian)] }
        // The server blocks the source in the step that refuses its 200th attempt, so that
        // refusal's REFUSE may still be on its way to the flooder when the block is seen (a CI run
        // read 199 here).
        try await flooder.counts.wait("the flooder read 200 refusals", timeout: .seconds(10)) { $0.busy >= 200 }
        let atBlock = flooder.current
        // Meanwhile, and while it is blocked, the established client is answered and newcomers from
        // another address get in.
        for round in 0..<50 {
            let reply = try await established.requestRaw([UInt8(round)], type: "echo", timeout: .seconds(10))
            #expect(reply.payload == [UInt8(round)])
        }
        for _ in 0..<5 {
            let newcomer = try await connect()
            newcomer.close()
        }
        try await flooder.counts.wait("blocked attempts unanswered", timeout: .seconds(10)) { $0.unanswered > atBlock.unanswered + 5 }
        // The block ends by itself: the source's attempts reach the server again (refused busy).
        try await waitUntil("the block lifted", timeout: .seconds(10)) { server.blockedSources.isEmpty }
        let atLift = flooder.current
        try await flooder.counts.wait("attempts answered again", timeout: .seconds(10)) { $0.busy > atLift.busy }
        // Flooding again soon after: blocked again, twice as long, after a sixteenth of the
        // refusals (on probation).
        try await waitUntil("blocked again", timeout: .seconds(20)) {
            log.lines.contains { $0.message.contains("blocking its attempts for 4.0 seconds") }
        }
        #expect(log.lines.contains { $0.message.contains("127.0.0.2 made 12 connection attempts in one second that were refused busy, soon after its last block") })
        let counts = await flooder.stop()
        established.close()
        harness.pump.cancel()
        await server.stop()

        #expect(counts.answered <= counts.attempts / 4, "the flood got handshake work done: \(counts)")
        // The bounds held: never more handshakes at once than configured.
        #expect(server.admissionCounts.handshakesHighWater <= 16)
        // The log: the first refusal of each reason, the block, the summary — not a line per attempt.
        let loud = log.lines.filter { $0.level >= .notice }
        #expect(loud.count <= 9, "\(loud.count) lines at notice or above: \(loud.prefix(10).map(\.message))")
        #expect(loud.contains { $0.message.contains("127.0.0.2 made 200 connection attempts in one second") })
        #expect(metrics.counterTotal(label: MetricNames.sourcesBlocked, dimensions: [("role", "server")]) == 2)
        print("MEASURED flood (debug build, 3 threads): \(counts); refused \(server.admissionCounts.refusals)")
    }
}
