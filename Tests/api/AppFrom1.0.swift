// An app written against the README of 1.0 (the Swift samples of README.md at bb52819^, before
// `ClientConfiguration.init(name:)` was removed), with the names 1.0 had. Tests/api/check-api.sh
// type-checks it against today's modules: an app written last month must still build. Deprecation
// warnings are expected here (that is what a deprecation is); errors are not.
import Discovery
import Logging
import Messaging
import ServiceLifecycle

struct Entry: Codable, Sendable {
    var key: String
    var value: String?
}

struct Note: Codable, Sendable {
    var text: String
}

/// The server: a published key-value board (README 1.0, "Getting started").
struct Board: Service {
    let server: MessageServer

    func run() async throws {
        var entries: [String: String] = [:]
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

func runBoard(logger: Logger) async throws {
    let server = MessageServer(
        configuration: .init(serviceType: "_kv._tcp", serviceName: "Board"),
        discovery: ServiceDiscovery(logger: logger), logger: logger)
    let services: [any Service] = [server, Board(server: server)]
    try await ServiceGroup(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger).run()
}

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

/// 1.0's initializer, by its old name.
func oldNames(target: ServiceTarget, logger: Logger) async throws {
    var configuration = ClientConfiguration(name: "alice", reconnect: ReconnectPolicy())
    configuration.browseTimeout = .seconds(5)
    let client = try await MessageClient.connect(to: target, configuration: configuration, logger: logger)
    try await client.send(Note(text: "typed while the Wi-Fi roams"), type: "note")
    for await event in client.events {
        if case .undelivered(let lost) = event { print("not delivered:", lost.map(\.typeID)) }
    }
}

func discover() async throws {
    let discovery = ServiceDiscovery(logger: Logger(label: "app"))
    let service = try await discovery.publish(name: "Lobby", type: "_chat._tcp", port: 4242, txt: ["topic": "hello"])
    print("published as", try await service.established())
    try await service.updateTXT(["topic": "new topic"])
    for await event in try discovery.browse(type: "_chat._tcp") {
        if case .added(let found) = event {
            let resolved = try await discovery.resolve(found)
            print(resolved.addresses)
        }
    }
    let rooms = try await discovery.services(ofType: "_chat._tcp", timeout: .seconds(3)) { _, allForNow in allForNow }
    print(rooms)
}

func chooseBackends(logger: Logger) async {
    let discovery = ServiceDiscovery(logger: logger)
    let embedded = ServiceDiscovery(logger: logger, backend: .embedded)
    var settings = DiscoveryConfiguration(interfaces: InterfacePolicy(denied: ["docker*", "veth*"]), ipVersion: .ipv4)
    settings.advertisedAddresses = [IPAddress("192.0.2.7")!]
    let controlled = ServiceDiscovery(logger: logger, configuration: settings)
    print(await discovery.backend(), discovery.backendReason ?? "", embedded, controlled)
}

func security() throws {
    var configuration = ServerConfiguration(serviceType: "_kv._tcp", serviceName: "Kitchen board")
    let identity = try Identity.loadOrCreate(at: Identity.defaultPath(app: "kv-board"))
    configuration.channel.security = .encrypted(
        identity: identity, trust: .pinned([Fingerprint("<64 hex digits of the client you allow>")!]))
    var client = ClientConfiguration(peerName: "kitchen tablet")
    let store = TrustStore(path: TrustStore.defaultPath(app: "kv-tablet"))
    client.channel.security = .encrypted(
        identity: try Identity.loadOrCreate(at: Identity.defaultPath(app: "kv-tablet")), trust: .trustOnFirstUse(store))
    print(configuration, client)
    // After a legitimate key change (the key-change warning says so): the next connection to the
    // board is a first contact again (issue 57; TrustFollowsTheKeyTests runs this flow).
    if try store.forget(name: "Kitchen board") { print("forgot the key of 'Kitchen board'") }
    print(store.fingerprint(for: "Kitchen board")?.full ?? "unknown", store.entries.count)
}
