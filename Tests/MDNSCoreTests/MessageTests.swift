import Testing

@testable import MDNSCore

#if canImport(Glibc)
    import Glibc
#endif

/// DNS names and messages: parsing, building, compression, and what a hostile peer can send.
struct MessageTests {
    @Test func namesCompareCaseInsensitivelyAndEscapeDots() throws {
        let a = try #require(DNSName("Lobby\\.v2._Chat._TCP.local."))
        let b = try #require(
            DNSName(labels: [Array("lobby.V2".utf8), Array("_chat".utf8), Array("_tcp".utf8), Array("LOCAL".utf8)]))
        #expect(a.labels.count == 4)
        #expect(a == b)
        #expect(a.hashValue == b.hashValue)
        #expect(a.description == "Lobby\\.v2._Chat._TCP.local")
        #expect(DNSName(a.description) == a)
        #expect(DNSName("a\\032b")?.labels.first == Array("a b".utf8))
        // Non-letters are not folded: '[' (0x5b) and '{' (0x7b) differ by 0x20 but are not case variants.
        #expect(DNSName("[") != DNSName("{"))
        #expect(DNSName(labels: [[UInt8](repeating: 65, count: 64)]) == nil)
        #expect(DNSName(labels: Array(repeating: [UInt8](repeating: 65, count: 63), count: 4)) == nil)  // 257 bytes
        #expect(DNSName("x\\") == nil)
    }

    @Test func alternativeNamesFollowAvahi() {
        #expect(alternativeName(for: "Lobby", isHost: false) == "Lobby #2")
        #expect(alternativeName(for: "Lobby #2", isHost: false) == "Lobby #3")
        #expect(alternativeName(for: "Lobby #09", isHost: false) == "Lobby #09 #2")
        #expect(alternativeName(for: "alpha", isHost: true) == "alpha-2")
        #expect(alternativeName(for: "alpha-2", isHost: true) == "alpha-3")
        let long = String(repeating: "é", count: 31)  // 62 bytes
        let next = alternativeName(for: long, isHost: false)
        #expect(next.utf8.count <= 63 && next.hasSuffix(" #2"))
    }

    static let type = DNSName.make("_chat._tcp.local")
    static let instance = DNSName(instance: "Lobby", service: type)!
    static let host = DNSName.make("alpha.local")

    static let sample = DNSMessage(
        id: 0, flags: DNSMessage.responseFlag | DNSMessage.authoritativeFlag,
        questions: [DNSQuestion(name: type, type: DNSType.ptr, unicastResponse: true)],
        answers: [ResourceRecord(name: type, data: .ptr(instance), ttl: 4500)],
        authorities: [],
        additionals: [
            ResourceRecord(
                name: instance, data: .srv(priority: 0, weight: 0, port: 4242, target: host), ttl: 120, cacheFlush: true
            ),
            ResourceRecord(
                name: instance, data: .txt([Array("topic=hi".utf8), Array("flag".utf8)]), ttl: 4500, cacheFlush: true),
            ResourceRecord(name: host, data: .a([10, 0, 0, 1]), ttl: 120, cacheFlush: true),
            ResourceRecord(
                name: host, data: .aaaa([0xfe, 0x80] + [UInt8](repeating: 0, count: 13) + [1]), ttl: 120,
                cacheFlush: true),
            ResourceRecord(
                name: host, data: .nsec(next: host, types: [DNSType.a, DNSType.aaaa]), ttl: 120, cacheFlush: true),
            ResourceRecord(name: host, data: .other(type: 99, rdata: [1, 2, 3]), ttl: 7),
        ])

    @Test func messageRoundTripsWithCompression() throws {
        let bytes = Self.sample.encoded()
        let parsed = try DNSMessage(parsing: bytes)
        #expect(parsed == Self.sample)
        #expect(parsed.questions[0].unicastResponse)
        #expect(parsed.additionals[0].cacheFlush && !parsed.answers[0].cacheFlush)
        // Compression: every repeated suffix is a 2-byte pointer.
        let uncompressed = Self.sample.records.reduce(12 + Self.type.wireLength + 4) { total, record in
            total + record.name.wireLength + 10 + record.data.canonicalBytes.count
        }
        #expect(bytes.count < uncompressed - 100, "\(bytes.count) bytes vs \(uncompressed) uncompressed")
    }

    @Test func writerRefusesWhatDoesNotFitAndLeavesNoTrace() throws {
        var writer = MessageWriter(id: 0, flags: 0, maxSize: 60)
        let added = writer.add(DNSQuestion(name: Self.type, type: DNSType.ptr))
        #expect(added)
        let before = writer.finish()
        let big = ResourceRecord(name: Self.instance, data: .txt([[UInt8](repeating: 0x61, count: 100)]), ttl: 1)
        let fitted = writer.add(big, to: .answer)
        #expect(!fitted)
        #expect(writer.finish() == before)
        #expect(try DNSMessage(parsing: before).questions.count == 1)
    }

    /// A message with a name at offset 12 whose label points at `pointerTarget`.
    static func messageWithPointer(_ pointerTarget: UInt16, prefix: [UInt8] = []) -> [UInt8] {
        [0, 0, 0x84, 0, 0, 1, 0, 0, 0, 0, 0, 0] + prefix + [
            0xc0 | UInt8(pointerTarget >> 8), UInt8(pointerTarget & 0xff), 0, 12, 0, 1,
        ]
    }

    @Test func compressionLoopsAndForwardPointersAreRejected() {
        // A pointer to itself (offset 12), and one to a later offset.
        #expect(throws: DNSParseError.badPointer) { try DNSMessage(parsing: Self.messageWithPointer(12)) }
        #expect(throws: DNSParseError.badPointer) { try DNSMessage(parsing: Self.messageWithPointer(20)) }
        // Two labels pointing at each other: "a" → ptr to 16, at 16: "b" → ptr to 12.
        let loop: [UInt8] = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0x61, 0xc0, 16, 1, 0x62, 0xc0, 12, 0, 1, 0, 1]
        #expect(throws: DNSParseError.badPointer) { try DNSMessage(parsing: loop) }
        // A pointer into the header (backwards, legal but pointing at garbage) ends at a zero byte or fails cleanly.
        _ = try? DNSMessage(parsing: Self.messageWithPointer(2))
    }

    @Test func malformedInputsFailCleanly() {
        let good = Self.sample.encoded()
        // Every truncation of a valid message fails (or parses a prefix-consistent message), never crashes.
        for length in 0..<good.count {
            #expect(throws: DNSParseError.self) { try DNSMessage(parsing: Array(good.prefix(length))) }
        }
        // Label type 0b01 / 0b10.
        #expect(throws: DNSParseError.badLabel) {
            try DNSMessage(parsing: [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x41, 0, 0, 1, 0, 1])
        }
        // Counts larger than the datagram can hold.
        #expect(throws: DNSParseError.self) {
            try DNSMessage(parsing: [0, 0, 0x84, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])
        }
        // An A record with 5 bytes of data.
        let bad = DNSMessage(
            id: 0, flags: 0x8400,
            answers: [ResourceRecord(name: Self.host, data: .other(type: 1, rdata: [1, 2, 3, 4, 5]), ttl: 1)])
        #expect(throws: DNSParseError.badRecordData(type: 1)) { try DNSMessage(parsing: bad.encoded()) }
        // A name longer than 255 bytes built from pointers: 5 copies of a 63-byte label chained.
        var bytes: [UInt8] = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        bytes += [63] + [UInt8](repeating: 0x61, count: 63) + [0]  // at 12
        var previous = 12
        for _ in 0..<4 {
            let at = bytes.count
            bytes += [63] + [UInt8](repeating: 0x62, count: 63) + [0xc0 | UInt8(previous >> 8), UInt8(previous & 0xff)]
            previous = at
        }
        let question = bytes.count
        bytes += [0xc0 | UInt8(previous >> 8), UInt8(previous & 0xff), 0, 1, 0, 1]
        var reader = DNSReader(bytes: bytes)
        reader.offset = question
        #expect(throws: DNSParseError.nameTooLong) { _ = try reader.name() }
    }

    /// Real packets from avahi-daemon, python-zeroconf and our own stack (the fuzzing seeds, captured
    /// by Tests/fuzz/capture-mdns-seeds.sh) parse, and survive a round trip through our encoder.
    @Test func capturedRealPacketsParseAndRoundTrip() throws {
        var directory = #filePath
        while !directory.hasSuffix("/Tests") { directory = String(directory[..<directory.lastIndex(of: "/")!]) }
        let seeds = directory + "/fuzz/mdns-seeds"
        guard let listing = opendir(seeds) else {
            Issue.record("no seed directory at \(seeds)")
            return
        }
        defer { closedir(listing) }
        var parsed = 0
        var sawResponse = false
        var sawQuery = false
        var sawProbe = false
        while let entry = readdir(listing) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) {
                String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard name.hasSuffix(".hex"), let file = fopen(seeds + "/" + name, "r") else { continue }
            var text: [UInt8] = []
            var byte = fgetc(file)
            while byte != EOF {
                text.append(UInt8(byte))
                byte = fgetc(file)
            }
            fclose(file)
            let hex = text.filter { $0 != 10 }
            let bytes = stride(from: 0, to: hex.count - 1, by: 2).map {
                UInt8(String(decoding: hex[$0...$0 + 1], as: UTF8.self), radix: 16)!
            }
            let message = try DNSMessage(parsing: bytes)
            #expect(try DNSMessage(parsing: message.encoded()) == message, "\(name)")
            parsed += 1
            if message.isResponse {
                sawResponse = true
            } else if message.authorities.isEmpty {
                sawQuery = true
            } else {
                sawProbe = true
            }
        }
        #expect(parsed >= 20 && sawResponse && sawQuery && sawProbe, "\(parsed) packets")
    }

    @Test func emptyTXTIsOneEmptyString() throws {
        let message = DNSMessage(flags: 0x8400, answers: [ResourceRecord(name: Self.instance, data: .txt([]), ttl: 1)])
        let bytes = message.encoded()
        #expect(Array(bytes.suffix(3)) == [0, 1, 0])  // rdlength 1, one zero-length string
        #expect(try DNSMessage(parsing: bytes).answers[0].data == .txt([[]]))
    }
}
