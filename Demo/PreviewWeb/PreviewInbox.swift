import Dispatch
import Foundation
import PreviewKit
import Locks

/// What the web page shows: the files in the inbox directory, newest first, read from the
/// directory at each request (a file deleted by hand is gone from the page, one copied in by hand
/// is listed), with the pusher and time of those pushed (remembered while the file is there, at
/// most ``maxRemembered``, across restarts when it keeps a record file); and the pages watching for new pushes
/// (Server-Sent Events), told of each stored file at once.
package final class PreviewInbox: Sendable {
    /// One file as the page lists it (JSON).
    package struct Entry: Codable, Sendable, Equatable {
        /// The stored name (what `/files/` and `/render/` take, percent-encoded).
        let name: String
        /// The name as shown: control and bidirectional formatting characters visible as `\u{…}`
        /// escapes (``FileName/printable(_:limit:)``), never interpreted. The page shows it as text.
        let display: String
        let size: UInt64
        /// How the page shows it: image, pdf, text, markdown, html or other.
        let kind: PreviewKind
        /// Its media type (also what `/files/` serves it as).
        let type: String
        /// Who pushed it: the client's name (escaped like `display`) and its key's short form; nil
        /// for a file that was in the directory before the server started.
        let pusher: String?
        let pusherKey: String?
        /// When it was stored (milliseconds since 1970; the file's modification time for one that
        /// was there before).
        let time: Int64
    }

    /// What a watching page is told.
    enum Update: Sendable {
        case stored(Entry)
        /// Nothing new: a comment line that finds pages gone away (every ``pingInterval``).
        case ping
    }

    let directory: String
    /// Said to a watching page every so often when nothing else is: a write to a page that went
    /// away fails, and its watch ends (instead of waiting for the next push).
    static let pingInterval: DispatchTimeInterval = .seconds(20)

    private struct Pushed: Sendable, Codable {
        let pusher: String?, pusherKey: String?, time: Int64
    }
    /// One line of the record file: a push.
    private struct RecordLine: Codable {
        let name: String
        let pushed: Pushed
    }
    /// Where who pushed what is kept across restarts (nil: in memory only): one JSON line per
    /// push, appended; rewritten with only what is remembered when it opens and when it holds
    /// twice ``maxRemembered`` lines. In the server's own folder, not the inbox, where a push could
    /// take its name. Not synced: it only says who pushed a file, so a power cut may cost its last
    /// lines (a torn or zero-filled line is skipped) or, after a rewrite whose data had not reached
    /// the disk, all of it — those files then show as found in the folder; no push is lost.
    let recordPath: String?
    private struct State {
        var pushed: [String: Pushed] = [:]
        /// Lines in the record file.
        var recordLines = 0
        var watchers: [UInt64: AsyncStream<Update>.Continuation] = [:]
        var lastWatcher: UInt64 = 0
        var finished = false
        var timer: (any DispatchSourceTimer)?
    }
    private let state = Locked(State())

    package init(directory: String, record: String? = nil) {
        self.directory = directory
        recordPath = record
        if let record {
            let remembered = Self.readRecord(record, directory: directory)
            state.withLock { state in
                state.pushed = remembered
                state.recordLines = remembered.count
            }
            Self.rewriteRecord(record, remembered)
        }
        state.withLock { state in
            let timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "preview-server.web.ping"))
            timer.schedule(deadline: .now() + Self.pingInterval, repeating: Self.pingInterval, leeway: .seconds(1))
            timer.setEventHandler { [weak self] in self?.tell(.ping) }
            timer.resume()
            state.timer = timer
        }
    }

    deinit { state.withLock { $0.timer?.cancel() } }

    /// A file was stored: remembered with its pusher and told to every watching page.
    @discardableResult
    package func stored(_ file: StoredFile, at time: Date = Date()) -> Entry {
        let milliseconds = Int64(time.timeIntervalSince1970 * 1000)
        let pushed = Pushed(
            pusher: file.pusher.map { FileName.printable($0.name, limit: 64) }, pusherKey: file.pusher?.key,
            time: milliseconds)
        let rewrite: [String: Pushed]? = state.withLock { state in
            state.pushed[file.name] = pushed
            if state.pushed.count > Self.maxRemembered {
                // The oldest tenth forgotten at once (a scan per 1,000 pushes, not per push).
                let kept = state.pushed.sorted { $0.value.time > $1.value.time }.prefix(Self.maxRemembered * 9 / 10)
                state.pushed = Dictionary(uniqueKeysWithValues: kept.map { ($0.key, $0.value) })
            }
            state.recordLines += 1
            guard state.recordLines > 2 * Self.maxRemembered else { return nil }
            state.recordLines = state.pushed.count
            return state.pushed
        }
        if let recordPath {
            if let rewrite {
                Self.rewriteRecord(recordPath, rewrite)
            } else {
                Self.appendRecord(recordPath, RecordLine(name: file.name, pushed: pushed))
            }
        }
        let entry = Self.entry(name: file.name, size: file.size, pushed: pushed)
        tell(.stored(entry))
        return entry
    }

    /// The files in the directory now, newest first. Left out: the server's temporary files, its
    /// folder of interrupted pushes, and anything that is not a regular file (a symbolic link, a
    /// folder).
    func list() -> [Entry] {
        let started = Int64(Date().timeIntervalSince1970 * 1000)
        let pushed = state.withLock { $0.pushed }
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        // Who pushed a file that is gone is forgotten (not one stored since the folder was read).
        let present = Set(names)
        let gone = pushed.filter { !present.contains($0.key) && $0.value.time < started }.map(\.key)
        if !gone.isEmpty {
            state.withLock { state in
                for name in gone where state.pushed[name].map({ $0.time < started }) == true { state.pushed[name] = nil }
            }
        }
        var entries: [Entry] = []
        entries.reserveCapacity(names.count)
        for name in names where Self.isListed(name) {
            var info = stat()
            guard lstat(directory + "/" + name, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { continue }
            let modified = Int64(info.st_mtim.tv_sec) * 1000 + Int64(info.st_mtim.tv_nsec) / 1_000_000
            entries.append(
                Self.entry(
                    name: name, size: UInt64(info.st_size),
                    pushed: pushed[name] ?? Pushed(pusher: nil, pusherKey: nil, time: modified)))
        }
        return entries.sorted { ($0.time, $0.name) > ($1.time, $1.name) }
    }

    /// Whether a directory entry may be listed and served: one plain path component, not one of
    /// the server's temporary files or its folder of interrupted pushes. (Not the pushed names'
    /// rules: a file copied in by hand with a bidirectional control in its name is listed, and
    /// shown escaped.)
    static func isListed(_ name: String) -> Bool {
        !name.isEmpty && name != "." && name != ".." && !name.contains("/") && !name.utf8.contains(0)
            && name != ".lanmsg-partial" && !FileName.isTempFile(name)
    }

    private static func entry(name: String, size: UInt64, pushed: Pushed) -> Entry {
        let (kind, type) = PreviewKind.of(name)
        return Entry(
            name: name, display: FileName.printable(name, limit: 300), size: size, kind: kind, type: type,
            pusher: pushed.pusher, pusherKey: pushed.pusherKey, time: pushed.time)
    }

    /// The updates for one page, until it goes away or the server stops (``finish()``).
    func watch() -> AsyncStream<Update> {
        let (stream, continuation) = AsyncStream.makeStream(of: Update.self, bufferingPolicy: .bufferingNewest(256))
        let id: UInt64? = state.withLock { state in
            guard !state.finished else { return nil }
            state.lastWatcher += 1
            state.watchers[state.lastWatcher] = continuation
            return state.lastWatcher
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.watchers.removeValue(forKey: id) }
        }
        return stream
    }

    // MARK: The record file

    /// What the record at `path` remembers of files still in `directory` (the latest line of each
    /// name; a torn last line, left by a crash mid-append, is skipped), the newest
    /// ``maxRemembered``.
    private static func readRecord(_ path: String, directory: String) -> [String: Pushed] {
        guard let data = FileManager.default.contents(atPath: path) else { return [:] }
        let present = Set((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
        var pushed: [String: Pushed] = [:]
        let decoder = JSONDecoder()
        for line in data.split(separator: UInt8(ascii: "\n")) {
            guard let record = try? decoder.decode(RecordLine.self, from: Data(line)), present.contains(record.name) else { continue }
            if pushed[record.name].map({ $0.time <= record.pushed.time }) ?? true { pushed[record.name] = record.pushed }
        }
        guard pushed.count > maxRemembered else { return pushed }
        return Dictionary(uniqueKeysWithValues: pushed.sorted { $0.value.time > $1.value.time }.prefix(maxRemembered).map { ($0.key, $0.value) })
    }

    /// Replaces the record with `pushed` (a new file renamed over it: a crash leaves the old one or
    /// the new one whole).
    private static func rewriteRecord(_ path: String, _ pushed: [String: Pushed]) {
        let encoder = JSONEncoder()
        var data = Data()
        for (name, entry) in pushed.sorted(by: { $0.value.time < $1.value.time }) {
            guard let line = try? encoder.encode(RecordLine(name: name, pushed: entry)) else { continue }
            data.append(line)
            data.append(UInt8(ascii: "\n"))
        }
        let temporary = path + ".new"
        guard FileManager.default.createFile(atPath: temporary, contents: data, attributes: [.posixPermissions: 0o600]) else { return }
        if rename(temporary, path) != 0 { unlink(temporary) }
    }

    /// Appends one push to the record.
    private static func appendRecord(_ path: String, _ record: RecordLine) {
        guard var line = try? JSONEncoder().encode(record) else { return }
        line.append(UInt8(ascii: "\n"))
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        defer { close(fd) }
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    }

    /// Pages watching now.
    var watcherCount: Int { state.withLock { $0.watchers.count } }

    /// Pushes remembered now (their pusher shown): the files still in the folder that were pushed
    /// since the server started, at most ``maxRemembered``.
    var rememberedCount: Int { state.withLock { $0.pushed.count } }
    /// The most pushes remembered: beyond it the oldest tenth is forgotten (their files then show
    /// as found in the folder).
    static let maxRemembered = 10_000

    /// The server stops: every watch ends (their responses finish, so the HTTP server's graceful
    /// shutdown does not wait on them), and no new one starts.
    package func finish() {
        let watchers = state.withLock { state in
            state.finished = true
            state.timer?.cancel()
            state.timer = nil
            defer { state.watchers = [:] }
            return Array(state.watchers.values)
        }
        for watcher in watchers { watcher.finish() }
    }

    private func tell(_ update: Update) {
        let watchers = state.withLock { Array($0.watchers.values) }
        for watcher in watchers { watcher.yield(update) }
    }

    /// A regular file of the inbox opened without following a symbolic link; nil otherwise. (Not
    /// blocking on a FIFO someone made in the folder: opened nonblocking, and refused by `fstat`.)
    static func openRegularFile(_ path: String) -> FileHandle? {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            close(fd)
            return nil
        }
        return FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    }
}
