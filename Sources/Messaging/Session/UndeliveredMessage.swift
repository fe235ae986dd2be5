import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// A one-way message that was sent in a message session but never acknowledged by the peer: the
/// session could not be resumed (the peer restarted or its grace period expired) or ended, so the
/// message may or may not have reached the peer's app. Never sent again by the library.
public struct UndeliveredMessage: Sendable, CustomStringConvertible {
    /// Its number in the session (1 = the session's first one-way message).
    public let number: UInt64
    /// Its type id.
    public let typeID: String
    /// Its codec id (1 = JSON).
    public let codecID: UInt8
    /// Its encoded payload.
    public let payload: [UInt8]
    /// Whether it went out on a connection at least once (false: it never left this process).
    public let wasTransmitted: Bool

    /// Decodes a JSON payload (codec 1, the default).
    /// - Throws: `TransportError.Code.decodingFailed` for another codec (read ``payload``), or what
    ///   the JSON decoder throws.
    public func decode<T: Decodable>(_: T.Type = T.self) throws -> T {
        guard codecID == WireProtocol.jsonCodecID else {
            throw TransportError(
                .decodingFailed, "undelivered message '\(typeID)' #\(number) carries codec \(codecID), not JSON; read `payload`")
        }
        return try payload.withUnsafeBytes { try FastJSONCodec().decode(T.self, from: $0) }
    }

    public var description: String { "#\(number) '\(typeID)' (\(payload.count) bytes)" }
}
