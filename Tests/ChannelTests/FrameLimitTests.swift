import FastJSON
import Foundation
import Testing

@testable import Messaging
import ProtocolCore
import Transport

/// The points an independent implementer found in the spec, checked on real sockets: a sender never
/// exceeds the receiver's frame limit, and a malformed HELLO is answered with REFUSE `bad_hello`.
@Suite struct FrameLimitTests {
    /// The peer's `max_frame` is learnt in the hello; a message larger than it fails at the sender
    /// with a clear error, nothing is sent, and the connection stays usable.
    @Test func aMessageLargerThanThePeersLimitIsRefusedBeforeSending() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.connection.maxFrameSize = 64 * 1024
            let server = try TestServer(serverConfig)
            let (client, accepted) = try await server.connectedPair()
            #expect(client.peerMaxFrameSize == 64 * 1024)
            #expect(accepted.peerMaxFrameSize == 16 * 1024 * 1024)
            let tooBig = [UInt8](repeating: 7, count: 64 * 1024)
            await #expect {
                try await client.sendRaw(tooBig, type: "big")
            } throws: { error in
                let error = error as? TransportError
                return error?.code == .frameTooLarge && error?.message.contains("65536") == true
                    && error?.message.contains("transfer") == true
            }
            #expect(throws: TransportError.self) { _ = try client.trySend(tooBig, type: "big") }
            // The largest message that fits: 64 KiB − 12 − type id.
            let fits = [UInt8](repeating: 8, count: 64 * 1024 - 12 - 3)
            try await client.sendRaw(fits, type: "fit")
            var messages = accepted.messages.makeAsyncIterator()
            let received = try #require(await messages.next())
            #expect(received.typeID == "fit" && received.payload.count == fits.count)
            client.close()
        }
    }

    /// The echo case: a request of exactly the receiver's limit cannot be answered with the same
    /// payload (the reply carries an 8-byte reference). The replier gets the error; the requester
    /// is not sent a frame it would have to drop, but the error reply `too_large` at once (it used
    /// to wait for its timeout).
    @Test func anEchoReplyThatWouldExceedTheLimitFailsAtTheReplier() async throws {
        try await withDeadline {
            var clientConfig = config("client")
            clientConfig.connection.maxFrameSize = 32 * 1024
            let server = try TestServer(config("server"))
            let (client, accepted) = try await server.connectedPair(clientConfig)
            let limit = 32 * 1024
            let request = [UInt8](repeating: 1, count: limit - 12 - 4)  // type "echo": exactly the limit
            let requester = Task { try await client.requestRaw(request, type: "echo", timeout: .seconds(2)) }
            var incoming = accepted.messages.makeAsyncIterator()
            let message = try #require(await incoming.next())
            await #expect {
                try await accepted.replyRaw(to: message, bytes: message.payload, type: "echo")
            } throws: { ($0 as? TransportError)?.code == .frameTooLarge }
            // The requester is answered with the error reply; the connection is still open.
            await #expect { _ = try await requester.value } throws: { ($0 as? RemoteError)?.code == "too_large" }
            try await accepted.replyRaw(to: message, bytes: [1], type: "echo")  // a second reply: dropped
            try await client.send(Chat(text: "still open"), type: "chat")
            #expect(await incoming.next()?.typeID == "chat")
            client.close()
        }
    }

    /// Chunks are cut to the receiver's limit: a file streams to a peer with a small limit.
    @Test func transferChunksFitThePeersLimit() async throws {
        try await withDeadline {
            var serverConfig = config("server")
            serverConfig.connection.maxFrameSize = 16 * 1024
            let server = try TestServer(serverConfig)
            let (client, accepted) = try await server.connectedPair()
            #expect(client.maxChunkSize == 16 * 1024 - 20)
            await #expect(throws: TransportError.self) {
                try await client.sendFile(at: "/dev/null", type: "f", chunkSize: 16 * 1024)
            }
            let path = NSTemporaryDirectory() + "chunks-\(UUID().uuidString)"
            let bytes = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
            _ = FileManager.default.createFile(atPath: path, contents: Data(bytes))
            defer { unlink(path) }
            async let sent: Void = client.sendFile(at: path, type: "f", chunkSize: client.maxChunkSize)
            var transfers = accepted.transfers.makeAsyncIterator()
            let transfer = try #require(await transfers.next())
            #expect(try await transfer.collect() == bytes)
            try await sent
            client.close()
        }
    }

    /// A HELLO without the required `name`, or not JSON at all, is answered with REFUSE
    /// `bad_hello` saying what is missing — not closed silently.
    @Test(arguments: [#"{"version":1}"#, "hello?"])
    func malformedHelloGetsBadHello(payload: String) async throws {
        try await withDeadline {
            let server = try TestServer(config("server"), families: [.ipv4])
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.write(Frame(kind: .hello, codecID: 1, sequence: 1, payload: Array(payload.utf8)))
            let answer = try await blocking { try raw.readFrame() }
            #expect(answer.kind == .refuse)
            let refusal = try FastJSONDecoder().decode(Refusal.self, from: answer.payload)
            #expect(refusal.code == "bad_hello")
            #expect(refusal.message.contains("name"))
            guard case .failure(let error) = try await server.next() else {
                Issue.record("the server accepted a malformed hello")
                return
            }
            #expect(error.code == .helloFailed)
        }
    }
}
