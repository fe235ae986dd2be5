import Testing
#if canImport(Glibc)
    import Glibc
#endif

@testable import Discovery
@testable import MDNSCore

/// TSIG (RFC 8945) against vectors made by dnspython (Tests/interop/tsig-vectors.py), an
/// implementation we did not write: our MAC over dnspython's UPDATE equals dnspython's, and we verify
/// the reply dnspython signed. The live test (WideAreaIntegrationTests) checks the other direction.
@Suite struct TSIGTests {
    // `tsig-vectors.py vectors` (dnspython 2.3.0); the secret is test material only.
    static let secret = "pYVjFfBNQ7vO5iD3kP1WdZ0s2GmK4u8TqXyRcAhLnEo="
    static let time: UInt64 = 1_795_000_000
    static let unsigned = hex(
        "123428000001000100050000036c616204686f6d65046172706100000600010d43686174206f6e20686f737461075f6c616e6d7367045f746370c00c00ff00fe000000000000c01f002100010000003c000e000000001f9005686f737461c00cc01f001000010000003c001a0666703d61626312657870697265733d31373935303033363030c02d000c00010000003c0002c01fc058000100ff000000000000c058000100010000003c00040a51010a"
    )
    static let signed = hex(
        "123428000001000100050001036c616204686f6d65046172706100000600010d43686174206f6e20686f737461075f6c616e6d7367045f746370c00c00ff00fe000000000000c01f002100010000003c000e000000001f9005686f737461c00cc01f001000010000003c001a0666703d61626312657870697265733d31373935303033363030c02d000c00010000003c0002c01fc058000100ff000000000000c058000100010000003c00040a51010ac05800fa00ff00000000003d0b686d61632d7368613235360000006afd86c0012c002010c1ba1bffb78aa088de3f44312218908210a83064d45f20da2c0d95c71cbab8123400000000"
    )
    static let requestMAC = hex("10c1ba1bffb78aa088de3f44312218908210a83064d45f20da2c0d95c71cbab8")
    static let reply = hex(
        "1234a8000001000000000001036c616204686f6d650461727061000006000105686f737461c00c00fa00ff00000000003d0b686d61632d7368613235360000006afd86c0012c0020de2395813bebed60ffd4749b492f1cb203396f0c2b52fdf682dced773e0a5d7e123400000000"
    )

    static func key(secret: String = secret) throws -> TSIGKey {
        try TSIGKey.parse("key \"hosta.lab.home.arpa\" {\n\talgorithm hmac-sha256;\n\tsecret \"\(secret)\";\n};\n")
    }

    @Test func ourSignatureOfDnspythonsUpdateIsDnspythons() throws {
        let (bytes, mac) = try Self.key().sign(Self.unsigned, id: 0x1234, time: Self.time)
        #expect(mac == Self.requestMAC)
        // dnspython compresses the TSIG owner name, we do not (both are allowed): the records parse
        // to the same TSIG.
        let ours = try SignedDNSMessage(parsing: bytes)
        let theirs = try SignedDNSMessage(parsing: Self.signed)
        #expect(ours.tsig == theirs.tsig)
        #expect(ours.unsignedBytes == theirs.unsignedBytes)
        #expect(ours.message == theirs.message)
    }

    @Test func weVerifyDnspythonsSignedReply() throws {
        let reply = try SignedDNSMessage(parsing: Self.reply)
        let key = try Self.key()
        #expect(key.verify(reply, requestMAC: Self.requestMAC, now: Self.time + 10).failureValue == nil)
        // A changed byte, another request MAC, a wrong secret, a late clock: each refused.
        var tampered = Self.reply
        tampered[3] ^= 0x01  // flags
        let bad = try SignedDNSMessage(parsing: tampered)
        #expect(key.verify(bad, requestMAC: Self.requestMAC, now: Self.time).failureValue == .badMAC)
        #expect(key.verify(reply, requestMAC: [UInt8](repeating: 0, count: 32), now: Self.time).failureValue == .badMAC)
        let other = try Self.key(secret: Base64.encode([UInt8](repeating: 7, count: 32)))
        #expect(other.verify(reply, requestMAC: Self.requestMAC, now: Self.time).failureValue == .badMAC)
        #expect(key.verify(reply, requestMAC: Self.requestMAC, now: Self.time + 301).failureValue == .badTime(serverTime: Self.time, skew: 301))
        var bare = Array(Self.reply.prefix(31))  // header and question, no TSIG
        bare[11] = 0
        let unsigned = try SignedDNSMessage(parsing: bare)
        #expect(key.verify(unsigned, requestMAC: Self.requestMAC, now: Self.time).failureValue == .unsigned)
    }

    @Test func dnspythonsUpdateParsesIntoTheFormsWeBuild() throws {
        let message = try DNSMessage(parsing: Self.unsigned)
        let instance = try #require(DNSName("Chat\\032on\\032hosta._lanmsg._tcp.lab.home.arpa"))
        let host = try #require(DNSName("hosta.lab.home.arpa"))
        #expect(message.opcode == DNSOpcode.update)
        #expect(message.questions == [DNSQuestion(name: DNSName("lab.home.arpa")!, type: DNSType.soa)])
        #expect(message.answers == [.nameNotInUse(instance)])
        #expect(message.authorities.contains(.deleteRRset(host, type: DNSType.a)))
        #expect(message.authorities.contains(ResourceRecord(name: host, data: .a([10, 81, 1, 10]), ttl: 60)))
        // Our encoding of the same update is byte for byte dnspython's (same compression choices).
        let ours = DNSMessage.update(
            id: 0x1234, zone: DNSName("lab.home.arpa")!, prerequisites: message.answers, updates: message.authorities)
        #expect(ours.encoded(maxSize: 65535) == Self.unsigned)
    }

    @Test func keyFilesAsTsigKeygenWritesThem() throws {
        let text = """
            key "hosta.lab.home.arpa" {
            	algorithm hmac-sha256;
            	secret "\(Self.secret)";
            };
            """
        let key = try TSIGKey.parse(text)
        #expect(key.name == "hosta.lab.home.arpa")
        #expect(key.algorithm == .hmacSHA256)
        #expect(!key.description.contains(Self.secret))  // the secret is never printed
        // Comments, other order, sha512.
        let other = try TSIGKey.parse(
            "# made by hand\nkey \"k.example\" { secret \"\(Self.secret)\"; /* x */ algorithm HMAC-SHA512; }; // end")
        #expect(other.algorithm == .hmacSHA512)
        // What is wrong is said.
        #expect(throws: DiscoveryError.self) { try TSIGKey.parse("key \"x\" { algorithm hmac-md5; secret \"\(Self.secret)\"; };") }
        #expect(throws: DiscoveryError.self) { try TSIGKey.parse("key \"x\" { algorithm hmac-sha256; secret \"not base64!\"; };") }
        #expect(throws: DiscoveryError.self) { try TSIGKey.parse("key \"x\" { algorithm hmac-sha256; secret \"AAAA\"; };") }  // 3 bytes
        #expect(throws: DiscoveryError.self) { try TSIGKey.parse("secret \"\(Self.secret)\";") }
        do {
            _ = try TSIGKey(contentsOfFile: "/nonexistent/key")
            Issue.record("an unreadable key file must throw")
        } catch {
            #expect(error.code == .invalidKeyFile)
            #expect(error.message.contains("/nonexistent/key"))
        }
    }

    @Test func base64RoundTrips() {
        for count in 0..<40 {
            let bytes = (0..<count).map { UInt8(truncatingIfNeeded: $0 * 37 + 11) }
            #expect(Base64.decode(Base64.encode(bytes)) == bytes)
        }
        #expect(Base64.decode("A===") == nil)
        #expect(Base64.decode("AB=C") == nil)
    }
}

func hex(_ text: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = text.startIndex
    while index < text.endIndex {
        let next = text.index(index, offsetBy: 2)
        bytes.append(UInt8(text[index..<next], radix: 16)!)
        index = next
    }
    return bytes
}

extension Result where Success == Void {
    var failureValue: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}

@Suite struct TSIGKeyFileTests {
    /// A key file others can read is refused before use, like an identity file, saying how to fix it.
    @Test func aKeyFileReadableByOthersIsRefused() throws {
        let path = "/tmp/tsig-\(UInt32.random(in: 0...UInt32.max)).key"
        let text = "key \"hosta.lab.home.arpa\" { algorithm hmac-sha256; secret \"\(TSIGTests.secret)\"; };\n"
        let fd = creat(path, 0o644)
        _ = text.withCString { write(fd, $0, strlen($0)) }
        close(fd)
        defer { unlink(path) }
        chmod(path, 0o644)
        do {
            _ = try TSIGKey(contentsOfFile: path)
            Issue.record("a world-readable key file must be refused")
        } catch {
            #expect(error.code == .invalidKeyFile)
            #expect(error.message.contains("chmod 600"), "\(error.message)")
        }
        chmod(path, 0o600)
        #expect(try TSIGKey(contentsOfFile: path).name == "hosta.lab.home.arpa")
        // Named by the environment, an unusable key stops a program as a flag would.
        chmod(path, 0o644)
        #expect(throws: DiscoveryError.self) {
            _ = try DiscoveryConfiguration.forProgram(environment: ["LANMSG_WIDE_AREA_KEY": path])
        }
    }
}

