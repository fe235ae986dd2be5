import Foundation
import Testing

/// preview-server's live web page (issue 44) in a real browser: the server on host b with
/// `--web-port 0 --web-address 10.77.0.2` (a phone on the LAN opens it), Debian's headless
/// Chromium driven by PyPI's Selenium on host a (Tests/browser/preview-page.py; venv:
/// Tests/harness/install-browser.sh), files pushed with the real preview-push from host a.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct PreviewPageTests {
    static var python: String {
        Harness.environment["BROWSER_PYTHON"]
            ?? Harness.repoRoot.appendingPathComponent(".build/browser-venv/bin/python").path
    }
    static var script: String { Harness.repoRoot.appendingPathComponent("Tests/browser/preview-page.py").path }
    /// What the script checks, each a line `CHECK <name> pass|FAIL <what it saw>`.
    static let checks = [
        "page-live",  // the page's event stream is open
        "png-shown",  // a pushed PNG: the screenshot's pixels at the image's place are its colour
        "markdown-heading",  // a pushed Markdown heading is rendered as an <h1>; its <script> did not run
        "live-update",  // a second push shows without a reload, within 200 ms of the result
        "html-sandboxed",  // a pushed HTML file's script does not run (its DOM marker stays)
        "click-shows",  // an earlier file clicked in the list is shown large
        "bidi-escaped",  // a name with U+202E shows the escape, not the reversed name
        "traversal-refused",  // /../, %2e%2e, %2f: refused, nothing outside the inbox served
        "file-headers",  // content type, nosniff, ETag, Range, the sandbox policy of pushed HTML
        "metrics-parse",  // /metrics parses as Prometheus text (prometheus_client)
        "phone-layout",  // 390 px wide: the list below the document, nothing wider than the screen
    ]

    @Test func thePageShowsWhatIsPushedLiveAndSafelyInARealBrowser() async throws {
        let test = PreviewIntegrationTests()
        let (directory, work, data) = (try test.makeDirectory(), try test.makeDirectory(), try test.makeDirectory())
        defer { test.remove(directory, work, data) }
        let hostB = PreviewIntegrationTests.hostB
        // preview-push with a trust store of its own: whether it knows the key is this test's doing.
        let pushCommand = ["env", "XDG_DATA_HOME=\(data)", Harness.binary("preview-push")]
        let (server, port) = try await test.startServer(
            directory: directory, name: "Preview ITest Page", ["--web-port", "0", "--web-address", hostB])
        defer { server.stop() }
        try await server.waitForOutput("web page at http://")  // (the page's own service: not ordered before "published as")
        let line = try #require(server.text.split(separator: "\n").first { $0.contains("web page at http://") })
        let webPort = try #require(UInt16(line.split(separator: ":").last?.split(separator: "/").first ?? ""))
        // Beyond loopback the page answers only its link with the token (issue 56, 2): without
        // it 401, with another token 403, each a page saying where the link comes from.
        let pageURL = String(line[try #require(line.range(of: "http://")).lowerBound...])
        #expect(pageURL.hasPrefix("http://\(hostB):\(webPort)/t/") && pageURL.hasSuffix("/") && pageURL.count == "http://\(hostB):\(webPort)/t/".count + 33, "\(pageURL)")
        func status(_ url: String) throws -> String {
            try Harness.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", url]).output
        }
        #expect(try status("http://\(hostB):\(webPort)/") == "401")
        #expect(try status("http://\(hostB):\(webPort)/files/") == "401")
        #expect(try status("http://\(hostB):\(webPort)/t/\(String(repeating: "0", count: 32))/") == "403")
        let refusal = try Harness.run(["curl", "-s", "--max-time", "10", "http://\(hostB):\(webPort)/api/files"]).output
        #expect(refusal.contains("needs its link") && refusal.contains("preview-push"), "\(refusal)")
        #expect(try status(pageURL) == "200")

        // The page's port is published in TXT (web=PORT): a pusher's --list shows its address.
        var txt = ""
        try await test.waitUntil("the TXT record carries the web page's port") {
            let lines = try Harness.run(["avahi-browse", "-rpt", "_preview._tcp"]).output.split(separator: "\n")
            txt = String(lines.first { $0.hasPrefix("=") && $0.contains("Preview\\032ITest\\032Page") } ?? "")
            return txt.contains("\"web=\(webPort)\"")
        }

        // preview-push --list: the device table, with the page's address, the key and whether it is trusted.
        func listed() throws -> String {
            let output = try Harness.run(pushCommand + ["--list", "--timeout", "5"]).output
            return output.split(separator: "\n").first { $0.hasPrefix("Preview ITest Page\t") }.map(String.init) ?? output
        }
        let before = try listed()
        #expect(before.contains("\tpage http://\(hostB):\(webPort)/ (needs its token: open the link a push prints)") && before.contains("\tkey ") && before.contains("\tnew\t"), "\(before)")

        #expect(FileManager.default.isExecutableFile(atPath: Self.python), "no browser venv at \(Self.python)")
        let push = (pushCommand + ["--host", hostB, "--port", String(port)]).joined(separator: " ")
        let started = ContinuousClock.now
        let result = try Harness.run(
            [Self.python, Self.script, "check", "--url", pageURL, "--push", push, "--work", work,
                "--inbox", directory, "--screenshots", Harness.environment["HARNESS_LOG_DIR"] ?? work],
            timeout: .seconds(240))
        let lines = result.output.split(separator: "\n").map(String.init)
        for check in Self.checks {
            let found = lines.first { $0.hasPrefix("CHECK \(check) ") }
            #expect(found?.hasPrefix("CHECK \(check) pass") == true, "\(found ?? "CHECK \(check) did not run"))")
        }
        #expect(result.status == 0, "\(result.output)")
        let after = try listed()  // pushed to once: its key is remembered
        #expect(after.contains("\ttrusted\t"), "\(after)")
        // A pusher the previewer accepts gets the page's link with its result.
        let note = work + "/link-note.txt"
        try Data("the link\n".utf8).write(to: URL(fileURLWithPath: note))
        let linked = try Harness.run(pushCommand + [note, "--host", hostB, "--port", String(port)])
        #expect(linked.status == 0, "\(linked.output)")
        #expect(linked.output.contains("page of 'Preview ITest Page': \(pageURL)"), "\(linked.output)")
        for measured in lines where measured.hasPrefix("MEASURED") { print(measured) }
        print("MEASURED page: the browser checks took \(ContinuousClock.now - started)")
    }

    /// `--allow-scripts`: a pushed HTML file's script runs, still sandboxed (an opaque origin: it
    /// cannot reach the page), and the server warns. Without the flag the same check fails (the
    /// script never runs; `thePageShows…` checks that side).
    @Test func allowScriptsRunsPushedScriptsInsideTheirSandboxOnly() async throws {
        let test = PreviewIntegrationTests()
        let (directory, work, data) = (try test.makeDirectory(), try test.makeDirectory(), try test.makeDirectory())
        defer { test.remove(directory, work, data) }
        let hostB = PreviewIntegrationTests.hostB
        let (server, port) = try await test.startServer(
            directory: directory, name: "Preview ITest Scripts",
            ["--web-port", "0", "--web-address", hostB, "--allow-scripts"])
        defer { server.stop() }
        #expect(server.text.contains("--allow-scripts: pushed HTML files run their scripts"))
        try await server.waitForOutput("web page at http://")  // (the page's own service: not ordered before "published as")
        let line = try #require(server.text.split(separator: "\n").first { $0.contains("web page at http://") })
        let pageURL = String(line[try #require(line.range(of: "http://")).lowerBound...])
        let push = ["env", "XDG_DATA_HOME=\(data)", Harness.binary("preview-push"), "--host", hostB, "--port", String(port)]
        let result = try Harness.run(
            [Self.python, Self.script, "scripted", "--url", pageURL, "--push",
                push.joined(separator: " "), "--work", work, "--inbox", directory],
            timeout: .seconds(120))
        let found = result.output.split(separator: "\n").first { $0.hasPrefix("CHECK allow-scripts-sandboxed ") }
        #expect(found?.hasPrefix("CHECK allow-scripts-sandboxed pass") == true, "\(result.output)")
        #expect(result.status == 0, "\(result.output)")
    }

    /// `preview-push --watch FILE`: pushed at once, then on every save — written in place, or a new
    /// file renamed over it as editors do — and a save of content the previewer already has is not
    /// sent; SIGTERM ends it with status 0.
    @Test func watchPushesEverySaveAndSkipsContentThePreviewerHas() async throws {
        let test = PreviewIntegrationTests()
        let (directory, work) = (try test.makeDirectory(), try test.makeDirectory())
        defer { test.remove(directory, work) }
        let (server, port) = try await test.startServer(directory: directory, name: "Preview ITest Watch")
        defer { server.stop() }
        let file = work + "/draft.md"
        try Data("# Draft 1\n".utf8).write(to: URL(fileURLWithPath: file))
        let watcher = try Harness.spawn(
            onB: false,
            [Harness.binary("preview-push"), "--watch", file, "--host", PreviewIntegrationTests.hostB, "--port", String(port)])
        defer { watcher.stop() }
        try await watcher.waitForOutput("watching", timeout: .seconds(15))
        func stored() -> Int { test.entries(directory).count }
        #expect(stored() == 1)
        try saveInPlace("# Draft 2\n", to: file)
        try await test.waitUntil("the second save stored", watching: [directory]) { stored() == 2 }
        try saveInPlace("# Draft 2\n", to: file)  // the same content again
        try await watcher.waitForOutput("unchanged", timeout: .seconds(15))
        #expect(stored() == 2, "\(test.entries(directory))")
        try Data("# Draft 3\n".utf8).write(to: URL(fileURLWithPath: work + "/.draft.md.swp"))
        #expect(rename(work + "/.draft.md.swp", file) == 0)  // a new file renamed over it
        try await test.waitUntil("the renamed save stored", watching: [directory]) { stored() == 3 }
        let contents = test.entries(directory).compactMap { try? String(contentsOfFile: directory + "/" + $0, encoding: .utf8) }
        #expect(Set(contents) == ["# Draft 1\n", "# Draft 2\n", "# Draft 3\n"])
        kill(watcher.pid, SIGTERM)
        #expect(watcher.wait(timeout: .seconds(15)) == 0, "\(watcher.text)")
        #expect(watcher.text.contains("stopped watching"), "\(watcher.text)")
    }
}
