/// Unicast DNS on top of the mDNS codec: the parts a DNS-SD client of an ordinary DNS server needs.
/// DNS UPDATE (RFC 2136) with its prerequisite and delete forms, EDNS(0) (RFC 6891) with the Update
/// Lease option (RFC 9664), TSIG records (RFC 8945) and the bytes their MAC covers, and messages over
/// TCP (RFC 1035 §4.2.2, two-byte length prefix). No I/O and no cryptography here: the HMAC itself is
/// computed by the caller (Discovery, with swift-crypto) over the bytes built here.

/// Opcodes (RFC 1035, RFC 2136).
public enum DNSOpcode {
    public static let query: UInt16 = 0
    public static let update: UInt16 = 5
}

/// Response codes (RFC 1035, RFC 2136, RFC 6891, RFC 8945). Values 16 and up are only ever seen as
/// a TSIG error or as an extended RCODE.
public enum DNSRcode {
    public static let noError: UInt16 = 0
    public static let formErr: UInt16 = 1
    public static let servFail: UInt16 = 2
    public static let nxDomain: UInt16 = 3
    public static let notImp: UInt16 = 4
    public static let refused: UInt16 = 5
    public static let yxDomain: UInt16 = 6
    public static let yxRRSet: UInt16 = 7
    public static let nxRRSet: UInt16 = 8
    public static let notAuth: UInt16 = 9
    public static let notZone: UInt16 = 10
    public static let badSig: UInt16 = 16
    public static let badKey: UInt16 = 17
    public static let badTime: UInt16 = 18
    public static let badTrunc: UInt16 = 22

    /// The mnemonic (`REFUSED`, `BADSIG`, ...) or `RCODE<n>`.
    public static func name(_ code: UInt16) -> String {
        switch code {
        case noError: "NOERROR"
        case formErr: "FORMERR"
        case servFail: "SERVFAIL"
        case nxDomain: "NXDOMAIN"
        case notImp: "NOTIMP"
        case refused: "REFUSED"
        case yxDomain: "YXDOMAIN"
        case yxRRSet: "YXRRSET"
        case nxRRSet: "NXRRSET"
        case notAuth: "NOTAUTH"
        case notZone: "NOTZONE"
        case badSig: "BADSIG"
        case badKey: "BADKEY"
        case badTime: "BADTIME"
        case badTrunc: "BADTRUNC"
        default: "RCODE\(code)"
        }
    }
}

extension DNSType {
    public static let ns: UInt16 = 2
    public static let cname: UInt16 = 5
    public static let soa: UInt16 = 6
    public static let opt: UInt16 = 41
    public static let tsig: UInt16 = 250
}

/// Classes beyond IN that DNS UPDATE uses (RFC 2136 §2.4, §2.5).
public enum DNSClass {
    public static let `in`: UInt16 = 1
    /// "Delete from / must not exist" forms.
    public static let none: UInt16 = 254
    /// "Delete all / must exist" forms; also TSIG's class.
    public static let any: UInt16 = 255
}

extension DNSMessage {
    /// RD: recursion desired (set in queries to a resolver).
    public static let recursionDesiredFlag: UInt16 = 0x0100

    /// A standard query (opcode 0) for one name and type.
    public static func query(id: UInt16, name: DNSName, type: UInt16, recursionDesired: Bool = true) -> DNSMessage {
        DNSMessage(
            id: id, flags: recursionDesired ? recursionDesiredFlag : 0,
            questions: [DNSQuestion(name: name, type: type)])
    }

    /// A DNS UPDATE (RFC 2136 §2): the zone as the one question, prerequisites in the answer
    /// section, updates in the authority section, additional records (EDNS, then TSIG) last.
    public static func update(
        id: UInt16, zone: DNSName, prerequisites: [ResourceRecord], updates: [ResourceRecord],
        additionals: [ResourceRecord] = []
    ) -> DNSMessage {
        DNSMessage(
            id: id, flags: DNSOpcode.update << 11, questions: [DNSQuestion(name: zone, type: DNSType.soa)],
            answers: prerequisites, authorities: updates, additionals: additionals)
    }

    /// The RCODE including the extended bits of an OPT record, if there is one (RFC 6891 §6.1.3).
    public var extendedRcode: UInt16 {
        guard let opt = additionals.first(where: { $0.type == DNSType.opt }) else { return rcode }
        return UInt16(opt.ttl >> 24) << 4 | rcode
    }
}

/// The RFC 2136 forms, as records.
extension ResourceRecord {
    /// Prerequisite "name is not in use" (RFC 2136 §2.4.5): class NONE, type ANY, no data.
    public static func nameNotInUse(_ name: DNSName) -> ResourceRecord {
        ResourceRecord(name: name, data: .other(type: DNSType.any, rdata: []), ttl: 0, recordClass: DNSClass.none)
    }

    /// Prerequisite "name is in use" (RFC 2136 §2.4.4): class ANY, type ANY, no data.
    public static func nameInUse(_ name: DNSName) -> ResourceRecord {
        ResourceRecord(name: name, data: .other(type: DNSType.any, rdata: []), ttl: 0, recordClass: DNSClass.any)
    }

    /// Prerequisite "RRset exists, value dependent" (RFC 2136 §2.4.2): the record itself with TTL 0.
    public static func rrsetEquals(_ record: ResourceRecord) -> ResourceRecord {
        var copy = record
        copy.ttl = 0
        copy.cacheFlush = false
        return copy
    }

    /// Update "delete an RRset" (RFC 2136 §2.5.2): class ANY, the type, no data.
    public static func deleteRRset(_ name: DNSName, type: UInt16) -> ResourceRecord {
        ResourceRecord(name: name, data: .other(type: type, rdata: []), ttl: 0, recordClass: DNSClass.any)
    }

    /// Update "delete all RRsets from a name" (RFC 2136 §2.5.3): class ANY, type ANY, no data.
    public static func deleteName(_ name: DNSName) -> ResourceRecord {
        ResourceRecord(name: name, data: .other(type: DNSType.any, rdata: []), ttl: 0, recordClass: DNSClass.any)
    }

    /// Update "delete an RR from an RRset" (RFC 2136 §2.5.4): class NONE, TTL 0, the record's data.
    /// The way to remove one PTR of a shared set (one instance of a service type).
    public static func deleteRecord(_ record: ResourceRecord) -> ResourceRecord {
        var copy = record
        copy.ttl = 0
        copy.cacheFlush = false
        copy.recordClass = DNSClass.none
        return copy
    }

    /// An EDNS(0) OPT pseudo-record (RFC 6891 §6.1.2) advertising `payloadSize` with `options`.
    public static func opt(payloadSize: UInt16 = 1232, options: [EDNSOption] = []) -> ResourceRecord {
        var rdata: [UInt8] = []
        for option in options {
            rdata += [UInt8(option.code >> 8), UInt8(option.code & 0xff)]
            rdata += [UInt8(option.data.count >> 8), UInt8(option.data.count & 0xff)]
            rdata += option.data
        }
        return ResourceRecord(
            name: .root, data: .other(type: DNSType.opt, rdata: rdata), ttl: 0,
            cacheFlush: payloadSize & 0x8000 != 0, recordClass: payloadSize & 0x7fff)
    }

    /// The options of an OPT record (empty for any other record, or malformed options).
    public var ednsOptions: [EDNSOption] {
        guard case .other(DNSType.opt, let rdata) = data else { return [] }
        var options: [EDNSOption] = []
        var offset = 0
        while offset + 4 <= rdata.count {
            let code = UInt16(rdata[offset]) << 8 | UInt16(rdata[offset + 1])
            let length = Int(rdata[offset + 2]) << 8 | Int(rdata[offset + 3])
            guard offset + 4 + length <= rdata.count else { return options }
            options.append(EDNSOption(code: code, data: Array(rdata[offset + 4..<offset + 4 + length])))
            offset += 4 + length
        }
        return options
    }

    /// The SOA serial, for an SOA record (nil otherwise or when the data is too short).
    public var soaSerial: UInt32? { soa?.serial }

    /// The SOA fields of an SOA record (nil otherwise).
    public var soa: SOAData? {
        guard case .other(DNSType.soa, let rdata) = data else { return nil }
        return SOAData(rdata: rdata)
    }
}

/// One EDNS(0) option (RFC 6891 §6.1.2).
public struct EDNSOption: Hashable, Sendable {
    public var code: UInt16
    public var data: [UInt8]

    public init(code: UInt16, data: [UInt8]) {
        self.code = code
        self.data = data
    }

    /// The Update Lease option (RFC 9664 §4, code 2): how long the server should keep the records.
    public static func updateLease(seconds: UInt32) -> EDNSOption {
        EDNSOption(code: 2, data: [UInt8(seconds >> 24), UInt8((seconds >> 16) & 0xff), UInt8((seconds >> 8) & 0xff), UInt8(seconds & 0xff)])
    }

    /// The lease a server granted, when this is an Update Lease option (4 or 8 bytes).
    public var updateLease: UInt32? {
        guard code == 2, data.count == 4 || data.count == 8 else { return nil }
        return UInt32(data[0]) << 24 | UInt32(data[1]) << 16 | UInt32(data[2]) << 8 | UInt32(data[3])
    }
}

/// The fields of an SOA record (RFC 1035 §3.3.13). Names inside are uncompressed in what we keep
/// (the parser keeps unknown-to-mDNS types raw, and SOA data from a server may be compressed, so
/// the raw form is only read through ``SOAData/init(rdata:)`` when it is not).
public struct SOAData: Hashable, Sendable {
    public var primary: DNSName
    public var mailbox: DNSName
    public var serial: UInt32
    public var refresh: UInt32
    public var retry: UInt32
    public var expire: UInt32
    public var minimum: UInt32

    /// Parses SOA rdata whose names are not compressed (see ``DNSMessage`` parsing, which expands
    /// SOA names); nil when malformed.
    public init?(rdata: [UInt8]) {
        var reader = DNSReader(bytes: rdata)
        guard let primary = try? reader.name(), let mailbox = try? reader.name(),
            let serial = try? reader.u32(), let refresh = try? reader.u32(), let retry = try? reader.u32(),
            let expire = try? reader.u32(), let minimum = try? reader.u32(), reader.offset == rdata.count
        else { return nil }
        self.primary = primary
        self.mailbox = mailbox
        self.serial = serial
        self.refresh = refresh
        self.retry = retry
        self.expire = expire
        self.minimum = minimum
    }

    public init(
        primary: DNSName, mailbox: DNSName, serial: UInt32, refresh: UInt32 = 3600, retry: UInt32 = 600,
        expire: UInt32 = 86400, minimum: UInt32 = 10
    ) {
        self.primary = primary
        self.mailbox = mailbox
        self.serial = serial
        self.refresh = refresh
        self.retry = retry
        self.expire = expire
        self.minimum = minimum
    }

    /// The rdata, names uncompressed.
    public var rdata: [UInt8] {
        var writer = ByteWriter()
        writer.appendUncompressed(primary)
        writer.appendUncompressed(mailbox)
        for value in [serial, refresh, retry, expire, minimum] { writer.append32(value) }
        return writer.bytes
    }
}

// MARK: - TSIG (RFC 8945)

/// A TSIG record's data (RFC 8945 §4.2), with the key name it was the owner of.
public struct TSIGRecord: Hashable, Sendable {
    /// The key's name (the record's owner name).
    public var keyName: DNSName
    /// The algorithm, e.g. `hmac-sha256.`.
    public var algorithm: DNSName
    /// Seconds since the epoch, 48 bits.
    public var timeSigned: UInt64
    /// Seconds of clock difference permitted.
    public var fudge: UInt16
    public var mac: [UInt8]
    /// The message ID the signature was made over.
    public var originalID: UInt16
    /// 0, or BADSIG / BADKEY / BADTIME / BADTRUNC.
    public var error: UInt16
    /// With BADTIME: the server's time (6 bytes).
    public var otherData: [UInt8]

    public init(
        keyName: DNSName, algorithm: DNSName, timeSigned: UInt64, fudge: UInt16 = 300, mac: [UInt8] = [],
        originalID: UInt16, error: UInt16 = 0, otherData: [UInt8] = []
    ) {
        self.keyName = keyName
        self.algorithm = algorithm
        self.timeSigned = timeSigned & 0xffff_ffff_ffff
        self.fudge = fudge
        self.mac = mac
        self.originalID = originalID
        self.error = error
        self.otherData = otherData
    }

    /// The server's clock in a BADTIME reply's other data (seconds since the epoch).
    public var serverTime: UInt64? {
        guard otherData.count == 6 else { return nil }
        return otherData.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// Parses TSIG rdata. Names inside TSIG data must not be compressed (RFC 8945 §4.2): a
    /// compression pointer is an error here.
    public init(keyName: DNSName, rdata: [UInt8]) throws(DNSParseError) {
        var reader = DNSReader(bytes: rdata)
        algorithm = try reader.uncompressedName()
        let high = UInt64(try reader.u16())
        let low = UInt64(try reader.u32())
        timeSigned = high << 32 | low
        fudge = try reader.u16()
        let macSize = Int(try reader.u16())
        mac = try reader.take(macSize)
        originalID = try reader.u16()
        error = try reader.u16()
        let otherSize = Int(try reader.u16())
        otherData = try reader.take(otherSize)
        guard reader.offset == rdata.count else { throw .badRecordData(type: DNSType.tsig) }
        self.keyName = keyName
    }

    /// The rdata on the wire (algorithm name uncompressed).
    public var rdata: [UInt8] {
        var writer = ByteWriter()
        writer.appendUncompressed(algorithm)
        writeTime(&writer)
        writer.append16(UInt16(mac.count))
        writer.append(mac)
        writer.append16(originalID)
        writer.append16(error)
        writer.append16(UInt16(otherData.count))
        writer.append(otherData)
        return writer.bytes
    }

    private func writeTime(_ writer: inout ByteWriter) {
        writer.append16(UInt16((timeSigned >> 32) & 0xffff))
        writer.append32(UInt32(timeSigned & 0xffff_ffff))
        writer.append16(fudge)
    }

    /// The TSIG variables (RFC 8945 §4.3.3): what the MAC covers after the message.
    public var variables: [UInt8] {
        var writer = ByteWriter()
        writer.appendUncompressed(keyName, lowercase: true)
        writer.append16(DNSClass.any)
        writer.append32(0)
        writer.appendUncompressed(algorithm, lowercase: true)
        writeTime(&writer)
        writer.append16(error)
        writer.append16(UInt16(otherData.count))
        writer.append(otherData)
        return writer.bytes
    }

    /// The bytes whose MAC signs a request (RFC 8945 §4.3.1): the message as sent, without the
    /// TSIG record, then the variables.
    public func requestDigestInput(message: [UInt8]) -> [UInt8] {
        message + variables
    }

    /// The bytes whose MAC signs a response (RFC 8945 §4.3.2): the request's MAC with its length,
    /// the response without the TSIG record (ARCOUNT less one, the original ID), then the variables.
    public func responseDigestInput(requestMAC: [UInt8], unsignedResponse: [UInt8]) -> [UInt8] {
        [UInt8(requestMAC.count >> 8), UInt8(requestMAC.count & 0xff)] + requestMAC + unsignedResponse + variables
    }

    /// `message` (already encoded, with no TSIG) with this record appended as its last additional
    /// record: owner and algorithm names uncompressed, ARCOUNT incremented.
    public func appended(to message: [UInt8]) -> [UInt8] {
        precondition(message.count >= 12, "a DNS message has a 12-byte header")
        var bytes = message
        let count = (Int(bytes[10]) << 8 | Int(bytes[11])) + 1
        bytes[10] = UInt8(count >> 8)
        bytes[11] = UInt8(count & 0xff)
        var writer = ByteWriter()
        writer.appendUncompressed(keyName)
        writer.append16(DNSType.tsig)
        writer.append16(DNSClass.any)
        writer.append32(0)
        let data = rdata
        writer.append16(UInt16(data.count))
        writer.append(data)
        return bytes + writer.bytes
    }
}

/// A parsed message with its TSIG record, if the last additional record is one, and the bytes the
/// MAC of a response covers.
public struct SignedDNSMessage: Sendable {
    /// The message; its additional section no longer holds the TSIG record.
    public var message: DNSMessage
    public var tsig: TSIGRecord?
    /// The message bytes before the TSIG record, ARCOUNT decremented and the ID set to the TSIG's
    /// original ID (RFC 8945 §4.3.2); the raw bytes when there is no TSIG.
    public var unsignedBytes: [UInt8]

    /// Parses a message from a unicast DNS server (UDP or TCP: up to 65,535 bytes). A TSIG record
    /// anywhere but last is an error (RFC 8945 §5.1). Names inside SOA records are expanded, so
    /// ``ResourceRecord/soa`` works on a reply whose SOA names were compressed.
    public init(parsing bytes: [UInt8]) throws(DNSParseError) {
        var (message, lastOffset) = try DNSMessage.parse(bytes, maxRecords: DNSMessage.maxUnicastRecords)
        let tsigIndices = message.additionals.indices.filter { message.additionals[$0].type == DNSType.tsig }
        guard tsigIndices.count <= 1, message.answers.allSatisfy({ $0.type != DNSType.tsig }),
            message.authorities.allSatisfy({ $0.type != DNSType.tsig })
        else { throw .badRecordData(type: DNSType.tsig) }
        if let index = tsigIndices.first {
            guard index == message.additionals.count - 1, let lastOffset else { throw .badRecordData(type: DNSType.tsig) }
            let record = message.additionals.removeLast()
            guard case .other(_, let rdata) = record.data, record.recordClass == DNSClass.any else {
                throw .badRecordData(type: DNSType.tsig)
            }
            let tsig = try TSIGRecord(keyName: record.name, rdata: rdata)
            var unsigned = Array(bytes[..<lastOffset])
            let count = max(0, (Int(unsigned[10]) << 8 | Int(unsigned[11])) - 1)
            unsigned[10] = UInt8(count >> 8)
            unsigned[11] = UInt8(count & 0xff)
            unsigned[0] = UInt8(tsig.originalID >> 8)
            unsigned[1] = UInt8(tsig.originalID & 0xff)
            self.tsig = tsig
            self.unsignedBytes = unsigned
        } else {
            self.tsig = nil
            self.unsignedBytes = bytes
        }
        self.message = message
    }
}

extension DNSMessage {
    /// Most records accepted from one unicast message (UDP or TCP, up to 65,535 bytes; each
    /// record takes at least 11 bytes, so the header check bounds it anyway).
    public static let maxUnicastRecords = 8192

    /// Parses `bytes` with a record limit; also returns where the last additional record starts.
    static func parse(_ bytes: [UInt8], maxRecords: Int) throws(DNSParseError) -> (DNSMessage, lastAdditionalOffset: Int?) {
        var reader = DNSReader(bytes: bytes)
        let id = try reader.u16()
        let flags = try reader.u16()
        let counts = [try reader.u16(), try reader.u16(), try reader.u16(), try reader.u16()].map(Int.init)
        guard counts.reduce(0, +) <= maxRecords else { throw .tooManyRecords }
        guard counts[0] * 5 + (counts[1] + counts[2] + counts[3]) * 11 <= bytes.count - 12 else { throw .truncated }
        var questions: [DNSQuestion] = []
        questions.reserveCapacity(counts[0])
        for _ in 0..<counts[0] {
            let name = try reader.name()
            let type = try reader.u16()
            let rawClass = try reader.u16()
            questions.append(
                DNSQuestion(
                    name: name, type: type, unicastResponse: rawClass & 0x8000 != 0, questionClass: rawClass & 0x7fff))
        }
        let answers = try reader.records(counts[1])
        let authorities = try reader.records(counts[2])
        var additionals: [ResourceRecord] = []
        var lastOffset: Int?
        for _ in 0..<counts[3] {
            lastOffset = reader.offset
            additionals.append(try reader.record())
        }
        let message = DNSMessage(
            id: id, flags: flags, questions: questions, answers: answers, authorities: authorities,
            additionals: additionals)
        return (message, lastOffset)
    }
}

extension DNSReader {
    /// A name with no compression pointer (TSIG data, RFC 8945 §4.2).
    mutating func uncompressedName() throws(DNSParseError) -> DNSName {
        var labels: [[UInt8]] = []
        var length = 1
        while true {
            let byte = Int(try u8())
            if byte == 0 { return DNSName(checkedLabels: labels) }
            guard byte & 0xc0 == 0 else { throw .badLabel }
            length += 1 + byte
            guard length <= DNSName.maxWireBytes else { throw .nameTooLong }
            labels.append(try take(byte))
        }
    }
}

// MARK: - TCP framing

/// DNS over TCP (RFC 1035 §4.2.2, RFC 7766): each message is preceded by its length in two bytes.
public enum DNSTCPFraming {
    /// `message` with its length prefix.
    public static func frame(_ message: [UInt8]) -> [UInt8] {
        precondition(message.count <= 65535, "a DNS message over TCP is at most 65,535 bytes")
        return [UInt8(message.count >> 8), UInt8(message.count & 0xff)] + message
    }

    /// The first complete message in `buffer` and how many bytes it took (prefix included), or nil
    /// when more bytes are needed.
    public static func nextMessage(in buffer: [UInt8]) -> (message: [UInt8], consumed: Int)? {
        guard buffer.count >= 2 else { return nil }
        let length = Int(buffer[0]) << 8 | Int(buffer[1])
        guard buffer.count >= 2 + length else { return nil }
        return (Array(buffer[2..<2 + length]), 2 + length)
    }
}

// MARK: - Reverse-mapping names (RFC 6763 §11)

extension DNSName {
    /// The reverse-mapping name of a subnet, host bits zeroed, in the full form RFC 6763 §11 asks
    /// for: all four octets under `in-addr.arpa` (`0.1.81.10.in-addr.arpa` for 10.81.1.0/24), all 32
    /// nibbles under `ip6.arpa`. nil for an address that is not 4 or 16 bytes.
    public static func reverseSubnet(address: [UInt8], prefixLength: Int) -> DNSName? {
        guard address.count == 4 || address.count == 16 else { return nil }
        var network = address
        let bits = address.count * 8
        let prefix = max(0, min(prefixLength, bits))
        for bit in prefix..<bits { network[bit / 8] &= ~(0x80 >> UInt8(bit % 8)) }
        var labels: [[UInt8]] = []
        if address.count == 4 {
            for byte in network.reversed() { labels.append(Array(String(byte).utf8)) }
            labels += [Array("in-addr".utf8), Array("arpa".utf8)]
        } else {
            let hex = Array("0123456789abcdef".utf8)
            for byte in network.reversed() {
                labels.append([hex[Int(byte & 0xf)]])
                labels.append([hex[Int(byte >> 4)]])
            }
            labels += [Array("ip6".utf8), Array("arpa".utf8)]
        }
        return DNSName(labels: labels)
    }

    /// This name with `suffix`'s labels appended.
    public func appending(_ suffix: DNSName) -> DNSName? {
        DNSName(labels: labels + suffix.labels)
    }

    /// `prefix` (dotted text such as `b._dns-sd._udp`) in front of this name.
    public func prepending(_ prefix: String) -> DNSName? {
        DNSName(prefix).flatMap { DNSName(labels: $0.labels + labels) }
    }
}
