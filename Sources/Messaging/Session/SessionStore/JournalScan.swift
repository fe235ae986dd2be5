/// Reading a session store's file back, without I/O: which bytes hold records, which are garbage a
/// crash left past the last sync (cut), which are damage (refused), and the sessions the records
/// leave.
extension Journal {
    /// What a file's bytes hold.
    struct Scan: Sendable {
        var header: Header
        /// Where the records start.
        var headerSize: Int
        /// Each record before the first bytes that are no record, and where it lies.
        var records: [(record: Record, offset: Int, length: Int)]
        /// The end of the last of them: the file is cut here when bytes follow.
        var end: Int
        /// Bytes after ``end`` that are cut: what was written after the last sync and did not
        /// reach the disk whole (0: none).
        var torn: Int
        /// Complete records found in those bytes after the first bad one, cut with them: written
        /// after the last sync, behind bytes that never arrived.
        var droppedRecords = 0
        /// The file was on the disk up to here when the last of its records was written (the
        /// largest `synced` a record claims).
        var synced: Int
    }

    /// Why a file's bytes cannot be used (never garbage past the last sync: that is cut).
    enum Damage: Error, Equatable, Sendable {
        /// It does not start with the magic: not a session store's file.
        case notAJournal
        /// Written by another format version.
        case otherVersion(UInt16)
        /// The header is cut short or its checksum fails.
        case damagedHeader(String)
        /// Bytes at `offset` that the file had been synced past do not read as a record.
        case damagedRecord(offset: Int, String)
    }

    /// What the bytes at an offset are.
    private enum Parsed {
        /// A record of `size` bytes whose `synced` is given.
        case record(Record, size: Int, synced: Int)
        /// No record: a check fails, or the body does not parse.
        case invalid(String)
        /// The file ends inside what its checked length announces (or inside a record header).
        case truncated
    }

    /// Reads a whole file: its header and its records. Recovery rules, from the first bytes that
    /// are no record (a check fails, or the file ends inside one):
    /// - when a valid record after them says the file had been synced past them, they were on the
    ///   disk and read wrong now: ``Damage`` (refused, never reset);
    /// - otherwise they are what a crash left of writes after the last sync — zeros, a torn or
    ///   half-written record, records that reached the disk out of order: cut there
    ///   (``Scan/torn``), with every record before them.
    /// A version-1 file, whose records do not say what was synced, is damage when a valid record
    /// follows the bad bytes, and cut otherwise.
    static func scan(_ bytes: UnsafeRawBufferPointer) -> Result<Scan, Damage> {
        let header: Header
        let headerSize: Int
        switch readHeader(bytes) {
        case .success(let (read, size)): (header, headerSize) = (read, size)
        case .failure(let damage): return .failure(damage)
        }
        var scan = Scan(header: header, headerSize: headerSize, records: [], end: headerSize, torn: 0, synced: headerSize)
        var offset = headerSize
        var firstBad: (offset: Int, why: String)?
        while offset < bytes.count {
            switch parse(bytes, at: offset, header: header) {
            case .record(let record, let size, let synced):
                scan.records.append((record, offset, size))
                scan.synced = max(scan.synced, synced)
                offset += size
                scan.end = offset
                continue
            case .invalid(let why): firstBad = (offset, why)
            case .truncated: firstBad = (offset, "the file ends inside it")
            }
            break
        }
        guard let firstBad else { return .success(scan) }
        // Are there records after the bad bytes, and do they say the bad bytes were on the disk?
        var later = 0
        var laterSynced = scan.synced
        var probe = firstBad.offset + 1
        while probe < bytes.count {
            if case .record(_, let size, let synced) = parse(bytes, at: probe, header: header) {
                later += 1
                laterSynced = max(laterSynced, synced)
                probe += size
            } else if bytes[probe] == 0 {
                // A run of zeros (the room written ahead of the records, or a zero-filled tail):
                // a record's 4-byte length has a nonzero byte, so none starts before 3 bytes ahead
                // of the next nonzero byte.
                var next = probe + 1
                while next < bytes.count, bytes[next] == 0 { next += 1 }
                probe = max(probe + 1, next - 3)
            } else {
                probe += 1
            }
        }
        let damaged = header.version == 1 ? later > 0 : laterSynced > firstBad.offset
        if damaged {
            let synced = header.version == 1 ? "" : ", and a later record says the file was on the disk up to byte \(laterSynced)"
            return .failure(.damagedRecord(offset: firstBad.offset, "\(firstBad.why)\(synced)"))
        }
        scan.torn = bytes.count - firstBad.offset
        scan.droppedRecords = later
        return .success(scan)
    }

    /// The header and its size.
    private static func readHeader(_ bytes: UnsafeRawBufferPointer) -> Result<(Header, Int), Damage> {
        guard bytes.count >= magic.count + 5 else {
            return bytes.starts(with: magic.prefix(bytes.count)) && bytes.count > 0 || bytes.isEmpty
                ? .failure(.damagedHeader("the file is \(bytes.count) bytes long, shorter than a header (it was cut short)"))
                : .failure(.notAJournal)
        }
        guard bytes.starts(with: magic) else { return .failure(.notAJournal) }
        var reader = ByteReader(UnsafeRawBufferPointer(rebasing: bytes[magic.count...]))
        guard let version = reader.integer(UInt16.self) else { return .failure(.damagedHeader("cut short")) }
        guard (1...Journal.version).contains(version) else { return .failure(.otherVersion(version)) }
        guard let roleByte = reader.byte(), let nameLength = reader.byte(), let name = reader.bytes(Int(nameLength)),
            let salt = version == 1 ? 0 : reader.integer(UInt64.self), let check = reader.integer(UInt32.self)
        else { return .failure(.damagedHeader("the file ends inside its header (it was cut short)")) }
        let headerSize = magic.count + reader.offset
        guard CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[0..<headerSize - 4])) == check else {
            return .failure(.damagedHeader("its checksum does not match"))
        }
        guard let role = Role(rawValue: roleByte) else { return .failure(.damagedHeader("an unknown role \(roleByte)")) }
        let header = Header(role: role, identity: String(decoding: name, as: UTF8.self), salt: salt, version: version)
        return .success((header, headerSize))
    }

    /// The record at `offset`, if one is there.
    private static func parse(_ bytes: UnsafeRawBufferPointer, at offset: Int, header: Header) -> Parsed {
        let left = bytes.count - offset
        let headerSize = header.version == 1 ? v1RecordHeaderSize : recordHeaderSize
        guard left >= headerSize else { return .truncated }
        let length = Int(bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self).bigEndian)
        let synced: Int
        let bodyCheck: UInt32
        if header.version == 1 {
            let lengthCheck = bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self).bigEndian
            guard CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + 4])) == lengthCheck else {
                return .invalid("its length field fails its check")
            }
            synced = 0
            bodyCheck = bytes.loadUnaligned(fromByteOffset: offset + 8, as: UInt32.self).bigEndian
        } else {
            let check = bytes.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self).bigEndian
            guard CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + 12])) ^ header.headerCheckSalt == check
            else { return .invalid("its length field fails its check") }
            synced = Int(clamping: bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt64.self).bigEndian)
            // A record cannot know of a sync past its own start.
            guard synced <= offset else { return .invalid("it claims a sync past its own place") }
            bodyCheck = bytes.loadUnaligned(fromByteOffset: offset + 16, as: UInt32.self).bigEndian ^ header.bodyCheckSalt
        }
        guard length > 0, length <= maxRecordLength else { return .invalid("its length field is out of range") }
        guard left - headerSize >= length else { return .truncated }
        let body = UnsafeRawBufferPointer(rebasing: bytes[offset + headerSize..<offset + headerSize + length])
        guard CRC32C.checksum(body) == bodyCheck else { return .invalid("its checksum does not match its \(length) bytes") }
        guard let record = header.version == 1 ? Record.decodeVersion1(body) : Record.decode(body) else {
            return .invalid("its checksum matches but its content does not parse")
        }
        switch record {
        case .reported, .reportTaken:
            guard header.version >= 4 else { return .invalid("a record of format 4 in a file of format \(header.version)") }
        default: break
        }
        return .record(record, size: headerSize + length, synced: synced)
    }

    /// Messages written ahead of the record that begins their epoch (an epoch change, or a
    /// renewed session, carrying kept messages over): held until that record comes, then applied
    /// with it; dropped when it never comes (a power loss took it — the session stays as it was).
    /// The *session* record says how many it carries: its `acknowledged` is the number before the
    /// first of them and its `nextNumber` the one after the last (every other *session* record
    /// has `acknowledged == nextNumber - 1`). The same rule for ``Journal/replay(_:)`` and the
    /// writer's index.
    struct Staged<Message> {
        private var groups: [Key: (epoch: UInt32, next: UInt64, messages: [Message])] = [:]

        /// Whether message `number` of `epoch` is staged: its session's current epoch is behind
        /// `epoch` (a change to come; messages of an epoch whose beginning failed to be written
        /// too: a later change drops them) — or its session is not known (a renewal to come; not
        /// one that ended in this file) and the message begins a group (carried messages are
        /// numbered from 1) or continues one. Any other message of an unknown session is damage,
        /// as before.
        func stages(_ key: Key, epoch: UInt32, number: UInt64, current: UInt32?, ended: Bool) -> Bool {
            if let current {
                let ahead = epoch &- current
                return ahead != 0 && ahead < 1 << 31
            }
            guard !ended else { return false }
            if number == 1 { return true }
            guard let group = groups[key] else { return false }
            return group.epoch == epoch && group.next == number
        }

        /// Stages a message. One that does not follow the group staged before it starts a new group:
        /// the one before was a change whose *session* record never reached the disk (the process
        /// went on after the crash, and changed the epoch again), or messages of an epoch whose
        /// beginning could not be written (the store failed it; the session went on in memory).
        mutating func add(_ key: Key, epoch: UInt32, number: UInt64, _ message: Message) {
            if var group = groups[key], group.epoch == epoch, number == group.next {
                group.next += 1
                group.messages.append(message)
                groups[key] = group
            } else {
                groups[key] = (epoch, number + 1, [message])
            }
        }

        /// The messages `snapshot` carries over, taken from those staged (nil: it carries none;
        /// a group staged before it is dropped then), or why those staged do not fit it.
        enum Taken {
            case carried([Message])
            case mismatch(String)
        }

        mutating func take(_ key: Key, for snapshot: Snapshot) -> Taken? {
            let group = groups.removeValue(forKey: key)
            guard snapshot.nextNumber > snapshot.acknowledged + 1 else { return nil }
            guard let group, group.epoch == snapshot.epoch, group.next == snapshot.nextNumber,
                group.next - UInt64(group.messages.count) == snapshot.acknowledged + 1
            else {
                let staged = group.map { "epoch \($0.epoch)'s #\($0.next - UInt64($0.messages.count))–#\($0.next - 1)" } ?? "none"
                return .mismatch(
                    "session \(key) begins epoch \(snapshot.epoch) carrying #\(snapshot.acknowledged + 1)–#\(snapshot.nextNumber - 1) over, and the messages before it are \(staged)")
            }
            return .carried(group.messages)
        }

        mutating func drop(_ key: Key) { groups[key] = nil }
    }

    /// A session as the records left it: what a restarted process continues from.
    struct Restored: Sendable {
        typealias Message = (number: UInt64, codecID: UInt8, typeID: String, payload: [UInt8], offset: Int, length: Int)
        var snapshot: Snapshot
        /// Its messages in order; those before ``head`` were released.
        private var all: [Message] = []
        private var head = 0
        /// The store may have lost its last records before this process opened it (a power loss
        /// under process-crash durability): the session must not go on as it stands — it starts
        /// anew with its peer at the next connection (``SessionJournal/settleSuspects``).
        var mayHaveLost = false

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
    /// A record of another epoch than its session's current one never applies.
    ///
    /// A session that begins again (a new epoch, or a new session a client renewed into) writes
    /// the messages it carries over *before* the record that begins it: they are staged
    /// (``Staged``) and apply only with that record, so an epoch change is all or nothing — a
    /// power loss that keeps part of it leaves the session as it was before, its messages with
    /// it, never a new epoch short of some of them.
    static func replay(_ records: [(record: Record, offset: Int, length: Int)]) -> Result<[Key: Restored], Damage> {
        var sessions: [Key: Restored] = [:]
        // Sessions an `ended` record ended in this file: a late record of one (written by a
        // version that let a handled count through after the end) applies to nothing.
        var ended: Set<Key> = []
        var staged = Staged<Restored.Message>()
        for (record, offset, length) in records {
            let key = record.key
            switch record {
            case .session(let snapshot):
                var restored = Restored(snapshot: snapshot)
                switch staged.take(key, for: snapshot) {
                case .none: break
                case .some(.carried(let carried)):
                    for message in carried { restored.append(message) }
                case .some(.mismatch(let why)): return .failure(.damagedRecord(offset: offset, why))
                }
                sessions[key] = restored
                continue
            case .ended:
                sessions[key] = nil
                staged.drop(key)
                ended.insert(key)
                continue
            case .reported, .reportTaken:
                continue  // (of no session's state: ``reports(_:)``)
            default:
                break
            }
            // (One lookup, the session changed in place through its slot: a `let` copy of it held
            // while the dictionary's value was mutated kept a second reference to its message list,
            // and every record copied the whole list — quadratic: a client's start on a 3.7 MB
            // journal of 33,000 kept messages took 21 s in a debug build.)
            let slot = sessions.index(forKey: key)
            let current = slot.map { sessions.values[$0].snapshot.epoch }
            if case .message(_, let epoch, let number, let codecID, let typeID, let payload) = record, current != epoch,
                staged.stages(key, epoch: epoch, number: number, current: current, ended: ended.contains(key))
            {
                staged.add(key, epoch: epoch, number: number, (number, codecID, typeID, payload, offset, length))
                continue
            }
            guard let slot else {
                if ended.contains(key) { continue }
                return .failure(.damagedRecord(offset: offset, "it names session \(key), which no record began"))
            }
            guard record.epoch == current else { continue }
            let next = sessions.values[slot].snapshot.nextNumber
            switch record {
            case .session, .ended, .reported, .reportTaken: break
            case .message(_, _, let number, let codecID, let typeID, let payload):
                guard number == next else {
                    return .failure(.damagedRecord(offset: offset, "message #\(number) of session \(key) where #\(next) was next"))
                }
                sessions.values[slot].snapshot.nextNumber += 1
                sessions.values[slot].append((number, codecID, typeID, payload, offset, length))
            case .released(_, _, let through):
                guard through < next else {
                    return .failure(.damagedRecord(offset: offset, "session \(key) released #\(through), beyond what it sent"))
                }
                sessions.values[slot].snapshot.acknowledged = max(sessions.values[slot].snapshot.acknowledged, through)
                sessions.values[slot].release(through: through)
            case .handled(_, _, let through):
                sessions.values[slot].snapshot.handled = max(sessions.values[slot].snapshot.handled, through)
            case .connected:
                sessions.values[slot].snapshot.everConnected = true
            }
        }
        return .success(sessions)
    }

    /// A report of undelivered messages the app had not taken when the file was last written: made
    /// again when the store opens (``SessionJournal/pendingReports``).
    struct Report: Sendable {
        var id: UInt64
        /// The session the messages were sent in.
        var key: Key
        var owner: String?
        var messages: [Reported]
        /// About the bytes of its records.
        var bytes: Int { messages.reduce(0) { $0 + 64 + $1.payload.count + $1.typeID.utf8.count + ($1.owner?.utf8.count ?? 0) } }
    }

    /// The reports in `records` not taken, in the order they were made. A report written with the
    /// records that drop its messages (``Reported/staged``) applies once its session's next
    /// *session* or *ended* record follows, and never when the file ends first (a crash kept the
    /// report and not them: the messages are in their session still); then, or one a compaction
    /// wrote, whatever becomes of the session. A `reportTaken` of a report not in the file (taken
    /// before a compaction) applies to nothing.
    static func reports(_ records: [(record: Record, offset: Int, length: Int)]) -> [Report] {
        var reports = Reports()
        for (record, _, _) in records { reports.apply(record) }
        return reports.pending
    }

    /// The reports of undelivered messages a file's records leave, record by record (``reports(_:)``,
    /// and the writer's index of them).
    struct Reports: Sendable {
        /// Those that apply and were not taken, oldest first.
        private(set) var pending: [Report] = []
        /// Messages of reports waiting for their session's next *session* or *ended* record.
        private var staged: [Key: [Reported]] = [:]

        /// Bytes of their messages, about (what a compaction copies of them).
        var bytes: Int { pending.reduce(0) { $0 + $1.bytes } }

        init(_ pending: [Report] = []) { self.pending = pending }

        mutating func apply(_ record: Record) {
            switch record {
            case .reported(let key, let message):
                if message.staged { staged[key, default: []].append(message) } else { add(key, message) }
            case .session(let snapshot):
                commit(snapshot.key)
            case .ended(let key):
                commit(key)
            case .reportTaken(_, let report):
                pending.removeAll { $0.id == report }
            default:
                break
            }
        }

        private mutating func commit(_ key: Key) {
            guard let messages = staged.removeValue(forKey: key) else { return }
            for message in messages { add(key, message) }
        }

        private mutating func add(_ key: Key, _ message: Reported) {
            var message = message
            message.staged = false
            if let at = pending.lastIndex(where: { $0.id == message.report }) {
                pending[at].messages.append(message)
            } else {
                pending.append(Report(id: message.report, key: key, owner: message.owner, messages: [message]))
            }
        }
    }
}
