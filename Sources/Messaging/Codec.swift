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

/// The codecs a channel can use: one for sending, any number for receiving (looked up by id).
///
/// One reference wide: every ``IncomingMessage`` carries its channel's registry, and copying a
/// message then costs one retain, not an existential's and a dictionary's.
public struct CodecRegistry: Sendable {
    private final class Storage: Sendable {
        let sendCodec: any MessageCodec
        let byID: [UInt8: any MessageCodec]
        init(sendCodec: any MessageCodec, byID: [UInt8: any MessageCodec]) {
            self.sendCodec = sendCodec
            self.byID = byID
        }
    }
    private var storage: Storage

    /// The codec used by ``MessageChannel/send(_:type:)`` and friends.
    public var sendCodec: any MessageCodec {
        get { storage.sendCodec }
        set { storage = Storage(sendCodec: newValue, byID: storage.byID) }
    }

    /// Creates a registry with `sendCodec` plus any additional decoders.
    public init(sendCodec: any MessageCodec = FoundationJSONCodec(), additional: [any MessageCodec] = []) {
        var map: [UInt8: any MessageCodec] = [:]
        for codec in additional { map[codec.id] = codec }
        map[sendCodec.id] = sendCodec
        storage = Storage(sendCodec: sendCodec, byID: map)
    }

    /// The codec for an id, if known.
    public func codec(for id: UInt8) -> (any MessageCodec)? { storage.byID[id] }
}
