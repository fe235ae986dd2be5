import Discovery
import Locks
import Logging
import ProtocolCore
import ServiceLifecycle
import Transport

/// How a ``MessageServer`` listens, publishes and treats its connections.
public struct ServerConfiguration: Sendable {
    /// The DNS-SD service type, e.g. `_bonjour-chat._tcp`.
    public var serviceType: String
    /// The DNS-SD instance name; nil gives `"<program> on <host>"`.
    public var serviceName: String?
    /// TXT entries to publish; the server adds `proto=<wire protocol version>`.
    public var txt: TXTRecord = TXTRecord()
    /// Publish through discovery (needs a ``ServiceDiscovery``); false listens only.
    public var publish = true
    /// Port and families (default: one kernel-assigned port for IPv4 and IPv6).
    public var listener = Listener.Configuration()
    /// Name in the hello, codecs, frame limit, timeouts and heartbeat of every connection.
    public var channel: ChannelConfiguration
    /// Connections beyond this are refused at once (closed before the hello).
    public var maxConnections = 1024
    /// Server events waiting for the app; beyond this, connections stop being read until it catches up.
    public var eventBufferLimit = 256
    /// How long ``MessageServer/stop()`` lets connections flush and say goodbye before aborting them.
    public var stopGracePeriod: Duration = .seconds(5)

    /// - Parameters:
    ///   - serviceType: The DNS-SD service type, e.g. `_bonjour-chat._tcp`.
    ///   - serviceName: The instance name; nil gives `"<program> on <host>"`.
    ///   - peerName: This server's name in the hello (defaults to the service name or type).
    public init(serviceType: String, serviceName: String? = nil, peerName: String? = nil) {
        self.serviceType = serviceType
        self.serviceName = serviceName
        var channel = ChannelConfiguration(name: peerName ?? serviceName ?? serviceType)
        // A peer that sends no complete frame for 30 s (healthy peers ping every 5 s) is dropped:
        // half-sent frames cannot pin a connection forever.
        channel.connection.idleTimeout = .seconds(30)
        channel.codecs = .messagingDefault
        self.channel = channel
    }
}

/// Something that happened on a ``MessageServer``.
public enum ServerEvent: Sendable, CustomStringConvertible {
    /// The service is announced on the network under this name.
    case published(name: String)
    /// The name collided; the service is re-published under `to`.
    case renamed(from: String, to: String)
    /// A client connected and completed the hello.
    case accepted(ServerConnection)
    /// A message arrived.
    case received(ServerConnection, IncomingMessage)
    /// A streamed transfer started; consume its chunks or `discard()` it.
    case transfer(ServerConnection, IncomingTransfer)
    /// A connection ended, with the reason.
    case closed(ServerConnection, CloseReason)
    /// A connection was refused (connection limit, failed hello), with the reason.
    case refused(remote: SocketAddress?, reason: String)

    public var description: String {
        switch self {
        case .published(let name): "published as '\(name)'"
        case .renamed(let from, let to): "renamed '\(from)' → '\(to)'"
        case .accepted(let connection): "accepted \(connection)"
        case .received(let connection, let message): "received \(message.typeID) #\(message.sequence) from \(connection)"
        case .transfer(let connection, let transfer): "transfer \(transfer.typeID) (\(transfer.totalSize) bytes) from \(connection)"
        case .closed(let connection, let reason): "closed \(connection): \(reason)"
        case .refused(let remote, let reason): "refused \(remote.map { "\($0)" } ?? "?"): \(reason)"
        }
    }
}

/// One client connection of a server.
public final class ServerConnection: Sendable, Hashable, CustomStringConvertible {
    /// Unique per server, increasing.
    public let id: UInt64
    /// The underlying channel: send, request, reply, stream files.
    public let channel: MessageChannel

    init(id: UInt64, channel: MessageChannel) {
        self.id = id
        self.channel = channel
    }

    /// The peer's hello: name, protocol version, metadata.
    public var peer: PeerInfo { channel.peer }
    /// Where the peer connects from.
    public var remoteAddress: SocketAddress? { channel.remoteAddress }

    /// Sends a message to this peer (suspends while its send queue is full).
    public func send<T: Encodable>(_ value: T, type: String) async throws {
        try await channel.send(value, type: type)
    }

    /// Replies to a request from this peer.
    public func reply<T: Encodable>(to message: IncomingMessage, with value: T, type: String) async throws {
        try await channel.reply(to: message, with: value, type: type)
    }

    /// Closes gracefully (queued messages are flushed first).
    public func close(reason: String = "closed by server") { channel.close(reason: reason) }

    public static func == (lhs: ServerConnection, rhs: ServerConnection) -> Bool { lhs.id == rhs.id }
    public func hash(into hasher: inout Hasher) { hasher.combine(id) }
    public var description: String {
        "#\(id) '\(peer.name)'\(remoteAddress.map { " at \($0)" } ?? "")"
    }
}

/// The outcome of a broadcast for one connection.
public struct BroadcastResult: Sendable {
    /// The connection.
    public let connection: ServerConnection
    /// Why sending to it failed (nil: the message was queued for it).
    public let error: (any Error)?
    /// Whether the message was queued for this connection.
    public var succeeded: Bool { error == nil }
}

/// The server's events, in order. One consumer. When the app does not consume them, the server
/// stops reading from its connections (bounded memory) until it does.
public struct ServerEvents: AsyncSequence, Sendable {
    public typealias Element = ServerEvent
    let queue: BoundedQueue<ServerEvent>

    public struct AsyncIterator: AsyncIteratorProtocol {
        let queue: BoundedQueue<ServerEvent>
        public mutating func next() async -> ServerEvent? { try? await queue.next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(queue: queue) }
}

/// A messaging server: listens on IPv4 and IPv6 on one port, publishes itself through discovery,
/// accepts clients, and reports what happens as ``events``.
///
/// ```swift
/// let server = MessageServer(configuration: .init(serviceType: "_chat._tcp", serviceName: "Lobby"),
///                            discovery: discovery, logger: logger)
/// try await server.start()
/// for await event in server.events {
///     if case .received(let connection, let message) = event, message.typeID == "chat.say" {
///         let text = try message.decode(String.self)
///         _ = await server.broadcast(text, type: "chat.said")
///     }
/// }
/// ```
///
/// Also a swift-service-lifecycle `Service`: `run()` starts it and stops it gracefully on shutdown.
public final class MessageServer: Service, Sendable {
    private enum Phase { case idle, starting, running, stopping, stopped }
    private struct State {
        var phase = Phase.idle
        var listener: Listener?
        var publication: PublishedService?
        var connections: [UInt64: ServerConnection] = [:]
        var pendingHellos = 0
        var nextID: UInt64 = 0
    }

    /// The configuration the server was created with.
    public let configuration: ServerConfiguration
    private let discovery: ServiceDiscovery?
    private let logger: Logger
    private let state = Locked(State())
    private let queue: BoundedQueue<ServerEvent>
    /// What happens on the server, in order; see ``ServerEvent``.
    public let events: ServerEvents

    /// - Parameters:
    ///   - configuration: Service type and name, limits, channel settings.
    ///   - discovery: Used to publish the server; nil (or `configuration.publish == false`) only listens.
    ///   - logger: Where the server logs (accepts, refusals, closes with reasons).
    public init(configuration: ServerConfiguration, discovery: ServiceDiscovery?, logger: Logger) {
        self.configuration = configuration
        self.discovery = discovery
        self.logger = logger
        self.queue = BoundedQueue(limit: configuration.eventBufferLimit)
        self.events = ServerEvents(queue: queue)
    }

    /// The listening port (nil before `start()`).
    public var port: UInt16? { state.withLock { $0.listener?.port } }
    /// The addresses the listener is bound to.
    public var boundAddresses: [SocketAddress] { state.withLock { $0.listener?.boundAddresses ?? [] } }
    /// The current published name (nil when not published).
    public var publishedName: String? { state.withLock { $0.publication?.name } }
    /// The open connections (hello completed), oldest first.
    public var connections: [ServerConnection] {
        state.withLock { $0.connections.values.sorted { $0.id < $1.id } }
    }

    /// Listens (IPv4 + IPv6 on one port) and publishes the service with `proto=<version>` in its TXT.
    /// - Throws: ``MessagingError`` `.alreadyStarted`, `.listenFailed`, `.publishFailed`.
    public func start() async throws(MessagingError) {
        let proceed = state.withLock { state -> Bool in
            guard state.phase == .idle else { return false }
            state.phase = .starting
            return true
        }
        guard proceed else { throw MessagingError(.alreadyStarted, "the server was already started; create a new one") }
        let listener: Listener
        do {
            listener = try Listener(configuration: configuration.listener, logger: logger) { [weak self] socket in
                self?.accepted(socket)
            }
        } catch {
            state.withLock { $0.phase = .stopped }
            throw MessagingError(.listenFailed, "cannot listen: \(error.message)", underlying: error)
        }
        state.withLock { $0.listener = listener }
        if configuration.publish, let discovery {
            var txt = configuration.txt
            txt["proto"] = String(WireProtocol.version)
            do {
                let publication = try await discovery.publish(
                    name: configuration.serviceName, type: configuration.serviceType, port: listener.port, txt: txt)
                state.withLock { $0.publication = publication }
                let queue = self.queue
                Task {
                    for await event in publication.events {
                        switch event {
                        case .established(let name): queue.push(.published(name: name))
                        case .renamed(let from, let to): queue.push(.renamed(from: from, to: to))
                        default: break
                        }
                    }
                }
            } catch {
                listener.stop()
                state.withLock { $0.phase = .stopped }
                throw MessagingError(.publishFailed, "cannot publish the server: \(error.message)", underlying: error)
            }
        }
        state.withLock { $0.phase = .running }
        logger.info("server running", metadata: ["port": "\(listener.port)", "type": "\(configuration.serviceType)"])
    }

    /// Replaces the published TXT record (the server keeps `proto`).
    /// - Throws: ``MessagingError`` `.notStarted`, or `.publishFailed` wrapping the discovery error.
    public func updateTXT(_ txt: TXTRecord) async throws(MessagingError) {
        guard let publication = state.withLock({ $0.publication }) else {
            throw MessagingError(.notStarted, "the server is not published; start it with a ServiceDiscovery first")
        }
        var record = txt
        record["proto"] = String(WireProtocol.version)
        do {
            try await publication.updateTXT(record)
        } catch {
            throw MessagingError(.publishFailed, "TXT update refused: \(error.message)", underlying: error)
        }
    }

    private func accepted(_ socket: AcceptedSocket) {
        let limit = configuration.maxConnections
        let admitted = state.withLock { state -> Bool in
            guard state.phase == .running, state.connections.count + state.pendingHellos < limit else { return false }
            state.pendingHellos += 1
            return true
        }
        guard admitted else {
            let reason = "connection limit of \(limit) reached (or server stopping)"
            logger.warning("refusing connection", metadata: ["remote": "\(socket.remoteAddress.map { "\($0)" } ?? "?")", "reason": "\(reason)"])
            socket.close()
            queue.push(.refused(remote: socket.remoteAddress, reason: reason))
            return
        }
        let remote = socket.remoteAddress
        Task {
            do {
                let channel = try await MessageChannel.accept(socket, configuration: configuration.channel, logger: logger)
                self.register(channel)
            } catch {
                state.withLock { $0.pendingHellos -= 1 }
                logger.notice("hello failed", metadata: ["remote": "\(remote.map { "\($0)" } ?? "?")", "error": "\(error)"])
                queue.push(.refused(remote: remote, reason: "\(error)"))
            }
        }
    }

    private func register(_ channel: MessageChannel) {
        let connection: ServerConnection? = state.withLock { state in
            state.pendingHellos -= 1
            guard state.phase == .running else { return nil }
            state.nextID += 1
            let connection = ServerConnection(id: state.nextID, channel: channel)
            state.connections[connection.id] = connection
            return connection
        }
        guard let connection else {
            channel.close(reason: "server stopping")
            return
        }
        logger.debug("accepted", metadata: ["connection": "\(connection)"])
        queue.push(.accepted(connection))
        let queue = self.queue
        Task {
            for await message in channel.messages { await queue.pushWaiting(.received(connection, message)) }
            let reason = await channel.closed()
            self.state.withLock { _ = $0.connections.removeValue(forKey: connection.id) }
            self.logger.debug("closed", metadata: ["connection": "\(connection)", "reason": "\(reason)"])
            queue.push(.closed(connection, reason))
        }
        Task {
            for await transfer in channel.transfers { await queue.pushWaiting(.transfer(connection, transfer)) }
        }
    }

    /// Sends one message to every connection. The value is encoded once. A connection whose send
    /// queue stays full for `timeout` (a peer that does not read) is dropped and reported failed.
    /// - Returns: One result per connection; failures carry their error, nothing is swallowed.
    public func broadcast<T: Encodable>(
        _ value: T, type: String, timeout: Duration = .seconds(10)
    ) async -> [BroadcastResult] {
        let targets = connections
        guard let first = targets.first else { return [] }
        let encoded: (codecID: UInt8, payload: [UInt8])
        do {
            encoded = try first.channel.encodeForSending(value, type: type)
        } catch {
            return targets.map { BroadcastResult(connection: $0, error: error) }
        }
        let logger = self.logger
        return await withTaskGroup(of: BroadcastResult.self) { group in
            for connection in targets {
                group.addTask {
                    do {
                        try await sendWithDeadline(connection: connection, timeout: timeout) {
                            try await connection.channel.sendEncoded(encoded.payload, codecID: encoded.codecID, type: type)
                        }
                        return BroadcastResult(connection: connection, error: nil)
                    } catch {
                        logger.notice("broadcast failed", metadata: ["connection": "\(connection)", "error": "\(error)"])
                        return BroadcastResult(connection: connection, error: error)
                    }
                }
            }
            var results: [BroadcastResult] = []
            for await result in group { results.append(result) }
            return results.sorted { $0.connection.id < $1.connection.id }
        }
    }

    /// Stops: unpublishes, stops accepting, closes every connection gracefully (flushing queued
    /// messages) within the grace period, aborts what is left, and ends ``events``. Idempotent.
    public func stop() async {
        let (listener, publication, connections, proceed) = state.withLock { state in
            guard state.phase == .running || state.phase == .starting else {
                return (nil as Listener?, nil as PublishedService?, [ServerConnection](), false)
            }
            state.phase = .stopping
            return (state.listener, state.publication, Array(state.connections.values), true)
        }
        guard proceed else { return }
        await publication?.unpublish()
        listener?.stop()
        for connection in connections { connection.channel.close(reason: "server stopping") }
        let grace = configuration.stopGracePeriod
        await withTaskGroup(of: Void.self) { group in
            for connection in connections {
                group.addTask {
                    let closed = await raceTimeout(grace) { _ = await connection.channel.closed() }
                    if !closed { connection.channel.abort() }
                }
            }
        }
        state.withLock { $0.phase = .stopped }
        queue.finish()
        logger.info("server stopped")
    }

    /// Runs the server as a swift-service-lifecycle service: starts it, and on graceful shutdown
    /// (or cancellation) stops it.
    public func run() async throws {
        try await start()
        try? await gracefulShutdown()
        await stop()
    }
}

/// Runs `body`; returns false if it did not finish within `timeout`. Does not wait for a body that
/// ignores cancellation (it keeps running in the background; the caller decides what to do).
func raceTimeout(_ timeout: Duration, _ body: @escaping @Sendable () async -> Void) async -> Bool {
    let race = Race()
    return await withCheckedContinuation { continuation in
        race.set(continuation)
        let timer = Task {
            // Cancelled (the body finished first): not a timeout. Finishing with false here would
            // race the body's finish(true) and could report a timeout for a body that completed.
            do { try await Task.sleep(for: timeout) } catch { return }
            race.finish(false)
        }
        Task {
            await body()
            race.finish(true)
            timer.cancel()
        }
    }
}

/// Resumes a continuation once, with whichever outcome comes first.
private final class Race: Sendable {
    private let continuation = Locked<CheckedContinuation<Bool, Never>?>(nil)
    func set(_ value: CheckedContinuation<Bool, Never>) { continuation.withLock { $0 = value } }
    func finish(_ outcome: Bool) {
        let waiting = continuation.withLock { value -> CheckedContinuation<Bool, Never>? in
            defer { value = nil }
            return value
        }
        waiting?.resume(returning: outcome)
    }
}

/// Runs a send; when it is still waiting for queue space after `timeout`, aborts the connection
/// (a peer that does not read) so the send fails instead of hanging.
func sendWithDeadline(
    connection: ServerConnection, timeout: Duration, _ send: @escaping @Sendable () async throws -> Void
) async throws {
    let sender = Task { try await send() }
    let finished = await raceTimeout(timeout) { _ = await sender.result }
    if !finished {
        connection.channel.abort()
        throw MessagingError(
            .peerTooSlow,
            "\(connection) did not accept data for \(timeout) (a peer that does not read); dropped it — raise the broadcast timeout if such peers are expected")
    }
    try await sender.value
}
