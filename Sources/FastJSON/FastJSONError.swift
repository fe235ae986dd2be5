/// An error raised by ``FastJSONEncoder`` or ``FastJSONDecoder``.
///
/// The codec throws the standard `DecodingError` / `EncodingError` cases that `Codable` code expects
/// (`keyNotFound`, `typeMismatch`, `valueNotFound`, `dataCorrupted`, `invalidValue`), so existing
/// `catch` clauses keep working. Each of those carries a `FastJSONError` as its context's
/// `underlyingError`, which adds a machine-readable ``code`` and, when decoding, the byte ``offset``
/// in the input where the problem was found.
///
/// ```swift
/// do {
///     _ = try FastJSONDecoder().decode(Sample.self, from: bytes)
/// } catch let DecodingError.dataCorrupted(context) {
///     if let error = context.underlyingError as? FastJSONError {
///         print(error.code, error.offset ?? -1)
///     }
/// }
/// ```
public struct FastJSONError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What went wrong, independent of the message text.
    ///
    /// New codes may be added in later versions; switch over them with a `default` branch.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case syntax, unexpectedEnd, invalidUTF8, invalidEscape, tooDeep, inputTooLarge
            case typeMismatch, keyNotFound, valueNotFound, numberNotRepresentable, invalidValue
            case nonFiniteNumber, invalidEncoderUsage, noValueEncoded
        }

        private let base: Base

        private init(_ base: Base) { self.base = base }

        /// The input is not JSON: an unexpected character was found.
        public static let syntax = Code(.syntax)
        /// The input ended in the middle of a JSON value.
        public static let unexpectedEnd = Code(.unexpectedEnd)
        /// A string contains bytes that are not valid UTF-8 (or the input is not valid UTF-16/32).
        public static let invalidUTF8 = Code(.invalidUTF8)
        /// A string contains an invalid escape sequence or an unpaired UTF-16 surrogate.
        public static let invalidEscape = Code(.invalidEscape)
        /// Arrays and objects are nested deeper than ``FastJSONDecoder/maximumDepth``.
        public static let tooDeep = Code(.tooDeep)
        /// The input is larger than the decoder supports (4 GiB).
        public static let inputTooLarge = Code(.inputTooLarge)
        /// A JSON value has a different type than the Swift type being decoded.
        public static let typeMismatch = Code(.typeMismatch)
        /// A keyed container has no value for a required key.
        public static let keyNotFound = Code(.keyNotFound)
        /// A value is `null` (or an unkeyed container is exhausted) where a value was required.
        public static let valueNotFound = Code(.valueNotFound)
        /// A JSON number does not fit the requested Swift numeric type.
        public static let numberNotRepresentable = Code(.numberNotRepresentable)
        /// A value is well-formed JSON but invalid for its type (bad Base64, bad URL, …).
        public static let invalidValue = Code(.invalidValue)
        /// A floating-point value to encode is NaN or infinite; JSON has no spelling for it.
        public static let nonFiniteNumber = Code(.nonFiniteNumber)
        /// An `Encodable` implementation used the encoder in a way this streaming encoder can't
        /// support (for example writing to a container after a sibling container was started).
        public static let invalidEncoderUsage = Code(.invalidEncoderUsage)
        /// The top-level value did not encode anything.
        public static let noValueEncoded = Code(.noValueEncoded)

        /// The code's name, such as `syntax`.
        public var description: String { base.rawValue }
    }

    /// What went wrong.
    public let code: Code
    /// Byte offset in the decoder's input where the problem was found, or `nil` when encoding.
    public let offset: Int?
    /// The coding path of the value concerned, written like `items[2].name` (empty at the top level).
    public let codingPath: String
    /// A human-readable explanation.
    public let message: String

    /// Creates an error. The codec creates these; user code normally only inspects them.
    public init(code: Code, offset: Int?, codingPath: String, message: String) {
        self.code = code
        self.offset = offset
        self.codingPath = codingPath
        self.message = message
    }

    /// A one-line description: message, offset and coding path.
    public var description: String {
        var text = "FastJSON \(code): \(message)"
        if let offset { text += " (at byte \(offset))" }
        if !codingPath.isEmpty { text += " (coding path: \(codingPath))" }
        return text
    }
}

/// Renders a coding path the way ``FastJSONError/codingPath`` shows it: `a.b[2].c`.
func _describe(codingPath: [any CodingKey]) -> String {
    var text = ""
    for key in codingPath {
        if let index = key.intValue, key is _JSONKey {
            text += "[\(index)]"
        } else {
            if !text.isEmpty { text += "." }
            text += key.stringValue
        }
    }
    return text
}

/// The coding key used for array indexes and `super`; an index's string is built only on demand.
/// Kept to three words so that it fits an existential's inline buffer (no allocation per element).
@usableFromInline
struct _JSONKey: CodingKey {
    @usableFromInline let string: String?
    @usableFromInline let index: Int

    @usableFromInline var stringValue: String { string ?? "Index \(index)" }
    @usableFromInline var intValue: Int? { string == nil ? index : nil }

    @usableFromInline init(stringValue: String) {
        self.string = stringValue
        self.index = 0
    }

    @usableFromInline init(intValue: Int) {
        self.string = nil
        self.index = intValue
    }

    static let `super` = _JSONKey(stringValue: "super")
}

/// Stands for "no key" in generic error-path parameters (a generic `Optional<Key>` would need
/// runtime metadata on every call).
struct _NoKey: CodingKey {
    var stringValue: String { "" }
    var intValue: Int? { nil }
    init() {}
    init?(stringValue: String) { nil }
    init?(intValue: Int) { nil }
}
