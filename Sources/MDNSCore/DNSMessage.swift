/// A DNS message (RFC 1035 §4.1) as mDNS uses it (RFC 6762 §18).
public struct DNSMessage: Hashable, Sendable {
    public var id: UInt16
    public var flags: UInt16
    public var questions: [DNSQuestion]
    public var answers: [ResourceRecord]
    public var authorities: [ResourceRecord]
    public var additionals: [ResourceRecord]

    /// QR: a response (1) or a query (0).
    public static let responseFlag: UInt16 = 0x8000
    /// AA: authoritative answer (set in every mDNS response, RFC 6762 §18.4).
    public static let authoritativeFlag: UInt16 = 0x0400
    /// TC: in a query, more known answers follow in the next packets (RFC 6762 §7.2).
    public static let truncatedFlag: UInt16 = 0x0200

    public init(
        id: UInt16 = 0, flags: UInt16 = 0, questions: [DNSQuestion] = [], answers: [ResourceRecord] = [],
        authorities: [ResourceRecord] = [], additionals: [ResourceRecord] = []
    ) {
        self.id = id
        self.flags = flags
        self.questions = questions
        self.answers = answers
        self.authorities = authorities
        self.additionals = additionals
    }

    public var isResponse: Bool { flags & Self.responseFlag != 0 }
    public var isTruncated: Bool { flags & Self.truncatedFlag != 0 }
    /// The OPCODE; mDNS messages with a non-zero opcode are ignored (RFC 6762 §18.3).
    public var opcode: UInt16 { (flags >> 11) & 0xf }
    /// The RCODE; mDNS messages with a non-zero rcode are ignored (RFC 6762 §18.11).
    public var rcode: UInt16 { flags & 0xf }

    /// Every record of the three record sections.
    public var records: [ResourceRecord] { answers + authorities + additionals }
}

/// Why a datagram was not a DNS message we accept. Nothing a peer sends can do more than this.
public enum DNSParseError: Error, Hashable, Sendable {
    case truncated
    /// A compression pointer that does not point strictly backwards (a loop or a forward jump).
    case badPointer
    /// A label type other than 0 (length) or 3 (pointer).
    case badLabel
    case nameTooLong
    /// Record data that does not match its type (an A record that is not 4 bytes, ...).
    case badRecordData(type: UInt16)
    case tooManyRecords
}

extension DNSMessage {
    /// Most records accepted from one message: 9,000 bytes hold at most ~800, so this only stops
    /// headers that announce more than the datagram can carry.
    public static let maxRecords = 1024

    /// Parses a datagram. Every length and pointer is checked; compression pointers must point
    /// strictly backwards, so a loop cannot make parsing spin; at most ``maxRecords`` records.
    /// Trailing bytes after the announced sections are tolerated (some stacks pad), not parsed.
    public init(parsing bytes: [UInt8]) throws(DNSParseError) {
        var reader = DNSReader(bytes: bytes)
        id = try reader.u16()
        flags = try reader.u16()
        let counts = [try reader.u16(), try reader.u16(), try reader.u16(), try reader.u16()].map(Int.init)
        guard counts.reduce(0, +) <= Self.maxRecords else { throw .tooManyRecords }
        // Each question needs at least 5 bytes, each record 11: a header cannot make us reserve more
        // than the datagram could hold.
        guard counts[0] * 5 + (counts[1] + counts[2] + counts[3]) * 11 <= bytes.count - 12 else { throw .truncated }
        questions = []
        questions.reserveCapacity(counts[0])
        for _ in 0..<counts[0] {
            let name = try reader.name()
            let type = try reader.u16()
            let rawClass = try reader.u16()
            questions.append(
                DNSQuestion(
                    name: name, type: type, unicastResponse: rawClass & 0x8000 != 0, questionClass: rawClass & 0x7fff))
        }
        answers = try reader.records(counts[1])
        authorities = try reader.records(counts[2])
        additionals = try reader.records(counts[3])
    }

    /// Encodes with name compression. Records that do not fit in `maxSize` bytes are left out;
    /// use ``MessageWriter`` to split across packets.
    public func encoded(maxSize: Int = 9000) -> [UInt8] {
        var writer = MessageWriter(id: id, flags: flags, maxSize: maxSize)
        for question in questions { _ = writer.add(question) }
        for record in answers { _ = writer.add(record, to: .answer) }
        for record in authorities { _ = writer.add(record, to: .authority) }
        for record in additionals { _ = writer.add(record, to: .additional) }
        return writer.finish()
    }
}

/// Bounds-checked reading of a DNS message.
struct DNSReader {
    let bytes: [UInt8]
    var offset = 0

    init(bytes: [UInt8]) {
        self.bytes = bytes
    }

    mutating func u8() throws(DNSParseError) -> UInt8 {
        guard offset < bytes.count else { throw .truncated }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func u16() throws(DNSParseError) -> UInt16 {
        guard offset + 2 <= bytes.count else { throw .truncated }
        defer { offset += 2 }
        return UInt16(bytes[offset]) << 8 | UInt16(bytes[offset + 1])
    }

    mutating func u32() throws(DNSParseError) -> UInt32 {
        guard offset + 4 <= bytes.count else { throw .truncated }
        defer { offset += 4 }
        return UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8
            | UInt32(bytes[offset + 3])
    }

    mutating func take(_ count: Int) throws(DNSParseError) -> [UInt8] {
        guard count >= 0, offset + count <= bytes.count else { throw .truncated }
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }

    /// Reads a possibly compressed name at the current offset and moves past it.
    ///
    /// A pointer must point before the start of the label run it ends (so every jump goes strictly
    /// backwards and the walk ends after at most `offset` steps); a name is at most 255 bytes.
    mutating func name() throws(DNSParseError) -> DNSName {
        var labels: [[UInt8]] = []
        var position = offset
        var runStart = offset
        var end: Int?
        var length = 1
        while true {
            guard position < bytes.count else { throw .truncated }
            let byte = Int(bytes[position])
            switch byte & 0xc0 {
            case 0x00:
                if byte == 0 {
                    offset = end ?? position + 1
                    return DNSName(checkedLabels: labels)
                }
                guard position + 1 + byte <= bytes.count else { throw .truncated }
                length += 1 + byte
                guard length <= DNSName.maxWireBytes else { throw .nameTooLong }
                labels.append(Array(bytes[position + 1..<position + 1 + byte]))
                position += 1 + byte
            case 0xc0:
                guard position + 1 < bytes.count else { throw .truncated }
                let target = (byte & 0x3f) << 8 | Int(bytes[position + 1])
                if end == nil { end = position + 2 }
                guard target < runStart else { throw .badPointer }
                runStart = target
                position = target
            default:
                throw .badLabel
            }
        }
    }

    mutating func records(_ count: Int) throws(DNSParseError) -> [ResourceRecord] {
        var records: [ResourceRecord] = []
        records.reserveCapacity(count)
        for _ in 0..<count { records.append(try record()) }
        return records
    }

    mutating func record() throws(DNSParseError) -> ResourceRecord {
        let owner = try name()
        let type = try u16()
        let rawClass = try u16()
        let ttl = try u32()
        let length = Int(try u16())
        let start = offset
        let end = start + length
        guard end <= bytes.count else { throw .truncated }
        let data: RecordData
        let recordClass = rawClass & 0x7fff
        if length == 0 && (recordClass == DNSClass.none || recordClass == DNSClass.any) {
            // DNS UPDATE's prerequisite and delete forms (RFC 2136 §2.4, §2.5): no data, any type.
            return ResourceRecord(
                name: owner, data: .other(type: type, rdata: []), ttl: ttl, cacheFlush: rawClass & 0x8000 != 0,
                recordClass: recordClass)
        }
        switch type {
        case DNSType.soa:
            // Kept raw, but with its two names expanded: a server's reply may compress them.
            var expanded = ByteWriter()
            expanded.appendUncompressed(try name())
            expanded.appendUncompressed(try name())
            expanded.append(try take(20))
            data = .other(type: type, rdata: expanded.bytes)
        case DNSType.a:
            guard length == 4 else { throw .badRecordData(type: type) }
            data = .a(try take(4))
        case DNSType.aaaa:
            guard length == 16 else { throw .badRecordData(type: type) }
            data = .aaaa(try take(16))
        case DNSType.ptr:
            data = .ptr(try name())
        case DNSType.srv:
            guard length >= 7 else { throw .badRecordData(type: type) }
            let priority = try u16()
            let weight = try u16()
            let port = try u16()
            data = .srv(priority: priority, weight: weight, port: port, target: try name())
        case DNSType.txt:
            var strings: [[UInt8]] = []
            while offset < end {
                let count = Int(try u8())
                guard offset + count <= end else { throw .badRecordData(type: type) }
                strings.append(try take(count))
            }
            // No data at all is read as the empty record it stands for: one empty string.
            data = .txt(strings.isEmpty ? [[]] : strings)
        case DNSType.nsec:
            let next = try name()
            var types: [UInt16] = []
            while offset < end {
                let window = UInt16(try u8())
                let count = Int(try u8())
                guard count >= 1, count <= 32, offset + count <= end else { throw .badRecordData(type: type) }
                for (index, bits) in try take(count).enumerated() {
                    for bit in 0..<8 where bits & (0x80 >> UInt8(bit)) != 0 {
                        types.append(window << 8 | UInt16(index * 8 + bit))
                    }
                }
            }
            data = .nsec(next: next, types: types)
        default:
            data = .other(type: type, rdata: try take(length))
        }
        // Names inside the data must end inside it.
        guard offset == end else { throw .badRecordData(type: type) }
        return ResourceRecord(
            name: owner, data: data, ttl: ttl, cacheFlush: rawClass & 0x8000 != 0, recordClass: rawClass & 0x7fff)
    }
}

/// Appends big-endian integers and names.
struct ByteWriter {
    var bytes: [UInt8] = []

    mutating func append8(_ value: UInt8) { bytes.append(value) }
    mutating func append16(_ value: UInt16) { bytes += [UInt8(value >> 8), UInt8(value & 0xff)] }
    mutating func append32(_ value: UInt32) {
        bytes += [UInt8(value >> 24), UInt8((value >> 16) & 0xff), UInt8((value >> 8) & 0xff), UInt8(value & 0xff)]
    }
    mutating func append(_ data: [UInt8]) { bytes += data }

    mutating func appendUncompressed(_ name: DNSName, lowercase: Bool = false) {
        for label in name.labels {
            append8(UInt8(label.count))
            append(lowercase ? DNSName.lowercased(label) : label)
        }
        append8(0)
    }
}

/// Writes one DNS message with name compression, refusing (and undoing) whatever would make it
/// larger than `maxSize`, so a caller can fill a packet and start the next one.
public struct MessageWriter {
    public enum Section: Int, Comparable, Sendable {
        case answer = 1
        case authority = 2
        case additional = 3
        public static func < (lhs: Section, rhs: Section) -> Bool { lhs.rawValue < rhs.rawValue }
    }

    private var writer = ByteWriter()
    /// Offsets of names already written, by their canonical (lower-cased) label suffix.
    private var offsets: [[[UInt8]]: Int] = [:]
    private var counts = [0, 0, 0, 0]
    private var lastSection = 0
    public let maxSize: Int

    public init(id: UInt16, flags: UInt16, maxSize: Int) {
        self.maxSize = maxSize
        writer.append16(id)
        writer.append16(flags)
        for _ in 0..<4 { writer.append16(0) }
    }

    /// Records and questions written so far.
    public var isEmpty: Bool { counts.allSatisfy { $0 == 0 } }
    /// Bytes written so far.
    public var size: Int { writer.bytes.count }

    /// Adds a question (before any record); false when it does not fit (nothing written).
    public mutating func add(_ question: DNSQuestion) -> Bool {
        precondition(lastSection == 0, "questions come before records")
        return attempt {
            $0.writeName(question.name)
            $0.writer.append16(question.type)
            $0.writer.append16(question.questionClass | (question.unicastResponse ? 0x8000 : 0))
            $0.counts[0] += 1
        }
    }

    /// Adds a record to a section (sections in order); false when it does not fit (nothing written).
    public mutating func add(_ record: ResourceRecord, to section: Section) -> Bool {
        precondition(section.rawValue >= lastSection, "sections are written in order")
        lastSection = section.rawValue
        return attempt {
            $0.writeName(record.name)
            $0.writer.append16(record.type)
            $0.writer.append16(record.recordClass | (record.cacheFlush ? 0x8000 : 0))
            $0.writer.append32(record.ttl)
            let lengthAt = $0.writer.bytes.count
            $0.writer.append16(0)
            $0.writeData(record.data)
            let length = $0.writer.bytes.count - lengthAt - 2
            $0.writer.bytes[lengthAt] = UInt8(length >> 8)
            $0.writer.bytes[lengthAt + 1] = UInt8(length & 0xff)
            $0.counts[section.rawValue] += 1
        }
    }

    /// The message bytes.
    public func finish() -> [UInt8] {
        var bytes = writer.bytes
        for (index, count) in counts.enumerated() {
            bytes[4 + index * 2] = UInt8(count >> 8)
            bytes[5 + index * 2] = UInt8(count & 0xff)
        }
        return bytes
    }

    private mutating func attempt(_ body: (inout MessageWriter) -> Void) -> Bool {
        let saved = self
        body(&self)
        if writer.bytes.count > maxSize {
            self = saved
            return false
        }
        return true
    }

    private mutating func writeName(_ name: DNSName) {
        let canonical = name.canonicalLabels
        for index in canonical.indices {
            let suffix = Array(canonical[index...])
            if let offset = offsets[suffix] {
                writer.append16(0xc000 | UInt16(offset))
                return
            }
            if writer.bytes.count < 0x3fff { offsets[suffix] = writer.bytes.count }
            writer.append8(UInt8(name.labels[index].count))
            writer.append(name.labels[index])
        }
        writer.append8(0)
    }

    private mutating func writeData(_ data: RecordData) {
        switch data {
        case .a(let bytes), .aaaa(let bytes): writer.append(bytes)
        case .ptr(let name): writeName(name)
        case .srv(let priority, let weight, let port, let target):
            writer.append16(priority)
            writer.append16(weight)
            writer.append16(port)
            writeName(target)
        case .txt(let strings):
            if strings.isEmpty { writer.append8(0) }  // an empty TXT record is one empty string (RFC 6763 §6.1)
            for string in strings {
                writer.append8(UInt8(min(string.count, 255)))
                writer.append(Array(string.prefix(255)))
            }
        case .nsec(let next, let types):
            writer.appendUncompressed(next)
            writer.append(nsecBitmap(types))
        case .other(_, let rdata): writer.append(rdata)
        }
    }
}
