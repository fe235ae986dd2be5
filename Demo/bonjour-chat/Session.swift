import Discovery
import ChatKit
import Foundation
import Logging
import Messaging

/// Where `join` goes.
enum JoinTarget: Sendable {
    /// A room by name, or (nil) the only one there is.
    case room(String?)
    /// A host and port, without discovery.
    case direct(host: String, port: UInt16)
}

/// What host and join share: output, input, discovery, the merged event stream.
final class ChatSession {
    let logger: Logger
    let nick: String
    let interactive: Bool
    let formatter: ChatFormatter
    let console: Console
    let discovery: ServiceDiscovery
    let stream: AsyncStream<LoopInput>
    let continuation: AsyncStream<LoopInput>.Continuation
    let key: PreSharedKey?

    init(options: CommonOptions, nick: String, discovery configuration: DiscoveryConfiguration) {
        logger = options.logger()
        key = (try? options.preSharedKey()) ?? nil  // validated when the options were parsed
        self.nick = nick
        interactive = isatty(STDIN_FILENO) == 1 && isatty(STDOUT_FILENO) == 1
        formatter = ChatFormatter(
            color: shouldUseColor(
                isTerminal: isatty(STDOUT_FILENO) == 1, environment: ProcessInfo.processInfo.environment))
        console = Console(interactive: interactive)
        discovery = ServiceDiscovery(logger: logger, programName: "bonjour-chat", configuration: configuration)
        (stream, continuation) = AsyncStream.makeStream(of: LoopInput.self)
    }

    var now: Double { Date().timeIntervalSince1970 }

    func notice(_ text: String) { console.show(formatter.notice(text, at: now)) }
    func problem(_ text: String) { console.show(formatter.error(text, at: now)) }

    /// Signals, raw mode (TTY), the prompt, the stdin reader.
    func startInput(prompt: String) {
        Signals.forward(into: continuation)
        if interactive { RawTerminal.enter() }
        console.activate(prompt: prompt)
        InputReader.start(console: console, into: continuation)
    }

    /// Clears the prompt, restores the terminal, stops discovery.
    func finish() async {
        console.deactivate()
        RawTerminal.restore()
        await discovery.shutdown()
    }

    func showHelp() {
        console.show(ChatCommand.helpLines.map { formatter.notice($0, at: now) })
    }

    /// The hosts this chat trusts (trust on first use: remembered at the first join).
    var trustStore: TrustStore { TrustStore(path: TrustStore.defaultPath(app: "bonjour-chat")) }

    /// One line about a proven peer: its key, the comparison code and, on a first contact, what to do.
    func describe(_ identity: PeerIdentity, as role: String) -> String {
        var line = "encrypted; \(role) \(Room.clean(identity.name)) has key \(identity.fingerprint.short), "
            + "comparison code \(identity.comparisonCode)"
        // A joining member trusts the host on first use; the host accepts any member's key, so only
        // the member's side knows whether this is a first contact.
        if identity.isFirstContact && role == "host" {
            line += " — first contact: check that the other side shows the same code"
        }
        return line
    }

    /// `/fingerprint`: this side's key and the keys and codes of the given peers.
    func showFingerprints(of peers: [PeerIdentity], as role: String) {
        if let identity = ChannelSecurity.standard.identity {
            notice("your key: \(identity.fingerprint.full)")
        }
        if peers.isEmpty { notice("no encrypted connection right now") }
        for peer in peers {
            notice("\(role) \(Room.clean(peer.name)): key \(peer.fingerprint.full), comparison code \(peer.comparisonCode)")
        }
    }

    /// `/trust [forget ROOM]`.
    func showTrust(forget room: String?) {
        let store = trustStore
        if let room {
            do {
                let forgotten = try store.forget(name: room)
                notice(forgotten ? "forgot the key of \(room); the next join trusts the key it then sees" : "\(room) was not trusted")
            } catch {
                problem(error.message)
            }
            return
        }
        let entries = store.entries
        if entries.isEmpty { notice("no trusted hosts yet (\(store.path))") }
        for entry in entries { notice("trusted: \(Room.clean(entry.name)) — key \(entry.fingerprint.full)") }
    }

    /// Lists the rooms without blocking the chat; the lines arrive as `.output`.
    func listRoomsInBackground() {
        notice("looking for rooms…")
        let finder = RoomFinder(discovery: discovery)
        let formatter = self.formatter
        let continuation = self.continuation
        Task {
            let lines: [String]
            do {
                let rooms = try await finder.list(timeout: .seconds(2))
                let time = Date().timeIntervalSince1970
                lines =
                    rooms.isEmpty
                    ? [formatter.notice("no rooms found", at: time)]
                    : rooms.map { formatter.notice("room: " + $0.summary, at: time) }
            } catch let error as ChatExit {
                lines = [formatter.error(error.message, at: Date().timeIntervalSince1970)]
            } catch {
                lines = [formatter.error("\(error)", at: Date().timeIntervalSince1970)]
            }
            continuation.yield(.output(lines))
        }
    }

    /// Reports a command the chat does not know or that misses its argument; true if it did.
    func reportBadCommand(_ command: ChatCommand) -> Bool {
        switch command {
        case .usage(let usage): problem("usage: \(usage)")
        case .unknown(let name):
            problem("unknown command /\(name); /help lists the commands (//text sends a line starting with /)")
        default: return false
        }
        return true
    }

    func channelConfiguration(_ channel: inout ChannelConfiguration) {
        channel.preSharedKey = key
        channel.pingInterval = .seconds(2)
        channel.heartbeatTimeout = .seconds(6)
    }

    // MARK: host

    func host(room name: String, topic: String, port: UInt16) async -> ChatExit {
        var room = Room(name: name, topic: topic)
        var me = Participant(nick: nick, room: name, formatter: formatter)
        let firstLines = room.handle(.join(nick: nick), from: Room.localID, at: now)
        var configuration = ServerConfiguration(serviceType: chatServiceType, serviceName: name, peerName: name)
        configuration.txt = TXTRecord(room.txt)
        configuration.listener.port = port
        configuration.stopGracePeriod = .seconds(2)
        channelConfiguration(&configuration.channel)
        let server = MessageServer(configuration: configuration, discovery: discovery, logger: logger)
        do {
            try await server.start()
        } catch {
            await discovery.shutdown()
            let hint = port != 0 ? "; is port \(port) in use? pick another --port or leave it out" : ""
            return ChatExit(ExitStatus.cannotHost, "cannot host \(name): \(error.message)\(hint)")
        }
        let continuation = self.continuation
        Task {
            for await event in server.events { continuation.yield(.server(event)) }
        }
        startInput(prompt: me.prompt)
        notice(
            "hosting \(name) on port \(server.port ?? port); others join with: bonjour-chat join \(shellQuoted(name))")
        if let identity = configuration.channel.security.identity {
            notice("encrypted; this room's key is \(identity.fingerprint.short) (members see it when they join)")
        }
        let discovery = self.discovery
        let formatter = self.formatter
        let listening = server.port ?? port
        Task {
            try? await Task.sleep(for: .seconds(5))
            let state = discovery.daemonState
            guard state != .running else { return }
            continuation.yield(
                .output([
                    formatter.error(
                        "the room is not published yet: the avahi-daemon is not reachable (\(state)); "
                            + "others can still join with: "
                            + "bonjour-chat join --host <this host's address> --port \(listening)",
                        at: Date().timeIntervalSince1970)
                ]))
        }
        var connections: [MemberID: ServerConnection] = [:]
        var publishedTXT = room.txt

        func deliver(_ deliveries: [Room.Delivery]) async {
            for delivery in deliveries {
                let targets: [MemberID]
                let message: HostMessage
                switch delivery {
                case .to(let id, let value): (targets, message) = ([id], value)
                case .everyone(let value): (targets, message) = (room.members.map(\.id), value)
                case .everyoneBut(let id, let value):
                    (targets, message) = (room.members.map(\.id).filter { $0 != id }, value)
                }
                if targets.contains(Room.localID) { console.show(me.receive(message, at: now)) }
                await send(message, to: targets.compactMap { connections[$0] })
            }
            console.setPrompt(me.prompt)
        }

        await deliver(firstLines)
        var status = ExitStatus.ok
        loop: for await input in stream {
            switch input {
            case .server(let event):
                switch event {
                case .published(let published):
                    notice("the room is published on the network as \(published)")
                case .renamed(let from, let to):
                    room.name = to
                    notice("a room named \(from) exists already; this one is published as \(to)")
                case .accepted(let connection):
                    connections[connection.id] = connection
                    if let identity = connection.channel.peerIdentity { notice(describe(identity, as: "member")) }
                case .received(let connection, let message):
                    let request: ParticipantRequest
                    do {
                        guard let decoded = try ParticipantRequest.decode(message) else {
                            // A type this version does not know: a request is answered, a one-way
                            // message logged (a newer member may send things this host ignores).
                            logger.notice("unknown message", metadata: ["type": "\(message.typeID)", "from": "\(connection)"])
                            if message.expectsReply {
                                try? await connection.reply(
                                    to: message,
                                    error: RemoteError(code: ChatErrorCode.unknownType, message: "this host does not know '\(message.typeID)'"))
                            }
                            continue loop
                        }
                        request = decoded
                    } catch {
                        // Malformed: said to the sender (error reply to a request, a notice otherwise) and logged.
                        let text = "your \(message.typeID) could not be read by the host: \(error)"
                        logger.notice("malformed message", metadata: ["type": "\(message.typeID)", "from": "\(connection)", "error": "\(error)"])
                        if message.expectsReply {
                            try? await connection.reply(to: message, error: RemoteError(code: ChatErrorCode.badRequest, message: text))
                        } else {
                            try? await connection.send(HostMessage.event(RoomEvent(.notice, time: now, text: text)))
                        }
                        continue loop
                    }
                    if case .members = request, message.expectsReply {
                        // `chat.members` is a request: the reply carries who is here.
                        if room.nick(of: connection.id) != nil {
                            try? await connection.reply(to: message, with: room.membersInfo, type: ChatType.members)
                        } else {
                            try? await connection.reply(
                                to: message, error: RemoteError(code: ChatErrorCode.notJoined, message: "join the room first (chat.join)"))
                        }
                        continue loop
                    }
                    await deliver(room.handle(request, from: connection.id, at: now))
                    if case .leave = request {
                        // chat.bye is sent: the member is gone, and so is its connection.
                        connections[connection.id] = nil
                        connection.close(reason: "left the room")
                    }
                case .closed(let connection, _):
                    connections[connection.id] = nil
                    await deliver(room.disconnected(connection.id, at: now))
                case .interrupted(let connection, let reason):
                    if let nick = room.nick(of: connection.id) {
                        notice("\(nick)'s connection dropped (\(reason)); keeping their place while they come back")
                    }
                case .resumed(let connection, _):
                    if let nick = room.nick(of: connection.id) { notice("\(nick) is back") }
                case .undelivered(let connection, let lost):
                    logger.notice("\(lost.count) messages to \(connection) were never acknowledged")
                case .transfer(_, let transfer):
                    transfer.discard()
                case .refused(let remote, let reason):
                    // The server's log already has these, as a summary per interval.
                    logger.debug(
                        "refused", metadata: ["remote": "\(remote.map { "\($0)" } ?? "?")", "reason": "\(reason)"])
                case .registered(let name, let domain):
                    notice("the room is also registered in \(domain) as \(name) (found from other subnets)")
                case .registrationFailed(let domain, let error):
                    problem("registering the room in \(domain) failed: \(error.message)")
                }
            case .line(let line):
                let command = ChatCommand.parse(line)
                switch command {
                case .say(let text): await deliver(room.handle(.say(text), from: Room.localID, at: now))
                case .me(let text): await deliver(room.handle(.me(text), from: Room.localID, at: now))
                case .nick(let new): await deliver(room.handle(.nick(new), from: Room.localID, at: now))
                case .topic(nil):
                    notice(room.topic.isEmpty ? "no topic; set one with /topic TEXT" : "topic: \(room.topic)")
                case .topic(let text?): await deliver(room.handle(.topic(text), from: Room.localID, at: now))
                case .who:
                    await deliver(room.handle(.members, from: Room.localID, at: now))
                    for connection in connections.values.sorted(by: { $0.id < $1.id }) {
                        let nick = room.nick(of: connection.id) ?? connection.peer.name
                        notice("  \(nick): \(await connection.health)")
                    }
                case .rooms: listRoomsInBackground()
                case .help: showHelp()
                case .fingerprint:
                    showFingerprints(of: connections.values.sorted { $0.id < $1.id }.compactMap(\.channel.peerIdentity), as: "member")
                case .trust(let room): showTrust(forget: room)
                case .quit: break loop
                case .empty, .usage, .unknown: _ = reportBadCommand(command)
                }
            case .endOfInput:
                if interactive { break loop }  // Ctrl-D; in scripted mode the room stays open
            case .interrupt:
                break loop
            case .output(let lines):
                console.show(lines)
            case .client, .rejoinDeadline, .byeTimeout:
                break
            }
            if room.txt != publishedTXT {
                publishedTXT = room.txt
                do {
                    try await server.updateTXT(TXTRecord(room.txt))
                } catch {
                    logger.warning("TXT update failed", metadata: ["error": "\(error.message)"])
                }
            }
        }
        let closing = RoomEvent(.notice, time: now, text: "\(me.nick) closed the room \(room.name)")
        console.show(me.receive(.event(closing), at: now))
        let members = room.members.compactMap { connections[$0.id] }
        await send(.event(closing), to: members)
        // chat.closed: members leave instead of looking for the room to rejoin.
        await send(.closed("the host closed the room \(room.name)"), to: members)
        await server.stop()
        await finish()
        _ = status
        status = ExitStatus.ok
        return ChatExit(status)
    }

    /// Sends to several connections at once, in order per connection. A connection that does not take
    /// the message within 5 s (a peer that stopped reading) is dropped rather than stalling the room.
    func send(_ message: HostMessage, to connections: [ServerConnection]) async {
        await withTaskGroup(of: Void.self) { outer in
            for connection in connections {
                outer.addTask {
                    await withTaskGroup(of: Void.self) { race in
                        race.addTask { try? await connection.send(message) }
                        race.addTask {
                            try? await Task.sleep(for: .seconds(5))
                            if !Task.isCancelled { connection.channel.abort() }
                        }
                        await race.next()
                        race.cancelAll()
                    }
                }
            }
        }
    }

    // MARK: join

    func join(_ target: JoinTarget, timeout: Double, rejoinTimeout: Double) async -> ChatExit {
        let serviceTarget: ServiceTarget
        let label: String
        switch target {
        case .direct(let host, let port):
            serviceTarget = .host(host, port: port)
            label = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .room(let name?):
            serviceTarget = .service(name: name, type: chatServiceType, discovery: discovery)
            label = name
        case .room(nil):
            let found: [DiscoveredService]
            do {
                found = try await RoomFinder(discovery: discovery).discover(timeout: seconds(timeout))
            } catch {
                await discovery.shutdown()
                return error
            }
            let names = found.map(\.name)
            let chosen: String
            switch names.count {
            case 0:
                await discovery.shutdown()
                return ChatExit(
                    ExitStatus.roomNotFound,
                    "no rooms found (looked for \(formatSeconds(timeout))); start one with: bonjour-chat host NAME")
            case 1:
                chosen = names[0]
            default:
                guard interactive, let picked = pick(from: names) else {
                    await discovery.shutdown()
                    let list = names.map { "  \($0)" }.joined(separator: "\n")
                    return ChatExit(
                        ExitStatus.roomNotFound,
                        "\(names.count) rooms found; name the one to join (bonjour-chat join NAME):\n\(list)")
                }
                chosen = picked
            }
            serviceTarget = .service(name: chosen, type: chatServiceType, discovery: discovery)
            label = chosen
        }

        var configuration = ClientConfiguration(
            peerName: nick,
            reconnect: rejoinTimeout > 0
                ? ReconnectPolicy(initialDelay: .milliseconds(250), maxDelay: .seconds(2)) : nil)
        configuration.browseTimeout = seconds(timeout)
        channelConfiguration(&configuration.channel)
        let client: MessageClient
        do {
            client = try await MessageClient.connect(to: serviceTarget, configuration: configuration, logger: logger)
        } catch {
            let state = discovery.daemonState
            await discovery.shutdown()
            if error.code == .serviceNotFound, case .service = serviceTarget, state != .running {
                return ChatExit(
                    ExitStatus.failure,
                    "cannot look for \(label): the avahi-daemon is not reachable (\(state)); "
                        + "start it, or join directly with --host H --port P"
                )
            }
            if error.code == .serviceNotFound || error.code == .ambiguousService {
                return ChatExit(ExitStatus.roomNotFound, "\(error.message); `bonjour-chat rooms` lists the rooms")
            }
            return ChatExit(ExitStatus.connectionLost, "cannot join \(label): \(error.message)")
        }
        let continuation = self.continuation
        Task {
            for await event in client.events { continuation.yield(.client(event)) }
        }
        var me = Participant(nick: nick, room: label, formatter: formatter)
        startInput(prompt: me.prompt)

        var everConnected = false
        var leaving = false
        var inputDone = false
        var pending: [ParticipantRequest] = []
        var generation = 0

        func leave(_ reason: String) async -> ChatExit? {
            guard me.joined else {
                await client.close()
                await finish()
                return ChatExit(ExitStatus.ok)
            }
            leaving = true
            do {
                try await client.send(.leave(reason))
            } catch {
                await client.close()
                await finish()
                return ChatExit(ExitStatus.ok)
            }
            Task {
                try? await Task.sleep(for: .seconds(3))
                continuation.yield(.byeTimeout)
            }
            return nil
        }

        func submit(_ request: ParticipantRequest) async {
            guard me.joined, pending.isEmpty else {
                guard pending.count < 500 else {
                    problem("not connected and too much waiting to be sent; dropped")
                    return
                }
                pending.append(request)
                return
            }
            do {
                try await client.send(request)
            } catch {
                pending.append(request)  // sent again after the rejoin
            }
        }

        /// Says which typed lines never reached the host (the room is gone, or the host restarted).
        func reportNotSent(_ requests: [ParticipantRequest]) {
            let lines = requests.compactMap { request -> String? in
                switch request {
                case .say(let text): text
                case .me(let text): "/me \(text)"
                case .nick(let nick): "/nick \(nick)"
                case .topic(let topic): "/topic \(topic)"
                default: nil
                }
            }
            guard !lines.isEmpty else { return }
            problem(
                "\(lines.count) line\(lines.count == 1 ? " was" : "s were") not delivered to \(me.room) "
                    + "(the host never confirmed them): " + lines.map { "\"\($0)\"" }.joined(separator: ", "))
        }

        func flushPending() async {
            while me.joined, let request = pending.first {
                do {
                    try await client.send(request)
                    pending.removeFirst()
                } catch {
                    return
                }
            }
        }

        for await input in stream {
            switch input {
            case .client(let event):
                switch event {
                case .connected(_, let via):
                    if everConnected && client.resumedSession {
                        // The message session continued: still a member, and whatever was sent or
                        // received meanwhile arrives once, in order.
                        me.sessionResumed()
                        notice("back in \(me.room)\(via.map { " via \($0)" } ?? ""); nothing was lost")
                        generation += 1
                        await flushPending()
                        continue
                    }
                    if everConnected { notice("found the room again\(via.map { " at \($0)" } ?? ""); rejoining") }
                    everConnected = true
                    if let identity = client.channel?.peerIdentity { notice(describe(identity, as: "host")) }
                    try? await client.send(ParticipantRequest.join(nick: me.nick))
                case .received(let message):
                    let decoded: HostMessage
                    do {
                        guard let known = try HostMessage.decode(message) else {
                            logger.debug("unknown message from the host", metadata: ["type": "\(message.typeID)"])
                            continue
                        }
                        decoded = known
                    } catch {
                        problem("the host sent a \(message.typeID) this chat cannot read (\(error)); it was skipped")
                        continue
                    }
                    console.show(me.receive(decoded, at: now))
                    console.setPrompt(me.prompt)
                    switch decoded {
                    case .closed:
                        // The room is gone for good: nothing to rejoin.
                        reportNotSent(pending)
                        await client.close()
                        await finish()
                        return ChatExit(ExitStatus.ok)
                    case .welcome:
                        generation += 1
                        await flushPending()
                        if inputDone && pending.isEmpty && !leaving, let exit = await leave("") { return exit }
                    case .bye:
                        await client.close()
                        await finish()
                        return ChatExit(ExitStatus.ok)
                    default:
                        break
                    }
                case .disconnected(let reason):
                    me.connectionLost()
                    if leaving {
                        await client.close()
                        await finish()
                        return ChatExit(ExitStatus.ok)
                    }
                    guard rejoinTimeout > 0 else {
                        problem("lost the connection to the host of \(me.room) (\(reason))")
                        await client.close()
                        await finish()
                        return ChatExit(ExitStatus.connectionLost)
                    }
                    problem(
                        "lost the connection to the host of \(me.room) (\(reason)); "
                            + "looking for the room to rejoin for \(formatSeconds(rejoinTimeout))"
                    )
                    generation += 1
                    let current = generation
                    let delay = seconds(rejoinTimeout)
                    Task {
                        try? await Task.sleep(for: delay)
                        continuation.yield(.rejoinDeadline(current))
                    }
                case .reconnecting, .waiting, .resumed:
                    break
                case .undelivered(let lost):
                    reportNotSent(lost.compactMap { try? ParticipantRequest.decode($0) })
                case .gaveUp(let error):
                    problem("gave up rejoining: \(error.message)")
                    reportNotSent(pending)
                    await finish()
                    return ChatExit(ExitStatus.connectionLost)
                case .transfer(let transfer):
                    transfer.discard()
                }
            case .rejoinDeadline(let which):
                guard which == generation, !me.joined else { continue }
                problem("could not rejoin \(me.room) within \(formatSeconds(rejoinTimeout)); giving up")
                reportNotSent(
                    client.unacknowledgedMessages.compactMap {
                        try? ParticipantRequest.decode($0)
                    } + pending)
                await client.close()
                await finish()
                return ChatExit(ExitStatus.connectionLost)
            case .line(let typed):
                guard !leaving else { continue }
                // A pasted block is several lines (CR, LF, CRLF): each is its own message or command.
                for line in Room.lines(of: typed) {
                let command = ChatCommand.parse(line)
                switch command {
                case .say(let text): await submit(.say(text))
                case .me(let text): await submit(.me(text))
                case .nick(let new): await submit(.nick(new))
                case .topic(nil): notice(me.topic.isEmpty ? "no topic; set one with /topic TEXT" : "topic: \(me.topic)")
                case .topic(let text?): await submit(.topic(text))
                case .who:
                    guard me.joined else {
                        notice("not in the room right now (\(me.room)); /who works once rejoined")
                        continue
                    }
                    // chat.members is a request: the host answers with who is here.
                    do {
                        let info = try await client.request(
                            TextPayload(), type: ChatType.members, expecting: MembersInfo.self, timeout: .seconds(5))
                        console.show(me.receive(.members(info), at: now))
                    } catch {
                        problem("the host did not say who is here: \(error)")
                    }
                    if let health = await client.health { notice("link to the host: \(health)") }
                case .rooms: listRoomsInBackground()
                case .help: showHelp()
                case .fingerprint: showFingerprints(of: client.channel?.peerIdentity.map { [$0] } ?? [], as: "host")
                case .trust(let room): showTrust(forget: room)
                case .quit(let reason):
                    if let exit = await leave(reason) { return exit }
                case .empty, .usage, .unknown: _ = reportBadCommand(command)
                }
                }
            case .endOfInput:
                inputDone = true
                if !leaving && (interactive || (me.joined && pending.isEmpty)), let exit = await leave("") {
                    return exit
                }
            case .interrupt:
                if leaving {
                    await finish()
                    return ChatExit(ExitStatus.ok)
                }
                if let exit = await leave("") { return exit }
            case .byeTimeout:
                await client.close()
                await finish()
                return ChatExit(ExitStatus.ok)
            case .output(let lines):
                console.show(lines)
            case .server:
                break
            }
        }
        await finish()
        return ChatExit(ExitStatus.ok)
    }

    /// Asks on the terminal which room to join (before raw mode); nil when nothing usable was typed.
    func pick(from names: [String]) -> String? {
        writeAll(STDOUT_FILENO, "rooms on the network:\n")
        for (index, name) in names.enumerated() { writeAll(STDOUT_FILENO, "  \(index + 1)) \(Room.clean(name))\n") }
        for _ in 0..<3 {
            writeAll(STDOUT_FILENO, "join which room? [1-\(names.count)] ")
            guard let answer = readLine()?.trimmingCharacters(in: .whitespaces) else { return nil }
            if let number = Int(answer), (1...names.count).contains(number) { return names[number - 1] }
            if let match = names.first(where: { $0 == answer }) { return match }
        }
        return nil
    }
}

func seconds(_ value: Double) -> Duration { .milliseconds(Int((value * 1000).rounded())) }

func shellQuoted(_ text: String) -> String {
    text.allSatisfy { $0.isLetter || $0.isNumber || "-_.".contains($0) }
        ? text : "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
}
