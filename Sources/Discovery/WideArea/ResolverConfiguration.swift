import MDNSCore

/// A unicast DNS server: an address and a port (53 unless said otherwise).
public struct DNSServerAddress: Sendable, Hashable, CustomStringConvertible {
    public var address: IPAddress
    public var port: UInt16

    public init(_ address: IPAddress, port: UInt16 = 53) {
        self.address = address
        self.port = port
    }

    /// Parses `10.0.0.53`, `10.0.0.53:5353`, `fd00::53`, `[fd00::53]:5353`; nil when malformed.
    public init?(_ text: String) {
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") {
            guard let address = IPAddress(String(text[text.index(after: text.startIndex)..<close])) else { return nil }
            let rest = text[text.index(after: close)...]
            if rest.isEmpty {
                self.init(address)
            } else {
                guard rest.hasPrefix(":"), let port = UInt16(rest.dropFirst()), port > 0 else { return nil }
                self.init(address, port: port)
            }
            return
        }
        if let address = IPAddress(text) {
            self.init(address)
            return
        }
        let parts = text.split(separator: ":")
        guard parts.count == 2, let address = IPAddress(String(parts[0])), case .v4 = address,
            let port = UInt16(parts[1]), port > 0
        else { return nil }
        self.init(address, port: port)
    }

    public var description: String {
        if port == 53 { return address.description }
        return address.version == .ipv6 ? "[\(address)]:\(port)" : "\(address):\(port)"
    }
}

/// What the system's resolver configuration (`/etc/resolv.conf`) says: the servers to ask and the
/// search domains, which are where DNS-SD looks for browse and registration domains (RFC 6763 §11).
struct ResolverConfiguration: Sendable, Hashable {
    var nameservers: [DNSServerAddress] = []
    var searchDomains: [DNSName] = []

    static let defaultPath = "/etc/resolv.conf"

    /// Reads the file; an unreadable file is an empty configuration.
    static func read(path: String = defaultPath) -> ResolverConfiguration {
        guard let text = readTextFile(path) else { return ResolverConfiguration() }
        return parse(text)
    }

    /// `nameserver ADDRESS` lines (at most 3, as the C library), the last `search` or `domain`
    /// line (they replace each other). Comments start with `#` or `;`. Link-local IPv6 servers
    /// with a `%scope` are skipped (no interface to send them on here).
    static func parse(_ text: String) -> ResolverConfiguration {
        var configuration = ResolverConfiguration()
        for rawLine in text.split(whereSeparator: { $0 == "\n" || $0 == "\r" }) {
            let line: Substring = rawLine.prefix { $0 != "#" && $0 != ";" }
            let words: [String] = line.split { $0 == " " || $0 == "\t" }.map { String($0) }
            guard let keyword = words.first else { continue }
            switch keyword {
            case "nameserver":
                guard words.count >= 2, configuration.nameservers.count < 3, !words[1].contains("%"),
                    let address = IPAddress(words[1])
                else { continue }
                configuration.nameservers.append(DNSServerAddress(address))
            case "search", "domain":
                configuration.searchDomains = words.dropFirst().compactMap { DNSName($0) }.filter { !$0.labels.isEmpty }
            default:
                continue
            }
        }
        return configuration
    }
}
