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
        .executable(name: "discovery-demo", targets: ["discovery-demo"]),
        .executable(name: "lanmsg-echo", targets: ["lanmsg-echo"]),
        .executable(name: "bonjour-chat", targets: ["bonjour-chat"]),
        .executable(name: "preview-server", targets: ["preview-server"]),
        .executable(name: "preview-push", targets: ["preview-push"]),
        .executable(name: "lanmsg", targets: ["lanmsg"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "3.12.0"),
        // The library reports through swift-metrics' API only; the app picks the back end.
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        // preview-server's opt-in Prometheus endpoint (a demo program, not the library).
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.0.0"),
        // preview-server's web page (--web-port): a well-kept HTTP server and a Markdown renderer, in
        // the daemon's target only, never in the library. (Hummingbird's manifest needs Swift 6.2:
        // the programs do, the library products still build with 6.0.)
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/JohnSundell/Ink.git", from: "0.6.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.0.0"),
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
        // The package's one system-call loop (EINTR retried) and errno type.
        .target(name: "SystemCalls", swiftSettings: strict),
        // Layer 0: mDNS / DNS-SD protocol logic without I/O (messages, cache, responder, querier).
        .target(name: "MDNSCore", swiftSettings: strict),
        // Layer 1a: DNS-SD through Avahi on Dispatch, or through MDNSCore on our own sockets.
        .target(
            name: "Discovery",
            dependencies: [
                "CAvahiClient", "MDNSCore", "Locks", "SystemCalls", .product(name: "Logging", package: "swift-log"),
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
                "ProtocolCore", "Locks", "SystemCalls", "CLanmsgAEAD", "CEpoll",
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
                "Discovery", "Transport", "ProtocolCore", "Locks", "SystemCalls", "FastJSON",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        // Demo programs: thin, argument parsing + UI only.
        .executableTarget(
            name: "discovery-demo",
            dependencies: [
                "Discovery",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Demo/discovery-demo",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "lanmsg-echo",
            dependencies: [
                "Messaging",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Demo/lanmsg-echo",
            swiftSettings: strict
        ),
        // bonjour-chat: the room and the host's and member's decisions in ChatKit (controllers returning effects,
        // unit-tested), terminal, sockets and timers in the executable.
        .target(
            name: "ChatKit",
            dependencies: ["Messaging", .product(name: "Logging", package: "swift-log")],
            path: "Demo/ChatKit",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "bonjour-chat",
            dependencies: [
                "ChatKit", "Messaging", "SystemCalls",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Demo/bonjour-chat",
            swiftSettings: strict
        ),
        // preview-server / preview-push: shared protocol and file handling in PreviewKit.
        .target(
            name: "PreviewKit",
            dependencies: [
                "Messaging", "SystemCalls", "Locks",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            path: "Demo/PreviewKit",
            swiftSettings: strict
        ),
        // preview-server's web page (Hummingbird 2): a target of its own, so that its routes are
        // tested in process (Tests/PreviewWebTests).
        .target(
            name: "PreviewWeb",
            dependencies: [
                "PreviewKit", "Locks",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Ink", package: "Ink"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ],
            path: "Demo/PreviewWeb",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "preview-server",
            dependencies: [
                "PreviewKit", "PreviewWeb", "Messaging", "ProtocolCore", "SystemCalls", "Transport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            path: "Demo/preview-server",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "preview-push",
            dependencies: [
                "PreviewKit", "Messaging", "Discovery",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Demo/preview-push",
            swiftSettings: strict
        ),
        // lanmsg: `lanmsg doctor` checks why discovery or a connection does not work, and says what to do.
        .executableTarget(
            name: "lanmsg",
            dependencies: [
                "Messaging", "Discovery", "Transport", "ProtocolCore", "MDNSCore", "SystemCalls",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Demo/lanmsg",
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
        .testTarget(name: "ChatTests", dependencies: ["ChatKit"], swiftSettings: strict),
        .testTarget(name: "PreviewTests", dependencies: ["PreviewKit", "TestWaits"], swiftSettings: strict),
        .testTarget(name: "PreviewWebTests", dependencies: ["PreviewWeb", "PreviewKit", "TestWaits"], swiftSettings: strict),
        // docs/PROTOCOL.md's application examples, rendered from what the code sends.
        .testTarget(
            name: "SpecExampleTests", dependencies: ["ChatKit", "PreviewKit", "ProtocolCore", "Messaging"],
            swiftSettings: strict),
        .testTarget(
            name: "DiscoveryTests",
            dependencies: ["Discovery", "MDNSCore", "Locks", .product(name: "Logging", package: "swift-log")], swiftSettings: strict),
        .testTarget(name: "MDNSCoreTests", dependencies: ["MDNSCore"], swiftSettings: strict),
        .testTarget(name: "ProtocolCoreTests", dependencies: ["ProtocolCore", "FastJSON"], swiftSettings: strict),
        .testTarget(name: "TransportTests", dependencies: ["Transport", "ProtocolCore", "TestWaits"], swiftSettings: strict),
        // MessageChannel over real loopback sockets: hello, messages, requests, transfers, limits.
        .testTarget(
            name: "ChannelTests", dependencies: ["Messaging", "Transport", "ProtocolCore", "TestSupport", "TestWaits"],
            swiftSettings: strict),
        // What the tests share that is no part of the products: the in-memory channel pair.
        .target(
            name: "TestSupport",
            dependencies: ["Messaging", "Transport", "ProtocolCore", "SystemCalls", .product(name: "Logging", package: "swift-log")],
            path: "Tests/TestSupport", swiftSettings: strict),
        // The tests' one wait for a condition (no dependencies: every test target may use it).
        .target(name: "TestWaits", path: "Tests/TestWaits", swiftSettings: strict),
        .testTarget(name: "FastJSONTests", dependencies: ["FastJSON"], swiftSettings: strict),
        .testTarget(
            name: "MessagingTests",
            dependencies: [
                "Messaging", "Transport", "ProtocolCore", "Discovery", "TestWaits",
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            swiftSettings: strict),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "Discovery", "MDNSCore", "Messaging", .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),  // the README's example
            ],
            swiftSettings: strict
        ),
    ],
    swiftLanguageModes: [.v6]
)
