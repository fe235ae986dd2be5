import Foundation
import Logging
import Testing
#if canImport(Glibc)
import Glibc
#endif
import Testing

@testable import Discovery

/// Runs where no system bus is reachable: Tests/run.sh points D-Bus at a path that does not exist for
/// the unit-test run (changing the environment here would break other tests in the same process).
@Suite(
    .serialized,
    .enabled(
        if: ProcessInfo.processInfo.environment["DBUS_SYSTEM_BUS_ADDRESS"]?.contains("/nonexistent/") == true,
        "run with DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent/bus (Tests/run.sh does)"))
struct NoDaemonTests {
    @Test func noBusMeansFailedStateRetryAndCleanShutdown() async throws {
        let discovery = ServiceDiscovery(logger: Logger(label: "test"), backend: .avahi)  // never mDNS on the host
        var states = discovery.daemonStates().makeAsyncIterator()
        var sawFailure = false
        // The first states: connecting, then failed (no bus), retried on a timer.
        for _ in 0..<3 {
            guard let state = await states.next() else { break }
            if case .failed(let error) = state {
                #expect(error.code == .daemonUnavailable)
                #expect(error.message.contains("retrying"))
                sawFailure = true
                break
            }
        }
        #expect(sawFailure)
        // A publication made while the daemon is away is accepted and waits.
        let service = try await discovery.publish(name: "Waiting", type: "_test._tcp", port: 1)
        #expect(!service.isEstablished)
        await discovery.shutdown()
        #expect(discovery.daemonState == .stopped)
        let counters = await discovery.pollCounters
        #expect(counters.watches == 0 && counters.timeouts == 0)
    }

    /// Without a daemon a snapshot finds nothing and ends at its timeout; a malformed type is
    /// refused before browsing.
    @Test func servicesSnapshotWithoutADaemonIsEmptyAtTheTimeout() async throws {
        let discovery = ServiceDiscovery(logger: Logger(label: "test"), backend: .avahi)  // never mDNS on the host
        let found = try await discovery.services(ofType: "_test._tcp", timeout: .milliseconds(200))
        #expect(found.isEmpty)
        await #expect {
            _ = try await discovery.services(ofType: "no-underscore", timeout: .seconds(60))
        } throws: { ($0 as? DiscoveryError)?.code == .invalidArgument }
        await discovery.shutdown()
    }

    @Test func invalidTXTIsRejectedBeforeAnythingIsSent() async {
        let discovery = ServiceDiscovery(logger: Logger(label: "test"), backend: .avahi)  // never mDNS on the host
        var txt = TXTRecord()
        txt["big"] = String(repeating: "x", count: 300)
        do {
            _ = try await discovery.publish(name: "Bad", type: "_test._tcp", port: 1, txt: txt)
            Issue.record("publish accepted an invalid TXT record")
        } catch {
            #expect(error.code == .invalidTXT)
        }
        await discovery.shutdown()
    }
}
