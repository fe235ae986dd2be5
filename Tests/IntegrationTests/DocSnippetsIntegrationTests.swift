import Foundation
import Testing

/// The documentation's snippets (`Snippets/*.swift`, shown by the DocC articles of `Messaging`),
/// run as built on host "a" against its avahi-daemon: each must end by itself with exit status 0
/// and print its `ok` line. `swift build` builds every snippet as an executable next to the other
/// products (`.build/debug/<Name>`).
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct DocSnippetsIntegrationTests {
    /// Each snippet and the start of the line it prints when everything worked.
    static let snippets: [(name: String, okLine: String)] = [
        ("GettingStarted", "getting-started: ok hello, alice"),
        ("DiscoveringServices", "discovery: ok"),
        ("SecurityAndTrust", "security: ok "),
        ("WireProtocol", "wire: ok"),
        ("Performance", "performance: ok 10000 messages"),
        ("MessageSessions", "sessions: ok"),
        ("DurableSessions", "durable: ok"),
    ]

    /// A snippet gets this long (each bounds its own waits and gives up by itself after 10 s).
    static let deadline: Duration = .seconds(30)

    @Test(arguments: snippets.map(\.name))
    func snippetRunsToItsOkLine(_ name: String) async throws {
        let okLine = try #require(Self.snippets.first { $0.name == name }?.okLine)
        let path = Harness.binary(name)
        try #require(
            FileManager.default.isExecutableFile(atPath: path),
            "no snippet binary at \(path): `swift build` builds Snippets/\(name).swift")
        let start = ContinuousClock.now
        let child = try Harness.spawn(onB: false, [path])
        let status = child.wait(timeout: Self.deadline)
        let output = child.text
        guard let status else {
            child.stop()
            Issue.record("\(name) did not exit within \(Self.deadline); output:\n\(output)")
            return
        }
        Harness.measured("snippet \(name)", ContinuousClock.now - start)
        #expect(status == 0, "\(name) exited with \(status); output:\n\(output)")
        let lines = output.split(separator: "\n")
        #expect(lines.contains { $0.hasPrefix(okLine) }, "no line starting '\(okLine)' from \(name); output:\n\(output)")
        if name == "SecurityAndTrust" {
            // The line ends with the six-digit comparison code, in two groups of three.
            let code = lines.first { $0.hasPrefix(okLine) }.map { String($0.dropFirst(okLine.count)) }
            #expect(code?.wholeMatch(of: /[0-9]{3} [0-9]{3}/) != nil, "no comparison code in: \(code ?? "nothing")")
        }
    }
}
