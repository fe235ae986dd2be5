import Foundation
import Glibc
import Locks

@testable import Messaging

/// A file system in memory that keeps the page cache and the disk apart, for the session store's
/// crash tests (the way SQLite's test VFS and LazyFS do it): every write, truncate, create, rename
/// and unlink goes to the cache at once and reaches the "disk" only when synced — a file's data by
/// its `fdatasync`, a directory's entries by the directory's `fsync`. ``image()`` takes what a
/// power loss at this moment may leave: the disk plus any of the unsynced operations — none, all,
/// a prefix, the next one torn at any byte or left as zeros (allocated, never written), an
/// arbitrary subset in order (pages written back out of order), and for directories any prefix of
/// their operations, independently of the files' data (a rename reaching the disk before the data
/// of the file it names). Any call can be made to fail with `EIO` or `ENOSPC`.
final class SimulatedDisk: StoreFileSystem, @unchecked Sendable {
    // @unchecked: every field is touched under `lock`.
    enum Operation: Equatable, Sendable {
        case write(offset: Int, bytes: [UInt8])
        case truncate(Int)
    }
    enum Entry: Equatable, Sendable {
        case link(String, inode: Int)
        case unlink(String)
        case rename(String, to: String)
    }
    struct Inode: Sendable {
        var disk: [UInt8] = []
        var cache: [UInt8] = []
        /// Since the last sync, in order.
        var pending: [Operation] = []
    }
    struct Directory: Sendable {
        var disk: [String: Int] = [:]
        var cache: [String: Int] = [:]
        var pending: [Entry] = []
    }
    /// What a power loss can work from: the disk and every unsynced operation.
    struct Image: Sendable {
        var inodes: [Int: Inode]
        var directories: [String: Directory]
        /// Mutating calls made before it.
        var calls: Int
    }

    private let lock = Lock()
    private var inodes: [Int: Inode] = [:]
    private var directories: [String: Directory] = [:]
    private var nextInode = 1
    /// The open files and their inodes: an unlinked file keeps its room until it is closed.
    private var openFiles: [ObjectIdentifier: Int] = [:]
    /// Mutating calls so far (the crash points).
    private var calls = 0
    var callCount: Int { lock.withLock { calls } }
    /// The call that fails (by its number among all calls), and how.
    var failure: (call: Int, errno: Int32)?
    /// The next call of this name (`pwrite`, `fdatasync`, …) fails, and how (then cleared).
    var failNext: (name: String, errno: Int32)? {
        get { lock.withLock { _failNext } }
        set { lock.withLock { _failNext = newValue } }
    }
    private var _failNext: (name: String, errno: Int32)?
    /// Bytes the disk holds at most (the cache's sizes counted): writes past it fail with ENOSPC.
    var capacity: Int?
    /// Runs after every mutating call, with the disk's image then (under the disk's lock: copy, do
    /// not call back).
    var onChange: (@Sendable (Image) -> Void)?

    init() {}

    /// A disk holding exactly `files` (already synced), in their directories.
    init(files: [String: [UInt8]]) {
        for (path, bytes) in files {
            let inode = nextInode
            nextInode += 1
            inodes[inode] = Inode(disk: bytes, cache: bytes)
            let (directory, name) = Self.split(path)
            directories[directory, default: Directory()].disk[name] = inode
            directories[directory, default: Directory()].cache[name] = inode
        }
    }

    static func split(_ path: String) -> (String, String) {
        ((path as NSString).deletingLastPathComponent, (path as NSString).lastPathComponent)
    }

    func image() -> Image { lock.withLock { Image(inodes: inodes, directories: directories, calls: calls) } }

    /// The files as they are in the cache (what the running process sees).
    func contents(_ path: String) -> [UInt8]? {
        lock.withLock {
            let (directory, name) = Self.split(path)
            return directories[directory]?.cache[name].flatMap { inodes[$0]?.cache }
        }
    }

    /// Counts a call; throws when it is the one that fails.
    var trace: [String] = []
    private func call(_ name: String, _ path: String, mutating: Bool = true) throws(StoreCallError) {
        calls += 1
        trace.append("\(calls) \(name) \((path as NSString).lastPathComponent)")
        if let failure, failure.call == calls { throw StoreCallError(name, path, failure.errno) }
        if let next = _failNext, next.name == name {
            _failNext = nil
            throw StoreCallError(name, path, next.errno)
        }
    }

    private func changed() {
        if let onChange { onChange(Image(inodes: inodes, directories: directories, calls: calls)) }
    }

    // MARK: StoreFileSystem

    func makeDirectories(_ path: String) throws(StoreCallError) {
        try lock.withLock { () throws(StoreCallError) in
            if directories[path] == nil { directories[path] = Directory() }
        }
    }

    func open(_ path: String) throws(StoreCallError) -> (any StoreFile)? {
        try lock.withLock { () throws(StoreCallError) -> (any StoreFile)? in
            let (directory, name) = Self.split(path)
            guard let inode = directories[directory]?.cache[name] else { return nil }
            return opened(SimulatedFile(disk: self, inode: inode, path: path))
        }
    }

    func create(_ path: String) throws(StoreCallError) -> any StoreFile {
        try lock.withLock { () throws(StoreCallError) -> any StoreFile in
            try call("open", path)
            let inode = nextInode
            nextInode += 1
            inodes[inode] = Inode()
            let (directory, name) = Self.split(path)
            directories[directory, default: Directory()].cache[name] = inode
            directories[directory, default: Directory()].pending.append(.link(name, inode: inode))
            changed()
            return opened(SimulatedFile(disk: self, inode: inode, path: path))
        }
    }

    func rename(_ from: String, to: String) throws(StoreCallError) {
        try lock.withLock { () throws(StoreCallError) in
            try call("rename", to)
            let (directory, fromName) = Self.split(from)
            let toName = Self.split(to).1
            guard let inode = directories[directory]?.cache[fromName] else { throw StoreCallError("rename", from, ENOENT) }
            directories[directory]!.cache[fromName] = nil
            directories[directory]!.cache[toName] = inode
            directories[directory]!.pending.append(.rename(fromName, to: toName))
            changed()
        }
    }

    func remove(_ path: String) throws(StoreCallError) {
        try lock.withLock { () throws(StoreCallError) in
            let (directory, name) = Self.split(path)
            guard directories[directory]?.cache[name] != nil else { return }
            try call("unlink", path)
            directories[directory]!.cache[name] = nil
            directories[directory]!.pending.append(.unlink(name))
            changed()
        }
    }

    func syncDirectory(of path: String) throws(StoreCallError) {
        try lock.withLock { () throws(StoreCallError) in
            let directory = Self.split(path).0
            try call("fsync", directory)
            directories[directory, default: Directory()].disk = directories[directory]!.cache
            directories[directory]!.pending = []
            changed()
        }
    }

    func freeSpace(at path: String) -> Int? {
        lock.withLock { capacity.map { $0 - used } }
    }

    /// What the store's lock file says (its holder: the boot and durability that wrote last; an
    /// image's disk starts without one — set it to carry the lock file over).
    private var holder: [UInt8] = []
    var lockHolder: [UInt8] {
        get { lock.withLock { holder } }
        set { lock.withLock { holder = newValue } }
    }

    func lock(_ directory: String, name: String) throws(FileError) -> (handle: any StoreLockHandle, previous: [UInt8]) {
        (HolderLock(disk: self), lock.withLock { holder })
    }

    struct HolderLock: StoreLockHandle {
        let disk: SimulatedDisk
        func unlock() {}
        func rewrite(_ holder: [UInt8]) -> Bool {
            disk.lock.withLock { disk.holder = holder }
            return true
        }
    }

    // MARK: Files

    /// Bytes of the files the directories name or a process holds open (a file renamed over or
    /// removed frees its room once it is closed, as on a real disk). Under the lock.
    private var used: Int {
        Set(directories.values.flatMap { $0.cache.values }).union(openFiles.values)
            .reduce(0) { $0 + (inodes[$1]?.cache.count ?? 0) }
    }

    /// What takes room: each named file and each open one, by inode (for a failure's message).
    var roomReport: String {
        lock.withLock {
            let named = directories.flatMap { dir, d in d.cache.map { "\($1):\(dir)/\($0)=\(inodes[$1]?.cache.count ?? 0)" } }
            let open = openFiles.values.map { "open \($0)=\(inodes[$0]?.cache.count ?? 0)" }
            return (named + open).sorted().joined(separator: " ")
        }
    }

    /// Under the lock.
    private func opened(_ file: SimulatedFile) -> SimulatedFile {
        openFiles[ObjectIdentifier(file)] = file.inode
        return file
    }

    fileprivate func closed(_ file: SimulatedFile) { lock.withLock { openFiles[ObjectIdentifier(file)] = nil } }

    fileprivate func size(_ inode: Int) -> Int { lock.withLock { inodes[inode]?.cache.count ?? 0 } }

    fileprivate func read(_ inode: Int, at offset: Int, count: Int) -> [UInt8] {
        lock.withLock {
            let bytes = inodes[inode]?.cache ?? []
            guard offset < bytes.count else { return [] }
            return Array(bytes[offset..<min(bytes.count, offset + count)])
        }
    }

    fileprivate func write(_ inode: Int, _ path: String, _ bytes: [UInt8], at offset: Int) throws(StoreCallError) {
        try lock.withLock { () throws(StoreCallError) in
            try call("pwrite", path)
            if let capacity {
                let growth = max(0, offset + bytes.count - (inodes[inode]?.cache.count ?? 0))
                if used + growth > capacity { throw StoreCallError("pwrite", path, ENOSPC) }
            }
            Self.apply(.write(offset: offset, bytes: bytes), to: &inodes[inode]!.cache)
            inodes[inode]!.pending.append(.write(offset: offset, bytes: bytes))
            changed()
        }
    }

    fileprivate func truncate(_ inode: Int, _ path: String, to length: Int) throws(StoreCallError) {
        try lock.withLock { () throws(StoreCallError) in
            try call("ftruncate", path)
            Self.apply(.truncate(length), to: &inodes[inode]!.cache)
            inodes[inode]!.pending.append(.truncate(length))
            changed()
        }
    }

    fileprivate func sync(_ inode: Int, _ path: String) throws(StoreCallError) {
        try lock.withLock { () throws(StoreCallError) in
            try call("fdatasync", path)
            inodes[inode]!.disk = inodes[inode]!.cache
            inodes[inode]!.pending = []
            changed()
        }
    }

    static func apply(_ operation: Operation, to bytes: inout [UInt8]) {
        switch operation {
        case .write(let offset, let data):
            if bytes.count < offset + data.count { bytes += [UInt8](repeating: 0, count: offset + data.count - bytes.count) }
            bytes.replaceSubrange(offset..<offset + data.count, with: data)
        case .truncate(let length):
            if length < bytes.count { bytes.removeSubrange(length...) } else { bytes += [UInt8](repeating: 0, count: length - bytes.count) }
        }
    }
}

/// An open file of a ``SimulatedDisk``.
final class SimulatedFile: StoreFile, @unchecked Sendable {
    // @unchecked: immutable; the disk locks.
    let disk: SimulatedDisk
    let inode: Int
    let path: String

    init(disk: SimulatedDisk, inode: Int, path: String) {
        self.disk = disk
        self.inode = inode
        self.path = path
    }

    func size() throws(StoreCallError) -> Int { disk.size(inode) }
    func read(at offset: Int, count: Int) throws(StoreCallError) -> [UInt8] { disk.read(inode, at: offset, count: count) }
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StoreCallError) {
        try disk.write(inode, path, Array(bytes), at: offset)
    }
    func truncate(to length: Int) throws(StoreCallError) { try disk.truncate(inode, path, to: length) }
    func sync() throws(StoreCallError) { try disk.sync(inode, path) }
    func close() { disk.closed(self) }
}

extension SimulatedDisk.Image {
    /// One way a power loss may have left it, chosen by `choice` with `random`: a new disk holding
    /// exactly that (everything synced).
    enum Choice: CaseIterable, Sendable {
        /// Nothing unsynced reached the disk.
        case nothing
        /// Everything did (what a crash of the process alone leaves: the page cache survives).
        case everything
        /// The operations of each file up to a random point; of each directory too, independently.
        case prefix
        /// A prefix, then the next write torn at a random byte.
        case torn
        /// A prefix, then the next write's bytes left as zeros (allocated, never written).
        case zeros
        /// A random subset of each file's operations, in order (written back out of order).
        case subset
    }

    func materialize(_ choice: Choice, using random: inout some RandomNumberGenerator) -> SimulatedDisk {
        var files: [String: [UInt8]] = [:]
        var content: [Int: [UInt8]] = [:]
        // (In a fixed order — the random choices follow it — so that a seed replays in any process:
        // a dictionary's order changes with the process's hash seed.)
        for (number, inode) in inodes.sorted(by: { $0.key < $1.key }) {
            var bytes = inode.disk
            let pending = inode.pending
            switch choice {
            case .nothing: break
            case .everything: bytes = inode.cache
            case .prefix, .torn, .zeros:
                let count = pending.isEmpty ? 0 : Int.random(in: 0...pending.count, using: &random)
                for operation in pending[0..<count] { SimulatedDisk.apply(operation, to: &bytes) }
                if count < pending.count, case .write(let offset, let data) = pending[count], !data.isEmpty {
                    if choice == .torn {
                        let kept = Int.random(in: 0..<data.count, using: &random)
                        SimulatedDisk.apply(.write(offset: offset, bytes: Array(data[0..<kept])), to: &bytes)
                    } else if choice == .zeros {
                        SimulatedDisk.apply(.write(offset: offset, bytes: [UInt8](repeating: 0, count: data.count)), to: &bytes)
                    }
                }
            case .subset:
                for operation in pending where Bool.random(using: &random) { SimulatedDisk.apply(operation, to: &bytes) }
            }
            content[number] = bytes
        }
        for (path, directory) in directories.sorted(by: { $0.key < $1.key }) {
            var entries = directory.disk
            var count = 0
            switch choice {
            case .nothing: count = 0
            case .everything: count = directory.pending.count
            default: count = directory.pending.isEmpty ? 0 : Int.random(in: 0...directory.pending.count, using: &random)
            }
            for entry in directory.pending[0..<count] {
                switch entry {
                case .link(let name, let inode): entries[name] = inode
                case .unlink(let name): entries[name] = nil
                case .rename(let from, let to):
                    entries[to] = entries[from]
                    entries[from] = nil
                }
            }
            for (name, inode) in entries { files[(path as NSString).appendingPathComponent(name)] = content[inode] ?? [] }
        }
        return SimulatedDisk(files: files)
    }
}
