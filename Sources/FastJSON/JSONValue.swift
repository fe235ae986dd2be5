/// Any JSON value, for decoding documents whose shape is not known in advance.
///
/// ```swift
/// let value = try FastJSONDecoder().decode(JSONValue.self, from: bytes)
/// if case .object(let members) = value, case .string(let name)? = members["name"] { … }
/// ```
///
/// Numbers are held as `Double` (so integers beyond ±2^53 lose precision, and numbers outside
/// `Double`'s range are rejected like `JSONDecoder` rejects them). Of duplicate object keys the first
/// wins. Encoding writes object members sorted by key, so output is deterministic. `JSONValue` works
/// with any `Encoder`/`Decoder`; with ``FastJSONDecoder`` it is built straight from the parsed input.
public enum JSONValue: Hashable, Sendable, Codable {
    /// `null`.
    case null
    /// `true` or `false`.
    case bool(Bool)
    /// A number.
    case number(Double)
    /// A string.
    case string(String)
    /// An array.
    case array([JSONValue])
    /// An object; the order of members is not kept.
    case object([String: JSONValue])

    /// Decodes any JSON value.
    public init(from decoder: any Decoder) throws {
        if let state = decoder as? _DecoderState {
            let core = state.core
            self = try core.pointee.buildValue(at: core.pointee.current, depth: core.pointee.currentDepth)
            return
        }
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    /// Encodes the value; object members are written in key order.
    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .null:
            var container = encoder.singleValueContainer()
            try container.encodeNil()
        case .bool(let value):
            var container = encoder.singleValueContainer()
            try container.encode(value)
        case .number(let value):
            var container = encoder.singleValueContainer()
            try container.encode(value)
        case .string(let value):
            var container = encoder.singleValueContainer()
            try container.encode(value)
        case .array(let values):
            var container = encoder.unkeyedContainer()
            for value in values { try container.encode(value) }
        case .object(let members):
            var container = encoder.container(keyedBy: _JSONKey.self)
            for key in members.keys.sorted() {
                try container.encode(members[key]!, forKey: _JSONKey(stringValue: key))
            }
        }
    }
}

extension _DecoderCore {
    /// Builds a ``JSONValue`` from the tape (depth is bounded by the parser's nesting limit).
    mutating func buildValue(at index: Int, depth: Int) throws -> JSONValue {
        let token = tokens[index]
        switch token.kind {
        case .null: return .null
        case .true: return .bool(true)
        case .false: return .bool(false)
        case .number: return .number(try decodeDouble(at: index, depth: depth, key: _NoKey()))
        case .string: return .string(makeString(token))
        case .array:
            var values: [JSONValue] = []
            values.reserveCapacity(Int(token.length))
            var i = index + 1
            let end = Int(token.next)
            while i < end {
                truncatePath(depth)
                path.append(_JSONKey(intValue: values.count))
                values.append(try buildValue(at: i, depth: depth + 1))
                i = Int(tokens[i].next)
            }
            truncatePath(depth)
            return .array(values)
        case .object:
            var members: [String: JSONValue] = Dictionary(minimumCapacity: Int(token.length))
            var i = index + 1
            let end = Int(token.next)
            while i < end {
                let key = makeString(tokens[i])
                if members[key] == nil {
                    truncatePath(depth)
                    path.append(_JSONKey(stringValue: key))
                    members[key] = try buildValue(at: i + 1, depth: depth + 1)
                }
                i = Int(tokens[i + 1].next)
            }
            truncatePath(depth)
            return .object(members)
        }
    }
}
