// swift-tools-version:6.0
import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "swift-lan-messaging",
    products: [
        .library(name: "Messaging", targets: ["Messaging"]),
        .library(name: "Discovery", targets: ["Discovery"]),
        .library(name: "Transport", targets: ["Transport"]),
        .library(name: "FastJSON", targets: ["FastJSON"]),
        .library(name: "MDNSCore", targets: ["MDNSCore"]),
        // Not API (no 1.x promise): the package's lock, system-call loop and protocol core, for the
        // programs (Demo/Package.swift: a package of their own, so that an app on the library never
        // resolves what only they need — argument-parser, Hummingbird, Ink, swift-prometheus).
        .library(name: "_ProgramSupport", targets: ["Locks", "SystemCalls", "ProtocolCore", "Scheduling"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "3.12.0"),
        // The library reports through swift-metrics' API only; the app picks the back end.
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        // `swift package generate-documentation` (Tests/docs/build-docs.sh).
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.4.0"),
    ],
    targets: [
        // Layer 0: the C headers of libavahi-client (Debian: libavahi-client-dev), nothing else. Only
        // Discovery imports it. No pkgConfig: avahi-client.pc adds -D_REENTRANT, which SwiftPM drops
        // with a "prohibited flag" warning in every build; the headers are in /usr/include and the
        // module map links the two libraries.
        .systemLibrary(name: "CAvahiClient"),
        // Layer 0: ChaCha20-Poly1305 in place, from OpenSSL 3's libcrypto (Debian: libssl-dev), for
        // the Noise transport: swift-crypto's AEAD returns new buffers, which cost the encrypted bulk
        // path several copies and allocations per message (docs/PERFORMANCE.md, "Encryption").
        .target(name: "CLanmsgAEAD", linkerSettings: [.linkedLibrary("crypto")]),
        // Layer 0: Linux's <sys/epoll.h> (the Glibc module leaves it out), for Transport's
        // LoopReadiness: one epoll set per loop instead of a Dispatch read source per connection.
        .systemLibrary(name: "CEpoll"),
        // The package's one lock type (a pthread mutex with its value in one allocation).
        .target(name: "Locks", swiftSettings: strict),
        // The package's one source of time for timers (Dispatch's, or a manual clock in tests).
        .target(name: "Scheduling", dependencies: ["Locks"], swiftSettings: strict),
        // The package's one system-call loop (EINTR retried) and errno type.
        .target(name: "SystemCalls", swiftSettings: strict),
        // Layer 0: mDNS / DNS-SD protocol logic without I/O (messages, cache, responder, querier).
        .target(name: "MDNSCore", swiftSettings: strict),
        // Layer 1a: DNS-SD through Avahi on Dispatch, or through MDNSCore on our own sockets.
        .target(
            name: "Discovery",
            dependencies: [
                "CAvahiClient", "MDNSCore", "Locks", "Scheduling", "SystemCalls", .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Crypto", package: "swift-crypto"),  // TSIG's HMAC (wide-area DNS UPDATE)
            ],
            swiftSettings: strict
        ),
        // Layer 1b: the protocol core. No I/O: no sockets, no Dispatch, no files. Frames, the
        // envelope and the connection's logic as state machines that take events and return actions.
        .target(
            name: "ProtocolCore",
            dependencies: [
                "FastJSON",  // hello payloads
                "CLanmsgAEAD",  // the transport's AEAD
                .product(name: "Crypto", package: "swift-crypto"),  // HMAC-SHA256 for pre-shared keys
            ],
            swiftSettings: strict
        ),
        // Layer 1c: I/O only: sockets, Dispatch sources, the driver that carries out the core's actions.
        .target(
            name: "Transport",
            dependencies: [
                "ProtocolCore", "Locks", "Scheduling", "SystemCalls", "CLanmsgAEAD", "CEpoll",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        // A Codable JSON codec over bytes (no I/O).
        .target(name: "FastJSON", swiftSettings: strict),
        // Layer 2: server and client, Transport + Discovery joined. What users import.
        .target(
            name: "Messaging",
            dependencies: [
                "Discovery", "Transport", "ProtocolCore", "Locks", "Scheduling", "SystemCalls", "FastJSON",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        // libFuzzer harness over the protocol core (Tests/fuzz/run-fuzz-wire.sh builds it with
        // --sanitize=fuzzer and -DFUZZING; a plain build replays inputs given as files).
        .executableTarget(
            name: "lanmsg-fuzz", dependencies: ["ProtocolCore", .product(name: "Crypto", package: "swift-crypto")], path: "Tests/fuzz/FuzzCore", swiftSettings: strict),
        // The README's Getting started as a program (board or client), for the integration test that
        // stops it with SIGTERM.
        .executableTarget(
            name: "readme-board",
            dependencies: [
                "Messaging", .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Tests/ReadmeBoard",
            swiftSettings: strict
        ),
        // One side of the chaos test of durable sessions (killed and restarted by
        // SessionChaosIntegrationTests and Tests/chaos/session-chaos.sh).
        .executableTarget(
            name: "session-chaos",
            dependencies: ["Messaging", "Locks", .product(name: "Logging", package: "swift-log")],
            path: "Tests/SessionChaos",
            swiftSettings: strict
        ),
        // A scriptable DNS-SD peer (either backend) for the integration tests.
        .executableTarget(
            name: "discovery-peer",
            dependencies: ["Discovery", .product(name: "Logging", package: "swift-log")],
            path: "Tests/DiscoveryPeer",
            swiftSettings: strict
        ),
        .testTarget(
            name: "DiscoveryTests",
            dependencies: [
                "Discovery", "MDNSCore", "Locks", "Scheduling", "SystemCalls", "TestWaits", .product(name: "Logging", package: "swift-log"),
                "Messaging",  // the one-clock world: a server and a client on the simulated link's backends
            ],
            swiftSettings: strict),
        .testTarget(name: "MDNSCoreTests", dependencies: ["MDNSCore"], swiftSettings: strict),
        .testTarget(name: "ProtocolCoreTests", dependencies: ["ProtocolCore", "FastJSON"], swiftSettings: strict),
        .testTarget(name: "TransportTests", dependencies: ["Transport", "ProtocolCore", "TestWaits"], swiftSettings: strict),
        // MessageChannel over real loopback sockets: hello, messages, requests, transfers, limits.
        .testTarget(
            name: "ChannelTests", dependencies: ["Messaging", "Transport", "ProtocolCore", "Scheduling", "TestSupport", "TestWaits"],
            swiftSettings: strict),
        // What the tests share that is no part of the products: the in-memory channel pair.
        .target(
            name: "TestSupport",
            dependencies: ["Messaging", "Transport", "ProtocolCore", "SystemCalls", "TestWaits", .product(name: "Logging", package: "swift-log")],
            path: "Tests/TestSupport", swiftSettings: strict),
        // The tests' waits: for a condition, a value that tells its changes, a child process's output
        // and exit (Locks only: every test target may use it).
        .target(name: "TestWaits", dependencies: ["Locks"], path: "Tests/TestWaits", swiftSettings: strict),
        .testTarget(name: "FastJSONTests", dependencies: ["FastJSON"], swiftSettings: strict),
        .testTarget(
            name: "MessagingTests",
            dependencies: [
                "Messaging", "Transport", "ProtocolCore", "Discovery", "Scheduling", "TestWaits", "TestSupport",
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            swiftSettings: strict),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "Discovery", "MDNSCore", "Messaging", "SystemCalls", "TestWaits", .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),  // the README's example
            ],
            swiftSettings: strict
        ),
    ],
    swiftLanguageModes: [.v6]
)

// CI's ThreadSanitizer bundle (Tests/run.sh builds it with LANMSG_TEST_BUNDLE=unit) leaves out the
// test targets its stage never runs: the integration tests (run in the namespace stages from the
// debug build) and the two targets of state machines without I/O (MDNSCore, ProtocolCore: values in,
// values out, no thread). Every other build has them all.
if Context.environment["LANMSG_TEST_BUNDLE"] == "unit" {
    package.targets.removeAll { ["IntegrationTests", "MDNSCoreTests", "ProtocolCoreTests"].contains($0.name) }
}
