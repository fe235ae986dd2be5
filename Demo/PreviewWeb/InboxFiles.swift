import Foundation
import Hummingbird
import Locks
import NIOCore
import NIOPosix

/// `/files/`'s files for Hummingbird's FileMiddleware (which keeps `ETag`, `Range`,
/// `If-None-Match` and `HEAD`): each file opened **once**, without following a symbolic link and
/// without blocking on a FIFO (`O_NOFOLLOW | O_NONBLOCK`), checked with `fstat` to be a regular
/// file, and served from that descriptor — what was checked is what is sent: a name swapped for a
/// link between a check and an open cannot send another file (the middleware's own provider opens
/// by name, after our `lstat` had checked it). The open, the `fstat` and every read run on NIO's
/// thread pool, never on Swift's cooperative threads (two on this machine).
struct InboxFiles: FileProvider {
    struct FileAttributes: FileMiddlewareFileAttributes, Sendable {
        let isFolder: Bool
        let size: Int
        let modificationDate: Date
    }

    /// One request's file: its path, then the descriptor opened for it (closed with it).
    final class FileIdentifier: Sendable {
        let path: String
        private let opened = Locked<(descriptor: Int32, size: Int)?>(nil)

        init(path: String) { self.path = path }

        deinit {
            if let (descriptor, _) = opened.withLock({ $0 }) { close(descriptor) }
        }

        func adopt(_ descriptor: Int32, size: Int) { opened.withLock { $0 = (descriptor, size) } }
        var file: (descriptor: Int32, size: Int)? { opened.withLock { $0 } }
    }

    /// Bytes read per step (one thread-pool job each).
    static let chunk = 64 << 10

    let directory: String
    let threadPool: NIOThreadPool

    init(directory: String, threadPool: NIOThreadPool = .singleton) {
        self.directory = directory
        self.threadPool = threadPool
    }

    /// `path`: `/NAME` (percent-decoded, the base path removed by the middleware). Only a name
    /// the inbox lists (``PreviewInbox/isListed(_:)``); ``InboxGuard`` said why before.
    func getFileIdentifier(_ path: String) -> FileIdentifier? {
        let name = String(path.dropFirst())
        guard path.first == "/", PreviewInbox.isListed(name) else { return nil }
        return FileIdentifier(path: directory + "/" + name)
    }

    /// Opens the file (nil: none, or not a regular file: a 404).
    func getAttributes(id: FileIdentifier) async throws -> FileAttributes? {
        try await threadPool.runIfActive { () -> FileAttributes? in
            let descriptor = open(id.path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            guard descriptor >= 0 else { return nil }
            var info = stat()
            guard fstat(descriptor, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
                close(descriptor)
                return nil
            }
            id.adopt(descriptor, size: Int(info.st_size))
            let modified = Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
            return FileAttributes(isFolder: false, size: Int(info.st_size), modificationDate: Date(timeIntervalSince1970: modified))
        }
    }

    func loadFile(id: FileIdentifier, context: some RequestContext) async throws -> ResponseBody { try body(id, range: nil) }

    func loadFile(id: FileIdentifier, range: ClosedRange<Int>, context: some RequestContext) async throws -> ResponseBody {
        try body(id, range: range)
    }

    /// The opened file's bytes (all of them as `fstat` saw it, or `range`).
    func body(_ id: FileIdentifier, range: ClosedRange<Int>?) throws -> ResponseBody {
        guard let file = id.file else { throw HTTPError(.notFound) }
        guard let range else { return body(id, from: 0, to: file.size) }
        return body(id, from: range.lowerBound, to: min(range.upperBound + 1, file.size))
    }

    /// The bytes `start..<end` of the opened file, read on the thread pool in ``chunk``s. A file
    /// cut shorter meanwhile ends the response early (the client sees fewer bytes than its
    /// `Content-Length`), never sends other bytes.
    private func body(_ id: FileIdentifier, from start: Int, to end: Int) -> ResponseBody {
        let threadPool = threadPool
        return ResponseBody(contentLength: max(0, end - start)) { writer in
            guard let (descriptor, _) = id.file else { throw HTTPError(.notFound) }
            var offset = start
            while offset < end {
                let count = min(Self.chunk, end - offset)
                let at = offset
                let buffer = try await threadPool.runIfActive { () throws -> ByteBuffer in
                    var buffer = ByteBufferAllocator().buffer(capacity: count)
                    let read = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { raw in
                        max(0, pread(descriptor, raw.baseAddress, count, off_t(at)))
                    }
                    guard read > 0 else { throw HTTPError(.internalServerError, message: "the file was cut while it was sent") }
                    return buffer
                }
                offset += buffer.readableBytes
                try await writer.write(buffer)
            }
            withExtendedLifetime(id) {}
            try await writer.finish(nil)
        }
    }
}
