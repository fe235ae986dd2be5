import Foundation
import TestWaits
import Testing

import Locks
@testable import Messaging
import Scheduling

/// Process-crash durability's background sync on the store's clock (issue 54, 1): armed by a
/// write, it syncs a second later on that clock — a manual one here, so the test turns the second
/// instead of waiting for it — once per second however many writes, and a closed store leaves no
/// timer. The file is real (a temporary directory).
@Suite struct JournalBackgroundSyncTests {
    @Test func aWriteIsSyncedOneSecondLaterOnTheStoresClockOncePerSecond() async throws {
        let clock = ManualScheduler()
        let directory = SessionStoreTests.directory("background-sync")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let journal = try SessionJournal(
            SessionStore(directory: directory), role: .server, identity: "plaintext", logger: testLogger(), scheduler: clock)
        let start = clock.now
        for number in UInt64(1)...3 {  // three writes: one timer
            _ = try journal.append(.message(SessionStoreTests.key, epoch: 0, number: number, codecID: 0, typeID: "t", payload: [1]))
        }
        #expect(clock.pendingDeadlines == [start + 1_000_000_000], "one background sync, a second after the first write")
        clock.advance(by: .milliseconds(999))
        #expect(journal.syncCount == 0, "synced before its second")
        clock.advance(by: .milliseconds(1))
        try await waitUntil("the background sync", timeout: .seconds(10)) { journal.syncCount == 1 }
        #expect(clock.pendingCount == 0)
        // The next write arms it again; closing the store cancels it.
        _ = try journal.append(.message(SessionStoreTests.key, epoch: 0, number: 4, codecID: 0, typeID: "t", payload: [1]))
        #expect(clock.pendingCount == 1)
        journal.close()
        #expect(clock.pendingCount == 0, "a closed store left its background sync armed")
    }

    /// What the background sync promises against a power loss, on the simulated disk (page cache
    /// and disk apart): before its second on the store's clock the records written are in the
    /// cache only — a power loss that keeps nothing unsynced loses them — and once it ran, the
    /// same power loss keeps every one. (Before the sync moved to the scheduler this could not be
    /// asked: the second was real time.)
    @Test func aPowerLossBeforeTheBackgroundSyncsSecondLosesTheRecordsAndAfterItKeepsThem() async throws {
        let clock = ManualScheduler()
        let disk = SimulatedDisk()
        let journal = try SessionJournal(
            SessionStore(directory: "/store"), role: .server, identity: "plaintext", logger: testLogger(), fileSystem: disk,
            scheduler: clock)
        let key = SessionStoreTests.key
        try journal.append(.session(Journal.Snapshot(key: key, positionID: key)))
        for number in UInt64(1)...3 {
            _ = try journal.append(.message(key, epoch: 0, number: number, codecID: 0, typeID: "t", payload: [UInt8(number)]))
        }
        var random = SeededRandom(1)
        func afterAPowerLoss() throws -> [UInt64] {
            let survivor = disk.image().materialize(.nothing, using: &random)
            let reopened = try SessionJournal(
                SessionStore(directory: "/store"), role: .server, identity: "plaintext", logger: testLogger(), fileSystem: survivor)
            defer { reopened.close() }
            return reopened.restored[key]?.messages.map(\.number) ?? []
        }
        #expect(try afterAPowerLoss() == [], "records on the disk before any sync")
        clock.advance(by: .milliseconds(999))
        #expect(try afterAPowerLoss() == [], "synced before its second")
        clock.advance(by: .milliseconds(1))
        try await waitUntil("the background sync", timeout: .seconds(10)) { journal.syncCount == 1 }
        #expect(try afterAPowerLoss() == [1, 2, 3], "the background sync left records in the cache only")
        journal.close()
    }
}
