import Dispatch
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
        let clock: any Scheduler = wideArea?.scheduler ?? DispatchScheduler()
        // Every place at once, in a group with two timers as children: the deadline, and half a
        // second after the first answer. The first of them, or the last place's answer, ends the
        // wait; what still runs is cancelled and awaited (the backends' resolves end on
        // cancellation), so nothing of this call outlives it.
        let outcome = await withTaskGroup(of: (index: Int, result: Result<ResolvedService, DiscoveryError>)?.self) { group in
            for (index, place) in places.enumerated() {
                let sightings = Self.isLinkDomain(place.domain) ? Array(service.seenOn) : []
                group.addTask {
                    do throws(DiscoveryError) {
                        return (index, .success(try await self.resolveOne(place, sightings: sightings, ipVersion: version, timeout: timeout)))
                    } catch {
                        return (index, .failure(error))
                    }
                }
            }
            group.addTask {
                await clock.sleep(for: timeout)
                return nil
            }
            var results = [Result<ResolvedService, DiscoveryError>?](repeating: nil, count: places.count)
            var graceStarted = false
            while let next = await group.next() {
                guard let (index, result) = next else { break }  // the deadline or the grace
                results[index] = result
                if results.allSatisfy({ $0 != nil }) { break }
                if case .success = result, !graceStarted {
                    graceStarted = true
                    group.addTask {
                        await clock.sleep(for: .milliseconds(500))
                        return nil
                    }
                }
            }
            group.cancelAll()
            return results
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
            // Cancelled: said as a one-place resolve says it (the places' answers were cut short).
            if Task.isCancelled { throw DiscoveryError(.shutDown, "resolve of \(service.identity) was cancelled") }
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

extension ResolvedService {
    /// Only the addresses of one IP version (all for `.any`).
    func only(_ version: IPVersion) -> ResolvedService {
        guard version != .any else { return self }
        return ResolvedService(
            identity: identity, hostName: hostName, port: port, txt: txt,
            addresses: addresses.filter { $0.ip.version == version }, isLocal: isLocal)
    }
}
