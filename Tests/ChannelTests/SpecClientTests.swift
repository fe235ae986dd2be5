import Foundation
import Testing

@testable import Messaging
import ProtocolCore
import Transport

@Suite struct SpecClientTests {
    /// Runs the Python client written from docs/PROTOCOL.md against a live in-process server on 127.0.0.1.
    @Test(.enabled(if: SpecClientTests.python != nil, "python3 not found"))
    func pythonSpecClientTalksToTheServer() async throws {
        try await withDeadline(60, "python spec client") {
            var serverConfig = config("swift-server")
            serverConfig.pingInterval = .milliseconds(20)  // the client must skip/answer pings
            let server = try TestServer(serverConfig, families: [.ipv4])
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("spec-\(UUID())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: directory) }
            let script = directory.appendingPathComponent("spec_client.py")
            try specClientPython.write(to: script, atomically: true, encoding: .utf8)

            let process = Process()
            process.executableURL = URL(fileURLWithPath: try #require(SpecClientTests.python))
            process.arguments = [script.path, "127.0.0.1", String(server.port)]
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            let exited = AsyncStream.makeStream(of: Int32.self)
            process.terminationHandler = { exited.continuation.yield($0.terminationStatus) }
            try process.run()

            let channel = try await server.nextChannel()
            #expect(channel.peer.name == "python-spec-client" && channel.peer.metadata == ["lang": "python"])
            var messages = channel.messages.makeAsyncIterator()
            let request = try #require(await messages.next())
            #expect(request.typeID == "spec.echo" && request.codecID == 1)
            let chat = try request.decode(Chat.self)
            try await channel.reply(to: request, with: Chat(text: chat.text.uppercased()), type: "spec.echo.reply")
            #expect(await channel.closed() == .goodbye("done"))

            var statuses = exited.stream.makeAsyncIterator()
            let status = await statuses.next()
            let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            #expect(status == 0, "python output: \(text)")
            #expect(text == "hello-ack swift-server\nreply spec.echo.reply 1 HELLO FROM PYTHON\nclosed\n")
        }
    }

    static let python: String? =
        ["/usr/bin/python3", "/usr/local/bin/python3"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }
        ?? ProcessInfo.processInfo.environment["PATH"]?.split(separator: ":")
        .map { "\($0)/python3" }.first { FileManager.default.isExecutableFile(atPath: $0) }
}
