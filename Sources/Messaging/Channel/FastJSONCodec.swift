import FastJSON
import ProtocolCore
import Transport

/// The messaging layer's default JSON codec (codec id 1): FastJSON, about 10× faster than
/// Foundation's JSONEncoder/JSONDecoder on small messages, with the same JSON on the wire — any JSON
/// library (and ``FoundationJSONCodec``) decodes what it sends. Select Foundation's instead with
/// `configuration.channel.codecs = CodecRegistry(sendCodec: FoundationJSONCodec())`.
public struct FastJSONCodec: MessageCodec {
    private let encoder = FastJSONEncoder()
    private let decoder = FastJSONDecoder()

    /// The codec (one encoder and one decoder, reused).
    public init() {}

    /// `WireProtocol.jsonCodecID` (1).
    public var id: UInt8 { WireProtocol.jsonCodecID }

    /// Encodes `value` as JSON (keys in declaration order).
    public func encode<T: Encodable>(_ value: T) throws -> [UInt8] {
        try encoder.encode(value)
    }

    /// Decodes a `T` from JSON bytes.
    public func decode<T: Decodable>(_ type: T.Type, from bytes: UnsafeRawBufferPointer) throws -> T {
        try decoder.decode(type, from: bytes)
    }
}

extension CodecRegistry {
    /// The messaging layer's default: FastJSON for sending and receiving JSON (codec id 1).
    public static var messagingDefault: CodecRegistry { CodecRegistry(sendCodec: FastJSONCodec()) }
}
