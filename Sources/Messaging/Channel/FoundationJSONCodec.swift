import ProtocolCore
import Foundation

/// JSON through Foundation's `JSONEncoder` / `JSONDecoder` (codec id 1).
///
/// By default keys are sorted, so the same value always produces the same bytes; pass
/// `sortedKeys: false` to skip the sorting (faster). One encoder and one decoder serve every message
/// (both are thread-safe): creating them per message costs about a microsecond.
public struct FoundationJSONCodec: MessageCodec {
    /// The JSON codec id, 1.
    public static let codecID: UInt8 = 1
    /// Always ``codecID`` (1).
    public var id: UInt8 { Self.codecID }

    private let encoder: JSONEncoder
    private let decoder = JSONDecoder()

    /// Creates the codec.
    /// - Parameter sortedKeys: Sort object keys (deterministic bytes; default) or keep the order of
    ///   the `Encodable` implementation.
    public init(sortedKeys: Bool = true) {
        encoder = JSONEncoder()
        encoder.outputFormatting = sortedKeys ? [.sortedKeys, .withoutEscapingSlashes] : [.withoutEscapingSlashes]
    }

    /// Encodes `value` as JSON (no slash escaping).
    public func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        [UInt8](try encoder.encode(value))
    }

    /// Decodes JSON into `type`.
    public func decode<T: Decodable>(_ type: T.Type, from bytes: UnsafeRawBufferPointer) throws -> T {
        try decoder.decode(type, from: Data(bytes))
    }
}
