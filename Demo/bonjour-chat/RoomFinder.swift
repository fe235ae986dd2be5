import Discovery
import ChatKit
import Foundation
import Messaging

/// A room seen on the network, with what its TXT record says.
struct RoomInfo: Sendable {
    var name: String
    var hostName: String?
    var port: UInt16?
    var addresses: [String] = []
    var topic: String?
    var members: Int?
    /// The host's short fingerprint as its TXT record announces it (a hint; joining proves it).
    var fingerprint: String?
    var problem: String?
    /// Where it was found: `link`, a unicast DNS domain, or both (`link, lab.home.arpa`).
    var foundIn: String = "link"

    /// One line: `Lobby — topic: Friday plans — 2 members — key 1a2b-3c4d-5e6f-7a8b — on bravo.local port 4242 (10.77.0.2, fe80::1%va)`.
    var summary: String {
        var parts = [Room.clean(name)]
        if let problem { return parts[0] + " — " + problem }
        if let topic, !topic.isEmpty { parts.append("topic: \(Room.clean(topic))") }
        if let members { parts.append(members == 1 ? "1 member" : "\(members) members") }
        if let fingerprint { parts.append("key \(Room.clean(fingerprint))") }
        if let hostName, let port {
            var location = "on \(hostName) port \(port)"
            if !addresses.isEmpty { location += " (\(addresses.joined(separator: ", ")))" }
            parts.append(location)
        }
        let places = foundIn.components(separatedBy: ", ").map { $0 == "link" ? "on the link" : "in \($0)" }
        parts.append("found " + places.joined(separator: " and "))
        return parts.joined(separator: " — ")
    }
}

/// Browses for rooms for a while and resolves what it found.
struct RoomFinder: Sendable {
    let discovery: ServiceDiscovery

    /// The rooms seen within `timeout` (sorted by name).
    func discover(timeout: Duration) async throws(ChatExit) -> [DiscoveredService] {
        let found: [DiscoveredService]
        do {
            found = try await discovery.services(ofType: chatServiceType, timeout: timeout)
        } catch {
            throw ChatExit(ExitStatus.failure, "cannot browse for rooms: \(error.message)")
        }
        let state = discovery.daemonState
        if found.isEmpty, state != .running {
            throw ChatExit(
                ExitStatus.failure,
                "cannot look for rooms: the avahi-daemon is not reachable (\(state)); "
                    + "start it, or join directly with --host H --port P"
            )
        }
        return found
    }

    /// The rooms with their host, addresses, topic and member count.
    func list(timeout: Duration) async throws(ChatExit) -> [RoomInfo] {
        let services = try await discover(timeout: timeout)
        let discovery = self.discovery
        return await withTaskGroup(of: RoomInfo.self) { group in
            for service in services {
                group.addTask {
                    do {
                        let resolved = try await discovery.resolve(service, timeout: .seconds(3))
                        return RoomInfo(
                            name: service.name, hostName: resolved.hostName, port: resolved.port,
                            addresses: resolved.addresses.map {
                                $0.scopeID != 0
                                    ? "\($0.ip)%\($0.interfaceName ?? String($0.interfaceIndex))" : "\($0.ip)"
                            },
                            topic: resolved.txt["topic"], members: resolved.txt["members"].flatMap { Int($0) },
                            fingerprint: resolved.txt["fp"], foundIn: service.foundIn)
                    } catch {
                        return RoomInfo(name: service.name, problem: "could not resolve it: \(error)")
                    }
                }
            }
            var rooms: [RoomInfo] = []
            for await room in group { rooms.append(room) }
            return rooms.sorted { $0.name < $1.name }
        }
    }
}
