import Foundation
import TestWaits
import Testing

@testable import Messaging
import ProtocolCore
import Transport

/// Every way a connection ends must close its socket. The fd is closed at teardown, after it left
/// its loop's epoll set, or from the write source's cancel handler (installed at teardown, not for
/// the connection's whole life), so a missing or late close would show up here as sockets left open.
@Suite(.serialized) struct FileDescriptorTests {
    static func openDescriptors() -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
    }

    @Test func everyWayOfClosingClosesTheSockets() async throws {
        try await withDeadline(90, "closing 50 connections") {
            // Before: this process's descriptors. Allowed after: the listener's socket, up to 3
            // that Dispatch makes lazily and keeps (epoll, eventfd, timerfd) and the shared loops'
            // epoll sets (made on first use). A leak of any one way of closing leaves 20 sockets
            // open (10 rounds, both ends).
            let before = Self.openDescriptors()
            let allowed = before + 4 + LoopGroup.shared.count
            let server = try TestServer(families: [.ipv4])
            let rounds = 10
            for _ in 0..<rounds {
                // Graceful close by the client (GOODBYE, flush, peer's end of file).
                var pair = try await server.connectedPair()
                pair.client.close()
                #expect(await pair.accepted.closed() == .goodbye("closing"))
                _ = await pair.client.closed()

                // Abort by the server.
                pair = try await server.connectedPair()
                pair.accepted.abort()
                #expect(await pair.accepted.closed() == .localClose)
                _ = await pair.client.closed()

                // Close from a handler: teardown while the loop's readiness set is serving the connection.
                pair = try await server.connectedPair()
                let accepted = pair.accepted
                accepted.on(type: "bye", as: Int.self) { _, _ in accepted.abort() }
                try await pair.client.send(1, type: "bye")
                #expect(await accepted.closed() == .localClose)
                _ = await pair.client.closed()

                // With a write source: the client stops reading (nobody consumes its messages), the
                // server's send queue fills until the socket would block, then the server aborts.
                pair = try await server.connectedPair()
                let chunk = [UInt8](repeating: 7, count: 64 * 1024)
                let sender = pair.accepted
                let filling = Task { while !Task.isCancelled { try await sender.sendRaw(chunk, type: "fill") } }
                try await waitUntil("the server's send queue backs up") { sender.queuedBytes > 0 }
                sender.abort()
                #expect(await sender.closed() == .localClose)
                pair.client.abort()  // its reading is paused (full buffer): it would not see the end
                _ = await pair.client.closed()
                filling.cancel()
                _ = await filling.result

                // With a suspended write source: the socket blocked once (source made), then the
                // client read everything, the queue drained (source suspended), then the server aborts.
                pair = try await server.connectedPair()
                let drained = pair.accepted
                let chunks = 200  // 12.5 MiB: more than the client's buffer of 64 messages plus socket buffers
                let sending = Task { for _ in 0..<chunks { try await drained.sendRaw(chunk, type: "fill") } }
                try await waitUntil("the server's send queue backs up") { drained.queuedBytes > 0 }
                var iterator = pair.client.messages.makeAsyncIterator()
                for _ in 0..<chunks { _ = await iterator.next() }
                try await sending.value
                // Every byte reached the client and every send returned: once the loop's turn that
                // wrote the last bytes has ended (a hop onto its queue), nothing is queued.
                drained.queue.sync {}
                #expect(drained.queuedBytes == 0, "the server's send queue did not drain")
                drained.abort()
                #expect(await drained.closed() == .localClose)
                _ = await pair.client.closed()
            }
            try await waitUntil("every socket closed (\(before) descriptors open before)", seconds: 20) {
                Self.openDescriptors() <= allowed
            }
            #expect(Self.openDescriptors() <= allowed)
        }
    }
}
