import ArgumentParser
import Foundation
import Logging
import Messaging
import Locks

/// A tiny published echo server: replies to every request with the same type id and payload bytes,
/// as codec 0 whatever the request's (or, when that would exceed the client's frame limit, once,
/// with the library's error `too_large`), and to "echo.stats" with how many messages it saw
/// (docs/PROTOCOL.md, "lanmsg-echo"). Used by the integration tests, the interop clients and the demo.
@main
struct EchoServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lanmsg-echo",
        abstract: "A published echo server (replies to every request with its payload).")

    @Option(help: "Service name to publish.") var name = "Echo"
    @Option(help: "Service type.") var type = "_lanmsg-echo._tcp"
    @Option(help: "Port (0: kernel-assigned).") var port: UInt16 = 0
    @Option(help: "Log level.") var logLevel = "warning"
    @Option(help: "encrypted (protocol version 2, default) or plaintext (version 1).") var security = "encrypted"
    @Option(help: "Identity file (created mode 0600 if missing; default: the program's identity under $XDG_DATA_HOME/lanmsg).")
    var identity: String?
    @Option(help: "Which client keys to accept: any, or pinned:<fingerprint>[,<fingerprint>…].") var trust = "any"
    @Option(help: "Pre-shared key file (its trimmed bytes are the key).") var keyFile: String?
    @Option(help: "Keep the message sessions in this directory (a session store), so that a restarted echo continues them.")
    var sessionStore: String?

    func run() async throws {
        var logger = Logger(label: "lanmsg-echo") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .warning
        let discovery = ServiceDiscovery(logger: logger, programName: "lanmsg-echo")
        var configuration = ServerConfiguration(serviceType: type, serviceName: name)
        configuration.listener.port = port
        if let sessionStore { configuration.session?.store = SessionStore(directory: sessionStore) }
        if let keyFile { configuration.channel.preSharedKey = try PreSharedKey(contentsOfFile: keyFile) }
        switch security {
        case "plaintext":
            configuration.channel.security = .plaintext
        case "encrypted":
            let identity = try Identity.loadOrCreate(at: identity ?? Identity.defaultPath(app: "lanmsg-echo"))
            let policy: TrustPolicy
            if trust == "any" {
                policy = .anyKey
            } else if trust.hasPrefix("pinned:") {
                let list = trust.dropFirst("pinned:".count).split(separator: ",").map(String.init)
                let fingerprints = list.compactMap(Fingerprint.init)
                guard fingerprints.count == list.count else {
                    // The short form (16 hex digits) is for people to compare by eye; a pin is the
                    // whole key's hash (docs/SECURITY.md, "Identities and trust").
                    let short = list.first { $0.filter(\.isHexDigit).count == 16 }
                    throw ValidationError(
                        "--trust pinned: needs full fingerprints (64 hex digits), comma-separated"
                            + (short.map {
                                "; '\($0)' is a short fingerprint, which people compare by eye but which is too short to pin "
                                    + "a key: use the full one (the peer prints it at start as `fingerprint <64 hex digits>`)"
                            } ?? ""))
                }
                policy = .pinned(fingerprints)
            } else {
                throw ValidationError("--trust must be 'any' or 'pinned:<fingerprint>,…'")
            }
            configuration.channel.security = .encrypted(identity: identity, trust: policy)
            say("fingerprint \(identity.fingerprint.full)")
        default:
            throw ValidationError("--security must be 'encrypted' or 'plaintext'")
        }
        let server = MessageServer(configuration: configuration, discovery: discovery, logger: logger)
        try await server.start()
        say("listening on port \(server.port ?? 0)")
        // SIGTERM / SIGINT: every client is told (GOODBYE "server stopping"), the service is
        // unpublished, then the program exits 0 — never a silent drop.
        let stopping = Task.detached { () async -> Void in
            for await number in Self.terminationSignals() {
                FileHandle.standardOutput.write(Data("stopping on signal \(number)\n".utf8))
                await server.stop()
                return
            }
        }
        defer { stopping.cancel() }
        let refusals = RefusalSummary(interval: .seconds(1)) { say($0) }
        defer { refusals.cancel() }
        var count = 0
        // Numbered one-way messages ("seq", {"n":…}) per connection: how many, how many twice, out of order.
        var sequences: [UInt64: SequenceStats] = [:]
        for await event in server.events {
            switch event {
            case .published(let name):
                say("published as \(name)")
            case .received(let connection, let message):
                count += 1
                switch message.typeID {
                case "seq":
                    if let number = try? message.decode(Numbered.self) { sequences[connection.id, default: .init()].add(number.n) }
                    continue
                case "seq.down":
                    // Sends the asked number of numbered messages back, through the connection's session.
                    guard let asked = try? message.decode(Numbered.self) else { continue }
                    Task {
                        for n in 0..<asked.n {
                            do { try await connection.send(Numbered(n: n), type: "seq") } catch {
                                say("seq.down to \(connection) stopped at \(n): \(error)")
                                return
                            }
                        }
                    }
                    continue
                case "seq.stats":
                    if message.expectsReply {
                        try? await connection.reply(to: message, with: sequences[connection.id, default: .init()], type: "seq.stats")
                    }
                    continue
                default:
                    break
                }
                guard message.expectsReply else { continue }  // other one-way messages are only counted
                if message.typeID == "echo.stats" {
                    try? await connection.reply(to: message, with: count, type: "echo.stats")
                    continue
                }
                do {
                    try await connection.channel.replyRaw(to: message, bytes: message.payload, type: message.typeID)
                } catch let error as TransportError where error.code == .frameTooLarge {
                    // The echo would not fit the client's frame limit (a reply carries 8 more bytes):
                    // the library has already answered `too_large` in its place — one reply, never two.
                    continue
                } catch {
                    say("reply to \(connection) failed: \(error)")
                }
            case .accepted(let connection):
                // The client's proven key and the comparison code its user sees on a first contact.
                if let peer = connection.channel.peerIdentity {
                    say("accepted \(connection): key \(peer.fingerprint.full), comparison code \(peer.comparisonCode)")
                } else {
                    say("\(event)")
                }
            case .transfer(_, let transfer):
                transfer.discard()
            case .refused(let remote, let reason):
                // A flood refuses thousands a second: the first of each second in full, then a count.
                if refusals.record() { say("refused \(remote.map { "\($0)" } ?? "?"): \(reason)") }
            default:
                say("\(event)")
            }
        }
        refusals.flush()
        // The events end when the server stopped (on a signal): leave discovery cleanly too.
        await discovery.shutdown()
        say("stopped")
    }

    /// SIGTERM and SIGINT as an async sequence (Dispatch signal sources; the default actions off).
    static func terminationSignals() -> AsyncStream<Int32> {
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        let sources = SignalSources(
            [SIGTERM, SIGINT].map { number in
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                source.setEventHandler { continuation.yield(number) }
                source.resume()
                return source
            })
        continuation.onTermination = { _ in sources.cancel() }
        return stream
    }

    struct Numbered: Codable, Sendable { var n: Int }

    /// What arrived of a numbered sequence (reported to the client as `seq.stats`).
    struct SequenceStats: Codable, Sendable {
        var received = 0
        var duplicates = 0
        var outOfOrder = 0
        var next = 0
        mutating func add(_ n: Int) {
            received += 1
            if n < next { duplicates += 1 } else if n > next { outOfOrder += 1 }
            next = max(next, n + 1)
        }
    }

    func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }
}

/// Refused connections on stdout as a summary (issue 43: a handshake flood printed 1,000+ lines a
/// second): the first refusal of an interval is printed in full by the caller, the others are
/// counted and said in one line when the interval ends (a Dispatch timer; any context).
final class RefusalSummary: @unchecked Sendable {
    // @unchecked: `timer` is set once in init; a Dispatch source is thread-safe. The rest is under a lock.
    private struct State {
        var open = false
        var more = 0
    }
    private let state = Locked(State())
    private let timer: any DispatchSourceTimer
    private let seconds: Int64
    private let say: @Sendable (String) -> Void

    init(interval: Duration, say: @escaping @Sendable (String) -> Void) {
        seconds = max(1, interval.components.seconds)
        self.say = say
        timer = DispatchSource.makeTimerSource(queue: .global())
        timer.schedule(deadline: .now() + .seconds(Int(seconds)), repeating: .seconds(Int(seconds)))
        timer.setEventHandler { [weak self] in self?.flush() }
        timer.resume()
    }

    /// One more refusal: true when it is the first of its interval (print it in full).
    func record() -> Bool {
        state.withLock { current in
            if current.open {
                current.more += 1
                return false
            }
            current.open = true
            return true
        }
    }

    /// Ends the interval: says how many were counted, if any (every interval, and at the end).
    func flush() {
        let more = state.withLock { current -> Int in
            defer { current = State() }
            return current.more
        }
        if more > 0 { say("refused \(more) more connections in the last \(seconds) s") }
    }

    func cancel() { timer.cancel() }
}

/// Dispatch signal sources, cancelled together (immutable after creation; cancel is thread-safe).
final class SignalSources: @unchecked Sendable {
    let sources: [any DispatchSourceSignal]
    init(_ sources: [any DispatchSourceSignal]) { self.sources = sources }
    func cancel() { for source in sources { source.cancel() } }
}
