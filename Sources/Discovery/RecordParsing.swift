/// Parsing of raw DNS record data as it arrives from the network (pure functions: no Avahi, no I/O,
/// fuzzed by Tests/fuzz/run-fuzz-wire.sh). Anything a hostile publisher can send must parse or be
/// rejected here without crashing, hanging or allocating without bound.

extension TXTRecord {
    /// Parses TXT RDATA: a sequence of length-prefixed character-strings (RFC 1035 §3.3.14,
    /// RFC 6763 §6). Returns nil when a length runs past the end. At most 64 KiB is read (the DNS
    /// limit for one record); entries beyond are ignored.
    public init?(rdata: [UInt8]) {
        var entries: [[UInt8]] = []
        var index = 0
        let end = min(rdata.count, 65535)
        while index < end {
            let length = Int(rdata[index])
            index += 1
            guard index + length <= end else { return nil }
            entries.append(Array(rdata[index..<index + length]))
            index += length
        }
        self.init(wireEntries: entries)
    }
}

extension IPAddress {
    /// An address from A (type 1, 4 bytes) or AAAA (type 28, 16 bytes) record data; nil for
    /// anything else (a malformed record from the network is ignored, not trusted).
    public init?(recordType: UInt16, rdata: [UInt8]) {
        switch (recordType, rdata.count) {
        case (1, 4): self = .v4(rdata[0], rdata[1], rdata[2], rdata[3])
        case (28, 16): self = .v6(rdata)
        default: return nil
        }
    }
}
