import PreviewKit
import Testing

@Suite struct FileNameTests {
    @Test(arguments: [
        "report.pdf", "a", "..hidden", "a..b", "x.", "Ünïcödé – name (1).txt", ".profile",
        String(repeating: "n", count: 255),
    ])
    func acceptsPlainNames(_ name: String) throws {
        try FileName.validate(name)
    }

    @Test(arguments: [
        "", ".", "..", "../x", "../../etc/passwd", "a/b", "/abs", "x/", "a/../b", "nul\0byte", "new\nline", "tab\tname",
        "del\u{7F}", String(repeating: "n", count: 256), String(repeating: "é", count: 128), ".preview-0123.part",
    ])
    func refusesBadNames(_ name: String) {
        #expect(throws: PreviewFailure.self) { try FileName.validate(name) }
        do {
            try FileName.validate(name)
        } catch {
            #expect(error.code == PreviewFailure.badName)
        }
    }

    @Test func traversalMessageSaysWhy() {
        do {
            try FileName.validate("../x")
            Issue.record("../x was accepted")
        } catch {
            #expect(error.message.contains("'/'"))
        }
    }

    @Test func suffixesGoBeforeTheExtension() {
        #expect(FileName.candidate("report.pdf", attempt: 1) == "report.pdf")
        #expect(FileName.candidate("report.pdf", attempt: 2) == "report (2).pdf")
        #expect(FileName.candidate("report.pdf", attempt: 11) == "report (11).pdf")
        #expect(FileName.candidate("archive.tar.gz", attempt: 2) == "archive.tar (2).gz")
        #expect(FileName.candidate("noext", attempt: 3) == "noext (3)")
        #expect(FileName.candidate(".profile", attempt: 2) == ".profile (2)")
    }

    @Test func suffixedLongNamesStayWithinTheLimit() throws {
        let long = String(repeating: "a", count: 251) + ".pdf"
        let candidate = FileName.candidate(long, attempt: 2)
        #expect(candidate.utf8.count <= FileName.maxBytes)
        #expect(candidate.hasSuffix(" (2).pdf"))
        try FileName.validate(candidate)
        let multibyte = String(repeating: "é", count: 125) + ".txt"  // 254 bytes
        let suffixed = FileName.candidate(multibyte, attempt: 7)
        #expect(suffixed.utf8.count <= FileName.maxBytes)
        #expect(suffixed.hasSuffix(" (7).txt"))
    }

    @Test func recognisesTempFiles() {
        #expect(FileName.isTempFile(".preview-0123abcd.part"))
        #expect(!FileName.isTempFile("preview-0123.part"))
        #expect(!FileName.isTempFile(".preview-0123.pdf"))
    }
}
