import Foundation
import Testing

/// The README's Getting started is what a newcomer copies: its code must be the code the test suite
/// compiles and runs (Tests/ReadmeBoard/GettingStarted.swift), and its Package.swift lines must
/// name this package and its products as they are.
@Suite struct ReadmeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func read(_ path: String) throws -> String {
        try String(contentsOf: root.appendingPathComponent(path), encoding: .utf8)
    }

    /// The ```swift blocks of the README's "Getting started" section.
    static func gettingStartedBlocks() throws -> [String] {
        let readme = try read("README.md")
        let start = try #require(readme.range(of: "## Getting started\n"))
        let section = readme[start.upperBound...].prefix { _ in true }
        let end = section.range(of: "\n## ")?.lowerBound ?? section.endIndex
        var blocks: [String] = []
        var rest = section[..<end]
        while let open = rest.range(of: "```swift\n") {
            guard let close = rest[open.upperBound...].range(of: "```\n") else { break }
            blocks.append(String(rest[open.upperBound..<close.lowerBound]))
            rest = rest[close.upperBound...]
        }
        return blocks
    }

    @Test func theGettingStartedCodeIsTheCodeTheTestsCompile() throws {
        let source = try Self.read("Tests/ReadmeBoard/GettingStarted.swift")
        let begin = try #require(source.range(of: "// README:begin\n"))
        let end = try #require(source.range(of: "// README:end"))
        let compiled = String(source[begin.upperBound..<end.lowerBound])
        let blocks = try Self.gettingStartedBlocks()
        // The first block is Package.swift, the second the app.
        try #require(blocks.count >= 2)
        #expect(blocks[1] == compiled, "README's Getting started code differs from GettingStarted.swift")
    }

    @Test func thePackageLinesNameThisPackageAndItsProducts() throws {
        let manifest = try #require(try Self.gettingStartedBlocks().first)
        let ours = try Self.read("Package.swift")
        #expect(ours.contains(#"name: "swift-lan-messaging""#))
        #expect(manifest.contains(#"package: "swift-lan-messaging""#))
        #expect(manifest.contains("swift-lan-messaging.git"))  // the identity is the URL's last component
        // A checkout by path keeps the identity only with `name:` (a folder's name is its identity).
        #expect(!manifest.contains(".package(path:"), "a path dependency without name: gets the folder's identity")
        #expect(manifest.contains(#".package(name: "swift-lan-messaging", path:"#))
        for product in ["Messaging"] {
            #expect(manifest.contains(#".product(name: "\#(product)", package: "swift-lan-messaging")"#))
            #expect(ours.contains(#".library(name: "\#(product)""#))
        }
        // The other packages it names are the ones this package depends on, at versions it accepts.
        #expect(manifest.contains("apple/swift-log.git") && ours.contains("apple/swift-log.git"))
        #expect(
            manifest.contains("swift-server/swift-service-lifecycle.git")
                && ours.contains("swift-server/swift-service-lifecycle.git"))
    }
}
