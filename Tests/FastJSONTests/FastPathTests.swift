import FastJSON
import Foundation
import Testing

/// The decoder's fast paths (short ASCII strings built directly, word-wise key comparison, the
/// short decimal `Double` parser) against Foundation, at and around every length boundary.
@Suite("Decoder fast paths")
struct FastPathTests {
    @Test func shortASCIIStringsOfEveryLength() throws {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 !#$%&'()*+,-./:;<=>?@[]^_`{|}~")
        for length in 0...40 {
            let text = String((0..<length).map { alphabet[($0 * 7 + length) % alphabet.count] })
            let json = try fastText(text)
            let decoded = try fastDecode(String.self, json)
            #expect(decoded == text)
            #expect(decoded.utf8.count == length)
            #expect(Array(decoded.utf8) == Array(text.utf8))
            #expect(decoded.hashValue == text.hashValue)
            // The string must behave like any other: mutation, slicing, bridging through Data.
            var copy = decoded
            copy.append("é")
            #expect(copy == text + "é")
            #expect(String(decoded.prefix(3)) == String(text.prefix(3)))
            #expect(String(decoding: Data(decoded.utf8), as: UTF8.self) == text)
            expectSameDecoding(String.self, json)
            expectSameDecoding([String].self, "[\(json),\(json)]")
            expectSameDecoding(Box<String>.self, "{\"value\":\(json)}")
        }
        // Non-ASCII and escaped strings of short lengths take the general path.
        for text in ["é", "aé", "\u{0}", "a\\b", "\"", "日本", "e\u{301}", "\u{7F}"] {
            let json = try fastText(text)
            #expect(try fastDecode(String.self, json) == text)
            expectSameDecoding([String].self, "[\(json)]")
        }
    }

    /// A key type whose names are given at run time.
    struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(_ name: String) { stringValue = name }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    /// Decodes the value of `name` from an object, or nil when absent.
    struct Lookup: Decodable, Equatable {
        static let nameKey = CodingUserInfoKey(rawValue: "name")!
        var value: Int?
        init(from decoder: any Decoder) throws {
            let name = decoder.userInfo[Self.nameKey] as! String
            value = try decoder.container(keyedBy: Key.self).decodeIfPresent(Int.self, forKey: Key(name))
        }
    }

    func lookup(_ name: String, in json: String) throws -> (Int?, Int?) {
        var ours = FastJSONDecoder()
        ours.userInfo[Lookup.nameKey] = name
        let theirs = JSONDecoder()
        theirs.userInfo[Lookup.nameKey] = name
        return (try ours.decode(Lookup.self, from: Array(json.utf8)).value,
                try theirs.decode(Lookup.self, from: Data(json.utf8)).value)
    }

    @Test func keysOfEveryLengthWithNearMisses() throws {
        for length in 1...40 {
            let name = String((0..<length).map { Character(UnicodeScalar(UInt8(97 + ($0 * 5 + length) % 26))) })
            // Same length, differing in the first, a middle or the last byte, then the key itself.
            var misses: [String] = []
            for position in Set([0, length / 2, length - 1]) {
                var bytes = Array(name.utf8)
                bytes[position] = bytes[position] == 0x7A ? 0x79 : bytes[position] + 1
                misses.append(String(decoding: bytes, as: UTF8.self))
            }
            let members = misses.enumerated().map { "\"\($0.element)\":\($0.offset + 100)" }
            let json = "{" + (members + ["\"\(name)\":\(length)"]).joined(separator: ",") + "}"
            let (ours, theirs) = try lookup(name, in: json)
            #expect(ours == length)
            #expect(ours == theirs)
            let missing = "{" + members.joined(separator: ",") + "}"
            let (oursMissing, theirsMissing) = try lookup(name, in: missing)
            #expect(oursMissing == nil)
            #expect(oursMissing == theirsMissing)
        }
    }

    @Test func nonASCIISwiftKeysMatchEquivalentJSONKeys() throws {
        // U+212A KELVIN SIGN equals "K" as a Swift String; JSON keys match like Foundation's.
        for json in [#"{"K":1}"#, "{\"\u{212A}\":2}", #"{"\u004B":3}"#, #"{"x":0,"K":4}"#, #"{"k":5}"#] {
            let (ours, theirs) = try lookup("\u{212A}", in: json)
            #expect(ours == theirs, "\(json)")
        }
        for json in ["{\"\u{E9}\":1}", "{\"e\u{301}\":2}", #"{"e":3}"#, #"{"\u00e9":4}"#] {
            let (ours, theirs) = try lookup("e\u{301}", in: json)
            #expect(ours == theirs, "\(json)")
        }
        let (empty, emptyTheirs) = try lookup("", in: #"{"a":1,"":2}"#)
        #expect(empty == 2)
        #expect(empty == emptyTheirs)
    }

    @Test func shortDecimalNumbersMatchFoundation() throws {
        var generator = SplitMix64(seed: 42)
        var texts: [String] = []
        for _ in 0..<3000 {
            let integerDigits = Int(generator.next() % 17) + 1
            let fractionDigits = Int(generator.next() % 17)
            var text = generator.next() % 3 == 0 ? "-" : ""
            let first = integerDigits == 1 ? generator.next() % 10 : generator.next() % 9 + 1
            text += String(first)
            for _ in 1..<integerDigits { text += String(generator.next() % 10) }
            if fractionDigits > 0 {
                text += "."
                for _ in 0..<fractionDigits { text += String(generator.next() % 10) }
            }
            if generator.next() % 8 == 0 { text += "e" + String(Int(generator.next() % 40) - 20) }
            texts.append(text)
        }
        let json = "[" + texts.joined(separator: ",") + "]"
        let ours = try fastDecode([Double].self, json)
        let theirs = try foundationDecode([Double].self, json)
        for i in texts.indices {
            #expect(ours[i].bitPattern == theirs[i].bitPattern, "\(texts[i])")
            #expect(ours[i].bitPattern == Double(texts[i])!.bitPattern, "\(texts[i])")
        }
    }
}

extension FastPathTests {
    @Test func integersOfEveryDigitCountMatchFoundation() throws {
        var generator = SplitMix64(seed: 7)
        var texts: [String] = []
        for digits in 1...20 {
            for _ in 0..<60 {
                var text = generator.next() % 2 == 0 ? "-" : ""
                text += String(digits == 1 ? generator.next() % 10 : generator.next() % 9 + 1)
                for _ in 1..<digits { text += String(generator.next() % 10) }
                texts.append(text)
            }
            texts.append(String(repeating: "9", count: digits))
            texts.append("1" + String(repeating: "0", count: digits - 1))
        }
        for text in texts {
            expectSameDecoding(Int.self, text)
            expectSameDecoding(Int64.self, text)
            expectSameDecoding(UInt64.self, text)
            expectSameDecoding(Int32.self, text)
            expectSameDecoding(UInt8.self, text)
        }
        let json = "[" + texts.joined(separator: ",") + "]"
        let ours = try fastDecode([Double].self, json)
        for (text, value) in zip(texts, ours) { #expect(value == Double(text)!, "\(text)") }
        expectSameDecoding([Int].self, "[" + texts.filter { $0.count < 19 }.joined(separator: ",") + "]")
    }
}
