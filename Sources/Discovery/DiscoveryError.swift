/// An error from service discovery: what happened and what to do about it.
///
/// New kinds of failure may be added as new ``Code`` values without breaking existing code.
public struct DiscoveryError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The kind of failure.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        fileprivate enum Kind: Sendable, Hashable {
            case invalidTXT, invalidArgument, daemonUnavailable, timedOut, avahi, collision, shutDown, notPublished, network
            case updateRefused, keyRejected, clockSkew, dnsUnreachable, dnsFailure, invalidKeyFile
        }
        fileprivate let kind: Kind
        /// A TXT record was rejected before it was sent (empty key, entry over 255 bytes, record over 1300 bytes).
        public static let invalidTXT = Code(kind: .invalidTXT)
        /// A name, type, port or interface was not acceptable.
        public static let invalidArgument = Code(kind: .invalidArgument)
        /// The Avahi daemon (or the system D-Bus) cannot be reached.
        public static let daemonUnavailable = Code(kind: .daemonUnavailable)
        /// A resolve did not find the service in time.
        public static let timedOut = Code(kind: .timedOut)
        /// Avahi reported an error; ``DiscoveryError/avahiErrorCode`` has its code.
        public static let avahi = Code(kind: .avahi)
        /// No free alternative name could be found for a colliding service.
        public static let collision = Code(kind: .collision)
        /// The discovery object was shut down.
        public static let shutDown = Code(kind: .shutDown)
        /// The service is not (or no longer) published.
        public static let notPublished = Code(kind: .notPublished)
        /// The embedded mDNS stack cannot use the network (its UDP port 5353 sockets); it retries.
        public static let network = Code(kind: .network)
        /// Wide-area: the DNS server's update policy does not allow this key to change this name
        /// (REFUSED). The message names the key and the name.
        public static let updateRefused = Code(kind: .updateRefused)
        /// Wide-area: the DNS server did not accept the TSIG key: wrong secret (BADSIG), a key name
        /// it does not know (BADKEY), or a reply whose signature did not verify.
        public static let keyRejected = Code(kind: .keyRejected)
        /// Wide-area: this host's clock and the DNS server's differ by more than the signature allows
        /// (BADTIME); the message gives the difference.
        public static let clockSkew = Code(kind: .clockSkew)
        /// Wide-area: no DNS server answered (none configured, unreachable, or silent); retried.
        public static let dnsUnreachable = Code(kind: .dnsUnreachable)
        /// Wide-area: the DNS server answered with an error not covered above; ``DiscoveryError/dnsRcode`` has it.
        public static let dnsFailure = Code(kind: .dnsFailure)
        /// A TSIG key file could not be read or is not in the format `tsig-keygen` writes.
        public static let invalidKeyFile = Code(kind: .invalidKeyFile)

        public var description: String {
            switch kind {
            case .invalidTXT: "invalid TXT record"
            case .invalidArgument: "invalid argument"
            case .daemonUnavailable: "avahi daemon unavailable"
            case .timedOut: "timed out"
            case .avahi: "avahi error"
            case .collision: "name collision"
            case .shutDown: "discovery shut down"
            case .notPublished: "not published"
            case .network: "network error"
            case .updateRefused: "DNS update refused"
            case .keyRejected: "TSIG key rejected"
            case .clockSkew: "clock skew"
            case .dnsUnreachable: "DNS server unreachable"
            case .dnsFailure: "DNS error"
            case .invalidKeyFile: "invalid key file"
            }
        }
    }

    /// The kind of failure.
    public let code: Code
    /// A sentence saying what happened and what to do.
    public let message: String
    /// The Avahi error number (negative), when Avahi reported one.
    public let avahiErrorCode: Int32?
    /// The `errno` of a failed system call of the embedded stack, when there was one.
    public let systemErrno: Int32?
    /// The DNS RCODE (or TSIG error) a unicast DNS server answered with, for wide-area failures.
    public let dnsRcode: UInt16?

    init(
        _ code: Code, _ message: String, avahiErrorCode: Int32? = nil, systemErrno: Int32? = nil, dnsRcode: UInt16? = nil
    ) {
        self.code = code
        self.message = message
        self.avahiErrorCode = avahiErrorCode
        self.systemErrno = systemErrno
        self.dnsRcode = dnsRcode
    }

    public var description: String { message }
}
