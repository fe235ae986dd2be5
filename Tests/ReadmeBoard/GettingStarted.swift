// The README's "Getting started" code, byte for byte between the markers (a unit test compares
// them; GettingStartedIntegrationTests runs the readme-board program built from it against real
// avahi-daemons).
// README:begin
import Logging
import Messaging
import ServiceLifecycle

struct Entry: Codable, Sendable {
    var key: String
    var value: String?
}

/// The server: a published key-value board. Clients set and get entries by request; every change
/// is broadcast to the other clients. A bad request gets an error reply, and the loop goes on.
struct Board: Service {
    let server: MessageServer

    func run() async throws {
        var entries: [String: String] = [:]
        // Until SIGTERM/SIGINT: the group stops this loop first, then the server (reverse order).
        for await event in server.events.cancelOnGracefulShutdown() {
            guard case .received(let client, let request) = event, request.expectsReply else { continue }
            do {
                let entry = try request.decode(Entry.self)
                if request.typeID == "kv.set" {
                    entries[entry.key] = entry.value
                    _ = await server.broadcast(entry, type: "kv.changed", except: [client])
                }
                try await client.reply(to: request, with: Entry(key: entry.key, value: entries[entry.key]), type: "kv.entry")
            } catch {
                try? await client.reply(to: request, error: RemoteError(code: "bad_request", message: "\(error)"))
            }
        }
    }
}

/// Runs the board until SIGINT or SIGTERM; then it unpublishes, says goodbye to every client, exits.
func runBoard(logger: Logger) async throws {
    let server = MessageServer(
        configuration: .init(serviceType: "_kv._tcp", serviceName: "Board"),
        discovery: ServiceDiscovery(logger: logger), logger: logger)
    let services: [any Service] = [server, Board(server: server)]
    try await ServiceGroup(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger).run()
}

/// A client: finds the board by name (waiting for it if it is not up yet), sets, then gets.
func useBoard(logger: Logger) async throws -> String? {
    var configuration = ClientConfiguration(peerName: "alice", reconnect: ReconnectPolicy())
    configuration.waitsForServer = true
    let client = try await MessageClient.connect(
        to: .service(name: "Board", type: "_kv._tcp", discovery: ServiceDiscovery(logger: logger)),
        configuration: configuration, logger: logger)
    defer { Task { await client.close() } }
    _ = try await client.request(Entry(key: "greeting", value: "hello"), type: "kv.set", expecting: Entry.self)
    return try await client.request(Entry(key: "greeting"), type: "kv.get", expecting: Entry.self).value
}
// README:end
