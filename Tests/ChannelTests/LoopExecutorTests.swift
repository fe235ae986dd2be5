import Foundation
import TestWaits
import Testing

@testable import Messaging
import ProtocolCore
import Transport

/// `MessageChannel.taskExecutor`: a task preferring it runs on the channel's loop queue, where its
/// sends pile up in the inbox and are written when it suspends.
@Suite struct LoopExecutorTests {
    /// Receives `n` messages and checks they carry 0, 1, 2, … in order.
    final class InOrder: Sendable {
        /// The next value expected and how many came out of order; a wait is woken by each arrival.
        let state = Observed((next: 0, wrong: 0))
        func receive(_ value: Int) {
            state.update { state in
                if value != state.next { state.wrong += 1 }
                state.next += 1
            }
        }
        var received: Int { state.value.next }
        var outOfOrder: Int { state.value.wrong }
    }

    @Test func aTaskOnTheLoopExecutorRunsOnTheLoopAndItsSendsArriveInOrder() async throws {
        try await withDeadline(60) {
            // A small send queue, so that the task often waits in the slow path — on the very queue
            // that must drain the inbox for it to go on (a deadlock if the wait blocked the queue).
            var clientConfiguration = config("client")
            clientConfiguration.connection.sendHighWaterMark = 16 * 1024
            clientConfiguration.connection.sendLowWaterMark = 4 * 1024
            let server = try TestServer(families: [.ipv4])
            let (client, accepted) = try await server.connectedPair(clientConfiguration)
            let order = InOrder()
            accepted.on(type: "n", as: Int.self) { value, _ in order.receive(value) }
            let count = 20_000
            let loop = client.driver.loop
            let everySendOnTheLoop = try await withTaskExecutorPreference(client.taskExecutor) {
                var onLoop = true
                for i in 0..<count {
                    if !loop.isCurrent { onLoop = false }
                    try await client.send(i, type: "n")
                }
                return onLoop
            }
            #expect(everySendOnTheLoop)
            #expect(client.maxQueuedBytes > 0)  // the queue was used (frames piled up), not only direct writes
            try await order.state.wait("all \(count) messages received") { $0.next == count }
            #expect(order.outOfOrder == 0)
            // Awaiting the channel from the loop executor works too (a request answered by the peer).
            accepted.on(type: "echo", as: String.self) { text, message in
                _ = try? accepted.trySend(text, type: "echo", replyTo: message.sequence)
            }
            let reply = try await withTaskExecutorPreference(client.taskExecutor) {
                try await client.request("ping", type: "echo", expecting: String.self)
            }
            #expect(reply == "ping")
        }
    }
}
