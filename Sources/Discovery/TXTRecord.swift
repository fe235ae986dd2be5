/// A DNS-SD TXT record: an ordered list of `key=value` entries (RFC 6763 §6).
///
/// Values are bytes; a key may also stand alone (a boolean attribute, `value == nil`).
/// Validation follows RFC 6763 and Avahi's limits: a key is non-empty and has no `=`,
/// one entry is at most 255 bytes, and the whole record at most 1300 bytes.
public struct TXTRecord: Sendable, Hashable, CustomStringConvertible, ExpressibleByDictionaryLiteral {
    /// One `key=value` entry.
    public struct Entry: Sendable, Hashable {
        /// The key (case-insensitive per RFC 6763, compared as given here).
        public var key: String
        /// The value bytes, or nil for a key that stands alone.
        public var value: [UInt8]?

        public init(key: String, value: [UInt8]?) {
            self.key = key
            self.value = value
        }

        /// The entry as it goes on the wire: `key`, or `key=value`.
        public var bytes: [UInt8] {
            var out = Array(key.utf8)
            if let value {
                out.append(UInt8(ascii: "="))
                out.append(contentsOf: value)
            }
            return out
        }
    }

    /// Maximum bytes in one entry (the DNS character-string limit).
    public static let maxEntryBytes = 255
    /// Maximum bytes in a whole record that we publish (RFC 6763 §6.2 recommendation).
    public static let maxRecordBytes = 1300

    /// The entries, in order.
    public private(set) var entries: [Entry] = []

    public init() {}

    public init(_ strings: [String: String]) {
        for key in strings.keys.sorted() { self[key] = strings[key] }
    }

    public init(dictionaryLiteral elements: (String, String)...) {
        for (key, value) in elements { self[key] = value }
    }

    /// Parses wire entries (each one character-string of the TXT RDATA).
    /// Entries without a key (starting with `=`) are ignored, as RFC 6763 §6.4 says; a repeated key
    /// keeps its first value (§6.4). Avahi's own `org.freedesktop.Avahi.cookie` entry is dropped.
    public init(wireEntries: [[UInt8]]) {
        for raw in wireEntries where !raw.isEmpty {
            let split = raw.firstIndex(of: UInt8(ascii: "="))
            let keyBytes = split.map { Array(raw[..<$0]) } ?? raw
            guard !keyBytes.isEmpty else { continue }
            let key = String(decoding: keyBytes, as: UTF8.self)
            if key == "org.freedesktop.Avahi.cookie" { continue }
            if entries.contains(where: { $0.key.lowercased() == key.lowercased() }) { continue }
            let value = split.map { Array(raw[raw.index(after: $0)...]) }
            entries.append(Entry(key: key, value: value))
        }
    }

    /// The value bytes for a key; nil when absent or when the key stands alone.
    public func data(for key: String) -> [UInt8]? {
        entries.first { $0.key.lowercased() == key.lowercased() }?.value
    }

    /// Whether the key is present (with or without a value).
    public func contains(_ key: String) -> Bool {
        entries.contains { $0.key.lowercased() == key.lowercased() }
    }

    /// The value as UTF-8 text; set to nil to remove the key.
    public subscript(key: String) -> String? {
        get { data(for: key).map { String(decoding: $0, as: UTF8.self) } }
        set { setData(newValue.map { Array($0.utf8) }, for: key, remove: newValue == nil) }
    }

    /// Sets raw bytes for a key (nil value: a key that stands alone).
    public mutating func set(_ value: [UInt8]?, for key: String) {
        setData(value, for: key, remove: false)
    }

    /// Removes a key.
    public mutating func remove(_ key: String) {
        entries.removeAll { $0.key.lowercased() == key.lowercased() }
    }

    private mutating func setData(_ value: [UInt8]?, for key: String, remove: Bool) {
        if let index = entries.firstIndex(where: { $0.key.lowercased() == key.lowercased() }) {
            if remove { entries.remove(at: index) } else { entries[index].value = value }
        } else if !remove {
            entries.append(Entry(key: key, value: value))
        }
    }

    /// Total size on the wire (each entry plus its length byte).
    public var wireSize: Int { entries.reduce(0) { $0 + 1 + $1.bytes.count } }

    /// Checks the record against the limits; throws a ``DiscoveryError`` with code `.invalidTXT`.
    public func validate() throws(DiscoveryError) {
        for entry in entries {
            if entry.key.isEmpty {
                throw DiscoveryError(.invalidTXT, "TXT entry has an empty key; give every entry a key")
            }
            if entry.key.utf8.contains(UInt8(ascii: "=")) {
                throw DiscoveryError(.invalidTXT, "TXT key '\(entry.key)' contains '='; keys cannot contain '='")
            }
            let size = entry.bytes.count
            if size > Self.maxEntryBytes {
                throw DiscoveryError(
                    .invalidTXT,
                    "TXT entry '\(entry.key)' is \(size) bytes; an entry is at most \(Self.maxEntryBytes) bytes (key=value). Shorten the value or split it across keys"
                )
            }
        }
        if wireSize > Self.maxRecordBytes {
            throw DiscoveryError(
                .invalidTXT,
                "TXT record is \(wireSize) bytes; keep it at most \(Self.maxRecordBytes) bytes (RFC 6763 §6.2). Move large data into the connection instead"
            )
        }
    }

    public var description: String {
        entries.map { entry in
            guard let value = entry.value else { return entry.key }
            let text = String(validating: value, as: UTF8.self) ?? value.map { String($0, radix: 16) }.joined()
            return "\(entry.key)=\(text)"
        }.joined(separator: " ")
    }
}
