import Crypto
import Locks
import Logging
import SystemCalls

#if canImport(Glibc)
    import Glibc
#endif

/// A failed system call: its name and errno.
public struct SystemCallError: Error, Sendable, CustomStringConvertible {
    /// What was called, e.g. `open(/srv/previews)`.
    public let call: String
    /// The errno value.
    public let errno: Int32

    public init(_ call: String, errno: Int32) {
        self.call = call
        self.errno = errno
    }

    public var description: String { "\(call): \(String(cString: strerror(errno)))" }
}

/// Runs a system call returning -1 on failure; retries on EINTR; throws ``SystemCallError``.
/// The one place syscalls of PreviewKit go through.
@discardableResult
func posix<T: FixedWidthInteger>(_ name: @autoclosure () -> String, _ body: () -> T) throws(SystemCallError) -> T {
    switch retryingInterrupts(body) {
    case .success(let result): return result
    case .failure(let error): throw SystemCallError(name(), errno: error.code)
    }
}

/// Lowercase hex of bytes.
func hex<S: Sequence>(_ bytes: S) -> String where S.Element == UInt8 {
    let digits = Array("0123456789abcdef".utf8)
    var out: [UInt8] = []
    for byte in bytes {
        out.append(digits[Int(byte >> 4)])
        out.append(digits[Int(byte & 0x0F)])
    }
    return String(decoding: out, as: UTF8.self)
}

/// SHA-256 of `bytes`, lowercase hex.
public func sha256Hex(_ bytes: [UInt8]) -> String { hex(SHA256.hash(data: bytes)) }

/// SHA-256 of a file, streamed in 1 MiB blocks (never holds the file).
public func sha256OfFile(atPath path: String) throws(SystemCallError) -> (hex: String, size: UInt64) {
    let fd = try posix("open(\(path))") { open(path, O_RDONLY | O_CLOEXEC) }
    defer { close(fd) }
    return try sha256(fd: fd, path: path)
}

/// SHA-256 of what remains to be read from `fd` (read sequentially).
func sha256(fd: Int32, path: String) throws(SystemCallError) -> (hex: String, size: UInt64) {
    var hasher = SHA256()
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    var total: UInt64 = 0
    while true {
        let count = try posix("read(\(path))") { buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }
        if count == 0 { break }
        buffer.withUnsafeBytes { hasher.update(bufferPointer: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        total += UInt64(count)
    }
    return (hex(hasher.finalize()), total)
}

/// Whether `text` is 64 hex digits (a SHA-256).
func isSHA256Hex(_ text: String) -> Bool {
    text.utf8.count == 64
        && text.utf8.allSatisfy {
            (0x30...0x39).contains($0) || (0x61...0x66).contains($0) || (0x41...0x46).contains($0)
        }
}

/// An accepted offer: a validated name and the bytes it reserves in the store's free space.
public struct Reservation: Sendable, Hashable {
    /// The offer id (random, unique per store).
    public let id: String
    /// What the client offered (name validated, hash well-formed, size within limits).
    public let offer: PreviewOffer
}

/// A file stored in the directory.
public struct StoredFile: Sendable, Hashable {
    /// The name it was stored under (maybe with a " (n)" suffix).
    public let name: String
    /// Its full path.
    public let path: String
    /// SHA-256, lowercase hex (verified against the offer).
    public let sha256: String
    /// Size in bytes.
    public let size: UInt64
    /// Who pushed it (set by ``PreviewService`` once stored; nil from the store itself).
    public var pusher: Pusher? = nil

    /// A pusher as a person sees it: the name its client gave, and its key's short form (nil for a
    /// plaintext pusher, which proves no key).
    public struct Pusher: Sendable, Hashable {
        public let name: String
        public let key: String?
        public init(name: String, key: String?) {
            self.name = name
            self.key = key
        }
    }
}

/// The receiving side's directory: admits offers (name, size, free space), streams transfers into
/// temporary files (`.preview-XXXXXXXX.part`, created with O_EXCL), hashes while writing, fsyncs, and
/// moves them into place with `link` + `unlink` (never overwriting) only when complete and verified.
/// Any failure, cancellation or abort deletes the temporary file.
public final class PreviewStore: Sendable {
    /// The directory files are stored in.
    public let directory: String
    /// The largest accepted file.
    public let maxSize: UInt64
    private let logger: Logger
    /// Bytes reserved by accepted offers that are not finished yet.
    private let reserved = Locked<[String: UInt64]>([:])

    /// - Throws: ``PreviewFailure`` (`storage-failed`) when `directory` is not a writable directory.
    public init(directory: String, maxSize: UInt64, logger: Logger) throws(PreviewFailure) {
        var path = directory
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw PreviewFailure(PreviewFailure.storageFailed, "'\(directory)' is not a directory; create it first")
        }
        guard access(path, W_OK | X_OK) == 0 else {
            throw PreviewFailure(PreviewFailure.storageFailed, "the directory '\(directory)' is not writable")
        }
        self.directory = path
        self.maxSize = maxSize
        self.logger = logger
    }

    /// Deletes temporary files left by a crashed server (`.preview-*.part`); returns their names.
    @discardableResult
    public func removeStaleTempFiles() -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var removed: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard FileName.isTempFile(name) else { continue }
            if unlinkat(dirfd(dir), name, 0) == 0 {
                removed.append(name)
            } else {
                logger.warning(
                    "cannot remove stale temporary file", metadata: ["file": "\(name)", "errno": "\(errno)"])
            }
        }
        if !removed.isEmpty {
            logger.notice("removed stale temporary files", metadata: ["files": "\(removed)"])
        }
        return removed
    }

    /// Free bytes in the directory for unprivileged writers (`statvfs`: f_bavail × f_frsize).
    public func freeSpace() -> UInt64? {
        var info = statvfs()
        guard statvfs(directory, &info) == 0 else { return nil }
        return UInt64(info.f_bavail) * UInt64(info.f_frsize)
    }

    /// Free space minus what accepted, unfinished offers reserve.
    public func availableSpace() -> UInt64? {
        guard let free = freeSpace() else { return nil }
        let pending = reserved.withLock { $0.values.reduce(0, +) }
        return free > pending ? free - pending : 0
    }

    /// Admits an offer — validates name and hash, checks size against the maximum and the free space
    /// (minus other reservations) — and reserves its size until ``release(_:)``.
    public func reserve(_ offer: PreviewOffer) throws(PreviewFailure) -> Reservation {
        try FileName.validate(offer.name)
        guard isSHA256Hex(offer.sha256) else {
            throw PreviewFailure(PreviewFailure.badRequest, "the offer's sha256 is not 64 hex digits")
        }
        guard offer.size <= maxSize else {
            throw PreviewFailure(
                PreviewFailure.tooLarge,
                "'\(offer.name)' is \(offer.size) bytes; this server accepts at most \(maxSize) bytes")
        }
        guard let free = freeSpace() else {
            throw PreviewFailure(
                PreviewFailure.storageFailed, "cannot determine the free space of the server's directory")
        }
        let id = Self.randomID()
        let admitted = reserved.withLock { reserved -> UInt64? in
            let pending = reserved.values.reduce(0, +)
            let available = free > pending ? free - pending : 0
            guard offer.size <= available else { return available }
            reserved[id] = offer.size
            return nil
        }
        if let available = admitted {
            throw PreviewFailure(
                PreviewFailure.noSpace,
                "not enough space on the server for '\(offer.name)': \(offer.size) bytes needed, \(available) available"
            )
        }
        return Reservation(
            id: id, offer: PreviewOffer(name: offer.name, size: offer.size, sha256: offer.sha256.lowercased()))
    }

    /// Gives back a reservation's space. Idempotent.
    public func release(_ reservation: Reservation) {
        _ = reserved.withLock { $0.removeValue(forKey: reservation.id) }
    }

    /// Number of unreleased reservations.
    public var reservationCount: Int { reserved.withLock { $0.count } }

    /// Streams `chunks` into a temporary file, hashing as it writes; when exactly the offered size
    /// arrived and the hash matches, fsyncs and links it into place under the offered name (or the
    /// first free " (n)" variant). On any failure — a chunk sequence that throws, too many or too few
    /// bytes, a hash mismatch, a write error, task cancellation — the temporary file is deleted.
    /// Does not release the reservation.
    public func receive<Chunks: AsyncSequence>(
        _ reservation: Reservation, chunks: Chunks
    ) async throws(PreviewFailure) -> StoredFile where Chunks.Element == [UInt8] {
        let offer = reservation.offer
        let temp: TempFile
        do {
            temp = try TempFile.create(in: directory)
        } catch {
            throw PreviewFailure(PreviewFailure.storageFailed, "cannot create a temporary file: \(error)")
        }
        defer { temp.discard() }  // no-op after commit
        var hasher = SHA256()
        var received: UInt64 = 0
        do {
            for try await chunk in chunks {
                if Task.isCancelled { throw CancellationError() }
                received += UInt64(chunk.count)
                guard received <= offer.size else {
                    throw PreviewFailure(
                        PreviewFailure.sizeMismatch, "more than the offered \(offer.size) bytes arrived")
                }
                chunk.withUnsafeBytes { hasher.update(bufferPointer: $0) }
                try temp.write(chunk)
            }
            if Task.isCancelled { throw CancellationError() }
        } catch let failure as PreviewFailure {
            throw failure
        } catch let error as SystemCallError {
            if error.errno == ENOSPC || error.errno == EDQUOT {
                throw PreviewFailure(PreviewFailure.noSpace, "the server ran out of space while writing: \(error)")
            }
            throw PreviewFailure(PreviewFailure.storageFailed, "cannot write the file: \(error)")
        } catch is CancellationError {
            throw PreviewFailure(
                PreviewFailure.transferFailed, "the transfer was aborted by the server (shutting down)")
        } catch {
            throw PreviewFailure(PreviewFailure.transferFailed, "the transfer failed: \(error)")
        }
        guard received == offer.size else {
            throw PreviewFailure(
                PreviewFailure.sizeMismatch, "\(received) of the offered \(offer.size) bytes arrived")
        }
        let digest = hex(hasher.finalize())
        guard digest == offer.sha256 else {
            throw PreviewFailure(
                PreviewFailure.hashMismatch,
                "the received bytes have SHA-256 \(digest), not the offered \(offer.sha256); nothing was stored")
        }
        do {
            let name = try temp.commit(as: offer.name)
            logger.info("stored", metadata: ["name": "\(name)", "bytes": "\(received)"])
            return StoredFile(name: name, path: directory + "/" + name, sha256: digest, size: received)
        } catch {
            throw PreviewFailure(PreviewFailure.storageFailed, "cannot store the file: \(error)")
        }
    }

    /// Stores a complete, verified file (a resumed transfer's partial, see `PartialTransfers`) under
    /// the offered name (or the first free " (n)" variant): linked into place, the partial unlinked,
    /// the directory synced. On failure the partial is deleted.
    public func commit(partial path: String, offer: PreviewOffer) throws(PreviewFailure) -> StoredFile {
        defer { unlink(path) }  // linked into place, or failed: the partial goes either way
        chmod(path, 0o644)
        var attempt = 0
        while true {
            attempt += 1
            let candidate = FileName.candidate(offer.name, attempt: attempt)
            let target = directory + "/" + candidate
            if link(path, target) == 0 {
                let dir = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                if dir >= 0 {
                    fsync(dir)
                    close(dir)
                }
                // Every push with partials kept comes here, resumed or not (issue 45, 7: this said
                // resumed=true for a fresh push); the push's own log line says whether it resumed.
                logger.info("stored", metadata: ["name": "\(candidate)", "bytes": "\(offer.size)"])
                return StoredFile(name: candidate, path: target, sha256: offer.sha256, size: offer.size)
            }
            let code = errno
            if code == EEXIST && attempt < 10_000 { continue }
            if code == EXDEV {
                throw PreviewFailure(
                    PreviewFailure.storageFailed, "the partial-transfer directory is on another file system than \(directory)")
            }
            throw PreviewFailure(PreviewFailure.storageFailed, "cannot store the file: \(String(cString: strerror(code)))")
        }
    }

    static func randomID() -> String {
        var generator = SystemRandomNumberGenerator()
        return hex((0..<8).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }
}

/// A temporary file in the store's directory, opened with O_EXCL. `discard()` closes and deletes it;
/// `commit(as:)` fsyncs it and links it to a final name (never replacing one), then deletes the
/// temporary name. Used by one task at a time.
final class TempFile: @unchecked Sendable {  // used by one task at a time (the receive loop)
    let directory: String
    let name: String
    private var fd: Int32
    private var done = false

    private init(directory: String, name: String, fd: Int32) {
        self.directory = directory
        self.name = name
        self.fd = fd
    }

    var path: String { directory + "/" + name }

    static func create(in directory: String) throws(SystemCallError) -> TempFile {
        var attempt = 0
        while true {
            attempt += 1
            let name = FileName.tempPrefix + PreviewStore.randomID() + FileName.tempSuffix
            let path = directory + "/" + name
            do {
                let fd = try posix("open(\(path))") { open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600) }
                return TempFile(directory: directory, name: name, fd: fd)
            } catch  where error.errno == EEXIST && attempt < 16 {
                continue
            }
        }
    }

    func write(_ chunk: [UInt8]) throws(SystemCallError) {
        var offset = 0
        while offset < chunk.count {
            offset += try posix("write(\(name))") {
                chunk.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
            }
        }
    }

    /// fsync, then link under the first free candidate name, unlink the temporary name, fsync the directory.
    func commit(as wanted: String) throws(SystemCallError) -> String {
        try posix("fchmod(\(name))") { fchmod(fd, 0o644) }
        try posix("fsync(\(name))") { fsync(fd) }
        close(fd)
        fd = -1
        var attempt = 0
        while true {
            attempt += 1
            let candidate = FileName.candidate(wanted, attempt: attempt)
            let target = directory + "/" + candidate
            do {
                try posix("link(\(target))") { link(path, target) }
            } catch  where error.errno == EEXIST && attempt < 10_000 {
                continue
            }
            done = true
            unlink(path)
            syncDirectory()
            return candidate
        }
    }

    private func syncDirectory() {
        let dir = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dir >= 0 else { return }
        fsync(dir)
        close(dir)
    }

    /// Closes and deletes the temporary file unless it was committed. Idempotent.
    func discard() {
        if fd >= 0 {
            close(fd)
            fd = -1
        }
        guard !done else { return }
        done = true
        unlink(path)
    }
}
