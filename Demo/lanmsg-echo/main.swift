import ArgumentParser
import Foundation
import Logging
import Messaging

/// A tiny published echo server: replies to every request with the same payload (or, when that
/// would exceed the client's frame limit, with the error `too_large`), and to "echo.stats" with how
/// many messages it saw. Used by the integration tests and the demo.
@main
struct EchoServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lanmsg-echo",
        abstract: "A published echo server (replies to every request with its payload).")

    @Option(help: "Service name to publish.") var name = "Echo"
    @Option(help: "Service type.") var type = "_lanmsg-echo._tcp"
    @Option(help: "Port (0: kernel-assigned).") var port: UInt16 = 0
    @Option(help: "Log level.") var logLevel = "warning"

    func run() async throws {
        var logger = Logger(label: "lanmsg-echo") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .warning
        let discovery = ServiceDiscovery(logger: logger, programName: "lanmsg-echo")
        var configuration = ServerConfiguration(serviceType: type, serviceName: name)
        configuration.listener.port = port
        let server = MessageServer(configuration: configuration, discovery: discovery, logger: logger)
        try await server.start()
        say("listening on port \(server.port ?? 0)")
        var count = 0
        for await event in server.events {
            switch event {
            case .published(let name):
                say("published as \(name)")
            case .received(let connection, let message):
                count += 1
                guard message.expectsReply else { continue }  // one-way messages are only counted
                if message.typeID == "echo.stats" {
                    try? await connection.reply(to: message, with: count, type: "echo.stats")
                    continue
                }
                do {
                    try await connection.channel.replyRaw(to: message, bytes: message.payload, type: message.typeID)
                } catch let error as TransportError where error.code == .frameTooLarge {
                    // The echo would not fit the client's frame limit (a reply carries 8 more bytes).
                    try? await connection.reply(to: message, error: RemoteError(code: "too_large", message: error.message))
                } catch {
                    say("reply to \(connection) failed: \(error)")
                }
            case .transfer(_, let transfer):
                transfer.discard()
            default:
                say("\(event)")
            }
        }
    }

    func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }
}
