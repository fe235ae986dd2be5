import Foundation
import Testing

@testable import Messaging
import ProtocolCore
import Transport

@Suite struct PreSharedKeyTests {
    let key = try! PreSharedKey(bytes: Array("correct horse battery staple!!".utf8))
    let otherKey = try! PreSharedKey(bytes: Array("a completely different secret".utf8))

    func keyed(_ name: String, _ key: PreSharedKey?) -> ChannelConfiguration {
        var configuration = config(name)
        configuration.preSharedKey = key
        configuration.helloTimeout = .seconds(5)
        return configuration
    }

    @Test func sameKeyConnectsAndMessagesFlow() async throws {
        let server = try TestServer(keyed("server", key))
        let client = try await MessageChannel.connect(to: [server.v4], configuration: keyed("client", key), logger: testLogger())
        let accepted = try await server.nextChannel()
        #expect(accepted.peer.name == "client" && client.peer.name == "server")
        try await client.send("secret stuff", type: "note")
        var iterator = accepted.messages.makeAsyncIterator()
        let message = try #require(await iterator.next())
        #expect(try message.decode(String.self) == "secret stuff")
        client.close()
    }

    @Test func clientWithoutKeyIsRefusedWithAClearError() async throws {
        let server = try TestServer(keyed("server", key))
        do {
            _ = try await MessageChannel.connect(to: [server.v4], configuration: keyed("nokey", nil), logger: testLogger())
            Issue.record("a client without the key got in")
        } catch let error as TransportError {
            #expect(error.code == .authenticationFailed)
            #expect(error.message.contains("pre-shared key"))
        }
        let serverSide = try await server.next()
        guard case .failure(let error) = serverSide else { Issue.record("server accepted a client without key"); return }
        #expect(error.code == .authenticationFailed)
    }

    @Test func wrongKeyFailsOnBothSides() async throws {
        let server = try TestServer(keyed("server", key))
        do {
            _ = try await MessageChannel.connect(to: [server.v4], configuration: keyed("wrong", otherKey), logger: testLogger())
            Issue.record("a client with the wrong key got in")
        } catch let error as TransportError {
            #expect(error.code == .authenticationFailed)
            #expect(error.message.contains("different pre-shared key"))
        }
        guard case .failure = try await server.next() else { Issue.record("server accepted a wrong key"); return }
    }

    @Test func clientWithKeyRefusesAServerWithout() async throws {
        let server = try TestServer(keyed("open", nil))
        do {
            _ = try await MessageChannel.connect(to: [server.v4], configuration: keyed("careful", key), logger: testLogger())
            Issue.record("client accepted an unauthenticated server")
        } catch let error as TransportError {
            #expect(error.code == .authenticationFailed)
            #expect(error.message.contains("did not prove"))
        }
    }

    /// A proof computed for one session is useless in the next: the server's nonce is fresh.
    @Test func replayedHelloAndProofAreRefused() async throws {
        let server = try TestServer(keyed("server", key))
        let clientNonce = [UInt8](repeating: 7, count: 32)
        func hello() throws -> Frame {
            let payload = try FoundationJSONCodec().encode(
                HelloPayload(PeerInfo(name: "replayer"), nonce: Hex.encode(clientNonce)))
            return Frame(kind: .hello, codecID: 1, sequence: 1, payload: payload)
        }
        // Session 1: a legitimate exchange, recorded.
        let first = try RawClient(port: server.port)
        try first.write(hello())
        let ack = try await blocking { try first.readFrame() }
        let challenge = try #require(try JSONDecoder().decode(HelloPayload.self, from: Data(ack.payload)).auth)
        let serverNonce = try #require(Hex.decode(challenge.nonce))
        let proof = AuthProof(proof: Hex.encode(key.clientProof(clientNonce: clientNonce, serverNonce: serverNonce)))
        let authFrame = Frame(kind: .auth, codecID: 1, sequence: 2, payload: try FoundationJSONCodec().encode(proof))
        try first.write(authFrame)
        #expect(try await blocking { try first.readFrame() }.kind == .authOK)
        guard case .success(let channel) = try await server.next() else { Issue.record("legit session refused"); return }
        channel.close()
        first.close()
        // Session 2: the captured bytes replayed verbatim.
        let second = try RawClient(port: server.port)
        try second.write(hello())
        let secondAck = try await blocking { try second.readFrame() }
        let secondChallenge = try #require(try JSONDecoder().decode(HelloPayload.self, from: Data(secondAck.payload)).auth)
        #expect(secondChallenge.nonce != challenge.nonce)
        try second.write(authFrame)
        let refusal = try await blocking { try second.readFrame() }
        #expect(refusal.kind == .refuse)
        #expect(String(decoding: refusal.payload, as: UTF8.self).contains("auth_failed"))
        guard case .failure(let error) = try await server.next() else { Issue.record("replay accepted"); return }
        #expect(error.code == .authenticationFailed)
        second.close()
    }

    /// What a keyed client puts on the wire contains nonces and HMACs, never the key.
    @Test func theKeyNeverTravels() async throws {
        let secret = Array("correct horse battery staple!!".utf8)
        let server = try TestServer(keyed("server", key))
        let client = try await MessageChannel.connect(to: [server.v4], configuration: keyed("client", key), logger: testLogger())
        _ = try await server.nextChannel()
        // Re-run the client side by hand to see its bytes.
        let raw = try RawClient(port: server.port)
        let nonce = [UInt8](repeating: 1, count: 32)
        let helloBytes = try Frame(
            kind: .hello, codecID: 1, sequence: 1,
            payload: FoundationJSONCodec().encode(HelloPayload(PeerInfo(name: "x"), nonce: Hex.encode(nonce)))
        ).encoded()
        try raw.write(helloBytes)
        let ack = try await blocking { try raw.readFrame() }
        let wire = helloBytes + ack.payload
        #expect(!contains(wire, secret) && !contains(wire, Array(Hex.encode(secret).utf8)))
        raw.close()
        client.close()
    }

    func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count else { return false }
        for start in 0...(haystack.count - needle.count) where Array(haystack[start..<start + needle.count]) == needle {
            return true
        }
        return false
    }

    @Test func keyFileIsTrimmedAndShortKeysRejected() throws {
        let path = NSTemporaryDirectory() + "psk-\(UUID().uuidString)"
        try "  0123456789abcdef0123\n".write(toFile: path, atomically: true, encoding: .utf8)
        defer { unlink(path) }
        let fromFile = try PreSharedKey(contentsOfFile: path)
        #expect(fromFile.keyBytes == Array("0123456789abcdef0123".utf8))
        #expect(throws: TransportError.self) { try PreSharedKey(bytes: Array("short".utf8)) }
        #expect(throws: FileError.self) { try PreSharedKey(contentsOfFile: "/nonexistent/key") }
    }

    /// RFC 4231 test case 2 style check that the HMAC is HMAC-SHA256 over label || a || b.
    @Test func proofIsHMACSHA256() throws {
        let k = try PreSharedKey(bytes: Array("Jefe".utf8) + Array(repeating: 0, count: 12))
        let viaProof = k.proof("what do ya want ", Array("for ".utf8), Array("nothing?".utf8))
        // HMAC-SHA256(key = "Jefe" padded with zeros to 16 bytes) equals HMAC with key "Jefe":
        // keys are zero-padded to the block size, so this is RFC 4231 test case 2.
        #expect(Hex.encode(viaProof) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }
}
