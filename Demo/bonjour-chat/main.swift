import ArgumentParser
import ChatKit
import Foundation
import Logging
import Messaging

/// Exit codes (also in `--help`).
enum ExitStatus {
    static let ok: Int32 = 0
    static let failure: Int32 = 1
    static let usage: Int32 = 2
    static let roomNotFound: Int32 = 3
    static let connectionLost: Int32 = 4
    static let cannotHost: Int32 = 5
}

/// Ends the program with a status and a message for stderr (the terminal is restored first).
struct ChatExit: Error {
    let status: Int32
    let message: String
    init(_ status: Int32, _ message: String = "") {
        self.status = status
        self.message = message
    }
}

let exitCodesHelp = """
    Exit status:
      0  ok: left or closed the room, listed rooms (also when there are none)
      1  other failure (for example no avahi-daemon reachable)
      2  usage error (unknown option, missing argument)
      3  room not found, or several rooms and none chosen
      4  connection lost (the host went away and did not come back in time)
         or refused
      5  cannot host (port in use, publishing failed)
    """

struct BonjourChat: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bonjour-chat",
        abstract: "Chat rooms on the local network, found with DNS-SD (Bonjour / Avahi).",
        discussion: """
            Host a room on one machine and join it from another:
              machine 1:  bonjour-chat host Lobby --topic "Friday plans"
              machine 2:  bonjour-chat join            (joins the only room, or: join Lobby)

            On a terminal you get a prompt; /help lists the commands:
            /who /nick /me /topic /rooms /fingerprint /trust /help /quit
            (/fingerprint: your key, and the host's with the comparison code;
            /trust: the rooms you trust, /trust forget ROOM to forget one).
            With stdin not a terminal (scripted use) each input line is a message
            (lines starting with / are commands), output is one event per line,
            and end of input leaves after everything typed was delivered.
            Colour only on a terminal, never with NO_COLOR set.

            \(exitCodesHelp)
            """,
        subcommands: [Rooms.self, Host.self, Join.self])
}

/// Options every command has.
struct CommonOptions: ParsableArguments {
    @Option(help: "Log level of the library on stderr (trace, debug, info, notice, warning, error, critical).")
    var logLevel: Logger.Level = .error

    @Option(
        help: ArgumentHelp(
            "A pre-shared key file (at least 16 bytes, e.g. `head -c 32 /dev/urandom | base64 > chat.key`).",
            discussion: "host: only people with the same key can join. join: the host must prove the same key."))
    var keyFile: String?

    @Option(
        help: ArgumentHelp(
            "Also look for rooms in this unicast DNS domain (wide-area DNS-SD, e.g. across routed subnets).",
            discussion: """
                Domains the network announces (DNS-SD domain enumeration under the resolver's search \
                domains) are used without this option. host: with --wide-area-key, the room is also \
                registered in this domain. Environment: LANMSG_WIDE_AREA_DOMAIN.
                """))
    var wideAreaDomain: String?

    /// The discovery settings: the environment's, with --wide-area-domain (and a key file) on top.
    func discoveryConfiguration(wideAreaKey: String? = nil) throws(DiscoveryError) -> DiscoveryConfiguration {
        let (configuration, problems) = try DiscoveryConfiguration.forProgram(
            wideAreaDomain: wideAreaDomain, wideAreaKeyFile: wideAreaKey)
        // Said at the default level (issue 45, 5: bonjour-chat logs errors only by default, and an
        // ignored LANMSG_WIDE_AREA_DOMAIN went unsaid).
        for problem in problems { FileHandle.standardError.write(Data("bonjour-chat: ignored discovery setting: \(problem)\n".utf8)) }
        return configuration
    }

    /// The pre-shared key, when --key-file was given (validated before the command runs).
    func preSharedKey() throws(FileError) -> PreSharedKey? {
        guard let keyFile else { return nil }
        return try PreSharedKey(contentsOfFile: keyFile)
    }

    func validate() throws {
        do {
            _ = try preSharedKey()
        } catch {
            throw ValidationError(error.message)
        }
        do {
            // The flag only (a usage error): the environment's settings are the run's to say.
            _ = try DiscoveryConfiguration.forProgram(wideAreaDomain: wideAreaDomain, environment: [:])
        } catch {
            throw ValidationError(error.message)
        }
    }

    func logger() -> Logger {
        var logger = Logger(label: "bonjour-chat") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = logLevel
        return logger
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// The subcommands' work, run by the entry point below (which maps errors to exit statuses).
protocol ChatCommandRunner: AsyncParsableCommand {
    func execute() async throws
}

extension ChatCommandRunner {
    func run() async throws { try await execute() }
}

struct Rooms: ChatCommandRunner {
    static let configuration = CommandConfiguration(
        abstract: "List the rooms on the network: name, host, addresses, topic, member count.",
        discussion: "Prints \"no rooms found\" (status 0) when there are none.\n\n\(exitCodesHelp)")

    @Option(help: "How long to look for rooms, in seconds.") var timeout: Double = 3
    @OptionGroup var common: CommonOptions

    func validate() throws {
        guard timeout > 0, timeout <= 600 else { throw ValidationError("--timeout must be between 0 and 600 seconds") }
    }

    func execute() async throws {
        let logger = common.logger()
        let discovery = ServiceDiscovery(
            logger: logger, programName: "bonjour-chat", configuration: try common.discoveryConfiguration())
        let rooms = try await RoomFinder(discovery: discovery).list(timeout: .milliseconds(Int(timeout * 1000)))
        await discovery.shutdown()
        if rooms.isEmpty {
            print("no rooms found (looked for \(formatSeconds(timeout))); start one with: bonjour-chat host NAME")
            return
        }
        for room in rooms { print(room.summary) }
    }
}

struct Host: ChatCommandRunner {
    static let configuration = CommandConfiguration(
        abstract: "Host a room: run it, publish it on the network, and take part from this terminal.",
        discussion: """
            The room closes on /quit, Ctrl-C or SIGTERM (everyone is told).
            In scripted mode (stdin not a terminal) the end of input stops
            reading input but keeps the room open.

            \(exitCodesHelp)
            """)

    @Argument(help: "The room's name (as published; a name already taken becomes \"NAME #2\").") var room: String
    @Option(help: "The room's topic.") var topic = ""
    @Option(help: "Your nick (default: your user name).") var nick: String?
    @Option(help: "TCP port to listen on (default: any free port).") var port: UInt16 = 0
    @Option(
        help: ArgumentHelp(
            "Also register the room in a unicast DNS domain, signing the updates with this TSIG key file.",
            discussion: """
                The file is what `tsig-keygen -a hmac-sha256 HOST.DOMAIN` writes; the DNS server must \
                allow the key to add the room (docs/DISCOVERY.md). The domain: --wide-area-domain, else \
                the one the network announces (dr._dns-sd._udp). Environment: LANMSG_WIDE_AREA_KEY.
                """))
    var wideAreaKey: String?
    @OptionGroup var common: CommonOptions

    func validate() throws {
        guard !room.isEmpty, room.utf8.count <= 63 else { throw ValidationError("ROOM must be 1 to 63 bytes") }
        if let nick, Room.sanitizeNick(nick) == nil { throw ValidationError("--nick must not be empty") }
        do {
            // The flags only (usage errors); the environment's settings are the run's to say, once.
            _ = try DiscoveryConfiguration.forProgram(
                wideAreaDomain: common.wideAreaDomain, wideAreaKeyFile: wideAreaKey, environment: [:])
        } catch {
            throw ValidationError(error.message)
        }
    }

    func execute() async throws {
        let session = ChatSession(
            options: common, nick: nick ?? defaultNick(),
            discovery: try common.discoveryConfiguration(wideAreaKey: wideAreaKey))
        throw await session.host(room: room, topic: topic, port: port)
    }
}

struct Join: ChatCommandRunner {
    static let configuration = CommandConfiguration(
        abstract: "Join a room by name (or the only one there is), or directly with --host and --port.",
        discussion: """
            Without ROOM: joins the only room on the network; with several, asks
            on a terminal and fails listing them otherwise. When the host goes
            away the room is looked for again and rejoined for --rejoin-timeout
            seconds.

            \(exitCodesHelp)
            """)

    @Argument(help: "The room's name (see: bonjour-chat rooms).") var room: String?
    @Option(help: "Your nick (default: your user name).") var nick: String?
    @Option(help: "Connect to this host directly, without discovery (needs --port).") var host: String?
    @Option(help: "The port for --host.") var port: UInt16?
    @Option(help: "How long to look for rooms, in seconds.") var timeout: Double = 3
    @Option(help: "After losing the host, how long to try to rejoin, in seconds.") var rejoinTimeout: Double = 60
    @OptionGroup var common: CommonOptions

    func validate() throws {
        if (host == nil) != (port == nil) {
            throw ValidationError("--host and --port go together: give both, or neither")
        }
        if host != nil, room != nil { throw ValidationError("give either ROOM or --host/--port, not both") }
        if let nick, Room.sanitizeNick(nick) == nil { throw ValidationError("--nick must not be empty") }
        guard timeout > 0, timeout <= 600 else { throw ValidationError("--timeout must be between 0 and 600 seconds") }
        guard rejoinTimeout >= 0, rejoinTimeout <= 86_400 else {
            throw ValidationError("--rejoin-timeout must be between 0 and 86400 seconds")
        }
    }

    func execute() async throws {
        let session = ChatSession(
            options: common, nick: nick ?? defaultNick(), discovery: try common.discoveryConfiguration())
        let target: JoinTarget = if let host, let port { .direct(host: host, port: port) } else { .room(room) }
        throw await session.join(target, timeout: timeout, rejoinTimeout: rejoinTimeout)
    }
}

/// The user name: $USER, else the password database, else "guest".
func defaultNick() -> String {
    if let user = ProcessInfo.processInfo.environment["USER"], let nick = Room.sanitizeNick(user) { return nick }
    if let entry = getpwuid(getuid()), let name = entry.pointee.pw_name,
        let nick = Room.sanitizeNick(String(cString: name))
    {
        return nick
    }
    return "guest"
}

// Entry point: ArgumentParser's usage errors exit with 2 (not 64), our own errors with their status.
ServiceDiscovery.onBackendChosen { kind, reason in FileHandle.standardError.write(Data("bonjour-chat: discovery backend: \(kind) (\(reason))\n".utf8)) }
do {
    var command = try BonjourChat.parseAsRoot()
    if let chatCommand = command as? any ChatCommandRunner {
        try await chatCommand.execute()
    } else {
        try command.run()
    }
    RawTerminal.restore()
    exit(ExitStatus.ok)
} catch let error as ChatExit {
    RawTerminal.restore()
    if !error.message.isEmpty { FileHandle.standardError.write(Data(("bonjour-chat: " + error.message + "\n").utf8)) }
    exit(error.status)
} catch {
    RawTerminal.restore()
    if BonjourChat.exitCode(for: error) == .validationFailure {
        FileHandle.standardError.write(Data((BonjourChat.fullMessage(for: error) + "\n").utf8))
        exit(ExitStatus.usage)
    }
    BonjourChat.exit(withError: error)
}
