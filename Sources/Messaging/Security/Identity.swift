import Crypto
import Foundation
import Locks
import ProtocolCore
import Glibc

/// This app's long-term identity: a Curve25519 key pair. Its public key's ``fingerprint`` is what
/// peers remember; the private key never leaves this process and is never logged.
public struct Identity: @unchecked Sendable {
    // @unchecked: the private key is an immutable value.
    let privateKey: Curve25519.KeyAgreement.PrivateKey

    /// A new key pair that lives only as long as this value (peers see a new key every run).
    public static func ephemeral() -> Identity { Identity(privateKey: .init()) }

    /// The 32-byte public key.
    public var publicKey: [UInt8] { Array(privateKey.publicKey.rawRepresentation) }
    /// The public key's fingerprint.
    public var fingerprint: Fingerprint { Fingerprint(publicKey: publicKey) }

    /// Where an app's identity lives by default: `$XDG_DATA_HOME/lanmsg/<app>/identity`
    /// (`~/.local/share/lanmsg/<app>/identity` without `XDG_DATA_HOME`).
    public static func defaultPath(app: String) -> String { dataDirectory(app: app) + "/identity" }

    /// Loads the identity stored at `path`, or creates one there (directories mode 0700, the file
    /// mode 0600) when the file does not exist.
    /// - Throws: ``FileError`` when the file cannot be read or written, is malformed, or can be
    ///   read by other users (like ssh, a key file open to others is refused).
    public static func loadOrCreate(at path: String) throws(FileError) -> Identity {
        if FileManager.default.fileExists(atPath: path) { return try load(path) }
        let identity = Identity.ephemeral()
        let text = "lanmsg-identity-1 " + Data(identity.privateKey.rawRepresentation).base64EncodedString() + "\n"
        try createDirectories(for: path)
        // Created whole, then linked into place exclusively (issue 43: two processes creating it at
        // once, one read the other's half-written file): the file at `path` is always complete, and
        // of two creators the second finds the first's key and uses it.
        let temporary = path + ".tmp.\(getpid()).\(UInt64.random(in: 0...UInt64.max))"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw FileError.system(
                path, "cannot create the identity file '\(path)'", errno: errno,
                advice: "check that its directory is writable or give another path")
        }
        let failure = writeAllAndSync(fd, Array(text.utf8))
        close(fd)
        defer { unlink(temporary) }
        if let failure {
            throw FileError.system(path, "cannot write the identity file '\(path)'", errno: failure)
        }
        guard link(temporary, path) == 0 else {
            let code = errno
            if code == EEXIST { return try load(path) }  // another process created it meanwhile: its key
            throw FileError.system(
                path, "cannot create the identity file '\(path)'", errno: code,
                advice: "check that its directory is writable or give another path")
        }
        syncDirectory(of: path)
        return identity
    }

    private static func load(_ path: String) throws(FileError) -> Identity {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw FileError.system(path, "cannot read the identity file '\(path)'", errno: errno)
        }
        if info.st_mode & 0o077 != 0 {
            throw FileError(
                path,
                "the identity file '\(path)' can be read by other users (mode \(String(info.st_mode & 0o777, radix: 8))); "
                    + "its private key must be private: run `chmod 600 '\(path)'`")
        }
        guard let data = FileManager.default.contents(atPath: path),
            let text = String(data: data, encoding: .utf8)
        else {
            throw FileError(path, "cannot read the identity file '\(path)'; check its permissions")
        }
        let parts = text.split(whereSeparator: \.isWhitespace)
        guard parts.count == 2, parts[0] == "lanmsg-identity-1", let raw = Data(base64Encoded: String(parts[1])),
            let key = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: raw)
        else {
            // The library writes identity files whole (a temporary file linked into place), so this
            // is not one another process is still writing.
            throw FileError(
                path,
                "the identity file '\(path)' is not a lanmsg identity (expected `lanmsg-identity-1 <base64 key>`, found "
                    + (data.isEmpty ? "an empty file" : "\(data.count) bytes of something else")
                    + "); it was not written by this library. Restore it from a backup, or move it away to create a "
                    + "new identity (peers that trusted the old one will refuse the new one)")
        }
        return Identity(privateKey: key)
    }

    static func dataDirectory(app: String) -> String {
        let environment = ProcessInfo.processInfo.environment
        let base =
            environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? ((environment["HOME"] ?? NSHomeDirectory()) + "/.local/share")
        return base + "/lanmsg/" + app
    }
}
