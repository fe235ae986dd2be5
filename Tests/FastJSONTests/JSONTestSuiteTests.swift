import FastJSON
import Foundation
import Testing

/// Locates `JSONTestSuite/test_parsing`: walks up from this file to the package root (a directory
/// with `Package.swift` whose parent holds `shared/JSONTestSuite`), as in `/work/main` beside
/// `/work/shared` locally and in CI.
enum JSONTestSuite {
    static let directory: URL? = {
        var candidate = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        let fileManager = FileManager.default
        while candidate.path != "/" {
            let suite = candidate.deletingLastPathComponent()
                .appendingPathComponent("shared/JSONTestSuite/test_parsing")
            if fileManager.fileExists(atPath: candidate.appendingPathComponent("Package.swift").path),
               fileManager.fileExists(atPath: suite.path)
            {
                return suite
            }
            candidate = candidate.deletingLastPathComponent()
        }
        return nil
    }()

    /// The file names, sorted; empty when the suite is missing (then `suiteIsPresent` fails).
    static let files: [String] = {
        guard let directory,
              let names = try? FileManager.default.contentsOfDirectory(atPath: directory.path)
        else { return [] }
        return names.filter { $0.hasSuffix(".json") }.sorted()
    }()

    static func bytes(_ name: String) throws -> [UInt8] {
        guard let directory else { throw CocoaError(.fileNoSuchFile) }
        return Array(try Data(contentsOf: directory.appendingPathComponent(name)))
    }
}

@Suite("JSONTestSuite (test_parsing)")
struct JSONTestSuiteTests {
    @Test func suiteIsPresent() {
        #expect(JSONTestSuite.directory != nil, """
            JSONTestSuite not found: expected <repository>/../shared/JSONTestSuite/test_parsing \
            (clone https://github.com/nst/JSONTestSuite into shared/ beside the repository)
            """)
        #expect(JSONTestSuite.files.count >= 300, "expected the full suite, found \(JSONTestSuite.files.count) files")
        #expect(JSONTestSuite.files.contains { $0.hasPrefix("y_") })
        #expect(JSONTestSuite.files.contains { $0.hasPrefix("n_") })
        #expect(JSONTestSuite.files.contains { $0.hasPrefix("i_") })
    }

    /// `y_` files parse, `n_` files fail with `DecodingError.dataCorrupted`, `i_` files either
    /// way; whenever Foundation also decodes a file, both produce the same value.
    @Test(.timeLimit(.minutes(1)), arguments: JSONTestSuite.files)
    func parse(_ name: String) throws {
        let bytes = try JSONTestSuite.bytes(name)
        let ours = Result { try FastJSONDecoder().decode(JSONValue.self, from: bytes) }
        // The other entry points must agree with the [UInt8] one.
        let viaData = Result { try FastJSONDecoder().decode(JSONValue.self, from: Data(bytes)) }
        let viaRaw = Result { try bytes.withUnsafeBytes { try FastJSONDecoder().decode(JSONValue.self, from: $0) } }
        #expect((try? ours.get()) == (try? viaData.get()))
        #expect((try? ours.get()) == (try? viaRaw.get()))

        switch name.prefix(2) {
        case "y_":
            #expect(throws: Never.self, "\(name) must be accepted") { try ours.get() }
        case "n_":
            #expect(throws: DecodingError.self, "\(name) must be rejected") { try ours.get() }
            if case .failure(let error) = ours {
                guard case DecodingError.dataCorrupted(let context) = error else {
                    Issue.record("\(name): expected dataCorrupted, got \(error)")
                    return
                }
                #expect(context.underlyingError is FastJSONError, "\(name): underlying error should be a FastJSONError")
            }
        default:
            break  // i_: either outcome is fine, as long as it returns.
        }
        if case .success(let value) = ours,
           let theirs = try? JSONDecoder().decode(JSONValue.self, from: Data(bytes))
        {
            #expect(value == theirs, "\(name): FastJSON and Foundation disagree")
        }
    }

    /// Where Foundation's parser deviates from RFC 8259 (documented in docs/JSON.md).
    static let foundationDeviations: [String: String] = [
        "n_array_extra_comma.json": "Foundation accepts a trailing comma",
        "n_array_number_and_comma.json": "Foundation accepts a trailing comma",
        "n_object_trailing_comma.json": "Foundation accepts a trailing comma",
        "y_number_0e1.json": "Foundation rejects 0e1 as a Double",
    ]

    /// Accept/reject decisions agree with Foundation on every file except the known deviations.
    @Test(arguments: JSONTestSuite.files)
    func acceptanceMatchesFoundation(_ name: String) throws {
        let bytes = try JSONTestSuite.bytes(name)
        let ours = (try? FastJSONDecoder().decode(JSONValue.self, from: bytes)) != nil
        let theirs = (try? JSONDecoder().decode(JSONValue.self, from: Data(bytes))) != nil
        if let reason = Self.foundationDeviations[name] {
            #expect(ours == name.hasPrefix("y_"), "\(name): FastJSON must follow RFC 8259")
            #expect(ours != theirs, "\(name): expected Foundation to differ (\(reason)); update the list")
        } else {
            #expect(ours == theirs, "\(name): FastJSON \(ours ? "accepts" : "rejects"), Foundation does not")
        }
    }

    /// Decoding `y_` files into a concrete type goes through the typed paths: same result as Foundation.
    @Test(arguments: JSONTestSuite.files.filter { $0.hasPrefix("y_") })
    func acceptedFilesMatchFoundationForConcreteTypes(_ name: String) throws {
        let bytes = try JSONTestSuite.bytes(name)
        let ours = try? FastJSONDecoder().decode([JSONValue].self, from: bytes)
        let theirs = try? JSONDecoder().decode([JSONValue].self, from: Data(bytes))
        if Self.foundationDeviations[name] == nil {
            #expect(ours == theirs, "\(name): [JSONValue] decoding differs from Foundation")
        } else {
            #expect(ours != nil)
        }
    }
}
