import ProtocolCore
import Dispatch
import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A configuration's values in one immutable object, replaced (not mutated) on change: copies of
/// the configuration share it, so thousands of connections made with one configuration hold one
/// pointer each instead of their own copy of every field.
struct SharedValues<Values: Sendable>: Sendable {
    private final class Box: Sendable {
        let values: Values
        init(_ values: Values) { self.values = values }
    }

    private var box: Box

    init(_ values: Values) { box = Box(values) }

    var values: Values { box.values }

    mutating func update(_ body: (inout Values) -> Void) {
        var values = box.values
        body(&values)
        box = Box(values)
    }
}

/// Frame-level settings of a connection.
public struct ConnectionConfiguration: Sendable {
    // Shared immutable storage, replaced on change (see SharedValues).
    struct Values: Sendable {
        var maxFrameSize: Int = 16 * 1024 * 1024
        var sendHighWaterMark: Int = 1024 * 1024
        var sendLowWaterMark: Int = 256 * 1024
        var idleTimeout: Duration? = nil
        var closeLinger: Duration = .seconds(2)
        var readBufferSize: Int = 64 * 1024
    }

    private var storage: SharedValues<Values>

    /// The largest accepted frame body in bytes (default 16 MiB). Larger length prefixes close the
    /// connection with ``CloseReason/frameTooLarge(size:limit:)`` before anything is allocated.
    public var maxFrameSize: Int {
        get { storage.values.maxFrameSize }
        set { storage.update { $0.maxFrameSize = newValue } }
    }

    /// Senders suspend while more than this many bytes are queued for the socket (default 1 MiB).
    public var sendHighWaterMark: Int {
        get { storage.values.sendHighWaterMark }
        set { storage.update { $0.sendHighWaterMark = newValue } }
    }

    /// Suspended senders resume once the queue drains to this many bytes (default 256 KiB).
    public var sendLowWaterMark: Int {
        get { storage.values.sendLowWaterMark }
        set { storage.update { $0.sendLowWaterMark = newValue } }
    }

    /// Close with ``CloseReason/idleTimeout`` when no complete frame arrived for this long (nil: never).
    public var idleTimeout: Duration? {
        get { storage.values.idleTimeout }
        set { storage.update { $0.idleTimeout = newValue } }
    }

    /// How long a graceful close waits for the peer to close its side after ours was shut down.
    public var closeLinger: Duration {
        get { storage.values.closeLinger }
        set { storage.update { $0.closeLinger = newValue } }
    }

    /// Size of the reusable read buffer (default 64 KiB).
    public var readBufferSize: Int {
        get { storage.values.readBufferSize }
        set { storage.update { $0.readBufferSize = newValue } }
    }

    /// Creates the default configuration.
    public init() { storage = SharedValues(Values()) }
}

/// Bytes waiting to be written: either one allocation holding a whole encoded frame (or only its
/// header), or a large payload array written in place (no copy; its own iovec).
final class WireBuffer {
    /// Payloads at least this large are not copied into the frame's buffer.
    static let inPlacePayloadThreshold = 16 * 1024

    let base: UnsafeRawPointer
    let count: Int
    private let owned: UnsafeMutableRawBufferPointer?
    private let payload: [UInt8]?

    /// The whole frame (`includePayload`) or everything but its payload, in one allocation.
    init(frame: Frame, size: Int, includePayload: Bool = true) {
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 8)
        frame.write(into: bytes, includePayload: includePayload)
        owned = bytes
        payload = nil
        base = UnsafeRawPointer(bytes.baseAddress!)
        count = size
    }

    /// A payload written from the array's own storage. The array is kept alive and never mutated,
    /// so its storage (and `base`) stays valid for this object's lifetime.
    init(payload: [UInt8]) {
        self.payload = payload
        owned = nil
        base = payload.withUnsafeBytes { UnsafeRawPointer($0.baseAddress!) }
        count = payload.count
    }

    deinit { owned?.deallocate() }

    /// Appends the buffers of one frame of `size` bytes (length prefix included) to `output`.
    static func append(_ frame: Frame, size: Int, to output: inout [WireBuffer], sizes: inout [Int]) {
        if frame.payload.count >= inPlacePayloadThreshold {
            let header = size - frame.payload.count
            output.append(WireBuffer(frame: frame, size: header, includePayload: false))
            sizes.append(header)
            output.append(WireBuffer(payload: frame.payload))
            sizes.append(frame.payload.count)
        } else {
            output.append(WireBuffer(frame: frame, size: size))
            sizes.append(size)
        }
    }
}

/// The read buffer of the current thread. A connection reads on whichever Dispatch worker runs its
/// queue and copies the bytes into its ``FrameDecoder`` before the event handler returns, so one
/// buffer per thread serves every connection, and an idle connection holds no read buffer at all.
enum ReadScratch {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let status = pthread_key_create(&key) { pointer in
            pointer?.deallocate()
        }
        precondition(status == 0, "pthread_key_create failed: \(status)")
        return key
    }()

    /// At least `minimumSize` bytes, valid on this thread until the next call on this thread.
    static func buffer(minimumSize: Int) -> UnsafeMutableRawBufferPointer {
        // Layout: one Int (the capacity), then the bytes.
        let header = MemoryLayout<Int>.stride
        if let pointer = pthread_getspecific(key) {
            let capacity = pointer.load(as: Int.self)
            if capacity >= minimumSize {
                return UnsafeMutableRawBufferPointer(start: pointer + header, count: capacity)
            }
            pointer.deallocate()
        }
        let pointer = UnsafeMutableRawPointer.allocate(byteCount: header + minimumSize, alignment: 16)
        pointer.storeBytes(of: minimumSize, as: Int.self)
        pthread_setspecific(key, pointer)
        return UnsafeMutableRawBufferPointer(start: pointer + header, count: minimumSize)
    }
}

/// The serial queues connections run on: one per core, like an event-loop group. Each connection
/// is assigned one (round robin) and does all its work there, so at most this many threads run
/// connection work at once — thousands of connections do not make Dispatch spawn dozens of threads
/// (each with a stack, a read buffer and malloc caches) — and an idle connection holds no queue of
/// its own.
enum ConnectionLoops {
    /// Each loop queue's index (also visible from any queue that targets it).
    static let key = DispatchSpecificKey<Int>()
    static let loops: [DispatchQueue] = {
        let count = max(1, min(sysconf(Int32(_SC_NPROCESSORS_ONLN)), 64))
        return (0..<count).map { index in
            let loop = DispatchQueue(label: "transport.loop.\(index)")
            loop.setSpecific(key: key, value: index)
            return loop
        }
    }()
    private static let counter = Lock()
    nonisolated(unsafe) private static var nextIndex = 0  // guarded by counter

    /// The loop for a new connection, round robin: its index and queue.
    static func next() -> (index: Int, queue: DispatchQueue) {
        let index = counter.withLock { () -> Int in
            defer { nextIndex &+= 1 }
            return nextIndex % loops.count
        }
        return (index, loops[index])
    }

    /// The loop running the current code, if any.
    static var current: Int? { DispatchQueue.getSpecific(key: key) }
}

/// When the current thread last sent a frame on the fast path (any connection), in uptime nanoseconds.
enum SendPacing {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let status = pthread_key_create(&key) { pointer in pointer?.deallocate() }
        precondition(status == 0, "pthread_key_create failed: \(status)")
        return key
    }()

    /// Stores `now` for this thread and returns the previous value (0 the first time).
    static func exchange(_ now: UInt64) -> UInt64 {
        let slot: UnsafeMutablePointer<UInt64>
        if let pointer = pthread_getspecific(key) {
            slot = pointer.assumingMemoryBound(to: UInt64.self)
        } else {
            slot = .allocate(capacity: 1)
            slot.initialize(to: 0)
            pthread_setspecific(key, slot)
        }
        defer { slot.pointee = now }
        return slot.pointee
    }
}

/// A nonblocking TCP connection exchanging ``Frame``s.
///
/// One serial queue (one of the ``ConnectionLoops``, shared with other connections), one read and
/// one write Dispatch source; the fd is closed only after both sources' cancel handlers ran. The
/// write source is resumed only while output is pending.
/// Outbound sequence numbers are assigned here, at the moment a frame enters the send queue, so
/// they always match the order on the wire.
///
/// Sending has a fast path: while the send queue is below the high-water mark, ``send(_:bypassLimit:)``
/// numbers the frame and appends it to a lock-protected inbox without hopping onto ``queue``; one
/// `queue.async` drains everything that piled up meanwhile and writes it with one `sendmsg`. Every
/// path that admits frames on ``queue`` drains the inbox first, under the same lock that hands out
/// sequence numbers, so numbers still match the order on the wire.
///
/// `@unchecked Sendable`: every mutable field is confined to ``queue``, except the fields marked
/// "guarded by sendLock".
final class Connection: @unchecked Sendable {
    enum State {
        case idle, open, flushing, halfClosed
        case closed(CloseReason)
    }

    // Field order matters for memory: Swift lays fields out in declaration order, so the small
    // ones sit together (and in the padding after 17-byte enums) instead of each taking 8 bytes.
    // An idle connection's size is measured by benchmark W5.
    let queue: DispatchQueue
    let fd: Int32
    /// The index of the loop that ``queue`` is (see ``ConnectionLoops``).
    let loop: Int32
    /// The logger given to init, without per-connection metadata (shared, costs nothing per connection).
    private let baseLogger: Logger
    /// This connection's logger: the given one with `peer` metadata. Built on each use: copying the
    /// metadata costs about 450 bytes, too much to keep for each of thousands of idle connections.
    var logger: Logger {
        var logger = baseLogger
        logger[metadataKey: "peer"] = "\(remoteAddress.map { "\($0)" } ?? "?")"
        return logger
    }
    let configuration: ConnectionConfiguration
    let remoteAddress: SocketAddress?
    let localAddress: SocketAddress?

    private(set) var state: State = .idle
    private var writeSourceResumed = false
    private var isFlushing = false
    private var cancelledSources: UInt8 = 0
    private var sourcesToCancel: UInt8 = 0
    private var readPauseCount: Int32 = 0
    /// The socket's `SO_RCVLOWAT` (1 unless a large payload is being received; see handleReadable()).
    private(set) var receiveLowWater: Int32 = 1
    private var readSource: (any DispatchSourceRead)?
    private var writeSource: (any DispatchSourceWrite)?
    private var decoder: FrameDecoder
    private var output: [WireBuffer] = []
    private var outputHead = 0
    private var outputOffset = 0  // bytes of output[outputHead] already written
    private var outputSizes: [Int] = []
    private(set) var queuedBytes = 0
    private var waiters: [(Frame, (Result<UInt64, TransportError>) -> Void)] = []
    private var waitersHead = 0
    private let sendLock = Lock()
    private var drainScheduled = false  // guarded by sendLock
    private var acceptingFastSends = false  // guarded by sendLock: state is .open
    private var nextSequence: UInt64 = 1  // guarded by sendLock
    private var inbox = Inbox()  // guarded by sendLock
    private var lastFastSend: UInt64 = 0  // guarded by sendLock: uptime (ns) of the last fast-path send
    /// A sender that sends again within this time is streaming: its frames are batched through the
    /// inbox (one `sendmsg` per batch) instead of written one by one. Checked per connection and per
    /// thread (a broadcast loop sends to many connections back to back: each connection sees a
    /// gap, the thread does not).
    private static let streamingGap: UInt64 = 20_000
    private var unsentBytes = 0  // guarded by sendLock: inbox + output bytes not yet written
    private var slowSenders = 0  // guarded by sendLock: senders waiting in the slow path
    private var peerCloseReason: CloseReason?
    private var idleTimer: (any DispatchSourceTimer)?
    private var lingerTimer: DispatchWorkItem?
    private(set) var lastFrameTime = DispatchTime.now()
    private var closeWaiters: [CheckedContinuation<CloseReason, Never>] = []
    private var onFrame: ((Frame) -> Void)?
    private var onClose: ((CloseReason) -> Void)?

    /// The sequence number the next frame will get (tests count pings with it).
    var nextSequenceForTests: UInt64 { sendLock.withLock { nextSequence } }

    /// The largest number of queued bytes seen (for tests of the bounded send queue).
    private(set) var maxQueuedBytes = 0

    init(fd: Int32, configuration: ConnectionConfiguration, logger: Logger) {
        self.fd = fd
        self.configuration = configuration
        self.remoteAddress = SocketOps.remoteAddress(fd)
        self.localAddress = SocketOps.localAddress(fd)
        self.baseLogger = logger
        let loop = ConnectionLoops.next()
        self.loop = Int32(loop.index)
        self.queue = loop.queue
        self.decoder = FrameDecoder(maxFrameSize: configuration.maxFrameSize)
        var one: Int32 = 1
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }


    /// Runs `body` on this connection's queue and returns its result: directly when already on
    /// it (e.g. from a handler of another connection of the same loop), else with `queue.sync`.
    func onQueue<T>(_ body: () -> T) -> T {
        ConnectionLoops.current == Int(loop) ? body() : queue.sync(execute: body)
    }

    var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }

    var closeReason: CloseReason? {
        if case .closed(let reason) = state { return reason }
        return nil
    }

    var isReadPaused: Bool { readPauseCount > 0 }

    // MARK: Lifecycle

    /// Starts reading. Must be called on ``queue`` once. `onFrame` and `onClose` run on ``queue``.
    func start(onFrame: @escaping (Frame) -> Void, onClose: @escaping (CloseReason) -> Void) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard case .idle = state else { return }
        state = .open
        sendLock.withLock { acceptingFastSends = true }
        self.onFrame = onFrame
        self.onClose = onClose
        lastFrameTime = .now()
        let read = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        read.setEventHandler { [unowned self] in self.handleReadable() }
        // The cancel handler is set in teardown(), right before cancel(): a handler costs a block
        // and a Dispatch continuation (~150 bytes) for the connection's whole life otherwise.
        readSource = read
        read.resume()
        // The write source is made on the first write that would block (see resumeWriteSource()):
        // most frames are written at once, and an idle connection then costs one source, not two.
        if let idle = configuration.idleTimeout {
            let timer = DispatchSource.makeTimerSource(queue: queue)
            let tick = max(idle / 4, .milliseconds(10))
            timer.schedule(deadline: .now() + tick.timeInterval, repeating: tick.timeInterval)
            timer.setEventHandler { [weak self] in self?.checkIdle(idle) }
            timer.resume()
            idleTimer = timer
        }
    }

    /// The fd is closed only after every source's cancel handler ran (GCDAsyncSocket pattern).
    private func sourceCancelled() {
        cancelledSources += 1
        if cancelledSources == sourcesToCancel {
            logger.trace("all sources cancelled, closing fd \(fd)")
            closeFD(fd)
        }
    }

    /// Replaces the frame and close handlers (the handshake hands over to the channel). On ``queue``.
    func setHandlers(onFrame: @escaping (Frame) -> Void, onClose: @escaping (CloseReason) -> Void) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !isClosed else { return }
        self.onFrame = onFrame
        self.onClose = onClose
    }

    private func checkIdle(_ idle: Duration) {
        guard !isClosed else { return }
        if readPauseCount > 0 {
            lastFrameTime = .now()
            return
        }
        if DispatchTime.now().uptimeNanoseconds - lastFrameTime.uptimeNanoseconds > idle.nanoseconds {
            let buffered = decoder.bufferedByteCount
            logger.warning("closing: no complete frame for \(idle) (\(buffered) bytes of a partial frame buffered)")
            teardown(.idleTimeout)
        }
    }

    /// Waits until the connection is closed and returns why. Callable from any context.
    func closed() async -> CloseReason {
        await withCheckedContinuation { continuation in
            queue.async {
                if let reason = self.closeReason {
                    continuation.resume(returning: reason)
                } else {
                    self.closeWaiters.append(continuation)
                }
            }
        }
    }

    /// Graceful close: stop accepting new frames, flush the queue, shut down writing, wait briefly
    /// for the peer's end of file, then close. On ``queue``.
    func closeGracefully(reason: CloseReason? = nil) {
        dispatchPrecondition(condition: .onQueue(queue))
        if let reason, peerCloseReason == nil { peerCloseReason = reason }
        switch state {
        case .idle:
            teardown(reason ?? .localClose)
        case .open:
            drainInbox()
            state = .flushing
            sendLock.withLock { acceptingFastSends = false }
            failWaiters(TransportError.closed(peerCloseReason ?? .localClose))
            if queuedBytes == 0 { shutdownWrite() } else { resumeWriteSource() }
        case .flushing, .halfClosed, .closed:
            break
        }
    }

    /// Records why the peer is closing (for example its GOODBYE), then closes gracefully.
    func peerIsClosing(_ reason: CloseReason) {
        peerCloseReason = reason
        closeGracefully()
    }

    private func shutdownWrite() {
        state = .halfClosed
        _ = shutdown(fd, Int32(SHUT_WR))
        let item = DispatchWorkItem { [weak self] in
            guard let self, !self.isClosed else { return }
            self.teardown(self.peerCloseReason ?? .localClose)
        }
        lingerTimer = item
        queue.asyncAfter(deadline: .now() + configuration.closeLinger.timeInterval, execute: item)
    }

    /// Closes now, with `reason`. Idempotent. On ``queue``.
    func teardown(_ reason: CloseReason) {
        dispatchPrecondition(condition: .onQueue(queue))
        if case .closed = state { return }
        let wasStarted: Bool
        if case .idle = state { wasStarted = false } else { wasStarted = true }
        state = .closed(reason)
        switch reason {
        case .localClose, .goodbye, .closedByPeer: logger.debug("connection closed: \(reason)")
        default: logger.info("connection closed: \(reason)")
        }
        lingerTimer?.cancel()
        lingerTimer = nil
        idleTimer?.cancel()
        idleTimer = nil
        failWaiters(TransportError.closed(reason))
        output.removeAll()
        outputSizes.removeAll()
        outputHead = 0
        outputOffset = 0
        queuedBytes = 0
        sendLock.withLock {
            // Frames still in the inbox are dropped like frames in the output queue.
            acceptingFastSends = false
            inbox = Inbox()
            unsentBytes = 0
        }
        if wasStarted, let read = readSource {
            sourcesToCancel = writeSource == nil ? 1 : 2
            // Setting a cancel handler on an active source is allowed; Dispatch applies it as a
            // barrier on the source, which runs before the cancellation is processed.
            read.setCancelHandler { [self] in self.sourceCancelled() }
            read.cancel()
            if readPauseCount > 0 { read.resume() }  // a suspended source never runs its cancel handler
            if let write = writeSource {
                write.setCancelHandler { [self] in self.sourceCancelled() }
                write.cancel()
                if !writeSourceResumed { write.resume() }
            }
            readSource = nil
            writeSource = nil
        } else {
            closeFD(fd)
        }
        let handler = onClose
        onClose = nil
        onFrame = nil
        handler?(reason)
        let waiting = closeWaiters
        closeWaiters.removeAll()
        for waiter in waiting { waiter.resume(returning: reason) }
    }

    // MARK: Reading

    /// Stops reading the socket until a matching ``resumeReading()`` (calls are counted). On ``queue``.
    func pauseReading() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !isClosed else { return }
        readPauseCount += 1
        if readPauseCount == 1 {
            logger.trace("reading paused (consumer is slow)")
            readSource?.suspend()
        }
    }

    /// Balances one ``pauseReading()``. On ``queue``.
    func resumeReading() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !isClosed, readPauseCount > 0 else { return }
        readPauseCount -= 1
        if readPauseCount == 0 {
            logger.trace("reading resumed")
            lastFrameTime = .now()
            readSource?.resume()
        }
    }

    /// The largest `SO_RCVLOWAT` asked for: the kernel grows the receive buffer to hold it.
    static let maxReceiveLowWater = 1024 * 1024

    /// Sets `SO_RCVLOWAT` to `bytes` (at least 1) when it differs from the current value.
    private func setReceiveLowWater(_ bytes: Int) {
        var value = Int32(clamping: max(bytes, 1))
        guard value != receiveLowWater else { return }
        if setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &value, socklen_t(MemoryLayout<Int32>.size)) == 0 {
            receiveLowWater = value
        }
    }

    private func handleReadable() {
        for _ in 0..<8 {
            guard readPauseCount == 0 else { return }
            switch state {
            case .open, .flushing, .halfClosed: break
            case .idle, .closed: return
            }
            var result: IOResult<Int> = .wouldBlock
            var failure: TransportError?
            if decoder.missingPayloadBytes > 0 {
                // A large payload: read straight into its array (no reassembly copies).
                decoder.fillPayload { space in
                    do throws(TransportError) {
                        result = try syscall("read", nonblocking: true) { read(fd, space.baseAddress, space.count) }
                    } catch {
                        failure = error
                    }
                    if case .processed(let count) = result { return count }
                    return 0
                }
            } else {
                let readBuffer = ReadScratch.buffer(minimumSize: max(configuration.readBufferSize, 4096))
                do {
                    result = try syscall("read", nonblocking: true) {
                        read(fd, readBuffer.baseAddress, readBuffer.count)
                    }
                    if case .processed(let count) = result, count > 0 {
                        decoder.append(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count]))
                    }
                } catch {
                    failure = error
                }
            }
            if let failure {
                teardown(Connection.reason(for: failure))
                return
            }
            switch result {
            case .wouldBlock:
                decoder.releaseStorageIfEmpty()  // the socket is drained: do not hold storage while idle
                // While a large payload is incomplete, ask the kernel to report the socket readable
                // only once the rest (up to 1 MiB) has arrived: one wake-up per megabyte instead of
                // one per few segments. End of file and errors are reported regardless of it.
                setReceiveLowWater(min(decoder.missingPayloadBytes, Connection.maxReceiveLowWater))
                return
            case .processed(0):
                handleEndOfFile()
                return
            case .processed:
                if receiveLowWater > 1 && decoder.missingPayloadBytes == 0 { setReceiveLowWater(1) }
                deliverFrames()
            }
        }
    }

    private func deliverFrames() {
        while true {
            if isClosed { return }
            let frame: Frame?
            do {
                frame = try decoder.next()
            } catch {
                logger.warning("hostile or broken input from \(remoteAddress.map { "\($0)" } ?? "?"): \(error.message)")
                teardown(error.closeReason ?? .protocolError(error.message))
                return
            }
            guard let frame else { return }
            lastFrameTime = .now()
            onFrame?(frame)
        }
    }

    private func handleEndOfFile() {
        if decoder.bufferedByteCount > 0 {
            let text =
                "peer closed the connection in the middle of a frame (\(decoder.bufferedByteCount) bytes buffered)"
            logger.warning("\(text)")
            teardown(.protocolError(text))
        } else if case .halfClosed = state {
            teardown(peerCloseReason ?? .localClose)
        } else {
            teardown(peerCloseReason ?? .closedByPeer)
        }
    }

    static func reason(for error: TransportError) -> CloseReason {
        switch error.errno {
        case ECONNRESET, EPIPE: .reset
        case ETIMEDOUT: .error(ETIMEDOUT)
        case let code?: .error(code)
        case nil: error.closeReason ?? .protocolError(error.message)
        }
    }

    // MARK: Writing

    /// Queues `frame` (its sequence number is assigned here) and calls `completion` on ``queue`` with
    /// the sequence number once the frame is in the send queue. Unless `bypassLimit`, the frame waits
    /// (FIFO) while more than the high-water mark is queued. On ``queue``.
    func enqueue(
        _ frame: Frame, bypassLimit: Bool = false, completion: @escaping (Result<UInt64, TransportError>) -> Void
    ) {
        dispatchPrecondition(condition: .onQueue(queue))
        switch state {
        case .open: break
        case .idle:
            completion(.failure(TransportError(.connectionClosed, "the connection is not started")))
            return
        case .flushing, .halfClosed:
            completion(.failure(TransportError.closed(peerCloseReason ?? .localClose)))
            return
        case .closed(let reason):
            completion(.failure(TransportError.closed(reason)))
            return
        }
        drainInbox()
        if !bypassLimit && (queuedBytes > configuration.sendHighWaterMark || waitersHead < waiters.count) {
            waiters.append((frame, completion))
            return
        }
        admit(frame, completion)
    }

    /// Sends `frames` in order: as one batch through the fast path when the queue is below the
    /// high-water mark and the batch is not larger than it (see ``submitFastBatch(_:sizes:)``), else
    /// one by one through ``send(_:bypassLimit:)``. So the queue never holds more than twice the mark.
    /// Callable from any context.
    func send(contentsOf frames: [Frame]) async throws {
        guard !frames.isEmpty else { return }
        var sizes: [Int] = []
        sizes.reserveCapacity(frames.count)
        for frame in frames { sizes.append(try Frame.validatedSize(frame)) }  // nothing sent if one is invalid
        if case .sent = submitFastBatch(frames, sizes: sizes) { return }
        // Full or closing: one by one through the slow path (which reports the close reason).
        for frame in frames { _ = try await send(frame) }
    }

    /// The fast path for a batch: numbers every frame and appends them to the inbox under one lock
    /// acquisition. When nothing else is unsent, this thread writes the batch itself (up to
    /// ``maxIOVecs`` buffers in one `sendmsg`); the rest goes to the queue with one `queue.async`.
    private func submitFastBatch(_ frames: [Frame], sizes: [Int]) -> FastSend {
        let total = sizes.reduce(0, +)
        var refusal = FastSend.full
        let schedule: Bool? = sendLock.withLock {
            guard acceptingFastSends else {
                refusal = .closed
                return nil
            }
            // A batch larger than the high-water mark goes frame by frame (bounded queue).
            guard slowSenders == 0, unsentBytes <= configuration.sendHighWaterMark,
                total <= configuration.sendHighWaterMark
            else { return nil }
            let idle = unsentBytes == 0
            for index in frames.indices {
                var frame = frames[index]
                frame.sequence = nextSequence
                nextSequence &+= 1
                inbox.append(frame, size: sizes[index])
            }
            unsentBytes += total
            lastFastSend = DispatchTime.now().uptimeNanoseconds
            if idle {
                // Nothing was unsent: nothing can be ahead of the batch, and the queue cannot start
                // writing while we hold the lock (see submitFast).
                unsentBytes -= writeInboxDirectly(maxBuffers: Connection.maxIOVecs)
                if inbox.isEmpty { return false }
            }
            return claimDrain()
        }
        guard let schedule else { return refusal }
        if schedule { scheduleDrain() }
        return .sent(0)
    }

    /// Async form of ``enqueue(_:bypassLimit:completion:)``: suspends while the send queue is above
    /// the high-water mark; returns the frame's sequence number. Callable from any context.
    func send(_ frame: Frame, bypassLimit: Bool = false) async throws -> UInt64 {
        if case .sent(let sequence) = submitFast(frame, bypassLimit: bypassLimit) { return sequence }
        // Slow path: the queue is full (or closing, or the frame is invalid); wait in FIFO order.
        // While any sender waits here, the fast path is closed so nobody overtakes it.
        sendLock.withLock { slowSenders += 1 }
        return try await withCheckedThrowingContinuation { continuation in
            queue.async {
                self.enqueue(frame, bypassLimit: bypassLimit) { result in
                    self.sendLock.withLock { self.slowSenders -= 1 }
                    continuation.resume(with: result)
                }
            }
        }
    }

    /// Frames numbered and encoded by senders on any thread, on their way into the output queue.
    struct Inbox {
        var buffers: [WireBuffer] = []
        var sizes: [Int] = []
        /// Bytes at the start of `buffers[0]` that a direct write already sent.
        var skip = 0
        var isEmpty: Bool { buffers.isEmpty }

        mutating func append(_ frame: Frame, size: Int) {
            WireBuffer.append(frame, size: size, to: &buffers, sizes: &sizes)
        }
    }

    /// The fast path of ``send(_:bypassLimit:)``: numbers and encodes the frame when the connection
    /// is open, nobody waits in the slow path and (unless `bypassLimit`) the unsent bytes are at most
    /// the high-water mark. When nothing at all is unsent, the caller writes the socket itself (no
    /// thread hop; what the socket does not take goes to the inbox); otherwise the frame goes to the
    /// inbox and one `queue.async` moves the inbox into the output queue. Returns `.full` or
    /// `.closed` when the slow path must be taken, `.invalid` for a frame that cannot be encoded.
    private func submitFast(_ frame: Frame, bypassLimit: Bool) -> FastSend {
        guard let size = try? Frame.validatedSize(frame) else { return .invalid }
        var frame = frame
        var refusal = FastSend.full
        let accepted: (sequence: UInt64, schedule: Bool)? = sendLock.withLock {
            guard acceptingFastSends else {
                refusal = .closed
                return nil
            }
            guard slowSenders == 0, bypassLimit || unsentBytes <= configuration.sendHighWaterMark else { return nil }
            frame.sequence = nextSequence
            nextSequence &+= 1
            // Nothing unsent anywhere (inbox and output queue empty): no byte can be ahead of this
            // frame, and the queue cannot start writing while we hold the lock. Direct writes save
            // a thread hop (latency); a streaming sender is better served by batches (throughput).
            let now = DispatchTime.now().uptimeNanoseconds
            let threadLast = SendPacing.exchange(now)
            let writeDirectly =
                unsentBytes == 0 && now &- lastFastSend >= Connection.streamingGap
                && now &- threadLast >= Connection.streamingGap
            lastFastSend = now
            inbox.append(frame, size: size)
            unsentBytes += size
            if writeDirectly {
                unsentBytes -= writeInboxDirectly(maxBuffers: 2)
                if inbox.isEmpty { return (frame.sequence, false) }
            }
            return (frame.sequence, claimDrain())
        }
        guard let accepted else { return refusal }
        if accepted.schedule { scheduleDrain() }
        return .sent(accepted.sequence)
    }

    enum FastSend {
        case sent(UInt64)
        /// Above the high-water mark, or a sender waits in the slow path.
        case full
        /// Not open (not started, closing or closed).
        case closed
        /// The frame cannot be encoded (type id too long).
        case invalid
    }

    /// Queues (or writes) `frame` without waiting; false when the send queue is full. Any context.
    /// - Throws: ``TransportError/Code/connectionClosed``, ``TransportError/Code/invalidArgument``.
    func trySend(_ frame: Frame) throws(TransportError) -> Bool {
        switch submitFast(frame, bypassLimit: false) {
        case .sent: return true
        case .full: return false
        case .closed: throw TransportError(.connectionClosed, "the connection is closed or closing")
        case .invalid:
            _ = try Frame.validatedSize(frame)
            return false
        }
    }

    /// One nonblocking `sendmsg` of the start of the inbox (at most `maxBuffers` buffers), called
    /// with `sendLock` held while everything unsent is in the inbox (so nothing can be ahead of it);
    /// drops what was written and returns its size. Would-block and errors write nothing here: the
    /// queue's ``flush()`` meets them again and handles them (write source, teardown).
    private func writeInboxDirectly(maxBuffers: Int) -> Int {
        let count = min(inbox.buffers.count, maxBuffers)
        guard count > 0 else { return 0 }
        let written = withUnsafeTemporaryAllocation(of: iovec.self, capacity: count) { vecs -> Int in
            for index in 0..<count {
                let buffer = inbox.buffers[index]
                let skip = index == 0 ? inbox.skip : 0
                vecs[index] = iovec(
                    iov_base: UnsafeMutableRawPointer(mutating: buffer.base + skip), iov_len: buffer.count - skip)
            }
            var message = msghdr()
            message.msg_iov = vecs.baseAddress
            message.msg_iovlen = numericCast(count)
            var result: Int
            repeat {
                result = sendmsg(fd, &message, Int32(MSG_NOSIGNAL))
            } while result < 0 && errno == EINTR
            return max(result, 0)
        }
        var remaining = written
        var done = 0
        while done < inbox.buffers.count {
            let left = inbox.sizes[done] - (done == 0 ? inbox.skip : 0)
            guard remaining >= left else { break }
            remaining -= left
            done += 1
        }
        if done > 0 {
            inbox.buffers.removeFirst(done)
            inbox.sizes.removeFirst(done)
            inbox.skip = 0
        }
        inbox.skip += remaining
        return written
    }

    /// With `sendLock` held, after frames went to the inbox: whether the caller must schedule the
    /// drain (true for the first since the last drain; later ones ride along).
    private func claimDrain() -> Bool {
        defer { drainScheduled = true }
        return !drainScheduled
    }

    /// One `queue.async` that moves the inbox into the output queue and writes it.
    private func scheduleDrain() {
        queue.async {
            self.drainInbox()
            self.flush()
        }
    }

    /// Moves the inbox's frames (already numbered) into the output queue. On ``queue``.
    private func drainInbox() {
        var taken = Inbox()
        sendLock.withLock {
            drainScheduled = false
            swap(&taken, &inbox)
        }
        appendToOutput(taken)
    }

    /// Appends frames taken from the inbox to the output queue. On ``queue``.
    private func appendToOutput(_ taken: Inbox) {
        guard !taken.isEmpty else { return }
        switch state {
        case .open, .flushing:
            if taken.skip > 0 {
                // A direct write sent the start of this frame; it was written while nothing else was
                // unsent, so everything before it in the output queue is written too.
                assert(outputHead == output.count && outputOffset == 0)
                outputOffset = taken.skip
            }
            output.append(contentsOf: taken.buffers)
            outputSizes.append(contentsOf: taken.sizes)
            queuedBytes += taken.sizes.reduce(0, +) - taken.skip
            maxQueuedBytes = max(maxQueuedBytes, queuedBytes)
        case .idle, .halfClosed, .closed:
            break  // teardown already dropped what was queued; so are these
        }
    }

    private func admit(_ frame: Frame, _ completion: (Result<UInt64, TransportError>) -> Void) {
        var frame = frame
        let size: Int
        do {
            size = try Frame.validatedSize(frame)
        } catch {
            completion(.failure(error))
            return
        }
        // Drain and number under one lock: no fast-path frame can get a smaller number and still
        // be behind this one in the output queue.
        var pending = Inbox()
        frame.sequence = sendLock.withLock {
            swap(&pending, &inbox)
            let sequence = nextSequence
            nextSequence &+= 1
            unsentBytes += size
            return sequence
        }
        appendToOutput(pending)
        WireBuffer.append(frame, size: size, to: &output, sizes: &outputSizes)
        queuedBytes += size
        maxQueuedBytes = max(maxQueuedBytes, queuedBytes)
        completion(.success(frame.sequence))
        // Write at once (the write source is only for when the socket is full); inside flush()
        // (admitting waiters) the running flush loop picks the frame up.
        if !isFlushing { flush() }
    }

    private func resumeWriteSource() {
        guard !writeSourceResumed, readSource != nil else { return }  // no sources before start / after teardown
        let source: any DispatchSourceWrite
        if let writeSource {
            source = writeSource
        } else {
            source = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: queue)
            source.setEventHandler { [unowned self] in self.flush() }
            writeSource = source
        }
        writeSourceResumed = true
        source.resume()
    }

    private func suspendWriteSource() {
        guard writeSourceResumed, let writeSource else { return }
        writeSourceResumed = false
        writeSource.suspend()
    }

    private static let maxIOVecs = 64

    /// Writes as much queued output as the socket takes: `sendmsg` with up to 64 iovecs and MSG_NOSIGNAL.
    private func flush() {
        isFlushing = true
        defer { isFlushing = false }
        while outputHead < output.count {
            if isClosed { return }
            var iovecs = [iovec]()
            iovecs.reserveCapacity(Connection.maxIOVecs)
            var index = outputHead
            while index < output.count && iovecs.count < Connection.maxIOVecs {
                let buffer = output[index]
                let skip = index == outputHead ? outputOffset : 0
                let base = UnsafeMutableRawPointer(mutating: buffer.base + skip)
                iovecs.append(iovec(iov_base: base, iov_len: buffer.count - skip))
                index += 1
            }
            let result: IOResult<Int>
            do {
                result = try iovecs.withUnsafeMutableBufferPointer { (vecs) throws(TransportError) -> IOResult<Int> in
                    var message = msghdr()
                    message.msg_iov = vecs.baseAddress
                    message.msg_iovlen = numericCast(vecs.count)
                    return try syscall("sendmsg", nonblocking: true) { sendmsg(fd, &message, Int32(MSG_NOSIGNAL)) }
                }
            } catch {
                teardown(Connection.reason(for: error))
                return
            }
            switch result {
            case .wouldBlock:
                resumeWriteSource()
                return
            case .processed(let written):
                consume(written)
            }
        }
        // Everything written.
        // Released, not kept: an idle connection then holds no output storage.
        output.removeAll()
        outputSizes.removeAll()
        outputHead = 0
        outputOffset = 0
        suspendWriteSource()
        if case .flushing = state { shutdownWrite() }
    }

    private func consume(_ written: Int) {
        var remaining = written
        queuedBytes -= written
        sendLock.withLock { unsentBytes -= written }
        while remaining > 0 {
            let left = outputSizes[outputHead] - outputOffset
            if remaining >= left {
                remaining -= left
                outputHead += 1
                outputOffset = 0
            } else {
                outputOffset += remaining
                remaining = 0
            }
        }
        if outputHead > 256 && outputHead * 2 > output.count {
            output.removeSubrange(0..<outputHead)
            outputSizes.removeSubrange(0..<outputHead)
            outputHead = 0
        }
        admitWaiters()
    }

    private func admitWaiters() {
        guard waitersHead < waiters.count, queuedBytes <= configuration.sendLowWaterMark else { return }
        while waitersHead < waiters.count && queuedBytes <= configuration.sendHighWaterMark {
            let (frame, completion) = waiters[waitersHead]
            waitersHead += 1
            admit(frame, completion)
        }
        if waitersHead == waiters.count {
            waiters.removeAll(keepingCapacity: true)
            waitersHead = 0
        }
    }

    private func failWaiters(_ error: TransportError) {
        let pending = waiters[waitersHead...]
        waiters.removeAll()
        waitersHead = 0
        for (_, completion) in pending { completion(.failure(error)) }
    }
}

extension Duration {
    var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 { return 0 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }

    var timeInterval: DispatchTimeInterval { .nanoseconds(Int(clamping: nanoseconds)) }
}
