import ProtocolCore
import Foundation

/// Encodes and decodes message payloads. The ``id`` travels in every MESSAGE frame.
///
/// Codec ids: 0 raw bytes (built in, no codec object), 1 JSON; other values are free for apps.
/// A faster JSON implementation may replace ``FoundationJSONCodec`` as long as it keeps id 1 and
/// produces JSON that any JSON decoder accepts.
public protocol MessageCodec: Sendable {
    /// The codec id written into frames.
    var id: UInt8 { get }
    /// Encodes `value` into payload bytes.
    func encode<T: Encodable>(_ value: T) throws -> [UInt8]
    /// Decodes a value of type `type` from payload bytes.
    func decode<T: Decodable>(_ type: T.Type, from bytes: UnsafeRawBufferPointer) throws -> T
}
