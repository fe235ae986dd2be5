import Foundation
import Locks
import SystemCalls

import Glibc

/// A file the library keeps or reads for the app could not be used: an identity's private key
/// (``Identity/loadOrCreate(at:)``), the trust store (``TrustStore``), the remembered peers
/// (``PeerMemory``) or a pre-shared key file (`PreSharedKey(contentsOfFile:)`).
///
/// ``message`` names the file, says what went wrong and what to do; ``errno`` keeps the system's
/// reason when a system call on the file failed.
public struct FileError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The file (or, when its directory could not be made, that directory).
    public let path: String
    /// What happened and what to do.
    public let message: String
    /// The system's error number (`EACCES`, `ENOSPC`, …) when a system call on the file failed;
    /// nil when the file was read but its content or its permissions are wrong.
    public let errno: Int32?

    init(_ path: String, _ message: String, errno: Int32? = nil) {
        self.path = path
        self.message = message
        self.errno = errno
    }

    /// A system call on `path` failed with `code`: `what` (`"cannot write the trust store '…'"`),
    /// the system's reason, and `advice` when there is something to do.
    static func system(_ path: String, _ what: String, errno code: Int32, advice: String? = nil) -> FileError {
        let reason = String(cString: strerror(code))
        return FileError(path, "\(what): \(reason)" + (advice.map { "; " + $0 } ?? ""), errno: code)
    }

    public var description: String { message }
}

/// Creates the directories above `path` (mode 0700) when they do not exist.
func createDirectories(for path: String) throws(FileError) {
    let directory = (path as NSString).deletingLastPathComponent
    guard !directory.isEmpty else { return }
    do {
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    } catch {
        let code = ((error as NSError).userInfo[NSUnderlyingErrorKey] as? NSError).map { Int32($0.code) }
        throw FileError(directory, "cannot create the directory '\(directory)': \(error.localizedDescription)", errno: code)
    }
}

/// A file of one entry per line that the library keeps for the app (``TrustStore``, ``PeerMemory``).
///
/// Read whole on every lookup, so several processes can share it; written whole through
/// `writeFileAtomically`. Reading takes no lock: a rename replaces the file at once, so a reader
/// sees the old list or the new one. A change reads, edits and writes the list under the file's
/// lock in this process and an flock on `<path>.lock` across processes (two changes at once would
/// each read the old list, and one would be lost).
struct LineFile<Entry>: Sendable {
    let path: String
    /// The first line: a comment saying what each line holds.
    private let header: String
    /// What the file is, in errors ("the trust store").
    private let what: String
    private let parse: @Sendable (Substring) -> Entry?
    private let format: @Sendable (Entry) -> String
    private let lock = Lock()

    init(
        path: String, header: String, what: String, parse: @escaping @Sendable (Substring) -> Entry?,
        format: @escaping @Sendable (Entry) -> String
    ) {
        self.path = path
        self.header = header
        self.what = what
        self.parse = parse
        self.format = format
    }

    /// Every entry, in file order (comment lines and lines that do not parse are skipped; a file
    /// that does not exist or is not UTF-8 has none).
    var entries: [Entry] {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else {
            return []
        }
        return text.split(separator: "\n").compactMap { $0.hasPrefix("#") ? nil : parse($0) }
    }

    /// Changes the list in one step: `change` edits the entries read now and returns whether to
    /// write them (false: nothing changed, nothing is written). Returns what `change` returned.
    /// - Throws: ``FileError`` when the file cannot be written.
    @discardableResult
    func update(_ change: (inout [Entry]) -> Bool) throws(FileError) -> Bool {
        try lock.withLock { () throws(FileError) -> Bool in
            // And across processes: two programs sharing the file (two clients of one user) would
            // each read the old list and one change would be lost (issue 43, 5). `<path>.lock`,
            // flock'd for the read-change-write; readers need no lock (the rename is atomic).
            try createDirectories(for: path)
            let lockFD = open(path + ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            guard lockFD >= 0 else {
                throw FileError.system(
                    path, "cannot lock \(what) '\(path)' (its lock file '\(path).lock')", errno: errno,
                    advice: "check that its directory is writable")
            }
            defer { close(lockFD) }  // releases the flock
            while flock(lockFD, LOCK_EX) != 0 && errno == EINTR {}
            var list = entries
            guard change(&list) else { return false }
            var text = header + "\n"
            for entry in list { text += format(entry) + "\n" }
            try writeFileAtomically(path, text, what: what)
            return true
        }
    }
}

/// The package's one atomic file writer: writes `text` to `path` through a temporary file of its
/// own, fsynced and renamed into place (mode 0600), so a reader sees the old file or the new one,
/// never a part. `what` names the file in errors (`"the trust store"`).
func writeFileAtomically(_ path: String, _ text: String, what: String) throws(FileError) {
    try createDirectories(for: path)
    // A name of its own per write: two writers of one file (threads or processes) never share it.
    let temporary = path + ".tmp.\(getpid()).\(UInt64.random(in: 0...UInt64.max))"
    let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else {
        throw FileError.system(path, "cannot write \(what) '\(path)'", errno: errno, advice: "check that its directory is writable")
    }
    var failure = writeAllAndSync(fd, Array(text.utf8))
    close(fd)
    if failure == nil, rename(temporary, path) != 0 { failure = errno }
    if let failure {
        unlink(temporary)
        throw FileError.system(path, "cannot write \(what) '\(path)'", errno: failure)
    }
}

/// Syncs the directory holding `path` (a new, linked or renamed file's name is on the disk then).
func syncDirectory(of path: String) {
    let directory = (path as NSString).deletingLastPathComponent
    let fd = open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { return }
    _ = fsync(fd)
    close(fd)
}

/// Writes all of `bytes` to `fd` (again after a short write or a signal) and fsyncs it: nil, or
/// the errno of the call that failed (ENOSPC when `write` wrote nothing).
func writeAllAndSync(_ fd: Int32, _ bytes: [UInt8]) -> Int32? {
    var offset = 0
    while offset < bytes.count {
        let result = bytes.withUnsafeBytes { raw in
            retryingInterrupts { write(fd, raw.baseAddress! + offset, raw.count - offset) }
        }
        switch result {
        case .success(0): return ENOSPC
        case .success(let count): offset += count
        case .failure(let error): return error.code
        }
    }
    if case .failure(let error) = retryingInterrupts({ fsync(fd) }) { return error.code }
    return nil
}
