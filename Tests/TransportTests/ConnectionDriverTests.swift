import Dispatch
import Logging
import Synchronization
import Testing

@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

#if canImport(Glibc)
    import Glibc
#endif

/// `ConnectionDriver` alone, over a socket pair: frames in order with their sequence numbers, the
/// graceful close that flushes first, the peer's limits and protocol errors, deadlines. No
/// channel, no hello, no listener: what Transport promises the floor above it.
@Suite(.timeLimit(.minutes(1))) struct ConnectionDriverTests {
    /// What a driver reported, in order.
    enum Event: Equatable, Sendable {
        case frame(FrameKind, sequence: UInt64, payload: String)
        case deadline(Deadlines.Kind)
        case closed(CloseReason)
    }

    /// A handler that passes every report on as an ``Event`` (called on the driver's loop).
    final class Recorder: ConnectionHandler, Sendable {
        let events: AsyncStream<Event>
        private let sink: AsyncStream<Event>.Continuation

        init() { (events, sink) = AsyncStream.makeStream(of: Event.self) }

        func connection(_ connection: ConnectionDriver, received frame: Frame) {
            sink.yield(.frame(frame.kind, sequence: frame.sequence, payload: String(decoding: frame.payload, as: UTF8.self)))
        }
        func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) { sink.yield(.deadline(kind)) }
        func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
            sink.yield(.closed(reason))
            sink.finish()
        }
    }

    static let logger = Logger(label: "driver-test")

    /// A connected, nonblocking `AF_UNIX` stream pair.
    static func socketPair() throws -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        try #require(socketpair(AF_UNIX, type, 0, &fds) == 0)
        return (fds[0], fds[1])
    }

    /// A started driver on `fd` and what it reports.
    static func driver(_ fd: Int32, _ configuration: ConnectionConfiguration = ConnectionConfiguration()) -> (ConnectionDriver, Recorder) {
        let driver = ConnectionDriver(fd: FileDescriptor(fd), loop: LoopGroup.shared.next(), configuration: configuration, logger: logger)
        let recorder = Recorder()
        driver.queue.sync { driver.start(handler: recorder) }
        return (driver, recorder)
    }

    static func message(_ text: String) -> Frame { Frame(kind: .message, typeID: "test", payload: Array(text.utf8)) }

    /// The next `count` events (the suite's time limit bounds the wait).
    static func take(_ count: Int, from recorder: Recorder) async -> [Event] {
        var taken: [Event] = []
        for await event in recorder.events {
            taken.append(event)
            if taken.count == count { break }
        }
        return taken
    }

    @Test func framesArriveInOrderNumberedFromOneInEachDirection() async throws {
        let (a, b) = try Self.socketPair()
        let (client, clientEvents) = Self.driver(a)
        let (server, serverEvents) = Self.driver(b)
        defer { client.abort(.localClose); server.abort(.localClose) }
        for text in ["one", "two", "three"] { _ = try await client.send(Self.message(text)) }
        #expect(
            await Self.take(3, from: serverEvents) == [
                .frame(.message, sequence: 1, payload: "one"), .frame(.message, sequence: 2, payload: "two"),
                .frame(.message, sequence: 3, payload: "three"),
            ])
        #expect(try await server.send(Self.message("back")) == 1)  // each direction counts on its own
        #expect(await Self.take(1, from: clientEvents) == [.frame(.message, sequence: 1, payload: "back")])
    }

    /// A graceful close writes every frame the queue admitted before it, then the peer sees the end
    /// of the stream; senders still waiting for room (past the high-water mark) fail with the close.
    @Test func aGracefulCloseFlushesWhatWasAdmittedAndFailsTheWaiting() async throws {
        let (a, b) = try Self.socketPair()
        let (client, clientEvents) = Self.driver(a)
        let (server, serverEvents) = Self.driver(b)
        defer { server.abort(.localClose) }
        final class Outcomes: Sendable {
            let sent = Mutex<[UInt64]>([])
            let failed = Mutex<[TransportError]>([])
        }
        let outcomes = Outcomes()
        let payload = String(repeating: "x", count: 10_000)
        client.queue.sync {
            for _ in 0..<200 {  // 2 MB: past the 1 MiB high-water mark, and more than the socket holds
                client.enqueue(Self.message(payload)) { result in
                    switch result {
                    case .success(let sequence): outcomes.sent.withLock { $0.append(sequence) }
                    case .failure(let error): outcomes.failed.withLock { $0.append(error) }
                    }
                }
            }
            client.closeGracefully()
        }
        #expect(await client.closed() == .localClose)
        let sent = outcomes.sent.withLock { $0 }
        let failed = outcomes.failed.withLock { $0 }
        #expect(sent.count + failed.count == 200)
        #expect(sent == Array(1...UInt64(sent.count)) && sent.count >= 100 && !failed.isEmpty)
        #expect(failed.allSatisfy { $0.closeReason == .localClose })

        let events = await Self.take(sent.count + 1, from: serverEvents)
        #expect(events.count == sent.count + 1)
        #expect(
            events.dropLast().enumerated().allSatisfy { index, event in
                event == .frame(.message, sequence: UInt64(index + 1), payload: payload)
            })
        #expect(events.last == .closed(.closedByPeer))
        #expect(await Self.take(1, from: clientEvents) == [.closed(.localClose)])
    }

    /// A frame larger than this side's limit closes the connection before its body is read.
    @Test func aFrameOverTheLimitClosesWithFrameTooLarge() async throws {
        let (a, b) = try Self.socketPair()
        let (client, _) = Self.driver(a)
        var small = ConnectionConfiguration()
        small.maxFrameSize = 1_024
        let (server, serverEvents) = Self.driver(b, small)
        defer { client.abort(.localClose) }
        _ = try await client.send(Self.message("fits"))
        _ = try await client.send(Self.message(String(repeating: "y", count: 2_000)))
        let events = await Self.take(2, from: serverEvents)
        #expect(events.first == .frame(.message, sequence: 1, payload: "fits"))
        guard case .closed(.frameTooLarge(let size, let limit)) = events.last else {
            Issue.record("expected a close for the large frame, got \(events)")
            return
        }
        #expect(size > 2_000 && limit == 1_024)
        #expect(server.isClosed)
    }

    /// Bytes that are not this protocol's (here a frame numbered 5 first) close with a protocol
    /// error that says what was wrong; nothing reaches the handler.
    @Test func aFrameOutOfSequenceClosesWithAProtocolError() async throws {
        let (a, b) = try Self.socketPair()
        defer { close(a) }
        let (_, serverEvents) = Self.driver(b)
        let frame = Frame(kind: .message, typeID: "test", sequence: 5, payload: Array("early".utf8))
        var bytes = [UInt8](repeating: 0, count: 4 + frame.bodySize)
        bytes.withUnsafeMutableBytes { frame.write(into: $0) }
        #expect(bytes.withUnsafeBytes { write(a, $0.baseAddress, $0.count) } == bytes.count)
        let events = await Self.take(1, from: serverEvents)
        guard case .closed(.protocolError(let text)) = events.first else {
            Issue.record("expected a protocol error, got \(events)")
            return
        }
        #expect(text.contains("sequence number 5 where 1 was expected"))
    }

    /// A deadline the owner sets reaches the handler once it passed; one moved later fires at the
    /// later time, after a deadline of another kind set for earlier.
    @Test func deadlinesReachTheHandler() async throws {
        let (a, b) = try Self.socketPair()
        defer { close(b) }
        let (driver, events) = Self.driver(a)
        defer { driver.abort(.localClose) }
        driver.queue.sync {
            let now = uptimeNanoseconds()
            driver.setDeadline(.request, at: now + 5_000_000)
            driver.setDeadline(.request, at: now + 40_000_000)  // moved: not at 5 ms
            driver.setDeadline(.ack, at: now + 10_000_000)
        }
        #expect(await Self.take(2, from: events) == [.deadline(.ack), .deadline(.request)])
    }
    /// A connection aborted before it started (from another context: a cancelled handshake)
    /// tells the handler it is given of the close at once; before, it said nothing, and whoever
    /// waited on the handler waited forever.
    @Test func aConnectionClosedBeforeItStartsTellsItsHandlerAtOnce() async throws {
        let (a, b) = try Self.socketPair()
        defer { close(b) }
        let driver = ConnectionDriver(fd: FileDescriptor(a), loop: LoopGroup.shared.next(), configuration: ConnectionConfiguration(), logger: Self.logger)
        driver.abort(.localClose)
        let recorder = Recorder()
        driver.queue.async { driver.start(handler: recorder) }
        #expect(await Self.take(1, from: recorder) == [.closed(.localClose)])
    }
}
