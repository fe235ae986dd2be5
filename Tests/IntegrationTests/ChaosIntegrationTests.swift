import Foundation
import Messaging
import TestWaits
import Testing

/// Message sessions under chaos on the veth link between the two hosts: the link flaps at random,
/// TCP connections are destroyed mid-stream (`ss -K`), nftables drops 5 % of the packets in both
/// directions at random (`numgen random`; this kernel has no netem) and `tc tbf` caps each direction
/// at 20 Mbit/s. 100,000 numbered messages go up to `lanmsg-echo` on host b and 20,000 come down,
/// both through the session: each must arrive exactly once, in order. Bounded: the faults stop by
/// themselves when the messages are through or after 240 s, and every fault is undone at the end.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct ChaosIntegrationTests {
    let logger = Harness.logger("chaos-test")
    struct Numbered: Codable, Sendable {
        var n: Int
        /// 200 bytes, so 100,000 messages are 23 MB on the wire: at 20 Mbit/s with 5 % loss they take
        /// long enough for the faults to hit them many times.
        var text: String?
    }
    static let padding = String(repeating: "lorem ipsum ", count: 17)
    struct Stats: Codable, Sendable {
        var received: Int
        var duplicates: Int
        var outOfOrder: Int
        var next: Int
    }

    static let upCount = 100_000
    static let downCount = 20_000

    @Test func messagesArriveExactlyOnceThroughFlapsKillsLossAndARateCap() async throws {
        let port: UInt16 = 7_431
        let server = try Harness.spawn(
            onB: true, [Harness.binary("lanmsg-echo"), "--name", "Chaos Echo", "--type", "_itest-chaos._tcp",
                        "--port", "\(port)"])
        defer { server.stop() }
        try await server.waitForOutput("listening on port")

        var configuration = ClientConfiguration(
            peerName: "chaos", reconnect: ReconnectPolicy(initialDelay: .milliseconds(100), maxDelay: .seconds(1)))
        configuration.channel.pingInterval = .milliseconds(500)
        configuration.channel.heartbeatTimeout = .seconds(2)
        configuration.channel.connectTimeout = .seconds(2)
        // The first connection before the loss: `connect` throws when it cannot connect within the
        // 2 s, and with 5 % of packets dropped each way a SYN and its retry a second later are both
        // lost in about 1 % of runs (it failed CI once so). Every reconnect after it runs under the
        // loss, retried by the policy.
        let client = try await MessageClient.connect(
            to: .host("10.77.0.2", port: port), configuration: configuration, logger: logger)
        try Self.installLossAndRateCap()
        defer { Self.removeFaults() }

        // Everything the client sees, with the time it saw it.
        let down = Observed<(next: Int, received: Int, duplicates: Int, outOfOrder: Int)>((0, 0, 0, 0))
        // What paces the faults: messages sent up and received down, counted 50 at a time (and
        // whether the run is over). Up, a message counts when its `send` returns: after the session's
        // first 4,096 (the most it keeps unacknowledged), each such return follows an acknowledgement.
        let progress = Observed<(messages: Int, over: Bool)>((0, false))
        defer { progress.update { $0.over = true } }  // (a failure below also ends the faults)
        let timeline = Locked<[(ContinuousClock.Instant, ClientEvent)]>([])
        let reader = Task {
            for await event in client.events {
                if case .received(let message) = event, message.typeID == "seq",
                    let value = try? message.decode(Numbered.self)
                {
                    down.update { state in
                        state.received += 1
                        if value.n < state.next { state.duplicates += 1 } else if value.n > state.next { state.outOfOrder += 1 }
                        state.next = max(state.next, value.n + 1)
                    }
                    if value.n % 50 == 0 { progress.update { $0.messages += 50 } }
                } else {
                    timeline.value.withLock { $0.append((.now, event)) }
                }
            }
        }
        defer { reader.cancel() }

        // The faults, until the run is over (or 240 s): a link flap or a connection kill after every
        // 500–5,000 messages more (up and down) — at points of progress, not of time: a fault comes
        // only once the one before was got over. (A link stays down 0.2–2 s: the fault is that
        // time without a link, against a 2-s heartbeat timeout.)
        let faults = Locked<[(kind: String, restored: ContinuousClock.Instant)]>([])
        let chaos = Task.detached {
            var generator = SystemRandomNumberGenerator()
            let end = ContinuousClock.now + .seconds(240)
            while ContinuousClock.now < end {
                let target = progress.value.messages + Int.random(in: 500...5_000, using: &generator)
                let left = end - ContinuousClock.now
                guard let now = try? await progress.wait("\(target) messages", timeout: left, until: { $0.messages >= target || $0.over }),
                    !now.over
                else { break }
                if Bool.random(using: &generator) {
                    try? Harness.control("link-down", host: "a")
                    try? await Task.sleep(for: .milliseconds(Int.random(in: 200...2_000, using: &generator)))
                    try? Harness.control("link-up", host: "a")
                    faults.value.withLock { $0.append(("flap", .now)) }
                } else {
                    _ = try? Harness.run(["ss", "-K", "dst", "10.77.0.2", "dport", "=", "\(port)"], timeout: .seconds(5))
                    faults.value.withLock { $0.append(("kill", .now)) }
                }
            }
        }

        let started = ContinuousClock.now
        try await client.send(Numbered(n: Self.downCount), type: "seq.down")
        for n in 0..<Self.upCount {
            try await client.send(Numbered(n: n, text: Self.padding), type: "seq")
            if n % 50 == 0 { progress.update { $0.messages += 50 } }
        }
        // Every message is kept until acknowledged: wait until the server acknowledged them all.
        try #require(await client.acknowledged(within: .seconds(200)), "all \(Self.upCount) acknowledged")
        try await down.wait("all \(Self.downCount) down", timeout: .seconds(120)) { $0.received >= Self.downCount }
        let elapsed = ContinuousClock.now - started
        progress.update { $0.over = true }
        _ = await chaos.result
        let droppedBeforeRemoval = Self.droppedPackets()
        Self.removeFaults()

        var stats: Stats?
        for _ in 0..<20 where stats == nil {
            stats = try? await client.request(Numbered(n: 0), type: "seq.stats", expecting: Stats.self, timeout: .seconds(5))
        }
        let up = try #require(stats)
        #expect(up.received == Self.upCount)
        #expect(up.duplicates == 0)
        #expect(up.outOfOrder == 0)
        let seen = down.value
        #expect(seen.received == Self.downCount)
        #expect(seen.duplicates == 0 && seen.outOfOrder == 0)
        #expect(!timeline.value.withLock { $0 }.contains { if case .undelivered = $0.1 { true } else { false } })

        // Figures: faults, reconnects, and the time from a fault's end to the session's resume.
        let events = timeline.value.withLock { $0 }
        let resumes = events.filter { if case .resumed = $0.1 { true } else { false } }
        let injected = faults.value.withLock { $0 }
        // A resume's time: from the end of the latest fault before it (the link back up, or the kill).
        var resumeTimes: [Double] = []
        for resume in resumes {
            guard let fault = injected.last(where: { $0.restored <= resume.0 }) else { continue }
            let gap = resume.0 - fault.restored
            resumeTimes.append(Double(gap.components.seconds) * 1000 + Double(gap.components.attoseconds) / 1e15)
        }
        let disconnects = events.filter { if case .disconnected = $0.1 { true } else { false } }.count
        let dropped = droppedBeforeRemoval
        resumeTimes.sort()
        let flaps = injected.filter { $0.kind == "flap" }.count
        let kills = injected.count - flaps
        let lostUp = Self.upCount - up.received
        let lostDown = Self.downCount - seen.received
        var line = "MEASURED chaos: \(Self.upCount) up + \(Self.downCount) down in \(elapsed), \(flaps) link flaps, "
        line += "\(kills) connection kills, 5 % loss (\(dropped) packets dropped), 20 Mbit/s; "
        line += "\(disconnects) disconnects, \(resumes.count) session resumes; "
        line += "up received \(up.received), duplicates \(up.duplicates), out of order \(up.outOfOrder), lost \(lostUp); "
        line += "down received \(seen.received), duplicates \(seen.duplicates), lost \(lostDown)"
        print(line)
        if !resumeTimes.isEmpty {
            Harness.measured("chaos resume after a fault ends, p50", resumeTimes[resumeTimes.count / 2], "ms")
            Harness.measured("chaos resume after a fault ends, max", resumeTimes.last!, "ms")
        }
        #expect(resumes.count >= 1)
        await client.close()
    }

    /// A 1 GiB push from host a to preview-server on host b across 5 link flaps and one kill -9 and
    /// restart of the server: preview-push retries by itself and resumes where the server's kept bytes
    /// end; the stored file has the right hash, and host a's veth sent at most 1.1 × the file's size.
    @Test func aGigabytePushSurvivesFlapsAndAServerRestart() async throws {
        let preview = PreviewIntegrationTests()
        let (directory, source) = (try preview.makeDirectory(), try preview.makeDirectory())
        defer { preview.remove(directory, source) }
        let size = 1 << 30
        let file = source + "/big.bin"
        try preview.makeFile(file, size: size)
        let port: UInt16 = 7_432
        let serverArguments = [
            Harness.binary("preview-server"), "--directory", directory, "--name", "Chaos Preview", "--port", "\(port)",
            "--log-level", "info",
        ]
        var server = try Harness.spawn(onB: true, serverArguments)
        defer { server.stop() }
        try await server.waitForOutput("published as", timeout: .seconds(15))
        let sentBefore = try Self.transmittedBytes()
        let started = ContinuousClock.now
        let pusher = try Harness.spawn(
            onB: false,
            [Harness.binary("preview-push"), file, "--host", "10.77.0.2", "--port", "\(port)", "--limit-rate", "50000000",
             "--retry-for", "120", "--verbose"])
        defer { pusher.stop() }
        try await preview.waitUntil("the push started", timeout: .seconds(60), watching: [directory]) { preview.partialBytes(directory) > 0 }

        var generator = SystemRandomNumberGenerator()
        var restartedAt: ContinuousClock.Instant?
        for flap in 1...5 {
            // A flap after every 40–120 MB more reached the server (at points of progress, not of
            // time; at once if the push is done), the link down 0.2–2 s (the fault is that time).
            let target = preview.partialBytes(directory) + UInt64(Int.random(in: 40...120, using: &generator) << 20)
            try await preview.waitUntil("\(target >> 20) MB kept before flap \(flap)", timeout: .seconds(60), watching: [directory]) {
                preview.partialBytes(directory) >= target || FileManager.default.fileExists(atPath: directory + "/big.bin")
            }
            try Harness.control("link-down", host: "a")
            try await Task.sleep(for: .milliseconds(Int.random(in: 200...2_000, using: &generator)))
            try Harness.control("link-up", host: "a")
            if flap == 3 {
                // The receiver dies mid-push and comes back on the same port and directory.
                let kept = preview.partialBytes(directory)
                kill(server.pid, SIGKILL)
                _ = server.wait(timeout: .seconds(10))
                server = try Harness.spawn(onB: true, serverArguments)
                try await server.waitForOutput("published as", timeout: .seconds(15))
                restartedAt = .now
                print("MEASURED 1 GiB push: server killed with \(kept) bytes kept, restarted")
            }
        }
        let status = pusher.wait(timeout: .seconds(300))
        let elapsed = ContinuousClock.now - started
        let sent = try Self.transmittedBytes() - sentBefore
        #expect(status == 0, "\(pusher.text)")
        #expect(try preview.sameBytes(file, directory + "/big.bin"))
        #expect(preview.partials(directory).isEmpty)
        let resumes = pusher.text.components(separatedBy: "resuming at").count - 1
        let retries = pusher.text.components(separatedBy: "retrying (attempt").count - 1
        #expect(resumes >= 1, "\(pusher.text)")
        let ratio = Double(sent) / Double(size)
        print(
            "MEASURED 1 GiB push across 5 flaps and a server restart: \(elapsed), \(retries) retries, \(resumes) resumes, "
                + "\(sent) bytes on host a's veth = \(String(format: "%.3f", ratio)) × the file")
        if let restartedAt, let line = pusher.text.split(separator: "\n").first(where: { $0.contains("resuming at") }) {
            print("MEASURED 1 GiB push: first resume line: \(line) (server restarted \(ContinuousClock.now - restartedAt) ago)")
        }
        #expect(ratio <= 1.1, "sent \(sent) bytes for a \(size)-byte file")
    }

    /// Bytes host a's end of the veth link (va) has sent, from the kernel's counters.
    static func transmittedBytes() throws -> Int {
        let listed = try Harness.run(["ip", "-s", "-j", "link", "show", "dev", "va"])
        guard let data = listed.output.data(using: .utf8),
            let links = try JSONSerialization.jsonObject(with: data) as? [[String: Any]],
            let stats = links.first?["stats64"] as? [String: Any], let tx = stats["tx"] as? [String: Any],
            let bytes = tx["bytes"] as? Int
        else { throw HarnessError("cannot read va's counters: \(listed.output)") }
        return bytes
    }

    /// 5 % random loss each way (nftables on both hosts' input) and a 20 Mbit/s cap each way (tbf).
    static func installLossAndRateCap() throws {
        let rules = """
            table inet lanmsg_chaos {
                chain input {
                    type filter hook input priority 0; policy accept;
                    ip saddr { 10.77.0.1, 10.77.0.2 } numgen random mod 100 < 5 counter drop
                }
            }
            """
        let file = NSTemporaryDirectory() + "lanmsg-chaos.nft"
        try rules.write(toFile: file, atomically: true, encoding: .utf8)
        for prefix in [[], ["nsenter", "-t", Harness.hostBPID, "-n", "--"]] {
            let loaded = try Harness.run(prefix + ["nft", "-f", file])
            guard loaded.status == 0 else { throw HarnessError("nft: \(loaded.output)") }
        }
        let capA = try Harness.run(["tc", "qdisc", "replace", "dev", "va", "root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"])
        let capB = try Harness.run(
            ["nsenter", "-t", Harness.hostBPID, "-n", "--", "tc", "qdisc", "replace", "dev", "vb", "root", "tbf", "rate",
             "20mbit", "burst", "32kbit", "latency", "400ms"])
        guard capA.status == 0, capB.status == 0 else { throw HarnessError("tc: \(capA.output) \(capB.output)") }
    }

    /// Packets the loss rules dropped so far, on both hosts.
    static func droppedPackets() -> Int {
        var total = 0
        for prefix in [[], ["nsenter", "-t", Harness.hostBPID, "-n", "--"]] {
            guard let listed = try? Harness.run(prefix + ["nft", "list", "table", "inet", "lanmsg_chaos"]) else { continue }
            if let range = listed.output.range(of: #"packets (\d+)"#, options: .regularExpression) {
                total += Int(listed.output[range].dropFirst("packets ".count)) ?? 0
            }
        }
        return total
    }

    static func removeFaults() {
        _ = try? Harness.control("link-up", host: "a")
        for prefix in [[], ["nsenter", "-t", Harness.hostBPID, "-n", "--"]] {
            _ = try? Harness.run(prefix + ["nft", "delete", "table", "inet", "lanmsg_chaos"])
        }
        _ = try? Harness.run(["tc", "qdisc", "del", "dev", "va", "root"])
        _ = try? Harness.run(["nsenter", "-t", Harness.hostBPID, "-n", "--", "tc", "qdisc", "del", "dev", "vb", "root"])
    }
}
