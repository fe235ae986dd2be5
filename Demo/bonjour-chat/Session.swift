import Discovery
import ChatKit
import Foundation
import Locks
import Logging
import Messaging
import Scheduling

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
    /// The clock of the session's timers (the publication check, the rejoin and bye deadlines).
    let scheduler: any Scheduler = DispatchScheduler()
    /// What the session started and owns: the event pumps, a room listing, and its timers —
    /// cancelled at ``finish()``, the tasks awaited, so that nothing of the session outlives it.
    private let owned = Locked<(tasks: [Task<Void, Never>], timers: [ScheduledWork])>(([], []))

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

    /// Clears the prompt, restores the terminal, ends what the session started (timers cancelled,
    /// tasks cancelled and awaited), stops discovery.
    func finish() async {
        console.deactivate()
        RawTerminal.restore()
        let (tasks, timers) = owned.withLock { owned in
            defer { owned = ([], []) }
            return owned
        }
        for timer in timers { timer.cancel() }
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
        await discovery.shutdown()
    }

    /// Starts `body` as a task the session owns (cancelled and awaited at ``finish()``).
    func spawn(_ body: @escaping @Sendable () async -> Void) {
        let task = Task { await body() }
        owned.withLock { $0.tasks.append(task) }
    }

    /// Feeds `input` into the session's loop after `delay`, unless the session finished first.
    func after(_ delay: Duration, feed input: LoopInput) {
        let continuation = self.continuation
        let timer = scheduler.schedule(after: delay) { continuation.yield(input) }
        owned.withLock { owned in
            owned.timers.removeAll { !$0.isPending }
            owned.timers.append(timer)
        }
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
        spawn {
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

    func channelConfiguration(_ channel: inout ChannelConfiguration) {
        channel.preSharedKey = key
        channel.pingInterval = .seconds(2)
        channel.heartbeatTimeout = .seconds(6)
    }

    // MARK: host

    func host(room name: String, topic: String, port: UInt16) async -> ChatExit {
        var controller = HostController(room: name, topic: topic, nick: nick, formatter: formatter, interactive: interactive, at: now)
        var configuration = ServerConfiguration(serviceType: chatServiceType, serviceName: name, peerName: name)
        configuration.txt = TXTRecord(controller.txt)
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
        spawn {
            for await event in server.events { continuation.yield(.server(event)) }
        }
        startInput(prompt: controller.me.prompt)
        notice(
            "hosting \(name) on port \(server.port ?? port); others join with: bonjour-chat join \(shellQuoted(name))")
        if let identity = configuration.channel.security.identity {
            notice("encrypted; this room's key is \(identity.fingerprint.short) (members see it when they join)")
        }
        let discovery = self.discovery
        let formatter = self.formatter
        let listening = server.port ?? port
        let check = scheduler.schedule(after: .seconds(5)) {
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
        owned.withLock { $0.timers.append(check) }
        var connections: [MemberID: ServerConnection] = [:]

        /// Carries out the controller's effects in order; false once the room is closed.
        /// `message`: the request being handled (replies go to it).
        func perform(_ effects: [HostController.Effect], replyingTo message: IncomingMessage? = nil, of connection: ServerConnection? = nil) async -> Bool {
            for effect in effects {
                switch effect {
                case .show(let lines): console.show(lines)
                case .prompt(let prompt): console.setPrompt(prompt)
                case .send(let message, let targets):
                    // One encoding for the room (MessageServer.broadcast); a member that does not take
                    // it within 5 s (it stopped reading) is dropped rather than stalling the room.
                    await server.broadcast(message, to: targets.compactMap { connections[$0] }, timeout: .seconds(5))
                case .replyMembers(let info):
                    if let message, let connection { try? await connection.reply(to: message, with: info, type: ChatType.members) }
                case .replyError(let code, let text):
                    if let message, let connection { try? await connection.reply(to: message, error: RemoteError(code: code, message: text)) }
                case .disconnect(let id, let reason):
                    // The request that ends it (chat.bye) is handled: acknowledged before the close,
                    // so the member does not report it as never acknowledged (issue 45, 7).
                    message?.acknowledge()
                    connections.removeValue(forKey: id)?.close(reason: reason)
                case .updateTXT(let txt):
                    do {
                        try await server.updateTXT(TXTRecord(txt))
                    } catch {
                        logger.warning("TXT update failed", metadata: ["error": "\(error.message)"])
                    }
                case .showHealth:
                    for connection in connections.values.sorted(by: { $0.id < $1.id }) {
                        let nick = controller.room.nick(of: connection.id) ?? connection.peer.name
                        notice("  \(nick): \(await connection.health)")
                    }
                case .listRooms: listRoomsInBackground()
                case .showHelp: showHelp()
                case .showFingerprints:
                    showFingerprints(of: connections.values.sorted { $0.id < $1.id }.compactMap(\.channel.peerIdentity), as: "member")
                case .showTrust(let room): showTrust(forget: room)
                case .exit: return false
                }
            }
            return true
        }

        _ = await perform(controller.opening)
        // The loop takes what happens, lets the controller decide, and carries out its effects.
        loop: for await input in stream {
            switch input {
            case .server(let event):
                let happened: HostController.Input
                switch event {
                case .published(let published): happened = .published("\(published)")
                case .renamed(let from, let to): happened = .renamed(from: from, to: to)
                case .accepted(let connection):
                    connections[connection.id] = connection
                    if let identity = connection.channel.peerIdentity { notice(describe(identity, as: "member")) }
                    continue loop
                case .received(let connection, let message):
                    do {
                        if let request = try ParticipantRequest.decode(message) {
                            happened = .request(request, from: connection.id, expectsReply: message.expectsReply)
                        } else {
                            logger.notice("unknown message", metadata: ["type": "\(message.typeID)", "from": "\(connection)"])
                            happened = .unknownMessage(type: message.typeID, expectsReply: message.expectsReply)
                        }
                    } catch {
                        logger.notice("malformed message", metadata: ["type": "\(message.typeID)", "from": "\(connection)", "error": "\(error)"])
                        happened = .malformed(type: message.typeID, error: "\(error)", from: connection.id, expectsReply: message.expectsReply)
                    }
                    guard await perform(controller.handle(happened, at: now), replyingTo: message, of: connection) else { break loop }
                    continue loop
                case .closed(let connection, _):
                    connections[connection.id] = nil
                    happened = .closed(connection.id)
                case .interrupted(let connection, let reason): happened = .interrupted(connection.id, reason: "\(reason)")
                case .resumed(let connection, _): happened = .resumed(connection.id)
                case .undelivered(let connection, let lost):
                    logger.notice("\(lost.count) messages to \(connection) were never acknowledged")
                    continue loop
                case .transfer(_, let transfer):
                    transfer.discard()
                    continue loop
                case .refused(let remote, let reason):
                    // The server's log already has these, as a summary per interval.
                    logger.debug(
                        "refused", metadata: ["remote": "\(remote.map { "\($0)" } ?? "?")", "reason": "\(reason)"])
                    continue loop
                case .registered(let name, let domain): happened = .registered(name: name, domain: domain)
                case .registrationFailed(let domain, let error): happened = .registrationFailed(domain: domain, error: error.message)
                }
                guard await perform(controller.handle(happened, at: now)) else { break loop }
            case .line(let line):
                guard await perform(controller.handle(.line(line), at: now)) else { break loop }
            case .endOfInput:
                guard await perform(controller.handle(.endOfInput, at: now)) else { break loop }
            case .interrupt:
                guard await perform(controller.handle(.interrupt, at: now)) else { break loop }
            case .output(let lines):
                console.show(lines)
            case .client, .rejoinDeadline, .byeTimeout:
                break
            }
        }
        await server.stop()
        await finish()
        return ChatExit(ExitStatus.ok)
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
        spawn {
            for await event in client.events { continuation.yield(.client(event)) }
        }
        var controller = JoinController(
            nick: nick, room: label, formatter: formatter, rejoinTimeout: rejoinTimeout, interactive: interactive)
        startInput(prompt: controller.me.prompt)

        // The loop takes what happens, lets the controller decide, and carries out its effects.
        for await input in stream {
            let happened: JoinController.Input
            switch input {
            case .client(let event):
                switch event {
                case .connected(_, let via): happened = .connected(resumed: client.resumedSession, via: via.map { "\($0)" })
                case .received(let message):
                    do {
                        guard let known = try HostMessage.decode(message) else {
                            logger.debug("unknown message from the host", metadata: ["type": "\(message.typeID)"])
                            continue
                        }
                        happened = .received(known)
                    } catch {
                        problem("the host sent a \(message.typeID) this chat cannot read (\(error)); it was skipped")
                        continue
                    }
                case .disconnected(let reason): happened = .disconnected(reason: "\(reason)")
                case .waiting(let error) where error.code == .untrustedServer:
                    // An impostor under the room's name (or a changed key): refused, and the room
                    // is looked for by its key (issue 43, 22). Said, not only logged.
                    problem(error.message)
                    continue
                case .reconnecting, .waiting, .resumed: continue
                case .undelivered(let lost): happened = .undelivered(lost.compactMap { try? ParticipantRequest.decode($0) })
                case .gaveUp(let error): happened = .gaveUp(error.message)
                case .transfer(let transfer):
                    transfer.discard()
                    continue
                }
            case .rejoinDeadline(let which):
                happened = .rejoinDeadline(
                    which, unacknowledged: client.unacknowledgedMessages.compactMap { try? ParticipantRequest.decode($0) })
            case .line(let typed): happened = .line(typed)
            case .endOfInput: happened = .endOfInput
            case .interrupt: happened = .interrupt
            case .byeTimeout: happened = .byeTimeout
            case .output(let lines):
                console.show(lines)
                continue
            case .server:
                continue
            }
            var effects = controller.handle(happened, at: now)
            while !effects.isEmpty {
                switch effects.removeFirst() {
                case .show(let lines): console.show(lines)
                case .prompt(let prompt): console.setPrompt(prompt)
                case .send(let requests):
                    var sent = 0
                    for request in requests {
                        do { try await client.send(request) } catch { break }
                        sent += 1
                    }
                    effects.insert(contentsOf: controller.sent(sent), at: 0)
                case .join(let nick): try? await client.send(ParticipantRequest.join(nick: nick))
                case .leave(let reason):
                    let ok = (try? await client.send(ParticipantRequest.leave(reason))) != nil
                    effects.insert(contentsOf: controller.leaveSent(ok), at: 0)
                case .describeHost:
                    if let identity = client.channel?.peerIdentity { notice(describe(identity, as: "host")) }
                case .askWho:
                    // chat.members is a request: the host answers with who is here.
                    do {
                        let info = try await client.request(
                            TextPayload(), type: ChatType.members, expecting: MembersInfo.self, timeout: .seconds(5))
                        effects.insert(contentsOf: controller.handle(.received(.members(info)), at: now), at: 0)
                    } catch {
                        problem("the host did not say who is here: \(error)")
                    }
                    if let health = await client.health { notice("link to the host: \(health)") }
                case .listRooms: listRoomsInBackground()
                case .showHelp: showHelp()
                case .showFingerprints: showFingerprints(of: client.channel?.peerIdentity.map { [$0] } ?? [], as: "host")
                case .showTrust(let room): showTrust(forget: room)
                case .startRejoinTimer(let which, let delay):
                    after(seconds(delay), feed: .rejoinDeadline(which))
                case .startByeTimer:
                    after(seconds(JoinController.byeTimeout), feed: .byeTimeout)
                case .close: await client.close()
                case .exit(let outcome):
                    await finish()
                    return ChatExit(outcome == .left ? ExitStatus.ok : ExitStatus.connectionLost)
                }
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
