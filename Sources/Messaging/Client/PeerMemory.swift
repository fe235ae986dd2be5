import Foundation
import Locks
import ProtocolCore
import Transport

/// Servers this client connected to by service name, remembered with the addresses it reached them
/// at and their proven key — so it can still find them when discovery cannot (another subnet with
/// no DNS-SD server, multicast filtered, the daemon down).
///
/// ``MessageClient`` writes an entry after each connection to a named service over an encrypted
/// channel, and reads it when a browse finds nothing within the browse timeout: it then tries the
/// remembered addresses, accepting there only the remembered key (a different machine at an old
/// address is refused, whatever its name). Nothing is stored that an mDNS browse would not show:
/// service type and name, addresses, port, the key's fingerprint.
///
/// One line per service: `<type> <fingerprint> <address>,<address>… <name>`. Every lookup reads the
/// file, changes are written to a temporary file and renamed into place (mode 0600), like
/// ``TrustStore``.
public final class PeerMemory: Sendable {
    /// One remembered server.
    public struct Entry: Sendable, Hashable {
        public var type: String
        public var name: String
        public var fingerprint: Fingerprint
        /// The address that worked first, then the others the service resolved to.
        public var addresses: [SocketAddress]
    }

    /// The file.
    public var path: String { file.path }
    private let file: LineFile<Entry>

    /// The most addresses kept per service.
    static let maxAddresses = 8

    /// Tests only: apps take ``shared(path:)``, so that two clients of one file share its lock.
    init(path: String) {
        file = LineFile(
            path: path, header: "# lanmsg known addresses: <service type> <fingerprint> <address>,… <service name>",
            what: "the peer memory", parse: Self.parse,
            format: { "\($0.type) \($0.fingerprint.full) \($0.addresses.map(\.description).joined(separator: ",")) \($0.name)" })
    }

    /// Where an app's memory lives by default: `$XDG_DATA_HOME/lanmsg/<app>/known_addresses`.
    public static func defaultPath(app: String) -> String { Identity.dataDirectory(app: app) + "/known_addresses" }

    /// The default for this process (`defaultPath(app:)` with the process name). One object per
    /// path in a process, so clients that share the file share its lock.
    public static var standard: PeerMemory { shared(path: defaultPath(app: ProcessInfo.processInfo.processName)) }

    private static let instances = Locked<[String: PeerMemory]>([:])

    /// The one object of this process for `path`: clients that remember into one file share its
    /// lock (two objects of one file could each read it, add their entry and write, and one entry
    /// would be lost).
    public static func shared(path: String) -> PeerMemory {
        instances.withLock { instances in
            if let existing = instances[path] { return existing }
            let memory = PeerMemory(path: path)
            instances[path] = memory
            return memory
        }
    }

    /// Every remembered service, in file order.
    public var entries: [Entry] { file.entries }

    /// The entry for a service, if any.
    public func entry(type: String, name: String) -> Entry? {
        file.entries.first { $0.type == type && $0.name == name }
    }

    /// Remembers (or replaces) a service's key and addresses; `used` first.
    public func remember(type: String, name: String, fingerprint: Fingerprint, used: SocketAddress?, others: [SocketAddress])
        throws(FileError)
    {
        var addresses: [SocketAddress] = used.map { [$0] } ?? []
        for address in others where !addresses.contains(address) { addresses.append(address) }
        let entry = Entry(type: type, name: name, fingerprint: fingerprint, addresses: Array(addresses.prefix(Self.maxAddresses)))
        guard !entry.addresses.isEmpty, !type.contains(" "), !type.contains("\n"), !name.contains("\n") else { return }
        try file.update { list in
            if list.contains(entry) { return false }  // nothing new: no write
            list.removeAll { $0.type == type && $0.name == name }
            list.append(entry)
            return true
        }
    }

    /// Forgets a service; returns whether it was remembered.
    @discardableResult
    public func forget(type: String, name: String) throws(FileError) -> Bool {
        try file.update { list in
            let count = list.count
            list.removeAll { $0.type == type && $0.name == name }
            return list.count != count
        }
    }

    /// One line: `<type> <fingerprint> <address>,<address>… <name>`.
    private static func parse(_ line: Substring) -> Entry? {
        let parts = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count == 4, let fingerprint = Fingerprint(String(parts[1])) else { return nil }
        let addresses = parts[2].split(separator: ",").compactMap { parseAddress(String($0)) }
        guard !addresses.isEmpty, !parts[3].isEmpty else { return nil }
        return Entry(type: String(parts[0]), name: String(parts[3]), fingerprint: fingerprint, addresses: addresses)
    }

    /// `10.0.0.1:4000` or `[fd00::1]:4000` (`[fe80::1%3]:4000`).
    static func parseAddress(_ text: String) -> SocketAddress? {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return try? SocketAddress(ipAddress: host, port: port)
    }
}
