import MDNSCore

/// The DNS UPDATE messages of one wide-area registration, built without I/O: what
/// `WideAreaRegistration` sends for each of `RegistrationMachine`'s updates, and how it tells an
/// earlier registration of its own (a crash) from someone else's. The unit tests build the same
/// messages and send them to a server in memory (`FakeDNSServer`).
struct RegistrationUpdates: Sendable {
    /// The service type (`_chat._tcp`).
    let type: String
    let port: UInt16
    /// The records' TTL (seconds).
    let ttl: UInt32
    /// How long the records are meant to live unless refreshed (the update lease, and the TXT
    /// `expires` stamp).
    let lease: Duration
    /// The domain, for messages.
    let domain: String

    /// One update, ready to sign and send.
    struct Built: Sendable {
        var message: DNSMessage
        var servers: [DNSServerAddress]
        /// The records it would create (register, replace, refresh): what a stop must delete.
        var records: RegisteredRecords?
        /// What it is, for messages ("'Lobby' in lab.home.arpa").
        var what: String
    }

    /// The service's PTR owner and the instance's name in `zone`.
    func names(_ name: String, zone: DNSName) throws(DiscoveryError) -> (service: DNSName, instance: DNSName) {
        guard let typeName = DNSName(type), let service = DNSName(labels: typeName.labels + zone.labels),
            let instance = DNSName(instance: name, service: service)
        else {
            throw DiscoveryError(.invalidArgument, "'\(name)' as \(type) in \(zone) is not a valid DNS name (too long?)")
        }
        return (service, instance)
    }

    /// The message for `update` (a registration needs the `plan`; a deletion uses the records' own
    /// zone and servers), with `txt` stamped to expire one lease after `now` (seconds since the epoch).
    func build(
        _ update: RegistrationMachine.Update, plan: RegistrationPlan?, txt: TXTRecord, now: UInt64, id: UInt16
    ) throws(DiscoveryError) -> Built {
        switch update {
        case .delete(let registration):
            let (service, instance) = try names(registration.name, zone: registration.zone)
            let message = DNSMessage.update(
                id: id, zone: registration.zone, prerequisites: [.rrsetEquals(registration.srv)],
                updates: [
                    .deleteRecord(ResourceRecord(name: service, data: .ptr(instance), ttl: 0)),
                    .deleteName(instance),
                ])
            return Built(
                message: message, servers: registration.servers, records: nil,
                what: "the removal of '\(registration.name)' from \(domain)")
        case .register(let name), .replace(let name, _):
            let (plan, srv, updates) = try additions(name, plan, txt: txt, now: now)
            let records = RegisteredRecords(name: name, zone: plan.zone.name, servers: plan.servers, srv: srv)
            if case .replace(_, let earlier) = update {
                // Replace exactly what was read: if it changed meanwhile (cleaned up, taken by
                // another host), the prerequisite fails and nothing of anyone else's is touched.
                let message = updateMessage(
                    id: id, zone: plan.zone.name, prerequisites: earlier.map { .rrsetEquals($0) },
                    updates: [.deleteName(srv.name)] + updates)
                return Built(message: message, servers: plan.servers, records: records, what: "our earlier '\(name)' in \(domain)")
            }
            let message = updateMessage(id: id, zone: plan.zone.name, prerequisites: [.nameNotInUse(srv.name)], updates: updates)
            return Built(message: message, servers: plan.servers, records: records, what: "'\(name)' in \(domain)")
        case .refresh(let current):
            let (plan, srv, updates) = try additions(current.name, plan, txt: txt, now: now)
            let message = updateMessage(
                id: id, zone: plan.zone.name, prerequisites: [.rrsetEquals(current.srv)],
                updates: [.deleteRRset(srv.name, type: DNSType.txt), .deleteRRset(srv.name, type: DNSType.srv)] + updates)
            return Built(
                message: message, servers: plan.servers,
                records: RegisteredRecords(name: current.name, zone: plan.zone.name, servers: plan.servers, srv: srv),
                what: "'\(current.name)' in \(domain)")
        }
    }

    /// `txt` with the reserved `expires` key: one lease after `now`.
    func stamped(_ txt: TXTRecord, now: UInt64) -> TXTRecord {
        var stamped = txt
        stamped[expiresKey] = String(now + UInt64(lease.components.seconds))
        return stamped
    }

    /// The records of one registration, and the updates that add them.
    private func additions(_ name: String, _ plan: RegistrationPlan?, txt: TXTRecord, now: UInt64) throws(DiscoveryError)
        -> (plan: RegistrationPlan, srv: ResourceRecord, updates: [ResourceRecord])
    {
        guard let plan else { throw DiscoveryError(.invalidArgument, "no zone located for '\(name)'") }
        let (service, instance) = try names(name, zone: plan.zone.name)
        let srv = ResourceRecord(name: instance, data: .srv(priority: 0, weight: 0, port: port, target: plan.host), ttl: ttl)
        var updates = [
            srv,
            ResourceRecord(name: instance, data: .txt(stamped(txt, now: now).wireEntries), ttl: ttl),
            ResourceRecord(name: service, data: .ptr(instance), ttl: ttl),
        ]
        // The host's addresses replace whatever it had (they follow address changes).
        updates.append(.deleteRRset(plan.host, type: DNSType.a))
        updates.append(.deleteRRset(plan.host, type: DNSType.aaaa))
        for address in plan.addresses {
            let data: RecordData = address.version == .ipv4 ? .a(address.bytes) : .aaaa(address.bytes)
            updates.append(ResourceRecord(name: plan.host, data: data, ttl: ttl))
        }
        return (plan, srv, updates)
    }

    private func updateMessage(id: UInt16, zone: DNSName, prerequisites: [ResourceRecord], updates: [ResourceRecord]) -> DNSMessage {
        let leaseSeconds = UInt32(clamping: lease.components.seconds)
        return DNSMessage.update(
            id: id, zone: zone, prerequisites: prerequisites, updates: updates,
            additionals: [.opt(options: [.updateLease(seconds: leaseSeconds)])])
    }

    /// The records under an instance name when they are an earlier registration of this same
    /// service (a restart after a crash): an SRV pointing at our host and, when our TXT has an
    /// `fp`, the same `fp` (the same key — another host with the same key and name is someone
    /// else). nil: someone else's.
    static func earlierRegistration(
        srv: [ResourceRecord], txt: [ResourceRecord], host: DNSName, fingerprint: String?
    ) -> [ResourceRecord]? {
        guard !srv.isEmpty, srv.allSatisfy({ record in
            if case .srv(_, _, _, let target) = record.data { return target == host }
            return false
        }) else { return nil }
        if let fingerprint {
            let theirs = txt.compactMap { record -> String? in
                guard case .txt(let strings) = record.data else { return nil }
                return TXTRecord(wireEntries: strings)["fp"]
            }
            guard theirs == [fingerprint] else { return nil }
        }
        return srv + txt
    }
}
