import Crypto
import MDNSCore
import SystemCalls

#if canImport(Glibc)
    import Glibc
#endif

/// A TSIG key (RFC 8945): the shared secret a DNS server accepts signed updates with.
///
/// Read it from the file `tsig-keygen` writes (BIND's `key` statement):
/// ```
/// key "hosta.lab.home.arpa" {
///     algorithm hmac-sha256;
///     secret "mFR0V4z6l8K5kzJ7o0PLNuI0rMv6vZqG4pOzYgXKJ0c=";
/// };
/// ```
/// The secret is never logged or printed; ``description`` shows the name and algorithm only.
public struct TSIGKey: Sendable, Hashable, CustomStringConvertible {
    /// The HMAC algorithms supported (RFC 8945 §6).
    public enum Algorithm: String, Sendable, Hashable, CaseIterable {
        case hmacSHA256 = "hmac-sha256"
        case hmacSHA384 = "hmac-sha384"
        case hmacSHA512 = "hmac-sha512"

        var dnsName: DNSName { DNSName(rawValue)! }
        var macSize: Int {
            switch self {
            case .hmacSHA256: 32
            case .hmacSHA384: 48
            case .hmacSHA512: 64
            }
        }
    }

    /// The key's name, as the server knows it (`hosta.lab.home.arpa`).
    public let name: String
    public let algorithm: Algorithm
    let dnsName: DNSName
    private let secret: [UInt8]

    /// A key from its parts. - Throws: `.invalidKeyFile` for an unusable name or an empty secret.
    public init(name: String, algorithm: Algorithm = .hmacSHA256, secret: [UInt8]) throws(DiscoveryError) {
        guard let dnsName = DNSName(name), !dnsName.labels.isEmpty else {
            throw DiscoveryError(.invalidKeyFile, "'\(name)' is not a usable TSIG key name")
        }
        guard secret.count >= 16 else {
            throw DiscoveryError(
                .invalidKeyFile,
                "the TSIG key '\(name)' has a secret of \(secret.count) bytes; use at least 16 (tsig-keygen makes 32)")
        }
        self.name = dnsName.description
        self.dnsName = dnsName
        self.algorithm = algorithm
        self.secret = secret
    }

    /// Reads a key file in the format `tsig-keygen` writes (the first `key` statement).
    /// - Throws: `.invalidKeyFile`, saying what is wrong and how to make a good one.
    public init(contentsOfFile path: String) throws(DiscoveryError) {
        // Like an identity file: whoever can read the secret can change the zone's services.
        var info = stat()
        if stat(path, &info) == 0, info.st_mode & 0o077 != 0 {
            throw DiscoveryError(
                .invalidKeyFile,
                "the TSIG key file '\(path)' can be read by other users (mode \(String(info.st_mode & 0o777, radix: 8))); "
                    + "anyone who reads it can change the zone's services. Make it private: chmod 600 \(path)")
        }
        guard let text = readTextFile(path) else {
            throw DiscoveryError(
                .invalidKeyFile, "cannot read the TSIG key file '\(path)': \(String(cString: strerror(errno)))",
                systemErrno: errno)
        }
        do {
            self = try Self.parse(text)
        } catch {
            throw DiscoveryError(
                .invalidKeyFile,
                "the TSIG key file '\(path)' is not usable: \(error.message). Make one with: tsig-keygen -a hmac-sha256 HOST.DOMAIN > FILE")
        }
    }

    /// Parses the text of a `key` statement.
    public static func parse(_ text: String) throws(DiscoveryError) -> TSIGKey {
        let tokens = tokenize(text)
        guard let keyIndex = tokens.firstIndex(of: .word("key")), keyIndex + 2 < tokens.count,
            case .string(let name) = tokens[keyIndex + 1], tokens[keyIndex + 2] == .open
        else {
            throw DiscoveryError(.invalidKeyFile, "no `key \"NAME\" { … };` statement")
        }
        var algorithm: Algorithm?
        var secret: [UInt8]?
        var index = keyIndex + 3
        while index < tokens.count, tokens[index] != .close {
            if tokens[index] == .word("algorithm"), index + 1 < tokens.count {
                let value: String
                switch tokens[index + 1] {
                case .word(let word), .string(let word): value = word.lowercased()
                default: value = ""
                }
                guard let known = Algorithm(rawValue: value) else {
                    throw DiscoveryError(
                        .invalidKeyFile,
                        "algorithm '\(value)' is not supported (use \(Algorithm.allCases.map(\.rawValue).joined(separator: ", ")))")
                }
                algorithm = known
                index += 2
            } else if tokens[index] == .word("secret"), index + 1 < tokens.count, case .string(let value) = tokens[index + 1] {
                guard let decoded = Base64.decode(value) else {
                    throw DiscoveryError(.invalidKeyFile, "the secret of key '\(name)' is not base64")
                }
                secret = decoded
                index += 2
            } else {
                index += 1
            }
        }
        guard let algorithm else { throw DiscoveryError(.invalidKeyFile, "key '\(name)' has no algorithm") }
        guard let secret else { throw DiscoveryError(.invalidKeyFile, "key '\(name)' has no secret") }
        return try TSIGKey(name: name, algorithm: algorithm, secret: secret)
    }

    public var description: String { "TSIG key '\(name)' (\(algorithm.rawValue))" }

    // Equality and hashing without comparing secrets in variable time.
    public static func == (lhs: TSIGKey, rhs: TSIGKey) -> Bool {
        lhs.dnsName == rhs.dnsName && lhs.algorithm == rhs.algorithm
            && lhs.secret.count == rhs.secret.count
            && zip(lhs.secret, rhs.secret).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(dnsName)
        hasher.combine(algorithm)
    }

    // MARK: Signing and verifying

    /// Signs an encoded request: appends a TSIG record made at `time` (seconds since the epoch).
    /// Returns the signed bytes and the MAC (needed to verify the reply).
    func sign(_ message: [UInt8], id: UInt16, time: UInt64, fudge: UInt16 = 300) -> (bytes: [UInt8], mac: [UInt8]) {
        var record = TSIGRecord(
            keyName: dnsName, algorithm: algorithm.dnsName, timeSigned: time, fudge: fudge, originalID: id)
        record.mac = mac(record.requestDigestInput(message: message))
        return (record.appended(to: message), record.mac)
    }

    /// Why a reply's signature is not acceptable.
    enum VerifyFailure: Error, Equatable {
        /// The reply carries no TSIG record.
        case unsigned
        /// Another key or algorithm than ours.
        case wrongKey
        /// The MAC does not match (or has the wrong size).
        case badMAC
        /// Signed outside the fudge window: the server's time and the difference in seconds.
        case badTime(serverTime: UInt64, skew: Int64)
    }

    /// Verifies a reply to a request whose MAC was `requestMAC`, at local time `now`.
    /// `checkTime: false` verifies the MAC only (a BADTIME reply is signed with the check skipped).
    func verify(_ reply: SignedDNSMessage, requestMAC: [UInt8], now: UInt64, checkTime: Bool = true) -> Result<Void, VerifyFailure> {
        guard let tsig = reply.tsig else { return .failure(.unsigned) }
        guard tsig.keyName == dnsName, tsig.algorithm == algorithm.dnsName else { return .failure(.wrongKey) }
        guard tsig.mac.count == algorithm.macSize else { return .failure(.badMAC) }
        let input = tsig.responseDigestInput(requestMAC: requestMAC, unsignedResponse: reply.unsignedBytes)
        guard isValid(tsig.mac, for: input) else { return .failure(.badMAC) }
        let skew = Int64(bitPattern: now) - Int64(bitPattern: tsig.timeSigned)
        guard !checkTime || abs(skew) <= Int64(tsig.fudge) else {
            return .failure(.badTime(serverTime: tsig.timeSigned, skew: skew))
        }
        return .success(())
    }

    func mac(_ data: [UInt8]) -> [UInt8] {
        let key = SymmetricKey(data: secret)
        switch algorithm {
        case .hmacSHA256: return Array(HMAC<SHA256>.authenticationCode(for: data, using: key))
        case .hmacSHA384: return Array(HMAC<SHA384>.authenticationCode(for: data, using: key))
        case .hmacSHA512: return Array(HMAC<SHA512>.authenticationCode(for: data, using: key))
        }
    }

    /// Constant-time comparison (swift-crypto's).
    private func isValid(_ mac: [UInt8], for data: [UInt8]) -> Bool {
        let key = SymmetricKey(data: secret)
        switch algorithm {
        case .hmacSHA256: return HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: data, using: key)
        case .hmacSHA384: return HMAC<SHA384>.isValidAuthenticationCode(mac, authenticating: data, using: key)
        case .hmacSHA512: return HMAC<SHA512>.isValidAuthenticationCode(mac, authenticating: data, using: key)
        }
    }

    // MARK: Key file syntax

    enum Token: Equatable {
        case word(String)
        case string(String)
        case open, close, semicolon
    }

    /// BIND's configuration syntax, as much as a key statement needs: words, quoted strings,
    /// braces, semicolons; `#`, `//` and `/* */` comments.
    static func tokenize(_ text: String) -> [Token] {
        var tokens: [Token] = []
        let chars = Array(text.unicodeScalars)
        var index = 0
        while index < chars.count {
            let c = chars[index]
            if c == " " || c == "\t" || c == "\n" || c == "\r" {
                index += 1
            } else if c == "#" || (c == "/" && index + 1 < chars.count && chars[index + 1] == "/") {
                while index < chars.count, chars[index] != "\n" { index += 1 }
            } else if c == "/" && index + 1 < chars.count && chars[index + 1] == "*" {
                index += 2
                while index + 1 < chars.count, !(chars[index] == "*" && chars[index + 1] == "/") { index += 1 }
                index += 2
            } else if c == "{" {
                tokens.append(.open)
                index += 1
            } else if c == "}" {
                tokens.append(.close)
                index += 1
            } else if c == ";" {
                tokens.append(.semicolon)
                index += 1
            } else if c == "\"" {
                var value = String.UnicodeScalarView()
                index += 1
                while index < chars.count, chars[index] != "\"" {
                    value.append(chars[index])
                    index += 1
                }
                index += 1
                tokens.append(.string(String(value)))
            } else {
                var value = String.UnicodeScalarView()
                while index < chars.count, !" \t\n\r{};\"".unicodeScalars.contains(chars[index]) {
                    value.append(chars[index])
                    index += 1
                }
                tokens.append(.word(String(value)))
            }
        }
        return tokens
    }
}

extension Result {
    var isFailure: Bool {
        if case .failure = self { return true }
        return false
    }
}

/// Standard base64 (RFC 4648 §4) decoding, whitespace ignored; nil when malformed.
enum Base64 {
    static func decode(_ text: String) -> [UInt8]? {
        var values: [UInt8] = []
        var padding = 0
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): values.append(byte - 65)
            case UInt8(ascii: "a")...UInt8(ascii: "z"): values.append(byte - 97 + 26)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): values.append(byte - 48 + 52)
            case UInt8(ascii: "+"): values.append(62)
            case UInt8(ascii: "/"): values.append(63)
            case UInt8(ascii: "="): padding += 1
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"): continue
            default: return nil
            }
            if byte != UInt8(ascii: "="), padding > 0 { return nil }
        }
        guard (values.count + padding) % 4 == 0, padding <= 2 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(values.count * 3 / 4)
        var index = 0
        while index + 4 <= values.count {
            let v = values[index..<index + 4]
            let a = v[v.startIndex], b = v[v.startIndex + 1], c = v[v.startIndex + 2], d = v[v.startIndex + 3]
            out += [a << 2 | b >> 4, (b & 0xf) << 4 | c >> 2, (c & 0x3) << 6 | d]
            index += 4
        }
        let rest = values.count - index
        if rest == 2 {
            out.append(values[index] << 2 | values[index + 1] >> 4)
        } else if rest == 3 {
            out += [values[index] << 2 | values[index + 1] >> 4, (values[index + 1] & 0xf) << 4 | values[index + 2] >> 2]
        } else if rest == 1 {
            return nil
        }
        return out
    }

    static func encode(_ bytes: [UInt8]) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var out: [UInt8] = []
        var index = 0
        while index < bytes.count {
            let chunk = Array(bytes[index..<min(index + 3, bytes.count)])
            let n = (UInt32(chunk[0]) << 16) | (chunk.count > 1 ? UInt32(chunk[1]) << 8 : 0) | (chunk.count > 2 ? UInt32(chunk[2]) : 0)
            out.append(alphabet[Int(n >> 18 & 63)])
            out.append(alphabet[Int(n >> 12 & 63)])
            out.append(chunk.count > 1 ? alphabet[Int(n >> 6 & 63)] : UInt8(ascii: "="))
            out.append(chunk.count > 2 ? alphabet[Int(n & 63)] : UInt8(ascii: "="))
            index += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// A small text file's contents (nil when it cannot be read). Bounded to 1 MiB.
func readTextFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while bytes.count < 1 << 20 {
        guard case .success(let count) = retryingInterrupts({ buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } })
        else { return nil }
        if count == 0 { break }
        bytes += buffer[0..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}
