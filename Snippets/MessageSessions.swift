// A client with a message session: its one-way messages survive a dropped connection and
// arrive exactly once, in order. The server drops the connection halfway (as a roaming Wi-Fi
// link would); the client reconnects, the session resumes, and nothing is lost or repeated.

import Foundation
import Logging
import Messaging

// snippet.hide
// Bounded: this program ends within 10 seconds whatever happens.
DispatchQueue.global().asyncAfter(deadline: .now() + 10) {
    print("sessions: timed out")
    exit(1)
}
// Keep the keys this demo creates out of the user's data directory.
let dataDirectory = NSTemporaryDirectory() + "lanmsg-sessions-\(getpid())"
setenv("XDG_DATA_HOME", dataDirectory, 1)
var logger = Logger(label: "sessions")
logger.logLevel = .error
// snippet.show

struct Note: Codable, Sendable {
    var number: Int
}
let total = 200

// snippet.server
// A server keeps a lost client's session for `session.gracePeriod` (60 s by default).
var configuration = ServerConfiguration(serviceType: "_notes._tcp", serviceName: "notes")
configuration.publish = false
let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
try await server.start()
let receiving = Task.detached { () -> [Int] in
    var numbers: [Int] = []
    for await event in server.events {
        switch event {
        case .received(let connection, let message):
            numbers.append(try! message.decode(Note.self).number)
            // Halfway, drop the TCP connection without a goodbye, like a network that fails.
            if numbers.count == total / 2 { connection.channel.abort() }
            if numbers.count == total { return numbers }
        case .interrupted(let connection, let reason):
            print("server: \(connection) interrupted (\(reason)); keeping its session")
        case .resumed(let connection, let resent):
            print("server: \(connection) resumed, \(resent) messages sent again")
        default:
            break
        }
    }
    return numbers
}
// snippet.end

// snippet.client
// A client with a reconnect policy opens a message session (`configuration.session`, on by default).
let client = try await MessageClient.connect(
    to: .host("127.0.0.1", port: server.port!),
    configuration: ClientConfiguration(peerName: "alice", reconnect: ReconnectPolicy(initialDelay: .milliseconds(100))),
    logger: logger)
let watching = Task.detached {
    for await event in client.events {
        switch event {
        case .disconnected(let reason): print("client: disconnected (\(reason))")
        case .resumed(let resent): print("client: session resumed, \(resent) messages sent again")
        case .undelivered(let lost): print("client: never acknowledged: \(lost)")  // not in this run
        default: break
        }
    }
}

// `send` returns once the message is kept for the server: sent now, or after the reconnect.
for number in 1...total {
    try await client.send(Note(number: number), type: "note")
}
// snippet.end

// snippet.check
let numbers = await receiving.value
guard numbers == Array(1...total) else {
    print("sessions: received \(numbers.count) notes, not 1...\(total) once each in order")
    exit(1)
}
print("server: all \(total) notes, each once, in order")
if let health = await client.health { print("client:", health) }  // RTT, reconnects, resumes
// snippet.end

await client.close()  // waits for the server's acknowledgements, then ends the session
await server.stop()
// snippet.hide
await watching.value
try? FileManager.default.removeItem(atPath: dataDirectory)
// snippet.show
print("sessions: ok")
