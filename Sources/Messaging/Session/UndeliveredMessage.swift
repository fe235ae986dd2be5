import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// A one-way message that was sent in a message session but never acknowledged by the peer: the
/// session could not be resumed (the peer restarted or its grace period expired) or ended, so the
/// message may or may not have reached the peer's app. Never sent again by the library. With a
/// ``SessionStore`` its report stays in the store until the app took it (the events loop asked for
/// the next event), and a process that died before makes it again (<doc:MessageSessions>).
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
    /// With a session store: the report it is part of, kept in the store until the app took it.
    let report: ReportToken?

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

/// A report of undelivered messages kept in the session store (``Journal/Record/reported(_:_:)``)
/// until the app took it: the events loop that got the ``ClientEvent/undelivered(_:)`` or
/// ``ServerEvent/undelivered(_:_:)`` asked for the next event. A process that dies before makes
/// the report again when it opens the store (``SessionJournal/pendingReports``). One per event.
final class ReportToken: Sendable {
    let store: SessionJournal
    let key: Journal.Key
    let id: UInt64
    private let done = Atomic<Bool>(false)

    init(store: SessionJournal, key: Journal.Key, id: UInt64) {
        self.store = store
        self.key = key
        self.id = id
    }

    /// The app took the report: its messages leave the store (the first call only). Not synced
    /// on its own: a crash that loses the record makes the report once more.
    func taken() {
        guard !done.exchange(true, ordering: .acquiringAndReleasing) else { return }
        store.enqueue([.reportTaken(key, report: id)])
        store.write()
    }
}

extension SessionJournal {
    /// The reports an earlier process made and its app never took, each with its way back here:
    /// made again, first, by the server or client that opened the store.
    func reportsToMakeAgain() -> [(report: Journal.Report, messages: [UndeliveredMessage])] {
        pendingReports.map { report in
            let token = ReportToken(store: self, key: report.key, id: report.id)
            return (
                report,
                report.messages.map {
                    UndeliveredMessage(
                        number: $0.number, typeID: $0.typeID, codecID: $0.codecID, payload: $0.payload,
                        wasTransmitted: $0.transmitted, report: token)
                }
            )
        }
    }
}
