import Discovery
import Locks

/// What a ``MessageServer`` needs from discovery: publish a service and later withdraw it. The
/// server uses `ServiceDiscovery`; tests of the server's lifecycle give it a publisher they control.
package protocol ServicePublisher: Sendable {
    func publishService(name: String?, type: String, port: UInt16, txt: TXTRecord) async throws(DiscoveryError)
        -> any ServicePublication
}

/// A published service as the server sees it.
package protocol ServicePublication: Sendable {
    var events: AsyncStream<PublicationEvent> { get }
    var name: String { get }
    func updateTXT(_ txt: TXTRecord) async throws(DiscoveryError)
    func unpublish() async
}

extension ServiceDiscovery: ServicePublisher {
    package func publishService(name: String?, type: String, port: UInt16, txt: TXTRecord) async throws(DiscoveryError)
        -> any ServicePublication
    {
        try await publish(name: name, type: type, port: port, txt: txt)
    }
}

extension PublishedService: ServicePublication {}

/// Runs `body`; returns false if it did not finish within `timeout`. Does not wait for a body that
/// ignores cancellation (it keeps running in the background; the caller decides what to do).
func raceTimeout(_ timeout: Duration, _ body: @escaping @Sendable () async -> Void) async -> Bool {
    let race = Race()
    return await withCheckedContinuation { continuation in
        race.set(continuation)
        let timer = Task {
            // Cancelled (the body finished first): not a timeout. Finishing with false here would
            // race the body's finish(true) and could report a timeout for a body that completed.
            do { try await Task.sleep(for: timeout) } catch { return }
            race.finish(false)
        }
        Task {
            await body()
            race.finish(true)
            timer.cancel()
        }
    }
}

/// Resumes a continuation once, with whichever outcome comes first.
private final class Race: Sendable {
    private let continuation = Locked<CheckedContinuation<Bool, Never>?>(nil)
    func set(_ value: CheckedContinuation<Bool, Never>) { continuation.withLock { $0 = value } }
    func finish(_ outcome: Bool) {
        let waiting = continuation.withLock { value -> CheckedContinuation<Bool, Never>? in
            defer { value = nil }
            return value
        }
        waiting?.resume(returning: outcome)
    }
}
