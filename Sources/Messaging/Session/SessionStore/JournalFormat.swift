import ProtocolCore

/// The session store's file, without I/O: its header and its records. Format version 2 (version 1
/// is read and rewritten as 2); <doc:MessageSessions> ("The store on disk") describes it for
/// people, ``Journal/scan(_:)`` says how a file's bytes are read back after a crash.
///
/// ```
/// header   "LANMSGSJ"  version u16  role u8  identity-length u8  identity  salt u64  crc32c u32
/// record   length u32  synced u64  header-check u32  body-check u32  body (length bytes)
/// body     kind u8  session u128  epoch u32  fields of the kind
/// ```
/// Integers are big-endian. `header-check` is the CRC-32C of the length and `synced`, `body-check`
/// the CRC-32C of the body, each XORed with one half of the file's random salt — so a record is
/// valid only in the file it was written for (a compaction's new file has a new salt; bytes that
/// happen to look like a record, in a payload or left by an older file, do not check). `synced`
/// is where the file had been synced to (`fdatasync`) when the record was written: what recovery
/// needs to tell bytes that never reached the disk whole from damage to bytes that did.
enum Journal {
    static let magic: [UInt8] = Array("LANMSGSJ".utf8)
    /// The version written; 1 and 2 are read too (and the file rewritten in this one). 3: a session
    /// that begins again writes the messages it carries over before its *session* record, and they
    /// apply only with it (``Journal/Staged``) — a reader of version 2 would drop them, so it must
    /// refuse such a file. 4: messages reported undelivered are kept until the app took the report
    /// (``Record/reported(_:_:)``, ``Record/reportTaken(_:report:)``) — a reader of version 3 would
    /// call those records damage.
    static let version: UInt16 = 4
    /// Bytes before a record's body.
    static let recordHeaderSize = 20
    /// Version 1's record header: length, its check, the body's check.
    static let v1RecordHeaderSize = 12
    /// A record longer than this is damage (a message is at most a frame: 16 MiB by default).
    static let maxRecordLength = 1 << 28

    /// Whose sessions a store holds.
    enum Role: UInt8, Sendable, CustomStringConvertible {
        case server = 1, client = 2
        var description: String { self == .server ? "a server's" : "a client's" }
    }

    struct Header: Equatable, Sendable {
        var role: Role
        /// The key of the process that keeps it (its full fingerprint), or `plaintext`.
        var identity: String
        /// Random per file (0 in a version-1 file, whose checks are not salted).
        var salt: UInt64 = 0
        var version: UInt16 = Journal.version

        /// A new file's header, with a random salt whose halves no zeros can match.
        static func fresh(role: Role, identity: String) -> Header {
            var salt = UInt64.random(in: 1...UInt64.max)
            while UInt32(truncatingIfNeeded: salt) == zeroCheck || UInt32(truncatingIfNeeded: salt >> 32) == 0 {
                salt = UInt64.random(in: 1...UInt64.max)
            }
            return Header(role: role, identity: identity, salt: salt)
        }

        /// The CRC-32C of a record header's first twelve bytes when they are zeros.
        private static let zeroCheck = CRC32C.checksum([UInt8](repeating: 0, count: 12))

        /// The header as written (``Journal/version``).
        var encoded: [UInt8] {
            var bytes = Journal.magic
            bytes.appendInteger(Journal.version)
            bytes.append(role.rawValue)
            let name = Array(identity.utf8.prefix(255))
            bytes.append(UInt8(name.count))
            bytes += name
            bytes.appendInteger(salt)
            bytes.appendInteger(CRC32C.checksum(bytes))
            return bytes
        }

        var headerCheckSalt: UInt32 { UInt32(truncatingIfNeeded: salt) }
        var bodyCheckSalt: UInt32 { UInt32(truncatingIfNeeded: salt >> 32) }
    }

    /// A session id (16 bytes; 32 hex digits on the wire and in the app's view).
    struct Key: Hashable, Sendable, CustomStringConvertible {
        let high: UInt64, low: UInt64

        init(high: UInt64, low: UInt64) {
            self.high = high
            self.low = low
        }

        /// From 32 hex digits; nil for anything else.
        init?(hex: String) {
            guard let bytes = Hex.decode(hex), bytes.count == 16 else { return nil }
            high = bytes[0..<8].reduce(0) { $0 << 8 | UInt64($1) }
            low = bytes[8..<16].reduce(0) { $0 << 8 | UInt64($1) }
        }

        /// A fresh random key.
        static func random() -> Key { Key(high: .random(in: 0...UInt64.max), low: .random(in: 0...UInt64.max)) }

        var hex: String {
            var bytes: [UInt8] = []
            bytes.appendInteger(high)
            bytes.appendInteger(low)
            return Hex.encode(bytes)
        }

        var description: String { String(hex.prefix(8)) + "…" }
    }

    /// Everything a store knows of a session apart from its kept messages: written when the session
    /// begins or begins again (a new epoch), and for each live session when the file is compacted.
    struct Snapshot: Equatable, Sendable {
        var key: Key
        /// ``SessionPosition/session`` of the messages it received in this epoch (a server's: the
        /// epoch's token on the wire too).
        var positionID: Key
        /// The key that opened it (the client's full fingerprint; a server's store), if any.
        var owner: String?
        /// A connection carried it (its messages may have been transmitted).
        var everConnected = false
        /// The number the next message it sends gets.
        var nextNumber: UInt64 = 1
        /// The peer acknowledged every message it sent up to this number.
        var acknowledged: UInt64 = 0
        /// It handled (and acknowledged, or may) every message it received up to this number.
        var handled: UInt64 = 0
        /// Counts the times the session began on this side: records of another epoch never apply.
        var epoch: UInt32 = 0
        /// A client's: the server's token for this epoch (its SESSION answer's `epoch`), if it sent one.
        var peerEpoch: Key?
    }

    /// A message the app was told of as undelivered (``UndeliveredMessage``), kept until the app
    /// took that report: a process that dies first makes the report again when it starts.
    struct Reported: Equatable, Sendable {
        /// The report it belongs to (random, nonzero; one per event).
        var report: UInt64
        /// The key of the session's peer, as the session's snapshot names it (a server's), if any.
        var owner: String?
        /// Written with the records that drop the message (a session's): it applies only when the
        /// session's next *session* or *ended* record follows in the file, as carried messages do
        /// (``Journal/Staged``) — a crash that keeps the report without them leaves the message in
        /// its session, not in both. A compaction writes reports that apply on their own.
        var staged = false
        var number: UInt64
        var transmitted: Bool
        var codecID: UInt8
        var typeID: String
        var payload: [UInt8]
    }

    enum Record: Equatable, Sendable {
        /// A session begins, or begins again (what the store had of it before is void).
        case session(Snapshot)
        /// A message it sent, kept until the peer acknowledges it.
        case message(Key, epoch: UInt32, number: UInt64, codecID: UInt8, typeID: String, payload: [UInt8])
        /// The peer acknowledged its messages up to this number.
        case released(Key, epoch: UInt32, through: UInt64)
        /// It handled the messages it received up to this number.
        case handled(Key, epoch: UInt32, through: UInt64)
        /// A connection carries it (from now on its messages may be transmitted).
        case connected(Key, epoch: UInt32)
        /// It ended: nothing of it is kept (whatever its epoch).
        case ended(Key)
        /// A message of the session reported undelivered, kept until its report is taken — also
        /// after the session began again or ended (written before the record that drops the
        /// message, so that no crash loses both the message and its report). Version 4.
        case reported(Key, Reported)
        /// The app took the report (its events loop asked for the next event): its messages go.
        case reportTaken(Key, report: UInt64)

        enum Kind: UInt8 { case session = 1, message, released, handled, connected, ended, reported, reportTaken }

        var key: Key {
            switch self {
            case .session(let snapshot): snapshot.key
            case .message(let key, _, _, _, _, _), .released(let key, _, _), .handled(let key, _, _), .connected(let key, _),
                .ended(let key), .reported(let key, _), .reportTaken(let key, _):
                key
            }
        }

        var epoch: UInt32 {
            switch self {
            case .session(let snapshot): snapshot.epoch
            case .message(_, let epoch, _, _, _, _), .released(_, let epoch, _), .handled(_, let epoch, _), .connected(_, let epoch):
                epoch
            case .ended, .reported, .reportTaken: 0
            }
        }

        /// Appends the record (header and body) to `bytes`, checked with `header`'s salt; `synced`:
        /// the file is on the disk up to this offset.
        func encode(into bytes: inout [UInt8], header: Header, synced: Int) {
            let start = bytes.count
            bytes.append(contentsOf: repeatElement(0, count: Journal.recordHeaderSize))
            let body = bytes.count
            func key(_ key: Key) {
                bytes.appendInteger(key.high)
                bytes.appendInteger(key.low)
            }
            bytes.append(kind.rawValue)
            key(self.key)
            bytes.appendInteger(epoch)
            switch self {
            case .session(let snapshot):
                key(snapshot.positionID)
                let flags: UInt8 = (snapshot.everConnected ? 1 : 0) | (snapshot.owner != nil ? 2 : 0) | (snapshot.peerEpoch != nil ? 4 : 0)
                bytes.append(flags)
                bytes.appendInteger(snapshot.nextNumber)
                bytes.appendInteger(snapshot.acknowledged)
                bytes.appendInteger(snapshot.handled)
                let owner = Array((snapshot.owner ?? "").utf8.prefix(255))
                bytes.append(UInt8(owner.count))
                bytes += owner
                if let peer = snapshot.peerEpoch { key(peer) }
            case .message(_, _, let number, let codecID, let typeID, let payload):
                bytes.appendInteger(number)
                bytes.append(codecID)
                let type = Array(typeID.utf8.prefix(Int(UInt16.max)))
                bytes.appendInteger(UInt16(type.count))
                bytes += type
                bytes += payload
            case .released(_, _, let through), .handled(_, _, let through):
                bytes.appendInteger(through)
            case .connected, .ended:
                break
            case .reported(_, let reported):
                bytes.appendInteger(reported.report)
                bytes.append((reported.transmitted ? 1 : 0) | (reported.owner != nil ? 2 : 0) | (reported.staged ? 4 : 0))
                let owner = Array((reported.owner ?? "").utf8.prefix(255))
                bytes.append(UInt8(owner.count))
                bytes += owner
                bytes.appendInteger(reported.number)
                bytes.append(reported.codecID)
                let type = Array(reported.typeID.utf8.prefix(Int(UInt16.max)))
                bytes.appendInteger(UInt16(type.count))
                bytes += type
                bytes += reported.payload
            case .reportTaken(_, let report):
                bytes.appendInteger(report)
            }
            let length = UInt32(bytes.count - body)
            bytes.withUnsafeMutableBytes { raw in
                raw.storeBytes(of: length.bigEndian, toByteOffset: start, as: UInt32.self)
                raw.storeBytes(of: UInt64(synced).bigEndian, toByteOffset: start + 4, as: UInt64.self)
                Journal.seal(raw, at: start, header: header)
                let bodyCheck = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: raw[body...])) ^ header.bodyCheckSalt
                raw.storeBytes(of: bodyCheck.bigEndian, toByteOffset: start + 16, as: UInt32.self)
            }
        }

        private var kind: Kind {
            switch self {
            case .session: .session
            case .message: .message
            case .released: .released
            case .handled: .handled
            case .connected: .connected
            case .ended: .ended
            case .reported: .reported
            case .reportTaken: .reportTaken
            }
        }

        /// Parses a body of version 2 or later whose check matched; nil when it does not parse.
        static func decode(_ body: UnsafeRawBufferPointer) -> Record? {
            var reader = ByteReader(body)
            guard let raw = reader.byte(), let kind = Kind(rawValue: raw), let id = reader.key(),
                let epoch = reader.integer(UInt32.self)
            else { return nil }
            let record: Record
            switch kind {
            case .session:
                guard let position = reader.key(), let flags = reader.byte(), flags <= 7, let next = reader.integer(UInt64.self),
                    let acknowledged = reader.integer(UInt64.self), let handled = reader.integer(UInt64.self),
                    let ownerLength = reader.byte(), let owner = reader.bytes(Int(ownerLength)), next >= 1, acknowledged < next
                else { return nil }
                var peer: Key?
                if flags & 4 != 0 {
                    guard let token = reader.key() else { return nil }
                    peer = token
                }
                guard flags & 2 != 0 || ownerLength == 0 else { return nil }
                record = .session(
                    Snapshot(
                        key: id, positionID: position, owner: flags & 2 != 0 ? String(decoding: owner, as: UTF8.self) : nil,
                        everConnected: flags & 1 != 0, nextNumber: next, acknowledged: acknowledged, handled: handled,
                        epoch: epoch, peerEpoch: peer))
            case .message:
                guard let number = reader.integer(UInt64.self), let codec = reader.byte(),
                    let typeLength = reader.integer(UInt16.self), let type = reader.bytes(Int(typeLength))
                else { return nil }
                let typeID = String(decoding: type, as: UTF8.self)
                guard Array(typeID.utf8) == type else { return nil }
                record = .message(id, epoch: epoch, number: number, codecID: codec, typeID: typeID, payload: reader.rest())
            case .released:
                guard let through = reader.integer(UInt64.self) else { return nil }
                record = .released(id, epoch: epoch, through: through)
            case .handled:
                guard let through = reader.integer(UInt64.self) else { return nil }
                record = .handled(id, epoch: epoch, through: through)
            case .connected:
                record = .connected(id, epoch: epoch)
            case .ended:
                record = .ended(id)
            case .reported:
                guard epoch == 0, let report = reader.integer(UInt64.self), report != 0, let flags = reader.byte(), flags <= 7,
                    let ownerLength = reader.byte(), let owner = reader.bytes(Int(ownerLength)),
                    flags & 2 != 0 || ownerLength == 0, let number = reader.integer(UInt64.self), let codec = reader.byte(),
                    let typeLength = reader.integer(UInt16.self), let type = reader.bytes(Int(typeLength))
                else { return nil }
                let typeID = String(decoding: type, as: UTF8.self)
                guard Array(typeID.utf8) == type else { return nil }
                record = .reported(
                    id,
                    Reported(
                        report: report, owner: flags & 2 != 0 ? String(decoding: owner, as: UTF8.self) : nil,
                        staged: flags & 4 != 0, number: number, transmitted: flags & 1 != 0, codecID: codec, typeID: typeID,
                        payload: reader.rest()))
            case .reportTaken:
                guard epoch == 0, let report = reader.integer(UInt64.self), report != 0 else { return nil }
                record = .reportTaken(id, report: report)
            }
            return kind == .message || kind == .reported || reader.isAtEnd ? record : nil
        }

        /// Parses a version-1 body (no epoch: every record is of epoch 0).
        static func decodeVersion1(_ body: UnsafeRawBufferPointer) -> Record? {
            var reader = ByteReader(body)
            guard let raw = reader.byte(), let kind = Kind(rawValue: raw), let id = reader.key() else { return nil }
            let record: Record
            switch kind {
            case .session:
                guard let position = reader.key(), let flags = reader.byte(), flags <= 1, let next = reader.integer(UInt64.self),
                    let acknowledged = reader.integer(UInt64.self), let handled = reader.integer(UInt64.self),
                    let hasOwner = reader.byte(), hasOwner <= 1, let ownerLength = reader.byte(),
                    let owner = reader.bytes(Int(ownerLength)), next >= 1, acknowledged < next
                else { return nil }
                record = .session(
                    Snapshot(
                        key: id, positionID: position, owner: hasOwner == 1 ? String(decoding: owner, as: UTF8.self) : nil,
                        everConnected: flags == 1, nextNumber: next, acknowledged: acknowledged, handled: handled))
            case .message:
                guard let number = reader.integer(UInt64.self), let codec = reader.byte(),
                    let typeLength = reader.integer(UInt16.self), let type = reader.bytes(Int(typeLength))
                else { return nil }
                let typeID = String(decoding: type, as: UTF8.self)
                guard Array(typeID.utf8) == type else { return nil }
                record = .message(id, epoch: 0, number: number, codecID: codec, typeID: typeID, payload: reader.rest())
            case .released:
                guard let through = reader.integer(UInt64.self) else { return nil }
                record = .released(id, epoch: 0, through: through)
            case .handled:
                guard let through = reader.integer(UInt64.self) else { return nil }
                record = .handled(id, epoch: 0, through: through)
            case .connected:
                record = .connected(id, epoch: 0)
            case .ended:
                record = .ended(id)
            case .reported, .reportTaken:
                return nil  // (version 4's)
            }
            return kind == .message || reader.isAtEnd ? record : nil
        }
    }

    /// Writes the header check of the record at `start` (length and `synced` in place).
    static func seal(_ raw: UnsafeMutableRawBufferPointer, at start: Int, header: Header) {
        let check = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: raw[start..<start + 12])) ^ header.headerCheckSalt
        raw.storeBytes(of: check.bigEndian, toByteOffset: start + 12, as: UInt32.self)
    }

    /// A record copied from a file with header `old` into one with header `new` (a compaction): its
    /// `synced` set to `synced`, its checks salted for the new file. The body (and its checksum) is
    /// not read again: only the salt of the body's check changes.
    static func reseal(_ raw: UnsafeMutableRawBufferPointer, at start: Int, from old: Header, to new: Header, synced: Int) {
        raw.storeBytes(of: UInt64(synced).bigEndian, toByteOffset: start + 4, as: UInt64.self)
        seal(raw, at: start, header: new)
        let bodyCheck = UInt32(bigEndian: raw.loadUnaligned(fromByteOffset: start + 16, as: UInt32.self))
        raw.storeBytes(
            of: (bodyCheck ^ old.bodyCheckSalt ^ new.bodyCheckSalt).bigEndian, toByteOffset: start + 16, as: UInt32.self)
    }
}

/// Reads big-endian fields from a buffer, nil past its end.
struct ByteReader {
    let bytes: UnsafeRawBufferPointer
    private(set) var offset = 0

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    var isAtEnd: Bool { offset == bytes.count }

    mutating func byte() -> UInt8? {
        guard offset < bytes.count else { return nil }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
        guard bytes.count - offset >= MemoryLayout<T>.size else { return nil }
        defer { offset += MemoryLayout<T>.size }
        return T(bigEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
    }

    mutating func key() -> Journal.Key? {
        guard let high = integer(UInt64.self), let low = integer(UInt64.self) else { return nil }
        return Journal.Key(high: high, low: low)
    }

    mutating func bytes(_ count: Int) -> [UInt8]? {
        guard bytes.count - offset >= count else { return nil }
        defer { offset += count }
        return Array(UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + count]))
    }

    mutating func rest() -> [UInt8] {
        defer { offset = bytes.count }
        return Array(UnsafeRawBufferPointer(rebasing: bytes[offset...]))
    }
}

extension Array where Element == UInt8 {
    /// Appends `value` big-endian.
    mutating func appendInteger<T: FixedWidthInteger>(_ value: T) {
        var big = value.bigEndian
        Swift.withUnsafeBytes(of: &big) { append(contentsOf: $0) }
    }
}
