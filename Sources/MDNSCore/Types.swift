/// A point in monotonic time, in nanoseconds from an arbitrary origin. The engine never reads a
/// clock: the driver passes `DispatchTime.now()`, tests pass a fake clock.
public struct MDNSInstant: Comparable, Hashable, Sendable, CustomStringConvertible {
    public var nanoseconds: UInt64

    public init(nanoseconds: UInt64) {
        self.nanoseconds = nanoseconds
    }

    public static func < (lhs: MDNSInstant, rhs: MDNSInstant) -> Bool { lhs.nanoseconds < rhs.nanoseconds }

    public func adding(milliseconds: Int64) -> MDNSInstant {
        MDNSInstant(nanoseconds: UInt64(max(0, Int64(nanoseconds) + milliseconds * 1_000_000)))
    }

    public func adding(nanoseconds delta: UInt64) -> MDNSInstant {
        MDNSInstant(nanoseconds: nanoseconds &+ delta)
    }

    /// Milliseconds from `earlier` to self (negative if earlier is later).
    public func milliseconds(since earlier: MDNSInstant) -> Int64 {
        (Int64(bitPattern: nanoseconds) - Int64(bitPattern: earlier.nanoseconds)) / 1_000_000
    }

    public var description: String { "\(nanoseconds / 1_000_000) ms" }
}

/// IPv4 or IPv6.
public enum AddressFamily: Int, Hashable, Sendable, Comparable, CustomStringConvertible {
    case v4 = 4
    case v6 = 6

    public static func < (lhs: AddressFamily, rhs: AddressFamily) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String { self == .v4 ? "IPv4" : "IPv6" }
}

/// One (interface, IP version) pair the engine talks on, like Avahi's (interface, protocol).
public struct LinkID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var interfaceIndex: Int32
    public var family: AddressFamily

    public init(interfaceIndex: Int32, family: AddressFamily) {
        self.interfaceIndex = interfaceIndex
        self.family = family
    }

    public static func < (lhs: LinkID, rhs: LinkID) -> Bool {
        (lhs.interfaceIndex, lhs.family) < (rhs.interfaceIndex, rhs.family)
    }

    public var description: String { "#\(interfaceIndex)/\(family)" }
}

/// A link and what the host advertises on it.
public struct MDNSLink: Hashable, Sendable {
    public var id: LinkID
    /// The interface name (for logs).
    public var name: String
    /// The interface's addresses (4 or 16 bytes) that may be advertised on this link. The driver
    /// applies the interface policy; the engine publishes A records on IPv4 links only and AAAA
    /// records on both (Avahi's defaults), so loopback addresses stay on loopback.
    public var addresses: [[UInt8]]

    public init(id: LinkID, name: String, addresses: [[UInt8]]) {
        self.id = id
        self.name = name
        self.addresses = addresses
    }
}

/// Which links something applies to.
public struct LinkFilter: Hashable, Sendable {
    public var interfaceIndex: Int32?
    public var family: AddressFamily?

    public init(interfaceIndex: Int32? = nil, family: AddressFamily? = nil) {
        self.interfaceIndex = interfaceIndex
        self.family = family
    }

    public static let all = LinkFilter()

    public func matches(_ link: LinkID) -> Bool {
        (interfaceIndex == nil || interfaceIndex == link.interfaceIndex) && (family == nil || family == link.family)
    }
}

/// Where a datagram came from.
public struct MDNSSource: Hashable, Sendable {
    /// The link it arrived on (the interface from IP_PKTINFO / IPV6_PKTINFO).
    public var link: LinkID
    /// Source address, 4 or 16 bytes.
    public var address: [UInt8]
    public var port: UInt16
    /// The source address is one of this host's own.
    public var isLocal: Bool

    public init(link: LinkID, address: [UInt8], port: UInt16, isLocal: Bool) {
        self.link = link
        self.address = address
        self.port = port
        self.isLocal = isLocal
    }
}

/// A datagram for the driver to send.
public struct MDNSPacket: Hashable, Sendable {
    public enum Destination: Hashable, Sendable {
        /// 224.0.0.251 or ff02::fb port 5353, on the link's interface.
        case multicast
        /// Back to one querier (QU questions, legacy unicast queries).
        case unicast(address: [UInt8], port: UInt16)
    }
    public var link: LinkID
    public var destination: Destination
    public var bytes: [UInt8]
}

/// The mDNS port.
public let mdnsPort: UInt16 = 5353

/// A small deterministic random generator (SplitMix64): the engine's jitter comes from it, so a
/// test with a fixed seed is reproducible.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) {
        state = seed
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The next name to try after a collision, the way Avahi picks it: `Name` → `Name #2` → `Name #3`
/// for services (avahi_alternative_service_name), `host` → `host-2` → `host-3` for host names.
/// The result stays within 63 bytes of UTF-8 (the base is shortened at a character boundary).
public func alternativeName(for name: String, isHost: Bool) -> String {
    let separator = isHost ? "-" : " #"
    var base = name
    var number = 2
    if let range = name.range(of: separator, options: .backwards),
        let value = Int(name[range.upperBound...]), value >= 2, !name[range.upperBound...].hasPrefix("0")
    {
        base = String(name[..<range.lowerBound])
        number = value + 1
    }
    let suffix = "\(separator)\(number)"
    while base.utf8.count + suffix.utf8.count > DNSName.maxLabelBytes, !base.isEmpty { base.removeLast() }
    return base + suffix
}

extension String {
    /// A minimal backwards search (the engine does not import Foundation).
    fileprivate func range(of needle: String, options: BackwardsOption) -> Range<String.Index>? {
        guard !needle.isEmpty else { return nil }
        var index = endIndex
        while index > startIndex {
            index = self.index(before: index)
            if self[index...].hasPrefix(needle) { return index..<self.index(index, offsetBy: needle.count) }
        }
        return nil
    }

    fileprivate enum BackwardsOption { case backwards }
}
