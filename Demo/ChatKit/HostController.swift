/// The host's side of a chat, without I/O: what `bonjour-chat host` does with each thing that
/// happens — members' requests and connections, the publication's news, the host's own typed
/// lines — as a list of ``Effect``s for the program to carry out in order. The ``Room`` decides
/// who gets which message; this adds the host's own view (a ``Participant``), the replies to
/// requests, the TXT record to republish and the closing of the room.
public struct HostController: Sendable {
    /// What happened. Members are the server's connection ids.
    public enum Input: Sendable, Equatable {
        /// A request of a member; `expectsReply`: it was sent as a request (only `chat.members` is).
        case request(ParticipantRequest, from: MemberID, expectsReply: Bool)
        /// A message whose type this version does not know.
        case unknownMessage(type: String, expectsReply: Bool)
        /// A message of a known type that could not be decoded.
        case malformed(type: String, error: String, from: MemberID, expectsReply: Bool)
        /// A member's connection ended for good.
        case closed(MemberID)
        /// A member's connection dropped; its session waits for it.
        case interrupted(MemberID, reason: String)
        /// A member's session resumed on a new connection.
        case resumed(MemberID)
        /// The room is published under this name.
        case published(String)
        /// Another room had the name: published under another.
        case renamed(from: String, to: String)
        /// Registered in a wide-area domain as well.
        case registered(name: String, domain: String)
        case registrationFailed(domain: String, error: String)
        /// A line typed (or pasted) at the host's terminal, or piped in.
        case line(String)
        /// Standard input ended.
        case endOfInput
        /// SIGINT or SIGTERM.
        case interrupt
    }

    /// What the program does, in order.
    public enum Effect: Sendable, Equatable {
        /// Lines for the host's terminal.
        case show([String])
        case prompt(String)
        /// Sends `message` to these members (the host's own user is never among them).
        case send(HostMessage, to: [MemberID])
        /// Answers the request being handled with the room's members.
        case replyMembers(MembersInfo)
        /// Answers the request being handled with an error.
        case replyError(code: String, message: String)
        /// Closes a member's connection.
        case disconnect(MemberID, reason: String)
        /// Republishes the room's TXT record (topic, member count).
        case updateTXT([String: String])
        /// Shows each member's link health (`/who`).
        case showHealth
        case listRooms
        case showHelp
        case showFingerprints
        case showTrust(forget: String?)
        /// The room is closed (members were told): stop the server and end.
        case exit
    }

    public private(set) var room: Room
    /// The host's own view of the room.
    public private(set) var me: Participant
    /// Ctrl-D closes the room on a terminal; a script's end leaves it open.
    public let interactive: Bool
    private var publishedTXT: [String: String]

    /// What the host's own joining shows (the program carries it out once its terminal is ready).
    public private(set) var opening: [Effect] = []

    /// The room, with the host's own user in it.
    public init(room name: String, topic: String, nick: String, formatter: ChatFormatter, interactive: Bool, at now: Double) {
        room = Room(name: name, topic: topic)
        me = Participant(nick: nick, room: name, formatter: formatter)
        publishedTXT = [:]
        self.interactive = interactive
        opening = deliver(room.handle(.join(nick: nick), from: Room.localID, at: now), now)
        publishedTXT = room.txt
    }

    /// The TXT record to publish at the start (the host counts as a member).
    public var txt: [String: String] { publishedTXT }

    public mutating func handle(_ input: Input, at now: Double) -> [Effect] {
        var effects: [Effect]
        switch input {
        case .request(let request, let id, let expectsReply):
            if case .members = request, expectsReply {
                // `chat.members` is a request: the reply carries who is here.
                guard room.nick(of: id) != nil else {
                    return [.replyError(code: ChatErrorCode.notJoined, message: "join the room first (chat.join)")]
                }
                return [.replyMembers(room.membersInfo)]
            }
            effects = deliver(room.handle(request, from: id, at: now), now)
            if case .leave = request {
                // chat.bye is sent: the member is gone, and so is its connection.
                effects.append(.disconnect(id, reason: "left the room"))
            }
        case .unknownMessage(let type, let expectsReply):
            // A newer member may send things this host ignores: a request is answered, a one-way
            // message only logged (by the program).
            return expectsReply
                ? [.replyError(code: ChatErrorCode.unknownType, message: "this host does not know '\(type)'")] : []
        case .malformed(let type, let error, let id, let expectsReply):
            // Said to the sender: an error reply to a request, a notice otherwise.
            let text = "your \(type) could not be read by the host: \(error)"
            return expectsReply
                ? [.replyError(code: ChatErrorCode.badRequest, message: text)]
                : [.send(.event(RoomEvent(.notice, time: now, text: text)), to: [id])]
        case .closed(let id):
            effects = deliver(room.disconnected(id, at: now), now)
        case .interrupted(let id, let reason):
            guard let nick = room.nick(of: id) else { return [] }
            return [notice("\(nick)'s connection dropped (\(reason)); keeping their place while they come back", now)]
        case .resumed(let id):
            guard let nick = room.nick(of: id) else { return [] }
            return [notice("\(nick) is back", now)]
        case .published(let name):
            return [notice("the room is published on the network as \(name)", now)]
        case .renamed(let from, let to):
            room.name = to
            return [notice("a room named \(from) exists already; this one is published as \(to)", now)]
        case .registered(let name, let domain):
            return [notice("the room is also registered in \(domain) as \(name) (found from other subnets)", now)]
        case .registrationFailed(let domain, let error):
            return [problem("registering the room in \(domain) failed: \(error)", now)]
        case .line(let line):
            effects = command(ChatCommand.parse(line), now)
        case .endOfInput:
            // In a script the room stays open after its last line.
            return interactive ? close(now) : []
        case .interrupt:
            return close(now)
        }
        if room.txt != publishedTXT {
            publishedTXT = room.txt
            effects.append(.updateTXT(publishedTXT))
        }
        return effects
    }

    private mutating func command(_ command: ChatCommand, _ now: Double) -> [Effect] {
        switch command {
        case .say(let text): return deliver(room.handle(.say(text), from: Room.localID, at: now), now)
        case .me(let text): return deliver(room.handle(.me(text), from: Room.localID, at: now), now)
        case .nick(let new): return deliver(room.handle(.nick(new), from: Room.localID, at: now), now)
        case .topic(let text?): return deliver(room.handle(.topic(text), from: Room.localID, at: now), now)
        case .topic(nil):
            return [notice(room.topic.isEmpty ? "no topic; set one with /topic TEXT" : "topic: \(room.topic)", now)]
        case .who: return deliver(room.handle(.members, from: Room.localID, at: now), now) + [.showHealth]
        case .rooms: return [.listRooms]
        case .help: return [.showHelp]
        case .fingerprint: return [.showFingerprints]
        case .trust(let room): return [.showTrust(forget: room)]
        case .quit: return close(now)
        case .usage, .unknown: return command.complaint.map { [problem($0, now)] } ?? []
        case .empty: return []
        }
    }

    /// The room's deliveries: the host's own share shown, the members' sent.
    private mutating func deliver(_ deliveries: [Room.Delivery], _ now: Double) -> [Effect] {
        var effects: [Effect] = []
        for delivery in deliveries {
            let targets: [MemberID]
            let message: HostMessage
            switch delivery {
            case .to(let id, let value): (targets, message) = ([id], value)
            case .everyone(let value): (targets, message) = (room.members.map(\.id), value)
            case .everyoneBut(let id, let value): (targets, message) = (room.members.map(\.id).filter { $0 != id }, value)
            }
            if targets.contains(Room.localID) { effects.append(.show(me.receive(message, at: now))) }
            let others = targets.filter { $0 != Room.localID }
            if !others.isEmpty { effects.append(.send(message, to: others)) }
        }
        return effects + [.prompt(me.prompt)]
    }

    /// Closes the room: the members are told (`chat.closed`: they leave instead of looking for it).
    private mutating func close(_ now: Double) -> [Effect] {
        let closing = RoomEvent(.notice, time: now, text: "\(me.nick) closed the room \(room.name)")
        let members = room.members.map(\.id).filter { $0 != Room.localID }
        return [
            .show(me.receive(.event(closing), at: now)),
            .send(.event(closing), to: members),
            .send(.closed("the host closed the room \(room.name)"), to: members),
            .exit,
        ]
    }

    private func notice(_ text: String, _ now: Double) -> Effect { .show([me.formatter.notice(text, at: now)]) }
    private func problem(_ text: String, _ now: Double) -> Effect { .show([me.formatter.error(text, at: now)]) }
}
