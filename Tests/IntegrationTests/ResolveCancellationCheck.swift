import Foundation
import Testing

@testable import Discovery

/// A resolve whose task is cancelled ends then — "resolve of … was cancelled" — not at its
/// timeout (issue 54, 4: a merged browse and `resolve` of a service in several places await the
/// resolves they cancel). Once while it runs, once cancelled before it started. For either backend
/// (`resolvesRunning`: how many resolves it runs now).
func checkThatACancelledResolveEndsThen(_ discovery: ServiceDiscovery, resolvesRunning: @escaping @Sendable () async -> Int) async {
    let nobody = ServiceIdentity(name: "Nobody Here", type: "_itest-none._tcp")
    for cancelEarly in [false, true] {
        let start = ContinuousClock.now
        let resolving = Task { () -> DiscoveryError? in
            do throws(DiscoveryError) {
                _ = try await discovery.resolve(nobody, timeout: .seconds(60))
                return nil
            } catch {
                return error
            }
        }
        if !cancelEarly {
            let deadline = ContinuousClock.now + .seconds(10)
            while await resolvesRunning() == 0, ContinuousClock.now < deadline { await Task.yield() }
            #expect(await resolvesRunning() == 1, "the resolve never started")
        }
        resolving.cancel()
        let error = await resolving.value
        #expect(error?.code == .shutDown && error?.message.contains("was cancelled") == true, "\(String(describing: error))")
        #expect(ContinuousClock.now - start < .seconds(30), "it ran to its timeout: \(ContinuousClock.now - start)")
        #expect(await resolvesRunning() == 0)
        Harness.measured("a resolve cancelled \(cancelEarly ? "before it started" : "while it ran") → ended", ContinuousClock.now - start)
    }
}
