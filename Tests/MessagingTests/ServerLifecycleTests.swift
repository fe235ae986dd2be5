import Foundation
import TestWaits
import Testing

import Discovery
import Locks
@testable import Messaging

/// A publisher the test controls: `publishService` waits until the test releases it.
final class GatedPublisher: ServicePublisher, @unchecked Sendable {
    final class Publication: ServicePublication, @unchecked Sendable {
        let events: AsyncStream<PublicationEvent>
        let continuation: AsyncStream<PublicationEvent>.Continuation
        let name: String
        let unpublished = Locked(false)
        init(name: String) {
            self.name = name
            (events, continuation) = AsyncStream.makeStream()
        }
        func updateTXT(_ txt: TXTRecord) async throws(DiscoveryError) {}
        func unpublish() async {
            unpublished.withLock { $0 = true }
            continuation.finish()
        }
    }

    /// A loopback server published through this gate, started: the gate opened as soon as
    /// `start()` entered it.
    func startedServer(name: String) async throws -> MessageServer {
        var configuration = ServerConfiguration(serviceType: "_test._tcp", serviceName: name)
        configuration.listener.loopbackOnly = true
        let server = MessageServer(configuration: configuration, publisher: self, logger: testLogger())
        let starting = Task { try await server.start() }
        var gate = entered.stream.makeAsyncIterator()
        _ = await gate.next()
        release.continuation.yield()
        try await starting.value
        return server
    }

    let entered = AsyncStream<Void>.makeStream()
    let release = AsyncStream<Void>.makeStream()
    let published = Locked<Publication?>(nil)

    func publishService(name: String?, type: String, port: UInt16, txt: TXTRecord) async throws(DiscoveryError)
        -> any ServicePublication
    {
        entered.continuation.yield()
        var gate = release.stream.makeAsyncIterator()
        _ = await gate.next()
        let publication = Publication(name: name ?? "x")
        published.withLock { $0 = publication }
        return publication
    }
}

@Suite struct ServerLifecycleTests {
    /// `stop()` while `start()` awaits the publication: `start()` throws `.stopped`, the publication
    /// it then receives is withdrawn and the listener closed — no server left half running.
    @Test func stopDuringPublishLeavesNothingRunning() async throws {
        let publisher = GatedPublisher()
        var configuration = ServerConfiguration(serviceType: "_test._tcp", serviceName: "Gate")
        configuration.listener.loopbackOnly = true
        let server = MessageServer(configuration: configuration, publisher: publisher, logger: testLogger())
        let starting = Task { () -> MessagingError? in
            do throws(MessagingError) {
                try await server.start()
                return nil
            } catch {
                return error
            }
        }
        var entered = publisher.entered.stream.makeAsyncIterator()
        _ = await entered.next()  // start() is now inside publishService
        let port = try #require(server.port)
        await server.stop()
        publisher.release.continuation.yield()
        let error: MessagingError? = await starting.value
        #expect(error?.code == .stopped)
        let publication = try #require(publisher.published.withLock { $0 })
        #expect(publication.unpublished.withLock { $0 })
        #expect(server.port == nil && server.publishedName == nil)
        // Nothing listens on the port any more.
        #expect(throws: (any Error).self) {
            _ = try TCPProbe.connect(port: port)
        }
        var events = server.events.makeAsyncIterator()
        let next = await events.next()
        #expect(next == nil)
    }

    /// Without a stop, the same gate lets the server run with its publication.
    @Test func startCompletesWhenThePublicationArrives() async throws {
        let publisher = GatedPublisher()
        let server = try await publisher.startedServer(name: "Gate")
        #expect(server.publishedName == "Gate")
        await server.stop()
        #expect(publisher.published.withLock { $0 }?.unpublished.withLock { $0 } == true)
    }
}

/// The server's background work (the handshake of each accepted socket, the forwarding of its
/// publication's events) runs as children of one root task (`ServerWork`), which `stop()` ends.
@Suite struct ServerWorkTests {
    @Test func stopEndsTheServersBackgroundWork() async throws {
        let publisher = GatedPublisher()
        let server = try await publisher.startedServer(name: "Work")
        let work = try #require(server.withState { $0.lifecycle.running?.work })

        // The forwarding job: a publication event reaches the server's events.
        let publication = try #require(publisher.published.withLock { $0 })
        publication.continuation.yield(.established(name: "Work"))
        var events = server.events.makeAsyncIterator()
        let first = await events.next()
        guard case .published(let name)? = first else {
            Issue.record("expected .published, got \(String(describing: first))")
            return
        }
        #expect(name == "Work")

        // A handshake job: a socket that connects, is admitted (its handshake runs), then closes
        // without a word; its job ends with the failed handshake.
        let port = try #require(server.port)
        let fd = try TCPProbe.open(port: port)
        try await waitUntil("the connection's handshake job started") { server.withState { $0.registry.pending } == 1 }
        close(fd)
        try await waitUntil("the handshake job ended") { server.withState { $0.registry.pending } == 0 }

        await server.stop()
        #expect(!work.run {}, "the stopped server's work takes no more jobs")
        let ended = Locked(false)
        let waiting = Task {
            await work.ended()
            ended.withLock { $0 = true }
        }
        try await waitUntil("the server's root task ended after stop()", timeout: .seconds(15)) {
            ended.withLock { $0 }
        }
        _ = await waiting.value
    }
}

extension ServerWorkTests {
    /// A peer that connected and said nothing: its handshake (hello timeout 10 s) is aborted by
    /// `stop()`, which returns only once it ended — its place is free and its socket closed when
    /// `stop()` returns, not 10 s later.
    @Test func stopAbortsTheHandshakesStillRunningAndWaitsForThem() async throws {
        let publisher = GatedPublisher()
        let server = try await publisher.startedServer(name: "Silent")
        let work = try #require(server.withState { $0.lifecycle.running?.work })
        let port = try #require(server.port)
        let fd = try TCPProbe.open(port: port)
        defer { close(fd) }
        try await waitUntil("the silent connection's handshake job started") { server.withState { $0.registry.pending } == 1 }

        await server.stop()
        #expect(server.withState { $0.registry.pending } == 0, "the handshake ended before stop() returned")
        #expect(!work.run {}, "the stopped server's work takes no more jobs")
        // The server's side of the socket is closed: the peer reads the end after whatever the
        // server said first (each read waits at most 5 s: a deadline, not a sleep).
        var ended = false
        var buffer = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<64 where !ended {
            var pollFD = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pollFD, 1, 5_000) == 1 else { break }
            ended = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT)) <= 0
        }
        #expect(ended, "the server closed the silent connection")
    }
}

/// A blocking TCP connect to 127.0.0.1 (throws when nothing listens).
enum TCPProbe {
    static func connect(port: UInt16) throws -> Int32 {
        close(try open(port: port))
        return 0
    }

    /// A TCP connection to 127.0.0.1 left open: its descriptor (the caller closes it).
    static func open(port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let code = errno
            close(fd)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
        return fd
    }
}

/// `stop()` waits for its connections to close after GOODBYE, and no longer than its grace period.
@Suite(.serialized) struct StopGraceTests {
    /// A peer that never closes its side after the GOODBYE (the server would linger 2 s for it) is
    /// aborted when the grace period ends, while a well-behaved client closes at once; both are
    /// reported closed.
    @Test func aPeerThatNeverClosesIsAbortedAfterTheGracePeriod() async throws {
        let harness = try await LoopbackServer(security: .plaintext) { $0.stopGracePeriod = .milliseconds(300) }
        let stubborn = try HostilePeer(port: harness.port)
        stubborn.hello()
        let client = try await harness.client("polite")
        try await harness.events.waitForCount("two accepted", 2) { if case .accepted = $0 { true } else { false } }
        let start = ContinuousClock.now
        await harness.server.stop()
        let took = ContinuousClock.now - start
        // Aborted at the grace period's end, not after the 2-s linger.
        #expect(took < .milliseconds(1_500), "stop() took \(took)")
        // (The events reach the harness's log from its own task: waited for, not counted at once.)
        try await harness.events.waitForCount("both reported closed", 2) { if case .closed = $0 { true } else { false } }
        #expect(await offThePool { stubborn.serverClosed() })
        _ = client
    }
}

extension StopGraceTests {
    /// A `stop()` called while another runs returns when that one did — it returned at once, the
    /// listener perhaps still open and a peer not yet aborted (`ServerSimulation` found it).
    @Test func aSecondStopReturnsWhenTheFirstDid() async throws {
        let harness = try await LoopbackServer(security: .plaintext) { $0.stopGracePeriod = .milliseconds(500) }
        let stubborn = try HostilePeer(port: harness.port)  // holds the first stop for its grace period
        stubborn.hello()
        try await harness.events.waitForCount("accepted", 1) { if case .accepted = $0 { true } else { false } }
        let first = Task { await harness.server.stop() }
        try await waitUntil("the first stop runs") { harness.server.withState { $0.lifecycle.isStopping } }
        await harness.server.stop()
        let stoppedThen = harness.server.withState { $0.lifecycle.isStopped }
        #expect(stoppedThen, "the second stop() returned while the first still ran")
        await first.value
        #expect(await offThePool { stubborn.serverClosed() })
        await harness.server.stop()  // a third, after both: returns at once
    }
}

extension StopGraceTests {
    /// The grace periods' timers belong to the server: a session whose client was lost waits for
    /// an hour, `stop()` cancels its timer, and the server is gone from memory once the app lets it
    /// go (a global Dispatch timer held it, and the session, for the whole hour).
    @Test func stopCancelsTheGraceTimersAndTheServerIsReleased() async throws {
        final class Weak: @unchecked Sendable {  // set once, before it is read
            weak var server: MessageServer?
        }
        let released = Weak()
        try await {
            var configuration = ServerConfiguration(serviceType: "_test._tcp", serviceName: "Grace")
            configuration.publish = false
            configuration.listener.loopbackOnly = true
            configuration.session = SessionConfiguration()
            configuration.session?.gracePeriod = .seconds(3_600)
            let server = MessageServer(configuration: configuration, discovery: nil, logger: testLogger())
            try await server.start()
            released.server = server
            let port = try #require(server.port)
            var clientConfiguration = ClientConfiguration(peerName: "leaver")
            clientConfiguration.channel.offersSessions = true
            let channel = try await MessageChannel.connect(
                to: [try SocketAddress(ipAddress: "127.0.0.1", port: port)],
                configuration: clientConfiguration.channel, logger: testLogger())
            _ = try await channel.openSession(
                MessageSession(id: MessageSession.makeID(), configuration: SessionConfiguration(), logger: testLogger()),
                timeout: .seconds(5))
            try await waitUntil("the session is open") { server.connections.first?.session != nil }
            channel.abort()
            try await waitUntil("the lost session waits for its client") { server.timers.count == 1 }
            await server.stop()
            #expect(server.timers.count == 0, "stop() cancelled the grace timer")
        }()
        try await waitUntil("the stopped server is released") { released.server == nil }
    }
}

extension StopGraceTests {
    /// Once `stop()` cancelled the grace timers, a connection that closes meanwhile arms none (it
    /// would hold its connection for the grace period, or end a session `stop()` keeps); `stop()`'s
    /// own deadline is still armed.
    @Test func noGraceTimerIsArmedOnceStopping() {
        let timers = ServerTimers()
        timers.schedule(after: .seconds(3_600)) {}
        #expect(timers.count == 1)
        timers.cancelAll()
        #expect(timers.count == 0)
        timers.schedule(after: .seconds(3_600)) { Issue.record("a grace timer armed while stopping") }
        #expect(timers.count == 0, "refused while stopping")
        let deadline = timers.schedule(after: .seconds(3_600), whileStopping: true) {}
        #expect(timers.count == 1, "stop()'s own deadline is armed")
        timers.cancel(deadline)
        #expect(timers.count == 0)
    }
}
