import Foundation
import Ink

/// How the page shows a file, decided by its name's extension (the content is never sniffed).
enum PreviewKind: String, Codable, Sendable {
    /// PNG, JPEG, GIF, WebP, SVG: an `<img>` (an SVG's scripts never run as an image).
    case image
    /// The browser's own PDF viewer, in a frame.
    case pdf
    /// Plain text and source code: escaped, monospace (``PageRendering/text(_:title:)``).
    case text
    /// Markdown, rendered to HTML (JohnSundell/Ink) in a sandboxed frame.
    case markdown
    /// HTML in a sandboxed frame: no scripts, no same origin, a strict Content-Security-Policy
    /// (scripts only with `--allow-scripts`).
    case html
    /// Anything else: a download link with its type.
    case other

    static let images = [
        "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp",
        "svg": "image/svg+xml",
    ]
    static let texts: Set<String> = [
        "txt", "text", "log", "csv", "tsv", "json", "xml", "yaml", "yml", "toml", "ini", "conf", "cfg", "swift", "c",
        "h", "cc", "cpp", "cxx", "hpp", "hh", "m", "mm", "py", "rb", "rs", "go", "java", "kt", "kts", "js", "mjs",
        "ts", "tsx", "jsx", "css", "scss", "sh", "bash", "zsh", "fish", "sql", "diff", "patch", "tex", "pl", "lua",
        "r", "cmake", "mk", "gradle", "properties", "proto", "graphql", "dockerfile",
    ]
    static let others = [
        "zip": "application/zip", "gz": "application/gzip", "tar": "application/x-tar", "mp3": "audio/mpeg",
        "mp4": "video/mp4", "wav": "audio/wav", "webm": "video/webm", "epub": "application/epub+zip",
    ]

    /// Every extension known, with its kind and media type: what the page shows and what
    /// `/files/` serves it as come from this one table.
    static let byExtension: [String: (PreviewKind, String)] = {
        var table: [String: (PreviewKind, String)] = [:]
        for (ext, type) in images { table[ext] = (.image, type) }
        for ext in texts { table[ext] = (.text, "text/plain; charset=utf-8") }
        for (ext, type) in others { table[ext] = (.other, type) }
        for ext in ["md", "markdown", "mdown", "mkd"] { table[ext] = (.markdown, "text/markdown; charset=utf-8") }
        for ext in ["html", "htm", "xhtml"] { table[ext] = (.html, "text/html; charset=utf-8") }
        table["pdf"] = (.pdf, "application/pdf")
        return table
    }()

    /// The kind and media type of a file named `name`.
    static func of(_ name: String) -> (PreviewKind, String) {
        guard let dot = name.lastIndex(of: "."), dot != name.startIndex else {
            return name.lowercased() == "makefile" || name.lowercased() == "dockerfile"
                ? (.text, "text/plain; charset=utf-8") : (.other, "application/octet-stream")
        }
        return byExtension[name[name.index(after: dot)...].lowercased()] ?? (.other, "application/octet-stream")
    }
}

/// The documents `/render/` answers with: a text file escaped in a `<pre>`, a Markdown file as
/// HTML. Served under a sandbox Content-Security-Policy (``WebSecurity``): what a Markdown file
/// carries as raw HTML is shown, its scripts never run.
enum PageRendering {
    /// The most of a file rendered (4 MiB); the rest is left out, and the page says so.
    static let limit = 4 << 20

    static func text(_ bytes: [UInt8], title: String, truncated: Bool) -> String {
        let text = String(decoding: bytes, as: UTF8.self)
        return document(
            title: title,
            body: "<pre>\(escape(text))</pre>" + (truncated ? note : ""))
    }

    static func markdown(_ bytes: [UInt8], title: String, truncated: Bool) -> String {
        let html = MarkdownParser().html(from: String(decoding: bytes, as: UTF8.self))
        return document(title: title, body: "<article>\(html)</article>" + (truncated ? note : ""))
    }

    private static var note: String {
        "<p class=\"note\">Only the first \(limit >> 20) MiB are shown; download the file for the rest.</p>"
    }

    /// A whole page around `body`. Relative links and images resolve in the inbox (`/files/`).
    static func document(title: String, body: String) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <base href="/files/">
        <title>\(escape(title))</title>
        <style>
        body { font: 16px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1rem; color: #1d1d1f; background: #fff; overflow-wrap: anywhere; }
        article { max-width: 52rem; }
        pre { white-space: pre-wrap; word-break: break-word; font: 14px/1.45 ui-monospace, "DejaVu Sans Mono", monospace; margin: 0; tab-size: 4; }
        article pre { background: #f4f4f6; padding: .75rem; border-radius: 6px; }
        img { max-width: 100%; }
        table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: .25rem .5rem; }
        .note { color: #8a5a00; font-style: italic; }
        </style></head>
        <body>\(body)</body></html>
        """
    }

    /// `text` with `&`, `<`, `>`, `"` and `'` as entities: text, never markup.
    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.append(character)
            }
        }
        return out
    }
}
