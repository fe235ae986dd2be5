import FastJSON
import Foundation
import Testing

/// One value to round-trip through FastJSON and Foundation in every direction.
struct RoundTripCase: Sendable, CustomTestStringConvertible {
    let name: String
    let check: @Sendable () throws -> Void

    init<T: Codable & Equatable & Sendable>(_ name: String, _ make: @escaping @Sendable () -> T) {
        self.name = name
        self.check = { try expectRoundTrip(make()) }
    }

    var testDescription: String { name }
}

let roundTripCases: [RoundTripCase] = [
    RoundTripCase("Sample") { Sample(id: 42, name: "sixteen chars!!!", value: 3.25, tags: ["a", "bc", "def"]) },
    RoundTripCase("Sample with empty tags") { Sample(id: -1, name: "", value: 0, tags: []) },
    RoundTripCase("nested structs") {
        Outer(inner: Inner(a: 1, b: "x"), list: [Inner(a: 2, b: nil), Inner(a: 3, b: "y")],
              map: ["k": Inner(a: 4, b: nil), "": Inner(a: 5, b: "")], optional: nil,
              nested: [[], [1], [2, 3]], matrix: ["m": [1: ["a"], -2: []], "n": [:]])
    },
    RoundTripCase("nested optional present") {
        Outer(inner: Inner(a: 0, b: nil), list: [], map: [:], optional: Inner(a: 9, b: "z"), nested: [], matrix: [:])
    },
    RoundTripCase("optionals all nil") { Optionals() },
    RoundTripCase("optionals all set") {
        Optionals(int: 1, string: "s", double: 2.5, bool: false, array: [1, nil, 3], inner: Inner(a: 1, b: nil),
                  float: 1.5, int8: -8, uint64: .max)
    },
    RoundTripCase("raw-value enums") { Box(value: [Color.red, .green, .blue]) },
    RoundTripCase("int raw-value enums") { Box(value: [Level.low, .high]) },
    RoundTripCase("enums with associated values") {
        Box(value: [Shape.circle(radius: 1.5), .rect(width: 2, height: 3), .point, .labeled("x", -1),
                    .nested(Inner(a: 1, b: nil), [.point, .circle(radius: 0)])])
    },
    RoundTripCase("top-level enum") { Shape.labeled("top", 7) },
    RoundTripCase("String-keyed dictionary") { ["one": 1, "two": 2, "": 0, "ü\"\\/": 3] },
    RoundTripCase("Int-keyed dictionary") { [1: "one", -2: "minus two", 0: ""] },
    RoundTripCase("Double-keyed dictionary (array form)") { [1.5: "a", -0.25: "b"] },
    RoundTripCase("UUID-keyed dictionary (array form)") {
        [UUID(uuidString: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F")!: 1]
    },
    RoundTripCase("enum-keyed dictionary (array form)") { Box(value: [Color.red: 1, .blue: 2]) },
    RoundTripCase("dictionary of arrays of dictionaries") { ["a": [["x": 1.5], [:]], "b": []] },
    RoundTripCase("nested arrays") { [[[Int]]]([[[1, 2], []], [], [[3]]]) },
    RoundTripCase("array of optionals") { [1, nil, 3] as [Int?] },
    RoundTripCase("array of optional optionals") { Box(value: [Optional<Int>.some(1), nil]) },
    RoundTripCase("empty array") { [Int]() },
    RoundTripCase("empty dictionary") { [String: Int]() },
    RoundTripCase("integer limits") { Limits() },
    RoundTripCase("integer limits top-level Int64.min") { Int64.min },
    RoundTripCase("integer limits top-level UInt64.max") { UInt64.max },
    RoundTripCase("Date, Data, URL, Decimal, UUID") {
        Foundations(date: Date(timeIntervalSinceReferenceDate: 123_456.789),
                    dates: [Date(timeIntervalSince1970: 0), Date(timeIntervalSinceReferenceDate: -1e9)],
                    data: Data([0, 1, 2, 254, 255, 10]), emptyData: Data(),
                    url: URL(string: "https://example.org/a/b?c=d&e=%20#frag")!,
                    urls: [URL(string: "file:///tmp/x")!, URL(string: "mailto:a@b.c")!],
                    decimal: Decimal(string: "12345.6789")!, uuid: UUID())
    },
    RoundTripCase("negative Decimal") { Box(value: [Decimal(string: "-0.001")!, Decimal(0), Decimal(string: "1e20")!]) },
    RoundTripCase("top-level Date") { Date(timeIntervalSinceReferenceDate: 0.5) },
    RoundTripCase("top-level Data") { Data("hello".utf8) },
    RoundTripCase("top-level URL") { URL(string: "https://swift.org/")! },
    RoundTripCase("class with superEncoder") { Dog(name: "Rex", tricks: ["sit", "roll"]) },
    RoundTripCase("class sharing the keyed container") { Cat(name: "Tom", lives: 9) },
    RoundTripCase("classes in an array") { [Dog(name: "a", tricks: []), Dog(name: "b", tricks: ["x"])] },
    RoundTripCase("nested containers and superEncoder(forKey:)") {
        Manual(x: 1, y: -2.5, points: [[1, 2], [], [3]], child: Inner(a: 7, b: "c"), label: "end")
    },
    RoundTripCase("unkeyed nestedContainer(keyedBy:)") { Rows(rows: [("a", 1), ("b", 2)]) },
    RoundTripCase("values that encode nothing") { HoldsNothing(nothing: Nothing(), list: [Nothing(), Nothing()]) },
    RoundTripCase("Bool") { Box(value: [true, false]) },
    RoundTripCase("top-level scalars: String") { "top" },
    RoundTripCase("top-level scalars: Int") { 7 },
    RoundTripCase("top-level scalars: Bool") { false },
    RoundTripCase("top-level scalars: Double") { 0.1 },
    RoundTripCase("top-level nil") { Int?.none },
    RoundTripCase("doubles") {
        Box(value: [0.0, 1.0, -1.0, 0.1, 0.2 + 0.1, 1.0 / 3.0, .pi, 1e100, 1e-100, 1e300, -1e-300, 123456789.0,
                    9007199254740991.0, 9007199254740992.0, 1e16, 1e15, 1e21, 1e22, 1e23, 2.5e-5, Double(bitPattern: 1), Double(bitPattern: 0x000F_FFFF_FFFF_FFFF),
                    .leastNonzeroMagnitude, .leastNormalMagnitude, .greatestFiniteMagnitude,
                    -.greatestFiniteMagnitude, Double(bitPattern: 0x0000_0000_DEAD_BEEF),
                    1.7976931348623157e308, 0.30000000000000004])
    },
    RoundTripCase("negative zero") { Bits(value: -0.0 as Double) },
    RoundTripCase("positive zero") { Bits(value: 0.0 as Double) },
    RoundTripCase("float negative zero") { Bits(value: -0.0 as Float) },
    RoundTripCase("floats") {
        Box(value: [Float(0.1), 1.0 / 3.0, .pi, 1e30, -1e-30, .leastNonzeroMagnitude, .leastNormalMagnitude,
                    .greatestFiniteMagnitude, 16_777_215, 3.4028235e38, Float(bitPattern: 1)])
    },
    RoundTripCase("strings") {
        Box(value: ["", "plain", "quote \" backslash \\ slash /", "\u{0}\u{1}\u{1F}\u{7F}", "\n\r\t\u{8}\u{C}",
                    "é ü ß 中文 日本語", "😀👍🏽🇨🇭", "e\u{301}", "\u{2028}\u{2029}", "\u{FEFF}bom", "\u{10FFFF}",
                    String(repeating: "long ", count: 200)])
    },
    RoundTripCase("unicode keys") { ["ключ": 1, "🔑": 2, "a\"b": 3, "tab\t": 4] },
    RoundTripCase("~10 KiB document") { Document.make() },
]

@Suite("Round trips with Foundation")
struct RoundTripTests {
    @Test(arguments: roundTripCases)
    func roundTrip(_ testCase: RoundTripCase) throws {
        try testCase.check()
    }

    @Test func negativeZeroKeepsItsSign() throws {
        let text = try fastText([-0.0, 0.0])
        #expect(text == "[-0,0]")
        let back = try FastJSONDecoder().decode([Double].self, from: Array(text.utf8))
        #expect(back[0].sign == .minus)
        #expect(back[1].sign == .plus)
    }

    @Test func nilPropertiesAreOmitted() throws {
        #expect(try fastText(Optionals()) == "{}")
        #expect(try fastText(Inner(a: 1, b: nil)) == #"{"a":1}"#)
        #expect(try fastText(Optionals(int: 1, array: [nil])) == #"{"int":1,"array":[null]}"#)
    }

    @Test func keysFollowEncodeCallOrder() throws {
        #expect(try fastText(Sample(id: 1, name: "n", value: 1.5, tags: ["t"]))
            == #"{"id":1,"name":"n","value":1.5,"tags":["t"]}"#)
        #expect(try fastText(Dog(name: "Rex", tricks: [])) == #"{"tricks":[],"super":{"name":"Rex"}}"#)
        #expect(try fastText(Cat(name: "Tom", lives: 9)) == #"{"name":"Tom","lives":9}"#)
        #expect(try fastText(Manual(x: 1, y: 2, points: [[1, 2]], child: Inner(a: 3, b: nil), label: "l"))
            == #"{"geometry":{"x":1,"y":2},"points":[[1,2]],"child":{"a":3},"label":"l"}"#)
        #expect(try fastText(HoldsNothing(nothing: Nothing(), list: [Nothing()])) == #"{"nothing":{},"list":[{}]}"#)
    }

    @Test func foundationSpecialTypesUseDefaultStrategies() throws {
        #expect(try fastText(Date(timeIntervalSinceReferenceDate: 1.5)) == "1.5")
        #expect(try fastText(Data([1, 2, 3])) == #""AQID""#)
        #expect(try fastText(URL(string: "https://x.org/a")!) == #""https://x.org/a""#)
        #expect(try fastText(Decimal(string: "12.345")!) == "12.345")
        #expect(try fastText([1: "a"]) == #"{"1":"a"}"#)
        #expect(try fastText([1.5: "a"]) == #"[1.5,"a"]"#)
    }

    @Test func doublesUseShortestRoundTripSpelling() throws {
        #expect(try fastText([1.0, 0.1, 1e100, 1e-7, Double.leastNonzeroMagnitude, 1.5, 1e16, 123.0])
            == "[1,0.1,1e+100,1e-07,5e-324,1.5,1e+16,123]")
        #expect(try fastText(Float(0.1)) == "0.1")
    }

    @Test func stringEscapes() throws {
        #expect(try fastText("a\"b\\c/d\n\u{1}\u{7F}é😀") == "\"a\\\"b\\\\c/d\\n\\u0001\u{7F}é😀\"")
        var encoder = FastJSONEncoder()
        encoder.escapesForwardSlashes = true
        #expect(String(decoding: try encoder.encode("a/b"), as: UTF8.self) == #""a\/b""#)
    }

    @Test func encodeIntoAppendsToTheBuffer() throws {
        var buffer = Array("prefix".utf8)
        try FastJSONEncoder().encode([1, 2], into: &buffer)
        #expect(String(decoding: buffer, as: UTF8.self) == "prefix[1,2]")
        #expect(throws: EncodingError.self) { try FastJSONEncoder().encode([1, .nan], into: &buffer) }
        #expect(String(decoding: buffer, as: UTF8.self) == "prefix[1,2]", "restored after a failure")
    }

    @Test func decodesFromDataSliceAndRawBuffer() throws {
        let bytes = Array(#"xx{"a":1,"b":"q"}yy"#.utf8)
        let slice = bytes[2..<(bytes.count - 2)]
        #expect(try FastJSONDecoder().decode(Inner.self, from: slice) == Inner(a: 1, b: "q"))
        #expect(try FastJSONDecoder().decode(Inner.self, from: Data(slice)) == Inner(a: 1, b: "q"))
        let viaRaw = try Array(slice).withUnsafeBytes { try FastJSONDecoder().decode(Inner.self, from: $0) }
        #expect(viaRaw == Inner(a: 1, b: "q"))
    }

    @Test func userInfoReachesTheCodableImplementations() throws {
        struct Probe: Codable {
            static let key = CodingUserInfoKey(rawValue: "probe")!
            var seen: String
            init(seen: String) { self.seen = seen }
            init(from decoder: any Decoder) throws { seen = decoder.userInfo[Probe.key] as? String ?? "none" }
            func encode(to encoder: any Encoder) throws {
                var container = encoder.singleValueContainer()
                try container.encode(encoder.userInfo[Probe.key] as? String ?? "none")
            }
        }
        var encoder = FastJSONEncoder()
        encoder.userInfo[Probe.key] = "enc"
        #expect(String(decoding: try encoder.encode(Probe(seen: "")), as: UTF8.self) == #""enc""#)
        var decoder = FastJSONDecoder()
        decoder.userInfo[Probe.key] = "dec"
        #expect(try decoder.decode(Probe.self, from: Array("1".utf8)).seen == "dec")
    }

    @Test func codingPathIsVisibleToImplementations() throws {
        struct PathProbe: Codable, Equatable {
            var path: String
            init(path: String) { self.path = path }
            init(from decoder: any Decoder) throws {
                path = decoder.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: "/")
                _ = try decoder.singleValueContainer().decode(Int.self)
            }
            func encode(to encoder: any Encoder) throws {
                var container = encoder.singleValueContainer()
                try container.encode(encoder.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }
                    .joined(separator: "/"))
            }
        }
        let encoded = try fastText(["k": [PathProbe(path: ""), PathProbe(path: "")]])
        #expect(encoded == #"{"k":["k\/0","k\/1"]}"# || encoded == #"{"k":["k/0","k/1"]}"#)
        let decoded = try fastDecode([String: [PathProbe]].self, #"{"k":[1,2]}"#)
        #expect(decoded["k"] == [PathProbe(path: "k/0"), PathProbe(path: "k/1")])
    }
}
