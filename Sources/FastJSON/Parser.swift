/// The kind of a JSON value on the tape.
@usableFromInline
enum _Kind: UInt8 {
    case null, `false`, `true`, number, string, array, object

    var name: String {
        switch self {
        case .null: "null"
        case .false, .true: "bool"
        case .number: "number"
        case .string: "a string"
        case .array: "an array"
        case .object: "a dictionary"
        }
    }
}

/// One value of a parsed document. Objects are followed by their keys and values in order
/// (key, value, key, value, …); arrays by their elements. `next` skips a whole subtree.
@usableFromInline
struct _Token {
    @usableFromInline var kind: _Kind
    /// Strings: `hasEscapes` | `nonASCII`. Numbers: `notInteger` | `negative` | `hasExponent`, and
    /// for numbers with a fraction the count of integer digits (1…31, else 0) in the top five bits
    /// (see ``integerDigits(_:)``).
    @usableFromInline var flags: UInt8
    /// Byte offset of the value (strings: of the first byte after the opening quote).
    @usableFromInline var start: UInt32
    /// Strings: raw byte length between the quotes. Numbers: byte length.
    /// Arrays: element count. Objects: number of members.
    @usableFromInline var length: UInt32
    /// Index of the token that follows this value and everything nested in it.
    @usableFromInline var next: UInt32

    static let hasEscapes: UInt8 = 1
    static let nonASCII: UInt8 = 2
    static let notInteger: UInt8 = 1
    static let negative: UInt8 = 2
    static let hasExponent: UInt8 = 4
    static let integerDigitsShift: UInt8 = 3

    /// Numbers with a fraction: the count of digits before the '.', or 0 if unknown (more than 31).
    @inline(__always)
    static func integerDigits(_ flags: UInt8) -> Int { Int(flags &>> integerDigitsShift) }
}

/// The parsed tokens, in a manually managed buffer (reading a class's array property costs a
/// retain/release pair per access; this is a plain pointer). The owner calls ``deallocate()``.
@usableFromInline
struct _Tape {
    var base: UnsafeMutablePointer<_Token>
    private(set) var count = 0
    private var capacity: Int

    init(capacity: Int) {
        self.capacity = max(capacity, 8)
        base = .allocate(capacity: self.capacity)
    }

    @inline(__always)
    mutating func append(_ token: _Token) {
        if _slowPath(count == capacity) { grow() }
        (base + count).initialize(to: token)
        count &+= 1
    }

    /// Appends a scalar token (its `next` is the following token). Offsets fit in 32 bits: the
    /// parser rejects inputs of 4 GiB or more up front.
    @inline(__always)
    mutating func append(_ kind: _Kind, _ flags: UInt8, start: Int, length: Int) {
        append(_Token(kind: kind, flags: flags, start: UInt32(truncatingIfNeeded: start),
                      length: UInt32(truncatingIfNeeded: length), next: UInt32(truncatingIfNeeded: count &+ 1)))
    }

    private mutating func grow() {
        let bigger = UnsafeMutablePointer<_Token>.allocate(capacity: capacity * 2)
        bigger.moveInitialize(from: base, count: count)
        base.deallocate()
        base = bigger
        capacity *= 2
    }

    @inline(__always)
    subscript(index: Int) -> _Token {
        get {
            assert(index >= 0 && index < count, "FastJSON internal error: token index out of range")
            return base[index]
        }
        nonmutating set { base[index] = newValue }
    }

    var capacityInTokens: Int { capacity }

    mutating func removeAll() { count = 0 }

    func deallocate() { base.deallocate() }
}

/// Why parsing stopped; turned into a ``FastJSONError`` (with a message) only when it happens.
enum _ParseProblem: Int {
    case emptyInput = 1, expectedValue, endInValue, trailingData, endInContainer, expectedCommaOrBrace,
         expectedCommaOrBracket, endBeforeKey, expectedKey, endBeforeColon, expectedColon, tooDeep,
         endInLiteral, badLiteral, unterminatedString, badEscape, unpairedHighSurrogate, unpairedLowSurrogate,
         endInEscape, badHexEscape, controlCharacter, badUTF8, truncatedUTF8, endInNumber, expectedDigit,
         expectedFractionDigit, expectedExponentDigit, inputTooLarge
}

/// Encodes a failure as a negative scanner result: offset and problem packed into one `Int`.
@inline(__always)
func _failure(_ problem: _ParseProblem, at offset: Int) -> Int {
    -((offset << 8) | problem.rawValue) - 1
}

func _syntaxError(_ message: String, at offset: Int, _ code: FastJSONError.Code = .syntax) -> FastJSONError {
    FastJSONError(code: code, offset: offset, codingPath: "", message: message)
}

/// Builds the error for a negative scanner result.
func _parseError(_ result: Int, _ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) -> FastJSONError {
    let packed = -(result + 1)
    let offset = packed >> 8
    let problem = _ParseProblem(rawValue: packed & 0xFF) ?? .expectedValue
    let found = offset < bytes.count ? "'\(_printable(bytes[offset]))'" : "end of input"
    switch problem {
    case .emptyInput: return _syntaxError("empty input", at: offset, .unexpectedEnd)
    case .expectedValue: return _syntaxError("unexpected character \(found), expected a value", at: offset)
    case .endInValue: return _syntaxError("unexpected end of input, expected a value", at: offset, .unexpectedEnd)
    case .trailingData: return _syntaxError("unexpected character \(found) after the top-level value", at: offset)
    case .endInContainer:
        return _syntaxError("unexpected end of input inside an array or object", at: offset, .unexpectedEnd)
    case .expectedCommaOrBrace:
        return _syntaxError("unexpected character \(found), expected ',' or '}' after an object value", at: offset)
    case .expectedCommaOrBracket:
        return _syntaxError("unexpected character \(found), expected ',' or ']' after an array element", at: offset)
    case .endBeforeKey: return _syntaxError("unexpected end of input, expected an object key", at: offset, .unexpectedEnd)
    case .expectedKey: return _syntaxError("unexpected character \(found), expected a string key", at: offset)
    case .endBeforeColon: return _syntaxError("unexpected end of input, expected ':'", at: offset, .unexpectedEnd)
    case .expectedColon: return _syntaxError("unexpected character \(found), expected ':' after an object key", at: offset)
    case .tooDeep:
        return _syntaxError("arrays and objects are nested deeper than the limit of \(maxDepth)", at: offset, .tooDeep)
    case .endInLiteral: return _syntaxError("unexpected end of input in a literal", at: offset, .unexpectedEnd)
    case .badLiteral: return _syntaxError("invalid literal, expected true, false or null", at: offset)
    case .unterminatedString: return _syntaxError("unterminated string", at: offset, .unexpectedEnd)
    case .badEscape: return _syntaxError("invalid escape sequence at \(found)", at: offset, .invalidEscape)
    case .unpairedHighSurrogate: return _syntaxError("unpaired UTF-16 high surrogate escape", at: offset, .invalidEscape)
    case .unpairedLowSurrogate: return _syntaxError("unpaired UTF-16 low surrogate escape", at: offset, .invalidEscape)
    case .endInEscape: return _syntaxError("unterminated escape sequence", at: offset, .unexpectedEnd)
    case .badHexEscape: return _syntaxError("invalid \\u escape: expected four hex digits", at: offset, .invalidEscape)
    case .controlCharacter: return _syntaxError("unescaped control character \(found) in string", at: offset)
    case .badUTF8: return _syntaxError("invalid UTF-8 in string", at: offset, .invalidUTF8)
    case .truncatedUTF8: return _syntaxError("truncated UTF-8 sequence in string", at: offset, .invalidUTF8)
    case .endInNumber: return _syntaxError("unexpected end of input in a number", at: offset, .unexpectedEnd)
    case .expectedDigit: return _syntaxError("invalid number: expected a digit", at: offset)
    case .expectedFractionDigit: return _syntaxError("invalid number: expected a digit after '.'", at: offset)
    case .expectedExponentDigit: return _syntaxError("invalid number: expected a digit in the exponent", at: offset)
    case .inputTooLarge: return _syntaxError("input larger than 4 GiB is not supported", at: 0, .inputTooLarge)
    }
}

private let _noParent = UInt32.max

/// Validates a complete UTF-8 JSON text and fills `tokens` with its tape. The document's root is
/// token 0; one extra `null` token is appended after it (index `count - 1`) to stand for missing
/// values.
///
/// Iterative (no recursion), so nesting depth is bounded by `maxDepth`, not by the stack. The chain
/// of open containers is kept in the tape itself: an open container's `next` holds its parent.
func _parse(_ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int, into tokens: inout _Tape) throws {
    let result = _parseTape(bytes, maxDepth: maxDepth, into: &tokens)
    if result < 0 { throw _parseError(result, bytes, maxDepth: maxDepth) }
}

/// The parser proper: returns 0, or a negative failure from ``_failure(_:at:)``. Nothing here throws
/// or allocates (except growing the tape), which keeps the loop tight.
private func _parseTape(_ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int, into tape: inout _Tape) -> Int {
    // A local copy that is never passed `inout` can live in registers; stores through the tape's
    // pointer could otherwise alias the caller's copy and force reloads after every token.
    var tokens = tape
    defer { tape = tokens }
    let n = bytes.count
    guard n < Int(UInt32.max) else { return _failure(.inputTooLarge, at: 0) }
    tokens.removeAll()
    guard let p = bytes.baseAddress else { return _failure(.emptyInput, at: 0) }
    var top = _noParent
    var topIsObject = false
    var depth = 0
    var i = _skipWhitespace(p, n, 0)

    valueLoop: while true {
        guard i < n else { return _failure(tokens.count == 0 ? .emptyInput : .endInValue, at: i) }
        let byte = p[i]
        if byte == UInt8(ascii: "\"") {
            var flags: UInt8 = 0
            let end = _scanString(p, n, i &+ 1, &flags)
            if end < 0 { return end }
            tokens.append(.string, flags, start: i &+ 1, length: end &- i &- 1)
            i = end &+ 1
        } else if byte &- UInt8(ascii: "0") < 10 || byte == UInt8(ascii: "-") {
            var flags: UInt8 = 0
            let end = _scanNumber(p, n, i, &flags)
            if end < 0 { return end }
            tokens.append(.number, flags, start: i, length: end &- i)
            i = end
        } else if byte == UInt8(ascii: "{") || byte == UInt8(ascii: "[") {
            let isObject = byte == UInt8(ascii: "{")
            guard depth < maxDepth else { return _failure(.tooDeep, at: i) }
            let index = tokens.count
            tokens.append(_Token(kind: isObject ? .object : .array, flags: 0, start: UInt32(truncatingIfNeeded: i),
                                 length: 0, next: 0))
            i = _skipWhitespace(p, n, i &+ 1)
            if i < n, p[i] == (isObject ? UInt8(ascii: "}") : UInt8(ascii: "]")) {
                tokens[index].next = UInt32(truncatingIfNeeded: tokens.count)
                i &+= 1
            } else {
                tokens[index].next = top
                tokens[index].length = 1
                top = UInt32(truncatingIfNeeded: index)
                topIsObject = isObject
                depth &+= 1
                if isObject {
                    var flags: UInt8 = 0
                    let keyEnd = _scanKey(p, n, i, &flags)
                    if keyEnd < 0 { return keyEnd }
                    tokens.append(.string, flags, start: i &+ 1, length: keyEnd &- i &- 1)
                    i = _skipColon(p, n, keyEnd &+ 1)
                    if i < 0 { return i }
                }
                continue valueLoop
            }
        } else {
            let (kind, literal, length): (_Kind, UInt64, Int)
            switch byte {
            case UInt8(ascii: "t"): (kind, literal, length) = (.true, 0x6575_7274, 4)  // "true"
            case UInt8(ascii: "f"): (kind, literal, length) = (.false, 0x65_736C_6166, 5)  // "false"
            case UInt8(ascii: "n"): (kind, literal, length) = (.null, 0x6C6C_756E, 4)  // "null"
            default: return _failure(.expectedValue, at: i)
            }
            guard n &- i >= length else { return _failure(.endInLiteral, at: i) }
            var word: UInt64 = 0
            for k in 0..<length { word |= UInt64(p[i &+ k]) << (8 &* UInt64(k)) }
            guard word == literal else { return _failure(.badLiteral, at: i) }
            tokens.append(kind, 0, start: i, length: length)
            i &+= length
        }

        // After a complete value: close containers, or move on to the next element.
        while true {
            i = _skipWhitespace(p, n, i)
            guard top != _noParent else {
                guard i == n else { return _failure(.trailingData, at: i) }
                tokens.append(.null, 0, start: n, length: 0)
                return 0
            }
            guard i < n else { return _failure(.endInContainer, at: i) }
            let open = Int(top)
            let byte = p[i]
            if byte == UInt8(ascii: ",") {
                tokens[open].length &+= 1
                i = _skipWhitespace(p, n, i &+ 1)
                if topIsObject {
                    var flags: UInt8 = 0
                    let keyEnd = _scanKey(p, n, i, &flags)
                    if keyEnd < 0 { return keyEnd }
                    tokens.append(.string, flags, start: i &+ 1, length: keyEnd &- i &- 1)
                    i = _skipColon(p, n, keyEnd &+ 1)
                    if i < 0 { return i }
                }
                continue valueLoop
            }
            if byte == (topIsObject ? UInt8(ascii: "}") : UInt8(ascii: "]")) {
                top = tokens[open].next
                tokens[open].next = UInt32(truncatingIfNeeded: tokens.count)
                depth &-= 1
                if top != _noParent { topIsObject = tokens[Int(top)].kind == .object }
                i &+= 1
                continue
            }
            return _failure(topIsObject ? .expectedCommaOrBrace : .expectedCommaOrBracket, at: i)
        }
    }
}

func _printable(_ byte: UInt8) -> String {
    byte >= 0x20 && byte < 0x7F ? String(UnicodeScalar(byte)) : "\\u{\(String(byte, radix: 16))}"
}

@inline(__always)
func _skipWhitespace(_ p: UnsafePointer<UInt8>, _ n: Int, _ start: Int) -> Int {
    // Compact JSON: the next byte is usually not whitespace.
    if _fastPath(start < n && p[start] > 0x20) { return start }
    var i = start
    while i < n {
        switch p[i] {
        case 0x20, 0x0A, 0x0D, 0x09: i &+= 1
        default: return i
        }
    }
    return i
}

/// Scans a key string starting at `i` (which must be its opening quote); returns the index of the
/// closing quote, or a failure.
@inline(__always)
func _scanKey(_ p: UnsafePointer<UInt8>, _ n: Int, _ i: Int, _ flags: inout UInt8) -> Int {
    guard i < n else { return _failure(.endBeforeKey, at: i) }
    guard p[i] == UInt8(ascii: "\"") else { return _failure(.expectedKey, at: i) }
    return _scanString(p, n, i &+ 1, &flags)
}

/// Skips `:` (with whitespace around it) at `i`; returns the index of the value, or a failure.
@inline(__always)
func _skipColon(_ p: UnsafePointer<UInt8>, _ n: Int, _ i: Int) -> Int {
    var colon = i
    if !(colon < n && p[colon] == UInt8(ascii: ":")) {
        colon = _skipWhitespace(p, n, colon)
        guard colon < n else { return _failure(.endBeforeColon, at: colon) }
        guard p[colon] == UInt8(ascii: ":") else { return _failure(.expectedColon, at: colon) }
    }
    return _skipWhitespace(p, n, colon &+ 1)
}

/// Scans string contents starting after the opening quote; returns the index of the closing quote
/// (or a failure) and sets `flags` (``_Token/hasEscapes``, ``_Token/nonASCII``).
@inline(__always)
func _scanString(_ p: UnsafePointer<UInt8>, _ n: Int, _ start: Int, _ flags: inout UInt8) -> Int {
    var i = start
    while true {
        // Plain ASCII run, eight bytes at a time where possible.
        while i &+ 8 <= n {
            let word = UInt64(littleEndian: UnsafeRawPointer(p + i).loadUnaligned(as: UInt64.self))
            // Bytes that are '"' (0x22), '\\' (0x5C), < 0x20 or >= 0x80 stop the run. Borrows
            // can only flag bytes after a true hit, so the lowest flagged byte is the first stop.
            let quote = word ^ 0x2222_2222_2222_2222
            let backslash = word ^ 0x5C5C_5C5C_5C5C_5C5C
            let low: UInt64 = 0x0101_0101_0101_0101
            let high: UInt64 = 0x8080_8080_8080_8080
            let special = (((quote &- low) & ~quote) | ((backslash &- low) & ~backslash) | (word &- low &* 0x20)
                | word) & high
            if special != 0 {
                i &+= special.trailingZeroBitCount &>> 3
                break
            }
            i &+= 8
        }
        guard i < n else { return _failure(.unterminatedString, at: n) }
        let byte = p[i]
        if byte == UInt8(ascii: "\"") { return i }
        if byte == UInt8(ascii: "\\") {
            flags |= _Token.hasEscapes
            i = _scanEscape(p, n, i)
            if i < 0 { return i }
        } else if byte < 0x20 {
            return _failure(.controlCharacter, at: i)
        } else if byte >= 0x80 {
            flags |= _Token.nonASCII
            i = _validateUTF8Sequence(p, n, i)
            if i < 0 { return i }
        } else {
            i &+= 1
        }
    }
}

/// Validates the escape sequence at `i` (the backslash); returns the index after it.
func _scanEscape(_ p: UnsafePointer<UInt8>, _ n: Int, _ i: Int) -> Int {
    guard i &+ 1 < n else { return _failure(.endInEscape, at: i) }
    switch p[i &+ 1] {
    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
         UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
        return i &+ 2
    case UInt8(ascii: "u"):
        let unit = _hex4(p, n, i &+ 2)
        if unit < 0 { return unit == -1 ? _failure(.endInEscape, at: i) : _failure(.badHexEscape, at: i) }
        if unit >= 0xD800 && unit <= 0xDBFF {
            let j = i &+ 6
            guard j &+ 1 < n, p[j] == UInt8(ascii: "\\"), p[j &+ 1] == UInt8(ascii: "u") else {
                return _failure(.unpairedHighSurrogate, at: i)
            }
            let low = _hex4(p, n, j &+ 2)
            guard low >= 0xDC00 && low <= 0xDFFF else { return _failure(.unpairedHighSurrogate, at: i) }
            return j &+ 6
        }
        if unit >= 0xDC00 && unit <= 0xDFFF { return _failure(.unpairedLowSurrogate, at: i) }
        return i &+ 6
    default:
        return _failure(.badEscape, at: i)
    }
}

@inline(__always)
func _hexValue(_ byte: UInt8) -> UInt32? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt32(byte &- 48)
    case UInt8(ascii: "a")...UInt8(ascii: "f"): UInt32(byte &- 87)
    case UInt8(ascii: "A")...UInt8(ascii: "F"): UInt32(byte &- 55)
    default: nil
    }
}

/// Four hex digits at `i` as a value, -1 if the input ends first, -2 if one isn't a hex digit.
func _hex4(_ p: UnsafePointer<UInt8>, _ n: Int, _ i: Int) -> Int {
    guard i &+ 4 <= n else { return -1 }
    var value: UInt32 = 0
    for k in 0..<4 {
        guard let digit = _hexValue(p[i &+ k]) else { return -2 }
        value = value << 4 | digit
    }
    return Int(value)
}

/// Validates one multi-byte UTF-8 sequence at `i`; returns the index after it.
func _validateUTF8Sequence(_ p: UnsafePointer<UInt8>, _ n: Int, _ i: Int) -> Int {
    let lead = p[i]
    let length: Int
    var lower: UInt8 = 0x80
    var upper: UInt8 = 0xBF
    switch lead {
    case 0xC2...0xDF: length = 2
    case 0xE0: length = 3; lower = 0xA0
    case 0xE1...0xEC, 0xEE...0xEF: length = 3
    case 0xED: length = 3; upper = 0x9F
    case 0xF0: length = 4; lower = 0x90
    case 0xF1...0xF3: length = 4
    case 0xF4: length = 4; upper = 0x8F
    default: return _failure(.badUTF8, at: i)
    }
    guard i &+ length <= n else { return _failure(.truncatedUTF8, at: i) }
    let second = p[i &+ 1]
    guard second >= lower && second <= upper else { return _failure(.badUTF8, at: i) }
    var k = 2
    while k < length {
        guard p[i &+ k] & 0xC0 == 0x80 else { return _failure(.badUTF8, at: i) }
        k &+= 1
    }
    return i &+ length
}

/// The index of the first non-digit at or after `start` (or `n`): eight bytes at a time where the
/// input allows, so a short run costs one step instead of a loop with a mispredicted exit.
@inline(__always)
func _skipDigits(_ p: UnsafePointer<UInt8>, _ n: Int, _ start: Int) -> Int {
    var i = start
    while i &+ 8 <= n {
        let word = UInt64(littleEndian: UnsafeRawPointer(p + i).loadUnaligned(as: UInt64.self))
        // A byte is a digit iff neither byte + 0x46 nor byte - 0x30 sets its top bit. Carries and
        // borrows only come from non-digit bytes, so they can't hide the lowest non-digit.
        let nonDigits = ((word &+ 0x4646_4646_4646_4646) | (word &- 0x3030_3030_3030_3030)) & 0x8080_8080_8080_8080
        if nonDigits != 0 { return i &+ nonDigits.trailingZeroBitCount &>> 3 }
        i &+= 8
    }
    while i < n && p[i] &- UInt8(ascii: "0") < 10 { i &+= 1 }
    return i
}

/// Scans a number per RFC 8259; returns the index after it (or a failure) and sets `flags`
/// (``_Token/negative``, ``_Token/notInteger``).
@inline(__always)
func _scanNumber(_ p: UnsafePointer<UInt8>, _ n: Int, _ start: Int, _ flags: inout UInt8) -> Int {
    var i = start
    if p[i] == UInt8(ascii: "-") {
        flags |= _Token.negative
        i &+= 1
        guard i < n else { return _failure(.endInNumber, at: i) }
    }
    let first = p[i]
    if first == UInt8(ascii: "0") {
        i &+= 1
    } else if first &- UInt8(ascii: "1") < 9 {
        i = _skipDigits(p, n, i &+ 1)
    } else {
        return _failure(.expectedDigit, at: i)
    }
    guard i < n else { return i }
    var byte = p[i]
    if byte == UInt8(ascii: ".") {
        flags |= _Token.notInteger
        let integerDigits = i &- start &- Int(flags & _Token.negative) &>> 1
        if integerDigits < 32 { flags |= UInt8(truncatingIfNeeded: integerDigits) &<< _Token.integerDigitsShift }
        i &+= 1
        guard i < n && p[i] &- UInt8(ascii: "0") < 10 else { return _failure(.expectedFractionDigit, at: i) }
        i = _skipDigits(p, n, i &+ 1)
        guard i < n else { return i }
        byte = p[i]
    }
    if byte | 0x20 == UInt8(ascii: "e") {
        flags |= _Token.notInteger | _Token.hasExponent
        i &+= 1
        if i < n && (p[i] == UInt8(ascii: "+") || p[i] == UInt8(ascii: "-")) { i &+= 1 }
        guard i < n && p[i] &- UInt8(ascii: "0") < 10 else { return _failure(.expectedExponentDigit, at: i) }
        repeat { i &+= 1 } while i < n && p[i] &- UInt8(ascii: "0") < 10
    }
    return i
}
