/// File names pushed to a preview server: validation and " (n)" suffixes.
public enum FileName {
    /// The longest name accepted, in UTF-8 bytes (the Linux NAME_MAX).
    public static let maxBytes = 255
    /// Prefix of the server's temporary files; pushed names may not start with it.
    public static let tempPrefix = ".preview-"
    /// Suffix of the server's temporary files.
    public static let tempSuffix = ".part"

    /// Checks that `name` is a single, plain path component: not empty, at most 255 bytes, no `/`,
    /// no NUL or other control character, not `.` or `..` (so `../x` and `a/../b` are refused), and not
    /// a name reserved for the server's temporary files.
    /// - Throws: ``PreviewFailure`` with code ``PreviewFailure/badName``.
    public static func validate(_ name: String) throws(PreviewFailure) {
        func bad(_ why: String) -> PreviewFailure {
            PreviewFailure(PreviewFailure.badName, "bad file name '\(printable(name))': \(why)")
        }
        if name.isEmpty { throw bad("it is empty") }
        if name.utf8.count > maxBytes {
            throw bad("it is \(name.utf8.count) bytes long, at most \(maxBytes) are allowed")
        }
        if name.utf8.contains(0) { throw bad("it contains a NUL byte") }
        if name.contains("/") { throw bad("it contains '/' (path traversal is refused; send a plain file name)") }
        if name == "." || name == ".." { throw bad("'.' and '..' are not file names") }
        if name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw bad("it contains a control character")
        }
        if name.unicodeScalars.contains(where: { (0x80...0x9F).contains($0.value) }) {
            throw bad("it contains a C1 control character (U+0080–U+009F), which terminals obey")
        }
        if let scalar = name.unicodeScalars.first(where: isBidiControl) {
            throw bad(
                "it contains the bidirectional control U+\(String(scalar.value, radix: 16, uppercase: true)), which can make "
                    + "a name look like another (\"txt.exe\" shown as \"exe.txt\"); rename the file without it")
        }
        if name.hasPrefix(tempPrefix) { throw bad("names starting with '\(tempPrefix)' are reserved") }
    }

    /// The `attempt`-th candidate for storing `name`: attempt 1 is `name` itself, attempt n ≥ 2 inserts
    /// " (n)" before the extension (`report.pdf` → `report (2).pdf`, `.profile` → `.profile (2)`),
    /// shortening the stem if the result would exceed ``maxBytes``.
    public static func candidate(_ name: String, attempt: Int) -> String {
        guard attempt > 1 else { return name }
        var stem = Substring(name)
        var ext: Substring = ""
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            stem = name[..<dot]
            ext = name[dot...]
        }
        let suffix = " (\(attempt))"
        var result = String(stem) + suffix + ext
        while result.utf8.count > maxBytes, !stem.isEmpty {
            stem = stem.dropLast()
            result = String(stem) + suffix + ext
        }
        return result
    }

    /// Whether a directory entry is one of the server's temporary files.
    public static func isTempFile(_ entry: String) -> Bool {
        entry.hasPrefix(tempPrefix) && entry.hasSuffix(tempSuffix)
    }

    /// The Unicode bidirectional formatting characters (embeddings, overrides, isolates, marks).
    public static func isBidiControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    /// `name` with control characters (C0, DEL, C1) and bidirectional controls escaped as
    /// `\u{…}`, for anything a program prints or logs: a name never reaches a terminal raw.
    public static func printable(_ name: String, limit: Int = 80) -> String {
        var out = ""
        for scalar in name.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7F || (0x80...0x9F).contains(scalar.value) || isBidiControl(scalar) {
                out += "\\u{\(String(scalar.value, radix: 16))}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out.count > limit ? String(out.prefix(limit)) + "…" : out
    }
}
