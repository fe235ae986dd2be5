/// Record types used by mDNS / DNS-SD (RFC 1035, 2782, 3596, 4034).
public enum DNSType {
    public static let a: UInt16 = 1
    public static let ptr: UInt16 = 12
    public static let txt: UInt16 = 16
    public static let aaaa: UInt16 = 28
    public static let srv: UInt16 = 33
    public static let nsec: UInt16 = 47
    public static let any: UInt16 = 255
}

/// The class IN; mDNS uses its top bit as the cache-flush (answers) or unicast-response (questions) bit.
public let dnsClassIN: UInt16 = 1

/// The data of a resource record, parsed for the types mDNS needs and kept raw for the others.
public enum RecordData: Hashable, Sendable, CustomStringConvertible {
    /// IPv4 address, 4 bytes.
    case a([UInt8])
    /// IPv6 address, 16 bytes.
    case aaaa([UInt8])
    case ptr(DNSName)
    case srv(priority: UInt16, weight: UInt16, port: UInt16, target: DNSName)
    /// Character-strings, in order (an empty TXT record is one empty string on the wire).
    case txt([[UInt8]])
    /// Next domain name and the types present (RFC 4034 §4; mDNS uses it for negative answers).
    case nsec(next: DNSName, types: [UInt16])
    /// Any other type: raw bytes.
    case other(type: UInt16, rdata: [UInt8])

    public var type: UInt16 {
        switch self {
        case .a: DNSType.a
        case .aaaa: DNSType.aaaa
        case .ptr: DNSType.ptr
        case .srv: DNSType.srv
        case .txt: DNSType.txt
        case .nsec: DNSType.nsec
        case .other(let type, _): type
        }
    }

    /// The rdata in canonical form: uncompressed, names lower-cased (RFC 4034 §6.2). Used to order
    /// records for probe tie-breaking (RFC 6762 §8.2).
    public var canonicalBytes: [UInt8] {
        var writer = ByteWriter()
        switch self {
        case .a(let bytes), .aaaa(let bytes): writer.append(bytes)
        case .ptr(let name): writer.appendUncompressed(name, lowercase: true)
        case .srv(let priority, let weight, let port, let target):
            writer.append16(priority)
            writer.append16(weight)
            writer.append16(port)
            writer.appendUncompressed(target, lowercase: true)
        case .txt(let strings):
            if strings.isEmpty { writer.append8(0) }  // as sent: one empty string (RFC 6763 §6.1)
            for string in strings {
                writer.append8(UInt8(min(string.count, 255)))
                writer.append(Array(string.prefix(255)))
            }
        case .nsec(let next, let types):
            writer.appendUncompressed(next, lowercase: true)
            writer.append(nsecBitmap(types))
        case .other(_, let rdata): writer.append(rdata)
        }
        return writer.bytes
    }

    public var description: String {
        switch self {
        case .a(let bytes): bytes.map(String.init).joined(separator: ".")
        case .aaaa(let bytes):
            stride(from: 0, to: bytes.count, by: 2).map {
                String(UInt16(bytes[$0]) << 8 | UInt16(bytes[$0 + 1]), radix: 16)
            }.joined(separator: ":")
        case .ptr(let name): name.description
        case .srv(let priority, let weight, let port, let target): "\(priority) \(weight) \(port) \(target)"
        case .txt(let strings): strings.map { "\"\(String(decoding: $0, as: UTF8.self))\"" }.joined(separator: " ")
        case .nsec(let next, let types): "\(next) \(types)"
        case .other(let type, let rdata): "type\(type) \(rdata.count) bytes"
        }
    }
}

/// A resource record as mDNS sees it.
public struct ResourceRecord: Hashable, Sendable, CustomStringConvertible {
    public var name: DNSName
    public var data: RecordData
    /// Class without the cache-flush bit (1 = IN).
    public var recordClass: UInt16
    /// The cache-flush bit (RFC 6762 §10.2): this record replaces every older one of its name and type.
    public var cacheFlush: Bool
    /// Seconds; 0 is a goodbye (RFC 6762 §10.1).
    public var ttl: UInt32

    public init(
        name: DNSName, data: RecordData, ttl: UInt32, cacheFlush: Bool = false, recordClass: UInt16 = dnsClassIN
    ) {
        self.name = name
        self.data = data
        self.ttl = ttl
        self.cacheFlush = cacheFlush
        self.recordClass = recordClass
    }

    public var type: UInt16 { data.type }

    /// Same name, type, class and data (TTL and cache-flush bit ignored): the same record.
    public func sameRecord(as other: ResourceRecord) -> Bool {
        recordClass == other.recordClass && name == other.name && data == other.data
    }

    public var description: String { "\(name) \(typeName(type)) \(data) ttl=\(ttl)\(cacheFlush ? " flush" : "")" }
}

/// A question of a query.
public struct DNSQuestion: Hashable, Sendable, CustomStringConvertible {
    public var name: DNSName
    public var type: UInt16
    public var questionClass: UInt16
    /// The QU bit (RFC 6762 §5.4): the querier asks for a unicast response.
    public var unicastResponse: Bool

    public init(name: DNSName, type: UInt16, unicastResponse: Bool = false, questionClass: UInt16 = dnsClassIN) {
        self.name = name
        self.type = type
        self.unicastResponse = unicastResponse
        self.questionClass = questionClass
    }

    /// Whether `record` answers this question (name, class, and type or ANY).
    public func isAnswered(by record: ResourceRecord) -> Bool {
        (type == DNSType.any || type == record.type)
            && (questionClass == record.recordClass || questionClass == DNSType.any) && name == record.name
    }

    public var description: String { "\(name) \(typeName(type))\(unicastResponse ? " QU" : "")" }
}

func typeName(_ type: UInt16) -> String {
    switch type {
    case DNSType.a: "A"
    case DNSType.aaaa: "AAAA"
    case DNSType.ptr: "PTR"
    case DNSType.srv: "SRV"
    case DNSType.txt: "TXT"
    case DNSType.nsec: "NSEC"
    case DNSType.any: "ANY"
    default: "TYPE\(type)"
    }
}

/// The type bitmap of an NSEC record (RFC 4034 §4.1.2).
func nsecBitmap(_ types: [UInt16]) -> [UInt8] {
    var windows: [UInt8: [UInt8]] = [:]
    for type in Set(types) {
        let window = UInt8(type >> 8)
        let low = Int(type & 0xff)
        var bits = windows[window] ?? []
        if bits.count < low / 8 + 1 { bits += [UInt8](repeating: 0, count: low / 8 + 1 - bits.count) }
        bits[low / 8] |= 0x80 >> UInt8(low % 8)
        windows[window] = bits
    }
    var out: [UInt8] = []
    for window in windows.keys.sorted() {
        let bits = windows[window]!
        out += [window, UInt8(bits.count)] + bits
    }
    return out
}
