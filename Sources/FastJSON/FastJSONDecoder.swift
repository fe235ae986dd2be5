#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Decodes `Decodable` values from UTF-8 JSON bytes, about ten times faster than Foundation's
/// `JSONDecoder`, accepting what `JSONDecoder` accepts with its default settings.
///
/// The input is read in place (no copy into `Data`). It is first validated completely and indexed
/// into a compact tape of values (type, byte range, subtree size); the `Decoder` then walks that
/// tape, comparing object keys byte-for-byte with `CodingKey.stringValue` without creating strings.
///
/// The parser is strict (RFC 8259, as checked by JSONTestSuite): no comments, trailing commas,
/// `NaN`, leading zeros or invalid UTF-8. Like `JSONDecoder` it also accepts UTF-16 and UTF-32
/// input (detected from a byte-order mark or the zero-byte pattern) and skips a UTF-8 byte-order mark.
///
/// Errors are the standard `DecodingError` cases; each context's `underlyingError` is a
/// ``FastJSONError`` with the byte offset of the offending value.
///
/// ```swift
/// let sample = try FastJSONDecoder().decode(Sample.self, from: bytes)
/// let any = try FastJSONDecoder().decode(JSONValue.self, from: bytes)
/// ```
public struct FastJSONDecoder: Sendable {
    /// The deepest nesting of arrays and objects accepted; deeper input fails with
    /// `DecodingError.dataCorrupted` (code ``FastJSONError/Code/tooDeep``). Default 512, like
    /// `JSONDecoder`. Decoding nested `Decodable` values recurses, so very large limits can exhaust
    /// the stack of the calling thread.
    public var maximumDepth: Int = 512

    /// Values handed to the `Decodable` implementations through `Decoder.userInfo`.
    public var userInfo: [CodingUserInfoKey: any Sendable] = [:]

    /// Creates a decoder with the default settings.
    public init() {}

    /// Decodes a value of type `T` from JSON bytes.
    ///
    /// - Throws: `DecodingError`: `dataCorrupted` for invalid JSON (with the byte offset in the
    ///   underlying ``FastJSONError``) or out-of-range numbers, `typeMismatch`, `keyNotFound`,
    ///   `valueNotFound` as for `JSONDecoder`.
    @inlinable
    public func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws -> T {
        try bytes.withUnsafeBufferPointer { try _decode(type, from: $0) }
    }

    /// Decodes a value of type `T` from a slice of JSON bytes (for example a frame in a larger buffer).
    @inlinable
    public func decode<T: Decodable>(_ type: T.Type, from bytes: ArraySlice<UInt8>) throws -> T {
        try bytes.withUnsafeBufferPointer { try _decode(type, from: $0) }
    }

    /// Decodes a value of type `T` from JSON bytes held in `Data`, without copying them.
    @inlinable
    public func decode<T: Decodable>(_ type: T.Type, from data: Data) throws -> T {
        try data.withUnsafeBytes { try _decode(type, from: $0.assumingMemoryBound(to: UInt8.self)) }
    }

    /// Decodes a value of type `T` from JSON bytes in memory the caller keeps valid for the call.
    @inlinable
    public func decode<T: Decodable>(_ type: T.Type, from buffer: UnsafeRawBufferPointer) throws -> T {
        try _decode(type, from: buffer.assumingMemoryBound(to: UInt8.self))
    }

    @usableFromInline
    func _decode<T: Decodable>(_ type: T.Type, from input: UnsafeBufferPointer<UInt8>) throws -> T {
        switch _detectEncoding(input) {
        case .utf8(let skip):
            return try _decodeUTF8(type, from: UnsafeBufferPointer(rebasing: input[skip...]))
        case let other:
            let utf8 = try _transcode(input, other)
            return try utf8.withUnsafeBufferPointer { try _decodeUTF8(type, from: $0) }
        }
    }

    func _decodeUTF8<T: Decodable>(_ type: T.Type, from input: UnsafeBufferPointer<UInt8>) throws -> T {
        var state = _DecoderState.make(userInfo: userInfo)
        defer { _DecoderState.recycle(&state) }
        let core = state.core
        do {
            try _parse(input, maxDepth: maximumDepth, into: &core.pointee.tokens)
        } catch let error as FastJSONError {
            throw DecodingError.dataCorrupted(DecodingError.Context(
                codingPath: [], debugDescription: "The given data was not valid JSON: \(error.message).",
                underlyingError: error))
        }
        core.pointee.bytes = input
        return try _Decoding.decodeTopLevel(core, type)
    }
}

// MARK: - Input encodings

enum _InputEncoding {
    case utf8(skip: Int)
    case utf16(bigEndian: Bool, skip: Int)
    case utf32(bigEndian: Bool, skip: Int)
}

/// Detects UTF-16/32 input the way `JSONDecoder` does: a byte-order mark, or the pattern of zero
/// bytes around the first (ASCII) character.
func _detectEncoding(_ bytes: UnsafeBufferPointer<UInt8>) -> _InputEncoding {
    let n = bytes.count
    // Fast path: UTF-8 JSON starting with a printable ASCII character followed by a non-zero byte.
    if n >= 2, bytes[0] > 0x20, bytes[0] < 0x80, bytes[1] != 0 { return .utf8(skip: 0) }
    if n >= 3, bytes[0] == 0xEF, bytes[1] == 0xBB, bytes[2] == 0xBF { return .utf8(skip: 3) }
    if n >= 4 {
        switch (bytes[0], bytes[1], bytes[2], bytes[3]) {
        case (0x00, 0x00, 0xFE, 0xFF): return .utf32(bigEndian: true, skip: 4)
        case (0xFF, 0xFE, 0x00, 0x00): return .utf32(bigEndian: false, skip: 4)
        case (0x00, 0x00, 0x00, _): return .utf32(bigEndian: true, skip: 0)
        case (_, 0x00, 0x00, 0x00): return .utf32(bigEndian: false, skip: 0)
        default: break
        }
    }
    if n >= 2 {
        switch (bytes[0], bytes[1]) {
        case (0xFE, 0xFF): return .utf16(bigEndian: true, skip: 2)
        case (0xFF, 0xFE): return .utf16(bigEndian: false, skip: 2)
        case (0x00, let b) where b != 0: return .utf16(bigEndian: true, skip: 0)
        case (let b, 0x00) where b != 0: return .utf16(bigEndian: false, skip: 0)
        default: break
        }
    }
    return .utf8(skip: 0)
}

func _transcode(_ bytes: UnsafeBufferPointer<UInt8>, _ encoding: _InputEncoding) throws -> [UInt8] {
    var string: String?
    switch encoding {
    case .utf8:
        return Array(bytes)
    case .utf16(let bigEndian, let skip):
        let body = bytes[skip...]
        if body.count % 2 == 0 {
            var units: [UInt16] = []
            units.reserveCapacity(body.count / 2)
            var i = body.startIndex
            while i < body.endIndex {
                let a = UInt16(body[i]), b = UInt16(body[i + 1])
                units.append(bigEndian ? a << 8 | b : b << 8 | a)
                i += 2
            }
            string = String(validating: units, as: UTF16.self)
        }
    case .utf32(let bigEndian, let skip):
        let body = bytes[skip...]
        if body.count % 4 == 0 {
            var units: [UInt32] = []
            var i = body.startIndex
            while i < body.endIndex {
                let b0 = UInt32(body[i]), b1 = UInt32(body[i + 1]), b2 = UInt32(body[i + 2]), b3 = UInt32(body[i + 3])
                units.append(bigEndian ? b0 << 24 | b1 << 16 | b2 << 8 | b3 : b3 << 24 | b2 << 16 | b1 << 8 | b0)
                i += 4
            }
            string = String(validating: units, as: UTF32.self)
        }
    }
    guard let string else {
        let error = FastJSONError(code: .invalidUTF8, offset: 0, codingPath: "",
                                  message: "the input looks like UTF-16 or UTF-32 but is not valid in that encoding")
        throw DecodingError.dataCorrupted(DecodingError.Context(
            codingPath: [], debugDescription: "The given data was not valid JSON: \(error.message).",
            underlyingError: error))
    }
    return Array(string.utf8)
}

// MARK: - State

/// The decoder's shared state; also the `Decoder` handed to values. Lives for one `decode` call.
/// The decoder's state for one `decode` call. It lives behind an `UnsafeMutablePointer` owned by
/// ``_DecoderState``, so containers reach it without retain/release and without the dynamic
/// exclusivity checks a class's stored properties would need.
///
/// Methods here never call user code (`init(from:)`); re-entrant operations live in ``_Decoding``
/// and access the state through the pointer only between calls into user code.
@usableFromInline
struct _DecoderCore {
    var bytes: UnsafeBufferPointer<UInt8>
    var tokens: _Tape
    /// Token the `Decoder` methods act on, and its coding-path depth.
    var current = 0
    var currentDepth = 0
    var path: [any CodingKey] = []
    /// Per container depth: (object token, next key token) for in-order lookups in large objects.
    var hints: [(object: Int, key: Int)] = []
    var sendableUserInfo: [CodingUserInfoKey: any Sendable]
    /// The `Decoder` handed to `init(from:)`; it owns this state.
    /// (Unmanaged: reading it for a call costs no retain/release pair.)
    var decoder: Unmanaged<_DecoderState>?
    var containers = _ContainerCache<_KeyedDecoderRecord>()
    /// ``_smallASCIIStringsSupported``, copied here to skip the global's lazy-initialization check.
    let smallStrings = _smallASCIIStringsSupported

    init(bytes: UnsafeBufferPointer<UInt8>, tokens: _Tape, userInfo: [CodingUserInfoKey: any Sendable]) {
        self.bytes = bytes
        self.tokens = tokens
        self.sendableUserInfo = userInfo
    }

    /// Index of the synthetic `null` token standing for absent values.
    var missing: Int { tokens.count - 1 }

    var userInfo: [CodingUserInfoKey: Any] {
        var result: [CodingUserInfoKey: Any] = [:]
        for (key, value) in sendableUserInfo { result[key] = value }
        return result
    }

    func prefixPath(_ depth: Int) -> [any CodingKey] {
        depth >= path.count ? path : Array(path[0..<depth])
    }

    func errorPath<K: CodingKey>(_ depth: Int, _ key: K) -> [any CodingKey] {
        var result = prefixPath(depth)
        if K.self != _NoKey.self { result.append(key) }
        return result
    }

    @inline(__always)
    mutating func truncatePath(_ depth: Int) {
        if path.count > depth { path.removeLast(path.count - depth) }
    }

    func containerMismatch(_ type: Any.Type, _ what: String, _ token: _Token, _ index: Int, _ depth: Int) -> DecodingError {
        let path = prefixPath(depth)
        if token.kind == .null {
            let message = "Cannot get \(what) decoding container -- found null value instead"
            return .valueNotFound(type, context(path, message, .valueNotFound, index))
        }
        let message = "Expected to decode \(type) but found \(token.kind.name) instead."
        return .typeMismatch(type, context(path, message, .typeMismatch, index))
    }

    func context(_ path: [any CodingKey], _ message: String, _ code: FastJSONError.Code, _ index: Int)
        -> DecodingError.Context
    {
        let offset = index < tokens.count - 1 ? Int(tokens[index].start) : nil
        return DecodingError.Context(
            codingPath: path, debugDescription: message,
            underlyingError: FastJSONError(code: code, offset: offset, codingPath: _describe(codingPath: path),
                                           message: message))
    }

    // MARK: Scalars

    @inline(__always)
    func text(_ token: _Token) -> UnsafeBufferPointer<UInt8> {
        UnsafeBufferPointer(start: bytes.baseAddress! + Int(token.start), count: Int(token.length))
    }

    func mismatch<K: CodingKey>(_ type: Any.Type, _ index: Int, _ depth: Int, _ key: K) -> DecodingError {
        let token = tokens[index]
        let path = errorPath(depth, key)
        if token.kind == .null {
            let message = "Cannot get value of type \(type) -- found null value instead"
            return .valueNotFound(type, context(path, message, .valueNotFound, index))
        }
        let message = "Expected to decode \(type) but found \(token.kind.name) instead."
        return .typeMismatch(type, context(path, message, .typeMismatch, index))
    }

    func notRepresentable<K: CodingKey>(_ type: Any.Type, _ index: Int, _ depth: Int, _ key: K) -> DecodingError {
        let path = errorPath(depth, key)
        let number = String(decoding: text(tokens[index]), as: UTF8.self)
        let message = "Number \(number) is not representable in Swift as \(type)."
        return .dataCorrupted(context(path, message, .numberNotRepresentable, index))
    }

    @inline(__always)
    mutating func decodeString<K: CodingKey>(at index: Int, depth: Int, key: K) throws -> String {
        let token = tokens[index]
        guard token.kind == .string else { throw mismatch(String.self, index, depth, key) }
        return makeString(token)
    }

    @inline(__always)
    mutating func decodeBool<K: CodingKey>(at index: Int, depth: Int, key: K) throws -> Bool {
        let kind = tokens[index].kind
        if kind == .true { return true }
        if kind == .false { return false }
        throw mismatch(Bool.self, index, depth, key)
    }

    @inline(__always)
    mutating func decodeInteger<I: FixedWidthInteger, K: CodingKey>(_ type: I.Type, at index: Int, depth: Int, key: K) throws -> I {
        let token = tokens[index]
        guard token.kind == .number else { throw mismatch(I.self, index, depth, key) }
        let parsed = _parseMagnitude(text(token), flags: token.flags)
        guard parsed.fits(I.self) else { throw notRepresentable(I.self, index, depth, key) }
        return parsed.value(I.self)
    }

    @inline(__always)
    mutating func decodeInt<K: CodingKey>(at index: Int, depth: Int, key: K) throws -> Int {
        let token = tokens[index]
        guard token.kind == .number else { throw mismatch(Int.self, index, depth, key) }
        let parsed = _parseMagnitude(text(token), flags: token.flags)
        guard parsed.fits(Int.self) else { throw notRepresentable(Int.self, index, depth, key) }
        return parsed.value(Int.self)
    }

    @inline(__always)
    mutating func decodeDouble<K: CodingKey>(at index: Int, depth: Int, key: K) throws -> Double {
        let token = tokens[index]
        guard token.kind == .number else { throw mismatch(Double.self, index, depth, key) }
        guard let value = _parseDouble(text(token), flags: token.flags) else {
            throw notRepresentable(Double.self, index, depth, key)
        }
        return value
    }

    mutating func decodeFloat<K: CodingKey>(at index: Int, depth: Int, key: K) throws -> Float {
        let token = tokens[index]
        guard token.kind == .number else { throw mismatch(Float.self, index, depth, key) }
        guard let value = _parseFloat(text(token), flags: token.flags) else {
            throw notRepresentable(Float.self, index, depth, key)
        }
        return value
    }

    @inline(__always)
    func makeString(_ token: _Token) -> String {
        let raw = text(token)
        // Short plain-ASCII strings (most keys' values: tags, ids, names) are built directly in
        // the small-string form, skipping UTF-8 validation the parser has already done.
        if token.flags == 0 && token.length <= 15 && smallStrings {
            let start = Int(token.start)
            if start &+ 16 <= bytes.count {
                // Room for two whole words: load them and mask, without branching on the length.
                let count = Int(token.length)
                return _smallASCIIString(_maskedLoad16(bytes.baseAddress! + start, count), count: count)
            }
            return _smallASCIIString(raw)
        }
        if token.flags & _Token.hasEscapes == 0 {
            return String(decoding: raw, as: UTF8.self)
        }
        return _unescape(raw)
    }

    // MARK: Values

    /// Decodes an array of scalars; errors name the element's index.
    @inline(__always)
    mutating func decodeArray<E, K: CodingKey>(at index: Int, depth: Int, key: K,
                                      _ element: (inout _DecoderCore, Int, Int, _JSONKey) throws -> E) throws -> [E] {
        let token = tokens[index]
        guard token.kind == .array else { throw mismatch([E].self, index, depth, key) }
        var result: [E] = []
        result.reserveCapacity(Int(token.length))
        var i = index + 1
        let end = Int(token.next)
        while i < end {
            do {
                result.append(try element(&self, i, depth, _JSONKey(intValue: result.count)))
            } catch {
                // Re-run the failing element with its full coding path for the error.
                truncatePath(depth)
                if K.self != _NoKey.self { path.append(key) }
                defer { truncatePath(depth) }
                _ = try element(&self, i, path.count, _JSONKey(intValue: result.count))
                throw error
            }
            i = Int(tokens[i].next)
        }
        return result
    }

    /// `[String]` without per-element closures (common in messages: tags, names, ids).
    mutating func decodeStringArray<K: CodingKey>(at index: Int, depth: Int, key: K) throws -> [String] {
        let token = tokens[index]
        guard token.kind == .array else { throw mismatch([String].self, index, depth, key) }
        let count = Int(token.length)
        var i = index + 1
        // (reserveCapacity + append is fully inlinable and specialized; the unsafeUninitializedCapacity
        // initializer allocates through unspecialized code that looks up the storage type's metadata.)
        var result: [String] = []
        result.reserveCapacity(count)
        for _ in 0..<count {
            let element = tokens[i]
            // All elements are strings in the common case (then they are consecutive tokens);
            // otherwise start over element by element, for errors with the element's path.
            guard element.kind == .string else {
                return try decodeArray(at: index, depth: depth, key: key) { core, i, path, key in
                    try core.decodeString(at: i, depth: path, key: key)
                }
            }
            result.append(makeString(element))
            i += 1
        }
        return result
    }

    // MARK: Keys

    /// Returns the token index of the value for `key` in the object at `object`, or `nil`.
    /// The first of duplicate keys wins (as with `JSONDecoder`).
    @inline(__always)
    mutating func find(_ key: String, in object: Int, end: Int, depth: Int, inOrder: Bool) -> Int? {
        if let found = key.utf8.withContiguousStorageIfAvailable({ find($0, in: object, end: end, depth: depth, inOrder: inOrder) }) {
            return found
        }
        var copy = key
        return copy.withUTF8 { find($0, in: object, end: end, depth: depth, inOrder: inOrder) }
    }

    @inline(__always)
    mutating func find(_ keyBytes: UnsafeBufferPointer<UInt8>, in object: Int, end: Int, depth: Int, inOrder: Bool) -> Int? {
        do {
            // A byte-for-byte match with a plain token (ASCII, no escapes) implies an ASCII key, so
            // the key's ASCII check is needed only on the other outcomes: a non-ASCII key must be
            // compared as a String with every key (it may be canonically equivalent to an ASCII one).
            if inOrder, depth < hints.count, hints[depth].object == object {
                let keyIndex = hints[depth].key
                if keyIndex < end, keyEquals(tokens[keyIndex], keyBytes) {
                    hints[depth].key = Int(tokens[keyIndex + 1].next)
                    return keyIndex + 1
                }
            }
            var i = object + 1
            while i < end {
                let token = tokens[i]
                if token.flags == 0 {
                    if keyEquals(token, keyBytes) {
                        if inOrder { remember(object: object, next: Int(tokens[i + 1].next), depth: depth) }
                        return i + 1
                    }
                } else if makeString(token) == String(decoding: keyBytes, as: UTF8.self) {
                    // Escaped or non-ASCII JSON key: compare as Strings (canonical equivalence).
                    return _isASCII(keyBytes) ? i + 1 : findSlow(keyBytes, in: object, end: end)
                }
                i = Int(tokens[i + 1].next)
            }
            return _isASCII(keyBytes) ? nil : findSlow(keyBytes, in: object, end: end)
        }
    }

    func _isASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        for byte in bytes where byte >= 0x80 { return false }
        return true
    }

    mutating func remember(object: Int, next: Int, depth: Int) {
        while hints.count <= depth { hints.append((-1, -1)) }
        hints[depth] = (object, next)
    }

    func findSlow(_ keyBytes: UnsafeBufferPointer<UInt8>, in object: Int, end: Int) -> Int? {
        findSlow(String(decoding: keyBytes, as: UTF8.self), in: object, end: end)
    }

    func findSlow(_ key: String, in object: Int, end: Int) -> Int? {
        var i = object + 1
        while i < end {
            if makeString(tokens[i]) == key { return i + 1 }
            i = Int(tokens[i + 1].next)
        }
        return nil
    }

    @inline(__always)
    func keyEquals(_ token: _Token, _ key: UnsafeBufferPointer<UInt8>) -> Bool {
        let count = Int(token.length)
        guard count == key.count else { return false }
        if count == 0 { return true }
        let json = bytes.baseAddress! + Int(token.start)
        let swift = key.baseAddress!
        if count <= 16 {
            // Typical keys: two (possibly overlapping) word loads per side, no loop.
            return _load16(json, count) == _load16(swift, count)
        }
        var i = 0
        while i &+ 8 <= count {
            if UnsafeRawPointer(json + i).loadUnaligned(as: UInt64.self)
                != UnsafeRawPointer(swift + i).loadUnaligned(as: UInt64.self) { return false }
            i &+= 8
        }
        while i < count {
            if json[i] != swift[i] { return false }
            i &+= 1
        }
        return true
    }

    /// Whether the object's keys are plain ASCII and distinct, so in-order lookup hints are exact.
    func keysAreDistinctASCII(_ object: Int) -> Bool {
        var seen = Set<Int>()
        let end = Int(tokens[object].next)
        var i = object + 1
        while i < end {
            let token = tokens[i]
            if token.flags != 0 { return false }
            var hasher = Hasher()
            hasher.combine(bytes: UnsafeRawBufferPointer(text(token)))
            if !seen.insert(hasher.finalize()).inserted { return false }
            i = Int(tokens[i + 1].next)
        }
        return true
    }
}

/// Operations that call user code (`init(from:)`) or create containers. They touch the state only
/// through short, separate accesses via the pointer, never across a call into user code.
enum _Decoding {
    typealias Core = UnsafeMutablePointer<_DecoderCore>

    static func decodeTopLevel<T: Decodable>(_ core: Core, _ type: T.Type) throws -> T {
        try decodeValue(core, type, at: 0, depth: 0, key: _NoKey())
    }

    static func keyedContainer<Key: CodingKey>(_ core: Core, at index: Int, depth: Int) throws -> KeyedDecodingContainer<Key> {
        let token = core.pointee.tokens[index]
        guard token.kind == .object else {
            throw core.pointee.containerMismatch([String: Any].self, "keyed", token, index, depth)
        }
        let record = _KeyedDecoderRecord(object: index, end: Int(token.next), depth: depth,
                                         inOrder: token.length > 12 && core.pointee.keysAreDistinctASCII(index))
        let keyType = ObjectIdentifier(Key.self)
        if let box = core.pointee.containers.reuse(keyType: keyType, record: record) {
            return unsafeBitCast(box, to: KeyedDecodingContainer<Key>.self)
        }
        let pointer = core.pointee.containers.newRecord(record)
        let container = KeyedDecodingContainer(_KeyedDecoder<Key>(core: core, record: pointer))
        let box: AnyObject? = MemoryLayout<KeyedDecodingContainer<Key>>.size == MemoryLayout<AnyObject>.size
            ? unsafeBitCast(container, to: AnyObject.self) : nil
        core.pointee.containers.keep(box, keyType: keyType, record: pointer)
        return container
    }

    static func unkeyedContainer(_ core: Core, at index: Int, depth: Int) throws -> any UnkeyedDecodingContainer {
        let token = core.pointee.tokens[index]
        guard token.kind == .array else {
            throw core.pointee.containerMismatch([Any].self, "unkeyed", token, index, depth)
        }
        return _UnkeyedDecoder(core: core, array: index, depth: depth)
    }

    /// Decodes the value at token `index`, whose coding path is `path[0..<depth] + [key]` (or just
    /// `path[0..<depth]` when `key` is `_NoKey`). Types with a JSON-specific representation are
    /// decoded directly; others through `init(from:)`.
    ///
    /// (No `Optional<T>` appears here: with `T` unspecialized it would cost a runtime metadata lookup.)
    @inline(__always)
    static func decodeValue<T: Decodable, K: CodingKey>(_ core: Core, _ type: T.Type, at index: Int, depth: Int, key: K) throws -> T {
        // Objects only ever decode through `init(from:)`, except the types JSONDecoder represents
        // as scalars and whose own Codable form is keyed (these must report a type mismatch).
        if core.pointee.tokens[index].kind == .object {
            if T.self == URL.self || T.self == Decimal.self {
                return try decodeRare(core, type, at: index, depth: depth, key: key)
            }
            return try decodeNested(core, type, at: index, depth: depth, key: key)
        }
        if T.self == String.self {
            return _cast(try core.pointee.decodeString(at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Int.self {
            return _cast(try core.pointee.decodeInt(at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Double.self {
            return _cast(try core.pointee.decodeDouble(at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Bool.self {
            return _cast(try core.pointee.decodeBool(at: index, depth: depth, key: key), to: T.self)
        } else if T.self == [String].self {
            // Move the array into the result (bit-casting would copy it: a retain and a release),
            // then leave an empty array behind for the local's own cleanup.
            var array = try core.pointee.decodeStringArray(at: index, depth: depth, key: key)
            return _take(&array, as: T.self)
        } else if T.self == [Int].self {
            return _cast(try core.pointee.decodeArray(at: index, depth: depth, key: key) { core, i, path, key in
                try core.decodeInt(at: i, depth: path, key: key)
            }, to: T.self)
        } else if T.self == [Double].self {
            return _cast(try core.pointee.decodeArray(at: index, depth: depth, key: key) { core, i, path, key in
                try core.decodeDouble(at: i, depth: path, key: key)
            }, to: T.self)
        }
        return try decodeRare(core, type, at: index, depth: depth, key: key)
    }

    /// Moves `array` out as a `T` (which must be `[String]`), leaving an empty array behind.
    @inline(__always)
    static func _take<T>(_ array: UnsafeMutablePointer<[String]>, as type: T.Type) -> T {
        let result = UnsafeMutableRawPointer(array).assumingMemoryBound(to: T.self).move()
        array.initialize(to: [])
        return result
    }

    static func decodeNested<T: Decodable, K: CodingKey>(_ core: Core, _ type: T.Type, at index: Int, depth: Int, key: K) throws -> T {
        core.pointee.truncatePath(depth)
        var valueDepth = depth
        if K.self != _NoKey.self {
            core.pointee.path.append(key)
            valueDepth += 1
        }
        let saved = (core.pointee.current, core.pointee.currentDepth)
        core.pointee.current = index
        core.pointee.currentDepth = valueDepth
        defer {
            (core.pointee.current, core.pointee.currentDepth) = saved
            core.pointee.truncatePath(depth)
        }
        // The state is alive for the whole call (its owner holds it); skip the retain/release.
        return try core.pointee.decoder!._withUnsafeGuaranteedRef { try T(from: $0) }
    }

    static func decodeRare<T: Decodable, K: CodingKey>(_ core: Core, _ type: T.Type, at index: Int, depth: Int, key: K) throws -> T {
        if T.self == Int64.self {
            return _cast(try core.pointee.decodeInteger(Int64.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == UInt64.self {
            return _cast(try core.pointee.decodeInteger(UInt64.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == UInt.self {
            return _cast(try core.pointee.decodeInteger(UInt.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Int32.self {
            return _cast(try core.pointee.decodeInteger(Int32.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == UInt32.self {
            return _cast(try core.pointee.decodeInteger(UInt32.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Int16.self {
            return _cast(try core.pointee.decodeInteger(Int16.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == UInt16.self {
            return _cast(try core.pointee.decodeInteger(UInt16.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Int8.self {
            return _cast(try core.pointee.decodeInteger(Int8.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == UInt8.self {
            return _cast(try core.pointee.decodeInteger(UInt8.self, at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Float.self {
            return _cast(try core.pointee.decodeFloat(at: index, depth: depth, key: key), to: T.self)
        } else if T.self == Date.self {
            let seconds = try core.pointee.decodeDouble(at: index, depth: depth, key: key)
            return _cast(Date(timeIntervalSinceReferenceDate: seconds), to: T.self)
        } else if T.self == Data.self {
            let string = try core.pointee.decodeString(at: index, depth: depth, key: key)
            guard let data = Data(base64Encoded: string) else {
                throw DecodingError.dataCorrupted(core.pointee.context(core.pointee.errorPath(depth, key), "Encountered Data is not valid Base64.",
                                                          .invalidValue, index))
            }
            return _cast(data, to: T.self)
        } else if T.self == URL.self {
            let string = try core.pointee.decodeString(at: index, depth: depth, key: key)
            guard let url = URL(string: string) else {
                throw DecodingError.dataCorrupted(core.pointee.context(core.pointee.errorPath(depth, key), "Invalid URL string.",
                                                          .invalidValue, index))
            }
            return _cast(url, to: T.self)
        } else if T.self == Decimal.self {
            let token = core.pointee.tokens[index]
            guard token.kind == .number else { throw core.pointee.mismatch(Decimal.self, index, depth, key) }
            let string = String(decoding: core.pointee.text(token), as: UTF8.self)
            guard let decimal = Decimal(string: string), decimal.isFinite else {
                throw core.pointee.notRepresentable(Decimal.self, index, depth, key)
            }
            return _cast(decimal, to: T.self)
        }
        return try decodeNested(core, type, at: index, depth: depth, key: key)
    }

}

/// The `Decoder` handed to `init(from:)`. Owns the state for one `decode` call.
@usableFromInline
final class _DecoderState: Decoder {
    let core: UnsafeMutablePointer<_DecoderCore>

    private init() {
        core = .allocate(capacity: 1)
        core.initialize(to: _DecoderCore(bytes: UnsafeBufferPointer(start: nil, count: 0), tokens: _Tape(capacity: 64),
                                         userInfo: [:]))
        core.pointee.decoder = Unmanaged.passUnretained(self)
    }

    /// One recycled state, kept between calls so decoding doesn't allocate it (and its tape) anew.
    private static let cache = _ObjectCache()

    /// A state ready for one `decode` call: recycled if one is available.
    static func make(userInfo: [CodingUserInfoKey: any Sendable]) -> _DecoderState {
        let state = cache.take(_DecoderState.self) ?? _DecoderState()
        if !userInfo.isEmpty || !state.core.pointee.sendableUserInfo.isEmpty {
            state.core.pointee.sendableUserInfo = userInfo
        }
        return state
    }

    /// Returns a state to the cache unless something else still references it or it grew large.
    static func recycle(_ state: inout _DecoderState) {
        guard isKnownUniquelyReferenced(&state), state.core.pointee.tokens.capacityInTokens <= 16_384 else { return }
        let core = state.core
        core.pointee.bytes = UnsafeBufferPointer(start: nil, count: 0)
        core.pointee.containers.reset()
        core.pointee.current = 0
        core.pointee.currentDepth = 0
        if !core.pointee.path.isEmpty { core.pointee.path.removeAll(keepingCapacity: true) }
        if !core.pointee.hints.isEmpty { core.pointee.hints.removeAll(keepingCapacity: true) }
        cache.put(state)
    }

    deinit {
        core.pointee.containers.destroy()
        core.pointee.tokens.deallocate()
        core.deinitialize(count: 1)
        core.deallocate()
    }

    @usableFromInline var codingPath: [any CodingKey] { core.pointee.prefixPath(core.pointee.currentDepth) }

    @usableFromInline var userInfo: [CodingUserInfoKey: Any] { core.pointee.userInfo }

    @usableFromInline
    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        try _Decoding.keyedContainer(core, at: core.pointee.current, depth: core.pointee.currentDepth)
    }

    @usableFromInline
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        try _Decoding.unkeyedContainer(core, at: core.pointee.current, depth: core.pointee.currentDepth)
    }

    @usableFromInline
    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        _SingleValueDecoder(core: core, index: core.pointee.current, depth: core.pointee.currentDepth)
    }
}

/// Whether ``_smallASCIIString(_:)`` builds strings exactly as the standard library does: checked
/// once against `String(decoding:as:)` for every length, so a different string layout merely
/// disables the fast path.
let _smallASCIIStringsSupported: Bool = {
    #if _pointerBitWidth(_64) && _endian(little)
    let letters = Array("abcdefghijklmnopq".utf8)
    return letters.withUnsafeBufferPointer { all in
        for count in 0...15 {
            let slice = UnsafeBufferPointer(rebasing: all[0..<count])
            let expected = String(decoding: slice, as: UTF8.self)
            let built = _smallASCIIStringBits(slice)
            let same = withUnsafeBytes(of: expected) { a in
                withUnsafeBytes(of: built) { b in a.elementsEqual(b) }
            }
            let masked = _maskedLoad16(all.baseAddress!, count)
            guard same, masked == _load16(all.baseAddress!, count), _smallASCIIString(slice) == expected,
                  _smallASCIIString(slice).utf8.count == count else {
                return false
            }
        }
        return true
    }
    #else
    return false
    #endif
}()

/// The bits of a small ASCII `String` holding `bytes` (at most 15): the code units in order, then
/// the discriminator (immortal, small, ASCII: 0xE) and the count in the top byte.
@inline(__always)
func _smallASCIIStringBits(_ bytes: UnsafeBufferPointer<UInt8>) -> (UInt64, UInt64) {
    guard let base = bytes.baseAddress else { return (0, UInt64(0xE0) << 56) }
    var bits = _load16(base, bytes.count)
    bits.1 |= UInt64(0xE0 | bytes.count) << 56
    return bits
}

/// The first `count` (at most 16) bytes at `p` packed into two words, byte `k` at bits `8k…8k+7`
/// of the pair (zero-filled), reading only those bytes (with overlapping loads).
@inline(__always)
func _load16(_ p: UnsafePointer<UInt8>, _ count: Int) -> (UInt64, UInt64) {
    let raw = UnsafeRawPointer(p)
    if count >= 8 {
        let low = UInt64(littleEndian: raw.loadUnaligned(as: UInt64.self))
        if count == 8 { return (low, 0) }
        let tail = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: count &- 8, as: UInt64.self))
        return (low, tail &>> UInt64(truncatingIfNeeded: 8 &* (16 &- count)))
    }
    if count >= 4 {
        let head = UInt64(UInt32(littleEndian: raw.loadUnaligned(as: UInt32.self)))
        let tail = UInt64(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: count &- 4, as: UInt32.self)))
        return (head | tail &<< UInt64(truncatingIfNeeded: 8 &* (count &- 4)), 0)
    }
    if count == 0 { return (0, 0) }
    let middle = count &>> 1
    let word = UInt64(p[0]) | UInt64(p[middle]) &<< UInt64(truncatingIfNeeded: 8 &* middle)
        | UInt64(p[count &- 1]) &<< UInt64(truncatingIfNeeded: 8 &* (count &- 1))
    return (word, 0)
}

/// Like ``_load16(_:_:)``, but reads all 16 bytes at `p` (which must be readable) and masks off
/// those from `count` on.
@inline(__always)
func _maskedLoad16(_ p: UnsafePointer<UInt8>, _ count: Int) -> (UInt64, UInt64) {
    let raw = UnsafeRawPointer(p)
    let low = UInt64(littleEndian: raw.loadUnaligned(as: UInt64.self))
    let high = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
    // Smart shifts: by 64 or more they give 0, so the masks are all ones or zeros at the ends.
    let lowMask = ~(UInt64.max << (8 &* count))
    let highMask = ~(UInt64.max << (8 &* (count > 8 ? count &- 8 : 0)))
    return (low & lowMask, high & highMask)
}

/// A `String` of 0…15 ASCII bytes (no validation: the parser has checked them), built without
/// calling into the runtime. Only used when ``_smallASCIIStringsSupported``.
@inline(__always)
func _smallASCIIString(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
    unsafeBitCast(_smallASCIIStringBits(bytes), to: String.self)
}

/// The small ASCII `String` of the `count` (at most 15) bytes packed in `packed` (zero-filled),
/// as from ``_load16(_:_:)``. Only used when ``_smallASCIIStringsSupported``.
@inline(__always)
func _smallASCIIString(_ packed: (UInt64, UInt64), count: Int) -> String {
    unsafeBitCast((packed.0, packed.1 | UInt64(0xE0 | count) << 56), to: String.self)
}

/// Decodes the contents of a string token that contains escapes (already validated).
func _unescape(_ raw: UnsafeBufferPointer<UInt8>) -> String {
    String(unsafeUninitializedCapacity: raw.count) { out in
        var i = 0
        var o = 0
        let n = raw.count
        @inline(__always) func hex(_ at: Int) -> UInt32 {
            var value: UInt32 = 0
            for k in 0..<4 { value = value << 4 | (_hexValue(raw[at + k]) ?? 0) }
            return value
        }
        while i < n {
            let byte = raw[i]
            if byte != UInt8(ascii: "\\") {
                out[o] = byte
                o += 1
                i += 1
                continue
            }
            let escaped = raw[i + 1]
            i += 2
            switch escaped {
            case UInt8(ascii: "b"): out[o] = 0x08
            case UInt8(ascii: "f"): out[o] = 0x0C
            case UInt8(ascii: "n"): out[o] = 0x0A
            case UInt8(ascii: "r"): out[o] = 0x0D
            case UInt8(ascii: "t"): out[o] = 0x09
            case UInt8(ascii: "u"):
                var scalar = hex(i)
                i += 4
                if scalar >= 0xD800 && scalar <= 0xDBFF {
                    let low = hex(i + 2)
                    i += 6
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                }
                if scalar < 0x80 {
                    out[o] = UInt8(scalar)
                } else if scalar < 0x800 {
                    out[o] = UInt8(0xC0 | scalar >> 6)
                    out[o + 1] = UInt8(0x80 | scalar & 0x3F)
                    o += 1
                } else if scalar < 0x10000 {
                    out[o] = UInt8(0xE0 | scalar >> 12)
                    out[o + 1] = UInt8(0x80 | scalar >> 6 & 0x3F)
                    out[o + 2] = UInt8(0x80 | scalar & 0x3F)
                    o += 2
                } else {
                    out[o] = UInt8(0xF0 | scalar >> 18)
                    out[o + 1] = UInt8(0x80 | scalar >> 12 & 0x3F)
                    out[o + 2] = UInt8(0x80 | scalar >> 6 & 0x3F)
                    out[o + 3] = UInt8(0x80 | scalar & 0x3F)
                    o += 3
                }
            default: out[o] = escaped  // '"', '\\', '/'
            }
            o += 1
        }
        return o
    }
}

// MARK: - Containers

/// Per-container data of a keyed decoding container (see ``_ContainerCache``).
struct _KeyedDecoderRecord {
    var object: Int
    var end: Int
    var depth: Int
    /// Large objects with distinct plain keys use an in-order lookup hint.
    var inOrder: Bool
}

struct _KeyedDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    // Valid only during the `decode` call that created the container (like the input bytes).
    let core: UnsafeMutablePointer<_DecoderCore>
    let record: UnsafeMutablePointer<_KeyedDecoderRecord>

    var object: Int { record.pointee.object }
    var end: Int { record.pointee.end }
    var depth: Int { record.pointee.depth }
    var inOrder: Bool { record.pointee.inOrder }

    var codingPath: [any CodingKey] { core.pointee.prefixPath(depth) }

    var allKeys: [Key] {
        var keys: [Key] = []
        var seen = Set<String>()
        var i = object + 1
        while i < end {
            let name = core.pointee.makeString(core.pointee.tokens[i])
            if inOrder || seen.insert(name).inserted, let key = Key(stringValue: name) {
                keys.append(key)
            }
            i = Int(core.pointee.tokens[i + 1].next)
        }
        return keys
    }

    @inline(__always)
    func find(_ key: Key) -> Int? {
        core.pointee.find(key.stringValue, in: object, end: end, depth: depth, inOrder: inOrder)
    }

    func contains(_ key: Key) -> Bool { find(key) != nil }

    func keyNotFound(_ key: Key) -> DecodingError {
        let message = "No value associated with key \(key) (\"\(key.stringValue)\")."
        return .keyNotFound(key, core.pointee.context(core.pointee.prefixPath(depth), message, .keyNotFound, object))
    }

    @inline(__always)
    func value(_ key: Key) throws -> Int {
        guard let index = find(key) else { throw keyNotFound(key) }
        return index
    }

    /// The value's index, or `nil` when absent or `null` (for `decodeIfPresent`).
    @inline(__always)
    func presentValue(_ key: Key) -> Int? {
        guard let index = find(key), core.pointee.tokens[index].kind != .null else { return nil }
        return index
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        let index = try value(key)
        return core.pointee.tokens[index].kind == .null
    }

    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool {
        let index = try value(key)
        return try core.pointee.decodeBool(at: index, depth: depth, key: key)
    }

    func decode(_ type: String.Type, forKey key: Key) throws -> String {
        let index = try value(key)
        return try core.pointee.decodeString(at: index, depth: depth, key: key)
    }

    func decode(_ type: Double.Type, forKey key: Key) throws -> Double {
        let index = try value(key)
        return try core.pointee.decodeDouble(at: index, depth: depth, key: key)
    }

    func decode(_ type: Float.Type, forKey key: Key) throws -> Float {
        let index = try value(key)
        return try core.pointee.decodeFloat(at: index, depth: depth, key: key)
    }

    func decode(_ type: Int.Type, forKey key: Key) throws -> Int {
        let index = try value(key)
        return try core.pointee.decodeInt(at: index, depth: depth, key: key)
    }

    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 {
        let index = try value(key)
        return try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        let index = try value(key)
        return try _Decoding.decodeValue(core, type, at: index, depth: depth, key: key)
    }

    func decodeIfPresent(_ type: Bool.Type, forKey key: Key) throws -> Bool? {
        guard let index = presentValue(key) else { return nil }
        return try core.pointee.decodeBool(at: index, depth: depth, key: key)
    }

    func decodeIfPresent(_ type: String.Type, forKey key: Key) throws -> String? {
        guard let index = presentValue(key) else { return nil }
        return try core.pointee.decodeString(at: index, depth: depth, key: key)
    }

    func decodeIfPresent(_ type: Double.Type, forKey key: Key) throws -> Double? {
        guard let index = presentValue(key) else { return nil }
        return try core.pointee.decodeDouble(at: index, depth: depth, key: key)
    }

    func decodeIfPresent(_ type: Int.Type, forKey key: Key) throws -> Int? {
        guard let index = presentValue(key) else { return nil }
        return try core.pointee.decodeInt(at: index, depth: depth, key: key)
    }

    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        guard let index = presentValue(key) else { return nil }
        return try _Decoding.decodeValue(core, type, at: index, depth: depth, key: key)
    }

    func nestedContainer<NestedKey: CodingKey>(
        keyedBy type: NestedKey.Type, forKey key: Key
    ) throws -> KeyedDecodingContainer<NestedKey> {
        let index = try value(key)
        core.pointee.truncatePath(depth)
        core.pointee.path.append(key)
        return try _Decoding.keyedContainer(core, at: index, depth: depth + 1)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        let index = try value(key)
        core.pointee.truncatePath(depth)
        core.pointee.path.append(key)
        return try _Decoding.unkeyedContainer(core, at: index, depth: depth + 1)
    }

    func superDecoder() throws -> any Decoder {
        let index = core.pointee.find("super", in: object, end: end, depth: depth, inOrder: false) ?? core.pointee.missing
        return _SubDecoder(core: core, index: index, codingPath: core.pointee.errorPath(depth, _JSONKey.super))
    }

    func superDecoder(forKey key: Key) throws -> any Decoder {
        _SubDecoder(core: core, index: find(key) ?? core.pointee.missing, codingPath: core.pointee.errorPath(depth, key))
    }
}

struct _UnkeyedDecoder: UnkeyedDecodingContainer {
    // Valid only during the `decode` call that created the container (like the input bytes).
    let core: UnsafeMutablePointer<_DecoderCore>
    let depth: Int
    let end: Int
    let count: Int?
    /// Token index of the next element.
    var position: Int
    private(set) var currentIndex = 0

    init(core: UnsafeMutablePointer<_DecoderCore>, array: Int, depth: Int) {
        self.core = core
        self.depth = depth
        let token = core.pointee.tokens[array]
        self.end = Int(token.next)
        self.count = Int(token.length)
        self.position = array + 1
    }

    var codingPath: [any CodingKey] { core.pointee.prefixPath(depth) }

    var isAtEnd: Bool { position >= end }

    @inline(__always)
    func element<T>(_ type: T.Type) throws -> Int {
        guard position < end else {
            let path = core.pointee.errorPath(depth, _JSONKey(intValue: currentIndex))
            let message = "Unkeyed container is at end."
            throw DecodingError.valueNotFound(type, core.pointee.context(path, message, .valueNotFound, core.pointee.missing))
        }
        return position
    }

    @inline(__always)
    mutating func advance() {
        position = Int(core.pointee.tokens[position].next)
        currentIndex += 1
    }

    var key: _JSONKey { _JSONKey(intValue: currentIndex) }

    mutating func decodeNil() throws -> Bool {
        let index = try element(Any?.self)
        if core.pointee.tokens[index].kind == .null {
            advance()
            return true
        }
        return false
    }

    mutating func decode(_ type: Bool.Type) throws -> Bool {
        let index = try element(type)
        let result = try core.pointee.decodeBool(at: index, depth: depth, key: key)
        advance()
        return result
    }

    mutating func decode(_ type: String.Type) throws -> String {
        let index = try element(type)
        let result = try core.pointee.decodeString(at: index, depth: depth, key: key)
        advance()
        return result
    }

    mutating func decode(_ type: Double.Type) throws -> Double {
        let index = try element(type)
        let result = try core.pointee.decodeDouble(at: index, depth: depth, key: key)
        advance()
        return result
    }

    mutating func decode(_ type: Float.Type) throws -> Float {
        let index = try element(type)
        let result = try core.pointee.decodeFloat(at: index, depth: depth, key: key)
        advance()
        return result
    }

    mutating func decode(_ type: Int.Type) throws -> Int { try integer(type) }
    mutating func decode(_ type: Int8.Type) throws -> Int8 { try integer(type) }
    mutating func decode(_ type: Int16.Type) throws -> Int16 { try integer(type) }
    mutating func decode(_ type: Int32.Type) throws -> Int32 { try integer(type) }
    mutating func decode(_ type: Int64.Type) throws -> Int64 { try integer(type) }
    mutating func decode(_ type: UInt.Type) throws -> UInt { try integer(type) }
    mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try integer(type) }
    mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try integer(type) }
    mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try integer(type) }
    mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try integer(type) }

    @inline(__always)
    mutating func integer<I: FixedWidthInteger>(_ type: I.Type) throws -> I {
        let index = try element(type)
        let result = try core.pointee.decodeInteger(type, at: index, depth: depth, key: key)
        advance()
        return result
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let index = try element(type)
        let result = try _Decoding.decodeValue(core, type, at: index, depth: depth, key: key)
        advance()
        return result
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy type: NestedKey.Type
    ) throws -> KeyedDecodingContainer<NestedKey> {
        let index = try element(KeyedDecodingContainer<NestedKey>.self)
        core.pointee.truncatePath(depth)
        core.pointee.path.append(key)
        let container: KeyedDecodingContainer<NestedKey> = try _Decoding.keyedContainer(core, at: index, depth: depth + 1)
        advance()
        return container
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let index = try element((any UnkeyedDecodingContainer).self)
        core.pointee.truncatePath(depth)
        core.pointee.path.append(key)
        let container = try _Decoding.unkeyedContainer(core, at: index, depth: depth + 1)
        advance()
        return container
    }

    mutating func superDecoder() throws -> any Decoder {
        let index = try element((any Decoder).self)
        let decoder = _SubDecoder(core: core, index: index, codingPath: core.pointee.errorPath(depth, key))
        advance()
        return decoder
    }
}

struct _SingleValueDecoder: SingleValueDecodingContainer {
    // Valid only during the `decode` call that created the container (like the input bytes).
    let core: UnsafeMutablePointer<_DecoderCore>
    let index: Int
    let depth: Int

    var codingPath: [any CodingKey] { core.pointee.prefixPath(depth) }

    func decodeNil() -> Bool { core.pointee.tokens[index].kind == .null }

    func decode(_ type: Bool.Type) throws -> Bool {
        try core.pointee.decodeBool(at: index, depth: depth, key: _NoKey())
    }

    func decode(_ type: String.Type) throws -> String {
        try core.pointee.decodeString(at: index, depth: depth, key: _NoKey())
    }

    func decode(_ type: Double.Type) throws -> Double {
        try core.pointee.decodeDouble(at: index, depth: depth, key: _NoKey())
    }

    func decode(_ type: Float.Type) throws -> Float {
        try core.pointee.decodeFloat(at: index, depth: depth, key: _NoKey())
    }

    func decode(_ type: Int.Type) throws -> Int { try integer(type) }
    func decode(_ type: Int8.Type) throws -> Int8 { try integer(type) }
    func decode(_ type: Int16.Type) throws -> Int16 { try integer(type) }
    func decode(_ type: Int32.Type) throws -> Int32 { try integer(type) }
    func decode(_ type: Int64.Type) throws -> Int64 { try integer(type) }
    func decode(_ type: UInt.Type) throws -> UInt { try integer(type) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try integer(type) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try integer(type) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try integer(type) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try integer(type) }

    func integer<I: FixedWidthInteger>(_ type: I.Type) throws -> I {
        try core.pointee.decodeInteger(type, at: index, depth: depth, key: _NoKey())
    }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try _Decoding.decodeValue(core, type, at: index, depth: depth, key: _NoKey())
    }
}

/// The decoder returned by `superDecoder()`.
final class _SubDecoder: Decoder {
    let core: UnsafeMutablePointer<_DecoderCore>
    let index: Int
    let codingPath: [any CodingKey]
    /// Keeps the state alive while this decoder exists.
    let owner: _DecoderState?

    init(core: UnsafeMutablePointer<_DecoderCore>, index: Int, codingPath: [any CodingKey]) {
        self.core = core
        self.index = index
        self.codingPath = codingPath
        self.owner = core.pointee.decoder?.takeUnretainedValue()
    }

    var userInfo: [CodingUserInfoKey: Any] { core.pointee.userInfo }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        core.pointee.path = codingPath
        return try _Decoding.keyedContainer(core, at: index, depth: codingPath.count)
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        core.pointee.path = codingPath
        return try _Decoding.unkeyedContainer(core, at: index, depth: codingPath.count)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        core.pointee.path = codingPath
        return _SingleValueDecoder(core: core, index: index, depth: codingPath.count)
    }
}
