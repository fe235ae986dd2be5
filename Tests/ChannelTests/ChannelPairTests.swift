import Testing

@testable import Messaging
@testable import ProtocolCore
@testable import Transport
import TestSupport

/// ``MessageChannel/pair(client:server:logger:)``: the in-memory transport for tests above the
/// channel — two channels joined by a socket pair, no listener, no port.
@Suite struct ChannelPairTests {
    @Test func messagesAndRequestsFlowBothWays() async throws {
        try await withDeadline {
            let (client, server) = try await MessageChannel.pair(client: config("client"), server: config("server"), logger: testLogger())
            #expect(client.peer.name == "server" && server.peer.name == "client")
            #expect(client.remoteAddress == nil && server.remoteAddress == nil)  // no IP address to speak of
            server.on(type: "echo", as: String.self) { [weak server] text, message in
                _ = try? server?.trySend(text.uppercased(), type: "echoed", replyTo: message.sequence)
            }
            #expect(try await client.request("hello", type: "echo", expecting: String.self) == "HELLO")
            try await server.send("from the server", type: "note")
            var messages = client.messages.makeAsyncIterator()
            #expect(try await messages.next()?.decode(String.self) == "from the server")
            client.close(reason: "done")
            #expect(await server.closed() == .goodbye("done"))
        }
    }

    @Test func theEncryptedHandshakeRunsOverThePair() async throws {
        try await withDeadline {
            let clientIdentity = Identity.ephemeral(), serverIdentity = Identity.ephemeral()
            var clientConfiguration = config("client")
            clientConfiguration.security = .encrypted(identity: clientIdentity, trust: .anyKey)
            var serverConfiguration = config("server")
            serverConfiguration.security = .encrypted(identity: serverIdentity, trust: .anyKey)
            let (client, server) = try await MessageChannel.pair(
                client: clientConfiguration, server: serverConfiguration, logger: testLogger())
            #expect(client.peerIdentity?.fingerprint == serverIdentity.fingerprint)
            #expect(server.peerIdentity?.fingerprint == clientIdentity.fingerprint)
            try await client.sendRaw([UInt8](repeating: 1, count: 100_000), type: "bulk")
            var messages = server.messages.makeAsyncIterator()
            #expect(await messages.next()?.payload.count == 100_000)
            client.close()
        }
    }

    @Test func aFailedHandshakeIsThrown() async throws {
        try await withDeadline {
            var clientConfiguration = config("client")
            clientConfiguration.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
            // A plaintext-only server refuses the encrypted client: both sides' failure is thrown.
            await #expect(throws: TransportError.self) {
                _ = try await MessageChannel.pair(client: clientConfiguration, server: config("server"), logger: testLogger())
            }
        }
    }
}
