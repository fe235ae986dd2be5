import ProtocolCore
import Foundation

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
