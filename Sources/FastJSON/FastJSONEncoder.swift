#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Encodes `Encodable` values as compact UTF-8 JSON, about ten times faster than Foundation's
/// `JSONEncoder`.
///
/// The encoder streams: each value is appended straight to a byte buffer as the `encode(to:)`
/// methods run; no intermediate tree is built. The finished bytes are copied once into the result
/// (or appended to the caller's buffer). The output is what `JSONEncoder` produces with its
/// default settings, except that
/// - object keys appear in the order the `encode` calls were made (declaration order for
///   synthesized conformances) — Foundation's order is unspecified;
/// - `/` is not escaped unless ``escapesForwardSlashes`` is `true`.
///
/// Defaults match `JSONEncoder`'s: `Date` as seconds since 2001-01-01 (a number), `Data` as a
/// Base64 string, `URL` as its absolute string, `Decimal` as a number, `Dictionary` with `String` or
/// `Int` keys as an object and with other keys as a flat `[key, value, …]` array, NaN and infinity
/// rejected with `EncodingError.invalidValue`.
///
/// ```swift
/// let bytes = try FastJSONEncoder().encode(message)      // [UInt8]
/// try FastJSONEncoder().encode(message, into: &frame)    // appends to a reusable buffer
/// ```
public struct FastJSONEncoder: Sendable {
    /// Whether `/` is written as `\/`, as `JSONEncoder` does by default. Default `false`; both
    /// spellings are valid JSON and decode to the same string.
    public var escapesForwardSlashes: Bool = false

    /// Values handed to the `Encodable` implementations through `Encoder.userInfo`.
    public var userInfo: [CodingUserInfoKey: any Sendable] = [:]

    /// Creates an encoder with the default settings.
    public init() {}

    /// Encodes `value` and returns the JSON bytes.
    ///
    /// - Throws: `EncodingError.invalidValue` for non-finite floating-point values, for a
    ///   top-level value that encodes nothing, and for container usage a streaming encoder cannot
    ///   support; the context's `underlyingError` is a ``FastJSONError``.
    @inlinable
    public func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        try _encode(value) { Array($0) }
    }

    /// Encodes `value` and appends the JSON bytes to `buffer`.
    ///
    /// Reusing one buffer across calls (for example `removeAll(keepingCapacity: true)` between
    /// messages) avoids allocating. If encoding throws, `buffer` is restored to its previous length.
    @inlinable
    public func encode<T: Encodable>(_ value: T, into buffer: inout [UInt8]) throws {
        try _encode(value) { buffer.append(contentsOf: $0) }
    }

    /// Encodes into the encoder's scratch buffer and hands the finished bytes to `body`.
    @usableFromInline
    func _encode<T: Encodable, R>(_ value: T, _ body: (UnsafeBufferPointer<UInt8>) throws -> R) throws -> R {
        var state = _EncoderState.make(escapeSlashes: escapesForwardSlashes, userInfo: userInfo)
        defer { _EncoderState.recycle(&state) }
        try _Encoding.encodeTopLevel(state.core, value)
        return try body(state.core.pointee.out.bytes)
    }
}

// MARK: - Output buffer

/// A growable byte buffer over manually managed memory: appends cost a bounds check and a store
/// (no uniqueness check, no retain). The owner calls ``deallocate()``.
@usableFromInline
struct _ByteBuffer {
    private(set) var base: UnsafeMutablePointer<UInt8>
    private(set) var count = 0
    private var capacity: Int

    init(capacity: Int) {
        self.capacity = capacity
        base = .allocate(capacity: capacity)
    }

    var bytes: UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(start: base, count: count) }

    @inline(__always)
    mutating func reserve(_ extra: Int) {
        if _slowPath(count &+ extra > capacity) { grow(count + extra) }
    }

    private mutating func grow(_ minimum: Int) {
        let newCapacity = max(capacity * 2, minimum)
        let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: newCapacity)
        bigger.update(from: base, count: count)
        base.deallocate()
        base = bigger
        capacity = newCapacity
    }

    @inline(__always)
    mutating func append(_ byte: UInt8) {
        reserve(1)
        base[count] = byte
        count &+= 1
    }

    @inline(__always)
    mutating func append(_ a: UInt8, _ b: UInt8) {
        reserve(2)
        base[count] = a
        base[count &+ 1] = b
        count &+= 2
    }

    @inline(__always)
    mutating func append(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard let source = bytes.baseAddress else { return }
        reserve(bytes.count)
        (base + count).update(from: source, count: bytes.count)
        count &+= bytes.count
    }

    @inline(__always)
    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        append(bytes.assumingMemoryBound(to: UInt8.self))
    }

    @inline(__always)
    mutating func append(_ literal: StaticString) {
        append(UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }

    @inline(__always)
    mutating func removeLast(_ n: Int) { count -= n }

    mutating func removeAll() { count = 0 }

    var capacityInBytes: Int { capacity }

    @inline(__always)
    subscript(index: Int) -> UInt8 { base[index] }

    func deallocate() { base.deallocate() }
}

// MARK: - State

/// One open container (or value slot) of the streaming encoder.
@usableFromInline
struct _EncoderFrame {
    enum Kind: UInt8 { case object, array, slot }
    var kind: Kind
    /// Elements written so far (a slot: 1 once its value has started).
    var count: Int
    /// Distinguishes this frame from a later one at the same index.
    var id: UInt32
}

/// The encoder's mutable state. It lives behind an `UnsafeMutablePointer` owned by
/// ``_EncoderState``, so containers reach it without retain/release and without the dynamic
/// exclusivity checks a class's stored properties would need.
///
/// Output is written eagerly. Open containers form a stack of frames; writing through a container
/// first closes every frame opened above it (which is how `}` and `]` get written: Codable has no
/// "container finished" callback).
///
/// Methods here never call user code (`encode(to:)`), so no access to the state is open while user
/// code runs; re-entrant operations live in ``_Encoding`` and access the state through the pointer.
@usableFromInline
struct _EncoderCore {
    var out = _ByteBuffer(capacity: 256)
    var frames: [_EncoderFrame] = []
    var nextID: UInt32 = 0
    /// The value slot the `Encoder` methods act on, and its coding-path depth.
    var currentSlot = 0
    var currentSlotID: UInt32 = 0
    var currentDepth = 0
    /// Keys of the value being encoded; containers remember their depth into it.
    var path: [any CodingKey] = []
    /// An error from a non-throwing API (`container(keyedBy:)` and friends), thrown at the end.
    var deferredError: (any Error)?
    var escapeSlashes: Bool
    var sendableUserInfo: [CodingUserInfoKey: any Sendable]
    /// The `Encoder` handed to `encode(to:)`; it owns this state.
    unowned(unsafe) var encoder: _EncoderState?
    var containers = _ContainerCache<_KeyedEncoderRecord>()

    init(escapeSlashes: Bool, userInfo: [CodingUserInfoKey: any Sendable]) {
        self.escapeSlashes = escapeSlashes
        self.sendableUserInfo = userInfo
        frames.reserveCapacity(8)
    }

    var userInfo: [CodingUserInfoKey: Any] {
        var result: [CodingUserInfoKey: Any] = [:]
        for (key, value) in sendableUserInfo { result[key] = value }
        return result
    }

    func prefixPath(_ depth: Int) -> [any CodingKey] {
        depth >= path.count ? path : Array(path[0..<depth])
    }

    @inline(__always)
    mutating func truncatePath(_ depth: Int) {
        if path.count > depth { path.removeLast(path.count - depth) }
    }

    // MARK: Frames

    @inline(__always)
    mutating func push(_ kind: _EncoderFrame.Kind) -> (Int, UInt32) {
        nextID &+= 1
        frames.append(_EncoderFrame(kind: kind, count: 0, id: nextID))
        return (frames.count - 1, nextID)
    }

    /// Closes (writes the closing bracket of) every frame above `index`.
    mutating func closeFrames(above index: Int) {
        while frames.count - 1 > index {
            let frame = frames.removeLast()
            switch frame.kind {
            case .object: out.append(UInt8(ascii: "}"))
            case .array: out.append(UInt8(ascii: "]"))
            case .slot:
                if frame.count == 0 { out.append(UInt8(ascii: "{"), UInt8(ascii: "}")) }
            }
        }
    }

    /// Makes frame `index` the innermost open frame, or throws if it was already closed.
    @inline(__always)
    mutating func activate(_ index: Int, _ id: UInt32) throws {
        if index >= 0, frames.count &- 1 == index, frames[index].id == id { return }
        try activateSlow(index, id)
    }

    mutating func activateSlow(_ index: Int, _ id: UInt32) throws {
        guard index >= 0, index < frames.count, frames[index].id == id else {
            throw usageError(
                "a container was written to after it was finished (FastJSON streams its output, so "
                    + "containers must be written in nesting order: finish a nested container before "
                    + "writing to its parent again)")
        }
        closeFrames(above: index)
    }

    func usageError(_ message: String) -> EncodingError {
        let path = prefixPath(currentDepth)
        return EncodingError.invalidValue(
            Optional<Int>.none as Any,
            EncodingError.Context(
                codingPath: path, debugDescription: message,
                underlyingError: FastJSONError(code: .invalidEncoderUsage, offset: nil,
                                               codingPath: _describe(codingPath: path), message: message)))
    }

    @inline(__always)
    mutating func beginKey(_ frame: Int, _ id: UInt32, _ key: String) throws {
        try activate(frame, id)
        if frames[frame].count > 0 { out.append(UInt8(ascii: ",")) }
        frames[frame].count &+= 1
        writeString(key)
        out.append(UInt8(ascii: ":"))
    }

    @inline(__always)
    mutating func beginElement(_ frame: Int, _ id: UInt32) throws {
        try activate(frame, id)
        if frames[frame].count > 0 { out.append(UInt8(ascii: ",")) }
        frames[frame].count &+= 1
    }

    /// Starts the single value of a slot.
    mutating func beginSlotValue(_ slot: Int, _ id: UInt32) throws {
        try activate(slot, id)
        guard frames[slot].count == 0 else {
            throw usageError("a single value container already holds a value")
        }
        frames[slot].count = 1
    }

    /// The container frame for a slot: opened now, or the one already opened for this slot
    /// (a class and its superclass may both ask the same encoder for a keyed container).
    mutating func containerFrame(slot: Int, id: UInt32, kind: _EncoderFrame.Kind) -> (Int, UInt32)? {
        guard slot >= 0, slot < frames.count, frames[slot].id == id else { return nil }
        if frames[slot].count == 0 {
            closeFrames(above: slot)
            frames[slot].count = 1
            out.append(kind == .object ? UInt8(ascii: "{") : UInt8(ascii: "["))
            return push(kind)
        }
        if frames.count > slot + 1, frames[slot + 1].kind == kind {
            closeFrames(above: slot + 1)
            return (slot + 1, frames[slot + 1].id)
        }
        return nil
    }

    mutating func deferError(_ error: any Error) {
        if deferredError == nil { deferredError = error }
    }

    // MARK: Values

    /// Writes values with a JSON-specific representation (scalars, `Data`, `URL`, `Date`,
    /// `Decimal`, arrays of scalars) directly. Returns `false` for anything else.
    @inline(__always)
    mutating func encodeSpecial<T: Encodable, K: CodingKey>(_ value: T, depth: Int, key: K) throws -> Bool {
        if T.self == String.self {
            writeString(_cast(value, to: String.self))
        } else if T.self == Int.self {
            writeInt(_cast(value, to: Int.self))
        } else if T.self == Double.self {
            try writeDouble(_cast(value, to: Double.self), depth: depth, key: key)
        } else if T.self == Bool.self {
            writeBool(_cast(value, to: Bool.self))
        } else if T.self == [String].self {
            let array = _cast(value, to: [String].self)
            out.append(UInt8(ascii: "["))
            for (i, element) in array.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                writeString(element)
            }
            out.append(UInt8(ascii: "]"))
        } else if T.self == [Int].self {
            let array = _cast(value, to: [Int].self)
            out.append(UInt8(ascii: "["))
            for (i, element) in array.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                writeInt(element)
            }
            out.append(UInt8(ascii: "]"))
        } else if T.self == [Double].self {
            let array = _cast(value, to: [Double].self)
            out.append(UInt8(ascii: "["))
            for (i, element) in array.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                try writeDouble(element, depth: depth, key: key, index: i)
            }
            out.append(UInt8(ascii: "]"))
        } else {
            return try encodeSpecialRare(value, depth: depth, key: key)
        }
        return true
    }

    mutating func encodeSpecialRare<T: Encodable, K: CodingKey>(_ value: T, depth: Int, key: K) throws -> Bool {
        if T.self == Int64.self {
            writeInt(_cast(value, to: Int64.self))
        } else if T.self == UInt64.self {
            writeUInt(_cast(value, to: UInt64.self))
        } else if T.self == UInt.self {
            writeUInt(_cast(value, to: UInt.self))
        } else if T.self == Int32.self {
            writeInt(_cast(value, to: Int32.self))
        } else if T.self == UInt32.self {
            writeUInt(_cast(value, to: UInt32.self))
        } else if T.self == Int16.self {
            writeInt(_cast(value, to: Int16.self))
        } else if T.self == UInt16.self {
            writeUInt(_cast(value, to: UInt16.self))
        } else if T.self == Int8.self {
            writeInt(_cast(value, to: Int8.self))
        } else if T.self == UInt8.self {
            writeUInt(_cast(value, to: UInt8.self))
        } else if T.self == Float.self {
            try writeFloat(_cast(value, to: Float.self), depth: depth, key: key)
        } else if T.self == Date.self {
            try writeDouble(_cast(value, to: Date.self).timeIntervalSinceReferenceDate, depth: depth, key: key)
        } else if T.self == Data.self {
            writeString(_cast(value, to: Data.self).base64EncodedString())
        } else if T.self == URL.self {
            writeString(_cast(value, to: URL.self).absoluteString)
        } else if T.self == Decimal.self {
            let decimal = _cast(value, to: Decimal.self)
            guard decimal.isFinite else {
                throw nonFinite(decimal, "Decimal.nan", depth: depth, key: key)
            }
            var text = decimal.description
            text.withUTF8 { out.append($0) }
        } else {
            return false
        }
        return true
    }

    // MARK: Scalars

    @inline(__always)
    mutating func writeNull() { out.append("null") }

    @inline(__always)
    mutating func writeBool(_ value: Bool) { out.append(value ? "true" : "false") }

    @inline(__always)
    mutating func writeInt<I: FixedWidthInteger & SignedInteger>(_ value: I) {
        if value >= 0 && value < 10 {
            out.append(UInt8(truncatingIfNeeded: value) &+ 48)
        } else {
            writeDigits(UInt64(truncatingIfNeeded: value.magnitude), negative: value < 0)
        }
    }

    @inline(__always)
    mutating func writeUInt<I: FixedWidthInteger & UnsignedInteger>(_ value: I) {
        if value < 10 {
            out.append(UInt8(truncatingIfNeeded: value) &+ 48)
        } else {
            writeDigits(UInt64(value), negative: false)
        }
    }

    mutating func writeDigits(_ value: UInt64, negative: Bool) {
        out.reserve(21)
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)
        withUnsafeMutableBytes(of: &digits) { buffer in
            var index = 24
            var rest = value
            repeat {
                let (quotient, digit) = rest.quotientAndRemainder(dividingBy: 10)
                index &-= 1
                buffer[index] = UInt8(truncatingIfNeeded: digit) &+ 48
                rest = quotient
            } while rest != 0
            if negative {
                index &-= 1
                buffer[index] = UInt8(ascii: "-")
            }
            out.append(UnsafeRawBufferPointer(rebasing: buffer[index...]))
        }
    }

    func nonFinite<K: CodingKey>(_ value: Any, _ spelled: String, depth: Int, key: K, index: Int? = nil) -> EncodingError {
        var codingPath = prefixPath(depth)
        if K.self != _NoKey.self { codingPath.append(key) }
        if let index { codingPath.append(_JSONKey(intValue: index)) }
        let message = "Unable to encode \(spelled) directly in JSON."
        return EncodingError.invalidValue(value, EncodingError.Context(
            codingPath: codingPath, debugDescription: message,
            underlyingError: FastJSONError(code: .nonFiniteNumber, offset: nil,
                                           codingPath: _describe(codingPath: codingPath), message: message)))
    }

    @inline(__always)
    mutating func writeDouble<K: CodingKey>(_ value: Double, depth: Int, key: K, index: Int? = nil) throws {
        guard value.isFinite else {
            throw nonFinite(value, value.isNaN ? "Double.nan" : value < 0 ? "-Double.infinity" : "Double.infinity",
                            depth: depth, key: key, index: index)
        }
        // Integral values below 2^53 print as plain integers (Swift's description would add ".0").
        if value.magnitude < 9_007_199_254_740_992, value == value.rounded(.towardZero), value != 0 || value.sign == .plus {
            writeInt(Int64(value))
            return
        }
        if writeShortDecimal(value) { return }
        writeFloatingPoint(value)
    }

    /// Fast path for values with a few decimals, like `3.25` or `47.3712`: finds the smallest
    /// `k ≤ 9` with `value == m / 10^k` for an integer `m < 2^53` and writes `m` with a decimal point.
    /// Parsing that text divides two exact doubles, which is correctly rounded, so it reads back as
    /// exactly `value`; and no spelling with fewer decimals exists, or a smaller `k` would have matched.
    @inline(__always)
    mutating func writeShortDecimal(_ value: Double) -> Bool {
        let magnitude = value.magnitude
        guard magnitude >= 1e-3, magnitude < 1e9 else { return false }
        var scale = 10.0
        for k in 1...9 {
            let scaled = (magnitude * scale).rounded()
            if scaled < 9_007_199_254_740_992, scaled / scale == magnitude {
                writeFixed(UInt64(scaled), decimals: k, negative: value < 0)
                return true
            }
            scale *= 10
        }
        return false
    }

    /// Writes `digits / 10^decimals` in fixed-point notation (`decimals` ≥ 1).
    mutating func writeFixed(_ digits: UInt64, decimals: Int, negative: Bool) {
        out.reserve(24)
        var storage: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
        withUnsafeMutableBytes(of: &storage) { buffer in
            var index = 32
            var rest = digits
            var written = 0
            while written < decimals || rest != 0 {
                if written == decimals {
                    index &-= 1
                    buffer[index] = UInt8(ascii: ".")
                }
                let (quotient, digit) = rest.quotientAndRemainder(dividingBy: 10)
                index &-= 1
                buffer[index] = UInt8(truncatingIfNeeded: digit) &+ 48
                rest = quotient
                written &+= 1
            }
            if written == decimals {
                // No integer digits were written: "0.xx".
                index &-= 1
                buffer[index] = UInt8(ascii: ".")
                index &-= 1
                buffer[index] = UInt8(ascii: "0")
            }
            if negative {
                index &-= 1
                buffer[index] = UInt8(ascii: "-")
            }
            out.append(UnsafeRawBufferPointer(rebasing: buffer[index...]))
        }
    }

    mutating func writeFloat<K: CodingKey>(_ value: Float, depth: Int, key: K, index: Int? = nil) throws {
        guard value.isFinite else {
            throw nonFinite(value, value.isNaN ? "Float.nan" : value < 0 ? "-Float.infinity" : "Float.infinity",
                            depth: depth, key: key, index: index)
        }
        writeFloatingPoint(value)
    }

    /// Writes Swift's shortest round-trip spelling (`description`), without a trailing `.0`.
    mutating func writeFloatingPoint<F: BinaryFloatingPoint & TextOutputStreamable>(_ value: F) {
        var sink = _DigitSink()
        value.write(to: &sink)
        withUnsafeBytes(of: &sink.storage) { raw in
            var count = sink.count
            if count >= 2, raw[count - 1] == UInt8(ascii: "0"), raw[count - 2] == UInt8(ascii: ".") { count -= 2 }
            out.append(UnsafeRawBufferPointer(rebasing: raw[0..<count]))
        }
    }

    // MARK: Strings

    @inline(__always)
    mutating func writeString(_ string: String) {
        let done: Void? = string.utf8.withContiguousStorageIfAvailable { writeEscaped($0) }
        if done == nil {
            var copy = string
            copy.withUTF8 { writeEscaped($0) }
        }
    }

    mutating func writeEscaped(_ utf8: UnsafeBufferPointer<UInt8>) {
        let count = utf8.count
        out.reserve(count + 2)
        out.append(UInt8(ascii: "\""))
        var runStart = 0
        var index = 0
        let slash: UInt8 = escapeSlashes ? UInt8(ascii: "/") : 0
        while index < count {
            let byte = utf8[index]
            if byte >= 0x20 && byte != UInt8(ascii: "\"") && byte != UInt8(ascii: "\\") && byte != slash {
                index &+= 1
                continue
            }
            if runStart < index {
                out.append(UnsafeBufferPointer(rebasing: utf8[runStart..<index]))
            }
            writeEscape(byte)
            index &+= 1
            runStart = index
        }
        if runStart < count {
            out.append(UnsafeBufferPointer(rebasing: utf8[runStart..<count]))
        }
        out.append(UInt8(ascii: "\""))
    }

    mutating func writeEscape(_ byte: UInt8) {
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(UInt8(ascii: "\\"), byte)
        case 0x08: out.append("\\b")
        case 0x0C: out.append("\\f")
        case 0x0A: out.append("\\n")
        case 0x0D: out.append("\\r")
        case 0x09: out.append("\\t")
        default:
            let hex: StaticString = "0123456789abcdef"
            out.append("\\u00")
            out.append(hex.utf8Start[Int(byte >> 4)], hex.utf8Start[Int(byte & 0xF)])
        }
    }
}

/// Receives the digits of `Double.write(to:)` / `Float.write(to:)` without building a `String`.
struct _DigitSink: TextOutputStream {
    var storage: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0)
    var count = 0

    mutating func write(_ string: String) {
        for byte in string.utf8 { push(byte) }
    }

    // The standard library's floating-point `write(to:)` calls this with its digit buffer.
    mutating func _writeASCII(_ buffer: UnsafeBufferPointer<UInt8>) {
        for byte in buffer { push(byte) }
    }

    @inline(__always)
    private mutating func push(_ byte: UInt8) {
        guard count < 48 else { return }
        withUnsafeMutableBytes(of: &storage) { $0[count] = byte }
        count += 1
    }
}

/// Reinterprets a value whose dynamic type the caller has already checked to be `U`.
@inline(__always)
func _cast<T, U>(_ value: T, to type: U.Type) -> U {
    unsafeBitCast(value, to: U.self)
}

/// Per-container data of a keyed encoding container (see ``_ContainerCache``).
struct _KeyedEncoderRecord {
    var frame: Int
    var id: UInt32
    var depth: Int
}

// MARK: - Re-entrant operations

/// Operations that call user code (`encode(to:)`). They only touch the state through short,
/// separate accesses via the pointer, never across the call into user code.
enum _Encoding {
    typealias Core = UnsafeMutablePointer<_EncoderCore>

    static func encodeTopLevel<T: Encodable>(_ core: Core, _ value: T) throws {
        let (slot, id) = core.pointee.push(.slot)
        if try core.pointee.encodeSpecial(value, depth: 0, key: _NoKey()) {
            core.pointee.frames[slot].count = 1
        } else {
            core.pointee.currentSlot = slot
            core.pointee.currentSlotID = id
            core.pointee.currentDepth = 0
            try Unmanaged.passUnretained(core.pointee.encoder!)._withUnsafeGuaranteedRef { try value.encode(to: $0) }
        }
        if let error = core.pointee.deferredError { throw error }
        guard core.pointee.frames.count > slot, core.pointee.frames[slot].id == id else {
            throw core.pointee.usageError("the top-level slot was closed")
        }
        core.pointee.closeFrames(above: slot)
        guard core.pointee.frames[slot].count > 0 else {
            let message = "Top-level \(T.self) did not encode any values."
            throw EncodingError.invalidValue(value, EncodingError.Context(
                codingPath: [], debugDescription: message,
                underlyingError: FastJSONError(code: .noValueEncoded, offset: nil, codingPath: "", message: message)))
        }
    }

    /// Encodes a non-primitive value into a fresh slot at the current output position.
    static func encodeNested<T: Encodable>(_ core: Core, _ value: T, depth: Int) throws {
        let (slot, id) = core.pointee.push(.slot)
        let saved = (core.pointee.currentSlot, core.pointee.currentSlotID, core.pointee.currentDepth)
        core.pointee.currentSlot = slot
        core.pointee.currentSlotID = id
        core.pointee.currentDepth = depth
        defer { (core.pointee.currentSlot, core.pointee.currentSlotID, core.pointee.currentDepth) = saved }
        // The state is alive for the whole call (its owner holds it); skip the retain/release.
        try Unmanaged.passUnretained(core.pointee.encoder!)._withUnsafeGuaranteedRef { try value.encode(to: $0) }
        guard slot < core.pointee.frames.count, core.pointee.frames[slot].id == id else {
            throw core.pointee.usageError(
                "a container of an enclosing value was written to while \(T.self) was being encoded")
        }
        core.pointee.closeFrames(above: slot - 1)
    }

    /// Encodes `value` (already positioned: key or comma written) whose coding path is
    /// `path[0..<depth] + [key]` (or `path[0..<depth]` for `_NoKey`).
    @inline(__always)
    static func encodeValue<T: Encodable, K: CodingKey>(_ core: Core, _ value: T, depth: Int, key: K) throws {
        if try core.pointee.encodeSpecial(value, depth: depth, key: key) { return }
        core.pointee.truncatePath(depth)
        var valueDepth = depth
        if K.self != _NoKey.self {
            core.pointee.path.append(key)
            valueDepth += 1
        }
        try encodeNested(core, value, depth: valueDepth)
        core.pointee.truncatePath(depth)
    }

    static func keyedContainer<Key: CodingKey>(_ core: Core, slot: Int, id: UInt32, depth: Int)
        -> KeyedEncodingContainer<Key>
    {
        if let (frame, frameID) = core.pointee.containerFrame(slot: slot, id: id, kind: .object) {
            return makeKeyed(core, frame: frame, id: frameID, depth: depth)
        }
        core.pointee.deferError(core.pointee.usageError(
            "keyed container requested for a value that already holds something else"))
        return makeKeyed(core, frame: -1, id: 0, depth: depth)
    }

    /// A keyed container for `frame`, reusing a cached box when possible.
    @inline(__always)
    static func makeKeyed<Key: CodingKey>(_ core: Core, frame: Int, id: UInt32, depth: Int) -> KeyedEncodingContainer<Key> {
        let record = _KeyedEncoderRecord(frame: frame, id: id, depth: depth)
        let keyType = ObjectIdentifier(Key.self)
        if let box = core.pointee.containers.reuse(keyType: keyType, record: record) {
            return unsafeBitCast(box, to: KeyedEncodingContainer<Key>.self)
        }
        let pointer = core.pointee.containers.newRecord(record)
        let container = KeyedEncodingContainer(_KeyedEncoder<Key>(core: core, record: pointer))
        let box: AnyObject? = MemoryLayout<KeyedEncodingContainer<Key>>.size == MemoryLayout<AnyObject>.size
            ? unsafeBitCast(container, to: AnyObject.self) : nil
        core.pointee.containers.keep(box, keyType: keyType, record: pointer)
        return container
    }

    static func unkeyedContainer(_ core: Core, slot: Int, id: UInt32, depth: Int) -> any UnkeyedEncodingContainer {
        if let (frame, frameID) = core.pointee.containerFrame(slot: slot, id: id, kind: .array) {
            return _UnkeyedEncoder(core: core, frame: frame, id: frameID, depth: depth)
        }
        core.pointee.deferError(core.pointee.usageError(
            "unkeyed container requested for a value that already holds something else"))
        return _UnkeyedEncoder(core: core, frame: -1, id: 0, depth: depth)
    }
}

/// The `Encoder` handed to `encode(to:)`. Owns the state for one `encode` call.
@usableFromInline
final class _EncoderState: Encoder {
    let core: UnsafeMutablePointer<_EncoderCore>

    private init() {
        core = .allocate(capacity: 1)
        core.initialize(to: _EncoderCore(escapeSlashes: false, userInfo: [:]))
        core.pointee.encoder = self
    }

    /// One recycled state, kept between calls so encoding doesn't allocate it (and its buffers) anew.
    private static let cache = _ObjectCache()

    /// A state ready for one `encode` call: recycled if one is available.
    static func make(escapeSlashes: Bool, userInfo: [CodingUserInfoKey: any Sendable]) -> _EncoderState {
        let state = cache.take(_EncoderState.self) ?? _EncoderState()
        state.core.pointee.escapeSlashes = escapeSlashes
        if !userInfo.isEmpty || !state.core.pointee.sendableUserInfo.isEmpty {
            state.core.pointee.sendableUserInfo = userInfo
        }
        return state
    }

    /// Returns a state to the cache unless something else still references it or it grew large.
    static func recycle(_ state: inout _EncoderState) {
        guard isKnownUniquelyReferenced(&state), state.core.pointee.out.capacityInBytes <= 65_536 else { return }
        let core = state.core
        core.pointee.out.removeAll()
        core.pointee.containers.reset()
        core.pointee.frames.removeAll(keepingCapacity: true)
        if !core.pointee.path.isEmpty { core.pointee.path.removeAll(keepingCapacity: true) }
        if core.pointee.deferredError != nil { core.pointee.deferredError = nil }
        core.pointee.currentSlot = 0
        core.pointee.currentSlotID = 0
        core.pointee.currentDepth = 0
        cache.put(state)
    }

    deinit {
        core.pointee.containers.destroy()
        core.pointee.out.deallocate()
        core.deinitialize(count: 1)
        core.deallocate()
    }

    @usableFromInline var codingPath: [any CodingKey] { core.pointee.prefixPath(core.pointee.currentDepth) }

    @usableFromInline var userInfo: [CodingUserInfoKey: Any] { core.pointee.userInfo }

    @usableFromInline
    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        _Encoding.keyedContainer(core, slot: core.pointee.currentSlot, id: core.pointee.currentSlotID,
                                 depth: core.pointee.currentDepth)
    }

    @usableFromInline
    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        _Encoding.unkeyedContainer(core, slot: core.pointee.currentSlot, id: core.pointee.currentSlotID,
                                   depth: core.pointee.currentDepth)
    }

    @usableFromInline
    func singleValueContainer() -> any SingleValueEncodingContainer {
        _SingleValueEncoder(core: core, slot: core.pointee.currentSlot, id: core.pointee.currentSlotID,
                            depth: core.pointee.currentDepth)
    }
}

// MARK: - Containers
// Containers hold the state pointer, valid only during the `encode` call that created them.

struct _KeyedEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let core: UnsafeMutablePointer<_EncoderCore>
    let record: UnsafeMutablePointer<_KeyedEncoderRecord>

    var frame: Int { record.pointee.frame }
    var id: UInt32 { record.pointee.id }
    var depth: Int { record.pointee.depth }

    var codingPath: [any CodingKey] { core.pointee.prefixPath(depth) }

    @inline(__always)
    func begin(_ key: Key) throws {
        try core.pointee.beginKey(frame, id, key.stringValue)
    }

    mutating func encodeNil(forKey key: Key) throws {
        try begin(key)
        core.pointee.writeNull()
    }

    mutating func encode(_ value: Bool, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeBool(value)
    }

    mutating func encode(_ value: String, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeString(value)
    }

    mutating func encode(_ value: Double, forKey key: Key) throws {
        try begin(key)
        try core.pointee.writeDouble(value, depth: depth, key: key)
    }

    mutating func encode(_ value: Float, forKey key: Key) throws {
        try begin(key)
        try core.pointee.writeFloat(value, depth: depth, key: key)
    }

    mutating func encode(_ value: Int, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int8, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int16, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int32, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int64, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: UInt, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt8, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt16, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt32, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt64, forKey key: Key) throws {
        try begin(key)
        core.pointee.writeUInt(value)
    }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try begin(key)
        try _Encoding.encodeValue(core, value, depth: depth, key: key)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy keyType: NestedKey.Type, forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        do {
            try begin(key)
        } catch {
            core.pointee.deferError(error)
            return _Encoding.makeKeyed(core, frame: -1, id: 0, depth: depth + 1)
        }
        core.pointee.out.append(UInt8(ascii: "{"))
        core.pointee.truncatePath(depth)
        core.pointee.path.append(key)
        let (frame, id) = core.pointee.push(.object)
        return _Encoding.makeKeyed(core, frame: frame, id: id, depth: depth + 1)
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        do {
            try begin(key)
        } catch {
            core.pointee.deferError(error)
            return _UnkeyedEncoder(core: core, frame: -1, id: 0, depth: depth + 1)
        }
        core.pointee.out.append(UInt8(ascii: "["))
        core.pointee.truncatePath(depth)
        core.pointee.path.append(key)
        let (frame, id) = core.pointee.push(.array)
        return _UnkeyedEncoder(core: core, frame: frame, id: id, depth: depth + 1)
    }

    mutating func superEncoder() -> any Encoder {
        superEncoder(key: _JSONKey.super)
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        superEncoder(key: key)
    }

    private func superEncoder(key: some CodingKey) -> any Encoder {
        var codingPath = core.pointee.prefixPath(depth)
        codingPath.append(key)
        do {
            try core.pointee.beginKey(frame, id, key.stringValue)
        } catch {
            core.pointee.deferError(error)
            return _SuperEncoder(core: core, slot: -1, id: 0, codingPath: codingPath)
        }
        let (slot, id) = core.pointee.push(.slot)
        return _SuperEncoder(core: core, slot: slot, id: id, codingPath: codingPath)
    }
}

struct _UnkeyedEncoder: UnkeyedEncodingContainer {
    let core: UnsafeMutablePointer<_EncoderCore>
    let frame: Int
    let id: UInt32
    let depth: Int
    private(set) var count = 0

    init(core: UnsafeMutablePointer<_EncoderCore>, frame: Int, id: UInt32, depth: Int) {
        self.core = core
        self.frame = frame
        self.id = id
        self.depth = depth
    }

    var codingPath: [any CodingKey] { core.pointee.prefixPath(depth) }

    @inline(__always)
    mutating func begin() throws {
        try core.pointee.beginElement(frame, id)
        count &+= 1
    }

    mutating func encodeNil() throws {
        try begin()
        core.pointee.writeNull()
    }

    mutating func encode(_ value: Bool) throws {
        try begin()
        core.pointee.writeBool(value)
    }

    mutating func encode(_ value: String) throws {
        try begin()
        core.pointee.writeString(value)
    }

    mutating func encode(_ value: Double) throws {
        try begin()
        try core.pointee.writeDouble(value, depth: depth, key: _JSONKey(intValue: count - 1))
    }

    mutating func encode(_ value: Float) throws {
        try begin()
        try core.pointee.writeFloat(value, depth: depth, key: _JSONKey(intValue: count - 1))
    }

    mutating func encode(_ value: Int) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int8) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int16) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int32) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int64) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: UInt) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt8) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt16) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt32) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt64) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        try begin()
        try _Encoding.encodeValue(core, value, depth: depth, key: _JSONKey(intValue: count - 1))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy keyType: NestedKey.Type
    ) -> KeyedEncodingContainer<NestedKey> {
        do {
            try begin()
        } catch {
            core.pointee.deferError(error)
            return _Encoding.makeKeyed(core, frame: -1, id: 0, depth: depth + 1)
        }
        core.pointee.out.append(UInt8(ascii: "{"))
        core.pointee.truncatePath(depth)
        core.pointee.path.append(_JSONKey(intValue: count - 1))
        let (frame, id) = core.pointee.push(.object)
        return _Encoding.makeKeyed(core, frame: frame, id: id, depth: depth + 1)
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        do {
            try begin()
        } catch {
            core.pointee.deferError(error)
            return _UnkeyedEncoder(core: core, frame: -1, id: 0, depth: depth + 1)
        }
        core.pointee.out.append(UInt8(ascii: "["))
        core.pointee.truncatePath(depth)
        core.pointee.path.append(_JSONKey(intValue: count - 1))
        let (frame, id) = core.pointee.push(.array)
        return _UnkeyedEncoder(core: core, frame: frame, id: id, depth: depth + 1)
    }

    mutating func superEncoder() -> any Encoder {
        var codingPath = core.pointee.prefixPath(depth)
        codingPath.append(_JSONKey(intValue: count))
        do {
            try begin()
        } catch {
            core.pointee.deferError(error)
            return _SuperEncoder(core: core, slot: -1, id: 0, codingPath: codingPath)
        }
        let (slot, id) = core.pointee.push(.slot)
        return _SuperEncoder(core: core, slot: slot, id: id, codingPath: codingPath)
    }
}

struct _SingleValueEncoder: SingleValueEncodingContainer {
    let core: UnsafeMutablePointer<_EncoderCore>
    let slot: Int
    let id: UInt32
    let depth: Int

    var codingPath: [any CodingKey] { core.pointee.prefixPath(depth) }

    @inline(__always)
    func begin() throws {
        try core.pointee.beginSlotValue(slot, id)
    }

    mutating func encodeNil() throws {
        try begin()
        core.pointee.writeNull()
    }

    mutating func encode(_ value: Bool) throws {
        try begin()
        core.pointee.writeBool(value)
    }

    mutating func encode(_ value: String) throws {
        try begin()
        core.pointee.writeString(value)
    }

    mutating func encode(_ value: Double) throws {
        try begin()
        try core.pointee.writeDouble(value, depth: depth, key: _NoKey())
    }

    mutating func encode(_ value: Float) throws {
        try begin()
        try core.pointee.writeFloat(value, depth: depth, key: _NoKey())
    }

    mutating func encode(_ value: Int) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int8) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int16) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int32) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: Int64) throws {
        try begin()
        core.pointee.writeInt(value)
    }

    mutating func encode(_ value: UInt) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt8) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt16) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt32) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode(_ value: UInt64) throws {
        try begin()
        core.pointee.writeUInt(value)
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        try begin()
        try _Encoding.encodeValue(core, value, depth: depth, key: _NoKey())
    }
}

/// The encoder returned by `superEncoder()`: writes one value into the slot reserved for it.
final class _SuperEncoder: Encoder {
    let core: UnsafeMutablePointer<_EncoderCore>
    let slot: Int
    let id: UInt32
    let codingPath: [any CodingKey]
    /// Keeps the state alive while this encoder exists.
    let owner: _EncoderState?

    init(core: UnsafeMutablePointer<_EncoderCore>, slot: Int, id: UInt32, codingPath: [any CodingKey]) {
        self.core = core
        self.slot = slot
        self.id = id
        self.codingPath = codingPath
        self.owner = core.pointee.encoder
    }

    var userInfo: [CodingUserInfoKey: Any] { core.pointee.userInfo }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        core.pointee.path = codingPath
        return _Encoding.keyedContainer(core, slot: slot, id: id, depth: codingPath.count)
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        core.pointee.path = codingPath
        return _Encoding.unkeyedContainer(core, slot: slot, id: id, depth: codingPath.count)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        core.pointee.path = codingPath
        return _SingleValueEncoder(core: core, slot: slot, id: id, depth: codingPath.count)
    }
}
