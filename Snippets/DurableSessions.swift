// Nothing lost when a process dies: a collector (server) keeps its sessions in a store and writes
// each reading to its file, with the reading's session position, before it goes on to the next
// one. This program starts the collector as a child process, sends it 200 readings from a sensor
// (client, with its own store), kills the collector with SIGKILL halfway, starts it again — and
// the file holds every reading exactly once, in order.

import Foundation
import Logging
import Messaging

// snippet.hide
// Bounded: this program ends within 20 seconds whatever happens.
DispatchQueue.global().asyncAfter(deadline: .now() + 20) {
    print("durable: timed out")
    exit(1)
}
let logger = {
    var logger = Logger(label: "durable")
    logger.logLevel = .error
    return logger
}()
struct Reading: Codable, Sendable { var value: Int }
let arguments = CommandLine.arguments
// snippet.show

// snippet.collector
/// The collector: `DurableSessions collector DIR PORT`. Its app's own durable state is its file
/// of effects, each line with the message's session position: a message that comes again after a
/// crash (it was written down, then the process died before it was acknowledged) is skipped.
func collect(directory: String, port: UInt16) async throws {
    var configuration = ServerConfiguration(serviceType: "_collector._tcp", serviceName: "collector")
    configuration.publish = false
    configuration.channel.security = .plaintext
    configuration.listener.port = port
    configuration.listener.loopbackOnly = true
    configuration.session?.store = SessionStore(directory: directory + "/store")  // survives kill -9
    let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
    try await server.start()
    FileHandle.standardOutput.write(Data("READY\n".utf8))  // (unbuffered: the parent waits for it)
    let path = directory + "/readings.txt"
    // The last position written, per session, from the file (the exactly-once recipe).
    var last: [String: UInt64] = [:]
    for line in ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n") {
        let fields = line.split(separator: " ")
        last[String(fields[0])] = UInt64(fields[1])
    }
    let file = FileHandle(forWritingAtPath: path)!
    file.seekToEndOfFile()
    for await event in server.events {
        guard case .received(_, let message) = event, let position = message.sessionPosition else { continue }
        if let done = last[position.session], position.number <= done { continue }  // came again
        let reading = try message.decode(Reading.self)
        file.write(Data("\(position.session) \(position.number) \(reading.value)\n".utf8))
        last[position.session] = position.number
        // The loop's next iteration acknowledges it (SessionAcknowledgement.automatic).
    }
}
// snippet.end

// snippet.hide
if arguments.count == 4, arguments[1] == "collector" {
    try await collect(directory: arguments[2], port: UInt16(arguments[3])!)
    exit(0)
}
let directory = NSTemporaryDirectory() + "lanmsg-durable-\(getpid())"
try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
_ = FileManager.default.createFile(atPath: directory + "/readings.txt", contents: nil)
// A free port for the collector (it comes back on the same one).
let port: UInt16 = {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    return UInt16(bigEndian: address.sin_port)
}()
func startCollector() throws -> Process {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: arguments[0])
    process.arguments = ["collector", directory, "\(port)"]
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    _ = pipe.fileHandleForReading.availableData  // its READY line
    return process
}
// snippet.show

// snippet.sensor
var collector = try startCollector()
var configuration = ClientConfiguration(
    peerName: "sensor", reconnect: ReconnectPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(100)))
configuration.channel.security = .plaintext
configuration.peerMemory = nil
configuration.session?.store = SessionStore(directory: directory + "/sensor")
let sensor = try await MessageClient.connect(to: .host("127.0.0.1", port: port), configuration: configuration, logger: logger)
for value in 1...200 {
    // Returns once the reading is in the sensor's store: sent now, or once the collector is back.
    try await sensor.send(Reading(value: value), type: "reading")
    if value == 100 {
        kill(collector.processIdentifier, SIGKILL)  // readings are in flight, some not handled yet
        collector.waitUntilExit()
        collector = try startCollector()
    }
    try await Task.sleep(for: .milliseconds(2))
}
while sensor.unacknowledgedCount > 0 { try await Task.sleep(for: .milliseconds(10)) }
// snippet.end

// snippet.check
let lines = try String(contentsOfFile: directory + "/readings.txt", encoding: .utf8).split(separator: "\n")
let values = lines.map { Int($0.split(separator: " ")[2])! }
guard values == Array(1...200) else {
    print("durable: the file holds \(values.count) readings, not 1...200 once each in order")
    exit(1)
}
print("collector: all 200 readings once each, in order, across a kill -9")
// snippet.end

// snippet.hide
await sensor.close()
collector.terminate()
collector.waitUntilExit()
try? FileManager.default.removeItem(atPath: directory)
// snippet.show
print("durable: ok")
