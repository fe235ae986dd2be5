import ProtocolCore
import Transport

/// Where a one-way message goes, decided in one place for the server's connections and the client
/// (issue 46, 3): into its message session — kept until the peer acknowledges it, sent now or when
/// the peer resumes — or straight onto its channel. ``ServerConnection`` and ``MessageClient`` each
/// pick their route (a session when there is one in use) and send through it; none of their send
/// methods decides on its own.
enum OutboundRoute: Sendable {
    case session(MessageSession)
    case channel(MessageChannel)

    /// Encodes `value` with `codec` and sends it.
    func send<T: Encodable>(_ value: T, type: String, codec: any MessageCodec) async throws {
        try await send(try Self.encode(value, type: type, codec: codec), codecID: codec.id, type: type)
    }

    /// Sends a message already encoded with the codec `codecID` (a broadcast encodes once).
    func send(_ payload: [UInt8], codecID: UInt8, type: String) async throws {
        switch self {
        case .session(let session):
            try await session.send(Frame(kind: .message, codecID: codecID, typeID: type, payload: payload))
        case .channel(let channel):
            try await channel.sendEncoded(payload, codecID: codecID, type: type)
        }
    }

    /// Sends several messages of one type in order, with one hand-off: the channel's batch
    /// (``MessageChannel/send(contentsOf:type:)``), or the session's (all encoded before the first
    /// is kept; one sync for the batch).
    func send<T: Encodable>(contentsOf values: some Sequence<T>, type: String, codec: any MessageCodec) async throws {
        switch self {
        case .session(let session):
            try await session.send(
                contentsOf: values.map {
                    Frame(kind: .message, codecID: codec.id, typeID: type, payload: try Self.encode($0, type: type, codec: codec))
                })
        case .channel(let channel):
            try await channel.send(contentsOf: values, type: type)
        }
    }

    /// `value`'s payload, or the error every send reports for a value that does not encode.
    static func encode<T: Encodable>(_ value: T, type: String, codec: any MessageCodec) throws(TransportError) -> [UInt8] {
        do {
            return try codec.encode(value)
        } catch {
            throw TransportError(.encodingFailed, "could not encode \(T.self) for message '\(type)': \(error)")
        }
    }
}
