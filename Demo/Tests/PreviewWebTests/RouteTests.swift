import Foundation
import Hummingbird
import Logging
import NIOCore
import DemoTestWaits
import Testing

@testable import PreviewKit
@testable import PreviewWeb

#if canImport(Glibc)
    import Glibc
#endif

/// The page's routes in process (issue 56, 3): the real router and Hummingbird server on
/// loopback, asked over a plain socket — every guard of `/files/`, `/render/` and `/api/files`
/// (traversal, links, folders, FIFOs, temporary files, methods, ranges, headers). What only a
/// browser shows stays in the Chromium tests (PreviewIntegrationTests).
@Suite(.serialized) struct RouteTests {
    /// An inbox folder with a file, a link out of it, a folder, a FIFO and a temporary file.
    final class Inbox {
        let directory: String
        let secret: String

        init() throws {
            directory = NSTemporaryDirectory() + "preview-web-\(UInt64.random(in: 0...UInt64.max))"
            secret = directory + "-secret"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try Data("the secret".utf8).write(to: URL(fileURLWithPath: secret))
            try Data("0123456789abcdef".utf8).write(to: URL(fileURLWithPath: directory + "/a.txt"))
            try Data("# Title\n".utf8).write(to: URL(fileURLWithPath: directory + "/notes.md"))
            try FileManager.default.createSymbolicLink(atPath: directory + "/link.txt", withDestinationPath: secret)
            try FileManager.default.createDirectory(atPath: directory + "/folder.txt", withIntermediateDirectories: false)
            #expect(mkfifo(directory + "/pipe.txt", 0o600) == 0)
            #expect(mkfifo(directory + "/pipe.md", 0o600) == 0)
            try Data("half".utf8).write(to: URL(fileURLWithPath: directory + "/\(FileName.tempPrefix)x\(FileName.tempSuffix)"))
        }

        deinit {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: secret)
        }
    }

    /// The page's server on 127.0.0.1 (a port the kernel picks) while `body` runs.
    static func withServer(_ inbox: Inbox, token: String? = nil, _ body: (UInt16) async throws -> Void) async throws {
        let logger = Logger(label: "preview-web-tests") { _ in SwiftLogNoOpLogHandler() }
        let web = PreviewWeb(inbox: PreviewInbox(directory: inbox.directory), name: "Test", allowScripts: false, registry: nil, logger: logger)
        let (ports, port) = AsyncStream.makeStream(of: Int.self)
        let service = WebService.make(router: web.router(), address: "127.0.0.1", port: 0, logger: logger, inbox: nil, token: token) { port.yield($0) }
        let server = Task { try await service.run() }
        defer { server.cancel() }
        var iterator = ports.makeAsyncIterator()
        guard let listening = await iterator.next(), listening > 0 else {
            Issue.record("the server did not start")
            return
        }
        try await body(UInt16(listening))
        server.cancel()
        _ = await server.result
    }

    struct Answer {
        let status: Int
        let headers: [String: String]
        let body: [UInt8]
        var text: String { String(decoding: body, as: UTF8.self) }
    }

    /// One HTTP/1.1 request over a new connection (on a thread of its own: the socket blocks, up to
    /// 10 s), the whole answer read until the server closes.
    static func ask(_ port: UInt16, _ method: String = "GET", _ path: String, headers: [String: String] = [:]) async throws -> Answer {
        let raw = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8], any Error>) in
            let thread = Thread {
                continuation.resume(with: Result { try exchange(port, method, path, headers) })
            }
            thread.start()
        }
        guard let end = raw.indices.first(where: { raw[$0...].starts(with: Array("\r\n\r\n".utf8)) }) else {
            throw TestFailure("no HTTP answer: \(String(decoding: raw, as: UTF8.self))")
        }
        let head = String(decoding: raw[..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let status = Int(head[0].split(separator: " ")[1]) ?? 0
        var fields: [String: String] = [:]
        for line in head.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            fields[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return Answer(status: status, headers: fields, body: Array(raw[(end + 4)...]))
    }

    struct TestFailure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    private static func exchange(_ port: UInt16, _ method: String, _ path: String, _ headers: [String: String]) throws -> [UInt8] {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket: \(errno)") }
        defer { close(fd) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw TestFailure("connect: \(errno)") }
        var request = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        for (name, value) in headers { request += "\(name): \(value)\r\n" }
        let bytes = Array((request + "\r\n").utf8)
        guard send(fd, bytes, bytes.count, 0) == bytes.count else { throw TestFailure("send: \(errno)") }
        var answer: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count == 0 { break }
            guard count > 0 else { throw TestFailure("no answer within 10 s (errno \(errno)) to \(method) \(path); had: \(answer.count) bytes") }
            answer += buffer[0..<count]
        }
        return answer
    }

    @Test func aFileIsServedWithItsHeadersRangesAndValidators() async throws {
        let inbox = try Inbox()
        try await Self.withServer(inbox) { port in
            let whole = try await Self.ask(port, "GET", "/files/a.txt")
            #expect(whole.status == 200 && whole.text == "0123456789abcdef")
            #expect(whole.headers["x-content-type-options"] == "nosniff")
            #expect(whole.headers["content-security-policy"]?.hasPrefix("sandbox;") == true, "\(whole.headers)")
            #expect(whole.headers["content-type"]?.hasPrefix("text/plain") == true, "\(whole.headers)")
            let etag = try #require(whole.headers["etag"])
            let part = try await Self.ask(port, "GET", "/files/a.txt", headers: ["Range": "bytes=2-5"])
            #expect(part.status == 206 && part.text == "2345" && part.headers["content-range"] == "bytes 2-5/16", "\(part.headers)")
            let unchanged = try await Self.ask(port, "GET", "/files/a.txt", headers: ["If-None-Match": etag])
            #expect(unchanged.status == 304 && unchanged.body.isEmpty)
            let head = try await Self.ask(port, "HEAD", "/files/a.txt")
            #expect(head.status == 200 && head.headers["content-length"] == "16" && head.body.isEmpty)
        }
    }

    /// Issue 56, 2: beyond loopback the page answers only under `/t/TOKEN/` — no token is 401,
    /// another token (even one differing in its last digit) 403, each with a page saying where the
    /// link comes from; under the token every route works as at `/` (the page's URLs are
    /// relative), and its guards still hold.
    @Test func withATokenOnlyItsLinkOpensThePage() async throws {
        let inbox = try Inbox()
        let token = "0123456789abcdef0123456789abcdef"
        try await Self.withServer(inbox, token: token) { port in
            for path in ["/", "/files/a.txt", "/api/files", "/app.js", "/events", "/x/\(token)/"] {
                let answer = try await Self.ask(port, "GET", path)
                #expect(answer.status == 401, "\(path): \(answer.status)")
                #expect(answer.text.contains("needs its link") && !answer.text.contains("0123456789ab"), "\(path): \(answer.text)")
            }
            for wrong in ["0123456789abcdef0123456789abcdee", "0123456789abcdef", token + "0", ""] {
                let answer = try await Self.ask(port, "GET", "/t/\(wrong)/files/a.txt")
                #expect(answer.status == 403 && answer.text.contains("not this previewer's"), "\(wrong): \(answer.status) \(answer.text)")
                #expect(answer.headers["x-content-type-options"] == "nosniff")
            }
            let page = try await Self.ask(port, "GET", "/t/\(token)/")
            #expect(page.status == 200 && page.text.contains("src=\"app.js\""), "\(page.status)")
            let file = try await Self.ask(port, "GET", "/t/\(token)/files/a.txt")
            #expect(file.status == 200 && file.text == "0123456789abcdef", "\(file.status) \(file.text)")
            #expect(file.headers["content-security-policy"]?.hasPrefix("sandbox;") == true, "\(file.headers)")
            let listing = try await Self.ask(port, "GET", "/t/\(token)/api/files?x=1")
            #expect(listing.status == 200 && listing.text.contains("a.txt"), "\(listing.status)")
            let bare = try await Self.ask(port, "GET", "/t/\(token)")
            #expect(bare.status == 308 && bare.headers["location"] == "/t/\(token)/", "\(bare.status) \(bare.headers)")
            let escape = try await Self.ask(port, "GET", "/t/\(token)/files/..%2F" + (inbox.secret as NSString).lastPathComponent)
            #expect(escape.status == 400 && !escape.text.contains("the secret"), "\(escape.status) \(escape.text)")
        }
        // Without a token (loopback) the page is open as before.
        try await Self.withServer(inbox) { port in
            let open = try await Self.ask(port, "GET", "/files/a.txt")
            #expect(open.status == 200)
        }
    }

    /// The token file: made once (0600, 32 hex digits), the same token after a restart, a damaged
    /// file refused with what to do.
    @Test func thePageTokenIsKeptInAFileOfItsOwn() throws {
        let path = NSTemporaryDirectory() + "page-token-\(UInt64.random(in: 0...UInt64.max))"
        defer { try? FileManager.default.removeItem(atPath: path) }
        let first = try PageToken.loadOrCreate(at: path)
        #expect(first.count == 32 && first.allSatisfy(\.isHexDigit))
        #expect(try PageToken.loadOrCreate(at: path) == first)
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int)
        #expect(mode == 0o600)
        try Data("short\n".utf8).write(to: URL(fileURLWithPath: path))
        #expect(throws: PreviewFailure.self) { try PageToken.loadOrCreate(at: path) }
    }

    /// Names outside the inbox, the server's own files and other methods are refused with why.
    @Test func namesOutsideTheInboxAndOtherMethodsAreRefused() async throws {
        let inbox = try Inbox()
        try await Self.withServer(inbox) { port in
            for path in [
                "/files/..%2F" + (inbox.secret as NSString).lastPathComponent, "/files/%2e%2e/etc/passwd", "/files/a%2Fb",
                "/files/.lanmsg-partial", "/files/\(FileName.tempPrefix)x\(FileName.tempSuffix)", "/files/",
            ] {
                let answer = try await Self.ask(port, "GET", path)
                #expect(answer.status == 400 || answer.status == 404, "\(path): \(answer.status) \(answer.text)")
                #expect(!answer.text.contains("the secret") && !answer.text.contains("half"), "\(path) served")
            }
            let put = try await Self.ask(port, "DELETE", "/files/a.txt")
            #expect(put.status == 405 && put.text.contains("read-only"), "\(put.status) \(put.text)")
            #expect(FileManager.default.fileExists(atPath: inbox.directory + "/a.txt"))
        }
    }

    /// A link out of the inbox, a folder and a FIFO are no files of it: 404 at once — a FIFO
    /// opened for reading without O_NONBLOCK waits for a writer forever (`/render/` did).
    @Test func linksFoldersAndFIFOsAreRefusedAtOnce() async throws {
        let inbox = try Inbox()
        try await Self.withServer(inbox) { port in
            for path in ["/files/link.txt", "/files/folder.txt", "/files/pipe.txt", "/render/link.txt", "/render/pipe.md", "/render/folder.txt"] {
                let answer = try await Self.ask(port, "GET", path)
                #expect(answer.status == 404, "\(path): \(answer.status) \(answer.text)")
                #expect(!answer.text.contains("the secret"), "\(path) served the file the link names")
            }
            let rendered = try await Self.ask(port, "GET", "/render/notes.md")
            #expect(rendered.status == 200 && rendered.text.contains("<h1>Title</h1>"), "\(rendered.text)")
            let listing = try await Self.ask(port, "GET", "/api/files")
            let names = try JSONDecoder().decode(PreviewWeb.Listing.self, from: Data(listing.body)).files.map(\.name)
            #expect(Set(names) == ["a.txt", "notes.md"], "\(names)")
        }
    }

    /// What was opened is what is sent: a file replaced by a link to another after it was opened
    /// and checked still sends its own bytes (the middleware's own provider opened by name again
    /// after a check by name: a swap between them sent whatever the link named).
    @Test func theCheckedFileIsTheOneSentEvenWhenItsNameIsSwapped() async throws {
        let inbox = try Inbox()
        let files = InboxFiles(directory: inbox.directory)
        let id = try #require(files.getFileIdentifier("/a.txt"))
        let attributes = try #require(try await files.getAttributes(id: id))
        #expect(attributes.size == 16 && !attributes.isFolder)
        try FileManager.default.removeItem(atPath: inbox.directory + "/a.txt")
        try FileManager.default.createSymbolicLink(atPath: inbox.directory + "/a.txt", withDestinationPath: inbox.secret)
        final class Collected: @unchecked Sendable { var bytes: [UInt8] = [] }  // one writer at a time
        struct Writer: ResponseBodyWriter {
            let collected: Collected
            mutating func write(_ buffer: ByteBuffer) async throws { collected.bytes += buffer.readableBytesView }
            consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
        }
        let collected = Collected()
        try await files.body(id, range: nil).write(Writer(collected: collected))
        #expect(String(decoding: collected.bytes, as: UTF8.self) == "0123456789abcdef")
        let part = Collected()
        try await files.body(id, range: 10...15).write(Writer(collected: part))
        #expect(String(decoding: part.bytes, as: UTF8.self) == "abcdef")
        #expect(files.getFileIdentifier("/../x") == nil && files.getFileIdentifier("/a/b") == nil)
    }

    /// Who pushed a file is remembered while the file is there: a file deleted by hand takes its
    /// pusher with it at the next listing (the record grew for the life of the process).
    @Test func whoPushedAFileIsForgottenWithTheFile() throws {
        let inbox = try Inbox()
        let pushes = PreviewInbox(directory: inbox.directory)
        defer { pushes.finish() }
        for name in ["a.txt", "notes.md"] {
            var file = StoredFile(name: name, path: inbox.directory + "/" + name, sha256: "", size: 1)
            file.pusher = StoredFile.Pusher(name: "Ann", key: "abcd")
            pushes.stored(file, at: Date(timeIntervalSinceNow: -1))
        }
        #expect(pushes.rememberedCount == 2)
        #expect(pushes.list().first { $0.name == "a.txt" }?.pusher == "Ann")
        try FileManager.default.removeItem(atPath: inbox.directory + "/a.txt")
        #expect(pushes.list().map(\.name) == ["notes.md"])
        #expect(pushes.rememberedCount == 1)
    }

    /// Issue 56, 3: with a record file, who pushed a file survives a restart (the page said "in
    /// the folder" for every file after one); a file gone meanwhile is dropped from the record, a
    /// torn last line (a crash mid-append) is skipped, and the record is rewritten compact.
    @Test func whoPushedAFileSurvivesARestartWithARecord() throws {
        let inbox = try Inbox()
        let record = inbox.directory + "-pushed"
        defer { try? FileManager.default.removeItem(atPath: record) }
        let first = PreviewInbox(directory: inbox.directory, record: record)
        for (name, who) in [("a.txt", "Ann"), ("notes.md", "Bob"), ("a.txt", "Cy")] {
            var file = StoredFile(name: name, path: inbox.directory + "/" + name, sha256: "", size: 1)
            file.pusher = StoredFile.Pusher(name: who, key: "abcd")
            first.stored(file, at: Date(timeIntervalSinceNow: -1))
        }
        first.finish()
        let lines = try String(contentsOfFile: record, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 3, "one line per push: \(lines)")
        try FileManager.default.removeItem(atPath: inbox.directory + "/notes.md")
        let handle = try #require(FileHandle(forWritingAtPath: record))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data("{\"name\":\"a.t".utf8))  // torn
        try handle.close()
        let second = PreviewInbox(directory: inbox.directory, record: record)
        defer { second.finish() }
        #expect(second.list().first { $0.name == "a.txt" }?.pusher == "Cy", "the latest push of a name")
        #expect(second.rememberedCount == 1, "notes.md is gone, and so is its pusher")
        let compact = try String(contentsOfFile: record, encoding: .utf8).split(separator: "\n")
        #expect(compact.count == 1 && compact[0].contains("Cy"), "\(compact)")
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: record)[.posixPermissions] as? Int)
        #expect(mode == 0o600)
    }
}
