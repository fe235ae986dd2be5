@_spi(Programs) import Discovery
import Locks
import Logging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

/// A server asked for by name whose key this client knows is looked for by that key (issue 43,
/// 22): whatever the instance is called now, impostors refused and reported.
extension MessageClient {
    /// The keys this client knows for the server it asks for by name: its trust policy's only (the
    /// trust store's entry for the name, or its pins). Never the peer memory's: a key forgotten in
    /// the trust store is forgotten (issue 57). Empty for a plaintext channel, a server asked for
    /// by type only or by address, a name seen for the first time or forgotten.
    func knownKeys() -> Set<Fingerprint> {
        guard case .service(let name?, _, _) = target,
            let (_, policy) = try? configuration.channel.security.resolved()
        else { return [] }
        return policy.knownKeys(forName: name)
    }

    enum FoundByKey {
        case connected(MessageChannel, [SocketAddress])
        /// Nothing named so or announcing the key answered, and no instance was refused: fall back
        /// to the remembered addresses (when there are any).
        case notFound
    }

    /// Looks for the server called `name` by the key this client knows for it (issue 43, 22: an
    /// impostor that claims the name first pushes the real server to "name #2"). Browses every
    /// instance of `type`; resolves each new one; tries the one named `name`, then those that announce
    /// a known key in TXT `fp` (whatever their name); proves the key in the handshake. One
    /// that presents another key is refused and reported (a `waiting` event, code
    /// `untrustedServer`), and the search goes on: for ``ClientConfiguration/browseTimeout`` (from
    /// the first refusal when waiting for the server), or for good with
    /// ``ClientConfiguration/keepsLookingForKnownKey``. Then the refusal is final.
    ///
    /// `last`: the addresses of a connection just lost (issue 53, 7). Tried before each round while
    /// they refuse the connection (a server restarting with its session store listens on the same
    /// port again, long before discovery announces it: Avahi probes a name for about a second),
    /// the rounds then short; dropped once they answer otherwise (another machine, no host).
    func findByKey(
        _ keys: Set<Fingerprint>, name: String, type: String, discovery: ServiceDiscovery, waiting: Bool,
        last: [SocketAddress]? = nil
    ) async throws(MessagingError) -> FoundByKey {
        var last = last
        let hints = Set(keys.map(\.short))
        let wantedText = keys.map(\.short).sorted().joined(separator: ", ")
        let started = ContinuousClock.now
        var firstRefusal: ContinuousClock.Instant?
        var lastRefusal: MessagingError?
        var refusalCount = 0
        var lastFailure: MessagingError?
        /// Instances seen, by name: examined once while they stay (again if they leave and return).
        var examined: Set<String> = []
        let reportedWaiting = Locked(false)
        let queue = self.queue
        func deadline() -> ContinuousClock.Instant? {
            if configuration.keepsLookingForKnownKey { return nil }
            if let firstRefusal, waiting { return firstRefusal + configuration.browseTimeout }
            return waiting ? nil : started + configuration.browseTimeout
        }
        var refusedNames: Set<String> = []
        /// After a round whose candidates could not be connected to (a server restarting, or moved
        /// to another port): how soon the next round looks again — from the reconnect policy's
        /// first delay, doubling, at most a second (issue 53, 7: it waited for news for a whole
        /// browse timeout, 5 s, before a restarted server was tried again).
        var retry: Duration?
        let first = configuration.reconnect?.initialDelay ?? .milliseconds(250)
        while !Task.isCancelled {
            let remaining = deadline().map { ContinuousClock.now.duration(to: $0) } ?? .seconds(86_400)
            guard remaining > .zero else { break }
            if let addresses = last {
                do {
                    let channel = try await connect((addresses, nil), requiring: keys)
                    logger.info("reconnected at the address of the lost connection", metadata: ["address": "\(addresses[0])"])
                    return .connected(channel, addresses)
                } catch let error as TransportError where error.everyAddressRefused {
                    retry = min(retry.map { $0 * 2 } ?? first, ClientLifecycle<MessageChannel, Void>.refusedRetryCap)
                } catch {
                    last = nil
                }
            }
            let seen: [DiscoveredService]
            let known = examined
            // Within one browse an instance may leave and another come back under its name (an
            // impostor gone, the real server back): a name seen in this browse that left ends it,
            // so that the name is examined again.
            let seenHere = Locked<Set<String>>([])
            let networkAnswered = Locked(false)
            do {
                // One browse timeout at a time: after each, every instance is examined again (an
                // instance can change behind a name that stayed).
                seen = try await discovery.services(ofType: type, timeout: min(remaining, retry ?? configuration.browseTimeout)) {
                    [weak self] seen, allForNow in
                    let names = Set(seen.map(\.name))
                    let left = seenHere.withLock { here in
                        here.formUnion(names)
                        return !here.isSubset(of: names)
                    }
                    if left { return true }
                    // Waiting for the server: said once, when the network answered without it.
                    if waiting, allForNow, !seen.contains(where: { $0.name == name }),
                        reportedWaiting.withLock({ reported in defer { reported = true }; return !reported })
                    {
                        let error = MessagingError(.serviceNotFound, "waiting for a \(type) service named '\(name)' (or with its key \(wantedText)) to appear")
                        self?.lifecycle { $0.waiting(error) }
                        queue.push(.waiting(error))
                    }
                    // The name asked for goes at once; others once the network has answered (about
                    // a second), so that all are ordered together.
                    if seen.contains(where: { $0.name == name && !known.contains($0.name) }) { return true }
                    let answered = networkAnswered.withLock { answered in
                        answered = answered || allForNow
                        return answered
                    }
                    return answered && seen.contains { !known.contains($0.name) }
                }
            } catch {
                throw MessagingError(.serviceNotFound, "cannot browse for \(type): \(error.message)", underlying: error)
            }
            examined.formIntersection(seen.map(\.name))
            if !seen.contains(where: { !known.contains($0.name) }) && seenHere.withLock({ $0.isSubset(of: Set(seen.map(\.name))) }) {
                examined = []  // a whole browse timeout without news: look at everything again
                continue
            }
            let fresh = seen.filter { !examined.contains($0.name) }
            examined.formUnion(fresh.map(\.name))
            // The candidates: named as asked, or announcing a known key (the TXT `fp` is a hint; the
            // handshake proves the key). Resolved together: one slow instance does not hold up the
            // others.
            let resolveTimeout = configuration.resolveTimeout
            let resolved = await withTaskGroup(of: (DiscoveredService, ResolvedService?).self) { group in
                for service in fresh {
                    group.addTask { (service, try? await discovery.resolve(service, timeout: resolveTimeout)) }
                }
                var all: [(DiscoveredService, ResolvedService?)] = []
                for await pair in group { all.append(pair) }
                return all
            }
            var candidates: [(service: DiscoveredService, addresses: [SocketAddress], hinted: Bool)] = []
            for case (let service, let found?) in resolved {
                let hinted = found.txt["fp"].map { hints.contains($0) } ?? false
                guard hinted || service.name == name else { continue }
                let addresses = found.addresses.compactMap { SocketAddress(bytes: $0.ip.bytes, port: $0.port, scopeID: $0.scopeID) }
                if !addresses.isEmpty { candidates.append((service, addresses, hinted)) }
            }
            // The name asked for first: the usual case (it is the server), and an impostor holding it
            // is proven one in the handshake — refused before this client's key is sent (message
            // 3) — and reported; then those announcing a known key.
            candidates.sort { ($0.service.name == name ? 0 : 1, $0.hinted ? 0 : 1) < ($1.service.name == name ? 0 : 1, $1.hinted ? 0 : 1) }
            var unreachable = false
            for candidate in candidates {
                do {
                    let channel = try await connect((candidate.addresses, nil), requiring: keys)
                    if candidate.service.name != name {
                        logger.notice(
                            "found '\(name)' by its key as '\(candidate.service.name)' (another instance has the name\(refusalCount == 0 ? "" : ": refused"))",
                            metadata: ["key": "\(channel.peerIdentity?.fingerprint.short ?? "?")"])
                    }
                    return .connected(channel, candidate.addresses)
                } catch let error as TransportError where error.code == .untrustedKey {
                    // An impostor (or a server whose key changed): refused loudly, and the search goes on.
                    let refusal = MessagingError(
                        .untrustedServer,
                        "refused '\(candidate.service.name)' (\(type)) at \(candidate.addresses.first.map { "\($0)" } ?? "?"): "
                            + firstLine(of: error.message, more: "the key this client knows for '\(name)' is \(wantedText)")
                            + "; still looking for that key among the \(type) services",
                        underlying: error)
                    lastRefusal = refusal
                    refusalCount += 1
                    firstRefusal = firstRefusal ?? .now
                    // Loud the first time per name; a client that keeps looking meets it again.
                    if refusedNames.insert(candidate.service.name).inserted {
                        logger.warning("\(refusal.message)")
                    } else {
                        logger.info("\(refusal.message)")
                    }
                    if waiting { lifecycle { $0.waiting(refusal) } }
                    queue.push(.waiting(refusal))
                } catch {
                    unreachable = true
                    lastFailure = MessagingError(
                        .connectFailed, "cannot connect to \(candidate.service.identity): \(error)", underlying: error)
                }
            }
            if last != nil { continue }  // (its cadence set above)
            retry = unreachable ? min(retry.map { $0 * 2 } ?? first, ClientLifecycle<MessageChannel, Void>.refusedRetryCap) : nil
        }
        if let underlying = lastRefusal?.underlying as? TransportError {
            // Final, as a refusal always was: the whole warning, and what was looked for.
            throw MessagingError(
                .untrustedServer,
                underlying.message + "\nNo \(type) service presented the key this client knows for '\(name)' (\(wantedText)) "
                    + "within \(configuration.browseTimeout) (refused: \(refusalCount)).",
                underlying: underlying)
        }
        if let lastFailure { throw lastFailure }
        return .notFound
    }
}
