import Dispatch
import Glibc

/// `--watch`: the saves of one file, told by inotify on its folder — an editor saves by writing
/// in place (IN_CLOSE_WRITE) or by renaming a new file over the old one (IN_MOVED_TO, IN_CREATE) —
/// and the end of the watch on SIGINT or SIGTERM. Events of one save come in a burst; a save is
/// reported once the file has been quiet for `settle`. Driven by Dispatch sources on one queue: no
/// thread, no polling.
///
/// `@unchecked Sendable`: every stored property is a constant; the sources are Dispatch's
/// (thread-safe) and are only configured in `init`.
final class FileWatcher: @unchecked Sendable {
    /// One element per save (after the settle time); finishes on SIGINT or SIGTERM.
    let saves: AsyncStream<Void>
    private let continuation: AsyncStream<Void>.Continuation
    private let queue = DispatchQueue(label: "preview-push.watch")
    private let fd: Int32
    private let reader: any DispatchSourceRead
    private let settle: any DispatchSourceTimer
    private let signals: [any DispatchSourceSignal]

    struct WatchError: Error, CustomStringConvertible {
        let description: String
    }

    init(path: String, settle delay: DispatchTimeInterval = .milliseconds(100)) throws {
        let slash = path.lastIndex(of: "/")
        let folder = slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        let name = slash.map { String(path[path.index(after: $0)...]) } ?? path
        fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { throw WatchError(description: "inotify_init1: \(String(cString: strerror(errno)))") }
        let mask = UInt32(IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE)
        guard inotify_add_watch(fd, folder, mask) >= 0 else {
            let why = String(cString: strerror(errno))
            close(fd)
            throw WatchError(description: "cannot watch \(folder): \(why)")
        }
        (saves, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let (fd, continuation) = (self.fd, self.continuation)
        settle = DispatchSource.makeTimerSource(queue: queue)
        settle.setEventHandler { continuation.yield() }
        settle.schedule(deadline: .distantFuture)
        settle.activate()
        reader = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        let settle = self.settle
        reader.setEventHandler {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = read(fd, &buffer, buffer.count)
                guard count > 0 else { break }
                if Self.names(in: buffer[..<count]).contains(name) { settle.schedule(deadline: .now() + delay) }
            }
        }
        reader.setCancelHandler { close(fd) }
        reader.activate()
        var signals: [any DispatchSourceSignal] = []
        for number in [SIGINT, SIGTERM] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler { continuation.finish() }
            source.activate()
            signals.append(source)
        }
        self.signals = signals
    }

    /// The names in a buffer of `struct inotify_event`s (wd, mask, cookie, len, then `len` bytes of
    /// NUL-padded name).
    static func names(in bytes: ArraySlice<UInt8>) -> [String] {
        var names: [String] = []
        var offset = bytes.startIndex
        while offset + 16 <= bytes.endIndex {
            let length = Int(bytes[offset + 12]) | Int(bytes[offset + 13]) << 8 | Int(bytes[offset + 14]) << 16
                | Int(bytes[offset + 15]) << 24
            let start = offset + 16
            let end = min(start + length, bytes.endIndex)
            let raw = bytes[start..<end].prefix { $0 != 0 }
            names.append(String(decoding: raw, as: UTF8.self))
            offset = end
        }
        return names
    }

    /// Stops watching (also ends ``saves``).
    func stop() {
        continuation.finish()
        reader.cancel()
        settle.cancel()
        for source in signals { source.cancel() }
    }
}
