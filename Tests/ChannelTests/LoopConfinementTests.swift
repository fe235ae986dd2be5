import Testing

@testable import Messaging

/// A channel's loop-confined state is checked, not only documented: in debug builds, touching it
/// from another thread stops the process at once (`MessageChannel.assertOnLoop`), instead of
/// racing silently until ThreadSanitizer happens to see it.
@Suite struct LoopConfinementTests {
    @Test func loopConfinedStateTouchedOffTheLoopStopsTheProcess() async {
        #if DEBUG
            let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
                let server = try TestServer(config("server"))
                let (client, _) = try await server.connectedPair(config("client"))
                _ = client.healthOnLoop()  // from this task, not the client's loop
            }
            let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
            #expect(stderr.contains("MessageChannel.healthOnLoop() must run on the connection's loop"), "\(stderr.suffix(500))")
        #endif
    }

    @Test func onTheLoopItIsAllowed() async throws {
        let server = try TestServer(config("server"))
        let (client, _) = try await server.connectedPair(config("client"))
        let health = client.queue.sync { client.healthOnLoop() }
        #expect(health.reconnects == 0)
        client.close()
    }
}
