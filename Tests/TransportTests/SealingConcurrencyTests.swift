import Dispatch
import Foundation
import Logging
import Synchronization
import TestWaits
import Testing

@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

/// Version 2 seals where frames are sent: a sender thread seals and writes its own frame when the
/// connection is idle, the loop's flush seals everything queued behind it. Every transport message
/// must get the next nonce exactly once and reach the socket in nonce order — the receiver opens
/// each message only with the nonce it expects, so one repeated, skipped or reordered nonce fails
/// authentication and closes the connection. Two drivers over a socket pair, encrypted with fixed
/// keys (the handshake is Messaging's; the sealing is Transport's — issue 46, 4).
@Suite("Sealing from several threads at once", .timeLimit(.minutes(2)))
struct SealingConcurrencyTests {
    /// Counts frames and payload bytes received, and tells the close: a test waits on it woken by
    /// each change, not by a poll.
    final class Counter: ConnectionHandler, Sendable {
        struct Counts: Sendable {
            var frames = 0
            var bytes = 0
            var closed = false
        }
        let counts = Observed(Counts())
        var frames: Int { counts.value.frames }
        var bytes: Int { counts.value.bytes }
        func connection(_ connection: ConnectionDriver, received frame: Frame) {
            counts.update {
                $0.frames += 1
                $0.bytes += frame.payload.count
            }
        }
        func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) {}
        func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) { counts.update { $0.closed = true } }
    }

    /// Two drivers over a socket pair whose transport is on: what one seals, the other opens.
    static func encryptedPair() throws -> (sender: ConnectionDriver, receiver: ConnectionDriver, received: Counter) {
        let (fdA, fdB) = try ConnectionDriverTests.socketPair()
        let logger = Logger(label: "sealing-test")
        let sender = ConnectionDriver(fd: FileDescriptor(fdA), loop: LoopGroup.shared.next(), configuration: ConnectionConfiguration(), logger: logger)
        let receiver = ConnectionDriver(fd: FileDescriptor(fdB), loop: LoopGroup.shared.next(), configuration: ConnectionConfiguration(), logger: logger)
        let (one, two) = ([UInt8](repeating: 0x11, count: 32), [UInt8](repeating: 0x22, count: 32))
        let received = Counter()
        sender.queue.sync {
            sender.startRaw(handler: Counter())
            sender.beginEncryption(SecureTransport(send: NoiseCipherState(key: one), receive: NoiseCipherState(key: two)), leftover: [])
        }
        receiver.queue.sync {
            receiver.startRaw(handler: received)
            receiver.beginEncryption(SecureTransport(send: NoiseCipherState(key: two), receive: NoiseCipherState(key: one)), leftover: [])
        }
        return (sender, receiver, received)
    }

    @Test func everyNonceIsUsedOnceAndInOrderWhileEightThreadsSend() async throws {
        let (client, accepted, received) = try Self.encryptedPair()
        defer {
            client.abort(.localClose)
            accepted.abort(.localClose)
        }
        // Eight threads (not tasks: real concurrency on the two cores), each 2,000 messages of
        // mixed sizes — small ones a sender seals itself, large ones the loop's flush seals.
        let threads = 8
        let perThread = 2_000
        let sizes = [1, 40, 700, 5_000, 70_000, 300_000]
        let sent = Atomic<Int>(0)
        let failures = Mutex<[String]>([])
        let group = DispatchGroup()
        // One deadline for every thread: none sends on after the test's time.
        let deadline = Date().addingTimeInterval(60)
        for thread in 0..<threads {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                for index in 0..<perThread {
                    let size = sizes[(index + thread) % sizes.count]
                    let payload = [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: index % 50 == 0 ? size : min(size, 700))
                    // The driver's synchronous send, from this thread (waiting briefly while the queue is full).
                    let frame = Frame(kind: .message, codecID: 0, typeID: "n", payload: payload)
                    guard Date() < deadline else { return }
                    while Date() < deadline {
                        do {
                            if try client.sendNow(frame) != nil {
                                sent.add(payload.count, ordering: .relaxed)
                                break
                            }
                        } catch {
                            failures.withLock { $0.append("send failed: \(error)") }
                            return
                        }
                        usleep(200)
                    }
                }
            }
        }
        await withCheckedContinuation { continuation in group.notify(queue: .global()) { continuation.resume() } }
        #expect(failures.withLock { $0 }.isEmpty)
        try await received.counts.wait("every message received, or the connection closed", timeout: .seconds(60)) {
            $0.frames == threads * perThread || $0.closed
        }
        #expect(received.frames == threads * perThread)
        #expect(received.bytes == sent.load(ordering: .relaxed))
        // (The lifecycle belongs to each connection's loop: read it there.)
        let open = client.loop.run { client.isOpen } && accepted.loop.run { accepted.isOpen }
        #expect(open, "a connection closed: a message failed to open")
        // Both sides counted the same transport messages: sealed = opened.
        let sealed = client.loop.run { client.transportMessageCounts?.sent }
        let opened = accepted.loop.run { accepted.transportMessageCounts?.received }
        #expect(sealed != nil && sealed == opened, "sealed \(sealed ?? 0), opened \(opened ?? 0)")
    }
}
