import FastJSON
import Foundation
import Testing

private func fastJSONError(_ error: any Error) -> FastJSONError? {
    switch error {
    case DecodingError.dataCorrupted(let context), DecodingError.typeMismatch(_, let context),
         DecodingError.valueNotFound(_, let context), DecodingError.keyNotFound(_, let context):
        return context.underlyingError as? FastJSONError
    case EncodingError.invalidValue(_, let context):
        return context.underlyingError as? FastJSONError
    default:
        return nil
    }
}

private func pathString(_ error: any Error) -> String {
    let path: [any CodingKey]
    switch error {
    case DecodingError.dataCorrupted(let context), DecodingError.typeMismatch(_, let context),
         DecodingError.valueNotFound(_, let context):
        path = context.codingPath
    case DecodingError.keyNotFound(let key, let context):
        path = context.codingPath + [key]
    case EncodingError.invalidValue(_, let context):
        path = context.codingPath
    default:
        return "?"
    }
    return path.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: "/")
}

@Suite("Errors and limits")
struct ErrorTests {
    @Test(arguments: [
        (#"{"a":1,}"#, FastJSONError.Code.syntax, 7),
        ("[1,2", .unexpectedEnd, 4),
        (#"["\x"]"#, .invalidEscape, 2),
        (#"["\uD800"]"#, .invalidEscape, 2),
        ("[01]", .syntax, 2),
        ("[1.]", .syntax, 3),
        ("", .unexpectedEnd, 0),
        ("[1] x", .syntax, 4),
        ("[tru]", .syntax, 1),
        ("{\"a\"1}", .syntax, 4),
        ("[\"a\u{1}\"]", .syntax, 3),
    ])
    func syntaxErrorsCarryCodeAndOffset(_ text: String, _ code: FastJSONError.Code, _ offset: Int) {
        #expect {
            _ = try fastDecode(JSONValue.self, text)
        } throws: { error in
            guard case DecodingError.dataCorrupted(let context) = error,
                  let underlying = context.underlyingError as? FastJSONError
            else { return false }
            #expect(underlying.code == code, "\(underlying)")
            #expect(underlying.offset == offset, "\(underlying)")
            #expect(context.debugDescription.hasPrefix("The given data was not valid JSON"))
            #expect(underlying.description.contains("at byte \(offset)"))
            return true
        }
    }

    @Test func invalidUTF8ReportsItsOffset() {
        let bytes: [UInt8] = Array(#"["ok","#.utf8) + [0x22, 0x61, 0xFF, 0x22, 0x5D]
        #expect {
            _ = try FastJSONDecoder().decode(JSONValue.self, from: bytes)
        } throws: { error in
            let underlying = fastJSONError(error)
            return underlying?.code == .invalidUTF8 && underlying?.offset == 8
        }
    }

    @Test func deepNestingIsRejectedWithoutCrashing() {
        let deepArrays = Array(repeating: UInt8(ascii: "["), count: 100_000)
        #expect { _ = try FastJSONDecoder().decode(JSONValue.self, from: deepArrays) } throws: {
            fastJSONError($0)?.code == .tooDeep
        }
        let deepObjects = Array(String(repeating: #"{"a":"#, count: 100_000).utf8)
        #expect { _ = try FastJSONDecoder().decode(JSONValue.self, from: deepObjects) } throws: {
            fastJSONError($0)?.code == .tooDeep
        }
        // Closed, valid but too deep: also rejected before any decoding recursion starts.
        let closed = String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000)
        #expect { _ = try fastDecode(JSONValue.self, closed) } throws: { fastJSONError($0)?.code == .tooDeep }
    }

    @Test func depthLimitMatchesFoundationAndIsConfigurable() throws {
        func nested(_ depth: Int) -> String { String(repeating: "[", count: depth) + String(repeating: "]", count: depth) }
        #expect(throws: Never.self) { try fastDecode(JSONValue.self, nested(512)) }
        #expect(throws: DecodingError.self) { try fastDecode(JSONValue.self, nested(513)) }
        #expect(throws: Never.self) { try foundationDecode(JSONValue.self, nested(512)) }
        #expect(throws: (any Error).self) { try foundationDecode(JSONValue.self, nested(513)) }
        var decoder = FastJSONDecoder()
        decoder.maximumDepth = 10
        #expect(throws: Never.self) { try decoder.decode(JSONValue.self, from: Array(nested(10).utf8)) }
        #expect { try decoder.decode(JSONValue.self, from: Array(nested(11).utf8)) } throws: {
            fastJSONError($0)?.code == .tooDeep
        }
    }

    struct Row: Codable, Equatable { var id: Int; var name: String; var tags: [String]? }
    struct Table: Codable, Equatable { var rows: [Row]; var meta: [String: Row] }

    @Test(arguments: [
        #"{"rows":[{"id":1,"name":"a"},{"id":2}],"meta":{}}"#,
        #"{"rows":[{"id":1,"name":"a"},{"id":"2","name":"b"}],"meta":{}}"#,
        #"{"rows":[{"id":1,"name":null}],"meta":{}}"#,
        #"{"rows":[],"meta":{"x":{"id":1,"name":"n","tags":["a",2]}}}"#,
        #"{"rows":[],"meta":{"x":{"id":1.5,"name":"n"}}}"#,
        #"{"rows":[{"id":99999999999999999999,"name":"a"}],"meta":{}}"#,
        #"{"rows":{},"meta":{}}"#,
        #"{"meta":{}}"#,
        #"{"rows":[null],"meta":{}}"#,
    ])
    func decodingErrorsMatchFoundation(_ text: String) {
        let ours = Result { try fastDecode(Table.self, text) }
        let theirs = Result { try foundationDecode(Table.self, text) }
        guard case .failure(let ourError) = ours, case .failure(let theirError) = theirs else {
            Issue.record("both should fail: \(ours) / \(theirs)")
            return
        }
        #expect(errorCase(ourError) == errorCase(theirError), "\(ourError) vs \(theirError)")
        if errorCase(theirError) == "dataCorrupted" && pathString(theirError).isEmpty {
            // Foundation reports out-of-range numbers without a coding path; FastJSON names it.
            #expect(!pathString(ourError).isEmpty, "\(ourError)")
        } else {
            #expect(pathString(ourError) == pathString(theirError), "\(ourError) vs \(theirError)")
        }
        #expect(fastJSONError(ourError) != nil, "carries a FastJSONError")
        #expect(fastJSONError(ourError)?.offset != nil, "knows where in the input")
    }

    @Test func numberOutOfRangeNamesTheType() {
        #expect {
            _ = try fastDecode(Box<Int8>.self, #"{"value":300}"#)
        } throws: { error in
            guard case DecodingError.dataCorrupted(let context) = error else { return false }
            return context.codingPath.map(\.stringValue) == ["value"]
                && (context.underlyingError as? FastJSONError)?.code == .numberNotRepresentable
                && context.debugDescription.contains("Int8")
        }
    }

    struct Reading: Codable { var label: String; var values: [Double]; var single: Float }

    @Test func nonFiniteNumbersAreRejectedOnEncodeLikeFoundation() {
        for reading in [Reading(label: "x", values: [1, .nan], single: 0), Reading(label: "x", values: [], single: .infinity),
                        Reading(label: "x", values: [-.infinity], single: 1)]
        {
            let ours = Result { try FastJSONEncoder().encode(["r": reading]) }
            let theirs = Result { try JSONEncoder().encode(["r": reading]) }
            guard case .failure(let ourError) = ours, case .failure(let theirError) = theirs else {
                Issue.record("both should fail")
                continue
            }
            #expect(ourError is EncodingError)
            #expect(fastJSONError(ourError)?.code == .nonFiniteNumber)
            #expect(pathString(ourError) == pathString(theirError), "\(ourError) vs \(theirError)")
        }
        #expect(throws: EncodingError.self) { try FastJSONEncoder().encode(Double.nan) }
        #expect(throws: EncodingError.self) { try FastJSONEncoder().encode([Float.infinity]) }
    }

    @Test func topLevelValueThatEncodesNothing() {
        #expect { try FastJSONEncoder().encode(Nothing()) } throws: { fastJSONError($0)?.code == .noValueEncoded }
        #expect(throws: EncodingError.self) { try JSONEncoder().encode(Nothing()) }
    }

    /// A streaming encoder can't go back into a container that was already closed.
    struct OutOfOrder: Encodable {
        enum Keys: String, CodingKey { case a, b, c }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: Keys.self)
            var nested = container.nestedContainer(keyedBy: Keys.self, forKey: .a)
            try nested.encode(1, forKey: .a)
            try container.encode(2, forKey: .b)
            try nested.encode(3, forKey: .c)  // `nested` was closed when `b` was written.
        }
    }

    struct TwoSingleValues: Encodable {
        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(1)
            try container.encode(2)
        }
    }

    /// A value that asks for a keyed container after writing a single value.
    struct Mixed: Encodable {
        enum Keys: String, CodingKey { case a }
        func encode(to encoder: any Encoder) throws {
            var single = encoder.singleValueContainer()
            try single.encode(1)
            var keyed = encoder.container(keyedBy: Keys.self)
            try keyed.encode(2, forKey: .a)
        }
    }

    @Test func unsupportedContainerUseIsAnErrorNotGarbage() {
        #expect { try FastJSONEncoder().encode(Mixed()) } throws: { fastJSONError($0)?.code == .invalidEncoderUsage }
        #expect { try FastJSONEncoder().encode([Mixed()]) } throws: { fastJSONError($0)?.code == .invalidEncoderUsage }
        #expect { try FastJSONEncoder().encode(OutOfOrder()) } throws: { fastJSONError($0)?.code == .invalidEncoderUsage }
        #expect { try FastJSONEncoder().encode(TwoSingleValues()) } throws: { fastJSONError($0)?.code == .invalidEncoderUsage }
    }

    @Test func codecsRecoverAfterErrors() throws {
        for _ in 0..<3 {
            #expect(throws: EncodingError.self) { try FastJSONEncoder().encode(OutOfOrder()) }
            #expect(throws: DecodingError.self) { try fastDecode(Sample.self, #"{"id":1,"#) }
            #expect(throws: DecodingError.self) { try fastDecode(Sample.self, #"{"id":"x","name":"n","value":1,"tags":[]}"#) }
            let sample = Sample(id: 1, name: "n", value: 2.5, tags: ["t"])
            let bytes = try FastJSONEncoder().encode(sample)
            #expect(String(decoding: bytes, as: UTF8.self) == #"{"id":1,"name":"n","value":2.5,"tags":["t"]}"#)
            #expect(try FastJSONDecoder().decode(Sample.self, from: bytes) == sample)
        }
    }

    @Test func errorDescriptionIsReadable() {
        let error = FastJSONError(code: .keyNotFound, offset: 12, codingPath: "rows[1]", message: "No value for key id")
        #expect(error.description == "FastJSON keyNotFound: No value for key id (at byte 12) (coding path: rows[1])")
        #expect(FastJSONError.Code.tooDeep.description == "tooDeep")
    }

    /// The codecs recycle internal state through a lock-free cache: hammer it from many tasks.
    @Test func concurrentUseFromManyTasks() async throws {
        let document = Document.make(users: 12)
        let expected = try FastJSONEncoder().encode(document)
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for task in 0..<8 {
                group.addTask {
                    for i in 0..<300 {
                        let sample = Sample(id: task * 1000 + i, name: "n\(i)", value: Double(i) / 4, tags: ["\(task)"])
                        let bytes = try FastJSONEncoder().encode(sample)
                        guard try FastJSONDecoder().decode(Sample.self, from: bytes) == sample else { return false }
                        guard try FastJSONEncoder().encode(document) == expected else { return false }
                        guard try FastJSONDecoder().decode(Document.self, from: expected) == document else { return false }
                    }
                    return true
                }
            }
            for try await ok in group { #expect(ok) }
        }
    }
}

/// A field holding JSON text, encoded and decoded with FastJSON from inside `encode(to:)` /
/// `init(from:)`: the codecs must be re-entrant.
struct Envelope: Codable, Equatable {
    var kind: String
    var payload: Sample

    enum CodingKeys: String, CodingKey { case kind, payload }

    init(kind: String, payload: Sample) {
        self.kind = kind
        self.payload = payload
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        kind = try container.decode(String.self, forKey: .kind)
        let text = try container.decode(String.self, forKey: .payload)
        payload = try FastJSONDecoder().decode(Sample.self, from: Array(text.utf8))
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(kind, forKey: .kind)
        let inner = try FastJSONEncoder().encode(payload)
        try container.encode(String(decoding: inner, as: UTF8.self), forKey: .payload)
    }
}

@Test func codecsAreReentrant() throws {
    let envelope = Envelope(kind: "sample", payload: Sample(id: 7, name: "in\"ner", value: 0.5, tags: ["x"]))
    let text = try fastText([envelope, envelope])
    #expect(text.contains(#"\"id\":7"#))
    #expect(try fastDecode([Envelope].self, text) == [envelope, envelope])
    #expect(try foundationDecode([Envelope].self, text) == [envelope, envelope])
}
