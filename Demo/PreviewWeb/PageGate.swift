import Foundation
import HTTPTypes
import Hummingbird
import PreviewKit

/// The page's secret beyond loopback (issue 56, 2): 128 random bits as 32 hex digits, kept in a
/// file of its own (mode 0600) so that links stay valid across restarts; delete the file for a
/// new one (every old link stops working).
package enum PageToken {
    /// The token in `path`, created (mode 0600) when there is none.
    package static func loadOrCreate(at path: String) throws(PreviewFailure) -> String {
        if let text = try? String(contentsOfFile: path, encoding: .utf8) {
            let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
            guard isWellFormed(token) else {
                throw PreviewFailure(
                    PreviewFailure.localFile, "the page token file '\(path)' does not hold 32 hex digits; delete it for a new token")
            }
            return token
        }
        var generator = SystemRandomNumberGenerator()
        let token = (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
        // Written whole under another name, synced, then renamed into place and the folder synced:
        // a crash or power cut leaves no token file or a whole one — never an empty one that
        // would stop the next start.
        let temporary = path + ".new"
        func failure(_ what: String) -> PreviewFailure {
            PreviewFailure(PreviewFailure.localFile, "cannot \(what) the page token file '\(path)': \(String(cString: strerror(errno)))")
        }
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure("create") }
        let bytes = Array((token + "\n").utf8)
        let written = write(fd, bytes, bytes.count) == bytes.count && fsync(fd) == 0
        close(fd)
        guard written else {
            unlink(temporary)
            throw failure("write")
        }
        guard rename(temporary, path) == 0 else {
            unlink(temporary)
            throw failure("rename into place")
        }
        let folder = open((path as NSString).deletingLastPathComponent.isEmpty ? "." : (path as NSString).deletingLastPathComponent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder >= 0 {
            fsync(folder)
            close(folder)
        }
        return token
    }

    static func isWellFormed(_ token: String) -> Bool {
        token.utf8.count == 32 && token.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }
    }
}

/// In front of the page's router when it listens beyond loopback: only a request whose path
/// starts with `/t/TOKEN/` gets through (the prefix removed: the page's own URLs are relative, so
/// everything it loads carries it). No token is 401, another token 403 — each with a page saying
/// where the link comes from. A path, not a cookie: the pushed documents the page shows run in
/// sandboxed frames (an opaque origin), whose requests carry no cookie of the page.
package struct PageGate<Inner: HTTPResponder>: HTTPResponder {
    package typealias Context = Inner.Context
    let inner: Inner
    /// nil: open (loopback).
    let token: [UInt8]?

    package init(_ inner: Inner, token: String?) {
        self.inner = inner
        self.token = token.map { Array($0.utf8) }
    }

    package func respond(to request: Request, context: Context) async throws -> Response {
        guard let token else { return try await inner.respond(to: request, context: context) }
        let target = request.head.path ?? "/"
        guard target.hasPrefix("/t/") else {
            return Self.refusal(
                .unauthorized, "This previewer's page needs its link",
                "The link with its token is printed by preview-server when it starts, and by preview-push after a push to "
                    + "this previewer (only a pusher the previewer accepts gets it). Open that link.")
        }
        let rest = target.dropFirst(3)
        let given = rest.prefix { $0 != "/" && $0 != "?" }
        guard Self.equalInConstantTime(Array(given.utf8), token) else {
            return Self.refusal(
                .forbidden, "This link's token is not this previewer's",
                "The token may have been replaced (its file deleted on the previewer). Ask for the current link: "
                    + "preview-server prints it when it starts, preview-push after a push.")
        }
        let remainder = rest.dropFirst(given.count)
        guard remainder.hasPrefix("/") else {
            // `/t/TOKEN` alone: the page's relative URLs need the slash.
            var headers = HTTPFields()
            headers[.location] = "/t/\(given)/" + remainder
            return Response(status: .permanentRedirect, headers: headers)
        }
        var head = request.head
        head.path = String(remainder)
        return try await inner.respond(to: Request(head: head, body: request.body), context: context)
    }

    /// Compares every byte whatever the first difference (the token is a secret).
    static func equalInConstantTime(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for index in a.indices { difference |= a[index] ^ b[index] }
        return difference == 0
    }

    static func refusal(_ status: HTTPResponse.Status, _ title: String, _ text: String) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "text/html; charset=utf-8"
        headers[.xContentTypeOptions] = "nosniff"
        headers[.contentSecurityPolicy] = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        headers[.cacheControl] = "no-store"
        let html = """
            <!doctype html><html lang="en"><head><meta charset="utf-8"><title>\(title)</title></head>
            <body><h1>\(title)</h1><p>\(text)</p></body></html>

            """
        return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: html)))
    }
}
