// swift-tools-version:6.0
// The programs built on the library — bonjour-chat, preview-server, preview-push, lanmsg,
// lanmsg-echo, discovery-demo — in a package of their own, with every dependency only they need
// (argument-parser, Hummingbird, Ink, swift-prometheus, swift-http-types). An app that depends on the
// library (the package one directory up) resolves and builds none of them.
//
//   swift build --package-path Demo            (or `cd Demo && swift build`)
//   Demo/run.sh                                  builds this package and runs the demo
import Foundation
import PackageDescription

// A path dependency's identity is its directory name (e.g. "main"), which depends on where the
// repository was cloned; derive it instead of hard-coding it.
let library = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent.lowercased()

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "lan-messaging-programs",
    products: [
        .executable(name: "discovery-demo", targets: ["discovery-demo"]),
        .executable(name: "lanmsg-echo", targets: ["lanmsg-echo"]),
        .executable(name: "bonjour-chat", targets: ["bonjour-chat"]),
        .executable(name: "preview-server", targets: ["preview-server"]),
        .executable(name: "preview-push", targets: ["preview-push"]),
        .executable(name: "lanmsg", targets: ["lanmsg"]),
    ],
    dependencies: [
        .package(path: ".."),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "3.12.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        // preview-server's opt-in Prometheus endpoint.
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.0.0"),
        // preview-server's web page (--web-port): a well-kept HTTP server and a Markdown renderer.
        // (Hummingbird's manifest needs Swift 6.2: this package does; the library needs 6.0.)
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/JohnSundell/Ink.git", from: "0.6.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.0.0"),
    ],
    targets: [
        .executableTarget(
            name: "discovery-demo",
            dependencies: [
                .product(name: "_ProgramSupport", package: library),  // Locked: the lock ThreadSanitizer sees
                .product(name: "Discovery", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "discovery-demo",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "lanmsg-echo",
            dependencies: [
                .product(name: "_ProgramSupport", package: library),  // Locked: the lock ThreadSanitizer sees
                .product(name: "Messaging", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "lanmsg-echo",
            swiftSettings: strict
        ),
        // bonjour-chat: the room and the host's and member's decisions in ChatKit (controllers
        // returning effects, unit-tested), terminal, sockets and timers in the executable.
        .target(
            name: "ChatKit",
            dependencies: [.product(name: "Messaging", package: library), .product(name: "Logging", package: "swift-log")],
            path: "ChatKit",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "bonjour-chat",
            dependencies: [
                "ChatKit",
                .product(name: "Messaging", package: library),
                .product(name: "_ProgramSupport", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "bonjour-chat",
            swiftSettings: strict
        ),
        // preview-server / preview-push: shared protocol and file handling in PreviewKit.
        .target(
            name: "PreviewKit",
            dependencies: [
                .product(name: "Messaging", package: library),
                .product(name: "_ProgramSupport", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            path: "PreviewKit",
            swiftSettings: strict
        ),
        // preview-server's web page (Hummingbird 2): a target of its own, so that its routes are
        // tested in process (Tests/PreviewWebTests).
        .target(
            name: "PreviewWeb",
            dependencies: [
                "PreviewKit",
                .product(name: "_ProgramSupport", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Ink", package: "Ink"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ],
            path: "PreviewWeb",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "preview-server",
            dependencies: [
                "PreviewKit", "PreviewWeb",
                .product(name: "Messaging", package: library),
                .product(name: "Transport", package: library),
                .product(name: "_ProgramSupport", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            path: "preview-server",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "preview-push",
            dependencies: [
                "PreviewKit",
                .product(name: "_ProgramSupport", package: library),
                .product(name: "Messaging", package: library),
                .product(name: "Discovery", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "preview-push",
            swiftSettings: strict
        ),
        // lanmsg: `lanmsg doctor` checks why discovery or a connection does not work, and says what to do.
        .executableTarget(
            name: "lanmsg",
            dependencies: [
                .product(name: "Messaging", package: library),
                .product(name: "Discovery", package: library),
                .product(name: "Transport", package: library),
                .product(name: "MDNSCore", package: library),
                .product(name: "_ProgramSupport", package: library),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "lanmsg",
            swiftSettings: strict
        ),
        // The tests' waits (a link to the library's Tests/TestWaits; its lock from _ProgramSupport).
        .target(
            name: "DemoTestWaits", dependencies: [.product(name: "_ProgramSupport", package: library)], path: "Tests/TestWaits",
            swiftSettings: strict),
        .testTarget(name: "ChatTests", dependencies: ["ChatKit"], swiftSettings: strict),
        .testTarget(
            name: "PreviewTests",
            dependencies: ["PreviewKit", "DemoTestWaits", .product(name: "_ProgramSupport", package: library)],
            swiftSettings: strict),
        .testTarget(name: "PreviewWebTests", dependencies: ["PreviewWeb", "PreviewKit", "DemoTestWaits"], swiftSettings: strict),
        // docs/PROTOCOL.md's application examples, rendered from what the code sends.
        .testTarget(
            name: "SpecExampleTests",
            dependencies: [
                "ChatKit", "PreviewKit",
                .product(name: "Messaging", package: library),
                .product(name: "_ProgramSupport", package: library),
            ],
            swiftSettings: strict),
    ],
    swiftLanguageModes: [.v6]
)

// CI's ThreadSanitizer bundle of the programs (Tests/run.sh builds it with LANMSG_TEST_BUNDLE=unit)
// leaves out the page's route tests: they alone need Hummingbird, and with them the bundle compiled
// SwiftNIO, Hummingbird, Ink and their dependencies under TSan — 485 of its 512 compile steps, most
// of its build (214 s alone on 2 cores, 350 s beside the library's TSan stage) — to check the
// routes' glue (requests from one thread, answers read whole). They run in the plain debug bundle
// (the unit-programs stage), as every test does; the TSan bundle keeps ChatTests, PreviewTests
// (PreviewKit: the store, pushes, resumes) and the spec examples.
if Context.environment["LANMSG_TEST_BUNDLE"] == "unit" {
    package.targets.removeAll { $0.name == "PreviewWebTests" }
}
