import Testing

@testable import Messaging
import ProtocolCore
import Transport
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

    /// The app asks for ``MessageChannel/messages`` on its thread while the loop delivers the first
    /// messages: whichever makes the buffer, the other uses the same one, and every message arrives
    /// once and in order. (CI also runs it under ThreadSanitizer: see ``LazyReference``.)
    @Test func theMessageBufferMadeWhileTheLoopDeliversIsSeenWhole() async throws {
        try await withDeadline {
            for _ in 0..<10 {
                let (client, server) = try await MessageChannel.pair(client: config("client"), server: config("server"), logger: testLogger())
                // The sender starts before the app makes the buffer, so nothing the app does after
                // making it reaches the loop before the loop's first push (no ordering TSan could
                // borrow from a dispatch or a task).
                let sender = Task { for number in 0..<50 { try await server.send(number, type: "number") } }
                var messages = client.messages.makeAsyncIterator()
                var received: [Int] = []
                for _ in 0..<50 { if let number = try await messages.next()?.decode(Int.self) { received.append(number) } }
                try await sender.value
                #expect(received == Array(0..<50))
                client.close()
                _ = await server.closed()
            }
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
    /// A handshake whose task is cancelled before it begins (a stopping server cancels the
    /// handshakes it admitted but has not started) ends at once with the connection closed, in
    /// both security modes. It used to wait forever: the cancellation closed the connection before
    /// the exchange started reading, and the exchange never heard of the close (a server's
    /// `stop()` hung on it in CI under ThreadSanitizer).
    @Test(arguments: [false, true])
    func aHandshakeCancelledBeforeItBeginsEndsAtOnce(encrypted: Bool) async throws {
        var clientConfiguration = config("client"), serverConfiguration = config("server")
        if encrypted {
            clientConfiguration.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
            serverConfiguration.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
        }
        let (client, server) = (clientConfiguration, serverConfiguration)
        let outcome = try await withDeadline(10, "the cancelled handshakes") { () -> String in
            let attempt = Task { () -> String in
                withUnsafeCurrentTask { $0?.cancel() }
                do {
                    _ = try await MessageChannel.pair(client: client, server: server, logger: testLogger())
                    return "connected"
                } catch {
                    return "\(error)"
                }
            }
            return await attempt.value
        }
        #expect(outcome != "connected")
        #expect(outcome.contains("closed"), "\(outcome)")
    }
}
