import ProtocolCore

/// The session store's file, without I/O: its header, its records, and how a file's bytes are read
/// back after a crash (``scan(_:)``). Format version 1; <doc:MessageSessions> ("The store on disk")
/// describes it for people.
///
/// ```
/// header   "LANMSGSJ"  version u16  role u8  identity-length u8  identity  crc32c u32
/// record   length u32  crc32c(length) u32  crc32c(body) u32  body (length bytes: kind u8, fields)
/// ```
/// Integers are big-endian. Each record's length has a checksum of its own, so that a flipped bit
/// in a length is told apart from a record cut short by a crash:
/// - the file ends inside a record (its header, or the body its checked length announces): a
///   write interrupted by a crash — the torn tail is cut, every complete record before it kept;
/// - a complete record whose length check or body checksum fails, or whose body does not parse:
///   damage — the store is refused, never silently reset.
enum Journal {
    static let magic: [UInt8] = Array("LANMSGSJ".utf8)
    static let version: UInt16 = 1
    /// Bytes before a record's body.
    static let recordHeaderSize = 12
    /// A record longer than this is damage (a message is at most a frame: 16 MiB by default).
    static let maxRecordLength = 1 << 28

    /// Whose sessions a store holds.
    enum Role: UInt8, Sendable, CustomStringConvertible {
        case server = 1, client = 2
        var description: String { self == .server ? "a server's" : "a client's" }
    }

    struct Header: Equatable, Sendable {
        var role: Role
        /// The key of the process that keeps it (its short fingerprint), or `plaintext`.
        var identity: String

        var encoded: [UInt8] {
            var bytes = Journal.magic
            bytes.appendInteger(Journal.version)
            bytes.append(role.rawValue)
            let name = Array(identity.utf8.prefix(255))
            bytes.append(UInt8(name.count))
            bytes += name
            bytes.appendInteger(CRC32C.checksum(bytes))
            return bytes
        }
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

        var hex: String {
            var bytes: [UInt8] = []
            bytes.appendInteger(high)
            bytes.appendInteger(low)
            return Hex.encode(bytes)
        }

        var description: String { String(hex.prefix(8)) + "…" }
    }

    /// Everything a store knows of a session apart from its kept messages: written when the session
    /// begins or begins again, and for each live session when the file is compacted.
    struct Snapshot: Equatable, Sendable {
        var key: Key
        /// ``SessionPosition/session`` of the messages it received in this epoch.
        var positionID: Key
        /// The key that opened it (the client's short fingerprint; a server's store), if any.
        var owner: String?
        /// A connection carried it (its messages may have been transmitted).
        var everConnected = false
        /// The number the next message it sends gets.
        var nextNumber: UInt64 = 1
        /// The peer acknowledged every message it sent up to this number.
        var acknowledged: UInt64 = 0
        /// It handled (and acknowledged, or may) every message it received up to this number.
        var handled: UInt64 = 0
    }

    enum Record: Equatable, Sendable {
        /// A session begins, or begins again (what the store had of it before is void).
        case session(Snapshot)
        /// A message it sent, kept until the peer acknowledges it.
        case message(Key, number: UInt64, codecID: UInt8, typeID: String, payload: [UInt8])
        /// The peer acknowledged its messages up to this number.
        case released(Key, through: UInt64)
        /// It handled the messages it received up to this number.
        case handled(Key, through: UInt64)
        /// A connection carries it (from now on its messages may be transmitted).
        case connected(Key)
        /// It ended: nothing of it is kept.
        case ended(Key)

        enum Kind: UInt8 { case session = 1, message, released, handled, connected, ended }

        var key: Key {
            switch self {
            case .session(let snapshot): snapshot.key
            case .message(let key, _, _, _, _), .released(let key, _), .handled(let key, _), .connected(let key), .ended(let key): key
            }
        }

        /// Appends the record (header and body) to `bytes`.
        func encode(into bytes: inout [UInt8]) {
            let start = bytes.count
            bytes.append(contentsOf: repeatElement(0, count: Journal.recordHeaderSize))
            let body = bytes.count
            func key(_ key: Key) {
                bytes.appendInteger(key.high)
                bytes.appendInteger(key.low)
            }
            switch self {
            case .session(let snapshot):
                bytes.append(Kind.session.rawValue)
                key(snapshot.key)
                key(snapshot.positionID)
                bytes.append(snapshot.everConnected ? 1 : 0)
                bytes.appendInteger(snapshot.nextNumber)
                bytes.appendInteger(snapshot.acknowledged)
                bytes.appendInteger(snapshot.handled)
                let owner = Array((snapshot.owner ?? "").utf8.prefix(255))
                bytes.append(snapshot.owner == nil ? 0 : 1)
                bytes.append(UInt8(owner.count))
                bytes += owner
            case .message(let id, let number, let codecID, let typeID, let payload):
                bytes.append(Kind.message.rawValue)
                key(id)
                bytes.appendInteger(number)
                bytes.append(codecID)
                let type = Array(typeID.utf8)
                bytes.appendInteger(UInt16(clamping: type.count))
                bytes += type.prefix(Int(UInt16.max))
                bytes += payload
            case .released(let id, let through):
                bytes.append(Kind.released.rawValue)
                key(id)
                bytes.appendInteger(through)
            case .handled(let id, let through):
                bytes.append(Kind.handled.rawValue)
                key(id)
                bytes.appendInteger(through)
            case .connected(let id):
                bytes.append(Kind.connected.rawValue)
                key(id)
            case .ended(let id):
                bytes.append(Kind.ended.rawValue)
                key(id)
            }
            let length = UInt32(bytes.count - body)
            bytes.withUnsafeMutableBytes { raw in
                raw.storeBytes(of: length.bigEndian, toByteOffset: start, as: UInt32.self)
                let lengthCheck = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: raw[start..<start + 4]))
                raw.storeBytes(of: lengthCheck.bigEndian, toByteOffset: start + 4, as: UInt32.self)
                let bodyCheck = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: raw[body...]))
                raw.storeBytes(of: bodyCheck.bigEndian, toByteOffset: start + 8, as: UInt32.self)
            }
        }

        /// Parses a body whose checksum matched; nil when it does not parse.
        static func decode(_ body: UnsafeRawBufferPointer) -> Record? {
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
                record = .message(id, number: number, codecID: codec, typeID: typeID, payload: reader.rest())
            case .released:
                guard let through = reader.integer(UInt64.self) else { return nil }
                record = .released(id, through: through)
            case .handled:
                guard let through = reader.integer(UInt64.self) else { return nil }
                record = .handled(id, through: through)
            case .connected:
                record = .connected(id)
            case .ended:
                record = .ended(id)
            }
            return kind == .message || reader.isAtEnd ? record : nil
        }
    }

    /// What a file's bytes hold.
    struct Scan: Sendable {
        var header: Header
        /// Where the records start.
        var headerSize: Int
        /// Each complete record and where it lies.
        var records: [(record: Record, offset: Int, length: Int)]
        /// The end of the last complete record: the file is cut here.
        var end: Int
        /// Bytes of a torn last record after ``end`` (0: none).
        var torn: Int
    }

    /// Why a file's bytes cannot be used (never a torn tail: that is cut).
    enum Damage: Error, Equatable, Sendable {
        /// It does not start with the magic: not a session store's file.
        case notAJournal
        /// Written by another format version.
        case otherVersion(UInt16)
        /// The header is cut short or its checksum fails.
        case damagedHeader(String)
        /// A complete record at `offset` fails its checks.
        case damagedRecord(offset: Int, String)
    }

    /// Reads a whole file: its header and every complete record; a record cut short at the end is
    /// reported (``Scan/torn``), any other damage is a ``Damage``.
    static func scan(_ bytes: UnsafeRawBufferPointer) -> Result<Scan, Damage> {
        guard bytes.count >= magic.count + 5 else {
            return bytes.starts(with: magic.prefix(bytes.count)) && bytes.count > 0 || bytes.isEmpty
                ? .failure(.damagedHeader("the file is \(bytes.count) bytes long, shorter than a header (it was cut short)"))
                : .failure(.notAJournal)
        }
        guard bytes.starts(with: magic) else { return .failure(.notAJournal) }
        var reader = ByteReader(UnsafeRawBufferPointer(rebasing: bytes[magic.count...]))
        guard let version = reader.integer(UInt16.self) else { return .failure(.damagedHeader("cut short")) }
        guard version == Journal.version else { return .failure(.otherVersion(version)) }
        guard let roleByte = reader.byte(), let nameLength = reader.byte(), let name = reader.bytes(Int(nameLength)),
            let check = reader.integer(UInt32.self)
        else { return .failure(.damagedHeader("the file ends inside its header (it was cut short)")) }
        let headerSize = magic.count + reader.offset
        guard CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[0..<headerSize - 4])) == check else {
            return .failure(.damagedHeader("its checksum does not match"))
        }
        guard let role = Role(rawValue: roleByte) else { return .failure(.damagedHeader("an unknown role \(roleByte)")) }
        var scan = Scan(
            header: Header(role: role, identity: String(decoding: name, as: UTF8.self)), headerSize: headerSize,
            records: [], end: headerSize, torn: 0)
        var offset = headerSize
        while offset < bytes.count {
            let left = bytes.count - offset
            guard left >= recordHeaderSize else {
                scan.torn = left
                break
            }
            let length = bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self).bigEndian
            let lengthCheck = bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self).bigEndian
            guard CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + 4])) == lengthCheck,
                length > 0, Int(length) <= maxRecordLength
            else { return .failure(.damagedRecord(offset: offset, "its length field fails its check")) }
            guard left - recordHeaderSize >= Int(length) else {
                scan.torn = left
                break
            }
            let body = UnsafeRawBufferPointer(rebasing: bytes[offset + recordHeaderSize..<offset + recordHeaderSize + Int(length)])
            let bodyCheck = bytes.loadUnaligned(fromByteOffset: offset + 8, as: UInt32.self).bigEndian
            guard CRC32C.checksum(body) == bodyCheck else {
                return .failure(.damagedRecord(offset: offset, "its checksum does not match its \(length) bytes"))
            }
            guard let record = Record.decode(body) else {
                return .failure(.damagedRecord(offset: offset, "its checksum matches but its content does not parse"))
            }
            let size = recordHeaderSize + Int(length)
            scan.records.append((record, offset, size))
            offset += size
            scan.end = offset
        }
        return .success(scan)
    }

    /// A session as the records left it: what a restarted process continues from.
    struct Restored: Sendable {
        typealias Message = (number: UInt64, codecID: UInt8, typeID: String, payload: [UInt8], offset: Int, length: Int)
        var snapshot: Snapshot
        /// Its messages in order; those before ``head`` were released.
        private var all: [Message] = []
        private var head = 0

        init(snapshot: Snapshot) { self.snapshot = snapshot }

        /// Its kept messages, in order (numbers above ``Snapshot/acknowledged``).
        var messages: ArraySlice<Message> { all[head...] }

        mutating func append(_ message: Message) { all.append(message) }

        mutating func release(through number: UInt64) {
            while head < all.count, all[head].number <= number { head += 1 }
        }
    }

    /// Replays records into the sessions they leave, or says which record contradicts the ones
    /// before it (damage the checksums cannot see, such as a message out of its session's order).
    static func replay(_ records: [(record: Record, offset: Int, length: Int)]) -> Result<[Key: Restored], Damage> {
        var sessions: [Key: Restored] = [:]
        for (record, offset, length) in records {
            let key = record.key
            if case .session(let snapshot) = record {
                sessions[key] = Restored(snapshot: snapshot)
                continue
            }
            guard let next = sessions[key]?.snapshot.nextNumber else {
                if case .ended = record { continue }
                return .failure(.damagedRecord(offset: offset, "it names session \(key), which no record began"))
            }
            // (Changed in place: a copy of a session with many messages per record would be quadratic.)
            switch record {
            case .session: break
            case .message(_, let number, let codecID, let typeID, let payload):
                guard number == next else {
                    return .failure(.damagedRecord(offset: offset, "message #\(number) of session \(key) where #\(next) was next"))
                }
                sessions[key]!.snapshot.nextNumber += 1
                sessions[key]!.append((number, codecID, typeID, payload, offset, length))
            case .released(_, let through):
                guard through < next else {
                    return .failure(.damagedRecord(offset: offset, "session \(key) released #\(through), beyond what it sent"))
                }
                sessions[key]!.snapshot.acknowledged = max(sessions[key]!.snapshot.acknowledged, through)
                sessions[key]!.release(through: through)
            case .handled(_, let through):
                sessions[key]!.snapshot.handled = max(sessions[key]!.snapshot.handled, through)
            case .connected:
                sessions[key]!.snapshot.everConnected = true
            case .ended:
                sessions[key] = nil
            }
        }
        return .success(sessions)
    }
}

/// Reads big-endian fields from a buffer, nil past its end.
private struct ByteReader {
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
    fileprivate mutating func appendInteger<T: FixedWidthInteger>(_ value: T) {
        var big = value.bigEndian
        Swift.withUnsafeBytes(of: &big) { append(contentsOf: $0) }
    }
}
