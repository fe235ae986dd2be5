import Testing

@testable import MDNSCore

/// The unicast side of the codec: DNS UPDATE forms, EDNS(0) and the Update Lease, SOA with
/// compressed names, TSIG placement, TCP framing, reverse-mapping names.
struct UnicastTests {
    static let zone = DNSName("lab.home.arpa")!
    static let instance = DNSName("Chat on hosta._lanmsg._tcp.lab.home.arpa")!

    @Test func updateFormsRoundTrip() throws {
        let srv = ResourceRecord(
            name: Self.instance, data: .srv(priority: 0, weight: 0, port: 8080, target: DNSName("hosta.lab.home.arpa")!), ttl: 60)
        let update = DNSMessage.update(
            id: 7, zone: Self.zone, prerequisites: [.nameNotInUse(Self.instance), .nameInUse(Self.instance), .rrsetEquals(srv)],
            updates: [
                srv, .deleteRRset(Self.instance, type: DNSType.txt), .deleteName(Self.instance),
                .deleteRecord(ResourceRecord(name: DNSName("_lanmsg._tcp.lab.home.arpa")!, data: .ptr(Self.instance), ttl: 60)),
            ],
            additionals: [.opt(options: [.updateLease(seconds: 7200)])])
        let bytes = update.encoded(maxSize: 65535)
        let parsed = try DNSMessage(parsing: bytes)
        #expect(parsed == update)
        #expect(parsed.opcode == DNSOpcode.update)
        // The wire forms of RFC 2136: class NONE/ANY, TTL 0, no data.
        #expect(parsed.answers[0].recordClass == DNSClass.none && parsed.answers[0].type == DNSType.any)
        #expect(parsed.answers[1].recordClass == DNSClass.any && parsed.answers[1].type == DNSType.any)
        #expect(parsed.answers[2].ttl == 0)
        #expect(parsed.authorities[3].recordClass == DNSClass.none && parsed.authorities[3].ttl == 0)
        #expect(parsed.additionals[0].ednsOptions.first?.updateLease == 7200)
        #expect(parsed.additionals[0].recordClass == 1232)
    }

    @Test func soaNamesAreExpandedFromACompressedReply() throws {
        // A reply whose SOA names point into the question (as servers write them).
        var writer = MessageWriter(id: 1, flags: DNSMessage.responseFlag, maxSize: 512)
        _ = writer.add(DNSQuestion(name: Self.zone, type: DNSType.soa))
        var bytes = writer.finish()
        bytes[7] = 1  // ANCOUNT
        // owner: pointer to the question name (offset 12), type SOA, class IN, TTL 60
        let rdata: [UInt8] = [2] + Array("ns".utf8) + [0xc0, 12] + [10] + Array("hostmaster".utf8) + [0xc0, 12]
            + [0, 0, 0, 42] + [0, 0, 0x0e, 0x10] + [0, 0, 2, 0x58] + [0, 1, 0x51, 0x80] + [0, 0, 0, 10]
        bytes += [0xc0, 12, 0, 6, 0, 1, 0, 0, 0, 60, 0, UInt8(rdata.count)] + rdata
        let message = try DNSMessage(parsing: bytes)
        let soa = try #require(message.answers.first?.soa)
        #expect(soa.primary == DNSName("ns.lab.home.arpa"))
        #expect(soa.mailbox == DNSName("hostmaster.lab.home.arpa"))
        #expect(soa.serial == 42 && soa.minimum == 10)
        // Re-encoded (uncompressed data) it parses to the same.
        #expect(try DNSMessage(parsing: message.encoded()) == message)
    }

    @Test func tsigMustBeTheLastRecordAndItsAlgorithmUncompressed() throws {
        let record = TSIGRecord(
            keyName: DNSName("k.example")!, algorithm: DNSName("hmac-sha256")!, timeSigned: 1_700_000_000,
            mac: [UInt8](repeating: 9, count: 32), originalID: 5)
        let message = DNSMessage.query(id: 5, name: Self.zone, type: DNSType.soa).encoded()
        let signed = record.appended(to: message)
        let parsed = try SignedDNSMessage(parsing: signed)
        #expect(parsed.tsig == record)
        #expect(parsed.unsignedBytes == message)
        // A TSIG followed by another record is refused.
        var two = signed
        two[11] = 2
        two += ResourceRecord.opt().encodedForTest()
        #expect(throws: DNSParseError.self) { try SignedDNSMessage(parsing: two) }
        // A compression pointer inside the TSIG data is refused.
        let rdata = [0xc0, 12] + Array(record.rdata.dropFirst(record.algorithm.wireLength))
        #expect(throws: DNSParseError.self) { try TSIGRecord(keyName: record.keyName, rdata: rdata) }
        // BADTIME's other data carries the server's time.
        let badTime = TSIGRecord(
            keyName: record.keyName, algorithm: record.algorithm, timeSigned: 1, originalID: 5, error: DNSRcode.badTime,
            otherData: [0, 0, 0x65, 0x53, 0xf1, 0x00])
        #expect(badTime.serverTime == 0x6553_f100)
    }

    @Test func tcpFramingSplitsMessages() {
        let a: [UInt8] = [1, 2, 3]
        let b = [UInt8](repeating: 7, count: 300)
        var stream = DNSTCPFraming.frame(a) + DNSTCPFraming.frame(b)
        #expect(DNSTCPFraming.nextMessage(in: Array(stream.prefix(4))) == nil)
        let first = DNSTCPFraming.nextMessage(in: stream)
        #expect(first?.message == a && first?.consumed == 5)
        stream.removeFirst(5)
        #expect(DNSTCPFraming.nextMessage(in: stream)?.message == b)
    }

    @Test func reverseMappingNamesOfSubnets() {
        #expect(DNSName.reverseSubnet(address: [10, 81, 1, 10], prefixLength: 24)?.description == "0.1.81.10.in-addr.arpa")
        #expect(DNSName.reverseSubnet(address: [192, 168, 12, 34], prefixLength: 16)?.description == "0.0.168.192.in-addr.arpa")
        let v6 = DNSName.reverseSubnet(
            address: [0xfd, 0x81, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10], prefixLength: 64)
        #expect(v6?.description == String(repeating: "0.", count: 24) + "1.0.0.0.1.8.d.f.ip6.arpa")
        #expect(DNSName.reverseSubnet(address: [1, 2, 3], prefixLength: 8) == nil)
        #expect(Self.zone.prepending("b._dns-sd._udp")?.description == "b._dns-sd._udp.lab.home.arpa")
    }

    @Test func largeUnicastRepliesParse() throws {
        // 1,100 PTRs over TCP: more than an mDNS message may carry.
        let service = DNSName("_lanmsg._tcp.lab.home.arpa")!
        var writer = MessageWriter(id: 3, flags: DNSMessage.responseFlag, maxSize: 65535)
        _ = writer.add(DNSQuestion(name: service, type: DNSType.ptr))
        for index in 0..<1100 {
            _ = writer.add(
                ResourceRecord(name: service, data: .ptr(DNSName(instance: "Service \(index)", service: service)!), ttl: 60),
                to: .answer)
        }
        let bytes = writer.finish()
        #expect(bytes.count > 9000)
        #expect(throws: DNSParseError.tooManyRecords) { try DNSMessage(parsing: bytes) }
        let parsed = try SignedDNSMessage(parsing: bytes)
        #expect(parsed.message.answers.count == 1100)
    }
}

extension ResourceRecord {
    func encodedForTest() -> [UInt8] {
        var writer = MessageWriter(id: 0, flags: 0, maxSize: 512)
        _ = writer.add(self, to: .additional)
        return Array(writer.finish().dropFirst(12))
    }
}

