/// A domain name as a sequence of labels (RFC 1035 §3.1). Labels are raw bytes: a DNS-SD instance
/// name is any UTF-8 up to 63 bytes and may contain dots, so a name is never split on dots after
/// it was built.
///
/// Equality and hashing ignore ASCII case (RFC 1035 §2.3.3, RFC 6762 §16); the bytes keep the case
/// they were created with.
public struct DNSName: Hashable, Sendable, CustomStringConvertible {
    /// The labels, most specific first (`["Lobby", "_chat", "_tcp", "local"]`).
    public let labels: [[UInt8]]

    /// The longest label (RFC 1035 §2.3.4).
    public static let maxLabelBytes = 63
    /// The longest name on the wire, length bytes and root included (RFC 1035 §2.3.4).
    public static let maxWireBytes = 255

    /// A name from labels; nil when a label is empty or too long, or the name too long.
    public init?(labels: [[UInt8]]) {
        guard labels.allSatisfy({ !$0.isEmpty && $0.count <= Self.maxLabelBytes }) else { return nil }
        guard labels.reduce(1, { $0 + 1 + $1.count }) <= Self.maxWireBytes else { return nil }
        self.labels = labels
    }

    /// Labels already checked (by the parser or by the caller).
    init(checkedLabels: [[UInt8]]) {
        self.labels = checkedLabels
    }

    /// A name from dotted text: `_chat._tcp.local`. A dot inside a label is written `\.`, a backslash
    /// `\\`, any byte `\DDD` (decimal). A trailing dot is allowed. Nil when malformed.
    public init?(_ text: String) {
        var labels: [[UInt8]] = []
        var current: [UInt8] = []
        var bytes = Array(text.utf8)[...]
        if bytes.last == UInt8(ascii: "."), bytes.count > 1 { bytes = bytes.dropLast() }
        while let byte = bytes.popFirst() {
            switch byte {
            case UInt8(ascii: "."):
                labels.append(current)
                current = []
            case UInt8(ascii: "\\"):
                guard let next = bytes.popFirst() else { return nil }
                if next >= UInt8(ascii: "0"), next <= UInt8(ascii: "9") {
                    let digits = [next] + Array(bytes.prefix(2))
                    guard digits.count == 3, digits.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
                    let value = digits.reduce(0) { $0 * 10 + Int($1 - 48) }
                    guard value <= 255 else { return nil }
                    bytes = bytes.dropFirst(2)
                    current.append(UInt8(value))
                } else {
                    current.append(next)
                }
            default:
                current.append(byte)
            }
        }
        labels.append(current)
        self.init(labels: labels)
    }

    /// `instance` as one label in front of `service` (the DNS-SD service instance name).
    public init?(instance: String, service: DNSName) {
        self.init(labels: [Array(instance.utf8)] + service.labels)
    }

    /// The root name (no labels).
    public static let root = DNSName(checkedLabels: [])

    /// Bytes on the wire without compression.
    public var wireLength: Int { labels.reduce(1) { $0 + 1 + $1.count } }

    /// The name without its first label (nil for the root).
    public var parent: DNSName? { labels.isEmpty ? nil : DNSName(checkedLabels: Array(labels.dropFirst())) }

    /// The first label as text (UTF-8, invalid bytes replaced).
    public var firstLabelText: String { labels.first.map { String(decoding: $0, as: UTF8.self) } ?? "" }

    /// Whether this name ends with `suffix` (ASCII case ignored).
    public func hasSuffix(_ suffix: DNSName) -> Bool {
        guard suffix.labels.count <= labels.count else { return false }
        let offset = labels.count - suffix.labels.count
        for (index, label) in suffix.labels.enumerated() where !Self.labelsEqual(labels[offset + index], label) {
            return false
        }
        return true
    }

    /// Lower-cased labels: the canonical form for comparing and hashing.
    public var canonicalLabels: [[UInt8]] { labels.map(Self.lowercased) }

    static func lowercased(_ label: [UInt8]) -> [UInt8] {
        label.map { $0 >= 65 && $0 <= 90 ? $0 | 0x20 : $0 }
    }

    static func labelsEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        for index in a.indices {
            let x = a[index]
            let y = b[index]
            if x == y { continue }
            // Equal ignoring case only when both are the same ASCII letter.
            let folded = x | 0x20
            guard folded == y | 0x20, folded >= 97, folded <= 122 else { return false }
        }
        return true
    }

    public static func == (lhs: DNSName, rhs: DNSName) -> Bool {
        guard lhs.labels.count == rhs.labels.count else { return false }
        for index in lhs.labels.indices where !labelsEqual(lhs.labels[index], rhs.labels[index]) { return false }
        return true
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(labels.count)
        for label in labels {
            hasher.combine(label.count)
            for byte in label { hasher.combine(byte >= 65 && byte <= 90 ? byte | 0x20 : byte) }
        }
    }

    /// Dotted text with `\.`, `\\` and `\DDD` escapes (no trailing dot); `.` for the root.
    public var description: String {
        guard !labels.isEmpty else { return "." }
        return labels.map(Self.escaped).joined(separator: ".")
    }

    static func escaped(_ label: [UInt8]) -> String {
        var out: [UInt8] = []
        for byte in label {
            switch byte {
            case UInt8(ascii: "."), UInt8(ascii: "\\"):
                out += [UInt8(ascii: "\\"), byte]
            case 0..<32, 127:
                let text = String(byte)
                out +=
                    [UInt8(ascii: "\\")] + Array(String(repeating: "0", count: 3 - text.count).utf8) + Array(text.utf8)
            default:
                out.append(byte)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

extension DNSName {
    /// `_services._dns-sd._udp.local`: where DNS-SD lists the service types present (RFC 6763 §9).
    public static let serviceTypeEnumeration = DNSName("_services._dns-sd._udp.local")!
    /// `local`.
    public static let local = DNSName("local")!
}
