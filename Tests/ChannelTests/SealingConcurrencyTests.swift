import Dispatch
import Foundation
import Locks
import Testing

@testable import Messaging
@testable import ProtocolCore
@testable import Transport

/// Version 2 seals where frames are sent: a sender thread seals and writes its own frame when the
/// connection is idle, the loop's flush seals everything queued behind it. Every transport message
/// must get the next nonce exactly once and reach the socket in nonce order — the receiver opens
/// each message only with the nonce it expects, so one repeated, skipped or reordered nonce fails
/// authentication and closes the connection.
@Suite("Sealing from several threads at once")
struct SealingConcurrencyTests {
    @Test func everyNonceIsUsedOnceAndInOrderWhileEightThreadsSend() async throws {
        try await withDeadline(120) {
            let server = try TestServer(SecureChannelTests.secure("server"))
            let (client, accepted) = try await server.connectedPair(SecureChannelTests.secure("client"))
            let received = Locked(0)
            let bytes = Locked(0)
            accepted.on(type: "n", as: [UInt8].self) { payload, _ in
                received.withLock { $0 += 1 }
                bytes.withLock { $0 += payload.count }
            }
            // Eight threads (not tasks: real concurrency on the two cores), each 2,000 messages of
            // mixed sizes — small ones a sender seals itself, large ones the loop's flush seals.
            let threads = 8
            let perThread = 2_000
            let sizes = [1, 40, 700, 5_000, 70_000, 300_000]
            let sent = Locked(0)
            let group = DispatchGroup()
            for thread in 0..<threads {
                group.enter()
                Thread.detachNewThread {
                    defer { group.leave() }
                    for index in 0..<perThread {
                        let size = sizes[(index + thread) % sizes.count]
                        let payload = [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: index % 50 == 0 ? size : min(size, 700))
                        // The driver's synchronous send, from this thread (waiting briefly while the queue is full).
                        let frame = Frame(kind: .message, codecID: 0, typeID: "n", payload: payload)
                        let deadline = Date().addingTimeInterval(60)
                        while Date() < deadline {
                            do {
                                if try client.driver.sendNow(frame) != nil {
                                    sent.withLock { $0 += payload.count }
                                    break
                                }
                            } catch {
                                Issue.record("send failed: \(error)")
                                return
                            }
                            usleep(200)
                        }
                    }
                }
            }
            await withCheckedContinuation { continuation in group.notify(queue: .global()) { continuation.resume() } }
            try await waitUntil("every message received, or a connection closed", seconds: 60) {
                received.withLock { $0 } == threads * perThread || !accepted.driver.loop.run { accepted.driver.isOpen }
            }
            #expect(received.withLock { $0 } == threads * perThread)
            #expect(bytes.withLock { $0 } == sent.withLock { $0 })
            // (The lifecycle belongs to each connection's loop: read it there.)
            let open = client.driver.loop.run { client.driver.isOpen } && accepted.driver.loop.run { accepted.driver.isOpen }
            #expect(open, "a connection closed: a message failed to open")
            // Both sides counted the same transport messages: sealed = opened.
            let sealed = client.driver.loop.run { client.driver.transportMessageCounts?.sent }
            let opened = accepted.driver.loop.run { accepted.driver.transportMessageCounts?.received }
            #expect(sealed != nil && sealed == opened, "sealed \(sealed ?? 0), opened \(opened ?? 0)")
            client.close()
            accepted.close()
        }
    }
}
