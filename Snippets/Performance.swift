// A small timed burst: a client sends 10,000 small Codable messages to a server on loopback
// in one batch, then asks how many arrived. Encrypted, as by default.

import Foundation
import Logging
import Messaging

// snippet.hide
// Bounded: this program ends within 10 seconds whatever happens.
DispatchQueue.global().asyncAfter(deadline: .now() + 10) {
    print("performance: timed out")
    exit(1)
}
// Keep the keys this demo creates out of the user's data directory.
let dataDirectory = NSTemporaryDirectory() + "lanmsg-performance-\(getpid())"
setenv("XDG_DATA_HOME", dataDirectory, 1)
var logger = Logger(label: "performance")
logger.logLevel = .warning
// snippet.show

/// The benchmarks' message (W1, W2, W4): about 80 bytes of JSON.
struct Sample: Codable, Sendable {
    var id: Int
    var name: String
    var value: Double
    var tags: [String]
}
struct Count: Codable, Sendable {
    var received: Int
}

var configuration = ServerConfiguration(serviceType: "_bench._tcp", serviceName: "bench")
configuration.publish = false
let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
try await server.start()
let counting = Task.detached {
    var received = 0
    for await event in server.events {
        guard case .received(let connection, let message) = event else { continue }
        if message.expectsReply {  // "how many?" arrives after every sample sent before it
            try? await connection.reply(to: message, with: Count(received: received), type: "count")
        } else if (try? message.decode(Sample.self)) != nil {
            received += 1
        }
    }
}

let client = try await MessageClient.connect(
    to: .host("127.0.0.1", port: server.port!), configuration: ClientConfiguration(peerName: "sender"),
    logger: logger)
let samples = (0..<10_000).map { Sample(id: $0, name: "sensor-\($0 % 100)", value: Double($0), tags: ["a", "b", "c"]) }

let start = ContinuousClock.now
try await client.send(contentsOf: samples, type: "sample")  // one hand-off for the whole batch
let count = try await client.request(Count(received: 0), type: "count?", expecting: Count.self)
let elapsed = ContinuousClock.now - start

let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
print("\(count.received) messages in \(elapsed): \(Int(Double(count.received) / seconds)) msgs/s")
guard count.received == samples.count else {
    print("performance: \(count.received) of \(samples.count) arrived")
    exit(1)
}
print("round trip:", await client.health?.description ?? "-")
await client.close()
await server.stop()
// snippet.hide
await counting.value
try? FileManager.default.removeItem(atPath: dataDirectory)
// snippet.show
print("performance: ok \(count.received) messages")
