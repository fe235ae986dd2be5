import Discovery
import Locks
import Logging
import ProtocolCore
import Transport

/// How a ``MessageClient`` finds, connects and reconnects.
public struct ClientConfiguration: Sendable {
    /// Name in the hello, codecs, frame limit, connect timeout, heartbeat.
    public var channel: ChannelConfiguration
    /// How long to browse for the service before giving up (or deciding it is ambiguous).
    public var browseTimeout: Duration = .seconds(5)
    /// How long one resolve may take.
    public var resolveTimeout: Duration = .seconds(5)
    /// Reconnect automatically when the connection is lost (not after ``MessageClient/close()``).
    public var reconnect: ReconnectPolicy?
    /// Client events waiting for the app; beyond this the connection stops being read.
    public var eventBufferLimit = 256

    public init(name: String, reconnect: ReconnectPolicy? = nil) {
        var channel = ChannelConfiguration(name: name)
        channel.codecs = .messagingDefault
        self.channel = channel
        self.reconnect = reconnect
    }
}

/// Back-off for automatic reconnection: re-browse and re-resolve (the server may come back on a new
/// port), then connect; the delay doubles from `initialDelay` up to `maxDelay`.
public struct ReconnectPolicy: Sendable {
    public var initialDelay: Duration
    public var maxDelay: Duration
    /// Give up after this many failed attempts in a row (nil: never).
    public var maxAttempts: Int?

    public init(initialDelay: Duration = .milliseconds(250), maxDelay: Duration = .seconds(5), maxAttempts: Int? = nil) {
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.maxAttempts = maxAttempts
    }
}

/// Something that happened on a ``MessageClient``.
public enum ClientEvent: Sendable, CustomStringConvertible {
    /// Connected (first time or after a reconnect) to this peer.
    case connected(PeerInfo, via: SocketAddress?)
    /// A message arrived.
    case received(IncomingMessage)
    /// A streamed transfer started; consume its chunks or `discard()` it.
    case transfer(IncomingTransfer)
    /// The connection ended, with the reason.
    case disconnected(CloseReason)
    /// Trying again after `delay` (attempt counts from 1).
    case reconnecting(attempt: Int, delay: Duration)
    /// Reconnection stopped (attempts exhausted); the client is closed.
    case gaveUp(MessagingError)

    public var description: String {
        switch self {
        case .connected(let peer, let via): "connected to '\(peer.name)'\(via.map { " via \($0)" } ?? "")"
        case .received(let message): "received \(message.typeID) #\(message.sequence)"
        case .transfer(let transfer): "transfer \(transfer.typeID) (\(transfer.totalSize) bytes)"
        case .disconnected(let reason): "disconnected: \(reason)"
        case .reconnecting(let attempt, let delay): "reconnecting (attempt \(attempt)) in \(delay)"
        case .gaveUp(let error): "gave up: \(error)"
        }
    }
}

/// The client's events, in order. One consumer.
public struct ClientEvents: AsyncSequence, Sendable {
    public typealias Element = ClientEvent
    let queue: BoundedQueue<ClientEvent>

    public struct AsyncIterator: AsyncIteratorProtocol {
        let queue: BoundedQueue<ClientEvent>
        public mutating func next() async -> ClientEvent? { try? await queue.next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(queue: queue) }
}

/// Where a client connects: a fixed host and port, or a service found by discovery.
public enum ServiceTarget: Sendable, CustomStringConvertible {
    /// A host name or numeric address (IPv6 may carry `%scope`) and a port.
    case host(String, port: UInt16)
    /// A DNS-SD service of `type`, by instance name; nil name: the only one there is.
    case service(name: String?, type: String, discovery: ServiceDiscovery)

    public var description: String {
        switch self {
        case .host(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .service(let name, let type, _): name.map { "'\($0)' (\(type))" } ?? "the \(type) service"
        }
    }
}

/// A messaging client: connects to a server by address or by discovered service name (resolve,
/// then Happy Eyeballs over every address, IPv6 link-local included), and optionally reconnects.
///
/// ```swift
/// let client = try await MessageClient.connect(
///     to: .service(name: "Lobby", type: "_chat._tcp", discovery: discovery),
///     configuration: .init(name: "alice"), logger: logger)
/// try await client.send("hello", type: "chat.say")
/// for await event in client.events { print(event) }
/// ```
public final class MessageClient: Sendable {
    private struct State {
        var channel: MessageChannel?
        var closed = false
    }

    /// Where this client connects.
    public let target: ServiceTarget
    /// The configuration it was created with.
    public let configuration: ClientConfiguration
    private let logger: Logger
    private let state = Locked(State())
    private let queue: BoundedQueue<ClientEvent>
    /// What happens on the client, in order; see ``ClientEvent``.
    public let events: ClientEvents

    private init(target: ServiceTarget, configuration: ClientConfiguration, logger: Logger) {
        self.target = target
        self.configuration = configuration
        self.logger = logger
        self.queue = BoundedQueue(limit: configuration.eventBufferLimit)
        self.events = ClientEvents(queue: queue)
    }

    /// Connects (resolving the target first) and performs the hello.
    /// - Throws: ``MessagingError`` `.serviceNotFound`, `.ambiguousService` (the names are in the
    ///   message), `.connectFailed` (each address's failure in the message).
    public static func connect(
        to target: ServiceTarget, configuration: ClientConfiguration, logger: Logger
    ) async throws(MessagingError) -> MessageClient {
        let client = MessageClient(target: target, configuration: configuration, logger: logger)
        let channel = try await client.establish()
        client.attach(channel)
        return client
    }

    /// The current channel (nil while disconnected).
    public var channel: MessageChannel? { state.withLock { $0.channel } }
    /// The server's hello, when connected.
    public var peer: PeerInfo? { channel?.peer }

    private func currentChannel() throws(MessagingError) -> MessageChannel {
        guard let channel else {
            throw MessagingError(.stopped, "not connected to \(target)\(configuration.reconnect != nil ? " (reconnecting)" : "")")
        }
        return channel
    }

    /// Sends a message (suspends while the send queue is full).
    public func send<T: Encodable>(_ value: T, type: String) async throws {
        try await currentChannel().send(value, type: type)
    }

    /// Sends several messages of one type in order with one hand-off to the connection (see
    /// `MessageChannel.send(contentsOf:type:)`): cheaper than one `send` each for a stream of
    /// small messages.
    public func send<T: Encodable>(contentsOf values: some Sequence<T>, type: String) async throws {
        try await currentChannel().send(contentsOf: values, type: type)
    }

    /// Sends a request and waits for the reply.
    public func request<Request: Encodable, Response: Decodable>(
        _ value: Request, type: String, expecting: Response.Type = Response.self, timeout: Duration = .seconds(10)
    ) async throws -> Response {
        try await currentChannel().request(value, type: type, expecting: expecting, timeout: timeout)
    }

    /// Closes gracefully (queued messages are flushed) and stops reconnecting. Idempotent.
    public func close(reason: String = "client closing") async {
        let channel = state.withLock { state -> MessageChannel? in
            state.closed = true
            return state.channel
        }
        if let channel {
            channel.close(reason: reason)
            _ = await raceTimeout(.seconds(5)) { _ = await channel.closed() }
        }
        queue.finish()
    }

    // MARK: Connecting

    private func attach(_ channel: MessageChannel) {
        let keep = state.withLock { state -> Bool in
            guard !state.closed else { return false }
            state.channel = channel
            return true
        }
        guard keep else {
            channel.close(reason: "client closed")
            return
        }
        queue.push(.connected(channel.peer, via: channel.remoteAddress))
        let queue = self.queue
        Task {
            for await transfer in channel.transfers { await queue.pushWaiting(.transfer(transfer)) }
        }
        Task {
            for await message in channel.messages { await queue.pushWaiting(.received(message)) }
            let reason = await channel.closed()
            let closedByUs = self.state.withLock { state -> Bool in
                if state.channel === channel { state.channel = nil }
                return state.closed
            }
            queue.push(.disconnected(reason))
            if !closedByUs, self.configuration.reconnect != nil {
                await self.reconnectLoop()
            } else if !closedByUs {
                queue.finish()
            }
        }
    }

    private func reconnectLoop() async {
        guard let policy = configuration.reconnect else { return }
        var delay = policy.initialDelay
        var attempt = 0
        while !state.withLock({ $0.closed }) {
            attempt += 1
            if let max = policy.maxAttempts, attempt > max {
                let error = MessagingError(.connectFailed, "gave up reconnecting to \(target) after \(max) attempts")
                logger.warning("\(error.message)")
                queue.push(.gaveUp(error))
                state.withLock { $0.closed = true }
                queue.finish()
                return
            }
            queue.push(.reconnecting(attempt: attempt, delay: delay))
            try? await Task.sleep(for: delay)
            do {
                let channel = try await establish()
                attach(channel)
                return
            } catch {
                logger.info("reconnect failed", metadata: ["attempt": "\(attempt)", "error": "\(error.message)"])
                delay = min(delay * 2, policy.maxDelay)
            }
        }
    }

    private func establish() async throws(MessagingError) -> MessageChannel {
        let addresses = try await addresses()
        do {
            return try await MessageChannel.connect(to: addresses, configuration: configuration.channel, logger: logger)
        } catch let error as TransportError {
            throw MessagingError(.connectFailed, "cannot connect to \(target): \(error.message)", underlying: error)
        } catch {
            throw MessagingError(.connectFailed, "cannot connect to \(target): \(error)", underlying: error)
        }
    }

    private func addresses() async throws(MessagingError) -> [SocketAddress] {
        switch target {
        case .host(let host, let port):
            do {
                return try HostLookup.addresses(host: host, port: port)
            } catch {
                throw MessagingError(.connectFailed, error.message, underlying: error)
            }
        case .service(let name, let type, let discovery):
            let service = try await Self.find(name: name, type: type, discovery: discovery, timeout: configuration.browseTimeout)
            let resolved: ResolvedService
            do {
                resolved = try await discovery.resolve(service, timeout: configuration.resolveTimeout)
            } catch {
                throw MessagingError(.serviceNotFound, "found \(service.identity) but could not resolve it: \(error.message)", underlying: error)
            }
            let addresses = resolved.addresses.compactMap {
                SocketAddress(bytes: $0.ip.bytes, port: $0.port, scopeID: $0.scopeID)
            }
            guard !addresses.isEmpty else {
                throw MessagingError(.serviceNotFound, "\(service.identity) resolved without a usable address")
            }
            logger.debug("resolved", metadata: ["service": "\(resolved)"])
            return addresses
        }
    }

    /// Browses for services of `type` and picks one: the one named `name`, or the only one.
    /// - Throws: ``MessagingError`` `.serviceNotFound` or `.ambiguousService` (names listed).
    public static func find(
        name: String?, type: String, discovery: ServiceDiscovery, timeout: Duration
    ) async throws(MessagingError) -> DiscoveredService {
        let found: [DiscoveredService]
        do {
            // With a name: until that one is seen. Without: until Avahi's first "all for now" that
            // saw something (a lone service must not be mistaken for the only one too early).
            found = try await discovery.services(ofType: type, timeout: timeout) { seen, allForNow in
                if let name { seen.contains { $0.name == name } } else { allForNow && !seen.isEmpty }
            }
        } catch {
            throw MessagingError(.serviceNotFound, "cannot browse for \(type): \(error.message)", underlying: error)
        }
        if let name {
            guard let match = found.first(where: { $0.name == name }) else {
                throw MessagingError(.serviceNotFound, "no \(type) service named '\(name)' found within \(timeout); check the name, or that it runs on this network")
            }
            return match
        }
        switch found.count {
        case 0:
            throw MessagingError(.serviceNotFound, "no \(type) service found within \(timeout); is one running on this network?")
        case 1:
            return found[0]
        default:
            let names = found.map { "'\($0.name)'" }.sorted().joined(separator: ", ")
            throw MessagingError(.ambiguousService, "\(found.count) \(type) services found (\(names)); name the one you want")
        }
    }
}
