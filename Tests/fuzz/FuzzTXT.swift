// libFuzzer target for what a hostile DNS-SD publisher controls: TXT RDATA and TXT entries, and
// A/AAAA record data. Built by run-fuzz-wire.sh with Sources/Discovery/{TXTRecord,DiscoveryError,
// RecordParsing,Types}.swift. Invariants: no crash; parsed records validate or fail cleanly; a record
// that validates survives a round trip through its wire form.

@inline(__always)
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("TXT fuzz invariant violated: \(message())") }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTXT(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let record = TXTRecord(rdata: bytes) {
        _ = record.description
        for entry in record.entries { _ = record.data(for: entry.key); _ = record[entry.key] }
        if (try? record.validate()) != nil {
            var rdata: [UInt8] = []
            for entry in record.entries {
                let wire = entry.bytes
                rdata.append(UInt8(wire.count))
                rdata += wire
            }
            let again = TXTRecord(rdata: rdata)
            check(again == record, "round trip changed \(record)")
        }
    }
    // The same bytes as one entry list split at zero bytes (the resolver's pre-split form).
    let entries = bytes.split(separator: 0, omittingEmptySubsequences: false).map(Array.init)
    _ = TXTRecord(wireEntries: entries).description
    if bytes.count >= 2 {
        let type: UInt16 = bytes[0] & 1 == 0 ? 1 : 28
        if let ip = IPAddress(recordType: type, rdata: Array(bytes.dropFirst())) {
            _ = ip.description
            _ = ip.isLinkLocal
            check(ip.bytes == Array(bytes.dropFirst()), "address bytes changed")
        }
    }
    return 0
}
