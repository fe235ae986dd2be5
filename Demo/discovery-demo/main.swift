import ArgumentParser
import Discovery
import Foundation
import Logging
import Locks

/// A small DNS-SD tool on the Discovery module: publish a service, or browse and resolve.
@main
struct DiscoveryDemo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "discovery-demo",
        abstract: "Publish, browse and resolve DNS-SD services through Avahi.",
        subcommands: [Publish.self, Browse.self])
}

struct Common: ParsableArguments {
    @Option(help: "Service type.") var type = "_discovery-demo._tcp"
    @Option(help: "Log level (trace, debug, info, notice, warning, error).") var logLevel = "warning"

    func makeLogger() -> Logger {
        ServiceDiscovery.onBackendChosen { kind, reason in FileHandle.standardError.write(Data("discovery-demo: discovery backend: \(kind) (\(reason))\n".utf8)) }
        var logger = Logger(label: "discovery-demo") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .warning
        return logger
    }
}

struct Publish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Publish a service until interrupted or --duration passes.")
    @OptionGroup var common: Common
    @Argument(help: "Service name (default: \"discovery-demo on <host>\").") var name: String?
    @Option(help: "Port to announce.") var port: UInt16 = 4242
    @Option(help: "A TXT entry key=value (repeatable).") var txt: [String] = []
    @Option(help: "Stop after this many seconds (default: run until interrupted).") var duration: Double?

    func run() async throws {
        let discovery = ServiceDiscovery(logger: common.makeLogger(), programName: "discovery-demo")
        var record = TXTRecord()
        for entry in txt {
            let parts = entry.split(separator: "=", maxSplits: 1)
            record[String(parts[0])] = parts.count > 1 ? String(parts[1]) : ""
        }
        let service = try await discovery.publish(name: name, type: common.type, port: port, txt: record)
        let events = Task {
            for await event in service.events {
                emit("publish: \(event)")
            }
        }
        if let duration {
            try await Task.sleep(for: .seconds(duration))
        } else {
            try await Task.sleep(for: .seconds(86400 * 365))  // until SIGINT/SIGTERM ends the process
        }
        await service.unpublish()
        await discovery.shutdown()
        events.cancel()
    }
}

struct Browse: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Browse for services and resolve each one found.")
    @OptionGroup var common: Common
    @Option(help: "Stop after this many seconds.") var timeout: Double = 5
    @Flag(help: "Stop after the first service is resolved.") var first = false

    func run() async throws {
        let discovery = ServiceDiscovery(logger: common.makeLogger(), programName: "discovery-demo")
        let browser = try discovery.browse(type: common.type)
        let resolvedCount = Counter()
        let stopAfterFirst = first
        let seconds = timeout
        let found = await withTaskGroup(of: Int.self) { group in
            group.addTask {
                var count = 0
                defer { resolvedCount.value.withLock { $0 = count } }
                for await event in browser {
                    emit("browse: \(event)")
                    if case .added(let service) = event {
                        do {
                            let resolved = try await discovery.resolve(service)
                            emit("resolved: \(resolved)")
                            count += 1
                            if stopAfterFirst { return count }
                        } catch {
                            emit("resolve failed: \(error)")
                        }
                    }
                }
                return count
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(seconds))
                return -1
            }
            _ = await group.next()
            group.cancelAll()
            return resolvedCount.value.withLock { $0 }
        }
        if found == 0 { emit("no services of type \(common.type) resolved within \(timeout)s") }
        await discovery.shutdown()
    }
}

/// Writes one line to standard output at once (unbuffered, so scripts see it immediately).
func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

final class Counter: Sendable {
    let value = Locked(0)
}
