import Crypto
import Foundation
import Locks
import Logging
import ProtocolCore
import Transport
import SystemCalls

/// Where a receiver keeps interrupted transfers so they resume where they stopped.
///
/// A partial transfer is keyed by its sender (for example the peer's key fingerprint), the content's
/// SHA-256 and its size. The sender offers the content with its hash and size; the receiver answers
/// with ``offset(for:)`` — the bytes it already has, durably — and the sender streams only the rest
/// (``MessageChannel/sendFile(at:type:metadata:startingAt:chunkSize:progress:)``). When the last byte
/// arrives the whole file is verified against the hash before it is handed over. Partial files live
/// in `directory` (mode 0700), survive a restart of the receiver, and are deleted after `keepFor`
/// without a resume.
public final class PartialTransfers: Sendable {
    /// What identifies one partial transfer.
    public struct Key: Hashable, Sendable, CustomStringConvertible {
        /// Who sends it (a key fingerprint; any stable name of the sender).
        public var sender: String
        /// SHA-256 of the whole content, lowercase hex.
        public var sha256: String
        /// Size of the whole content.
        public var size: UInt64

        public init(sender: String, sha256: String, size: UInt64) {
            self.sender = sender
            self.sha256 = sha256
            self.size = size
        }

        /// The partial file's name: a hash of the key (names from the network never reach the path).
        var fileName: String {
            let digest = SHA256.hash(data: Array("\(sender)\n\(sha256)\n\(size)".utf8))
            return Hex.encode(Array(digest.prefix(16))) + ".partial"
        }

        public var description: String { "\(sha256.prefix(12))… (\(size) bytes) from \(sender.prefix(16))" }
    }

    /// The directory of the partial files.
    public let directory: String
    /// How long a partial file is kept without a resume.
    public let keepFor: Duration
    private let logger: Logger
    private let active = Locked<Set<Key>>([])

    /// - Parameters:
    ///   - directory: Created (mode 0700) if missing.
    ///   - keepFor: Partial files older than this (since their last byte) are deleted.
    ///   - logger: Where resumes, expiries and storage failures are logged.
    /// - Throws: ``ResumableTransferError`` `.storage` when the directory cannot be made.
    public init(directory: String, keepFor: Duration = .seconds(3600), logger: Logger) throws(ResumableTransferError) {
        self.directory = directory
        self.keepFor = keepFor
        self.logger = logger
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw ResumableTransferError(
                code: .storage, message: "cannot create \(directory): \(String(cString: strerror(errno)))", kept: 0)
        }
        removeExpired()
    }

    private func path(_ key: Key) -> String { directory + "/" + key.fileName }

    /// The bytes already received of `key` (0: none, or expired); a transfer resumes after them.
    public func offset(for key: Key) -> UInt64 {
        var info = stat()
        guard stat(path(key), &info) == 0 else { return 0 }
        if isExpired(info) {
            unlink(path(key))
            return 0
        }
        let length = UInt64(max(info.st_size, 0))
        return length <= key.size ? length : 0
    }

    /// Whether a receive of `key` is running.
    public func isReceiving(_ key: Key) -> Bool { active.withLock { $0.contains(key) } }

    /// Receives the bytes of `key` from `offset` on (what ``offset(for:)`` said) into its partial file.
    ///
    /// - Returns: The path of the complete, verified file. Move it away (rename or link) or delete it:
    ///   it is no longer a partial.
    /// - Throws: ``ResumableTransferError``: `.interrupted` keeps what arrived (fsynced) for the next
    ///   resume; `.hashMismatch` and `.sizeMismatch` delete the partial; `.busy` when another receive
    ///   of the same key runs.
    public func receive<Chunks: AsyncSequence>(
        _ chunks: Chunks, key: Key, offset: UInt64
    ) async throws(ResumableTransferError) -> String where Chunks.Element == [UInt8] {
        let admitted = active.withLock { $0.insert(key).inserted }
        guard admitted else {
            throw ResumableTransferError(code: .busy, message: "\(key) is being received already", kept: 0)
        }
        defer { _ = active.withLock { $0.remove(key) } }
        let path = path(key)
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw storage("open \(path)", kept: 0) }
        defer { Glibc.close(fd) }
        var info = stat()
        fstat(fd, &info)
        guard offset <= UInt64(max(info.st_size, 0)), offset <= key.size else {
            Glibc.unlink(path)
            throw ResumableTransferError(
                code: .sizeMismatch, message: "offset \(offset) is beyond the \(info.st_size) bytes kept of \(key)",
                kept: 0)
        }
        // Whatever lies beyond the offset the sender was told is dropped.
        guard ftruncate(fd, off_t(offset)) == 0, lseek(fd, off_t(offset), SEEK_SET) >= 0 else {
            throw storage("truncate \(path)", kept: offset)
        }
        var written = offset
        do {
            for try await chunk in chunks {
                if Task.isCancelled { break }
                guard written + UInt64(chunk.count) <= key.size else {
                    Glibc.unlink(path)
                    throw ResumableTransferError(
                        code: .sizeMismatch, message: "more than the announced \(key.size) bytes arrived", kept: 0)
                }
                try Self.writeAll(fd, chunk, path: path, kept: written)
                written += UInt64(chunk.count)
            }
        } catch let error as ResumableTransferError {
            if error.code == .storage { fsync(fd) }
            throw error
        } catch {
            fsync(fd)
            throw ResumableTransferError(
                code: .interrupted, message: "the transfer stopped after \(written) of \(key.size) bytes: \(error)",
                kept: written)
        }
        guard fsync(fd) == 0 else { throw storage("fsync \(path)", kept: written) }
        guard written == key.size else {
            throw ResumableTransferError(
                code: .interrupted,
                message: "the transfer ended after \(written) of \(key.size) bytes\(Task.isCancelled ? " (cancelled)" : "")",
                kept: written)
        }
        // The whole file, including the bytes of earlier attempts, must have the announced hash.
        let digest: String
        do {
            digest = try Self.sha256(path)
        } catch {
            throw ResumableTransferError(code: .storage, message: "cannot read \(path) back: \(error)", kept: written)
        }
        guard digest == key.sha256 else {
            Glibc.unlink(path)
            throw ResumableTransferError(
                code: .hashMismatch,
                message: "the received file has SHA-256 \(digest), not the announced \(key.sha256); it was deleted",
                kept: 0)
        }
        return path
    }

    /// Deletes the partial file of `key`.
    public func discard(_ key: Key) { unlink(path(key)) }

    /// Deletes partial files older than ``keepFor``; returns how many.
    @discardableResult
    public func removeExpired() -> Int {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return 0 }
        var removed = 0
        for name in names where name.hasSuffix(".partial") {
            var info = stat()
            let path = directory + "/" + name
            if stat(path, &info) == 0, isExpired(info), unlink(path) == 0 { removed += 1 }
        }
        if removed > 0 { logger.info("removed \(removed) expired partial transfers") }
        return removed
    }

    private func isExpired(_ info: stat) -> Bool {
        let age = Date().timeIntervalSince1970 - (Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9)
        let (seconds, attoseconds) = keepFor.components
        return age > Double(seconds) + Double(attoseconds) / 1e18
    }

    private func storage(_ what: String, kept: UInt64) -> ResumableTransferError {
        let code = errno
        return ResumableTransferError(
            code: .storage, message: "\(what): \(String(cString: strerror(code))) (errno \(code))", kept: kept)
    }

    private static func writeAll(_ fd: Int32, _ bytes: [UInt8], path: String, kept: UInt64) throws(ResumableTransferError) {
        var offset = 0
        while offset < bytes.count {
            switch retryingInterrupts({ bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) } }) {
            case .success(let count): offset += count
            case .failure(let error):
                throw ResumableTransferError(code: .storage, message: "write \(path): \(error)", kept: kept)
            }
        }
    }

    /// SHA-256 of a file, lowercase hex.
    static func sha256(_ path: String) throws -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw TransportError(.syscallFailed, "open \(path): \(String(cString: strerror(errno)))") }
        defer { Glibc.close(fd) }
        var hasher = SHA256()
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let count: Int
            switch retryingInterrupts({ buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) } }) {
            case .success(let read): count = read
            case .failure(let error): throw TransportError(.syscallFailed, "read \(path): \(error)")
            }
            if count == 0 { break }
            buffer.withUnsafeBytes { hasher.update(bufferPointer: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        }
        return Hex.encode(Array(hasher.finalize()))
    }
}
