import Foundation
import Logging
import Testing

import Locks
@testable import Messaging
import ProtocolCore

/// The session store alone: its format (records, checksums, what a torn tail and a flipped byte
/// are), its file (lock, identity, version, compaction) — real files in a temporary directory.
@Suite struct SessionStoreTests {
    static func directory(_ name: String) -> String {
        NSTemporaryDirectory() + "session-store-\(name)-\(UInt64.random(in: 0...UInt64.max))"
    }

    static let key = Journal.Key(hex: "00112233445566778899aabbccddeeff")!
    static let position = Journal.Key(hex: "ffeeddccbbaa99887766554433221100")!

    static let header = Journal.Header.fresh(role: .server, identity: "plaintext")

    /// A file's bytes: a header, a session and `count` messages, some released. `synced`: each
    /// record says the file was synced up to its own start (as with power-loss durability, a sync
    /// before every record), or nothing was (process-crash durability between its syncs).
    static func file(messages count: Int, syncedBeforeEach: Bool = false) -> [UInt8] {
        var bytes = header.encoded
        func add(_ record: Journal.Record) {
            record.encode(into: &bytes, header: header, synced: syncedBeforeEach ? bytes.count : 0)
        }
        add(.session(Journal.Snapshot(key: key, positionID: position, owner: "owner")))
        for number in 1...UInt64(count) {
            add(.message(key, epoch: 0, number: number, codecID: 1, typeID: "reading", payload: Array("{\"n\":\(number)}".utf8)))
            if number == 2 { add(.released(key, epoch: 0, through: 1)) }
        }
        add(.handled(key, epoch: 0, through: 7))
        return bytes
    }

    static func scan(_ bytes: [UInt8]) -> Result<Journal.Scan, Journal.Damage> { bytes.withUnsafeBytes { Journal.scan($0) } }

    @Test func crc32cMatchesItsCheckValue() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([UInt8]()) == 0)
        let long = (0..<1000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let bytewise = long.withUnsafeBytes { raw in
            (0..<raw.count).reduce(UInt32(0)) { crc, index in CRC32C.checksum(UnsafeRawBufferPointer(rebasing: raw[index..<index + 1]), continuing: crc) }
        }
        #expect(CRC32C.checksum(long) == bytewise, "slicing by 8 agrees with a byte at a time")
    }

    @Test func recordsRoundTripAndReplay() throws {
        let bytes = Self.file(messages: 5)
        let scan = try Self.scan(bytes).get()
        #expect(scan.header == Self.header)
        #expect(scan.records.count == 1 + 5 + 1 + 1 && scan.torn == 0 && scan.end == bytes.count)
        let sessions = try Journal.replay(scan.records).get()
        let session = try #require(sessions[Self.key])
        #expect(session.messages.map(\.number) == [2, 3, 4, 5])
        #expect(session.snapshot.nextNumber == 6 && session.snapshot.acknowledged == 1 && session.snapshot.handled == 7)
        #expect(session.snapshot.owner == "owner" && session.snapshot.positionID == Self.position)
        #expect(String(decoding: session.messages.first!.payload, as: UTF8.self) == "{\"n\":2}")
    }

    /// A late record of a session its `ended` record ended (written by a version that let a handled
    /// count through after the end) applies to nothing; a record of a session no record began is
    /// still damage.
    @Test func aLateRecordOfAnEndedSessionIsNoDamage() throws {
        let begun = Journal.Record.session(Journal.Snapshot(key: Self.key, positionID: Self.position))
        let late: [(record: Journal.Record, offset: Int, length: Int)] = [
            (begun, 0, 0), (.ended(Self.key), 1, 0), (.handled(Self.key, epoch: 0, through: 1), 2, 0),
        ]
        #expect(try Journal.replay(late).get().isEmpty)
        let stray: [(record: Journal.Record, offset: Int, length: Int)] = [(.handled(Self.key, epoch: 0, through: 1), 7, 0)]
        guard case .failure(.damagedRecord(7, let why)) = Journal.replay(stray) else {
            Issue.record("a stray record passed")
            return
        }
        #expect(why.contains("which no record began"))
    }

    /// A crash interrupts the last write at any byte: every complete record before it is read back,
    /// the rest reported as torn (to be cut), never as damage.
    @Test func aTornLastRecordIsCutAtEveryOffset() throws {
        let bytes = Self.file(messages: 3, syncedBeforeEach: true)
        let full = try Self.scan(bytes).get()
        let last = try #require(full.records.last)
        for cut in last.offset..<bytes.count {
            let scan = try Self.scan(Array(bytes[..<cut])).get()
            #expect(scan.records.count == full.records.count - 1, "cut at \(cut)")
            #expect(scan.end == last.offset && scan.torn == cut - last.offset)
        }
        // And inside every record, not only the last: what precedes the cut is kept.
        for cut in full.headerSize..<bytes.count {
            let scan = try Self.scan(Array(bytes[..<cut])).get()
            #expect(scan.records.count == full.records.filter { $0.offset + $0.length <= cut }.count)
        }
    }

    /// One byte changed anywhere is never read as something else: in the header, or in a record a
    /// later record says was on the disk, it is damage (refused); in what no sync had covered yet
    /// (the last record here) it is what a crash left, cut with everything after it.
    @Test func aFlippedByteIsDamageWhereSyncedAndCutWhereNot() throws {
        let bytes = Self.file(messages: 3, syncedBeforeEach: true)
        let full = try Self.scan(bytes).get()
        let last = try #require(full.records.last)
        var wrong: [String] = []
        for index in bytes.indices {
            for mask: UInt8 in [0x01, 0x80, 0xFF] {
                var damaged = bytes
                damaged[index] ^= mask
                switch Self.scan(damaged) {
                case .failure:
                    if index >= last.offset { wrong.append("byte \(index) of the unsynced last record refused") }
                case .success(let scan):
                    if index < last.offset {
                        wrong.append("byte \(index) (synced) accepted")
                    } else if scan.records.count != full.records.count - 1 || scan.torn != bytes.count - last.offset {
                        wrong.append("byte \(index): \(scan.records.count) records kept, \(scan.torn) cut")
                    }
                }
            }
        }
        #expect(wrong.isEmpty, "\(wrong.prefix(20))")
    }

    /// What delayed allocation, a torn page or `data=writeback` leaves past the last sync: zeros
    /// after the valid records. Cut, never damage (CRC-32C of zeros is not zero) — also zeros
    /// between records that reached the disk out of order, when no record says it was synced.
    @Test func zerosPastTheLastSyncAreCut() throws {
        let bytes = Self.file(messages: 3)
        let zeros = try Self.scan(bytes + [UInt8](repeating: 0, count: 4096)).get()
        #expect(zeros.records.count == 6 && zeros.torn == 4096 && zeros.end == bytes.count)
        // A hole of zeros where records 3 and 4 were, records after it: written back out of order.
        var holed = bytes
        let scan = try Self.scan(bytes).get()
        let hole = scan.records[2].offset..<(scan.records[3].offset + scan.records[3].length)
        holed.replaceSubrange(hole, with: [UInt8](repeating: 0, count: hole.count))
        let cut = try Self.scan(holed).get()
        #expect(cut.records.count == 2 && cut.end == hole.lowerBound && cut.droppedRecords == 2)
        // The same hole in a file a later record says was synced past it: damage.
        let synced = Self.file(messages: 3, syncedBeforeEach: true)
        var damaged = synced
        damaged.replaceSubrange(hole, with: [UInt8](repeating: 0, count: hole.count))
        guard case .failure(.damagedRecord(let offset, let why)) = Self.scan(damaged) else {
            Issue.record("a hole in synced records was not refused")
            return
        }
        #expect(offset == hole.lowerBound && why.contains("on the disk up to byte"), "\(why)")
    }

    /// Bytes of an older file (another salt) or a payload that holds a record's bytes never read as
    /// records of this one.
    @Test func recordsOfAnotherFileDoNotCheck() throws {
        let other = Journal.Header.fresh(role: .server, identity: "plaintext")
        var bytes = Self.header.encoded
        Journal.Record.session(Journal.Snapshot(key: Self.key, positionID: Self.position)).encode(into: &bytes, header: other, synced: 0)
        let scan = try Self.scan(bytes).get()
        #expect(scan.records.isEmpty && scan.torn > 0)
    }

    /// Format 3: a session that begins again writes the messages it carries over before the record
    /// that begins it, and they apply only with that record. Every prefix of such a change replays
    /// to the session before it, whole, or after it, whole — a power loss keeping part of the
    /// change never leaves a new epoch short of messages (found by the session simulation, seed
    /// 318) — and so does a renewed session's (its carried messages, its beginning, the old one's
    /// end). Staged messages that do not fit the record after them are damage.
    @Test func anEpochChangeAppliesWholeOrNotAtAll() throws {
        let old = Journal.Snapshot(key: Self.key, positionID: Self.position, nextNumber: 1)
        var before: [Journal.Record] = [.session(old)]
        for number in UInt64(1)...4 { before.append(.message(Self.key, epoch: 0, number: number, codecID: 1, typeID: "t", payload: [UInt8(number)])) }
        before.append(.released(Self.key, epoch: 0, through: 1))
        let carried = (UInt64(1)...3).map { Journal.Record.message(Self.key, epoch: 1, number: $0, codecID: 1, typeID: "t", payload: [UInt8($0 + 1)]) }
        let change = carried + [.session(Journal.Snapshot(key: Self.key, positionID: Self.key, nextNumber: 4, epoch: 1))]
        func replay(_ records: [Journal.Record]) throws -> [Journal.Key: Journal.Restored] {
            try Journal.replay(records.map { ($0, 0, 0) }).get()
        }
        for length in 0...change.count {
            let session = try #require(try replay(before + change.prefix(length))[Self.key])
            if length < change.count {
                #expect(session.snapshot.epoch == 0 && session.messages.map(\.payload) == [[2], [3], [4]], "prefix \(length)")
            } else {
                #expect(session.snapshot.epoch == 1 && session.snapshot.nextNumber == 4 && session.messages.map(\.number) == [1, 2, 3])
                #expect(session.messages.map(\.payload) == [[2], [3], [4]])
            }
        }
        let renewedKey = Journal.Key(high: 9, low: 9)
        let renewal: [Journal.Record] =
            (UInt64(1)...3).map { .message(renewedKey, epoch: 1, number: $0, codecID: 1, typeID: "t", payload: [UInt8($0 + 1)]) }
            + [.session(Journal.Snapshot(key: renewedKey, positionID: renewedKey, nextNumber: 4, epoch: 1)), .ended(Self.key)]
        for length in 0...renewal.count {
            let sessions = try replay(before + renewal.prefix(length))
            #expect((sessions[Self.key] != nil) == (length < renewal.count), "prefix \(length): the old session until its end")
            #expect((sessions[renewedKey] != nil) == (length >= 4), "prefix \(length): the new one from its beginning, whole")
            if let renewed = sessions[renewedKey] { #expect(renewed.messages.map(\.payload) == [[2], [3], [4]]) }
        }
        // A change whose beginning never reached the disk, and the process went on: the next change
        // (carrying nothing, or other messages) applies alone, never with the stale ones.
        let stale = Array(carried.prefix(2))
        let bare = try #require(try replay(before + stale + [.session(Journal.Snapshot(key: Self.key, positionID: Self.key, epoch: 1))])[Self.key])
        #expect(bare.snapshot.epoch == 1 && bare.messages.isEmpty && bare.snapshot.nextNumber == 1, "stale messages applied: \(bare.messages.map(\.number))")
        let again = try #require(try replay(before + stale + change)[Self.key])
        #expect(again.messages.map(\.payload) == [[2], [3], [4]] && again.snapshot.nextNumber == 4)
        // An epoch whose beginning the store failed to write (the session went on in memory, its
        // later messages written under the new epoch): a later change drops them, carrying its own
        // or nothing — never damage (review of the change).
        let failedStart = (UInt64(3)...4).map { Journal.Record.message(Self.key, epoch: 1, number: $0, codecID: 1, typeID: "t", payload: [9]) }
        let laterChange = (UInt64(1)...2).map { Journal.Record.message(Self.key, epoch: 2, number: $0, codecID: 1, typeID: "t", payload: [UInt8($0)]) }
            + [.session(Journal.Snapshot(key: Self.key, positionID: Self.key, nextNumber: 3, epoch: 2))]
        let afterFailure = try #require(try replay(before + failedStart + laterChange)[Self.key])
        #expect(afterFailure.snapshot.epoch == 2 && afterFailure.messages.map(\.payload) == [[1], [2]])
        let fromOne = (UInt64(1)...2).map { Journal.Record.message(Self.key, epoch: 1, number: $0, codecID: 1, typeID: "t", payload: [9]) }
        let bareLater = try #require(
            try replay(before + fromOne + [.session(Journal.Snapshot(key: Self.key, positionID: Self.key, epoch: 2))])[Self.key])
        #expect(bareLater.snapshot.epoch == 2 && bareLater.messages.isEmpty)
        // A message of a session no record began, that begins no carried group (not #1): damage,
        // as in format 2.
        let orphan: [Journal.Record] = [.message(Journal.Key(high: 7, low: 7), epoch: 0, number: 5, codecID: 1, typeID: "t", payload: [1])]
        if case .failure(.damagedRecord) = Journal.replay((before + orphan).map { ($0, 0, 0) }) {} else {
            Issue.record("a message of a session no record began passed")
        }
        // A beginning that says it carries messages the records before it do not hold: damage.
        let wrongEpoch = carried + [.session(Journal.Snapshot(key: Self.key, positionID: Self.key, nextNumber: 4, epoch: 2))]
        let wrongCount = carried + [.session(Journal.Snapshot(key: Self.key, positionID: Self.key, nextNumber: 5, epoch: 1))]
        let missing: [Journal.Record] = [.session(Journal.Snapshot(key: Self.key, positionID: Self.key, nextNumber: 4, epoch: 1))]
        for records in [wrongEpoch, wrongCount, missing] {
            if case .failure(.damagedRecord) = Journal.replay((before + records).map { ($0, 0, 0) }) {} else {
                Issue.record("a beginning carrying messages the records before it do not hold passed")
            }
        }
    }

    @Test func anotherVersionAndAnotherFileAreNamed() {
        var bytes = Self.file(messages: 1)
        bytes[9] = UInt8(Journal.version + 1)  // a version to come
        #expect(Self.scan(bytes).failure == .otherVersion(Journal.version + 1))
        #expect(Self.scan(Array("hello, world, not a journal".utf8)).failure == .notAJournal)
        if case .damagedHeader = Self.scan(Array(bytes[0..<10])).failure {} else { Issue.record("a cut header passed") }
    }

    // MARK: The file

    static func open(_ directory: String, identity: String = "plaintext", role: Journal.Role = .server) throws(FileError) -> SessionJournal {
        try SessionJournal(SessionStore(directory: directory), role: role, identity: identity, logger: testLogger())
    }

    @Test func whatWasAppendedIsRestoredAndTheFileIsPrivate() throws {
        let directory = Self.directory("restore")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        do {
            let journal = try Self.open(directory)
            try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
            for number in UInt64(1)...10 {
                try journal.append(.message(Self.key, epoch: 0, number: number, codecID: 1, typeID: "t", payload: [UInt8(number)]))
            }
            try journal.append(.released(Self.key, epoch: 0, through: 4), .handled(Self.key, epoch: 0, through: 3), .connected(Self.key, epoch: 0))
            journal.close()
        }
        let journal = try Self.open(directory)
        let session = try #require(journal.restored[Self.key])
        #expect(session.messages.map(\.number) == Array(5...10))
        #expect(session.snapshot.everConnected && session.snapshot.handled == 3)
        let attributes = try FileManager.default.attributesOfItem(atPath: journal.path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        let directoryMode = try FileManager.default.attributesOfItem(atPath: directory)[.posixPermissions] as? Int
        #expect(directoryMode == 0o700)
        journal.close()
    }

    /// One process per store: a second opener (here the same process, a second descriptor) is
    /// refused with a message saying so; after the first closes, it may.
    @Test func aSecondOpenerIsRefused() throws {
        let directory = Self.directory("lock")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try Self.open(directory)
        #expect(throws: FileError.self) { try Self.open(directory) }
        do {
            _ = try Self.open(directory)
        } catch {
            #expect(error.message.contains("in use by another process (pid \(getpid()))"), "\(error.message)")
        }
        first.close()
        try Self.open(directory).close()
    }

    @Test func anotherIdentityOrRoleIsRefusedAndNothingIsReset() throws {
        let directory = Self.directory("identity")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try Self.open(directory, identity: "aaaa")
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        journal.close()
        let before = try Data(contentsOf: URL(fileURLWithPath: journal.path))
        do {
            _ = try Self.open(directory, identity: "bbbb")
            Issue.record("another identity opened it")
        } catch {
            #expect(error.message.contains("holds the sessions of identity aaaa") && error.path == journal.path)
        }
        do {
            _ = try Self.open(directory, identity: "aaaa", role: .client)
            Issue.record("a client opened a server's store")
        } catch {
            #expect(error.message.contains("holds a server's sessions"))
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: journal.path)) == before, "refusing changes nothing")
    }

    /// A damaged file is refused with its name, the byte and what to do — and left as it is:
    /// here a byte of a message that a sync had covered (a later record says so) is flipped.
    @Test func aDamagedFileIsRefusedWithWhatToDo() async throws {
        let directory = Self.directory("damaged")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try SessionJournal(
            SessionStore(directory: directory, durability: .powerLoss), role: .server, identity: "plaintext", logger: testLogger())
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        let position = try journal.append(.message(Self.key, epoch: 0, number: 1, codecID: 1, typeID: "t", payload: Array(repeating: 7, count: 40)))
        try await journal.synced(position)
        try journal.append(.handled(Self.key, epoch: 0, through: 1))
        journal.close()
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: journal.path)))
        let flipped = bytes.count - 60  // inside the synced message
        bytes[flipped] ^= 0x20
        try Data(bytes).write(to: URL(fileURLWithPath: journal.path))
        do {
            _ = try Self.open(directory)
            Issue.record("a damaged store opened")
        } catch {
            #expect(error.message.contains("is damaged at byte"), "\(error.message)")
            #expect(error.message.contains("move it away") && error.message.contains("never resets it"))
        }
        #expect(try [UInt8](Data(contentsOf: URL(fileURLWithPath: journal.path))) == bytes)
    }

    /// Issue 53, 2: a journal whose valid records are followed by 4 KiB of zeros (what a power loss
    /// leaves past the last sync) opens: the zeros are cut, the notice says how many bytes, every
    /// session is there, and the store goes on. (It was refused as damaged at the first zero.)
    @Test func aZeroTailOnDiskOpensWithANotice() throws {
        let directory = Self.directory("zeros")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try Self.open(directory)
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        try journal.append(.message(Self.key, epoch: 0, number: 1, codecID: 1, typeID: "t", payload: [1]))
        journal.close()
        let handle = try #require(FileHandle(forWritingAtPath: journal.path))
        handle.seekToEndOfFile()
        handle.write(Data(count: 4096))
        try handle.close()
        let notices = CapturedLog()
        let reopened = try SessionJournal(
            SessionStore(directory: directory), role: .server, identity: "plaintext", logger: notices.logger())
        #expect(reopened.opening.cutBytes == 4096)
        #expect(reopened.restored[Self.key]?.messages.map(\.payload) == [[1]])
        #expect(notices.lines.contains { $0.level == .notice && $0.message.contains("cut 4096 bytes at byte") }, "\(notices.lines.map(\.message))")
        try reopened.append(.message(Self.key, epoch: 0, number: 2, codecID: 1, typeID: "t", payload: [2]))
        reopened.close()
        let again = try Self.open(directory)
        #expect(again.restored[Self.key]?.messages.map(\.payload) == [[1], [2]] && again.opening.cutBytes == 0)
        again.close()
    }

    /// The room the writer keeps ahead of its records: zeros written past the last record (an
    /// overwrite's `fdatasync` then writes no new length or extents). The file as a kill -9 leaves
    /// it — records, then zeros — opens with every record and a notice that says the cut bytes are
    /// zeros; a clean close leaves the file ending at its last record.
    @Test func theRoomAheadOfTheRecordsIsCutAtOpenAndAtClose() throws {
        let directory = Self.directory("room")
        let killed = Self.directory("room-killed")
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: killed)
        }
        let journal = try Self.open(directory)
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        for number in 1...100 {
            try journal.append(.message(Self.key, epoch: 0, number: UInt64(number), codecID: 1, typeID: "t", payload: [UInt8(number)]))
        }
        let end = journal.writer.state.size
        let name = URL(fileURLWithPath: journal.path).lastPathComponent
        // What a kill -9 now leaves: the file as the page cache has it.
        let left = try [UInt8](Data(contentsOf: URL(fileURLWithPath: journal.path)))
        #expect(left.count > end && left.count % (64 << 10) == 0, "\(left.count) bytes for records ending at \(end)")
        #expect(!left[end...].contains { $0 != 0 })
        try FileManager.default.createDirectory(atPath: killed, withIntermediateDirectories: true)
        try Data(left).write(to: URL(fileURLWithPath: killed + "/" + name))
        let notices = CapturedLog()
        let reopened = try SessionJournal(SessionStore(directory: killed), role: .server, identity: "plaintext", logger: notices.logger())
        #expect(reopened.opening.cutBytes == left.count - end && reopened.opening.droppedRecords == 0)
        #expect(reopened.restored[Self.key]?.messages.map(\.payload) == (1...100).map { [UInt8($0)] })
        #expect(notices.lines.contains { $0.level == .notice && $0.message.contains("at byte \(end)") && $0.message.contains("all zeros") }, "\(notices.lines.map(\.message))")
        reopened.close()
        journal.close()
        let closed = try FileManager.default.attributesOfItem(atPath: journal.path)[.size] as? Int
        #expect(closed == end, "a closed store ends at its last record")
        let again = try Self.open(directory)
        #expect(again.opening.cutBytes == 0 && again.restored[Self.key]?.messages.count == 100)
        again.close()
    }

    /// At `.processCrash` the writer copies records into a mapping of the room ahead (no `pwrite`
    /// per batch); at `.powerLoss` it does not. A kill in the middle of a copy can leave a batch with
    /// a hole of zeros before a complete record (glibc may store a short copy's tail first): its
    /// records say nothing was synced past the batch's start, so the store opens with the batch cut
    /// as a torn tail and every record before it — never refused as damage.
    @Test func aCopyAKillCutShortIsATornTailAndOnlyProcessCrashMaps() throws {
        let directory = Self.directory("mapped")
        let killed = Self.directory("mapped-killed")
        let power = Self.directory("mapped-power")
        defer {
            for path in [directory, killed, power] { try? FileManager.default.removeItem(atPath: path) }
        }
        let journal = try Self.open(directory)
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        for number in 1...100 {
            try journal.append(.message(Self.key, epoch: 0, number: UInt64(number), codecID: 1, typeID: "t", payload: [UInt8(number)]))
        }
        #expect(MappedJournalFileTests.mapped(journal.path), "process-crash durability maps the room ahead")
        let batchStart = journal.writer.state.size
        let payload = [UInt8](repeating: 0xA5, count: 200)
        try journal.append([
            .message(Self.key, epoch: 0, number: 101, codecID: 1, typeID: "t", payload: payload),
            .message(Self.key, epoch: 0, number: 102, codecID: 1, typeID: "t", payload: payload),
        ])
        let batchEnd = journal.writer.state.size
        var left = try [UInt8](Data(contentsOf: URL(fileURLWithPath: journal.path)))
        #expect(left[batchStart..<batchEnd].contains { $0 != 0 }, "the batch reached the page cache through the mapping")
        // The copy cut short: the middle of the first record is still zeros, the second is whole.
        for offset in (batchStart + 20)..<(batchStart + 120) { left[offset] = 0 }
        try FileManager.default.createDirectory(atPath: killed, withIntermediateDirectories: true)
        try Data(left).write(to: URL(fileURLWithPath: killed + "/" + URL(fileURLWithPath: journal.path).lastPathComponent))
        let notices = CapturedLog()
        let reopened = try SessionJournal(SessionStore(directory: killed), role: .server, identity: "plaintext", logger: notices.logger())
        #expect(reopened.restored[Self.key]?.messages.map(\.payload) == (1...100).map { [UInt8($0)] })
        #expect(reopened.opening.cutBytes == left.count - batchStart)
        #expect(notices.lines.contains { $0.level == .notice && $0.message.contains("at byte \(batchStart)") }, "\(notices.lines.map(\.message))")
        reopened.close()
        journal.close()
        // Power-loss durability writes with pwrite: no mapping.
        let synced = try SessionJournal(SessionStore(directory: power, durability: .powerLoss), role: .server, identity: "plaintext", logger: testLogger())
        try synced.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        try synced.append(.message(Self.key, epoch: 0, number: 1, codecID: 1, typeID: "t", payload: [1]))
        #expect(!MappedJournalFileTests.mapped(synced.path))
        synced.close()
    }

    /// Issue 53, 3 (both stores cut back alike): a process-crash store last written in another
    /// boot of the machine by a process that did not close it may have lost its last records to
    /// the power, cut at a record where nothing in the file shows it. Its sessions are marked to
    /// start anew (with a notice), and stay marked — across a crash before they did — until they
    /// have; the same boot, a closed store or power-loss durability is trusted.
    @Test func aStoreWrittenInAnotherBootAndNotClosedStartsItsSessionsAnew() throws {
        let directory = Self.directory("boot")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let suspects = directory + "/sessions.suspect"
        func open(_ boot: String, _ durability: SessionStore.Durability = .processCrash, log: CapturedLog? = nil) throws -> SessionJournal {
            var store = SessionStore(directory: directory, durability: durability)
            store.boot = boot
            return try SessionJournal(store, role: .server, identity: "plaintext", logger: log?.logger() ?? testLogger())
        }
        // (A journal let go without `close` is a killed process: its lock goes, its words stay.)
        do {
            let journal = try open("A")
            try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
            try journal.append(.message(Self.key, epoch: 0, number: 1, codecID: 1, typeID: "t", payload: [1]))
        }
        do {
            let journal = try open("A")
            #expect(journal.restored[Self.key]?.mayHaveLost == false && journal.opening.lostBoot == nil, "the same boot")
        }
        let notices = CapturedLog()
        do {
            let journal = try open("B", log: notices)
            #expect(journal.opening.lostBoot == "A" && journal.opening.mayHaveLost == 1)
            #expect(journal.restored[Self.key]?.mayHaveLost == true)
            #expect(notices.lines.contains { $0.level == .notice && $0.message.contains("in another boot of this machine") }, "\(notices.lines.map(\.message))")
            #expect(FileManager.default.fileExists(atPath: suspects))
        }
        do {
            let journal = try open("B")
            #expect(journal.opening.lostBoot == nil && journal.restored[Self.key]?.mayHaveLost == true, "forgotten after a crash in the new boot")
            // It starts anew (a new epoch), and the store is closed.
            try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: .random(), epoch: 1)))
            journal.close()
        }
        do {
            let journal = try open("C")
            #expect(journal.opening.lostBoot == nil && journal.restored[Self.key]?.mayHaveLost == false, "closed, then started anew")
            #expect(!FileManager.default.fileExists(atPath: suspects))
        }
        do { _ = try open("C", .powerLoss) }
        let journal = try open("D")
        #expect(journal.opening.lostBoot == nil && journal.restored[Self.key]?.mayHaveLost == false, "power-loss durability")
        journal.close()
    }

    /// A store of format 2 (the records are the same; an epoch change wrote its snapshot before the
    /// messages it carried) is read and rewritten in format 3 when it opens — so that a library of
    /// format 2 refuses it afterwards instead of dropping what a format-3 epoch change carries.
    /// A store of format version 2: one session at epoch 1 (as every client's session after its
    /// first connection: the rewrite keeps it) keeping messages 2 and 3, its app's handled count 7.
    static func version2Store() -> [UInt8] {
        var bytes = header.encoded
        for record: Journal.Record in [
            .session(Journal.Snapshot(key: key, positionID: position, owner: "owner", nextNumber: 1, epoch: 1)),
            .message(key, epoch: 1, number: 1, codecID: 1, typeID: "t", payload: [1]),
            .message(key, epoch: 1, number: 2, codecID: 1, typeID: "t", payload: [2]),
            .released(key, epoch: 1, through: 1),
            .message(key, epoch: 1, number: 3, codecID: 1, typeID: "t", payload: [3]),
            .handled(key, epoch: 1, through: 7),
        ] {
            record.encode(into: &bytes, header: header, synced: 0)
        }
        bytes[9] = 2
        let headerSize = header.encoded.count
        bytes.replaceSubrange((headerSize - 4)..<headerSize, with: bigEndian(CRC32C.checksum(Array(bytes[0..<headerSize - 4]))))
        return bytes
    }

    @Test func aVersion2StoreIsReadAndRewritten() throws {
        let directory = Self.directory("v2")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let bytes = Self.version2Store()
        #expect(Self.scan(bytes).map(\.header.version) == .success(2))
        try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + SessionJournal.fileName))
        let journal = try Self.open(directory)
        #expect(journal.opening.migrated)
        #expect(journal.restored[Self.key]?.messages.map(\.number) == [2, 3] && journal.restored[Self.key]?.snapshot.handled == 7)
        try journal.append(.message(Self.key, epoch: 1, number: 4, codecID: 1, typeID: "t", payload: [4]))
        journal.close()
        let again = try Self.open(directory)
        #expect(!again.opening.migrated && again.restored[Self.key]?.messages.map(\.payload) == [[2], [3], [4]])
        #expect(again.restored[Self.key]?.snapshot.epoch == 1)
        #expect(Array(try [UInt8](Data(contentsOf: URL(fileURLWithPath: again.path)))[8..<10]) == [0, UInt8(Journal.version)])
        again.close()
    }

    /// A store of version 3 (every store before reports were kept) is read and rewritten in the
    /// current version, its sessions and messages whole, and nothing reported.
    @Test func aVersion3StoreIsReadAndRewritten() throws {
        let directory = Self.directory("v3")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var bytes = Self.version2Store()
        bytes[9] = 3
        let headerSize = Self.header.encoded.count
        bytes.replaceSubrange((headerSize - 4)..<headerSize, with: Self.bigEndian(CRC32C.checksum(Array(bytes[0..<headerSize - 4]))))
        #expect(Self.scan(bytes).map(\.header.version) == .success(3))
        try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + SessionJournal.fileName))
        let journal = try Self.open(directory)
        #expect(journal.opening.migrated && journal.pendingReports.isEmpty)
        #expect(journal.restored[Self.key]?.messages.map(\.payload) == [[2], [3]] && journal.restored[Self.key]?.snapshot.handled == 7)
        journal.close()
        let again = try Self.open(directory)
        #expect(!again.opening.migrated && again.restored[Self.key]?.messages.map(\.payload) == [[2], [3]])
        #expect(Array(try [UInt8](Data(contentsOf: URL(fileURLWithPath: again.path)))[8..<10]) == [0, UInt8(Journal.version)])
        again.close()
    }

    /// A report of undelivered messages (``Journal/Record/reported(_:_:)``) stays in the store
    /// until it is taken — after its session ended, and through compactions of the file, also a
    /// report made or taken while a compaction copies in the background — and a report taken is
    /// gone; one written with the records that drop its messages (staged) applies only once its
    /// session's *ended* (or *session*) record follows. The next opening finds the ones not taken,
    /// in the order they were made, each message whole.
    @Test func aReportStaysUntilTakenThroughCompactions() throws {
        let directory = Self.directory("reports")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func open() throws -> SessionJournal {
            try SessionJournal(SessionStore(directory: directory), role: .server, identity: "plaintext", logger: testLogger(), compactionFloor: 4096)
        }
        func reported(_ report: UInt64, _ number: UInt64, key: Journal.Key = Self.key, staged: Bool = true, transmitted: Bool = true) -> Journal.Record {
            .reported(
                key,
                Journal.Reported(
                    report: report, owner: "owner", staged: staged, number: number, transmitted: transmitted, codecID: 1, typeID: "t",
                    payload: Array("{\"n\":\(number)}".utf8)))
        }
        let journal = try open()
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position, owner: "owner")))
        try journal.append(reported(7, 1), reported(7, 2))
        try journal.append(reported(9, 3, transmitted: false), .ended(Self.key))
        try journal.append(.reportTaken(Self.key, report: 7))
        // Another session's traffic, released as it goes: the file is compacted again and again;
        // a report of its own every 100 messages, the one before it taken.
        let other = Journal.Key(high: 5, low: 5)
        try journal.append(.session(Journal.Snapshot(key: other, positionID: Self.position)))
        for number in UInt64(1)...2_000 {
            try journal.append(
                .message(other, epoch: 0, number: number, codecID: 0, typeID: "m", payload: [UInt8](repeating: 1, count: 100)),
                .released(other, epoch: 0, through: number))
            if number % 100 == 0 {
                try journal.append(reported(1_000 + number, number, key: other, staged: false))
                if number > 100 { try journal.append(.reportTaken(other, report: 1_000 + number - 100)) }
            }
        }
        #expect(journal.compactionCount > 3)
        // Staged, and its session's end never written (a crash took it): the message is in its
        // session still, so the report must not apply.
        try journal.append(reported(13, 2_001, key: other))
        journal.close()
        let again = try open()
        #expect(again.pendingReports.map(\.id) == [9, 3_000])
        let report = try #require(again.pendingReports.first)
        #expect(report.key == Self.key && report.owner == "owner")
        #expect(report.messages.map(\.number) == [3] && report.messages.map(\.transmitted) == [false])
        #expect(report.messages.first?.payload == Array("{\"n\":3}".utf8) && report.messages.first?.typeID == "t")
        #expect(again.restored[Self.key] == nil, "the session itself ended")
        try again.append(.reportTaken(Self.key, report: 9), .reportTaken(other, report: 3_000))
        again.close()
        let third = try open()
        #expect(third.pendingReports.isEmpty)
        third.close()
    }

    /// A store written by the version before (format 1) is read and rewritten in the current format.
    @Test func aVersion1StoreIsReadAndRewritten() throws {
        let directory = Self.directory("v1")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var bytes = Array("LANMSGSJ".utf8) + [0, 1, 1, 9] + Array("plaintext".utf8)
        bytes += Self.bigEndian(CRC32C.checksum(bytes))
        func record(_ body: [UInt8]) {
            let length = Self.bigEndian(UInt32(body.count))
            bytes += length + Self.bigEndian(CRC32C.checksum(length)) + Self.bigEndian(CRC32C.checksum(body)) + body
        }
        let key = Self.bigEndian(Self.key.high) + Self.bigEndian(Self.key.low)
        let position = Self.bigEndian(Self.position.high) + Self.bigEndian(Self.position.low)
        record([1] + key + position + [1] + Self.bigEndian(UInt64(1)) + Self.bigEndian(UInt64(0)) + Self.bigEndian(UInt64(4)) + [1, 3] + Array("abc".utf8))
        for number in UInt64(1)...3 { record([2] + key + Self.bigEndian(number) + [1, 0, 1] + Array("t".utf8) + [UInt8(number)]) }
        record([3] + key + Self.bigEndian(UInt64(1)))
        try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + SessionJournal.fileName))
        let journal = try Self.open(directory)
        #expect(journal.opening.migrated)
        let session = try #require(journal.restored[Self.key])
        #expect(session.messages.map(\.payload) == [[2], [3]] && session.snapshot.handled == 4 && session.snapshot.owner == "abc")
        #expect(session.snapshot.everConnected && session.snapshot.nextNumber == 4)
        try journal.append(.message(Self.key, epoch: 0, number: 4, codecID: 1, typeID: "t", payload: [4]))
        journal.close()
        let again = try Self.open(directory)
        #expect(!again.opening.migrated && again.restored[Self.key]?.messages.map(\.payload) == [[2], [3], [4]])
        let header = try [UInt8](Data(contentsOf: URL(fileURLWithPath: again.path)))[8..<10]
        #expect(Array(header) == [0, UInt8(Journal.version)])
        again.close()
    }

    static func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian) { Array($0) }
    }

    /// A torn tail on disk is cut when the store opens, and the store goes on after it.
    @Test func aTornTailOnDiskIsCutAndTheStoreGoesOn() throws {
        let directory = Self.directory("torn")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try Self.open(directory)
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        try journal.append(.message(Self.key, epoch: 0, number: 1, codecID: 1, typeID: "t", payload: [1]))
        try journal.append(.message(Self.key, epoch: 0, number: 2, codecID: 1, typeID: "t", payload: [2, 2, 2, 2]))
        journal.close()
        let size = try #require(try FileManager.default.attributesOfItem(atPath: journal.path)[.size] as? Int)
        #expect(truncate(journal.path, off_t(size - 3)) == 0)
        let reopened = try Self.open(directory)
        #expect(reopened.restored[Self.key]?.messages.map(\.number) == [1])
        try reopened.append(.message(Self.key, epoch: 0, number: 2, codecID: 1, typeID: "t", payload: [9]))
        reopened.close()
        let again = try Self.open(directory)
        #expect(again.restored[Self.key]?.messages.map(\.payload) == [[1], [9]])
        again.close()
    }

    /// Compaction under load: 40,000 messages written while most are released, the file rewritten
    /// several times; what is still unacknowledged, and the largest handled count, is exactly what
    /// comes back.
    @Test func compactionUnderLoadKeepsWhatIsUnacknowledged() throws {
        let directory = Self.directory("compact")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try Self.open(directory)
        let keys = (0..<4).map { Journal.Key(high: UInt64($0), low: 42) }
        for key in keys { try journal.append(.session(Journal.Snapshot(key: key, positionID: Self.position))) }
        // Handled counts written out of order (two tasks handling at once): the largest stays,
        // in the file and through the compactions.
        try journal.append(.handled(keys[0], epoch: 0, through: 10), .handled(keys[0], epoch: 0, through: 5))
        let payload = [UInt8](repeating: 0x5A, count: 300)
        var largestFile = 0
        for number in UInt64(1)...10_000 {
            for (index, key) in keys.enumerated() {
                try journal.append(.message(key, epoch: 0, number: number, codecID: 0, typeID: "m\(index)", payload: payload + [UInt8(number & 0xFF)]))
                // Session 0 keeps its last 50, session 3 keeps everything after 9,000, the others all.
                if index == 0 && number > 50 { try journal.append(.released(key, epoch: 0, through: number - 50)) }
                if (index == 1 || index == 2) && number % 10 == 0 { try journal.append(.released(key, epoch: 0, through: number)) }
                if index == 3 && number == 9_000 { try journal.append(.released(key, epoch: 0, through: 9_000)) }
            }
            largestFile = max(largestFile, journal.sizes.file)
        }
        let sizes = journal.sizes
        journal.close()
        #expect(largestFile < 4 * 10_000 * 330, "the file was compacted (largest \(largestFile) bytes)")
        let restored = try Self.open(directory)
        #expect(restored.restored[keys[0]]?.messages.map(\.number) == Array(9_951...10_000))
        #expect(restored.restored[keys[1]]?.messages.isEmpty == true)
        #expect(restored.restored[keys[3]]?.messages.map(\.number) == Array(9_001...10_000))
        #expect(restored.restored[keys[3]]?.messages.last?.payload == payload + [UInt8(10_000 & 0xFF)])
        #expect(restored.restored[keys[3]]?.snapshot.nextNumber == 10_001)
        #expect(restored.restored[keys[0]]?.snapshot.handled == 10)
        #expect(sizes.live == 1_050 * (payload.count + 1 + 20 + 1 + 16 + 4 + 8 + 1 + 2 + 2))
        restored.close()
    }

    /// Rounds of the small-disk tests below: 10 (20 for the four writers), or
    /// `LANMSG_SMALL_DISK_ROUNDS` — CI's ThreadSanitizer stage runs 3 (6): the same compactions and
    /// threads, a third of the volume (the 10 took 61 s of its 305 there, 16 s in the plain run).
    static var smallDiskRounds: Int { Int(ProcessInfo.processInfo.environment["LANMSG_SMALL_DISK_ROUNDS"] ?? "") ?? 10 }

    /// A small disk and acknowledged messages only: nothing is ever kept for long, so no write may
    /// fail for the full disk — also when the compaction copying in the background is what filled
    /// it (CI failed a `send` so: the writer finished that compaction and gave up instead of
    /// writing again into the file it left).
    @Test(.timeLimit(.minutes(1)), arguments: [14, 16, 20]) func acknowledgedMessagesNeverFillASmallDisk(kib: Int) throws {
        for round in 0..<Self.smallDiskRounds {
            let disk = SimulatedDisk()
            disk.capacity = kib << 10
            let journal = try SessionJournal(
                SessionStore(directory: "/store"), role: .client, identity: "plaintext", logger: testLogger(),
                fileSystem: disk, compactionFloor: 4096)
            let key = Journal.Key(high: UInt64(round), low: 1)
            try journal.append(.session(Journal.Snapshot(key: key, positionID: Self.position)))
            let payload = [UInt8](repeating: 0x44, count: 300)
            for number in UInt64(1)...3_000 {
                do {
                    try journal.append(.message(key, epoch: 0, number: number, codecID: 0, typeID: "t", payload: payload))
                } catch {
                    Issue.record("message \(number) of round \(round): \(error); the disk: \(disk.roomReport)")
                    throw error
                }
                if number % 4 == 0 { try journal.append(.released(key, epoch: 0, through: number)) }
            }
            #expect(journal.compactionCount > 10)
            journal.close()
        }
    }

    /// A small disk, four writers at once: compactions follow one another (the floor is 4 KiB), the
    /// writers catch up with them and fill the disk. Every write ends — stored, or refused for the
    /// full disk — and nothing waits for a compaction queued behind the thread it waits on (CI
    /// once hung here: the compaction's thread wrote what was queued, started the next compaction
    /// and waited for its copy, which its own queue would run after it).
    @Test(.timeLimit(.minutes(1))) func writersOnASmallDiskNeverWaitForever() async throws {
        for round in 0..<2 * Self.smallDiskRounds {
            let disk = SimulatedDisk()
            disk.capacity = 48 << 10
            let journal = try SessionJournal(
                SessionStore(directory: "/store"), role: .client, identity: "plaintext", logger: testLogger(),
                fileSystem: disk, compactionFloor: 4096)
            let keys = (0..<4).map { Journal.Key(high: UInt64(round), low: UInt64($0)) }
            for key in keys { try journal.append(.session(Journal.Snapshot(key: key, positionID: Self.position))) }
            let payload = [UInt8](repeating: 0x33, count: 200)
            let refused = Locked(0)
            await withTaskGroup(of: Void.self) { group in
                for key in keys {
                    group.addTask {
                        for number in UInt64(1)...600 {
                            do {
                                try journal.append(.message(key, epoch: 0, number: number, codecID: 0, typeID: "t", payload: payload))
                                // Released as written for 400 of them; then kept, until the disk is full.
                                if number <= 400 { try journal.append(.released(key, epoch: 0, through: number)) }
                            } catch {
                                refused.withLock { $0 += 1 }
                                break
                            }
                        }
                    }
                }
            }
            #expect(journal.compactionCount > 0)
            #expect(refused.withLock { $0 } > 0, "800 kept messages of 200 bytes do not fit in 48 KiB")
            journal.close()
        }
    }

    /// Power-loss durability, group commit: 64 records written, then 64 waiters — one sync (two
    /// at most, if the first began before the last record) serves them all; a waiter for what is
    /// synced already is served at once, with no sync.
    @Test(.timeLimit(.minutes(1))) func syncWaitersShareOneSync() async throws {
        let directory = Self.directory("sync")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try SessionJournal(
            SessionStore(directory: directory, durability: .powerLoss), role: .client, identity: "plaintext", logger: testLogger())
        try journal.append(.session(Journal.Snapshot(key: Self.key, positionID: Self.position)))
        let positions = try (UInt64(1)...64).map { number in
            try journal.append(.message(Self.key, epoch: 0, number: number, codecID: 0, typeID: "t", payload: [1]))
        }
        let done = Locked(0)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for position in positions {
                group.addTask {
                    try await journal.synced(position)
                    done.withLock { $0 += 1 }
                }
            }
            try await group.waitForAll()
        }
        #expect(done.withLock { $0 } == 64)
        #expect((1...2).contains(journal.syncCount), "\(journal.syncCount) syncs for 64 waiters")
        let before = journal.syncCount
        try await journal.synced(positions[10])
        #expect(journal.syncCount == before, "already on the disk: no sync")
        journal.close()
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
