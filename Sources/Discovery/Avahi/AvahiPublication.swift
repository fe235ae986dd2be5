import CAvahiClient
import Dispatch
import Locks
import Scheduling

/// The Avahi side of a publication: one entry group. Confined to the core's queue.
final class Publication: @unchecked Sendable {  // confined to core.queue
    unowned let core: AvahiBackend
    let handle: PublishedService
    let type: String
    let domain: String?
    let port: UInt16
    /// Where to publish: one interface, every interface (`ifUnspec`), or, under a restrictive
    /// interface policy, each permitted interface in turn.
    let interfaces: [Int32]
    let ipVersion: IPVersion
    var name: String
    var txt: TXTRecord
    var group: OpaquePointer?
    var stopped = false
    /// Armed while the group probes (REGISTERING); see ``probingStalled()``.
    private var probeWatchdog: ScheduledWork?
    /// Re-registrations after a stalled probe, since the last time the group was established.
    private var stallRetries = 0

    init(
        core: AvahiBackend, name: String, type: String, domain: String?, port: UInt16, txt: TXTRecord,
        interface: Int32?, ipVersion: IPVersion
    ) {
        self.core = core
        self.name = name
        self.type = type
        self.domain = domain
        self.port = port
        self.txt = txt
        self.interfaces = interface.map { [$0] } ?? core.permittedInterfaces()
        self.ipVersion = ipVersion
        self.handle = PublishedService(owner: core, name: name, type: type, port: port, txt: txt)
        handle.backendObject = self
    }

    /// Creates (or reuses) the entry group, adds the service (renaming on a local collision) and commits.
    func register() {
        guard !stopped, let client = core.client else { return }
        if group == nil {
            group = avahi_entry_group_new(client, entryGroupCallback, Unmanaged.passUnretained(self).toOpaque())
            guard group != nil else {
                fail(avahi_client_errno(client), "cannot create an Avahi entry group")
                return
            }
        }
        guard let group else { return }
        guard !interfaces.isEmpty else {
            fail(Int32(AVAHI_ERR_NO_NETWORK), "no interface is permitted by the interface policy (\(core.configuration.interfaces))")
            return
        }
        for _ in 0..<32 {
            let result = addService(group, flags: AvahiPublishFlags(rawValue: 0))
            if result == AVAHI_ERR_COLLISION {
                // Same name already registered on this daemon (by us or another local process).
                avahi_entry_group_reset(group)  // drop what was added on other interfaces
                rename(reason: "already registered on this host")
                continue
            }
            if result < 0 {
                fail(result, "Avahi refused service '\(name)'")
                return
            }
            let commit = avahi_entry_group_commit(group)
            core.logger.trace("entry group committed", metadata: ["name": "\(name)", "result": "\(commit)"])
            if commit < 0 { fail(commit, "Avahi could not commit service '\(name)'") }
            return
        }
        fail(Int32(AVAHI_ERR_COLLISION), "no free name found for '\(name)' after 32 alternatives")
    }

    private func addService(_ group: OpaquePointer, flags: AvahiPublishFlags) -> Int32 {
        let host = core.advertisedHost()  // nil: the daemon's own host name
        return withStringList(txt) { list in
            for interface in interfaces {
                let result = avahi_entry_group_add_service_strlst(
                    group, interface, ipVersion.avahiProtocol, flags, name, type, domain, host, port, list)
                if result < 0 { return result }
            }
            return 0
        }
    }

    private func rename(reason: String) {
        let old = name
        guard let alternative = avahi_alternative_service_name(name) else { return }
        name = String(cString: alternative)
        avahi_free(alternative)
        core.logger.notice(
            "service name collision, renamed",
            metadata: ["from": "\(old)", "to": "\(name)", "type": "\(type)", "reason": "\(reason)"])
        handle.record(.renamed(from: old, to: name))
    }

    func groupStateChanged(_ group: OpaquePointer, _ state: AvahiEntryGroupState) {
        core.logger.trace("entry group state", metadata: ["name": "\(name)", "state": "\(state.rawValue)"])
        if state == AVAHI_ENTRY_GROUP_REGISTERING { armProbeWatchdog() } else { cancelProbeWatchdog() }
        switch state {
        case AVAHI_ENTRY_GROUP_ESTABLISHED:
            stallRetries = 0
            core.logger.debug("service established", metadata: ["name": "\(name)", "type": "\(type)"])
            handle.record(.established(name: name))
        case AVAHI_ENTRY_GROUP_COLLISION:
            // Another host has the name: pick an alternative and publish again.
            rename(reason: "another host publishes it")
            avahi_entry_group_reset(group)
            register()
        case AVAHI_ENTRY_GROUP_FAILURE:
            let error = core.client.map { avahi_client_errno($0) } ?? Int32(AVAHI_ERR_FAILURE)
            fail(error, "service '\(name)' failed")
        default:
            break
        }
    }

    func updateTXT(_ newTXT: TXTRecord) -> Result<Void, DiscoveryError> {
        txt = newTXT
        handle.txtChanged(newTXT)
        guard let group, avahi_entry_group_is_empty(group) == 0 else { return .success(()) }  // applied at next register
        let result = withStringList(newTXT) { list -> Int32 in
            for interface in interfaces {
                let result = avahi_entry_group_update_service_txt_strlst(
                    group, interface, ipVersion.avahiProtocol, AvahiPublishFlags(rawValue: 0), name, type, domain, list)
                if result < 0 { return result }
            }
            return 0
        }
        if result < 0 {
            return .failure(DiscoveryError(
                .avahi, "Avahi refused the TXT update of '\(name)': \(avahiMessage(result))", avahiErrorCode: result))
        }
        return .success(())
    }

    /// The daemon's host name is re-registering: withdraw, re-add on RUNNING.
    func reset() {
        cancelProbeWatchdog()
        if let group { avahi_entry_group_reset(group) }
    }

    /// The client died: the group died with it.
    func clientLost() {
        cancelProbeWatchdog()
        group = nil
        handle.record(.suspended)
    }

    func stop(reason: DiscoveryError?) {
        guard !stopped else { return }
        stopped = true
        cancelProbeWatchdog()
        if let group {
            avahi_entry_group_free(group)
            self.group = nil
        }
        if let reason { handle.record(.failed(reason)) }
        handle.continuation.finish()
    }

    // MARK: Stalled probing

    /// Probing normally takes under a second (three probes 250 ms apart). Avahi 0.8 sometimes never
    /// finishes it on one interface (a known class of bugs: the group's probe counter never reaches
    /// zero; seen here on loopback/IPv6, about 1 run in 10 of our integration suite), leaving the
    /// group REGISTERING for good. After this long we withdraw the group and register it again
    /// (a reset clears the counter): ``maxStallRetries`` times in a row after the configured time,
    /// then after 5 s (at least the configured time) doubling up to 60 s — a registration that
    /// stalled again is never left unpublished, and a probe that is merely slow still completes.
    private func armProbeWatchdog() {
        guard probeWatchdog == nil else { return }
        var wait = core.probeStallTimeout
        if stallRetries >= Publication.maxStallRetries {
            let later = min(stallRetries - Publication.maxStallRetries, 4)
            wait = min(max(core.probeStallTimeout, .seconds(5)) * (1 << later), .seconds(60))
        }
        probeWatchdog = core.scheduler.schedule(after: wait, on: core.queue) { [weak self] in self?.probingStalled() }
    }

    private func cancelProbeWatchdog() {
        probeWatchdog?.cancel()
        probeWatchdog = nil
    }

    static let maxStallRetries = 3

    private func probingStalled() {
        probeWatchdog = nil
        guard !stopped, let group, avahi_entry_group_get_state(group) == Int32(AVAHI_ENTRY_GROUP_REGISTERING.rawValue) else { return }
        stallRetries += 1
        handle.stallRetried()
        core.logger.notice(
            "service still probing, registering it again",
            metadata: [
                "name": "\(name)", "type": "\(type)", "after": "\(core.probeStallTimeout)",
                "attempt": "\(stallRetries)",
            ])
        avahi_entry_group_reset(group)
        register()
    }

    private func fail(_ error: Int32, _ what: String) {
        let failure = DiscoveryError(.avahi, "\(what): \(avahiMessage(error))", avahiErrorCode: error)
        core.logger.error("publish failed", metadata: ["name": "\(name)", "error": "\(failure.message)"])
        handle.record(.failed(failure))
    }
}

private func entryGroupCallback(_ group: OpaquePointer?, _ state: AvahiEntryGroupState, _ userdata: UnsafeMutableRawPointer?) {
    guard let group, let userdata else { return }
    Unmanaged<Publication>.fromOpaque(userdata).takeUnretainedValue().groupStateChanged(group, state)
}

/// Builds an `AvahiStringList` for the TXT record, in order, and frees it after `body`.
func withStringList<T>(_ txt: TXTRecord, _ body: (UnsafeMutablePointer<AvahiStringList>?) -> T) -> T {
    var list: UnsafeMutablePointer<AvahiStringList>? = nil
    // avahi_string_list_add_* prepends, and Avahi sends the list last-first (as avahi_string_list_new
    // builds it): adding in order puts the entries on the wire in order.
    for entry in txt.entries {
        let bytes = entry.bytes
        list = bytes.withUnsafeBufferPointer { avahi_string_list_add_arbitrary(list, $0.baseAddress, $0.count) }
    }
    defer { avahi_string_list_free(list) }
    return body(list)
}

/// Reads an `AvahiStringList` into wire entries.
func wireEntries(_ list: UnsafeMutablePointer<AvahiStringList>?) -> [[UInt8]] {
    var out: [[UInt8]] = []
    var node = list
    var guardCount = 0
    while let current = node, guardCount < 4096 {
        let size = avahi_string_list_get_size(current)
        if let text = avahi_string_list_get_text(current) {
            out.append(Array(UnsafeBufferPointer(start: text, count: size)))
        }
        node = avahi_string_list_get_next(current)
        guardCount += 1
    }
    return out
}
