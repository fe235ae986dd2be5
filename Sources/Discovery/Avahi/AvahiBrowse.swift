import CAvahiClient
import Dispatch

/// One browse: an Avahi service browser and the de-duplicated view of what it reported.
/// Confined to the core's queue.
final class BrowseSession: @unchecked Sendable {  // confined to core.queue
    unowned let core: AvahiBackend
    let type: String
    let domain: String?
    let interface: Int32?
    let ipVersion: IPVersion
    let continuation: AsyncStream<BrowseEvent>.Continuation
    private var browser: OpaquePointer?
    private var stopped = false

    private struct Entry {
        var sightings: Set<DiscoveredService.Sighting>
        var isLocal: Bool
        var isOwn: Bool
        var reported: DiscoveredService
    }
    private var entries: [ServiceIdentity: Entry] = [:]

    init(
        core: AvahiBackend, type: String, domain: String?, interface: Int32?, ipVersion: IPVersion,
        continuation: AsyncStream<BrowseEvent>.Continuation
    ) {
        self.core = core
        self.type = type
        self.domain = domain
        self.interface = interface
        self.ipVersion = ipVersion
        self.continuation = continuation
    }

    func start() {
        guard !stopped, browser == nil, let client = core.client else { return }
        browser = avahi_service_browser_new(
            client, interface ?? ifUnspec, ipVersion.avahiProtocol, type, domain, AvahiLookupFlags(rawValue: 0),
            browseCallback, Unmanaged.passUnretained(self).toOpaque())
        if browser == nil {
            let error = avahi_client_errno(client)
            let failure = DiscoveryError(
                .avahi, "cannot browse for \(type): \(avahiMessage(error))", avahiErrorCode: error)
            core.logger.error("browse failed", metadata: ["type": "\(type)", "error": "\(failure.message)"])
            continuation.yield(.failed(failure))
        }
    }

    func event(
        interface: Int32, protocol proto: Int32, event: AvahiBrowserEvent, name: String?, type: String?,
        domain: String?, flags: AvahiLookupResultFlags
    ) {
        guard !stopped else { return }
        switch event {
        case AVAHI_BROWSER_NEW, AVAHI_BROWSER_REMOVE:
            guard let name, let type, let domain, core.permits(interface: interface) else { return }
            let identity = ServiceIdentity(name: name, type: type, domain: domain)
            let sighting = DiscoveredService.Sighting(interfaceIndex: interface, ipVersion: IPVersion(avahiProtocol: proto))
            if event == AVAHI_BROWSER_NEW {
                core.sightings[identity, default: []].insert(sighting)
                if var entry = entries[identity] {
                    entry.sightings.insert(sighting)
                    entries[identity] = entry
                } else {
                    let isLocal = flags.rawValue & AVAHI_LOOKUP_RESULT_LOCAL.rawValue != 0
                    let isOwn = flags.rawValue & AVAHI_LOOKUP_RESULT_OUR_OWN.rawValue != 0
                    let service = DiscoveredService(identity: identity, seenOn: [sighting], isLocal: isLocal, isOwn: isOwn)
                    entries[identity] = Entry(sightings: [sighting], isLocal: isLocal, isOwn: isOwn, reported: service)
                    continuation.yield(.added(service))
                }
            } else {
                core.sightings[identity]?.remove(sighting)
                guard var entry = entries[identity] else { return }
                entry.sightings.remove(sighting)
                if entry.sightings.isEmpty {
                    entries.removeValue(forKey: identity)
                    if core.sightings[identity]?.isEmpty == true { core.sightings.removeValue(forKey: identity) }
                    continuation.yield(.removed(entry.reported))
                } else {
                    entries[identity] = entry
                }
            }
        case AVAHI_BROWSER_ALL_FOR_NOW:
            continuation.yield(.allForNow)
        case AVAHI_BROWSER_FAILURE:
            let error = core.client.map { avahi_client_errno($0) } ?? Int32(AVAHI_ERR_FAILURE)
            let failure = DiscoveryError(.avahi, "browse for \(self.type) failed: \(avahiMessage(error))", avahiErrorCode: error)
            core.logger.warning("browse failed", metadata: ["type": "\(self.type)", "error": "\(failure.message)"])
            continuation.yield(.failed(failure))
        default:
            break  // CACHE_EXHAUSTED: nothing for the app
        }
    }

    /// The client died with the daemon: what we knew is no longer vouched for.
    func clientLost() {
        browser = nil
        for entry in entries.values { continuation.yield(.removed(entry.reported)) }
        entries.removeAll()
    }

    func stop() {
        guard !stopped else { return }
        stopped = true
        if let browser {
            avahi_service_browser_free(browser)
            self.browser = nil
        }
        continuation.finish()
    }
}

private func browseCallback(
    _ browser: OpaquePointer?, _ interface: AvahiIfIndex, _ proto: AvahiProtocol, _ event: AvahiBrowserEvent,
    _ name: UnsafePointer<CChar>?, _ type: UnsafePointer<CChar>?, _ domain: UnsafePointer<CChar>?,
    _ flags: AvahiLookupResultFlags, _ userdata: UnsafeMutableRawPointer?
) {
    guard let userdata else { return }
    Unmanaged<BrowseSession>.fromOpaque(userdata).takeUnretainedValue().event(
        interface: interface, protocol: proto, event: event, name: name.map { String(cString: $0) },
        type: type.map { String(cString: $0) }, domain: domain.map { String(cString: $0) }, flags: flags)
}
