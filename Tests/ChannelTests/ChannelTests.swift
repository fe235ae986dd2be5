import Foundation
import Testing

@testable import Messaging
import ProtocolCore
import Transport

struct Chat: Codable, Sendable, Equatable {
    var text: String
}

@Suite struct ChannelTests {
    @Test func helloAndMessageBothWays() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.metadata = ["role": "server"]
            let server = try TestServer(serverConfig)
            var clientConfig = config("client")
            clientConfig.metadata = ["app": "test"]
            let (client, accepted) = try await server.connectedPair(clientConfig)
            #expect(client.peer.name == "server" && client.peer.metadata == ["role": "server"])
            #expect(accepted.peer.name == "client" && accepted.peer.metadata == ["app": "test"])

            try await client.send(Chat(text: "hi"), type: "chat.message")
            var serverMessages = accepted.messages.makeAsyncIterator()
            let message = try #require(await serverMessages.next())
            #expect(message.typeID == "chat.message" && message.codecID == 1 && message.replyTo == nil)
            #expect(try message.decode(Chat.self) == Chat(text: "hi"))
            try await accepted.sendRaw([1, 2, 3], type: "raw")
            var clientMessages = client.messages.makeAsyncIterator()
            let raw = try #require(await clientMessages.next())
            #expect(raw.payload == [1, 2, 3] && raw.codecID == 0 && raw.typeID == "raw")

            // Sequence numbers really count: HELLO was 1, so the first message is 2.
            #expect(message.sequence == 2)
            try await client.send(Chat(text: "again"), type: "chat.message")
            #expect(await serverMessages.next()?.sequence == 3)

            client.close(reason: "done")
            #expect(await accepted.closed() == .goodbye("done"))
            #expect(await client.closed() == .localClose)
            #expect(await serverMessages.next() == nil)
        }
    }

    @Test func versionMismatchIsRefusedOnBothSides() async throws {
        try await withDeadline {
            let server = try TestServer()
            var clientConfig = config("old-client")
            clientConfig.protocolVersion = 99
            await #expect {
                _ = try await MessageChannel.connect(to: [server.v4], configuration: clientConfig, logger: testLogger())
            } throws: { error in
                let error = error as? TransportError
                return error?.code == .versionMismatch && error?.message.contains("version") == true
            }
            guard case .failure(let serverError) = try await server.next() else {
                Issue.record("server accepted a mismatched version")
                return
            }
            #expect(serverError.code == .versionMismatch)
        }
    }

    @Test func helloValidatorRefuses() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.helloValidator = { $0.name == "mallory" ? "not welcome" : nil }
            let server = try TestServer(serverConfig)
            await #expect {
                _ = try await MessageChannel.connect(
                    to: [server.v4], configuration: config("mallory"), logger: testLogger())
            } throws: { ($0 as? TransportError)?.code == .helloRefused }
            #expect(try await server.next().mapError { $0 }.isFailure)
        }
    }

    @Test func ipv4AndIPv6LoopbackWithOneListenerPort() async throws {
        try await withDeadline {
            let server = try TestServer()
            #expect(server.listener.families == [.ipv4, .ipv6])
            let ports = server.listener.boundAddresses.map(\.port)
            #expect(ports.count == 2 && ports[0] == ports[1] && ports[0] == server.port)
            let v4 = try await MessageChannel.connect(
                to: [server.v4], configuration: config("v4"), logger: testLogger())
            _ = try await server.nextChannel()
            let v6 = try await MessageChannel.connect(
                to: [.ipv6Loopback(port: server.port)], configuration: config("v6"), logger: testLogger())
            let accepted6 = try await server.nextChannel()
            #expect(v4.remoteAddress?.family == .ipv4)
            #expect(v6.remoteAddress?.family == .ipv6)
            #expect(accepted6.remoteAddress?.family == .ipv6)
            v4.abort()
            v6.abort()
        }
    }

    @Test func fixedPortWhenAsked() async throws {
        let port = try deadPort()
        var configuration = Listener.Configuration()
        configuration.port = port
        configuration.loopbackOnly = true
        let listener = try Listener(configuration: configuration, logger: testLogger()) { _ in }
        #expect(listener.port == port && listener.boundAddresses.allSatisfy { $0.port == port })
        listener.stop()
        #expect(throws: TransportError.self) {
            let a = try Listener(configuration: configuration, logger: testLogger()) { _ in }
            let b = try Listener(configuration: configuration, logger: testLogger()) { _ in }  // EADDRINUSE
            a.stop()
            b.stop()
        }
    }

    @Test func listenerStopIsIdempotent() throws {
        let server = try TestServer()
        server.listener.stop()
        server.listener.stop()
    }
}

extension Result {
    var isFailure: Bool {
        if case .failure = self { return true }
        return false
    }
}
