// Publish a DNS-SD service, browse for its type until it appears, and resolve it to a host,
// a port, its TXT record and every address.

import Discovery
import Foundation
import Logging

// snippet.hide
// Bounded: this program ends within 10 seconds whatever happens.
DispatchQueue.global().asyncAfter(deadline: .now() + 10) {
    print("discovery: timed out")
    exit(1)
}
// snippet.show

// Avahi when its daemon answers within a second, else the embedded mDNS stack;
// LANMSG_DISCOVERY_BACKEND=avahi|embedded overrides the choice.
let discovery = ServiceDiscovery(logger: Logger(label: "discovery"))
print("backend:", await discovery.backend(), "-", discovery.backendReason ?? "")

// snippet.publish
// Publish. A name that collides is replaced ("Lobby #2"): `established` returns the final one.
let type = "_lanmsg-demo._tcp"
let service = try await discovery.publish(
    name: "Lobby \(getpid())", type: type, port: 4242, txt: ["topic": "hello"])
let name = try await service.established(timeout: .seconds(8))
print("published as", name)
// snippet.end

// snippet.browse
// Browse: one `added` per service, however many interfaces and IP versions it is seen on.
let browsing = Task { () -> DiscoveredService? in
    for await event in try discovery.browse(type: type) {
        print("browse:", event)
        if case .added(let found) = event, found.name == name { return found }
    }
    return nil  // the browse was cancelled
}
let deadline = Task {
    try await Task.sleep(for: .seconds(8))
    browsing.cancel()
}
guard let found = try await browsing.value else {
    print("discovery: \(name) was not seen within 8 s")
    exit(1)
}
deadline.cancel()
// snippet.end

// snippet.resolve
// Resolve: host name, port, TXT, and every address (link-local IPv6 with its scope).
let resolved = try await discovery.resolve(found, timeout: .seconds(5))
print("resolved:", resolved.hostName, resolved.port, resolved.txt["topic"] ?? "-", resolved.addresses)
// snippet.end

// snippet.update
// TXT updates reach browsers that watch the service (`discovery.watch(_:)`).
try await service.updateTXT(["topic": "new topic"])
await service.unpublish()  // a goodbye: other hosts see `removed` about a second later
// snippet.end
await discovery.shutdown()
print("discovery: ok")
