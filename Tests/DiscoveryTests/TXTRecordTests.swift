import Testing

@testable import Discovery

@Suite struct TXTRecordTests {
    @Test func stringAndBinaryValuesKeepOrder() throws {
        var txt = TXTRecord()
        txt["path"] = "/x"
        txt.set([0, 1, 2, 255], for: "bin")
        txt.set(nil, for: "flag")
        #expect(txt.entries.map(\.key) == ["path", "bin", "flag"])
        #expect(txt["path"] == "/x")
        #expect(txt.data(for: "BIN") == [0, 1, 2, 255])  // keys are case-insensitive
        #expect(txt.contains("flag") && txt.data(for: "flag") == nil)
        #expect(txt.entries[2].bytes == Array("flag".utf8))
        try txt.validate()
    }

    @Test func emptyKeyRejected() {
        var txt = TXTRecord()
        txt[""] = "x"
        #expect(throws: DiscoveryError.self) { try txt.validate() }
        do { try txt.validate() } catch { #expect(error.code == .invalidTXT && error.message.contains("empty key")) }
    }

    @Test func keyWithEqualsRejected() {
        var txt = TXTRecord()
        txt["a=b"] = "x"
        do { try txt.validate(); Issue.record("accepted a key with '='") } catch { #expect(error.code == .invalidTXT) }
    }

    @Test(arguments: [(253, true), (254, false)])
    func entryLimitIs255Bytes(valueLength: Int, valid: Bool) {
        var txt = TXTRecord()
        txt["k"] = String(repeating: "v", count: valueLength)  // "k=" + value
        #expect(txt.entries[0].bytes.count == valueLength + 2)
        do {
            try txt.validate()
            #expect(valid)
        } catch {
            #expect(!valid && error.code == .invalidTXT && error.message.contains("255"))
        }
    }

    @Test func wholeRecordLimitIs1300Bytes() {
        var txt = TXTRecord()
        for index in 0..<6 { txt["k\(index)"] = String(repeating: "x", count: 200) }  // 6 × 204 = 1224
        #expect(throws: Never.self) { try txt.validate() }
        txt["k6"] = String(repeating: "x", count: 100)  // + 104 = 1328
        do { try txt.validate(); Issue.record("accepted \(txt.wireSize) bytes") } catch {
            #expect(error.code == .invalidTXT && error.message.contains("1300"))
        }
    }

    @Test func parsingWireEntries() {
        let txt = TXTRecord(wireEntries: [
            Array("a=1".utf8), Array("=orphan".utf8), Array("flag".utf8), Array("A=dup".utf8), [],
            Array("org.freedesktop.Avahi.cookie=12345".utf8), Array("empty=".utf8), [0x62, 0x3D, 0xFF, 0x00],
        ])
        #expect(txt.entries.map(\.key) == ["a", "flag", "empty", "b"])
        #expect(txt["a"] == "1")  // first value of a repeated key wins (RFC 6763 §6.4)
        #expect(txt.data(for: "flag") == nil && txt.contains("flag"))
        #expect(txt.data(for: "empty") == [])
        #expect(txt.data(for: "b") == [0xFF, 0x00])
    }

    @Test func serviceTypeValidation() {
        #expect(throws: Never.self) { try ServiceDiscovery.validateType("_chat._tcp") }
        #expect(throws: DiscoveryError.self) { try ServiceDiscovery.validateType("chat") }
        #expect(throws: DiscoveryError.self) { try ServiceDiscovery.validateType("_chat._xyz") }
    }

    @Test func linkLocalScope() {
        let linkLocal = ServiceAddress(ip: .v6([0xfe, 0x80] + Array(repeating: 0, count: 13) + [1]), interfaceIndex: 7, port: 80)
        #expect(linkLocal.scopeID == 7)
        #expect(linkLocal.numericHost == "fe80::1%7")
        let global = ServiceAddress(ip: .v6([0xfd, 0x77] + Array(repeating: 0, count: 13) + [1]), interfaceIndex: 7, port: 80)
        #expect(global.scopeID == 0 && global.numericHost == "fd77::1")
        let v4 = ServiceAddress(ip: .v4(10, 77, 0, 1), interfaceIndex: 2, port: 80)
        #expect(v4.description == "10.77.0.1:80")
    }
}
