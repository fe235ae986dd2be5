// A server and a client in one program: the server publishes itself on the local network,
// the client finds it by name, sends a request and prints the reply.

import Foundation
import Logging
import Messaging

// snippet.hide
// Bounded: this program ends within 10 seconds whatever happens.
DispatchQueue.global().asyncAfter(deadline: .now() + 10) {
    print("getting-started: timed out")
    exit(1)
}
// Keep the keys this demo creates out of the user's data directory.
let dataDirectory = NSTemporaryDirectory() + "lanmsg-getting-started-\(getpid())"
setenv("XDG_DATA_HOME", dataDirectory, 1)
// snippet.show

struct Greeting: Codable, Sendable {
    var text: String
}

let logger = Logger(label: "greeter")
let discovery = ServiceDiscovery(logger: logger)  // Avahi, or the embedded mDNS stack
let name = "Greeter \(getpid())"

// The server: listens on one port (IPv4 and IPv6), publishes `_greeter._tcp`, answers requests.
let server = MessageServer(
    configuration: ServerConfiguration(serviceType: "_greeter._tcp", serviceName: name),
    discovery: discovery, logger: logger)
try await server.start()
let serving = Task {
    for await event in server.events {
        guard case .received(let connection, let request) = event, request.expectsReply else { continue }
        do {
            let greeting = try request.decode(Greeting.self)
            try await connection.reply(to: request, with: Greeting(text: "hello, \(greeting.text)"), type: "greeting")
        } catch {
            try? await connection.reply(to: request, error: RemoteError(code: "bad_request", message: "\(error)"))
        }
    }
}

// The client: browses for the service by name, resolves it, connects, asks.
let client = try await MessageClient.connect(
    to: .service(name: name, type: "_greeter._tcp", discovery: discovery),
    configuration: ClientConfiguration(peerName: "alice"), logger: logger)
let reply = try await client.request(Greeting(text: "alice"), type: "greet", expecting: Greeting.self)
print("getting-started: ok \(reply.text)")

await client.close()
await server.stop()  // unpublishes, says goodbye to every client, ends `server.events`
// snippet.hide
await serving.value
await discovery.shutdown()
try? FileManager.default.removeItem(atPath: dataDirectory)
