import Foundation
import Testing

/// bonjour-chat end to end: the built binary, rooms hosted on host "b", listed and joined from host
/// "a" over the veth link, real avahi-daemons on both. Every wait has a deadline.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct ChatIntegrationTests {
    let chat = Harness.binary("bonjour-chat")

    /// A room name no other test uses (avahi caches outlive a test by a second or so).
    func roomName(_ base: String) -> String { "\(base)-\(UUID().uuidString.prefix(6))" }

    /// Hosts a room on host b (scripted: the test types into its stdin) and waits until it is published.
    func hostOnB(_ room: String, nick: String = "hal", _ extra: [String] = []) async throws -> ChatProcess {
        let host = try ChatProcess(onB: true, [chat, "host", room, "--nick", nick] + extra)
        try await host.waitForOutput("published on the network as \(room)")
        return host
    }

    /// Joins from host a (scripted) and waits for the welcome.
    func join(_ arguments: [String], nick: String) async throws -> ChatProcess {
        let process = try ChatProcess(onB: false, [chat, "join"] + arguments + ["--nick", nick])
        try await process.waitForOutput("joined")
        return process
    }

    /// `bonjour-chat rooms` from host a, repeated (bounded) until a line about `room` satisfies `predicate`.
    func roomsLine(_ room: String, timeout: Duration = .seconds(30), where predicate: (String) -> Bool) async throws
        -> String
    {
        let deadline = ContinuousClock.now + timeout
        var last = ""
        while ContinuousClock.now < deadline {
            let result = try Harness.run([chat, "rooms", "--timeout", "2"], timeout: .seconds(15))
            #expect(result.status == 0, "rooms failed: \(result.output)")
            last = result.output
            if let line = last.split(separator: "\n").map(String.init).first(where: {
                $0.hasPrefix(room + " ") && predicate($0)
            }) {
                return line
            }
        }
        throw HarnessError("rooms never showed the expected line for \(room) within \(timeout); last output:\n\(last)")
    }

    /// Version 2 in the chat: the host's key in `rooms`, the same comparison code on both sides at
    /// join, `/fingerprint` and `/trust` on the member's side.
    @Test func joinShowsKeysAndTheSameComparisonCodeOnBothSides() async throws {
        let room = roomName("Secure")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let hostKey = try await host.waitForOutput("this room's key is")
        let short = try #require(
            hostKey.range(of: "key is ").map { String(hostKey[$0.upperBound...].prefix(19)) })
        #expect(short.count == 19, "\(hostKey)")
        let line = try await roomsLine(room) { $0.contains("key ") }
        #expect(line.contains("key \(short)"), "\(line)")

        let alice = try await join([room], nick: "alice")
        defer { alice.stop() }
        let seen = try await alice.waitForOutput("comparison code")
        #expect(seen.contains("has key \(short)"), "\(seen)")
        let member = try await host.waitForOutput("comparison code")
        let code = { (text: String) -> String? in
            guard let range = text.range(of: "comparison code ") else { return nil }
            return String(text[range.upperBound...].prefix(7))
        }
        #expect(code(seen) != nil && code(seen) == code(member), "\(seen) / \(member)")

        try alice.send("/fingerprint")
        let full = try await alice.waitForOutput("host \(room): key")
        #expect(full.contains("comparison code \(code(seen) ?? "?")"), "\(full)")
        try alice.send("/trust")
        _ = try await alice.waitForOutput("trusted: \(room)")
    }

    /// Trust follows the key, not the name (issue 43, 22): a member that met a room once, when an
    /// impostor has since taken the room's name (the real host came back as "<room> #2"), joins the
    /// real room by its key and says that it refused the impostor — on Avahi here, on the embedded
    /// stack in the chat-preview-embedded stage.
    @Test func aMemberFindsTheRoomByItsKeyWhenAnImpostorTookTheName() async throws {
        let room = roomName("Keyed")
        let data = NSTemporaryDirectory() + "chat-key-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: data) }
        func host(_ who: String) async throws -> (ChatProcess, key: String) {
            let process = try ChatProcess(onB: true, ["env", "XDG_DATA_HOME=\(data)/\(who)", chat, "host", room, "--nick", who])
            let line = try await process.waitForOutput("this room's key is")
            _ = try await process.waitForOutput("published")  // "… on the network as R", or "… as R #2" after a rename
            let key = try #require(line.range(of: "key is ").map { String(line[$0.upperBound...].prefix(19)) })
            return (process, key)
        }
        func member() throws -> ChatProcess {
            try ChatProcess(onB: false, ["XDG_DATA_HOME=\(data)/member", chat, "join", room, "--nick", "alice", "--timeout", "8"])
        }
        var (real, realKey) = try await host("real")
        let first = try member()
        try await first.waitForOutput("has key \(realKey)")
        first.stop()
        real.stop()
        let (impostor, impostorKey) = try await host("impostor")
        defer { impostor.stop() }
        (real, _) = try await host("real")
        defer { real.stop() }
        #expect(real.text.contains("published as \(room) #2"), "\(real.text)")

        let second = try member()
        defer { second.stop() }
        let seen = try await second.waitForOutput("has key")
        #expect(seen.contains("has key \(realKey)"), "\(seen) (the impostor's key is \(impostorKey))")
        #expect(second.text.contains("refused '\(room)'"), "\(second.text)")
        #expect(second.text.contains("HAS CHANGED"), "\(second.text)")
        try await real.waitForOutput("alice joined")
        #expect(!impostor.text.contains("alice joined"), "\(impostor.text)")
    }

    /// The environment's settings as the docs say (issue 45, 5): a malformed LANMSG_WIDE_AREA_DOMAIN
    /// is ignored and said at the default level; a LANMSG_WIDE_AREA_KEY that cannot be used stops
    /// the program with the reason, not with its usage text.
    @Test func environmentSettingsAreSaidOrStopTheProgramAsDocumented() async throws {
        let ignored = try Harness.run(
            ["env", "LANMSG_WIDE_AREA_DOMAIN=bad..name", chat, "rooms", "--timeout", "1"], timeout: .seconds(20))
        #expect(ignored.status == 0, "\(ignored.output)")
        #expect(ignored.output.contains("ignored discovery setting: LANMSG_WIDE_AREA_DOMAIN: 'bad..name' is not a domain name"), "\(ignored.output)")
        let room = roomName("Keyless")
        let stopped = try Harness.run(
            ["env", "LANMSG_WIDE_AREA_KEY=/nonexistent/host.key", chat, "host", room, "--nick", "hal"], timeout: .seconds(20))
        #expect(stopped.status != 0, "\(stopped.output)")
        #expect(stopped.output.contains("/nonexistent/host.key"), "\(stopped.output)")
        #expect(!stopped.output.contains("USAGE:") && !stopped.output.contains("Usage:"), "\(stopped.output)")
    }

    /// `--help` names every command the running program's `/help` lists (issue 45, 8: it lacked
    /// `/fingerprint` and `/trust`), and preview-push's `--help` gives each exit status it uses.
    @Test func theHelpTextsNameEveryCommandAndExitStatus() async throws {
        let room = roomName("Helpful")
        let host = try await hostOnB(room)
        defer { host.stop() }
        try host.send("/help")
        try await host.waitForOutput("the end of /help") { $0.contains("//text") }
        let listed = host.text
        // Lines "[time] -!-   /who   who is in the room": the first word starting with /.
        let commands = listed.split(separator: "\n").compactMap { line -> String? in
            guard line.contains("-!-   /"), let word = line.split(separator: " ").first(where: { $0.hasPrefix("/") }), !word.hasPrefix("//")
            else { return nil }
            return String(word)
        }
        #expect(Set(commands).isSuperset(of: ["/who", "/fingerprint", "/trust", "/quit"]), "\(listed)")
        let help = try Harness.run([chat, "--help"], timeout: .seconds(10)).output
        for command in Set(commands) {
            #expect(help.contains(command + " ") || help.contains(command + "\n") || help.contains(command + ":"), "--help lacks \(command): \(help)")
        }
        let push = try Harness.run([Harness.binary("preview-push"), "--help"], timeout: .seconds(10)).output
        let status = push.replacingOccurrences(of: "\n", with: " ").replacingOccurrences(of: "  ", with: " ")
        for code in ["0 every file stored", "1 a file failed", "2 nothing was sent", "64 a usage error"] {
            #expect(status.contains(code), "preview-push --help lacks exit status '\(code)': \(push)")
        }
    }

    @Test func roomsListsTheHostedRoomWithTopicAndMemberCountKeptCurrent() async throws {
        let room = roomName("Lobby")
        let host = try await hostOnB(room, ["--topic", "Friday plans"])
        defer { host.stop() }
        let line = try await roomsLine(room) { $0.contains("1 member") }
        #expect(line.contains("topic: Friday plans"), "\(line)")
        #expect(line.contains("on bravo.local port"), "\(line)")
        #expect(line.contains("10.77.0.2"), "\(line)")
        // A member joins: the TXT record follows.
        let alice = try await join([room], nick: "alice")
        defer { alice.stop() }
        _ = try await roomsLine(room) { $0.contains("2 members") }
        // The topic changes: the TXT record follows.
        try alice.send("/topic Saturday now")
        try await host.waitForOutput("alice set the topic: Saturday now")
        _ = try await roomsLine(room) { $0.contains("topic: Saturday now") && $0.contains("2 members") }
        alice.closeInput()
        #expect(await alice.waitForExit(timeout: .seconds(10)) == 0, "\(alice.text)")
    }

    @Test func messagesAreRelayedBothWaysAmongThreeParticipants() async throws {
        let room = roomName("Relay")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let portLine = try await host.waitForOutput("on port ")
        let port = try #require(
            portLine.components(separatedBy: "on port ").last?.split(separator: ";").first.map(String.init))
        let alice = try await join([room], nick: "alice")
        defer { alice.stop() }
        // carol connects directly, without discovery.
        let carol = try await join(["--host", "10.77.0.2", "--port", port], nick: "carol")
        defer { carol.stop() }
        try await host.waitForOutput("carol joined")

        try alice.send("hi from alice")
        for peer in [host, carol, alice] { try await peer.waitForOutput("<alice> hi from alice") }
        try host.send("hi from hal")
        for peer in [alice, carol] { try await peer.waitForOutput("<hal> hi from hal") }
        try carol.send("/me waves")
        for peer in [host, alice] { try await peer.waitForOutput("* carol waves") }
        try alice.send("/who")
        try await alice.waitForOutput("3 here: hal, alice, carol in \(room)")
        // Lines have the documented shape.
        let said = try await carol.waitForOutput("alice's line") { $0.hasSuffix("<alice> hi from alice") }
        #expect(
            said.range(of: #"^\[\d\d:\d\d:\d\d\] <alice> hi from alice$"#, options: .regularExpression) != nil,
            "\(said)")

        // End of input: alice leaves after what she typed was delivered; the others see it at once.
        try alice.send("last words")
        alice.closeInput()
        #expect(await alice.waitForExit(timeout: .seconds(10)) == 0, "\(alice.text)")
        for peer in [host, carol] {
            try await peer.waitForOutput("<alice> last words")
            try await peer.waitForOutput("alice left") { $0.hasSuffix("-!- alice left") }
        }
        try carol.send("/quit")
        #expect(await carol.waitForExit(timeout: .seconds(10)) == 0, "\(carol.text)")
        try await host.waitForOutput("carol left") { $0.hasSuffix("-!- carol left") }
        // The host closes the room on SIGTERM and tells everyone.
        host.deliver(signal: SIGTERM)
        #expect(await host.waitForExit(timeout: .seconds(10)) == 0, "\(host.text)")
        #expect(host.text.contains("hal closed the room"))
    }

    @Test func keyFileKeepsStrangersOut() async throws {
        let keyPath = NSTemporaryDirectory() + "chat-\(UUID().uuidString).key"
        let otherPath = keyPath + ".other"
        try "a shared secret for the test room\n".write(toFile: keyPath, atomically: true, encoding: .utf8)
        try "somebody else's secret, not ours\n".write(toFile: otherPath, atomically: true, encoding: .utf8)
        defer { unlink(keyPath); unlink(otherPath) }
        let room = roomName("Keyed")
        let host = try await hostOnB(room, ["--key-file", keyPath])
        defer { host.stop() }
        // No key: refused with a clear message, non-zero exit.
        let stranger = try ChatProcess(onB: false, [chat, "join", room, "--nick", "eve", "--rejoin-timeout", "0"])
        defer { stranger.stop() }
        let strangerStatus = await stranger.waitForExit(timeout: .seconds(20))
        #expect(strangerStatus != nil && strangerStatus != 0, "\(stranger.text)")
        #expect(stranger.text.contains("pre-shared key"), "\(stranger.text)")
        // Wrong key: refused too.
        let wrong = try ChatProcess(onB: false, [chat, "join", room, "--nick", "mallory", "--rejoin-timeout", "0", "--key-file", otherPath])
        defer { wrong.stop() }
        let wrongStatus = await wrong.waitForExit(timeout: .seconds(20))
        #expect(wrongStatus != nil && wrongStatus != 0, "\(wrong.text)")
        #expect(wrong.text.contains("key"), "\(wrong.text)")
        // The same key: in.
        let friend = try await join([room, "--key-file", keyPath], nick: "friend")
        defer { friend.stop() }
        try friend.send("hello with the key")
        try await host.waitForOutput("<friend> hello with the key")
        #expect(!host.text.contains("eve joined") && !host.text.contains("mallory joined"))
    }

    @Test func lateJoinerGetsTheHistory() async throws {
        let room = roomName("History")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let alice = try await join([room], nick: "alice")
        defer { alice.stop() }
        for index in 1...3 { try alice.send("message \(index)") }
        try await host.waitForOutput("<alice> message 3")
        let dave = try await join([room], nick: "dave")
        defer { dave.stop() }
        try await dave.waitForOutput("<alice> message 3")
        let lines = dave.lines
        let header = try #require(lines.firstIndex { $0.contains("last 3 messages:") }, "\(dave.text)")
        #expect(
            lines[(header + 1)...].prefix(3).map {
                $0.components(separatedBy: "] ").dropFirst().joined(separator: "] ")
            }
                == ["<alice> message 1", "<alice> message 2", "<alice> message 3"])
        try await alice.waitForOutput("dave joined")
    }

    @Test func duplicateNickIsRenamedAndTold() async throws {
        let room = roomName("Nicks")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let first = try await join([room], nick: "sam")
        defer { first.stop() }
        let second = try await join([room], nick: "sam")
        defer { second.stop() }
        try await second.waitForOutput("you joined \(room) as sam_2")
        try await second.waitForOutput("the nick sam is taken; you are sam_2")
        try await host.waitForOutput("sam_2 joined")
        try second.send("which sam am I")
        try await first.waitForOutput("<sam_2> which sam am I")
    }

    @Test func joinWithoutANameFailsListingTheRoomsWhenThereAreSeveral() async throws {
        let one = try await hostOnB(roomName("One"))
        defer { one.stop() }
        let two = try await hostOnB(roomName("Two"))
        defer { two.stop() }
        let result = try Harness.run([chat, "join", "--timeout", "3", "--nick", "x"], timeout: .seconds(20))
        #expect(result.status == 3, "\(result.output)")
        #expect(result.output.contains("rooms found; name the one to join"), "\(result.output)")
        let missing = try Harness.run(
            [chat, "join", "No-Such-Room-\(UUID().uuidString.prefix(6))", "--timeout", "2"], timeout: .seconds(20))
        #expect(missing.status == 3, "\(missing.output)")
        #expect(missing.output.contains("bonjour-chat rooms"), "\(missing.output)")
        let usage = try Harness.run([chat, "join", "--host", "10.77.0.2"], timeout: .seconds(10))
        #expect(usage.status == 2, "\(usage.output)")
    }

    /// A corrupt identity file stops the host before anything is published, naming the file and
    /// what to do (it used to publish the room, then refuse every member's handshake).
    @Test func aCorruptIdentityFileStopsTheHostNamingTheFile() async throws {
        let data = NSTemporaryDirectory() + "chat-corrupt-\(UUID().uuidString.prefix(8))"
        let file = data + "/lanmsg/bonjour-chat/identity"
        try FileManager.default.createDirectory(atPath: data + "/lanmsg/bonjour-chat", withIntermediateDirectories: true)
        try "this is not a key\n".write(toFile: file, atomically: true, encoding: .utf8)
        chmod(file, 0o600)
        let room = roomName("Broken Key")
        let result = try Harness.run(["env", "XDG_DATA_HOME=\(data)", chat, "host", room, "--nick", "hal"], timeout: .seconds(20))
        #expect(result.status == 5, "\(result.output)")
        #expect(result.output.contains(file), "\(result.output)")
        #expect(!result.output.contains("published on the network"), "\(result.output)")
    }

    @Test func hostKilledClientsNoticeSaySoAndRejoin() async throws {
        let room = roomName("Fragile")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let alice = try await join([room, "--rejoin-timeout", "60"], nick: "alice")
        defer { alice.stop() }
        let bob = try await join([room, "--rejoin-timeout", "2"], nick: "bob")
        defer { bob.stop() }
        try await host.waitForOutput("bob joined")

        host.deliver(signal: SIGKILL)
        #expect(await host.waitForExit(timeout: .seconds(5)) != nil)
        for peer in [alice, bob] { try await peer.waitForOutput("lost the connection to the host of \(room)") }
        try await alice.waitForOutput("looking for the room to rejoin")
        // bob gives up after 2 s and says so; exit status 4 (connection lost).
        try await bob.waitForOutput("could not rejoin \(room) within 2 s; giving up")
        #expect(await bob.waitForExit(timeout: .seconds(10)) == 4, "\(bob.text)")

        // The room comes back (new process, new port): alice finds it again and rejoins.
        let again = try await hostOnB(room)
        defer { again.stop() }
        try await alice.waitForOutput("rejoined \(room) as alice", timeout: .seconds(30))
        try alice.send("back again")
        try await again.waitForOutput("<alice> back again")
    }

    /// The link drops and the member's connection is destroyed while she types: she stays in the room,
    /// and her lines reach the host once each, in order, when the link is back (the message session
    /// resumes). Then the host dies for good: the line she typed meanwhile is reported as not delivered.
    @Test func aDroppedConnectionLosesNoLinesAndAGoneRoomSaysWhichWereNotSent() async throws {
        let room = roomName("Roaming")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let alice = try await join([room, "--rejoin-timeout", "15"], nick: "alice")
        defer { alice.stop() }
        try await host.waitForOutput("alice joined")
        try Harness.control("link-down", host: "a")
        _ = try Harness.run(["ss", "-K", "dst", "10.77.0.2"])
        try await alice.waitForOutput("lost the connection to the host of \(room)")
        for i in 1...3 { try alice.send("while away \(i)") }
        try Harness.control("link-up", host: "a")
        try await alice.waitForOutput("back in \(room)", timeout: .seconds(30))
        for i in 1...3 { try await host.waitForOutput("<alice> while away \(i)") }
        let said = host.lines.filter { $0.contains("<alice> while away") }.map { String($0.suffix(12)) }
        #expect(said == ["while away 1", "while away 2", "while away 3"], "\(host.text)")
        #expect(!host.text.contains("alice left"), "\(host.text)")
        #expect(host.text.contains("alice is back"), "\(host.text)")
        #expect(!alice.text.contains("rejoined"))  // no new join: the session continued

        host.deliver(signal: SIGKILL)
        #expect(await host.waitForExit(timeout: .seconds(5)) != nil)
        try await alice.waitForOutput("lost the connection to the host of \(room)") {
            $0.contains("lost the connection") && alice.text.components(separatedBy: "lost the connection").count > 2
        }
        try alice.send("into the void")
        let report = try await alice.waitForOutput("not delivered", timeout: .seconds(30))
        #expect(report.contains("\"into the void\""), "\(report)")
        #expect(await alice.waitForExit(timeout: .seconds(10)) == 4, "\(alice.text)")
    }

    @Test func interactiveModeInARealTerminal() async throws {
        let room = roomName("Screen")
        let host = try await hostOnB(room)
        defer { host.stop() }
        let tmux = try TmuxSession([chat, "join", room, "--nick", "tina"])
        defer { tmux.kill() }
        let prompt = "[\(room)] tina> "
        try await tmux.waitForScreen("the welcome and the prompt") { rows in
            rows.contains { $0.contains("you joined \(room) as tina") }
                && rows.last == prompt.trimmingCharacters(in: .whitespaces)
        }
        try await host.waitForOutput("tina joined")
        // Colour on a terminal.
        #expect(try tmux.screen(escapes: true).joined().contains("\u{1B}["))

        // Half a line typed, then a message arrives: it is printed above, the typed text stays intact.
        try tmux.type("hello wor")
        try await tmux.waitForScreen("the typed text") { $0.last == prompt + "hello wor" }
        try host.send("incoming while typing")
        let rows = try await tmux.waitForScreen("the incoming line above the prompt") { rows in
            rows.contains { $0.hasSuffix("<hal> incoming while typing") } && rows.last == prompt + "hello wor"
        }
        #expect(rows.filter { $0.contains("hello wor") }.count == 1, "\(rows)")
        let incoming = try #require(rows.first { $0.contains("incoming while typing") })
        #expect(
            incoming.range(of: #"^\[\d\d:\d\d:\d\d\] <hal> incoming while typing$"#, options: .regularExpression)
                != nil, "\(incoming)")

        // Finish the line: it goes out whole.
        try tmux.type("ld")
        try tmux.press("Enter")
        try await host.waitForOutput("<tina> hello world")
        try await tmux.waitForScreen("the sent line") { rows in
            rows.contains { $0.hasSuffix("<tina> hello world") }
                && rows.last == prompt.trimmingCharacters(in: .whitespaces)
        }

        // Commands work; /quit leaves politely (no "connection lost").
        try tmux.type("/who")
        try tmux.press("Enter")
        try await tmux.waitForScreen("/who") { $0.contains { $0.contains("2 here: hal, tina in \(room)") } }
        try tmux.type("/quit")
        try tmux.press("Enter")
        try await host.waitForOutput("tina left") { $0.hasSuffix("-!- tina left") }

        // `join` without a name and several rooms: a person picks one on the terminal. Ctrl-C leaves
        // politely, and the terminal is back in its normal mode afterwards.
        let other = try await hostOnB(roomName("Other"))
        defer { other.stop() }
        let picker = try TmuxSession([
            "sh", "-c", "trap : INT; \"$0\" join --nick tom --timeout 3; echo \"EXIT=$?\"; stty -a; exec sleep 60",
            chat,
        ])
        defer { picker.kill() }
        try await picker.waitForScreen("the room picker") { $0.last?.hasPrefix("join which room?") == true }
        #expect(try picker.screen().contains { $0.hasSuffix(") \(room)") })
        try picker.type(room)
        try picker.press("Enter")
        try await picker.waitForScreen("the welcome") { $0.contains { $0.contains("you joined \(room) as tom") } }
        try await host.waitForOutput("tom joined")
        try picker.press("C-c")
        try await host.waitForOutput("tom left") { $0.hasSuffix("-!- tom left") }
        let after = try await picker.waitForScreen("the exit status and stty") { rows in
            rows.contains("EXIT=0") && rows.contains { $0.contains("icanon") }
        }
        let flags = after.joined(separator: " ").split(separator: " ")
        #expect(
            flags.contains("icanon") && flags.contains("echo") && !flags.contains("-icanon")
                && !flags.contains("-echo"), "\(after)")
    }
}
