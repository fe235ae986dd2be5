import Foundation
import Locks
import Synchronization
import SystemCalls

import Glibc

/// The system calls a session store makes, behind one seam: the real file system
/// (``PosixFileSystem``), or a simulated disk in the tests that loses, tears, zero-fills and
/// reorders what was not synced when it "loses power", and fails any call with `EIO` or `ENOSPC`
/// (`Tests/MessagingTests/SimulatedDisk.swift`). Every call's result is checked: a failure throws
/// the call's ``Errno``, never passes unnoticed.
protocol StoreFileSystem: Sendable {
    /// Creates `path` and the directories above it that do not exist (mode 0700), each new one
    /// made durable in its parent (the parent synced).
    func makeDirectories(_ path: String) throws(StoreCallError)
    /// Opens the file at `path` for reading and writing; nil when there is none (`ENOENT`).
    func open(_ path: String) throws(StoreCallError) -> (any StoreFile)?
    /// Creates the file at `path` (mode 0600), replacing one that is there.
    func create(_ path: String) throws(StoreCallError) -> any StoreFile
    /// `rename(2)`: replaces `to` with `from` in one step.
    func rename(_ from: String, to: String) throws(StoreCallError)
    /// `unlink(2)`; a file that is not there is no error.
    func remove(_ path: String) throws(StoreCallError)
    /// `fsync(2)` of the directory holding `path`: a file created, renamed or removed there is
    /// durable then.
    func syncDirectory(of path: String) throws(StoreCallError)
    /// Bytes free on the file system holding `path` (`statvfs`), nil when unknown.
    func freeSpace(at path: String) -> Int?
    /// Takes the lock that keeps other processes from the store in `directory` (a file `name`
    /// there), or says who holds it. Returns the handle and what the lock file holds (the words of
    /// the process that held it last, empty for a new one), unchanged: the opener writes its own
    /// with ``StoreLockHandle/rewrite(_:)`` once it has settled what they told it.
    func lock(_ directory: String, name: String) throws(FileError) -> (handle: any StoreLockHandle, previous: [UInt8])
}

/// An open file of a store.
protocol StoreFile: AnyObject, Sendable {
    /// Its length (`fstat`).
    func size() throws(StoreCallError) -> Int
    /// Up to `count` bytes at `offset` (`pread`; fewer only at the end of the file).
    func read(at offset: Int, count: Int) throws(StoreCallError) -> [UInt8]
    /// All of `bytes` at `offset` (`pwrite`, again after a short write). On a failure part of them
    /// may have been written: the caller cuts the file back.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreCallError)
    /// `ftruncate(2)`.
    func truncate(to length: Int) throws(StoreCallError)
    /// `fdatasync(2)`: what was written is on the disk.
    func sync() throws(StoreCallError)
    /// `close(2)`.
    func close()
    /// The caller wrote `[offset, end)` (zeros ahead of its records): the file has those bytes, and
    /// the next writes inside them may be copies into memory shared with the file (`mmap`,
    /// `MAP_SHARED`) instead of `pwrite` calls — the same page cache, so what a process crash and
    /// ``sync()`` keep is the same. Optional: a file may ignore it.
    func writesWillStayWithin(_ offset: Int, _ end: Int)
}

extension StoreFile {
    func writesWillStayWithin(_ offset: Int, _ end: Int) {}

    /// All of `bytes` at `offset` (``write(_:at:)`` of an array).
    func write(_ bytes: [UInt8], at offset: Int) throws(StoreCallError) {
        let result = bytes.withUnsafeBytes { raw in Result { () throws(StoreCallError) in try write(raw, at: offset) } }
        try result.get()
    }
}

/// A failed system call of the store: which one, on what, and its errno.
struct StoreCallError: Error, Sendable, CustomStringConvertible {
    let call: String
    let path: String
    let errno: Errno

    init(_ call: String, _ path: String, _ code: Int32) {
        self.call = call
        self.path = path
        errno = Errno(code)
    }

    var code: Int32 { errno.code }
    var description: String { "\(call) '\(path)': \(errno)" }
}

/// The real file system.
struct PosixFileSystem: StoreFileSystem {
    func makeDirectories(_ path: String) throws(StoreCallError) {
        var missing: [String] = []
        var directory = path
        while !directory.isEmpty, directory != "/", access(directory, F_OK) != 0 {
            missing.append(directory)
            directory = (directory as NSString).deletingLastPathComponent
        }
        for directory in missing.reversed() {
            if case .failure(let error) = retryingInterrupts({ mkdir(directory, 0o700) }), error.code != EEXIST {
                throw StoreCallError("mkdir", directory, error.code)
            }
            // The new directory's entry in its parent: durable only once the parent is synced.
            try syncDirectory(of: directory)
        }
    }

    func open(_ path: String) throws(StoreCallError) -> (any StoreFile)? {
        switch retryingInterrupts({ Glibc.open(path, O_RDWR | O_CLOEXEC) }) {
        case .success(let fd): return PosixFile(fd: fd, path: path)
        case .failure(let error) where error.code == ENOENT: return nil
        case .failure(let error): throw StoreCallError("open", path, error.code)
        }
    }

    func create(_ path: String) throws(StoreCallError) -> any StoreFile {
        switch retryingInterrupts({ Glibc.open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600) }) {
        case .success(let fd): return PosixFile(fd: fd, path: path)
        case .failure(let error): throw StoreCallError("open", path, error.code)
        }
    }

    func rename(_ from: String, to: String) throws(StoreCallError) {
        if case .failure(let error) = retryingInterrupts({ Glibc.rename(from, to) }) { throw StoreCallError("rename", to, error.code) }
    }

    func remove(_ path: String) throws(StoreCallError) {
        if case .failure(let error) = retryingInterrupts({ unlink(path) }), error.code != ENOENT {
            throw StoreCallError("unlink", path, error.code)
        }
    }

    func syncDirectory(of path: String) throws(StoreCallError) {
        let directory = (path as NSString).deletingLastPathComponent
        let name = directory.isEmpty ? "." : directory
        let fd: Int32
        switch retryingInterrupts({ Glibc.open(name, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }) {
        case .success(let opened): fd = opened
        case .failure(let error): throw StoreCallError("open", name, error.code)
        }
        defer { _ = Glibc.close(fd) }
        if case .failure(let error) = retryingInterrupts({ fsync(fd) }) { throw StoreCallError("fsync", name, error.code) }
    }

    func freeSpace(at path: String) -> Int? {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return nil }
        return Int(info.f_bavail) * Int(info.f_frsize)
    }
}

/// A file descriptor of the real file system (immutable; the calls are thread-safe).
final class PosixFile: StoreFile {
    let fd: Int32
    let path: String
    /// Where the file is mapped (``writesWillStayWithin(_:_:)``): writes inside it are copies, one
    /// `memcpy` instead of a `pwrite` per batch of records (the per-message system call of a
    /// session's journal at `.processCrash`). Taken by the journal's writer alone, the lock for the
    /// close that may come from another queue.
    private let window = Locked<Window?>(nil)

    struct Window: @unchecked Sendable {
        let base: UnsafeMutableRawPointer
        /// The file offset of `base` (a page boundary) and the bytes mapped.
        let offset: Int
        let length: Int
        var end: Int { offset + length }
    }

    init(fd: Int32, path: String) {
        self.fd = fd
        self.path = path
    }

    deinit { unmap() }

    func writesWillStayWithin(_ offset: Int, _ end: Int) {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let start = offset / page * page
        guard end > start else { return }
        let mapped = mmap(nil, end - start, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(start))
        window.withLock { window in
            if let old = window { munmap(old.base, old.length) }
            // (Not mapped — no address space, a file system without mmap: writes stay pwrite.)
            window = mapped == MAP_FAILED || mapped == nil ? nil : Window(base: mapped!, offset: start, length: end - start)
        }
    }

    private func unmap() {
        window.withLock { window in
            if let old = window { munmap(old.base, old.length) }
            window = nil
        }
    }

    func size() throws(StoreCallError) -> Int {
        var info = stat()
        if case .failure(let error) = retryingInterrupts({ fstat(fd, &info) }) { throw StoreCallError("fstat", path, error.code) }
        return Int(info.st_size)
    }

    func read(at offset: Int, count: Int) throws(StoreCallError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let result = bytes.withUnsafeMutableBytes { raw in
                retryingInterrupts { pread(fd, raw.baseAddress! + done, count - done, off_t(offset + done)) }
            }
            switch result {
            case .success(0): return Array(bytes[0..<done])
            case .success(let read): done += read
            case .failure(let error): throw StoreCallError("pread", path, error.code)
            }
        }
        return bytes
    }

    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreCallError) {
        let copied = window.withLock { window -> Bool in
            guard let window, offset >= window.offset, offset + bytes.count <= window.end else { return false }
            (window.base + (offset - window.offset)).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
            return true
        }
        if copied { return }
        var done = 0
        while done < bytes.count {
            switch retryingInterrupts({ pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset + done)) }) {
            case .success(0): throw StoreCallError("pwrite", path, ENOSPC)
            case .success(let written): done += written
            case .failure(let error): throw StoreCallError("pwrite", path, error.code)
            }
        }
    }

    func truncate(to length: Int) throws(StoreCallError) {
        unmap()  // (a page mapped past the end would fault: SIGBUS)
        if case .failure(let error) = retryingInterrupts({ ftruncate(fd, off_t(length)) }) {
            throw StoreCallError("ftruncate", path, error.code)
        }
    }

    func sync() throws(StoreCallError) {
        if case .failure(let error) = retryingInterrupts({ fdatasync(fd) }) { throw StoreCallError("fdatasync", path, error.code) }
    }

    func close() {
        unmap()
        _ = Glibc.close(fd)
    }
}

/// The lock a process holds on a store's directory while it uses the store.
protocol StoreLockHandle: Sendable {
    /// Releases it (once; again is nothing).
    func unlock()
    /// Replaces what the lock file holds with `holder`, synced; false when that failed.
    func rewrite(_ holder: [UInt8]) -> Bool
}

extension PosixFileSystem {
    /// Takes the store's lock: `flock` on `<directory>/<name>` (released by the kernel when the
    /// process ends, however it ends). The file holds its holder's pid on its first line.
    func lock(_ directory: String, name: String) throws(FileError) -> (handle: any StoreLockHandle, previous: [UInt8]) {
        let lockPath = (directory as NSString).appendingPathComponent(name)
        let fd: Int32
        switch retryingInterrupts({ Glibc.open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600) }) {
        case .success(let opened): fd = opened
        case .failure(let error):
            throw FileError.system(lockPath, "cannot open the session store's lock '\(lockPath)'", errno: error.code, advice: "check that the directory is writable")
        }
        if case .failure(let error) = retryingInterrupts({ flock(fd, LOCK_EX | LOCK_NB) }) {
            var holder = ""
            let bytes = Self.readAll(fd)
            if let line = String(decoding: bytes, as: UTF8.self).split(separator: "\n").first,
                let pid = Int(line.trimmingCharacters(in: .whitespaces))
            {
                holder = " (pid \(pid))"
            }
            _ = Glibc.close(fd)
            guard error.wouldBlock else {
                throw FileError.system(lockPath, "cannot lock the session store '\(directory)'", errno: error.code)
            }
            throw FileError(
                lockPath,
                "the session store '\(directory)' is in use by another process\(holder): a store belongs to one process at a time; give this one a directory of its own, or stop the other first",
                errno: EWOULDBLOCK)
        }
        return (PosixStoreLock(fd: fd), Self.readAll(fd))
    }

    /// What the file at `fd` holds (up to 64 KiB; empty when it cannot be read).
    static func readAll(_ fd: Int32) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 64 << 10)
        let count = pread(fd, &bytes, bytes.count, 0)
        return count > 0 ? Array(bytes[0..<count]) : []
    }
}

/// A held `flock` (its descriptor closed on unlock, once).
final class PosixStoreLock: StoreLockHandle {
    private let fd: Int32
    private let released = Atomic(false)

    init(fd: Int32) { self.fd = fd }

    func unlock() {
        guard !released.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = flock(fd, LOCK_UN)
        _ = Glibc.close(fd)
    }

    func rewrite(_ holder: [UInt8]) -> Bool {
        guard !released.load(ordering: .acquiring) else { return false }
        guard case .success = retryingInterrupts({ ftruncate(fd, 0) }) else { return false }
        var done = 0
        while done < holder.count {
            let result = holder.withUnsafeBytes { raw in
                retryingInterrupts { pwrite(fd, raw.baseAddress! + done, holder.count - done, off_t(done)) }
            }
            guard case .success(let written) = result, written > 0 else { return false }
            done += written
        }
        if case .success = retryingInterrupts({ fdatasync(fd) }) { return true }
        return false
    }
}
