import FastJSON
import Testing

import ProtocolCore

/// The hello exchange with frames passed by hand between two state machines (no sockets).
@Suite struct HandshakeTests {
    typealias Machine = HandshakeStateMachine

    static func settings(
        _ name: String, key: PreSharedKey? = nil, version: Int = 1, maxFrame: Int = 16 << 20,
        nonce: UInt8 = 0, validator: (@Sendable (PeerInfo) -> String?)? = nil
    ) -> Machine.Settings {
        Machine.Settings(
            info: PeerInfo(version: version, name: name, metadata: ["app": "demo"]), maxFrameSize: maxFrame,
            preSharedKey: key, validator: validator, makeNonce: { [UInt8](repeating: nonce, count: 32) })
    }

    static let key = try! PreSharedKey(bytes: Array("0123456789abcdef0123456789abcdef".utf8))

    /// Runs both machines until neither has anything to send; returns both outcomes.
    static func run(_ client: inout Machine, _ server: inout Machine) -> (
        client: Result<Machine.Established, TransportError>?, server: Result<Machine.Established, TransportError>?
    ) {
        var clientOutcome: Result<Machine.Established, TransportError>?
        var serverOutcome: Result<Machine.Established, TransportError>?
        var toServer = client.start().frames
        var toClient: [Frame] = []
        for _ in 0..<10 where !(toServer.isEmpty && toClient.isEmpty) {
            for frame in toServer {
                let output = server.receive(frame)
                toClient += output.frames
                if let outcome = output.outcome { serverOutcome = outcome }
            }
            toServer = []
            for frame in toClient {
                let output = client.receive(frame)
                toServer += output.frames
                if let outcome = output.outcome { clientOutcome = outcome }
            }
            toClient = []
        }
        return (clientOutcome, serverOutcome)
    }

    @Test func plainHelloEstablishesBothSidesAndExchangesFrameLimits() throws {
        var client = Machine(role: .client, settings: Self.settings("alice", maxFrame: 1 << 20))
        var server = Machine(role: .server, settings: Self.settings("server"))
        let (c, s) = Self.run(&client, &server)
        let clientSide = try #require(try c?.get())
        let serverSide = try #require(try s?.get())
        #expect(clientSide.peer.name == "server" && clientSide.peerMaxFrameSize == 16 << 20)
        #expect(serverSide.peer.name == "alice" && serverSide.peerMaxFrameSize == 1 << 20)
        #expect(serverSide.peer.metadata == ["app": "demo"])
        #expect(client.isDone && server.isDone)
    }

    /// The client's HELLO payload is the spec's test vector (docs/PROTOCOL.md), byte for byte.
    @Test func helloPayloadMatchesTheSpecVector() {
        var client = Machine(role: .client, settings: Self.settings("alice"))
        let hello = client.start().frames[0]
        #expect(hello.kind == .hello && hello.codecID == 1)
        #expect(hello.payload == Vectors.hello.1.payload)
    }

    @Test func versionMismatchIsRefusedWithAReason() throws {
        var client = Machine(role: .client, settings: Self.settings("old", version: 7))
        var server = Machine(role: .server, settings: Self.settings("server"))
        let (c, s) = Self.run(&client, &server)
        #expect(throws: TransportError.self) { try c?.get() }
        if case .failure(let error)? = c { #expect(error.code == .versionMismatch) }
        if case .failure(let error)? = s { #expect(error.code == .versionMismatch) }
    }

    /// A HELLO without a required key, or not JSON at all, gets a REFUSE that says what is wrong —
    /// not a silent close.
    @Test(arguments: [
        #"{"version":1,"metadata":{}}"#, #"{"name":"x"}"#, "not json", #"{"version":"1","name":"x"}"#,
    ])
    func malformedHelloIsRefusedWithBadHello(payload: String) throws {
        var server = Machine(role: .server, settings: Self.settings("server"))
        let output = server.receive(Frame(kind: .hello, codecID: 1, sequence: 1, payload: Array(payload.utf8)))
        let refuse = try #require(output.frames.first)
        #expect(refuse.kind == .refuse)
        let refusal = try FastJSONDecoder().decode(Refusal.self, from: refuse.payload)
        #expect(refusal.code == "bad_hello")
        #expect(refusal.message.contains("version") && refusal.message.contains("name"))
        if case .failure(let error)? = output.outcome { #expect(error.code == .helloFailed) } else {
            Issue.record("the server must fail")
        }
    }

    @Test func metadataAndMaxFrameAreOptional() throws {
        var server = Machine(role: .server, settings: Self.settings("server"))
        let output = server.receive(
            Frame(kind: .hello, codecID: 1, sequence: 1, payload: Array(#"{"version":1,"name":"bare"}"#.utf8)))
        let established = try #require(try output.outcome?.get())
        #expect(established.peer.metadata.isEmpty && established.peerMaxFrameSize == 16 << 20)
        #expect(output.frames.first?.kind == .helloAck)
    }

    @Test func validatorRefuses() throws {
        var client = Machine(role: .client, settings: Self.settings("mallory"))
        var server = Machine(
            role: .server, settings: Self.settings("server", validator: { $0.name == "mallory" ? "not welcome" : nil }))
        let (c, s) = Self.run(&client, &server)
        if case .failure(let error)? = c {
            #expect(error.code == .helloRefused && error.message.contains("not welcome"))
        } else {
            Issue.record("the client must be refused")
        }
        if case .failure(let error)? = s { #expect(error.code == .helloRefused) } else { Issue.record("server") }
    }

    @Test func preSharedKeyOnBothSidesAuthenticatesMutually() throws {
        var client = Machine(role: .client, settings: Self.settings("alice", key: Self.key, nonce: 1))
        var server = Machine(role: .server, settings: Self.settings("server", key: Self.key, nonce: 2))
        let (c, s) = Self.run(&client, &server)
        #expect(try c?.get().peer.name == "server")
        #expect(try s?.get().peer.name == "alice")
    }

    @Test func wrongKeyFailsOnTheClientWhichChecksTheServerFirst() throws {
        let other = try PreSharedKey(bytes: Array("another key, 32 bytes long......".utf8))
        var client = Machine(role: .client, settings: Self.settings("alice", key: other, nonce: 1))
        var server = Machine(role: .server, settings: Self.settings("server", key: Self.key, nonce: 2))
        let (c, _) = Self.run(&client, &server)
        if case .failure(let error)? = c {
            #expect(error.code == .authenticationFailed && error.message.contains("different pre-shared key"))
        } else {
            Issue.record("the client must fail")
        }
    }

    @Test func wrongProofIsRefusedByTheServer() throws {
        var server = Machine(role: .server, settings: Self.settings("server", key: Self.key, nonce: 2))
        let hello = HelloPayload(PeerInfo(name: "forger"), nonce: Hex.encode([UInt8](repeating: 1, count: 32)))
        let ack = server.receive(Machine.jsonFrame(.hello, hello))
        #expect(ack.frames.first?.kind == .helloAck && ack.outcome == nil)
        let output = server.receive(Machine.jsonFrame(.auth, AuthProof(proof: String(repeating: "00", count: 32))))
        #expect(output.frames.first?.kind == .refuse)
        #expect(String(decoding: output.frames[0].payload, as: UTF8.self).contains("auth_failed"))
        if case .failure(let error)? = output.outcome { #expect(error.code == .authenticationFailed) }
    }

    @Test func keyOnOneSideOnly() throws {
        var keyedClient = Machine(role: .client, settings: Self.settings("alice", key: Self.key, nonce: 1))
        var plainServer = Machine(role: .server, settings: Self.settings("server"))
        let (c, _) = Self.run(&keyedClient, &plainServer)
        if case .failure(let error)? = c { #expect(error.message.contains("did not prove")) } else {
            Issue.record("a keyed client must refuse an unkeyed server")
        }
        var plainClient = Machine(role: .client, settings: Self.settings("bob"))
        var keyedServer = Machine(role: .server, settings: Self.settings("server", key: Self.key))
        let (c2, s2) = Self.run(&plainClient, &keyedServer)
        if case .failure(let error)? = c2 { #expect(error.code == .authenticationFailed) } else { Issue.record("c2") }
        if case .failure(let error)? = s2 { #expect(error.code == .authenticationFailed) } else { Issue.record("s2") }
    }

    @Test func unexpectedFramesTimeoutsAndClosesFail() {
        var server = Machine(role: .server, settings: Self.settings("server"))
        let output = server.receive(Frame(kind: .message, typeID: "early", sequence: 1))
        if case .failure(let error)? = output.outcome {
            #expect(error.closeReason == .protocolError("expected HELLO, got message"))
        } else {
            Issue.record("a message before the hello must fail")
        }
        let ignored = server.receive(Frame(kind: .hello))
        #expect(ignored.outcome == nil && ignored.frames.isEmpty)  // over: ignored
        var waiting = Machine(role: .server, settings: Self.settings("server"))
        if case .failure(let error)? = waiting.timedOut(after: .seconds(10)).outcome {
            #expect(error.code == .helloFailed && error.message.contains("10"))
        } else {
            Issue.record("timeout")
        }
        var closing = Machine(role: .client, settings: Self.settings("c"))
        _ = closing.start()
        if case .failure(let error)? = closing.connectionClosed(.reset).outcome {
            #expect(error.closeReason == .reset)
        } else {
            Issue.record("close")
        }
    }
}

/// The protocol's own JSON is written with sorted keys, metadata included (docs/PROTOCOL.md,
/// "Frame kinds"): a Swift dictionary encodes in hash order, which differs between runs, so the
/// same hello or STREAM_START used to come out in different byte orders.
@Suite struct SortedProtocolJSONTests {
    static let metadata = Dictionary(uniqueKeysWithValues: (0..<24).map { ("key\(String($0, radix: 36))-\($0 * 7 % 24)", "\($0)") })
    static let sortedKeys = metadata.keys.sorted()

    static func keys(in json: [UInt8]) -> [String] {
        let text = String(decoding: json, as: UTF8.self)
        return sortedKeys.compactMap { key in text.range(of: "\"\(key)\"").map { (key, $0.lowerBound) } }
            .sorted { $0.1 < $1.1 }.map(\.0)
    }

    @Test func helloMetadataIsSorted() throws {
        let json = try FastJSONEncoder().encode(HelloPayload(PeerInfo(version: 1, name: "n", metadata: Self.metadata)))
        #expect(Self.keys(in: json) == Self.sortedKeys)
    }

    @Test func streamStartMetadataIsSorted() throws {
        let json = try FastJSONEncoder().encode(TransferHeader(size: 1, metadata: Self.metadata))
        #expect(Self.keys(in: json) == Self.sortedKeys)
        #expect(String(decoding: json, as: UTF8.self).hasSuffix(#","size":1}"#))
    }
}

/// A refused client reports the error the REFUSE code names — in version 2 too, where the client
/// used to report every verdict REFUSE as `helloRefused` (docs/PROTOCOL.md, "Verdict").
@Suite struct RefusalCodeTests {
    @Test(arguments: [
        ("bad_hello", TransportError.Code.helloFailed), ("version_mismatch", .versionMismatch), ("refused", .helloRefused),
        ("auth_required", .authenticationFailed), ("auth_failed", .authenticationFailed), ("something_new", .helloRefused),
    ])
    func theCodeChoosesTheError(code: String, expected: TransportError.Code) {
        #expect(Refusal(code: code, message: "m").errorCode == expected)
    }
}
