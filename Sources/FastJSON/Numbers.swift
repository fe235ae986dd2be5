/// Number conversions from validated JSON number text (`-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`).

@usableFromInline
let _powersOfTen: [Double] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
]

/// 10^k for 0 ≤ k ≤ 8 as an integer.
@inline(__always)
func _powerOfTenInteger(_ k: Int) -> UInt64 {
    switch k {
    case 0: 1
    case 1: 10
    case 2: 100
    case 3: 1000
    case 4: 10000
    case 5: 100_000
    case 6: 1_000_000
    case 7: 10_000_000
    default: 100_000_000
    }
}

/// 10^k for 0 ≤ k ≤ 22 (exact as a `Double`), without the global array's lazy-initialization check.
@inline(__always)
func _exactPowerOfTen(_ k: Int) -> Double {
    switch k {
    case 0: 1e0
    case 1: 1e1
    case 2: 1e2
    case 3: 1e3
    case 4: 1e4
    case 5: 1e5
    case 6: 1e6
    case 7: 1e7
    case 8: 1e8
    case 9: 1e9
    case 10: 1e10
    case 11: 1e11
    case 12: 1e12
    case 13: 1e13
    case 14: 1e14
    case 15: 1e15
    case 16: 1e16
    case 17: 1e17
    case 18: 1e18
    case 19: 1e19
    case 20: 1e20
    case 21: 1e21
    default: 1e22
    }
}

@usableFromInline
let _powersOfTenFloat: [Float] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10]

/// The pieces of a number: up to 19 leading significant digits as an integer, the decimal
/// exponent that applies to them, and whether digits were dropped.
struct _DecimalParts {
    var negative = false
    var mantissa: UInt64 = 0
    /// Value = mantissa × 10^exponent (exactly, unless `truncated`).
    var exponent = 0
    var digitCount = 0
    /// Non-zero digits beyond the 19 kept in `mantissa`.
    var truncated = false
    var hasNonZeroDigit = false
}

@inline(__always)
func _decimalParts(_ text: UnsafeBufferPointer<UInt8>) -> _DecimalParts {
    var parts = _DecimalParts()
    var i = 0
    let n = text.count
    if text[0] == UInt8(ascii: "-") {
        parts.negative = true
        i = 1
    }
    var droppedExponent = 0
    var fractionDigits = 0
    var inFraction = false
    while i < n {
        let byte = text[i]
        if byte == UInt8(ascii: ".") {
            inFraction = true
            i += 1
            continue
        }
        let digit = byte &- UInt8(ascii: "0")
        guard digit < 10 else { break }
        if digit != 0 { parts.hasNonZeroDigit = true }
        if parts.mantissa == 0 && digit == 0 {
            // Leading zero: no significance.
            if inFraction { fractionDigits += 1 }
        } else if parts.digitCount < 19 {
            parts.mantissa = parts.mantissa &* 10 &+ UInt64(digit)
            parts.digitCount += 1
            if inFraction { fractionDigits += 1 }
        } else {
            if digit != 0 { parts.truncated = true }
            if !inFraction { droppedExponent += 1 }
        }
        i += 1
    }
    var exponent = 0
    if i < n {
        // 'e' or 'E'
        i += 1
        var negativeExponent = false
        if text[i] == UInt8(ascii: "-") {
            negativeExponent = true
            i += 1
        } else if text[i] == UInt8(ascii: "+") {
            i += 1
        }
        while i < n {
            if exponent < 1_000_000 { exponent = exponent * 10 + Int(text[i] &- UInt8(ascii: "0")) }
            i += 1
        }
        if negativeExponent { exponent = -exponent }
    }
    parts.exponent = exponent - fractionDigits + droppedExponent
    return parts
}

/// An integer read from number text: magnitude and sign, plus what `JSONDecoder` additionally
/// requires of numbers written with a fraction or exponent (see ``_parseMagnitudeSlow(_:negative:)``).
struct _ParsedInteger {
    var magnitude: UInt64
    var negative: Bool
    var valid: Bool
    /// The magnitude of the number read as a `Double`, which must also fit the type.
    var doubleMagnitude: UInt64
    /// The decimal path negates a positive value, so the magnitude must fit the positive range.
    var positiveRangeOnly = false

    init(_ magnitude: UInt64, negative: Bool, valid: Bool) {
        self.magnitude = magnitude
        self.negative = negative
        self.valid = valid
        self.doubleMagnitude = magnitude
    }

    @inline(__always)
    func fits<I: FixedWidthInteger>(_ type: I.Type) -> Bool {
        valid && _fits(I.self, magnitude: magnitude, negative: negative)
            && (doubleMagnitude == magnitude || _fits(I.self, magnitude: doubleMagnitude, negative: negative))
            && (!positiveRangeOnly || _fits(I.self, magnitude: magnitude, negative: false))
    }

    @inline(__always)
    func value<I: FixedWidthInteger>(_ type: I.Type) -> I {
        negative ? I(truncatingIfNeeded: Int64(bitPattern: 0 &- magnitude)) : I(truncatingIfNeeded: magnitude)
    }
}

/// Parses `text` as an integer magnitude and sign, accepting `1.0` or `1e2` when `JSONDecoder`
/// would. Check the result with ``_ParsedInteger/fits(_:)``.
@inline(__always)
func _parseMagnitude(_ text: UnsafeBufferPointer<UInt8>, flags: UInt8) -> _ParsedInteger {
    let negative = flags & _Token.negative != 0
    var magnitude: UInt64 = 0
    if flags & _Token.notInteger == 0 {
        var i = negative ? 1 : 0
        let n = text.count
        if n &- i <= 8, let base = text.baseAddress {
            // Up to eight digits at once, without a loop (and its mispredicted exit).
            return _ParsedInteger(_eightDigits(base + i, n &- i), negative: negative, valid: true)
        }
        if n - i <= 18 {
            while i < n {
                magnitude = magnitude &* 10 &+ UInt64(text[i] &- UInt8(ascii: "0"))
                i += 1
            }
        } else {
            while i < n {
                let (times10, overflow1) = magnitude.multipliedReportingOverflow(by: 10)
                let (sum, overflow2) = times10.addingReportingOverflow(UInt64(text[i] &- UInt8(ascii: "0")))
                if overflow1 || overflow2 { return _ParsedInteger(0, negative: negative, valid: false) }
                magnitude = sum
                i += 1
            }
        }
        return _ParsedInteger(magnitude, negative: negative, valid: true)
    }
    return _parseMagnitudeSlow(text, negative: negative)
}

/// The value of `count` (1…8) ASCII digits at `p`: loaded as one word (first digit in the low
/// byte), shifted so that they end in the top byte (the zero bytes below act as leading zeros),
/// then combined pairwise by multiplication (Lemire's eight-digit method).
@inline(__always)
func _eightDigits(_ p: UnsafePointer<UInt8>, _ count: Int) -> UInt64 {
    var value = _load16(p, count).0 &<< UInt64(truncatingIfNeeded: 8 &* (8 &- count))
    value = ((value & 0x0F0F_0F0F_0F0F_0F0F) &* 2561) &>> 8
    value = ((value & 0x00FF_00FF_00FF_00FF) &* 6_553_601) &>> 16
    return ((value & 0x0000_FFFF_0000_FFFF) &* 42_949_672_960_001) &>> 32
}

/// Integers written with a fraction or exponent, decided exactly as `JSONDecoder` decides them:
/// the text is read as a `Double`, which must be integral (so `1.0000000000000000001` reads as 1
/// and `1e-400` as 0); below 2^53 that double is the value, otherwise the value is recomputed from
/// the decimal digits, dividing by ten with truncation for a negative exponent.
func _parseMagnitudeSlow(_ text: UnsafeBufferPointer<UInt8>, negative: Bool) -> _ParsedInteger {
    let invalid = _ParsedInteger(0, negative: negative, valid: false)
    guard let double = Double(String(decoding: text, as: UTF8.self)), double.isFinite,
          double == double.rounded(.towardZero), double.magnitude < 18_446_744_073_709_551_616.0
    else { return invalid }
    let magnitude = UInt64(double.magnitude)
    if double.magnitude < 9_007_199_254_740_992 { return _ParsedInteger(magnitude, negative: negative, valid: true) }
    // Large: the caller checks that the double fits; the result comes from the decimal digits.
    // Trailing zeros don't count against the 64-bit mantissa (Foundation's decimal drops them).
    var digits: UInt64 = 0
    var fractionDigits = 0
    var inFraction = false
    var pendingZeros = 0
    var pendingFractionZeros = 0
    var i = negative ? 1 : 0
    while i < text.count {
        let byte = text[i]
        let digit = byte &- UInt8(ascii: "0")
        if byte == UInt8(ascii: ".") {
            inFraction = true
        } else if digit == 0 {
            pendingZeros += 1
            if inFraction { pendingFractionZeros += 1 }
        } else if digit < 10 {
            for _ in 0...pendingZeros {
                let (times10, overflow) = digits.multipliedReportingOverflow(by: 10)
                if overflow { return invalid }
                digits = times10
            }
            let (sum, overflow) = digits.addingReportingOverflow(UInt64(digit))
            if overflow { return invalid }
            digits = sum
            fractionDigits += pendingFractionZeros + (inFraction ? 1 : 0)
            pendingZeros = 0
            pendingFractionZeros = 0
        } else {
            break
        }
        i += 1
    }
    let trailingIntegerZeros = pendingZeros - pendingFractionZeros
    var exponent = 0
    if i < text.count {
        i += 1
        var negativeExponent = false
        if text[i] == UInt8(ascii: "-") {
            negativeExponent = true
            i += 1
        } else if text[i] == UInt8(ascii: "+") {
            i += 1
        }
        while i < text.count {
            if exponent < 100_000 { exponent = exponent * 10 + Int(text[i] &- UInt8(ascii: "0")) }
            i += 1
        }
        if negativeExponent { exponent = -exponent }
    }
    exponent += trailingIntegerZeros - fractionDigits
    if exponent < 0 {
        for _ in 0..<min(-exponent, 40) { digits /= 10 }
    } else {
        for _ in 0..<exponent {
            let (times10, overflow) = digits.multipliedReportingOverflow(by: 10)
            if overflow { return invalid }
            digits = times10
        }
    }
    var result = _ParsedInteger(digits, negative: negative, valid: true)
    result.doubleMagnitude = magnitude
    result.positiveRangeOnly = true
    return result
}

/// Whether ±`magnitude` is representable in `I` (`-0` is 0, which every type holds).
@inline(__always)
func _fits<I: FixedWidthInteger>(_ type: I.Type, magnitude: UInt64, negative: Bool) -> Bool {
    let bits = I.bitWidth
    if negative {
        if magnitude == 0 { return true }
        return I.isSigned && magnitude <= UInt64(1) << (bits - 1)
    }
    if I.isSigned { return magnitude <= (UInt64(1) << (bits - 1)) - 1 }
    return bits >= 64 || magnitude <= (UInt64(1) << bits) - 1
}

/// Parses `text` as the nearest `Double`. Returns `nil` when the value overflows to infinity or
/// underflows to zero (as `JSONDecoder` does).
@inline(__always)
func _parseDouble(_ text: UnsafeBufferPointer<UInt8>, flags: UInt8) -> Double? {
    if flags & _Token.notInteger == 0 && text.count <= 16 {
        // At most 15 digits: exact in a Double.
        let negative = flags & _Token.negative != 0
        var i = negative ? 1 : 0
        var magnitude: UInt64 = 0
        while i < text.count {
            magnitude = magnitude &* 10 &+ UInt64(text[i] &- UInt8(ascii: "0"))
            i += 1
        }
        let value = Double(magnitude)
        return negative ? -value : value
    }
    // Most common: `-?digits.digits` without exponent, at most eight digits on either side (the
    // parser recorded where the '.' is): both runs at once, one correctly rounded division.
    let integerDigits = _Token.integerDigits(flags)
    if flags & _Token.hasExponent == 0 && integerDigits != 0 && integerDigits <= 8, let base = text.baseAddress {
        let sign = Int(flags & _Token.negative) &>> 1
        let fractionDigits = text.count &- sign &- integerDigits &- 1
        if fractionDigits <= 8 && fractionDigits >= 1 {
            let whole = _eightDigits(base + sign, integerDigits)
            let fraction = _eightDigits(base + sign + integerDigits + 1, fractionDigits)
            // At most 16 digits: below 2^53 unless all of them are used, so check.
            let mantissa = whole &* _powerOfTenInteger(fractionDigits) &+ fraction
            if mantissa < (1 << 53) {
                let value = Double(mantissa) / _exactPowerOfTen(fractionDigits)
                return sign != 0 ? -value : value
            }
        }
    }
    // Common case: `-?digits.digits` with at most 15 significant digits, no exponent.
    if text.count <= 17 {
        let negative = flags & _Token.negative != 0
        let n = text.count
        var i = negative ? 1 : 0
        var mantissa: UInt64 = 0
        // Integer digits, then fraction digits: two loops without a branch on '.' per digit.
        while i < n {
            let digit = text[i] &- UInt8(ascii: "0")
            if digit >= 10 { break }
            mantissa = mantissa &* 10 &+ UInt64(digit)
            i &+= 1
        }
        var decimals = 0
        if i < n && text[i] == UInt8(ascii: ".") {
            i &+= 1
            let fractionStart = i
            while i < n {
                let digit = text[i] &- UInt8(ascii: "0")
                if digit >= 10 { break }
                mantissa = mantissa &* 10 &+ UInt64(digit)
                i &+= 1
            }
            decimals = i &- fractionStart
        }
        // (At most 16 digits here, so `decimals` ≤ 16 and 10^decimals is exact.)
        if i == n && mantissa < (1 << 53) {
            let value = decimals > 0 ? Double(mantissa) / _exactPowerOfTen(decimals) : Double(mantissa)
            return negative ? -value : value
        }
    }
    let parts = _decimalParts(text)
    if !parts.truncated && parts.mantissa <= (1 << 53) && parts.exponent >= -22 && parts.exponent <= 22 {
        // Clinger's fast path: both operands exact, one correctly rounded operation.
        var value = Double(parts.mantissa)
        if parts.exponent < 0 {
            value /= _powersOfTen[-parts.exponent]
        } else {
            value *= _powersOfTen[parts.exponent]
        }
        return parts.negative ? -value : value
    }
    guard let value = Double(String(decoding: text, as: UTF8.self)), value.isFinite else { return nil }
    if value == 0 && parts.hasNonZeroDigit { return nil }
    return value
}

/// Parses `text` as the nearest `Float` (directly, not through `Double`, to avoid double rounding).
func _parseFloat(_ text: UnsafeBufferPointer<UInt8>, flags: UInt8) -> Float? {
    let parts = _decimalParts(text)
    if !parts.truncated && parts.mantissa <= (1 << 24) && parts.exponent >= -10 && parts.exponent <= 10 {
        var value = Float(parts.mantissa)
        if parts.exponent < 0 {
            value /= _powersOfTenFloat[-parts.exponent]
        } else {
            value *= _powersOfTenFloat[parts.exponent]
        }
        return parts.negative ? -value : value
    }
    guard let value = Float(String(decoding: text, as: UTF8.self)), value.isFinite else { return nil }
    if value == 0 && parts.hasNonZeroDigit { return nil }
    return value
}
