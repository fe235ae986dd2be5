import Dispatch
import Foundation
import Locks
import Testing

@testable import Messaging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// Protocol version 2 on real loopback sockets: the Noise handshake, the encrypted transport, trust
/// policies, downgrade refusal, and what an on-path relay sees and can do.
@Suite("Encrypted channels (version 2)")
struct SecureChannelTests {
    static func secure(
        _ name: String, identity: Identity = .ephemeral(), trust: TrustPolicy = .anyKey, psk: String? = nil
    ) -> ChannelConfiguration {
        var configuration = config(name)
        configuration.security = .encrypted(identity: identity, trust: trust)
        if let psk { configuration.preSharedKey = try! PreSharedKey(bytes: Array(psk.utf8)) }
        return configuration
    }

    /// Answers every request on `channel` with its own payload.
    static func echo(_ channel: MessageChannel) -> Task<Void, Never> {
        Task {
            for await message in channel.messages where message.expectsReply {
                try? await channel.replyRaw(to: message, bytes: message.payload, type: message.typeID)
            }
        }
    }

    static func temporaryDirectory() -> String {
        let path = NSTemporaryDirectory() + "lanmsg-secure-\(UUID().uuidString)"
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    @Test("both sides prove their keys, see the same comparison code, and exchange small and large messages")
    func encryptedExchange() async throws {
        try await withDeadline(60) {
            let serverIdentity = Identity.ephemeral()
            let clientIdentity = Identity.ephemeral()
            let server = try TestServer(Self.secure("server", identity: serverIdentity))
            let (client, accepted) = try await server.connectedPair(Self.secure("client", identity: clientIdentity))
            let echo = Self.echo(accepted)
            defer { echo.cancel() }

            let seenByClient = try #require(client.peerIdentity)
            let seenByServer = try #require(accepted.peerIdentity)
            #expect(seenByClient.fingerprint == serverIdentity.fingerprint)
            #expect(seenByServer.fingerprint == clientIdentity.fingerprint)
            #expect(seenByClient.comparisonCode == seenByServer.comparisonCode)
            #expect(seenByClient.comparisonCode.count == 7)
            #expect(client.peer.name == "server" && accepted.peer.name == "client")
            #expect(client.peer.version == 2)

            let small = try await client.requestRaw(Array("hello".utf8), type: "echo")
            #expect(small.payload == Array("hello".utf8))
            // 5 MiB: one frame spanning about 80 Noise messages, each way.
            let large = (0..<(5 * 1024 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            let reply = try await client.requestRaw(large, type: "echo", timeout: .seconds(30))
            #expect(reply.payload == large)
            client.close()
        }
    }

    @Test("a peer identity shows the handshake's comparison code as it was derived, leading zeros kept")
    func identityKeepsTheComparisonCode() {
        let fingerprint = Fingerprint(publicKey: [UInt8](repeating: 7, count: 32))
        for code in ["027 631", "000 009", "999 999", "100 000"] {
            let identity = PeerIdentity(name: "peer", fingerprint: fingerprint, comparisonCode: code, isFirstContact: true)
            #expect(identity.comparisonCode == code)
        }
        let hash = [UInt8](repeating: 3, count: 32)
        let derived = SecureProtocol.comparisonCode(handshakeHash: hash)
        #expect(
            PeerIdentity(name: "peer", fingerprint: fingerprint, comparisonCode: derived, isFirstContact: false)
                .comparisonCode == derived)
    }

    @Test("request/reply round trips cross the rekey at transport message 65,536 in both directions")
    func rekeyOnTheWire() async throws {
        try await withDeadline(120) {
            var serverConfiguration = Self.secure("server")
            serverConfiguration.pingInterval = nil  // nothing in flight while the nonces are set
            var clientConfiguration = Self.secure("client")
            clientConfiguration.pingInterval = nil
            let server = try TestServer(serverConfiguration)
            let (client, accepted) = try await server.connectedPair(clientConfiguration)
            // The echo answers from a handler on its loop, the client's task runs on its own loop:
            // no thread hops beyond the two loops.
            accepted.on(type: "n", as: Int.self) { value, message in
                _ = try? accepted.tryReply(to: message, with: value, type: "n")
            }
            #expect(try await client.request(-1, type: "n", expecting: Int.self) == -1)
            // Nothing in flight (heartbeats off, the reply read): both ends of both directions jump
            // to 2,000 messages before the rekey (Noise's SetNonce), instead of sending 63,536
            // round trips first (70 s in CI). The rekey itself is the real one.
            let start = SecureProtocol.rekeyInterval - 2_000
            client.driver.queue.sync { client.driver.setTransportNonces(start) }
            accepted.driver.queue.sync { accepted.driver.setTransportNonces(start) }
            // One request at a time: each request and each reply is a transport message of its own.
            try await withTaskExecutorPreference(client.taskExecutor) {
                for index in 0..<4_000 {
                    let reply = try await client.request(index, type: "n", expecting: Int.self)
                    guard reply == index else {
                        Issue.record("reply \(index) was \(reply)")
                        return
                    }
                }
            }
            let counts = client.driver.queue.sync { client.driver.transportMessageCounts }
            let (sent, received) = try #require(counts)
            #expect(sent > 65_536 + 1_000 && received > 65_536 + 1_000, "sent \(sent), received \(received)")
            client.close()
        }
    }

    @Test("a relay in the middle sees no plaintext: not the names, not the messages")
    func noPlaintextOnTheWire() async throws {
        try await withDeadline(60) {
            let server = try TestServer(Self.secure("server-name-visible?"))
            let relay = try Relay(to: server.port)
            let client = try await MessageChannel.connect(
                to: [.ipv4Loopback(port: relay.port)], configuration: Self.secure("client-name-visible?"),
                logger: testLogger())
            let accepted = try await server.nextChannel()
            let echo = Self.echo(accepted)
            defer { echo.cancel() }
            let secret = "the secret marker 4f1c"
            let reply = try await client.requestRaw(Array(secret.utf8), type: "type-id-visible?")
            #expect(reply.payload == Array(secret.utf8))
            client.close()
            _ = await accepted.closed()
            let (upstream, downstream) = relay.captured()
            #expect(upstream.starts(with: Array("LANMSG/2".utf8)))
            #expect(upstream.count > 100 && downstream.count > 100)
            for needle in [secret, "server-name-visible?", "client-name-visible?", "type-id-visible?"] {
                #expect(!Relay.contains(upstream, needle), "\(needle) travelled in plaintext upstream")
                #expect(!Relay.contains(downstream, needle), "\(needle) travelled in plaintext downstream")
            }
        }
    }

    @Test("one flipped bit after the handshake closes that connection with a reason; the server goes on")
    func flippedBitClosesTheConnection() async throws {
        try await withDeadline(60) {
            let server = try TestServer(Self.secure("server"))
            // Client-to-server byte 20,000 lies inside the 64 KiB message sent below (the
            // handshake is a few hundred bytes).
            let relay = try Relay(to: server.port, flipUpstreamByte: 20_000)
            let client = try await MessageChannel.connect(
                to: [.ipv4Loopback(port: relay.port)], configuration: Self.secure("client"), logger: testLogger())
            let accepted = try await server.nextChannel()
            try await client.sendRaw([UInt8](repeating: 7, count: 64 * 1024), type: "big")
            let reason = await accepted.closed()
            guard case .protocolError(let text) = reason else {
                Issue.record("expected a protocol error, got \(reason)")
                return
            }
            #expect(text.contains("failed authentication"))
            _ = await client.closed()
            // The server still serves: a direct connection works.
            let (again, acceptedAgain) = try await server.connectedPair(Self.secure("client"))
            let echo = Self.echo(acceptedAgain)
            defer { echo.cancel() }
            #expect(try await again.requestRaw([1, 2, 3], type: "echo").payload == [1, 2, 3])
            again.close()
        }
    }

    @Test("a recorded client's bytes replayed to the server fail the handshake; nothing reaches the app")
    func replayedHandshakeFails() async throws {
        try await withDeadline(60) {
            let server = try TestServer(Self.secure("server"))
            let relay = try Relay(to: server.port)
            let client = try await MessageChannel.connect(
                to: [.ipv4Loopback(port: relay.port)], configuration: Self.secure("client"), logger: testLogger())
            let accepted = try await server.nextChannel()
            try await client.sendRaw(Array("once only".utf8), type: "note")
            var messages = accepted.messages.makeAsyncIterator()
            #expect(await messages.next()?.payload == Array("once only".utf8))
            client.close()
            _ = await accepted.closed()
            let recorded = relay.captured().up

            // The same bytes again, on a new connection: the server's fresh ephemeral key makes
            // message 3 (and everything after it) fail authentication.
            let replay = try RawClient(port: server.port)
            defer { replay.close() }
            try replay.write(recorded)
            guard case .failure(let error) = try await server.next() else {
                Issue.record("the replayed handshake produced a channel")
                return
            }
            #expect(error.code == .authenticationFailed, "\(error)")
            #expect(error.message.contains("failed"), "\(error.message)")
        }
    }

    @Test("trust on first use remembers a key and refuses a changed one loudly; nothing is sent")
    func trustOnFirstUse() async throws {
        try await withDeadline(60) {
            let directory = Self.temporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let store = TrustStore(path: directory + "/known_peers")
            let original = Identity.ephemeral()
            let server = try TestServer(Self.secure("kitchen", identity: original))
            let clientConfiguration = Self.secure("laptop", trust: .trustOnFirstUse(store))

            let (first, _) = try await server.connectedPair(clientConfiguration)
            #expect(first.peerIdentity?.isFirstContact == true)
            #expect(store.fingerprint(for: "kitchen") == original.fingerprint)
            first.close()
            let (second, _) = try await server.connectedPair(clientConfiguration)
            #expect(second.peerIdentity?.isFirstContact == false)
            second.close()

            // Same name, another key.
            let impostor = try TestServer(Self.secure("kitchen", identity: .ephemeral()))
            do {
                _ = try await MessageChannel.connect(
                    to: [impostor.v4], configuration: clientConfiguration, logger: testLogger())
                Issue.record("a changed key was accepted")
            } catch let error as TransportError {
                #expect(error.code == .untrustedKey)
                #expect(error.message.contains("THE KEY OF PEER 'kitchen' HAS CHANGED"))
                #expect(error.message.contains(original.fingerprint.full))
            }
            // The impostor never got the client's hello (the client closed before message 3).
            if case .failure(let error) = try await impostor.next() {
                #expect(error.code == .helloFailed)
            } else {
                Issue.record("the impostor got a channel")
            }
            #expect(store.fingerprint(for: "kitchen") == original.fingerprint)
        }
    }

    @Test("a relay that terminates both handshakes shows each side a different comparison code and key")
    func manInTheMiddleShowsDifferentCodes() async throws {
        try await withDeadline(60) {
            let serverIdentity = Identity.ephemeral()
            let clientIdentity = Identity.ephemeral()
            let server = try TestServer(Self.secure("server", identity: serverIdentity))
            // The relay: its own key pair towards both sides.
            let relayIdentity = Identity.ephemeral()
            let relay = try TestServer(Self.secure("server", identity: relayIdentity))
            let (victim, relayFacingVictim) = try await relay.connectedPair(Self.secure("client", identity: clientIdentity))
            let (relayToServer, serverSide) = try await server.connectedPair(Self.secure("client", identity: relayIdentity))
            let victimSees = try #require(victim.peerIdentity)
            let relaySeesVictim = try #require(relayFacingVictim.peerIdentity)
            let serverSees = try #require(serverSide.peerIdentity)
            let relaySeesServer = try #require(relayToServer.peerIdentity)
            // Each handshake agrees with itself...
            #expect(victimSees.comparisonCode == relaySeesVictim.comparisonCode)
            #expect(serverSees.comparisonCode == relaySeesServer.comparisonCode)
            // ...but the two people comparing codes see different ones, and other keys.
            #expect(victimSees.comparisonCode != serverSees.comparisonCode)
            #expect(victimSees.fingerprint != serverIdentity.fingerprint)
            #expect(serverSees.fingerprint != clientIdentity.fingerprint)
            victim.close()
            relayToServer.close()
        }
    }

    @Test("a pinned server refuses an unknown client and says why, encrypted")
    func pinnedRefusal() async throws {
        try await withDeadline(60) {
            let allowed = Identity.ephemeral()
            let server = try TestServer(Self.secure("server", trust: .pinned([allowed.fingerprint])))
            do {
                _ = try await MessageChannel.connect(
                    to: [server.v4], configuration: Self.secure("stranger"), logger: testLogger())
                Issue.record("an unpinned client was accepted")
            } catch let error as TransportError {
                #expect(error.code == .helloRefused)
                #expect(error.message.contains("not among the 1 pinned"))
            }
            if case .failure(let error) = try await server.next() {
                #expect(error.code == .untrustedKey)
            } else {
                Issue.record("the server made a channel for an unpinned client")
            }
            let (client, _) = try await server.connectedPair(Self.secure("friend", identity: allowed))
            #expect(client.peerIdentity != nil)
            client.close()
        }
    }

    @Test("a pre-shared key selects XXpsk3: the same key connects, another key fails on both sides")
    func preSharedKey() async throws {
        try await withDeadline(60) {
            let server = try TestServer(Self.secure("server", psk: "correct horse battery staple"))
            let (client, _) = try await server.connectedPair(Self.secure("client", psk: "correct horse battery staple"))
            client.close()
            do {
                _ = try await server.connectedPair(Self.secure("client", psk: "wrong horse battery staple"))
                Issue.record("a wrong pre-shared key connected")
            } catch let error as TransportError {
                #expect([.authenticationFailed, .helloFailed].contains(error.code), "\(error)")
            }
            do {
                _ = try await server.connectedPair(Self.secure("client"))
                Issue.record("a client without the pre-shared key connected")
            } catch is TransportError {}
        }
    }

    @Test("no downgrade: plaintext clients are refused with a reason unless the server allows them; an encrypted client never falls back")
    func noDowngrade() async throws {
        try await withDeadline(60) {
            let strict = try TestServer(Self.secure("server"))
            do {
                _ = try await strict.connectedPair(config("old client"))
                Issue.record("a plaintext client was served")
            } catch let error as TransportError {
                #expect(error.code == .versionMismatch)
                #expect(error.message.contains("requires protocol version 2"))
            }

            var lenient = Self.secure("server")
            lenient.security.acceptsPlaintextPeers = true
            let tolerant = try TestServer(lenient)
            let (old, accepted) = try await tolerant.connectedPair(config("old client"))
            #expect(old.peerIdentity == nil && accepted.peerIdentity == nil)
            let echo = Self.echo(accepted)
            defer { echo.cancel() }
            #expect(try await old.requestRaw([9], type: "echo").payload == [9])
            old.close()

            let plaintextServer = try TestServer(config("old server"))
            do {
                _ = try await plaintextServer.connectedPair(Self.secure("client"))
                Issue.record("an encrypted client fell back to plaintext")
            } catch let error as TransportError {
                #expect(error.code == .helloFailed)
                #expect(error.message.contains("plaintext protocol version 1"))
            }
        }
    }

    @Test("an identity is created once with mode 0600, loaded again, and refused when others can read it")
    func identityFile() throws {
        let directory = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/app/identity"
        let created = try Identity.loadOrCreate(at: path)
        var info = stat()
        #expect(stat(path, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
        #expect(try Identity.loadOrCreate(at: path).fingerprint == created.fingerprint)
        #expect(created.fingerprint.short.count == 19)
        #expect(Fingerprint(created.fingerprint.full) == created.fingerprint)

        chmod(path, 0o644)
        let open = #expect(throws: FileError.self) { try Identity.loadOrCreate(at: path) }
        #expect(open?.path == path && open?.errno == nil && open?.message.contains("chmod 600") == true)
        chmod(path, 0o600)
        try "not a key\n".write(toFile: path, atomically: false, encoding: .utf8)
        let malformed = #expect(throws: FileError.self) { try Identity.loadOrCreate(at: path) }
        #expect(malformed?.path == path && malformed?.errno == nil && malformed?.message.contains("not a lanmsg identity") == true)
    }
}

/// A blocking TCP relay on 127.0.0.1 between one client and a server: forwards both directions,
/// keeps a copy of every byte, and can flip one bit of the client's stream.
final class Relay: @unchecked Sendable {
    private let listenFD: Int32
    let port: UInt16
    private let copies = Locked<(up: [UInt8], down: [UInt8])>(([], []))
    private let done = DispatchGroup()

    init(to serverPort: UInt16, flipUpstreamByte: Int? = nil) throws {
        let listenFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        _ = try SocketAddress.ipv4Loopback(port: 0).withSockAddr { (sa, len) throws(TransportError) in
            try syscallValue("bind") { bind(listenFD, sa, len) }
        }
        listen(listenFD, 1)
        self.listenFD = listenFD
        port = SocketOps.localAddress(FileDescriptor(listenFD))!.port
        done.enter()
        DispatchQueue.global().async { [self] in
            defer { done.leave() }
            let client = accept(listenFD, nil, nil)
            guard client >= 0 else { return }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            let connected = try? SocketAddress.ipv4Loopback(port: serverPort).withSockAddr {
                (sa, len) throws(TransportError) in try syscallValue("connect") { connect(server, sa, len) }
            }
            guard connected != nil else {
                close(client)
                close(server)
                return
            }
            let pumps = DispatchGroup()
            for (from, to, upstream) in [(client, server, true), (server, client, false)] {
                pumps.enter()
                DispatchQueue.global().async {
                    defer { pumps.leave() }
                    self.pump(from: from, to: to, upstream: upstream, flip: upstream ? flipUpstreamByte : nil)
                }
            }
            pumps.wait()
            close(client)
            close(server)
        }
    }

    private func pump(from: Int32, to: Int32, upstream: Bool, flip: Int?) {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        var offset = 0
        while true {
            let count = recv(from, &buffer, buffer.count, 0)
            guard count > 0 else { break }
            if let flip, flip >= offset, flip < offset + count { buffer[flip - offset] ^= 0x10 }
            copies.withLock { state in
                if upstream { state.up += buffer[0..<count] } else { state.down += buffer[0..<count] }
            }
            offset += count
            var sent = 0
            while sent < count {
                let n = buffer.withUnsafeBytes { send(to, $0.baseAddress! + sent, count - sent, Int32(MSG_NOSIGNAL)) }
                guard n > 0 else { return shutdown(from, Int32(SHUT_RDWR)) == 0 ? () : () }
                sent += n
            }
        }
        shutdown(to, Int32(SHUT_WR))
    }

    /// Everything relayed so far, each direction.
    func captured() -> (up: [UInt8], down: [UInt8]) { copies.withLock { $0 } }

    static func contains(_ haystack: [UInt8], _ needle: String) -> Bool {
        let bytes = Array(needle.utf8)
        guard haystack.count >= bytes.count else { return false }
        for start in 0...(haystack.count - bytes.count) where haystack[start] == bytes[0] {
            if Array(haystack[start..<(start + bytes.count)]) == bytes { return true }
        }
        return false
    }

    deinit {
        close(listenFD)
    }
}
