import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import NIOPosix
import PreviewKit
import Prometheus
import ServiceLifecycle

/// `--web-port`: the live page (Hummingbird 2), read-only.
///
/// - `GET /`: the page (`/app.js`, `/app.css`): the latest file large, the earlier ones listed.
/// - `GET /api/files`: the list as JSON (``PreviewInbox/Entry``), newest first.
/// - `GET /events`: Server-Sent Events, one `stored` event per file stored, at once.
/// - `GET /files/NAME`: the file as it is (`ETag`, `Range`, `If-None-Match`: Hummingbird's
///   FileMiddleware), only a name in the inbox: anything with a `/` once decoded, `..`, the
///   server's temporary files and anything but a regular file are refused; opened once, without
///   following a link, and served from that descriptor (``InboxFiles``).
/// - `GET /render/NAME`: a text or Markdown file rendered (``PageRendering``).
/// - `GET /metrics`: Prometheus' text, when metrics are on.
///
/// Every answer says `X-Content-Type-Options: nosniff`; what a pusher sent is served under a
/// sandbox Content-Security-Policy (``WebSecurity``).
package struct PreviewWeb {
    let inbox: PreviewInbox
    let name: String
    let allowScripts: Bool
    let registry: PrometheusCollectorRegistry?
    let logger: Logger

    package init(inbox: PreviewInbox, name: String, allowScripts: Bool, registry: PrometheusCollectorRegistry?, logger: Logger) {
        self.inbox = inbox
        self.name = name
        self.allowScripts = allowScripts
        self.registry = registry
        self.logger = logger
    }

    /// The router of the page (or, with `pageless`, of `/metrics` alone: `--metrics-port`).
    package func router(pageless: Bool = false) -> Router<BasicRequestContext> {
        let router = Router()
        router.add(middleware: WebSecurity(allowScripts: allowScripts))
        if let registry {
            router.get("/metrics") { _, _ in
                var headers = HTTPFields()
                headers[.contentType] = "text/plain; version=0.0.4; charset=utf-8"
                return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer())))
            }
        }
        guard !pageless else { return router }
        router.add(middleware: InboxGuard())
        router.add(
            middleware: FileMiddleware(fileProvider: InboxFiles(directory: inbox.directory), urlBasePath: "/files")
                .withAdditionalMediaTypes(forFileExtensions: Self.mediaTypes))
        router.get("/") { _, _ in Self.asset(WebAssets.page, "text/html; charset=utf-8") }
        router.get("/app.js") { _, _ in Self.asset(WebAssets.script, "text/javascript; charset=utf-8") }
        router.get("/app.css") { _, _ in Self.asset(WebAssets.style, "text/css; charset=utf-8") }
        let (inbox, name, allowScripts) = (self.inbox, self.name, self.allowScripts)
        router.get("/api/files") { _, _ in
            // A readdir and an lstat per file: on NIO's thread pool, never on a cooperative thread.
            let files = try await NIOThreadPool.singleton.runIfActive { inbox.list() }
            let listing = Listing(name: FileName.printable(name, limit: 100), allowScripts: allowScripts, files: files)
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            headers[.cacheControl] = "no-store"
            return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: try JSONEncoder().encode(listing))))
        }
        router.get("/events") { _, _ in Self.events(inbox) }
        router.get("/render/:name") { _, context in
            let name = try context.parameters.require("name")
            // Up to 4 MiB read and rendered: on NIO's thread pool too.
            return try await NIOThreadPool.singleton.runIfActive { try Self.render(name, in: inbox.directory) }
        }
        return router
    }

    /// The JSON of `/api/files`.
    struct Listing: Codable {
        let name: String
        let allowScripts: Bool
        let files: [PreviewInbox.Entry]
    }

    /// The media types the FileMiddleware serves by extension: the page's own table (the
    /// middleware's lacks some, and text gets its charset).
    static var mediaTypes: [String: MediaType] {
        PreviewKind.byExtension.compactMapValues { MediaType(from: $0.1) }
    }

    static func asset(_ text: String, _ type: String) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = type
        headers[.cacheControl] = "no-cache"
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: text)))
    }

    /// Server-Sent Events: `stored` with the entry's JSON for each file stored, a comment line
    /// every 20 s, until the page goes away or the server stops.
    static func events(_ inbox: PreviewInbox) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "text/event-stream"
        headers[.cacheControl] = "no-store"
        let updates = inbox.watch()
        return Response(
            status: .ok, headers: headers,
            body: ResponseBody { writer in
                try await writer.write(ByteBuffer(string: "retry: 1000\n: watching the inbox\n\n"))
                let encoder = JSONEncoder()
                for await update in updates {
                    switch update {
                    case .stored(let entry):
                        let json = String(decoding: try encoder.encode(entry), as: UTF8.self)
                        try await writer.write(ByteBuffer(string: "event: stored\ndata: \(json)\n\n"))
                    case .ping:
                        try await writer.write(ByteBuffer(string: ": ping\n\n"))
                    }
                }
                try await writer.finish(nil)
            })
    }

    /// `/render/NAME`: a text or Markdown file of the inbox as a page.
    static func render(_ encoded: String, in directory: String) throws -> Response {
        guard let name = encoded.removingPercentEncoding, PreviewInbox.isListed(name) else {
            throw HTTPError(.badRequest, message: "not a file name of the inbox")
        }
        let (kind, _) = PreviewKind.of(name)
        guard kind == .text || kind == .markdown else {
            throw HTTPError(.notFound, message: "only text and Markdown files are rendered; get it from /files/")
        }
        guard let handle = PreviewInbox.openRegularFile(directory + "/" + name) else {
            throw HTTPError(.notFound, message: "no such file in the inbox")
        }
        defer { try? handle.close() }
        let data = (try? handle.read(upToCount: PageRendering.limit + 1)) ?? Data()
        let truncated = data.count > PageRendering.limit
        let bytes = [UInt8](data.prefix(PageRendering.limit))
        let title = FileName.printable(name, limit: 300)
        let page =
            kind == .markdown
            ? PageRendering.markdown(bytes, title: title, truncated: truncated)
            : PageRendering.text(bytes, title: title, truncated: truncated)
        var headers = HTTPFields()
        headers[.contentType] = "text/html; charset=utf-8"
        headers[.cacheControl] = "no-cache"
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: page)))
    }
}

/// Refuses every `/files/` request that is not for one plain name of the inbox, with why, before
/// the FileMiddleware looks: `/files/../x`, `/files/%2e%2e/x`, `/files/a%2Fb`, the server's
/// temporary files and its folder of interrupted pushes; and every method but GET and HEAD.
/// (Symbolic links, folders and FIFOs are refused by ``InboxFiles``, which opens the file.)
struct InboxGuard<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let path = request.uri.path
        guard path.hasPrefix("/files/") || path == "/files" else { return try await next(request, context) }
        guard request.method == .get || request.method == .head else {
            throw HTTPError(.methodNotAllowed, message: "the inbox is read-only")
        }
        guard let name = path.dropFirst("/files/".count).removingPercentEncoding, PreviewInbox.isListed(name) else {
            throw HTTPError(.badRequest, message: "not a file name of the inbox (one name, no '/' or '..')")
        }
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            throw HTTPError(.notFound, message: "no such file in the inbox")
        }
    }
}

/// The headers every answer carries: `nosniff` and no referrer; the page's own strict
/// Content-Security-Policy; and for what a pusher sent (`/files/`, `/render/`) a sandbox policy —
/// no scripts (unless `--allow-scripts`, for HTML files), no plugins, no same origin — so that
/// even opened on its own, outside the page's sandboxed frame, a pushed page runs nothing.
struct WebSecurity<Context: RequestContext>: RouterMiddleware {
    let allowScripts: Bool

    static var referrerPolicy: HTTPField.Name { HTTPField.Name("Referrer-Policy")! }
    static var pagePolicy: String {
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-src 'self'; "
            + "object-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    }
    static var documentPolicy: String {
        "sandbox; default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; media-src 'self'; "
            + "font-src 'self' data:"
    }
    static var scriptedPolicy: String {
        "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline' 'self'; img-src 'self' data:; "
            + "style-src 'unsafe-inline'; media-src 'self'; font-src 'self' data:"
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var response: Response
        do {
            response = try await next(request, context)
        } catch let error as any HTTPResponseError {
            response = try error.response(from: request, context: context)
        }
        response.headers[.xContentTypeOptions] = "nosniff"
        response.headers[Self.referrerPolicy] = "no-referrer"
        let path = request.uri.path
        if path.hasPrefix("/files/") {
            let name = path.dropFirst("/files/".count).removingPercentEncoding ?? ""
            switch PreviewKind.of(name).0 {
            case .pdf: break  // the browser's PDF viewer does not run under a sandbox policy
            case .html where allowScripts: response.headers[.contentSecurityPolicy] = Self.scriptedPolicy
            default: response.headers[.contentSecurityPolicy] = Self.documentPolicy
            }
        } else if path.hasPrefix("/render/") {
            response.headers[.contentSecurityPolicy] = Self.documentPolicy
        } else {
            response.headers[.contentSecurityPolicy] = Self.pagePolicy
        }
        return response
    }
}

/// The web page as a service of the daemon's service group: on graceful shutdown the pages'
/// event streams end first (else the HTTP server's own shutdown would wait on them).
package struct WebService: Service {
    let application: Application<PageGate<RouterResponder<BasicRequestContext>>>
    let inbox: PreviewInbox?

    package func run() async throws {
        try await withGracefulShutdownHandler {
            try await application.run()
        } onGracefulShutdown: {
            inbox?.finish()
        }
    }

    /// An application on `address`:`port` (0: the kernel's choice) that calls `running` with the
    /// port it got. With a `token`, only paths under `/t/TOKEN/` are answered (``PageGate``).
    package static func make(
        router: Router<BasicRequestContext>, address: String, port: UInt16, logger: Logger, inbox: PreviewInbox?,
        token: String? = nil, running: @escaping @Sendable (Int) -> Void
    ) -> WebService {
        let application = Application(
            responder: PageGate(router.buildResponder(), token: token), configuration: .init(address: .hostname(address, port: Int(port)), serverName: "preview-server"),
            onServerRunning: { channel in running(channel.localAddress?.port ?? 0) }, logger: logger)
        return WebService(application: application, inbox: inbox)
    }
}
