import Dispatch
import Glibc

/// Changes in directories a test waits on — files a server creates, writes, renames or removes —
/// as events, not polls: inotify on each directory and on every directory created in it since (a
/// server's hidden directory of partial transfers appears after the watch began). Each batch of
/// events signals `changes`; a wait (``waitUntil(_:timeout:wokenBy:_:)``) re-checks its condition
/// then.
package final class DirectoryWatch: @unchecked Sendable {  // immutable after init; the source is thread-safe
    package let changes = Observed<Int>()
    private let source: any DispatchSourceRead

    static let mask = UInt32(IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB)

    /// The watch descriptors' directories (touched on the watch's queue only, after init).
    private final class Watches: @unchecked Sendable {
        let notify: Int32
        var paths: [Int32: String] = [:]
        init(notify: Int32) { self.notify = notify }

        /// Watches `path` and the directories under it; false if `path` cannot be watched.
        @discardableResult
        func add(_ path: String) -> Bool {
            let descriptor = inotify_add_watch(notify, path, DirectoryWatch.mask)
            guard descriptor >= 0 else { return false }
            paths[descriptor] = path
            guard let directory = opendir(path) else { return true }
            defer { closedir(directory) }
            while let entry = readdir(directory) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                if entry.pointee.d_type == UInt8(DT_DIR), name != ".", name != ".." { add(path + "/" + name) }
            }
            return true
        }

        /// Reads what is queued; watches the directories created since.
        func drain() {
            var buffer = [UInt8](repeating: 0, count: 8_192)
            while true {
                let count = read(notify, &buffer, buffer.count)
                guard count > 0 else { return }
                var offset = 0
                while offset + 16 <= count {
                    let (descriptor, mask, length) = buffer.withUnsafeBytes { bytes in
                        (
                            bytes.loadUnaligned(fromByteOffset: offset, as: Int32.self),
                            bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self),
                            Int(bytes.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                        )
                    }
                    if mask & UInt32(IN_CREATE | IN_MOVED_TO) != 0, mask & UInt32(IN_ISDIR) != 0, let parent = paths[descriptor] {
                        let name = String(decoding: buffer[(offset + 16)..<(offset + 16 + length)].prefix { $0 != 0 }, as: UTF8.self)
                        add(parent + "/" + name)
                    }
                    offset += 16 + length
                }
            }
        }
    }

    /// Watches `directories` (each must exist) and what is created in them.
    package init(_ directories: [String]) throws {
        let notify = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard notify >= 0 else {
            throw ChildWatchError(description: "cannot watch directories (inotify): \(String(cString: strerror(errno)))")
        }
        let watches = Watches(notify: notify)
        for directory in directories where !watches.add(directory) {
            let reason = String(cString: strerror(errno))
            close(notify)
            throw ChildWatchError(description: "cannot watch \(directory) (inotify): \(reason)")
        }
        let changes = changes
        source = DispatchSource.makeReadSource(fileDescriptor: notify, queue: DispatchQueue(label: "itest.directory-watch"))
        source.setEventHandler {
            watches.drain()
            changes.signal()
        }
        source.setCancelHandler { close(notify) }
        source.resume()
    }

    deinit { source.cancel() }
}
