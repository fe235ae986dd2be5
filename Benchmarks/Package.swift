// swift-tools-version:6.0
// Benchmarks live in their own package so benchmark-only code stays out of the library's manifest.
// Run with `Benchmarks/run-codec.sh`.
import Foundation
import PackageDescription

// A path dependency's identity is its directory name (e.g. "main"), which depends on where the
// repository was cloned; derive it instead of hard-coding it.
let parentIdentity = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent.lowercased()

let package = Package(
    name: "Benchmarks",
    dependencies: [
        .package(path: ".."),
        // Issue 7 (Benchmarks/run.sh): the SwiftNIO peer.
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.0"),
        // Issue 13: the like-for-like anchor of our encrypted channel, the NIO peer over TLS 1.3.
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        // --metrics: the cost of counting into a real swift-metrics back end (Prometheus).
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.0.0"),
        // The X25519 floor of the handshake (issue 55), with the calls the library's handshake makes.
        .package(url: "https://github.com/apple/swift-crypto.git", from: "3.12.0"),
    ],
    targets: [
        .executableTarget(
            name: "codec-bench",
            dependencies: [.product(name: "FastJSON", package: parentIdentity)],
            path: "Sources/codec-bench",
            swiftSettings: [.enableUpcomingFeature("ExistentialAny")]
        ),
        // Issue 7 (Benchmarks/run.sh): workloads W1-W5 and D1, ours vs the SwiftNIO peer.
        // The workload definitions shared by both implementations (Sample, timing, options).
        .target(name: "CBenchSupport", path: "Sources/CBenchSupport"),
        .target(name: "BenchCommon", dependencies: ["CBenchSupport"], path: "Sources/BenchCommon"),
        // W2's handler client, for bench-ours and bench-siege.
        .target(
            name: "BenchMessaging",
            dependencies: ["BenchCommon", .product(name: "Messaging", package: parentIdentity)],
            path: "Sources/BenchMessaging"
        ),
        // W1-W5 with our Transport (+ FoundationJSONCodec or FastJSON).
        .executableTarget(
            name: "bench-ours",
            dependencies: [
                "BenchCommon",
                "BenchMessaging",
                .product(name: "Transport", package: parentIdentity),
                .product(name: "Messaging", package: parentIdentity),  // its default codec, FastJSONCodec
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            path: "Sources/bench-ours"
        ),
        // W1-W5 with the SwiftNIO peer: NIOPosix + NIOExtras length-field framing + Foundation JSON.
        .executableTarget(
            name: "bench-nio",
            dependencies: [
                "BenchCommon",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            path: "Sources/bench-nio"
        ),
        // Issue 28 (Benchmarks/flood.sh): a MessageServer under a handshake flood, an established
        // client's round trips and a legitimate newcomer's connects beside it.
        .executableTarget(
            name: "bench-siege",
            dependencies: [
                "BenchCommon",
                "BenchMessaging",
                .product(name: "Messaging", package: parentIdentity),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/bench-siege"
        ),
        // D1: publish -> resolve -> connect, and stop -> removed, across the two-host avahi harness.
        .executableTarget(
            name: "bench-discovery",
            dependencies: [
                .product(name: "Messaging", package: parentIdentity),
                .product(name: "Transport", package: parentIdentity),  // Listener
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/bench-discovery"
        ),
    ],
    swiftLanguageModes: [.v6]
)
