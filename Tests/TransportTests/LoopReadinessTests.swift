import Dispatch
import Logging
import Synchronization
import TestWaits
import Testing

@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// A loop's connections are read when its one epoll set says so (`LoopReadiness`), not through a
/// Dispatch read source each. Drivers over socket pairs on a private group of one loop, so every
/// connection here shares that loop's set and its counts are theirs alone. (They were channel
/// tests over TCP; the set is Transport's, and so are these now — issue 46, 4.)
@Suite(.serialized, .timeLimit(.minutes(1))) struct LoopReadinessTests {
    /// Counts the frames a driver received and tells its close.
    final class Counter: ConnectionHandler, Sendable {
        let frames = Observed(0)  // woken by each frame, not polled
        let lastPayload = Mutex<[UInt8]>([])
        let closeReason = Mutex<CloseReason?>(nil)

        func connection(_ connection: ConnectionDriver, received frame: Frame) {
            // The payload first: a waiter woken by the count reads it at once (counted first, it
            // found the payload not yet set once in 20 runs of the unit stage).
            lastPayload.withLock { $0 = frame.payload }
            frames.update { $0 += 1 }
        }
        func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) {}
        func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
            closeReason.withLock { $0 = reason }
        }
    }

    /// Two started drivers on `loop`, over a socket pair, and their counters.
    static func pair(on loop: Loop) throws -> (a: ConnectionDriver, b: ConnectionDriver, aEvents: Counter, bEvents: Counter) {
        let (fdA, fdB) = try ConnectionDriverTests.socketPair()
        let logger = Logger(label: "readiness-test")
        let a = ConnectionDriver(fd: FileDescriptor(fdA), loop: loop, configuration: ConnectionConfiguration(), logger: logger)
        let b = ConnectionDriver(fd: FileDescriptor(fdB), loop: loop, configuration: ConnectionConfiguration(), logger: logger)
        let (aEvents, bEvents) = (Counter(), Counter())
        loop.run {
            a.start(handler: aEvents)
            b.start(handler: bEvents)
        }
        return (a, b, aEvents, bEvents)
    }


    /// More sockets readable at once than one turn serves (three turns' worth): every one is read,
    /// and every slot is given back when the connections close.
    @Test func everyReadableConnectionIsReadAndEverySlotFreed() async throws {
        let group = LoopGroup(loopCount: 1, label: "test.readiness")
        defer { withExtendedLifetime(group) {} }
        let loop = group.loops[0]
        let count = 3 * Int(LoopReadiness.batch)
        var pairs: [(a: ConnectionDriver, b: ConnectionDriver, aEvents: Counter, bEvents: Counter)] = []
        for _ in 0..<count { pairs.append(try Self.pair(on: loop)) }
        #expect(loop.run { loop.readiness.count } == 2 * count)

        // Sent while the loop is busy with this block: the receiving sockets become readable
        // together and are found in the same turns (a few of up to 64 each, not one per
        // connection: the batching is the point of the set).
        let senders = pairs.map(\.a)
        let turnsBefore = loop.run { loop.readiness.turns }
        loop.run {
            for (index, sender) in senders.enumerated() {
                _ = try? sender.trySend(Frame(kind: .message, typeID: "n", payload: [UInt8(truncatingIfNeeded: index)]))
            }
        }
        for pair in pairs { try await pair.bEvents.frames.wait("every connection read") { $0 == 1 } }
        for (index, pair) in pairs.enumerated() {
            #expect(pair.bEvents.lastPayload.withLock { $0 } == [UInt8(truncatingIfNeeded: index)])
        }
        let turns = loop.run { loop.readiness.turns } - turnsBefore
        #expect(turns <= UInt64(count / 2), "\(turns) turns to read \(count) connections")

        loop.run { for pair in pairs { pair.a.closeGracefully(reason: .localClose) } }
        for pair in pairs {
            _ = await pair.a.closed()
            _ = await pair.b.closed()
        }
        try await waitUntil("every slot given back") { loop.run { loop.readiness.count } == 0 }
    }

    /// A connection whose reading is paused leaves the set: when its peer hangs up meanwhile, the
    /// set does not report the socket over and over (a level-triggered set would spin the loop);
    /// once reading resumes, the end of file is read and the connection closes.
    @Test func aPausedSocketIsNotReportedUntilReadingResumes() async throws {
        let group = LoopGroup(loopCount: 1, label: "test.readiness")
        defer { withExtendedLifetime(group) {} }
        let loop = group.loops[0]
        let (a, b, _, bEvents) = try Self.pair(on: loop)
        // The kernel's view of the set, not a window of time: the descriptors epoll watches, as
        // /proc lists them. (It was a 200-ms window counting the loop's turns; a socket left in the
        // set after its peer hung up is reported by a level-triggered set on every turn, even with
        // no events asked for — EPOLLHUP always is — so out of the set is what "not reported" takes.)
        let epoll = loop.run { loop.readiness.descriptor }
        let bSocket = b.fd.rawValue
        #expect(try epollWatchedDescriptors(epoll).contains(bSocket), "the positive control: a reading socket is in the set")
        loop.run { b.pauseReading() }
        a.abort(.localClose)
        _ = await a.closed()
        #expect(try !epollWatchedDescriptors(epoll).contains(bSocket), "a paused socket is still in the epoll set")
        let turns = loop.run { loop.readiness.turns }
        loop.run {}  // a turn of the loop's queue later, the set was not read again for it
        #expect(loop.run { loop.readiness.turns } == turns)
        #expect(loop.run { b.isOpen })

        loop.run { b.resumeReading() }
        let reason = await b.closed()
        #expect(reason == .closedByPeer || reason == .reset, "closed with \(reason)")
        #expect(bEvents.closeReason.withLock { $0 } == reason)
        try await waitUntil("the slot given back") { loop.run { loop.readiness.count } == 0 }
    }
}
