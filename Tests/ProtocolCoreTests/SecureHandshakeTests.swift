import Crypto
import Testing

@testable import ProtocolCore

/// The version-2 handshake and transport without sockets: both sides in memory.
@Suite struct SecureHandshakeTests {
    static func settings(
        _ name: String, key: Curve25519.KeyAgreement.PrivateKey = .init(), psk: [UInt8]? = nil,
        verify: @escaping @Sendable (ProvenPeer) -> String? = { _ in nil }
    ) -> SecureHandshake.Settings {
        .init(
            info: PeerInfo(version: 2, name: name), maxFrameSize: 1 << 20, staticKey: key, preSharedKey: psk,
            verify: verify)
    }

    struct Run {
        var client: SecureHandshake
        var server: SecureHandshake
        var clientOutcome: Result<ProvenPeer, TransportError>?
        var serverOutcome: Result<ProvenPeer, TransportError>?
        /// Every byte each side sent, in order.
        var clientBytes: [UInt8] = []
        var serverBytes: [UInt8] = []
    }

    /// Runs both sides to the end, delivering `chunk` bytes at a time.
    static func run(
        client: SecureHandshake.Settings, server: SecureHandshake.Settings, chunk: Int = .max,
        clientEphemeral: Curve25519.KeyAgreement.PrivateKey? = nil,
        serverEphemeral: Curve25519.KeyAgreement.PrivateKey? = nil
    ) throws -> Run {
        var run = Run(
            client: try SecureHandshake(role: .client, settings: client, ephemeral: clientEphemeral),
            server: try SecureHandshake(role: .server, settings: server, ephemeral: serverEphemeral))
        var toServer = run.client.start().bytes
        run.clientBytes += toServer
        var toClient: [UInt8] = []
        for _ in 0..<1000 where !toServer.isEmpty || !toClient.isEmpty {
            while !toServer.isEmpty {
                let piece = Array(toServer.prefix(chunk))
                toServer.removeFirst(piece.count)
                let output = run.server.receive(piece)
                toClient += output.bytes
                run.serverBytes += output.bytes
                if let outcome = output.outcome { run.serverOutcome = outcome }
            }
            while !toClient.isEmpty {
                let piece = Array(toClient.prefix(chunk))
                toClient.removeFirst(piece.count)
                let output = run.client.receive(piece)
                toServer += output.bytes
                run.clientBytes += output.bytes
                if let outcome = output.outcome { run.clientOutcome = outcome }
            }
        }
        return run
    }

    @Test(arguments: [Int.max, 1, 7])
    func bothSidesProveEachOtherAndAgreeOnTheCode(chunk: Int) throws {
        let clientKey = Curve25519.KeyAgreement.PrivateKey()
        let serverKey = Curve25519.KeyAgreement.PrivateKey()
        let run = try Self.run(
            client: Self.settings("alice", key: clientKey), server: Self.settings("server", key: serverKey), chunk: chunk)
        let server = try #require(try run.clientOutcome?.get())
        let client = try #require(try run.serverOutcome?.get())
        #expect(server.publicKey == Array(serverKey.publicKey.rawRepresentation))
        #expect(client.publicKey == Array(clientKey.publicKey.rawRepresentation))
        #expect(server.info.name == "server")
        #expect(client.info.name == "alice")
        #expect(client.maxFrameSize == 1 << 20)
        #expect(server.handshakeHash == client.handshakeHash)
        let code = SecureProtocol.comparisonCode(handshakeHash: server.handshakeHash)
        #expect(code.count == 7)
        #expect(code == SecureProtocol.comparisonCode(handshakeHash: client.handshakeHash))
        #expect(Array(run.clientBytes.prefix(8)) == Array("LANMSG/2".utf8))
        // Transport both ways, across a message boundary split.
        let (clientSend, clientReceive) = try run.client.transport()
        let (serverSend, serverReceive) = try run.server.transport()
        var toServer = SecureTransport(send: clientSend, receive: clientReceive)
        var atServer = SecureTransport(send: serverSend, receive: serverReceive)
        let sealed = try toServer.seal(Array("hello".utf8)) + toServer.seal(Array(" world".utf8))
        #expect(try atServer.open(sealed.prefix(10)) == [])
        #expect(atServer.pendingBytes == 10)
        #expect(try atServer.open(sealed.dropFirst(10)) == Array("hello world".utf8))
        #expect(try toServer.open(atServer.seal([9])) == [9])
    }

    @Test func thePlaintextNeverAppearsOnTheWire() throws {
        let run = try Self.run(client: Self.settings("a-very-distinct-name"), server: Self.settings("server-name-xyz"))
        let (send, receive) = try run.client.transport()
        var transport = SecureTransport(send: send, receive: receive)
        let secret = Array("the secret chat line".utf8)
        let wire = run.clientBytes + run.serverBytes + (try transport.seal(secret))
        for needle in ["a-very-distinct-name", "server-name-xyz", "the secret chat line"] {
            #expect(!Self.contains(wire, Array(needle.utf8)), "\(needle) is visible")
        }
    }

    static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard haystack.count >= needle.count else { return false }
        return (0...(haystack.count - needle.count)).contains { Array(haystack[$0..<($0 + needle.count)]) == needle }
    }

    @Test func theClientRefusesAServerItsPolicyRejects() throws {
        let run = try Self.run(
            client: Self.settings("alice", verify: { _ in "not the pinned key" }), server: Self.settings("server"))
        guard case .failure(let error) = run.clientOutcome else { Issue.record("client accepted"); return }
        #expect(error.code == .authenticationFailed)
        #expect(error.message.contains("not the pinned key"))
        #expect(run.serverOutcome == nil)  // the server never got message 3
    }

    @Test func theServerRefusesAClientItsPolicyRejects() throws {
        let run = try Self.run(
            client: Self.settings("alice"), server: Self.settings("server", verify: { $0.info.name == "alice" ? "unknown" : nil }))
        guard case .failure(let error) = run.serverOutcome else { Issue.record("server accepted"); return }
        #expect(error.code == .authenticationFailed)
        #expect((try? run.clientOutcome?.get()) != nil)  // the client finished its part; the server then refuses
    }

    @Test func aSharedKeySelectsXXpsk3AndAMismatchFails() throws {
        let psk = [UInt8](repeating: 7, count: 32)
        let good = try Self.run(client: Self.settings("a", psk: psk), server: Self.settings("s", psk: psk))
        #expect((try? good.clientOutcome?.get()) != nil)
        #expect((try? good.serverOutcome?.get()) != nil)
        let bad = try Self.run(
            client: Self.settings("a", psk: psk), server: Self.settings("s", psk: [UInt8](repeating: 8, count: 32)))
        // XXpsk3 mixes the key into message 3: the client finishes its part, the server cannot read it.
        guard case .failure(let error) = bad.serverOutcome else { Issue.record("server accepted"); return }
        #expect(error.code == .authenticationFailed)
        #expect(error.message.contains("pre-shared key"))
        let oneSided = try Self.run(client: Self.settings("a"), server: Self.settings("s", psk: psk))
        #expect((try? oneSided.serverOutcome?.get()) == nil)
        #expect((try? oneSided.clientOutcome?.get()) == nil)
    }

    @Test func aVersionOneHelloIsNotAPreamble() throws {
        var server = try SecureHandshake(role: .server, settings: Self.settings("s"))
        let output = server.receive([0, 0, 0, 20, 0x01, 0x00] + Array("{\"version\":1}".utf8))
        guard case .failure(let error) = output.outcome else { Issue.record("accepted"); return }
        #expect(error.code == .protocolViolation)
    }

    @Test func aReplayedHandshakeFails() throws {
        // A recording of a whole client side, played to a fresh server: message 3 was made for the
        // recorded server's ephemeral key, so it fails authentication.
        let first = try Self.run(client: Self.settings("a"), server: Self.settings("s"))
        var server = try SecureHandshake(role: .server, settings: Self.settings("s"))
        let output = server.receive(first.clientBytes)
        guard case .failure(let error) = output.outcome else { Issue.record("replay accepted"); return }
        #expect(error.code == .authenticationFailed)
    }

    @Test func bytesAfterTheLastHandshakeMessageAreLeftOver() throws {
        // The client's first transport message arrives in the same read as handshake message 3.
        var client = try SecureHandshake(role: .client, settings: Self.settings("a"))
        var server = try SecureHandshake(role: .server, settings: Self.settings("s"))
        let message2 = server.receive(client.start().bytes).bytes
        let message3 = client.receive(message2).bytes
        var transport = SecureTransport(
            send: try client.transport().send, receive: try client.transport().receive)
        let output = server.receive(message3 + (try transport.seal([1, 2, 3])))
        #expect((try? output.outcome?.get()) != nil)
        let (send, receive) = try server.transport()
        var serverTransport = SecureTransport(send: send, receive: receive)
        #expect(try serverTransport.open(server.leftover) == [1, 2, 3])
    }

    @Test func eachDirectionRekeysEvery65536MessagesInStep() throws {
        let run = try Self.run(client: Self.settings("a"), server: Self.settings("s"))
        let (send, _) = try run.client.transport()
        let (_, receive) = try run.server.transport()
        var sender = SecureTransport(send: send, receive: NoiseCipherState())
        var receiver = SecureTransport(send: NoiseCipherState(), receive: receive)
        var plain = send
        var last: [UInt8] = []
        for index in 0..<(Int(SecureProtocol.rekeyInterval) + 2) {
            let payload = [UInt8(truncatingIfNeeded: index)]
            let sealed = try sender.seal(payload)
            #expect(try receiver.open(sealed) == payload)
            if index == Int(SecureProtocol.rekeyInterval) {
                // A cipher that did not rekey encrypts this message differently.
                last = sealed
            } else if index < Int(SecureProtocol.rekeyInterval) {
                _ = try plain.encrypt(ad: [], payload)
            }
        }
        let unrekeyed = SecureHandshake.framed(try plain.encrypt(ad: [], [UInt8(truncatingIfNeeded: SecureProtocol.rekeyInterval)]))
        #expect(unrekeyed != last)
    }

    @Test func aFlippedBitFailsTheMessage() throws {
        let run = try Self.run(client: Self.settings("a"), server: Self.settings("s"))
        var sender = SecureTransport(send: try run.client.transport().send, receive: NoiseCipherState())
        var receiver = SecureTransport(send: NoiseCipherState(), receive: try run.server.transport().receive)
        var sealed = try sender.seal(Array("payload".utf8))
        sealed[5] ^= 0x10
        #expect(throws: NoiseError.self) { _ = try receiver.open(sealed) }
    }
}
