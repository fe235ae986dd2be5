import Foundation
import Logging
import Messaging
import TestWaits
import Testing

/// preview-server on host "b", preview-push on host "a" (this process), across the veth link, with
/// the built binaries. Files live under /tmp, which both namespace hosts share.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct PreviewIntegrationTests {
    static let hostB = "10.77.0.2"
    let logger = Harness.logger("preview-test")

    // MARK: Fixtures

    func makeDirectory() throws -> String {
        var template = Array("/tmp/preview-itest-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp failed") }
        return String(cString: made)
    }

    func remove(_ paths: String...) { for path in paths { try? FileManager.default.removeItem(atPath: path) } }

    /// Starts pushing a new file of `size` bytes to host b at 4 MB/s and waits until the server
    /// is receiving it (its temporary file appeared in `directory`).
    func startSlowPush(
        _ file: String, size: Int, port: UInt16, into directory: String, _ extra: [String] = []
    ) async throws -> Background {
        try makeFile(file, size: size)
        let client = try Harness.spawn(
            onB: false,
            pushArguments([file], ["--host", Self.hostB, "--port", String(port), "--limit-rate", "4000000"] + extra))
        try await waitUntil("a temporary file appears", watching: [directory]) { hasTempFile(directory) }
        return client
    }

    /// The store's entries, without the hidden directory of partial (resumable) transfers.
    func entries(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0 != ".lanmsg-partial" }.sorted()
    }

    /// The partial transfers the server keeps for a resume.
    func partials(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory + "/.lanmsg-partial")) ?? []).sorted()
    }

    /// A file of `size` bytes: a pseudo-random 1 MiB block, rotated per block (fast, not compressible).
    func makeFile(_ path: String, size: Int, seed: UInt64 = 1) throws {
        var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
        let block = (0..<(1 << 20)).map { _ -> UInt8 in
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return UInt8(truncatingIfNeeded: state)
        }
        guard FileManager.default.createFile(atPath: path, contents: nil),
            let handle = FileHandle(forWritingAtPath: path)
        else { throw HarnessError("cannot create \(path)") }
        defer { try? handle.close() }
        var written = 0
        var index = 0
        while written < size {
            let rotation = index % block.count
            var chunk = Array(block[rotation...] + block[..<rotation])
            if chunk.count > size - written { chunk = Array(chunk[0..<(size - written)]) }
            try handle.write(contentsOf: chunk)
            written += chunk.count
            index += 7919
        }
    }

    func sameBytes(_ a: String, _ b: String) throws -> Bool {
        try Harness.run(["cmp", a, b], timeout: .seconds(120)).status == 0
    }

    /// Starts preview-server on host b and waits until it is published; returns it and its port.
    /// `ignoring`: signals the daemon's parent ignores when it starts it (a shell's `trap ''`, as
    /// `nohup` or a background job does), which a child inherits.
    func startServer(
        directory: String, name: String, _ extra: [String] = [], ignoring: String? = nil
    ) async throws -> (server: Background, port: UInt16) {
        let launcher = ignoring.map { ["/bin/sh", "-c", "trap '' \($0); exec \"$0\" \"$@\""] } ?? []
        let server = try Harness.spawn(
            onB: true,
            launcher + [Harness.binary("preview-server"), "--directory", directory, "--name", name, "--log-level", "info"] + extra)
        try await server.waitForOutput("published as", timeout: .seconds(15))
        let line = try #require(server.text.split(separator: "\n").first { $0.hasPrefix("listening on port ") })
        let port = try #require(UInt16(line.dropFirst("listening on port ".count)))
        return (server, port)
    }

    func pushArguments(_ files: [String], _ options: [String]) -> [String] {
        [Harness.binary("preview-push")] + files + options
    }

    /// Runs preview-push to completion on host a.
    func push(_ files: [String], _ options: [String], timeout: Duration = .seconds(120)) throws -> (
        status: Int32, output: String
    ) {
        try Harness.run(pushArguments(files, options), timeout: timeout)
    }

    /// Waits (bounded) until `condition` holds. On files in `directories`: checked at each change
    /// in them (inotify, ``DirectoryWatch``), not on a timer. Otherwise (a command's answer, a
    /// metric) the tests' one poll (TestWaits), every 20 ms.
    func waitUntil(
        _ what: String, timeout: Duration = .seconds(15), watching directories: [String] = [], _ condition: () throws -> Bool
    ) async throws {
        guard !directories.isEmpty else {
            return try await TestWaits.waitUntil(what, timeout: timeout, every: .milliseconds(20), condition)
        }
        let watch = try DirectoryWatch(directories)
        var failure: (any Error)?
        try await TestWaits.waitUntil(what, timeout: timeout, wokenBy: watch.changes) {
            do { return try condition() } catch {
                failure = error
                return true
            }
        }
        if let failure { throw failure }
    }

    /// Bytes in the partial transfers.
    func partialBytes(_ directory: String) -> UInt64 {
        partials(directory).reduce(0) { sum, name in
            let path = directory + "/.lanmsg-partial/" + name
            return sum + ((try? FileManager.default.attributesOfItem(atPath: path)[.size] as? UInt64) ?? 0)
        }
    }

    /// Whether the server is receiving a push: its temporary file, or its partial transfer.
    func hasTempFile(_ directory: String) -> Bool {
        entries(directory).contains { $0.hasPrefix(".preview-") && $0.hasSuffix(".part") } || !partials(directory).isEmpty
    }

    /// Host b's IPv6 link-local address on its end of the veth link.
    func linkLocalAddressOfB() throws -> String {
        let result = try Harness.run([
            "nsenter", "-t", Harness.hostBPID, "-n", "ip", "-6", "-o", "addr", "show", "dev", "vb", "scope", "link",
        ])
        let words = result.output.split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)
        guard let index = words.firstIndex(of: "inet6"), index + 1 < words.count else {
            throw HarnessError("no link-local IPv6 address on host b's vb: \(result.output)")
        }
        return String(words[index + 1].split(separator: "/")[0])
    }

    /// Peak resident set size (VmHWM) of a running process, in KiB.
    func peakRSS(_ pid: pid_t) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") })
        return try #require(Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]))
    }

    /// Runs a command to completion (bounded) and reports its peak RSS (wait4 rusage, KiB).
    func runMeasured(_ arguments: [String], timeout: Duration) throws -> (status: Int32, output: String, maxRSS: Int) {
        let child = try Background(arguments)
        guard let status = child.wait(timeout: timeout) else {
            child.stop()
            throw HarnessError("\(arguments) did not finish within \(timeout); output: \(child.text)")
        }
        return (status, child.text, child.peakRSSKiB.value.withLock { $0 } ?? 0)
    }

    // MARK: Tests

    @Test func pushesAcrossTheLinkOverIPv4IPv6AndDiscovery() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let (server, port) = try await startServer(directory: directory, name: "Preview ITest Basic")
        defer { server.stop() }
        let file = source + "/report.pdf"
        try makeFile(file, size: 3 * 1024 * 1024 + 17)

        // IPv4, no discovery.
        let v4 = try push([file], ["--host", Self.hostB, "--port", String(port)])
        #expect(v4.status == 0, "\(v4.output)")
        #expect(v4.output.contains("as 'report.pdf'"))
        #expect(try sameBytes(file, directory + "/report.pdf"))

        // IPv6 link-local with the interface as scope.
        let address = try linkLocalAddressOfB()
        let v6 = try push([file], ["--host", "\(address)%va", "--port", String(port)])
        #expect(v6.status == 0, "\(v6.output)")
        #expect(v6.output.contains("as 'report (2).pdf'"), "\(v6.output)")
        #expect(try sameBytes(file, directory + "/report (2).pdf"))

        // Discovery by name.
        let found = try push([file], ["--to", "Preview ITest Basic"])
        #expect(found.status == 0, "\(found.output)")
        #expect(found.output.contains("as 'report (3).pdf'"), "\(found.output)")
        #expect(try sameBytes(file, directory + "/report (3).pdf"))
        #expect(entries(directory) == ["report (2).pdf", "report (3).pdf", "report.pdf"])

        // The server reports the stored name and hash; the hash printed is the file's.
        let hash = try Harness.run(["sha256sum", file]).output.prefix(64)
        #expect(v4.output.contains("sha256 \(hash)"))
    }

    /// `--metrics-port`: the library's swift-metrics figures in Prometheus' text format at /metrics
    /// on loopback (scraped from inside host b), counting the push that just happened.
    @Test func metricsEndpointServesPrometheusText() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let (server, port) = try await startServer(
            directory: directory, name: "Preview ITest Metrics", ["--metrics-port", "0"])
        defer { server.stop() }
        // (Printed by the metrics endpoint's own service once it listens: nothing orders it before
        // "published as", which startServer waited for.)
        try await server.waitForOutput("metrics at http://127.0.0.1:")
        let line = try #require(server.text.split(separator: "\n").first { $0.contains("metrics at http://127.0.0.1:") })
        let metricsPort = try #require(UInt16(line.split(separator: ":").last?.split(separator: "/").first ?? ""))
        let file = source + "/figures.pdf"
        try makeFile(file, size: 1024 * 1024)
        let pushed = try push([file], ["--host", Self.hostB, "--port", String(port)])
        #expect(pushed.status == 0, "\(pushed.output)")

        func get(_ path: String) throws -> String {
            // `Connection: close`: the answer ends with the connection (Hummingbird keeps an HTTP/1.0
            // connection open unless asked; a client reading to the end would wait).
            let script = "exec 3<>/dev/tcp/127.0.0.1/\(metricsPort); printf 'GET \(path) HTTP/1.0\\r\\nConnection: close\\r\\n\\r\\n' >&3; cat <&3"
            return try Harness.run(["nsenter", "-t", Harness.hostBPID, "-n", "--", "bash", "-c", script]).output
        }
        // The server counts the push's connection close after the pusher's goodbye: wait for it.
        var scrape = ""
        try await waitUntil("the push's connection counted as closed") {
            scrape = try get("/metrics")
            return scrape.contains(#"lanmsg_connections_closed_total{role="server",reason="goodbye"} 1"#)
        }
        #expect(scrape.hasPrefix("HTTP/1.1 200 OK"), "\(scrape.prefix(200))")
        #expect(scrape.contains(#"lanmsg_connections_accepted_total{role="server"} 1"#))
        #expect(scrape.contains(#"lanmsg_connections_open{role="server"} 0"#))
        #expect(scrape.contains(#"lanmsg_messages_received_total{role="server",type="preview.offer"} 1"#))
        #expect(scrape.contains(#"lanmsg_messages_sent_total{role="server",type="preview.offer-reply"} 1"#))
        #expect(scrape.contains(#"lanmsg_discovery_daemon_state{state="running"} 1"#))
        #expect(scrape.contains(#"lanmsg_discovery_events_total{event="published"} 1"#))
        let bytesLine = try #require(scrape.split(separator: "\n").first { $0.hasPrefix(#"lanmsg_bytes_received_total{role="server"} "#) })
        #expect((Int(bytesLine.split(separator: " ").last ?? "") ?? 0) > 1024 * 1024)
        #expect(try get("/").hasPrefix("HTTP/1.1 404"))  // --metrics-port serves /metrics only, not the page
    }

    /// Version 2 end to end with the programs: pairing (--accept paired --pair-for), the code shown
    /// on both sides, paired pushers admitted later, others refused with what to do, and a server
    /// whose key changed refused by preview-push (trust on first use). Every process gets its own
    /// XDG_DATA_HOME: identities and trust stores of this test stay in its directory.
    @Test func pairingAndAChangedServerKey() async throws {
        let (directory, source, data) = (try makeDirectory(), try makeDirectory(), try makeDirectory())
        defer { remove(directory, source, data) }
        let file = source + "/paired.txt"
        try makeFile(file, size: 2048)
        let env = ["env", "XDG_DATA_HOME=\(data)"]
        func server(_ extra: [String]) async throws -> (Background, UInt16) {
            let server = try Harness.spawn(
                onB: true,
                env + [Harness.binary("preview-server"), "--directory", directory, "--name", "Preview ITest Pair",
                    "--log-level", "info"] + extra)
            try await server.waitForOutput("published as", timeout: .seconds(15))
            let line = try #require(server.text.split(separator: "\n").first { $0.hasPrefix("listening on port ") })
            return (server, try #require(UInt16(line.dropFirst("listening on port ".count))))
        }
        func push(_ port: UInt16) throws -> (status: Int32, output: String) {
            try Harness.run(
                env + [Harness.binary("preview-push"), file, "--host", Self.hostB, "--port", String(port)],
                timeout: .seconds(60))
        }

        // Paired only, no pairing window: refused, and told how to pair.
        var (running, port) = try await server(["--accept", "paired"])
        let refused = try push(port)
        #expect(refused.status != 0 && refused.output.contains("paired pushers only"), "\(refused.output)")
        #expect(entries(directory).isEmpty)
        running.stop()

        // A pairing window: the push is accepted, both sides show the same code.
        (running, port) = try await server(["--accept", "paired", "--pair-for", "60"])
        let paired = try push(port)
        #expect(paired.status == 0, "\(paired.output)")
        let pushCode = try #require(Self.code(in: paired.output, after: "comparison code "), "\(paired.output)")
        try await running.waitForOutput("paired with", timeout: .seconds(10))
        let serverCode = try #require(Self.code(in: running.text, after: "comparison code "), "\(running.text)")
        #expect(pushCode == serverCode)
        running.stop()

        // Window closed: the paired pusher is still admitted; no first-contact notice this time.
        (running, port) = try await server(["--accept", "paired"])
        let again = try push(port)
        #expect(again.status == 0, "\(again.output)")
        #expect(!again.output.contains("first contact"), "\(again.output)")
        running.stop()

        // The server made a new identity under the same name: preview-push refuses it loudly.
        (running, port) = try await server(["--identity", data + "/other-identity"])
        defer { running.stop() }
        let changed = try push(port)
        #expect(changed.status != 0, "\(changed.output)")
        #expect(changed.output.contains("HAS CHANGED"), "\(changed.output)")
        #expect(entries(directory).count == 2)  // the paired and the later push; nothing from the refused ones
    }

    /// The code preview-push asks its user to compare is on the server too (issue 45, 4): with the
    /// default `--accept any` the server shows the pusher's key and the same comparison code at its
    /// first contact (it logged only "client connected").
    @Test func theServerShowsThePushersKeyAndCodeAtFirstContact() async throws {
        let (directory, source, data) = (try makeDirectory(), try makeDirectory(), try makeDirectory())
        defer { remove(directory, source, data) }
        try makeFile(source + "/hello.txt", size: 100)
        let (server, port) = try await startServer(directory: directory, name: "Preview ITest Code")
        defer { server.stop() }
        let pushed = try Harness.run(
            ["env", "XDG_DATA_HOME=\(data)", Harness.binary("preview-push"), source + "/hello.txt", "--host", Self.hostB,
                "--port", String(port)], timeout: .seconds(60))
        #expect(pushed.status == 0, "\(pushed.output)")
        let pushCode = try #require(Self.code(in: pushed.output, after: "comparison code "), "\(pushed.output)")
        try await server.waitForOutput("comparison code", timeout: .seconds(10))
        let serverCode = try #require(Self.code(in: server.text, after: "comparison code "), "\(server.text)")
        #expect(pushCode == serverCode)
        #expect(server.text.contains("pusher 'preview-push' has key"), "\(server.text)")
    }

    /// Trust follows the key, not the name (issue 43, 22): preview-push, having pushed to a
    /// previewer once, finds it by its key when an impostor has taken its name (the real one came
    /// back as "<name> #2"): the file lands at the real previewer, the impostor is refused loudly
    /// and gets nothing. On Avahi here, on the embedded stack in the chat-preview-embedded stage.
    @Test func aPusherFindsThePreviewerByItsKeyWhenAnImpostorTookTheName() async throws {
        let (realDirectory, impostorDirectory, source, data) = (
            try makeDirectory(), try makeDirectory(), try makeDirectory(), try makeDirectory()
        )
        defer { remove(realDirectory, impostorDirectory, source, data) }
        let name = "Preview ITest Keyed \(UUID().uuidString.prefix(4))"
        try makeFile(source + "/first.txt", size: 1000)
        try makeFile(source + "/second.txt", size: 1000, seed: 2)
        func server(_ directory: String, identity: String) async throws -> Background {
            let server = try Harness.spawn(
                onB: true,
                [Harness.binary("preview-server"), "--directory", directory, "--name", name, "--identity", data + "/" + identity,
                    "--log-level", "info"])
            try await server.waitForOutput("published as", timeout: .seconds(15))
            return server
        }
        func push(_ file: String) throws -> (status: Int32, output: String) {
            try Harness.run(
                ["env", "XDG_DATA_HOME=\(data)/pusher", Harness.binary("preview-push"), source + "/" + file, "--to", name,
                    "--timeout", "10"], timeout: .seconds(60))
        }
        var real = try await server(realDirectory, identity: "real")
        let first = try push("first.txt")
        #expect(first.status == 0, "\(first.output)")
        real.stop()
        let impostor = try await server(impostorDirectory, identity: "impostor")
        defer { impostor.stop() }
        real = try await server(realDirectory, identity: "real")
        defer { real.stop() }
        #expect(real.text.contains("published as '\(name) #2'"), "\(real.text)")

        let second = try push("second.txt")
        #expect(second.status == 0, "\(second.output)")
        #expect(second.output.contains("refused '\(name)'"), "\(second.output)")
        #expect(entries(realDirectory).sorted() == ["first.txt", "second.txt"])
        #expect(entries(impostorDirectory).isEmpty)
    }

    static func code(in text: String, after marker: String) -> String? {
        guard let range = text.range(of: marker) else { return nil }
        let code = text[range.upperBound...].prefix(7)
        return code.count == 7 ? String(code) : nil
    }

    @Test func keyFileAdmitsOnlyPushersWithTheSameKey() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let key = source + "/preview.key"
        let other = source + "/other.key"
        try "the previewer's shared secret 123\n".write(toFile: key, atomically: true, encoding: .utf8)
        try "not the previewer's secret at all\n".write(toFile: other, atomically: true, encoding: .utf8)
        let (server, port) = try await startServer(directory: directory, name: "Preview ITest Key", ["--key-file", key])
        defer { server.stop() }
        let file = source + "/note.txt"
        try makeFile(file, size: 4096)
        let target = ["--host", Self.hostB, "--port", String(port)]
        let none = try push([file], target)
        #expect(none.status != 0 && none.output.contains("pre-shared key"), "\(none.output)")
        let wrong = try push([file], target + ["--key-file", other])
        #expect(wrong.status != 0 && wrong.output.contains("key"), "\(wrong.output)")
        #expect(entries(directory).isEmpty)
        let right = try push([file], target + ["--key-file", key])
        #expect(right.status == 0, "\(right.output)")
        #expect(try sameBytes(file, directory + "/note.txt"))
        #expect(server.text.contains("authentication failed") || server.text.contains("pre-shared key"), "\(server.text)")
    }

    @Test func publishesItsLimitsAndKeepsFreeSpaceCurrent() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let (server, port) = try await startServer(
            directory: directory, name: "Preview ITest TXT", ["--max-size", "123456789"])
        defer { server.stop() }
        func txt() throws -> String {
            let lines = try Harness.run(["avahi-browse", "-rpt", "_preview._tcp"]).output.split(separator: "\n")
            return String(lines.first { $0.hasPrefix("=") && $0.contains("Preview\\032ITest\\032TXT") } ?? "")
        }
        var before = ""
        try await waitUntil("the TXT record is seen from host a") {
            before = try txt()
            return !before.isEmpty
        }
        #expect(before.contains("\"pv=1\"") && before.contains("\"max=123456789\"") && before.contains("\"sv="))
        #expect(before.contains("\"free="))
        let file = source + "/data.bin"
        try makeFile(file, size: 16 * 1024 * 1024)
        let result = try push([file], ["--host", Self.hostB, "--port", String(port)])
        #expect(result.status == 0, "\(result.output)")
        func free(_ line: String) -> String? {
            line.split(separator: ";").last?.split(separator: " ").first { $0.hasPrefix("\"free=") }.map(String.init)
        }
        let old = free(before)
        try await waitUntil("the free space in the TXT record changes after a push") { free(try txt()) != old }
    }

    @Test func pushesOneGiBWithBoundedMemory() async throws {
        let size = ProcessInfo.processInfo.environment["PREVIEW_BIG_BYTES"].flatMap(Int.init) ?? 1 << 30
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let (server, port) = try await startServer(directory: directory, name: "Preview ITest Big")
        defer { server.stop() }
        let comm = try String(contentsOfFile: "/proc/\(server.pid)/comm", encoding: .utf8)
        try #require(comm.hasPrefix("preview-server"), "the spawned pid is \(comm), not the server")
        let file = source + "/big.bin"
        try makeFile(file, size: size)
        let start = ContinuousClock.now
        let result = try runMeasured(
            pushArguments([file], ["--host", Self.hostB, "--port", String(port)]), timeout: .seconds(600))
        let elapsed = ContinuousClock.now - start
        let serverPeak = try peakRSS(server.pid)
        #expect(result.status == 0, "\(result.output)")
        #expect(try sameBytes(file, directory + "/big.bin"))
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        Harness.measured(
            "preview push \(size >> 20) MiB throughput (hash + offer + stream + fsync)",
            Double(size) / 1_048_576 / seconds, "MiB/s")
        Harness.measured("preview-push peak RSS (\(size >> 20) MiB push)", Double(result.maxRSS) / 1024, "MiB")
        Harness.measured("preview-server peak RSS (\(size >> 20) MiB push)", Double(serverPeak) / 1024, "MiB")
        // "Well under 128 MiB" whatever the file size: chunks are streamed, never the whole file.
        #expect(result.maxRSS < 96 * 1024, "client peak RSS \(result.maxRSS) KiB")
        #expect(serverPeak < 96 * 1024, "server peak RSS \(serverPeak) KiB")
    }

    /// A pusher killed mid-push leaves nothing in the store; its bytes are kept hidden for a resume,
    /// and pushing the same file again sends only the rest.
    @Test func aClientKilledMidPushLeavesNothingBehindAndAPushAgainResumes() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let (server, port) = try await startServer(directory: directory, name: "Preview ITest Kill")
        defer { server.stop() }
        let file = source + "/slow.bin"
        let client = try await startSlowPush(file, size: 64 * 1024 * 1024, port: port, into: directory)
        try await waitUntil("2 MB arrived", watching: [directory]) { partialBytes(directory) >= 2_000_000 }
        kill(client.pid, SIGKILL)
        #expect(client.wait(timeout: .seconds(5)) != nil)
        try await server.waitForOutput("push failed", timeout: .seconds(15))  // the server notices
        #expect(entries(directory).isEmpty)
        #expect(partials(directory).count == 1)
        #expect(server.poll() == nil, "the server must keep running: \(server.text)")
        // Pushed again: it resumes where the kept bytes end, and the whole file is verified.
        let again = try push([file], ["--host", Self.hostB, "--port", String(port)])
        #expect(again.status == 0, "\(again.output)")
        #expect(again.output.contains("resuming at"), "\(again.output)")
        #expect(entries(directory) == ["slow.bin"])
        #expect(partials(directory).isEmpty)
        #expect(try sameBytes(file, directory + "/slow.bin"))
    }

    @Test func aTooLargeFileIsRefusedBeforeDataFlowsAndStaleTemporariesAreCleaned() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        // A temporary file left by a crashed server is removed when the server starts.
        let stale = directory + "/.preview-0badc0de.part"
        try makeFile(stale, size: 4096)
        let (server, port) = try await startServer(
            directory: directory, name: "Preview ITest Small", ["--max-size", "1000"])
        #expect(!FileManager.default.fileExists(atPath: stale), "the stale temporary file is still there")
        defer { server.stop() }
        let file = source + "/big.bin"
        try makeFile(file, size: 1 << 20)
        let result = try push([file], ["--host", Self.hostB, "--port", String(port)])
        #expect(result.status != 0)
        #expect(result.output.contains("at most 1000 bytes") && result.output.contains("too-large"), "\(result.output)")
        // Refused at the offer: the server never accepted it nor saw a transfer.
        #expect(server.text.contains("refused offer"))
        #expect(!server.text.contains("accepted offer"))
        #expect(entries(directory).isEmpty)
    }

    @Test func twoClientsPushAtOnce() async throws {
        let directory = try makeDirectory()
        let sourceA = try makeDirectory()
        let sourceB = try makeDirectory()
        defer {
            remove(directory)
            remove(sourceA)
            remove(sourceB)
        }
        let (server, port) = try await startServer(directory: directory, name: "Preview ITest Two")
        defer { server.stop() }
        let fileA = sourceA + "/same.bin"
        let fileB = sourceB + "/same.bin"
        try makeFile(fileA, size: 24 * 1024 * 1024, seed: 11)
        try makeFile(fileB, size: 24 * 1024 * 1024, seed: 22)
        let options = ["--host", Self.hostB, "--port", String(port), "--limit-rate", "12000000"]
        let first = try Harness.spawn(onB: false, pushArguments([fileA], options))
        let second = try Harness.spawn(onB: false, pushArguments([fileB], options))
        try await waitUntil("both pushes are in flight together", watching: [directory]) {
            entries(directory).filter { $0.hasPrefix(".preview-") }.count + partials(directory).count == 2
        }
        #expect(first.wait(timeout: .seconds(60)) == 0, "\(first.text)")
        #expect(second.wait(timeout: .seconds(60)) == 0, "\(second.text)")
        #expect(entries(directory) == ["same (2).bin", "same.bin"])
        let plain = directory + "/same.bin"
        let suffixed = directory + "/same (2).bin"
        let aIsPlain = try sameBytes(fileA, plain)
        #expect(try sameBytes(aIsPlain ? fileB : fileA, suffixed))
        #expect(try sameBytes(aIsPlain ? fileA : fileB, plain))
    }

    @Test func sigtermDuringAPushAbortsItCleanlyAfterTheGracePeriod() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let (server, port) = try await startServer(
            directory: directory, name: "Preview ITest Term", ["--grace-period", "1", "--keep-partial", "0"])
        defer { server.stop() }
        let file = source + "/slow.bin"
        let client = try await startSlowPush(
            file, size: 64 * 1024 * 1024, port: port, into: directory, ["--retry-for", "0"])
        let start = ContinuousClock.now
        kill(server.pid, SIGTERM)
        let status = server.wait(timeout: .seconds(20))
        Harness.measured("preview-server SIGTERM → exit (grace period 1 s, push aborted)", ContinuousClock.now - start)
        #expect(status == 0, "\(server.text)")
        #expect(entries(directory).isEmpty, "left behind: \(entries(directory))")
        // With --keep-partial 0 an interrupted push keeps nothing, not even hidden.
        #expect(partials(directory).isEmpty && !FileManager.default.fileExists(atPath: directory + "/.lanmsg-partial"))
        let clientStatus = client.wait(timeout: .seconds(20))
        #expect(clientStatus != nil && clientStatus != 0)
        #expect(client.text.contains("failed"), "\(client.text)")
    }

    @Test func sigtermLetsAPushInFlightFinish() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let (server, port) = try await startServer(
            directory: directory, name: "Preview ITest Drain", ["--grace-period", "30"])
        defer { server.stop() }
        let file = source + "/doc.bin"
        let client = try await startSlowPush(file, size: 8 * 1024 * 1024, port: port, into: directory)
        kill(server.pid, SIGTERM)
        #expect(server.wait(timeout: .seconds(40)) == 0, "\(server.text)")
        #expect(client.wait(timeout: .seconds(10)) == 0, "\(client.text)")
        #expect(entries(directory) == ["doc.bin"])
        #expect(try sameBytes(file, directory + "/doc.bin"))
    }

    /// Offers from a hand-written client (the CLI only sends plain base names).
    struct RawOffer: Codable {
        var name: String
        var size: UInt64
        var sha256: String
    }
    struct RawFailure: Codable {
        var code: String
        var message: String
    }
    struct RawReply: Codable {
        var accepted: Bool
        var offerID: String?
        var failure: RawFailure?
    }

    @Test func pathTraversalNamesAreRefused() async throws {
        let directory = try makeDirectory()
        defer { remove(directory) }
        let (server, port) = try await startServer(directory: directory, name: "Preview ITest Names")
        defer { server.stop() }
        let channel = try await MessageChannel.connect(
            to: [try SocketAddress(ipAddress: Self.hostB, port: port)],
            configuration: ChannelConfiguration(name: "raw-itest"),
            logger: logger)
        defer { channel.close() }
        let hash = String(repeating: "0", count: 64)
        let escape = "preview-itest-escape-\(UUID().uuidString)"
        for name in ["../x", "../\(escape)", "../../etc/passwd", "..", "a/b", "/etc/passwd", "x\u{0}y", ""] {
            let reply = try await channel.request(
                RawOffer(name: name, size: 10, sha256: hash), type: "preview.offer", expecting: RawReply.self)
            #expect(!reply.accepted, "\(name) was accepted")
            #expect(reply.failure?.code == "bad-name", "\(name): \(String(describing: reply.failure))")
        }
        let ok = try await channel.request(
            RawOffer(name: "fine.txt", size: 10, sha256: hash), type: "preview.offer", expecting: RawReply.self)
        #expect(ok.accepted)
        #expect(entries(directory).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: directory + "/../" + escape))
    }

    @Test func onReceiveRunsAndItsFailureDoesNotStopTheServer() async throws {
        let (directory, source) = (try makeDirectory(), try makeDirectory())
        defer { remove(directory, source) }
        let marker = source + "/marker"
        let signals = source + "/signals"
        let hook = source + "/hook.sh"
        // (It also writes down the signals it started with, blocked and ignored, read by the shell
        // itself: a `grep` of the shell's status raced the shell's fork, which blocks every signal.)
        try """
            #!/bin/sh
            while IFS= read -r line; do case "$line" in SigBlk:*|SigIgn:*) echo "$line";; esac; done < /proc/self/status > '\(signals)'
            echo "$1" >> '\(marker)'
            exit 3

            """.write(toFile: hook, atomically: true, encoding: .utf8)
        chmod(hook, 0o755)
        // Started the way a shell starts a job in the background or under nohup: SIGINT and SIGHUP
        // ignored, which the daemon inherits.
        let (server, port) = try await startServer(
            directory: directory, name: "Preview ITest Hook", ["--on-receive", hook], ignoring: "INT HUP")
        defer { server.stop() }
        let file = source + "/shown.txt"
        try makeFile(file, size: 4096)
        let first = try push([file], ["--host", Self.hostB, "--port", String(port)])
        #expect(first.status == 0, "\(first.output)")
        try await waitUntil("the hook writes its marker", watching: [source]) {
            ((try? String(contentsOfFile: marker, encoding: .utf8)) ?? "").contains(directory + "/shown.txt")
        }
        try await server.waitForOutput("--on-receive failed")
        // The hook starts as a shell would start it: what the daemon ignores or blocks is not
        // passed on, so `kill`, Ctrl-C in its terminal and `timeout` stop a hook.
        let states = try String(contentsOfFile: signals, encoding: .utf8)
        let masks = Dictionary(uniqueKeysWithValues: states.split(separator: "\n").compactMap { line -> (String, UInt64)? in
            let parts = line.split(separator: ":").map { $0.trimmingCharacters(in: .whitespaces) }
            guard parts.count == 2, let value = UInt64(parts[1], radix: 16) else { return nil }
            return (parts[0], value)
        })
        let stopping: UInt64 = [SIGTERM, SIGINT, SIGHUP].reduce(0) { $0 | 1 << (UInt64($1) - 1) }
        #expect(masks["SigBlk"] == 0, "the hook started with signals blocked: \(states)")
        #expect(masks["SigIgn"].map { $0 & stopping == 0 } == true, "the hook started with SIGTERM, SIGINT or SIGHUP ignored: \(states)")
        let second = try push([file], ["--host", Self.hostB, "--port", String(port)])
        #expect(second.status == 0, "\(second.output)")
        try await waitUntil("the hook runs for the second file", watching: [source]) {
            ((try? String(contentsOfFile: marker, encoding: .utf8)) ?? "").contains(directory + "/shown (2).txt")
        }
        #expect(server.poll() == nil)
    }

    /// Issue 56, item 4: a local name with a bidirectional control is refused, and preview-push's
    /// own lines show it escaped — never raw (its "failed" line printed `invoice‮txt.exe` reversed).
    @Test func aNameWithABidiControlIsRefusedAndPrintedEscaped() async throws {
        let directory = try makeDirectory()
        let source = try makeDirectory()
        defer {
            remove(directory)
            remove(source)
        }
        let file = source + "/invoice\u{202E}txt.exe"
        try makeFile(file, size: 100)
        let (server, _) = try await startServer(directory: directory, name: "Preview ITest Bidi")
        defer { server.stop() }
        let pushed = try push([file], ["--timeout", "5"])
        #expect(pushed.status != 0, "\(pushed.output)")
        #expect(pushed.output.contains("failed"), "\(pushed.output)")
        #expect(!pushed.output.unicodeScalars.contains("\u{202E}"), "a raw U+202E in: \(pushed.output.debugDescription)")
        #expect(pushed.output.contains("invoice\\u{202e}txt.exe"), "\(pushed.output)")
        #expect(entries(directory).isEmpty)
    }

    /// Issue 56, 1: the same files to several previewers at once. `--to` three times: one
    /// connection each, a result line per previewer and file, every copy whole; `--all`: the
    /// previewers this pusher trusts, one never pushed to skipped with a note saying how to trust
    /// it; a previewer that is gone fails alone (exit status 3, the others stored everything).
    /// Also prints D3's figure: a 10 MiB push to one previewer and to three (not asserted).
    @Test func pushesToSeveralPreviewersAtOnce() async throws {
        let tag = UUID().uuidString.prefix(4)
        let names = ["A", "B", "C", "D"].map { "Preview ITest Many \($0) \(tag)" }
        let directories = try names.map { _ in try makeDirectory() }
        let (source, data) = (try makeDirectory(), try makeDirectory())
        defer {
            for directory in directories { remove(directory) }
            remove(source, data)
        }
        var servers: [Background] = []
        defer { for server in servers { server.stop() } }
        for (index, name) in names.enumerated() {
            let server = try Harness.spawn(
                onB: true,
                [Harness.binary("preview-server"), "--directory", directories[index], "--name", name, "--identity",
                    data + "/server-\(index)", "--log-level", "info"])
            servers.append(server)
            try await server.waitForOutput("published as", timeout: .seconds(15))
        }
        func push(_ files: [String], _ options: [String]) throws -> (status: Int32, output: String) {
            try Harness.run(
                ["env", "XDG_DATA_HOME=\(data)/pusher", Harness.binary("preview-push")] + files.map { source + "/" + $0 }
                    + ["--timeout", "5", "--retry-for", "0"] + options, timeout: .seconds(120))
        }
        func to(_ indices: Int...) -> [String] { indices.flatMap { ["--to", names[$0]] } }
        try makeFile(source + "/small.txt", size: 1000)
        try makeFile(source + "/design.bin", size: 3 * 1024 * 1024, seed: 2)
        try makeFile(source + "/later.txt", size: 500, seed: 3)
        try makeFile(source + "/after.txt", size: 700, seed: 4)

        let three = try push(["small.txt", "design.bin"], to(0, 1, 2))
        #expect(three.status == 0, "\(three.output)")
        for index in 0..<3 {
            #expect(entries(directories[index]) == ["design.bin", "small.txt"], "\(names[index]): \(three.output)")
            #expect(try sameBytes(source + "/design.bin", directories[index] + "/design.bin"))
            #expect(three.output.contains("on '\(names[index])' as 'design.bin'"), "\(three.output)")
            #expect(three.output.contains("first contact with '\(names[index])'"), "\(three.output)")
        }
        #expect(three.output.contains("3 previewers:"), "\(three.output)")

        // --all: the three now trusted; D, never pushed to, is skipped and told how to trust it.
        var all = (status: Int32(-1), output: "")
        try await waitUntil("--all sees D too", timeout: .seconds(30)) {
            all = try push(["later.txt"], ["--all"])
            return all.output.contains(names[3])
        }
        #expect(all.status == 0, "\(all.output)")
        #expect(all.output.contains("skipped '\(names[3])': never pushed to"), "\(all.output)")
        #expect(all.output.contains("--to '\(names[3])'"), "\(all.output)")
        for index in 0..<3 { #expect(entries(directories[index]).contains("later.txt"), "\(names[index]): \(all.output)") }
        #expect(entries(directories[3]).isEmpty)

        // C gone: it fails alone.
        servers[2].stop()
        let partly = try push(["after.txt"], to(0, 1, 2))
        #expect(partly.status == 3, "\(partly.output)")
        #expect(partly.output.contains("'\(names[2])' not reached"), "\(partly.output)")
        for index in 0..<2 { #expect(entries(directories[index]).contains("after.txt"), "\(names[index]): \(partly.output)") }
        #expect(!entries(directories[2]).contains("after.txt"))

        // D3 (Benchmarks/preview-page.sh prints the same): a 10 MiB file to one, then to three.
        try makeFile(source + "/big.bin", size: 10 * 1024 * 1024, seed: 5)
        let clock = ContinuousClock()
        var one = (status: Int32(-1), output: "")
        let toOne = try clock.measure { one = try push(["big.bin"], to(0)) }
        #expect(one.status == 0, "\(one.output)")
        servers[2] = try Harness.spawn(
            onB: true,
            [Harness.binary("preview-server"), "--directory", directories[2], "--name", names[2], "--identity",
                data + "/server-2", "--log-level", "info"])
        try await servers[2].waitForOutput("published as", timeout: .seconds(15))
        var many = (status: Int32(-1), output: "")
        let toThree = try clock.measure { many = try push(["big.bin"], to(0, 1, 2)) }
        #expect(many.status == 0, "\(many.output)")
        print("MEASURED preview-push 10 MiB: to one previewer \(toOne), to three at once \(toThree) (process start to exit)")

        // --watch with two: each save goes to both; a save both have is not sent again.
        let draft = source + "/draft.md"
        try Data("# Draft 1\n".utf8).write(to: URL(fileURLWithPath: draft))
        let watcher = try Harness.spawn(
            onB: false,
            ["env", "XDG_DATA_HOME=\(data)/pusher", Harness.binary("preview-push"), "--watch", draft, "--timeout", "5"] + to(0, 1))
        defer { watcher.stop() }
        try await watcher.waitForOutput("watching", timeout: .seconds(15))
        func drafts(_ index: Int) -> Int { entries(directories[index]).filter { $0.hasPrefix("draft") }.count }
        #expect(drafts(0) == 1 && drafts(1) == 1, "\(watcher.text)")
        try saveInPlace("# Draft 2\n", to: draft)
        try await waitUntil("the second save stored on both", watching: directories) { drafts(0) == 2 && drafts(1) == 2 }
        try saveInPlace("# Draft 2\n", to: draft)
        try await watcher.waitForOutput("unchanged", timeout: .seconds(15))
        kill(watcher.pid, SIGTERM)
        #expect(watcher.wait(timeout: .seconds(15)) == 0, "\(watcher.text)")
        #expect(drafts(0) == 2 && drafts(1) == 2, "\(watcher.text)")
        #expect(watcher.text.contains("'\(names[0])' stored 2 of 2") && watcher.text.contains("'\(names[1])' stored 2 of 2"), "\(watcher.text)")
    }

    @Test func picksTheOnlyPreviewerAndFailsClearlyWhenAmbiguous() async throws {
        let directoryA = try makeDirectory()
        let directoryB = try makeDirectory()
        let source = try makeDirectory()
        defer {
            remove(directoryA)
            remove(directoryB)
            remove(source)
        }
        let file = source + "/note.txt"
        try makeFile(file, size: 2000)
        let (first, _) = try await startServer(directory: directoryA, name: "Preview ITest One")
        defer { first.stop() }
        let only = try push([file], ["--timeout", "5"])
        #expect(only.status == 0, "\(only.output)")
        #expect(entries(directoryA) == ["note.txt"])

        let (second, _) = try await startServer(directory: directoryB, name: "Preview ITest Two Of Two")
        defer { second.stop() }
        var listed = ""
        try await waitUntil("--list shows both previewers") {
            listed = try push([], ["--list", "--timeout", "5"]).output
            return listed.contains("Preview ITest One") && listed.contains("Preview ITest Two Of Two")
        }
        #expect(listed.contains("free"))
        let ambiguous = try push([file], ["--timeout", "5"])
        #expect(ambiguous.status != 0)
        #expect(
            ambiguous.output.contains("'Preview ITest One'") && ambiguous.output.contains("'Preview ITest Two Of Two'"),
            "\(ambiguous.output)")
        #expect(ambiguous.output.contains("--to"))
        let named = try push([file], ["--to", "Preview ITest Two Of Two", "--timeout", "5"])
        #expect(named.status == 0, "\(named.output)")
        #expect(entries(directoryB) == ["note.txt"])
        #expect(entries(directoryA) == ["note.txt"])
    }
}

/// preview-push and the push protocol's version (issue 27, item 18): a previewer speaking another
/// version (TXT and hello `pv`) is listed with a warning and not pushed to unless asked.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct PreviewVersionIntegrationTests {
    @Test func aPreviewerOfAnotherVersionIsListedWithAWarningAndNotPushedToUnlessAsked() async throws {
        let logger = Harness.logger("preview-version")
        let discovery = ServiceDiscovery(logger: logger)
        defer { Task { await discovery.shutdown() } }
        let name = "Future Previewer \(UUID().uuidString.prefix(4))"
        var configuration = ServerConfiguration(serviceType: "_preview._tcp", serviceName: name, peerName: name)
        configuration.txt = ["pv": "2", "max": "1000", "free": "1000"]
        configuration.channel.metadata = ["pv": "2"]
        configuration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        let server = MessageServer(configuration: configuration, discovery: discovery, logger: logger)
        try await server.start()
        defer { Task { await server.stop() } }
        let drain = Task { for await _ in server.events {} }
        defer { drain.cancel() }
        let push = Harness.binary("preview-push")
        let data = NSTemporaryDirectory() + "preview-version-\(UUID().uuidString.prefix(8))"
        var listed = ""
        try await Lab.waitUntil("--list shows the future previewer") {
            listed = try Harness.run(["env", "XDG_DATA_HOME=\(data)", push, "--list", "--timeout", "3"]).output
            return listed.contains(name)
        }
        #expect(listed.contains("warning: '\(name)' speaks push protocol version 2"), "\(listed)")
        #expect(listed.contains("pv 2"), "\(listed)")
        let file = NSTemporaryDirectory() + "preview-version-\(UUID().uuidString.prefix(8)).txt"
        try "new format\n".write(toFile: file, atomically: true, encoding: .utf8)
        let refused = try Harness.run(
            ["env", "XDG_DATA_HOME=\(data)", push, "--to", name, "--timeout", "5", "--retry-for", "0", file])
        #expect(refused.status != 0, "\(refused.output)")
        #expect(refused.output.contains("speaks push protocol version 2") && refused.output.contains("--ignore-version"), "\(refused.output)")
        #expect(refused.output.contains("nothing was sent"), "\(refused.output)")
        let asked = try Harness.run(
            ["env", "XDG_DATA_HOME=\(data)", push, "--to", name, "--timeout", "2", "--retry-for", "0", "--ignore-version", file],
            timeout: .seconds(60))
        #expect(!asked.output.contains("speaks push protocol version 2"), "\(asked.output)")
    }
}

/// Saves `text` over the file at `path` in place (the same file, as an editor that does not rename
/// saves) with one write, then cuts what lies past it: not `Data.write`'s truncate-then-write — two
/// changes, and a watcher whose 100-ms pause ended between them would hash and push an empty file.
func saveInPlace(_ text: String, to path: String) throws {
    let fd = open(path, O_WRONLY | O_CLOEXEC)
    guard fd >= 0 else { throw HarnessError("cannot open \(path) to save it in place: errno \(errno)") }
    defer { close(fd) }
    let bytes = Array(text.utf8)
    guard pwrite(fd, bytes, bytes.count, 0) == bytes.count, ftruncate(fd, off_t(bytes.count)) == 0 else {
        throw HarnessError("cannot save \(path) in place: errno \(errno)")
    }
}
