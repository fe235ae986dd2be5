import FastJSON
import Foundation
import Testing

/// Inputs that Foundation's JSONDecoder accepts must decode identically, and inputs it rejects
/// must fail with the same `DecodingError` case (differences are listed in docs/JSON.md).
@Suite("Decoding compatibility with Foundation")
struct DecodingCompatibilityTests {
    static let numbers = [
        "0", "-0", "1", "-1", "7", "127", "128", "-128", "-129", "255", "256", "32767", "-32768", "65535",
        "2147483647", "-2147483648", "4294967295", "9223372036854775807", "-9223372036854775808",
        "9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616",
        "1.0", "1.5", "-1.5", "1e2", "1E2", "1e+2", "1e-2", "100e-2", "0.1e1", "0.5e1", "0e+1", "0.0e1", "-0.0",
        "0.1", "0.2", "0.30000000000000004", "3.14159", "47.3712", "-8.54", "1e308", "1.7976931348623157e308",
        "1.7976931348623159e308", "2.2250738585072014e-308", "4.9e-324", "5e-324", "3e-324", "2e-324", "1e-400",
        "1e400", "-1e400", "123456789012345678901234567890", "0.000001", "1e-7", "12345.678e-2",
        "3.4028235e38", "3.4028236e38", "1e39", "1e-45", "1e-46", "1e-50", "1.17549435e-38", "1E+308",
        "9007199254740993", "9007199254740992", "123456789.123456789", "1.000000000000000000000000000001",
        "0.000000000000000000000000000000000000000000001", "100000000000000000000000", "1e22", "1e23",
        "123456789012345678", "1234567890123456789", "-1234567890123456789", "1.5e300", "2.5e-300",
    ]

    @Test(arguments: numbers)
    func numbersDecodeLikeFoundation(_ text: String) {
        expectSameDecoding(Double.self, text)
        expectSameDecoding(Float.self, text)
        expectSameDecoding(Decimal.self, text)
        expectSameDecoding(Int.self, text)
        expectSameDecoding(Int8.self, text)
        expectSameDecoding(UInt8.self, text)
        expectSameDecoding(Int16.self, text)
        expectSameDecoding(UInt16.self, text)
        expectSameDecoding(Int32.self, text)
        expectSameDecoding(UInt32.self, text)
        expectSameDecoding(Int64.self, text)
        expectSameDecoding(UInt64.self, text)
        expectSameDecoding(UInt.self, text)
        expectSameDecoding(Box<Double>.self, "{\"value\":\(text)}")
        expectSameDecoding([Int].self, "[\(text)]")
        expectSameDecoding([Double].self, "[\(text)]")
    }

    /// Integers written with a fraction or exponent follow JSONDecoder's rules exactly, quirks
    /// included: the text is read as a Double, which must be an integer of the type.
    @Test func integersWithFractionOrExponent() throws {
        #expect(try fastDecode(Int.self, "1.0") == 1)
        #expect(try fastDecode(Int.self, "1e2") == 100)
        #expect(try fastDecode(Int.self, "-0.0") == 0)
        #expect(try fastDecode(UInt8.self, "2.55e2") == 255)
        #expect(try fastDecode(Int.self, "1.000000000000000000000000000001") == 1)
        #expect(try fastDecode(Int.self, "1e-400") == 0)
        #expect(try fastDecode(Int.self, "-9.2233720368547758e18") == -9_223_372_036_854_775_800)
        #expect(throws: DecodingError.self) { try fastDecode(Int.self, "9.2233720368547758e18") }
        #expect(throws: DecodingError.self) { try fastDecode(Int.self, "9223372036854775807.0") }
        #expect(throws: DecodingError.self) { try fastDecode(Int.self, "1.5") }
        #expect(throws: DecodingError.self) { try fastDecode(Int.self, "1e20") }
        #expect(throws: DecodingError.self) { try fastDecode(Int.self, "1e-1") }
        #expect(throws: DecodingError.self) { try fastDecode(Int.self, "1e99999999999999999999") }
        for text in ["9.2233720368547758e18", "-9.2233720368547758e18", "9223372036854775807.0", "-9.223372036854775808e18",
                     "12345678901234567890e-3", "1.8446744073709551615e19", "123456789012e-3", "4.5e15", "9.007199254740993e15",
                     "1.7e308", "-1e-5", "2.5e1", "-128.0", "-1.29e2", "6.5535e4"]
        {
            expectSameDecoding(Int.self, text)
            expectSameDecoding(Int8.self, text)
            expectSameDecoding(UInt16.self, text)
            expectSameDecoding(Int64.self, text)
            expectSameDecoding(UInt64.self, text)
        }
    }

    /// Foundation rejects `0e1` and `0E1` as floating-point numbers (valid JSON); FastJSON accepts them.
    @Test func zeroWithExponent() throws {
        #expect(try fastDecode(Double.self, "0e1") == 0)
        #expect(try fastDecode(Float.self, "0E1") == 0)
        #expect(try fastDecode(Double.self, "-0e5").sign == .minus)
    }

    static let strings = [
        #""plain""#, #""""#, #""\u0041\u00e9\u4e2d""#, #""\ud83d\ude00""#, #""\uD834\uDD1E""#, #""\/\\\"""#,
        #""\b\f\n\r\t""#, #""\u0000""#, #""é😀中""#, "\"\u{7F}\"", #""\u0061\u0301""#, #""\uFEFF""#,
        #""\uDBFF\uDFFF""#, #""\uD800""#, #""\uDC00""#, #""\uD800\u0041""#, #""\uD800\uD800""#, #""\x""#,
        #""\u12""#, #""\u12G4""#, "\"tab\there\"", "\"new\nline\"", #""unterminated"#, #""a" "b""#,
        #""\""#, #""\\""#, "\"" + String(repeating: "long text ", count: 500) + "\"",
        "\"\u{2028}\u{2029}\"", #""\uffff\ufffe""#,
    ]

    @Test(arguments: strings)
    func stringsDecodeLikeFoundation(_ text: String) {
        expectSameDecoding(String.self, text)
        expectSameDecoding([String].self, "[\(text)]")
        expectSameDecoding(Box<String>.self, "{\"value\":\(text)}")
    }

    @Test func invalidUTF8IsRejectedLikeFoundation() {
        for bytes: [UInt8] in [[0x22, 0xFF, 0x22], [0x22, 0xC0, 0xAF, 0x22], [0x22, 0xED, 0xA0, 0x80, 0x22],
                               [0x22, 0xF4, 0x90, 0x80, 0x80, 0x22], [0x22, 0xE2, 0x82, 0x22]]
        {
            #expect(throws: DecodingError.self) { try FastJSONDecoder().decode(String.self, from: bytes) }
            #expect(throws: DecodingError.self) { try JSONDecoder().decode(String.self, from: Data(bytes)) }
        }
    }

    static let documents: [String] = [
        #"{"a":1}"#, #"{"a":1,"b":"x"}"#, #"{"b":"x","a":1}"#, #" { "a" : 1 , "b" : null } "#,
        "\n\t{\r\n\"a\"\t:\n2}\n", #"{"a":1,"a":2}"#, #"{"\u0061":3}"#, #"{"a":"1"}"#, #"{"a":1.5}"#,
        #"{"a":null}"#, #"{"b":"x"}"#, #"{}"#, #"[]"#, #"{"a":true}"#, #"{"a":[1]}"#, #"{"a":{"a":1}}"#,
        #"{"a":1,"b":1,"c":1}"#, #"[1,2,3]"#, #"[[1],[2]]"#, #"{"int":1,"array":[1,null]}"#,
    ]

    @Test(arguments: documents)
    func documentsDecodeLikeFoundation(_ text: String) {
        expectSameDecoding(Inner.self, text)
        expectSameDecoding(Optionals.self, text)
        expectSameDecoding([String: Int].self, text)
        expectSameDecoding([String: JSONValue].self, text)
        expectSameDecoding(JSONValue.self, text)
        expectSameDecoding([Int].self, text)
    }

    static let invalidDocuments: [String] = [
        #"{"a":1}x"#, #"{"a" 1}"#, #"{a:1}"#, #"{'a':1}"#, "", " ", #"{"a":01}"#, #"{"a":-}"#, #"{"a":1e}"#,
        #"{"a":.5}"#, #"{"a":+1}"#, #"{"a":NaN}"#, #"{"a":Infinity}"#, #"{"a":1 /* c */}"#, #"{"a":tru}"#,
        #"{"a":nul}"#, #"{"a":"\x"}"#, #"{"b":01,"a":1}"#, "[1,2", #"{"a":1"#, "\u{0}",
    ]

    /// FastJSON validates the whole input before decoding, so invalid JSON is always
    /// `dataCorrupted`. Foundation validates some values (numbers, escapes) only when they are
    /// decoded: it rejects these documents too, but may report a type mismatch, and decodes a type
    /// that never reads the broken value.
    @Test(arguments: invalidDocuments)
    func invalidDocumentsAreRejected(_ text: String) {
        for attempt in [
            { try fastDecode(Inner.self, text) as Any }, { try fastDecode(Optionals.self, text) as Any },
            { try fastDecode(JSONValue.self, text) as Any },
        ] as [() throws -> Any] {
            #expect {
                _ = try attempt()
            } throws: { error in
                guard case DecodingError.dataCorrupted(let context) = error else { return false }
                return context.underlyingError is FastJSONError
            }
        }
        #expect(throws: (any Error).self) { try foundationDecode(JSONValue.self, text) }
    }

    @Test func duplicateKeysFirstOneWins() throws {
        #expect(try fastDecode(Inner.self, #"{"a":1,"a":2}"#) == Inner(a: 1, b: nil))
        #expect(try fastDecode([String: Int].self, #"{"k":1,"k":2}"#) == ["k": 1])
        // Large objects take the in-order lookup path; duplicates there must still resolve to the first.
        var members = (0..<40).map { "\"k\($0)\":\($0)" }
        members.append(#""k3":999"#)
        let text = "{" + members.joined(separator: ",") + "}"
        let ours = try fastDecode([String: Int].self, text)
        let theirs = try foundationDecode([String: Int].self, text)
        #expect(ours == theirs)
        #expect(ours["k3"] == 3)
    }

    @Test func keysCompareAsSwiftStrings() throws {
        struct K: Codable, Equatable { var K: Int }
        // U+212A KELVIN SIGN is canonically equivalent to "K" (Swift String equality).
        expectSameDecoding(K.self, "{\"\u{212A}\":5}")
        expectSameDecoding(K.self, #"{"\u004B":6}"#)
        struct Accent: Codable, Equatable { var é: Int }
        expectSameDecoding(Accent.self, "{\"e\u{301}\":7}")
        expectSameDecoding(Accent.self, "{\"\u{E9}\":8}")
    }

    @Test func largeObjectsAndDictionaries() throws {
        struct Wide: Codable, Equatable {
            var f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15: Int
            var g: String?
        }
        let wide = Wide(f0: 0, f1: 1, f2: 2, f3: 3, f4: 4, f5: 5, f6: 6, f7: 7, f8: 8, f9: 9, f10: 10, f11: 11,
                        f12: 12, f13: 13, f14: 14, f15: 15, g: "g")
        try expectRoundTrip(wide)
        // Keys in reverse order and some missing optional: lookups out of order.
        let reversed = #"{"f15":15,"f14":14,"f13":13,"f12":12,"f11":11,"f10":10,"f9":9,"f8":8,"f7":7,"f6":6,"f5":5,"f4":4,"f3":3,"f2":2,"f1":1,"f0":0}"#
        expectSameDecoding(Wide.self, reversed)
        let dictionary = Dictionary(uniqueKeysWithValues: (0..<1000).map { ("key\($0)", $0) })
        try expectRoundTrip(dictionary)
        try expectRoundTrip(Dictionary(uniqueKeysWithValues: (0..<300).map { ($0, "v\($0)") }))
    }

    @Test func typeMismatchesMatchFoundation() {
        expectSameDecoding(Bool.self, "1")
        expectSameDecoding(Bool.self, "\"true\"")
        expectSameDecoding(String.self, "1")
        expectSameDecoding(Int.self, "\"1\"")
        expectSameDecoding(Int.self, "true")
        expectSameDecoding(Double.self, "\"1.0\"")
        expectSameDecoding(Int.self, "null")
        expectSameDecoding(Int?.self, "null")
        expectSameDecoding([Int].self, "{}")
        expectSameDecoding([String: Int].self, "[]")
        expectSameDecoding(Inner.self, "[]")
        expectSameDecoding(Inner.self, "null")
        expectSameDecoding(Inner.self, "1")
        expectSameDecoding([Int].self, "[1,\"2\"]")
        expectSameDecoding([Int].self, "[1,null]")
        expectSameDecoding([Int?].self, "[1,null]")
        expectSameDecoding(Data.self, #""AQID""#)
        expectSameDecoding(Data.self, #""AQI""#)
        expectSameDecoding(Data.self, "1")
        expectSameDecoding(URL.self, #""https://example.org/x""#)
        expectSameDecoding(URL.self, #""""#)
        expectSameDecoding(URL.self, #"{"relative":"https://example.org"}"#)
        expectSameDecoding(Decimal.self, #""1.5""#)
        expectSameDecoding(Decimal.self, #"{"exponent":1}"#)
        expectSameDecoding(Date.self, "1.5")
        expectSameDecoding(Date.self, #""2020-01-01""#)
        expectSameDecoding(Shape.self, #"{"circle":{"radius":2}}"#)
        expectSameDecoding(Shape.self, #"{"circle":{}}"#)
        expectSameDecoding(Shape.self, #"{"unknown":{}}"#)
        expectSameDecoding(Color.self, #""BLUE""#)
        expectSameDecoding(Color.self, #""purple""#)
        expectSameDecoding(Level.self, "10")
        expectSameDecoding(Level.self, "11")
    }

    @Test func topLevelFragmentsAndWhitespace() {
        for text in ["1", " 1 ", "\n1\n", "\"s\"", "true", "null", "[]", "{}", " [ 1 , 2 ] ", "1 2", "[1] [2]"] {
            expectSameDecoding(JSONValue.self, text)
            expectSameDecoding(Int?.self, text)
        }
    }

    @Test func alternativeInputEncodings() throws {
        let text = #"{"a":1,"b":"é😀"}"#
        let utf16LE = Array(text.utf16).flatMap { [UInt8($0 & 0xFF), UInt8($0 >> 8)] }
        let utf16BE = Array(text.utf16).flatMap { [UInt8($0 >> 8), UInt8($0 & 0xFF)] }
        let utf32LE = text.unicodeScalars.flatMap { scalar -> [UInt8] in
            let v = scalar.value
            return [UInt8(v & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v >> 16 & 0xFF), UInt8(v >> 24)]
        }
        let inputs: [[UInt8]] = [
            [0xEF, 0xBB, 0xBF] + Array(text.utf8), [0xFF, 0xFE] + utf16LE, [0xFE, 0xFF] + utf16BE, utf16LE, utf16BE,
            utf32LE,
        ]
        for input in inputs {
            let theirs = try JSONDecoder().decode(Inner.self, from: Data(input))
            #expect(try FastJSONDecoder().decode(Inner.self, from: input) == theirs)
        }
        // A BOM alone, or broken UTF-16, is an error like in Foundation.
        #expect(throws: DecodingError.self) { try FastJSONDecoder().decode(JSONValue.self, from: [0xEF, 0xBB, 0xBF]) }
        #expect(throws: DecodingError.self) { try FastJSONDecoder().decode(JSONValue.self, from: [0xFF, 0xFE, 0x5B]) }
    }

    /// Random doubles and floats: both codecs read each other's text back to the same bits.
    @Test func randomFloatingPointValuesRoundTripExactly() throws {
        var generator = SplitMix64(seed: 0x5EED)
        var doubles: [Double] = []
        while doubles.count < 4000 {
            let value = Double(bitPattern: generator.next())
            if value.isFinite { doubles.append(value) }
        }
        // Values with few decimals take a separate fast path when encoding.
        for _ in 0..<2000 {
            doubles.append(Double(Int64(bitPattern: generator.next()) % 10_000_000) / 10_000)
            doubles.append(Double(Int64(bitPattern: generator.next()) % 1_000_000_000) / 1e9)
        }
        let ours = try FastJSONEncoder().encode(doubles)
        let byFoundation = try JSONDecoder().decode([Double].self, from: Data(ours))
        let byUs = try FastJSONDecoder().decode([Double].self, from: ours)
        let byUsFromFoundation = try FastJSONDecoder().decode([Double].self, from: try JSONEncoder().encode(doubles))
        for i in doubles.indices {
            #expect(byFoundation[i].bitPattern == doubles[i].bitPattern, "\(doubles[i])")
            #expect(byUs[i].bitPattern == doubles[i].bitPattern, "\(doubles[i])")
            #expect(byUsFromFoundation[i].bitPattern == doubles[i].bitPattern, "\(doubles[i])")
        }
        var floats: [Float] = []
        while floats.count < 4000 {
            let value = Float(bitPattern: UInt32(truncatingIfNeeded: generator.next()))
            if value.isFinite { floats.append(value) }
        }
        let floatText = try FastJSONEncoder().encode(floats)
        let floatsByFoundation = try JSONDecoder().decode([Float].self, from: Data(floatText))
        let floatsByUs = try FastJSONDecoder().decode([Float].self, from: floatText)
        let floatsFromFoundation = try FastJSONDecoder().decode([Float].self, from: try JSONEncoder().encode(floats))
        for i in floats.indices {
            #expect(floatsByFoundation[i].bitPattern == floats[i].bitPattern, "\(floats[i])")
            #expect(floatsByUs[i].bitPattern == floats[i].bitPattern, "\(floats[i])")
            #expect(floatsFromFoundation[i].bitPattern == floats[i].bitPattern, "\(floats[i])")
        }
    }
}

/// A small deterministic generator, so failures reproduce.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
