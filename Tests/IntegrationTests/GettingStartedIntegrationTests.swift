import Foundation
import Messaging
import Testing

/// The README's Getting started, run as written against the avahi-daemons of hosts "a" and "b": the
/// readme-board program (Tests/ReadmeBoard, the README's code) as the board on host b and as the
/// client here, then the board stopped with SIGTERM as a user would.
@Suite(.serialized, .enabled(if: Harness.isActive, Harness.disabledReason))
struct GettingStartedIntegrationTests {
    @Test func theReadmeBoardAndClientWorkAndSIGTERMStopsTheBoard() async throws {
        let program = Harness.binary("readme-board")
        let data = NSTemporaryDirectory() + "readme-board-\(UUID().uuidString.prefix(8))"
        // The client first: it waits for the board to appear.
        let client = try Harness.spawn(onB: false, ["env", "XDG_DATA_HOME=\(data)-client", program, "client"])
        defer { client.stop() }
        let board = try Harness.spawn(onB: true, ["env", "XDG_DATA_HOME=\(data)-board", program, "board"])
        defer { board.stop() }
        try await client.waitForOutput("greeting: hello", timeout: .seconds(30))
        #expect(client.wait(timeout: .seconds(10)) == 0, "\(client.text)")
        // SIGTERM: the service group stops the board's loop, then the server; the program ends.
        kill(board.pid, SIGTERM)
        #expect(board.wait(timeout: .seconds(10)) == 0, "the board did not stop on SIGTERM: \(board.text)")
        #expect(board.text.contains("board stopped"), "\(board.text)")
    }
}
