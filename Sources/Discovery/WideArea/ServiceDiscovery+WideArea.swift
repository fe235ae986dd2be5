import Dispatch
import Locks
import Scheduling

extension ServiceDiscovery {
    /// Resolves a service found in several places (the link and unicast domains) in all of them at
    /// once and merges the answers: the link's addresses first. Returns when every place answered,
    /// or half a second after the first answer, or at `timeout`.
    func resolveEverywhere(
        _ service: DiscoveredService, ipVersion: IPVersion, timeout: Duration
    ) async throws(DiscoveryError) -> ResolvedService {
        let version = try configuration.effectiveVersion(ipVersion)
        let places = service.locations
        let collector = ResolveCollector(count: places.count)
        let outcome: [Result<ResolvedService, DiscoveryError>?] = await withCheckedContinuation { continuation in
            collector.start(continuation, timeout: timeout)
            for (index, place) in places.enumerated() {
                let sightings = Self.isLinkDomain(place.domain) ? Array(service.seenOn) : []
                Task {
                    let result: Result<ResolvedService, DiscoveryError>
                    do throws(DiscoveryError) {
                        result = .success(try await self.resolveOne(place, sightings: sightings, ipVersion: version, timeout: timeout))
                    } catch {
                        result = .failure(error)
                    }
                    collector.record(index, result)
                }
            }
        }
        var merged: ResolvedService?
        var addresses: [ServiceAddress] = []
        var lastError: DiscoveryError?
        for result in outcome {
            switch result {
            case .success(let resolved)?:
                if merged == nil { merged = resolved }
                // The same address from a second place adds nothing (the first, the link's, keeps its interface).
                for address in resolved.addresses where !addresses.contains(where: { $0.ip == address.ip && $0.port == address.port }) {
                    addresses.append(address)
                }
            case .failure(let error)?:
                lastError = error
            case nil:
                continue
            }
        }
        guard let first = merged else {
            metrics?.count(.resolveFailed)
            throw lastError ?? DiscoveryError(.timedOut, "no answer from \(service.identity) within \(timeout)")
        }
        metrics?.count(.resolved)
        return ResolvedService(
            identity: service.identity, hostName: first.hostName, port: first.port, txt: first.txt, addresses: addresses,
            isLocal: first.isLocal)
    }

    private func resolveOne(
        _ place: ServiceIdentity, sightings: [DiscoveredService.Sighting], ipVersion: IPVersion, timeout: Duration
    ) async throws(DiscoveryError) -> ResolvedService {
        if let wideArea, !Self.isLinkDomain(place.domain) {
            return try await wideArea.resolve(place, timeout: timeout).only(ipVersion)
        }
        let request = ResolveRequest(identity: place, sightings: sightings, interface: nil, ipVersion: ipVersion)
        return try await selector.backend().resolve(request, timeout: timeout).get()
    }

    /// Watches a service in a unicast domain: resolves it again every record TTL (at least every
    /// poll interval), reporting each change.
    func watchWideArea(
        _ identity: ServiceIdentity, wideArea: WideArea, ipVersion: IPVersion, continuation: AsyncStream<ResolvedService>.Continuation,
        ended: @escaping @Sendable () -> Void
    ) -> Task<Void, Never> {
        Task {
            defer { ended() }
            var last: ResolvedService?
            let interval = min(wideArea.settings.pollInterval, .seconds(Int64(wideArea.settings.recordTTL)))
            while !Task.isCancelled {
                if let resolved = try? await wideArea.resolve(identity, timeout: wideArea.settings.queryTimeout).only(ipVersion),
                    resolved != last
                {
                    last = resolved
                    continuation.yield(resolved)
                }
                await wideArea.scheduler.sleep(for: interval)
            }
        }
    }
}

/// Gathers the answers of several resolves; ends when all answered, half a second after the first
/// success, or at the timeout — whichever comes first (Dispatch timers).
private final class ResolveCollector: Sendable {
    typealias Results = [Result<ResolvedService, DiscoveryError>?]

    private enum Input {
        case start(CheckedContinuation<Results, Never>, timeout: Duration)
        case record(Int, Result<ResolvedService, DiscoveryError>)
        case timeUp
    }

    private struct State {
        var results: Results
        var continuation: CheckedContinuation<Results, Never>?
        var graceStarted = false
        /// The timeout and grace timers, cancelled when the answer is given.
        var timers: [any DispatchSourceTimer] = []
    }
    private let state: Locked<State>

    init(count: Int) { state = Locked(State(results: Array(repeating: nil, count: count))) }

    func start(_ continuation: CheckedContinuation<Results, Never>, timeout: Duration) {
        apply(.start(continuation, timeout: timeout))
    }

    func record(_ index: Int, _ result: Result<ResolvedService, DiscoveryError>) {
        apply(.record(index, result))
    }

    /// The one door: the answer is given (once) after the lock is released.
    private func apply(_ input: Input) {
        let answer = state.withLock { state -> (CheckedContinuation<Results, Never>, Results, [any DispatchSourceTimer])? in
            var done = false
            switch input {
            case .start(let continuation, let timeout):
                state.continuation = continuation
                state.timers.append(timer(after: timeout))
            case .record(let index, let result):
                state.results[index] = result
                done = state.results.allSatisfy { $0 != nil }
                if !done, case .success = result, !state.graceStarted {
                    state.graceStarted = true
                    state.timers.append(timer(after: .milliseconds(500)))
                }
            case .timeUp:
                done = true
            }
            guard done, let continuation = state.continuation else { return nil }
            defer {
                state.continuation = nil
                state.timers = []
            }
            return (continuation, state.results, state.timers)
        }
        guard let (continuation, results, timers) = answer else { return }
        for timer in timers { timer.cancel() }
        continuation.resume(returning: results)
    }

    private func timer(after delay: Duration) -> any DispatchSourceTimer {
        let timer = DispatchSource.makeTimerSource(queue: .global())
        timer.schedule(deadline: .now() + delay.dispatchInterval)
        timer.setEventHandler { [weak self] in self?.apply(.timeUp) }
        timer.activate()
        return timer
    }
}

extension ResolvedService {
    /// Only the addresses of one IP version (all for `.any`).
    func only(_ version: IPVersion) -> ResolvedService {
        guard version != .any else { return self }
        return ResolvedService(
            identity: identity, hostName: hostName, port: port, txt: txt,
            addresses: addresses.filter { $0.ip.version == version }, isLocal: isLocal)
    }
}
