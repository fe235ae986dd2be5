import Foundation
import Messaging
import Testing

/// The README's Getting started, run as written against the avahi-daemon of host "a".
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct GettingStartedIntegrationTests {
    @Test func theReadmeBoardAndClientWork() async throws {
        let logger = Harness.logger("getting-started")
        // The client first: it waits for the board to appear.
        let client = Task { try await useBoard(logger: logger) }
        let board = Task { try await runBoard(logger: logger) }
        let greeting = try await client.value
        #expect(greeting == "hello")
        board.cancel()  // like SIGTERM: the service group shuts the server down gracefully
        try await board.value
    }
}
