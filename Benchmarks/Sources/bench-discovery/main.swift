// D1: discovery latency across the two-host avahi harness (Benchmarks/d1.sh runs it).
//
//   bench-discovery server --rounds N    (host a) per round: listen, publish "d1-<i>", wait for the
//                                        client's hello, print "CONNECT <i> <ms>", then stop (unpublish
//                                        + close) and print "STOPPED <i> <monotonic ns>"
//   bench-discovery client --rounds N    (host b) browse; for each "d1-<i>": resolve, connect (hello);
//                                        on its removal print "REMOVED <i> <monotonic ns>"
//
// Both hosts share the kernel's CLOCK_MONOTONIC (network namespaces, not time namespaces), so the
// stop-to-removed time is a difference of two processes' readings.
import Discovery
import Foundation
import Logging
import Messaging
import Transport

let serviceType = "_benchd1._tcp"

func monotonicNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }

func die(_ text: String) -> Never {
    FileHandle.standardError.write(Data("bench-discovery: \(text)\n".utf8))
    exit(1)
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard let role = arguments.first else { die("usage: bench-discovery server|client [--rounds N]") }
let rounds = arguments.firstIndex(of: "--rounds").flatMap { Int(arguments[$0 + 1]) } ?? 5
let logger: Logger = {
    var logger = Logger(label: "bench-discovery")
    logger.logLevel = .error
    return logger
}()
// Every process is bounded.
Thread.detachNewThread {
    Thread.sleep(forTimeInterval: 150)
    die("watchdog fired")
}

func channelConfiguration(_ name: String) -> ChannelConfiguration {
    var configuration = ChannelConfiguration(name: name)
    configuration.pingInterval = nil
    return configuration
}

func server() async throws {
    let discovery = ServiceDiscovery(logger: logger, programName: "bench-discovery")
    for round in 0..<rounds {
        let accepted = AsyncStream<MessageChannel>.makeStream()
        let configuration = channelConfiguration("server")
        let listener = try Listener(logger: logger) { socket in
            Task {
                if let channel = try? await MessageChannel.accept(
                    socket, configuration: configuration, logger: logger)
                {
                    accepted.continuation.yield(channel)
                }
            }
        }
        let start = monotonicNanos()
        let published = try await discovery.publish(name: "d1-\(round)", type: serviceType, port: listener.port)
        var iterator = accepted.stream.makeAsyncIterator()
        guard let channel = await iterator.next() else { die("no connection in round \(round)") }
        let connected = monotonicNanos()
        say("CONNECT \(round) \(Double(connected - start) / 1e6)")
        try await Task.sleep(for: .milliseconds(500))
        say("STOPPED \(round) \(monotonicNanos())")
        await published.unpublish()
        channel.close()
        listener.stop()
        try await Task.sleep(for: .milliseconds(2500))  // let the removal reach the other host
    }
    await discovery.shutdown()
}

func client() async throws {
    let discovery = ServiceDiscovery(logger: logger, programName: "bench-discovery-client")
    var removed = 0
    var channels: [String: MessageChannel] = [:]
    for await event in try discovery.browse(type: serviceType) {
        switch event {
        case .added(let service) where service.name.hasPrefix("d1-"):
            let resolved = try await discovery.resolve(service)
            let addresses = resolved.addresses.compactMap {
                try? SocketAddress(ipAddress: $0.numericHost, port: $0.port)
            }
            channels[service.name] = try await MessageChannel.connect(
                to: addresses, configuration: channelConfiguration("client"), logger: logger)
        case .removed(let service) where service.name.hasPrefix("d1-"):
            say("REMOVED \(service.name.dropFirst(3)) \(monotonicNanos())")
            channels.removeValue(forKey: service.name)?.close()
            removed += 1
            if removed == rounds {
                await discovery.shutdown()
                return
            }
        default:
            break
        }
    }
}

do {
    if role == "server" { try await server() } else { try await client() }
} catch {
    die("\(role): \(error)")
}
exit(0)
