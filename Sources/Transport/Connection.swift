import Dispatch
import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Frame-level settings of a connection.
public struct ConnectionConfiguration: Sendable {
    /// The largest accepted frame body in bytes (default 16 MiB). Larger length prefixes close the
    /// connection with ``CloseReason/frameTooLarge(size:limit:)`` before anything is allocated.
    public var maxFrameSize: Int = 16 * 1024 * 1024
    /// Senders suspend while more than this many bytes are queued for the socket (default 1 MiB).
    public var sendHighWaterMark: Int = 1024 * 1024
    /// Suspended senders resume once the queue drains to this many bytes (default 256 KiB).
    public var sendLowWaterMark: Int = 256 * 1024
    /// Close with ``CloseReason/idleTimeout`` when no complete frame arrived for this long (nil: never).
    public var idleTimeout: Duration? = nil
    /// How long a graceful close waits for the peer to close its side after ours was shut down.
    public var closeLinger: Duration = .seconds(2)
    /// Size of the reusable read buffer (default 64 KiB).
    public var readBufferSize: Int = 64 * 1024

    /// Creates the default configuration.
    public init() {}
}

/// One encoded frame waiting to be written: a single allocation holding the whole frame.
final class WireBuffer {
    let bytes: UnsafeMutableRawBufferPointer
    init(frame: Frame, size: Int) {
        bytes = .allocate(byteCount: size, alignment: 8)
        frame.write(into: bytes)
    }
    deinit { bytes.deallocate() }
}

/// A nonblocking TCP connection exchanging ``Frame``s.
///
/// One serial queue, one read and one write Dispatch source; the fd is closed only after both
/// sources' cancel handlers ran. The write source is resumed only while output is pending.
/// Outbound sequence numbers are assigned here, at the moment a frame enters the send queue, so
/// they always match the order on the wire.
///
/// `@unchecked Sendable`: every mutable field is confined to ``queue``.
final class Connection: @unchecked Sendable {
    enum State {
        case idle, open, flushing, halfClosed
        case closed(CloseReason)
    }

    let queue: DispatchQueue
    let fd: Int32
    let logger: Logger
    let configuration: ConnectionConfiguration
    let remoteAddress: SocketAddress?
    let localAddress: SocketAddress?

    private(set) var state: State = .idle
    private var readSource: (any DispatchSourceRead)?
    private var writeSource: (any DispatchSourceWrite)?
    private var writeSourceResumed = false
    private var readPauseCount = 0
    private var cancelledSources = 0
    private var decoder: FrameDecoder
    private let readBuffer: UnsafeMutableRawBufferPointer
    private var output: [WireBuffer] = []
    private var outputHead = 0
    private var outputOffset = 0  // bytes of output[outputHead] already written
    private var outputSizes: [Int] = []
    private(set) var queuedBytes = 0
    private var waiters: [(Frame, (Result<UInt64, TransportError>) -> Void)] = []
    private var waitersHead = 0
    private var nextSequence: UInt64 = 1
    private var peerCloseReason: CloseReason?
    private var idleTimer: (any DispatchSourceTimer)?
    private var lingerTimer: DispatchWorkItem?
    private(set) var lastFrameTime = DispatchTime.now()
    private var closeWaiters: [CheckedContinuation<CloseReason, Never>] = []
    private var onFrame: ((Frame) -> Void)?
    private var onClose: ((CloseReason) -> Void)?

    /// The sequence number the next frame will get (tests count pings with it).
    var nextSequenceForTests: UInt64 { nextSequence }

    /// The largest number of queued bytes seen (for tests of the bounded send queue).
    private(set) var maxQueuedBytes = 0

    init(fd: Int32, configuration: ConnectionConfiguration, logger: Logger, queue: DispatchQueue? = nil) {
        self.fd = fd
        self.configuration = configuration
        self.remoteAddress = SocketOps.remoteAddress(fd)
        self.localAddress = SocketOps.localAddress(fd)
        var logger = logger
        logger[metadataKey: "peer"] = "\(remoteAddress.map { "\($0)" } ?? "?")"
        self.logger = logger
        self.queue = queue ?? DispatchQueue(label: "transport.connection.\(fd)")
        self.decoder = FrameDecoder(maxFrameSize: configuration.maxFrameSize)
        self.readBuffer = .allocate(byteCount: max(configuration.readBufferSize, 4096), alignment: 8)
        var one: Int32 = 1
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        self.queue.setSpecific(key: Connection.onQueueKey, value: ObjectIdentifier(self))
    }

    deinit { readBuffer.deallocate() }

    private static let onQueueKey = DispatchSpecificKey<ObjectIdentifier>()

    /// Runs `body` on ``queue`` and returns its result; runs it directly when already on ``queue``.
    func onQueue<T>(_ body: () -> T) -> T {
        DispatchQueue.getSpecific(key: Connection.onQueueKey) == ObjectIdentifier(self)
            ? body() : queue.sync(execute: body)
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
        self.onFrame = onFrame
        self.onClose = onClose
        lastFrameTime = .now()
        let read = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        let write = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: queue)
        read.setEventHandler { [unowned self] in self.handleReadable() }
        write.setEventHandler { [unowned self] in self.flush() }
        // The fd is closed only after BOTH cancel handlers ran (GCDAsyncSocket pattern).
        let cancel: () -> Void = { [self] in
            self.cancelledSources += 1
            if self.cancelledSources == 2 {
                self.logger.trace("both sources cancelled, closing fd \(self.fd)")
                closeFD(self.fd)
            }
        }
        read.setCancelHandler(handler: cancel)
        write.setCancelHandler(handler: cancel)
        readSource = read
        writeSource = write
        read.resume()
        if let idle = configuration.idleTimeout {
            let timer = DispatchSource.makeTimerSource(queue: queue)
            let tick = max(idle / 4, .milliseconds(10))
            timer.schedule(deadline: .now() + tick.timeInterval, repeating: tick.timeInterval)
            timer.setEventHandler { [weak self] in self?.checkIdle(idle) }
            timer.resume()
            idleTimer = timer
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
            state = .flushing
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
        if wasStarted, let read = readSource, let write = writeSource {
            read.cancel()
            if readPauseCount > 0 { read.resume() }  // a suspended source never runs its cancel handler
            write.cancel()
            if !writeSourceResumed { write.resume() }
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

    private func handleReadable() {
        for _ in 0..<8 {
            guard readPauseCount == 0 else { return }
            switch state {
            case .open, .flushing, .halfClosed: break
            case .idle, .closed: return
            }
            let result: IOResult<Int>
            do {
                result = try syscall("read", nonblocking: true) { read(fd, readBuffer.baseAddress, readBuffer.count) }
            } catch {
                teardown(Connection.reason(for: error))
                return
            }
            switch result {
            case .wouldBlock:
                return
            case .processed(0):
                handleEndOfFile()
                return
            case .processed(let count):
                decoder.append(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count]))
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
        if !bypassLimit && (queuedBytes > configuration.sendHighWaterMark || waitersHead < waiters.count) {
            waiters.append((frame, completion))
            return
        }
        admit(frame, completion)
    }

    /// Async form of ``enqueue(_:bypassLimit:completion:)``: suspends while the send queue is above
    /// the high-water mark; returns the frame's sequence number. Callable from any context.
    func send(_ frame: Frame, bypassLimit: Bool = false) async throws -> UInt64 {
        try await withCheckedThrowingContinuation { continuation in
            queue.async {
                self.enqueue(frame, bypassLimit: bypassLimit) { continuation.resume(with: $0) }
            }
        }
    }

    private func admit(_ frame: Frame, _ completion: (Result<UInt64, TransportError>) -> Void) {
        var frame = frame
        frame.sequence = nextSequence
        let size: Int
        do {
            size = try Frame.validatedSize(frame)
        } catch {
            completion(.failure(error))
            return
        }
        nextSequence &+= 1
        output.append(WireBuffer(frame: frame, size: size))
        outputSizes.append(size)
        queuedBytes += size
        maxQueuedBytes = max(maxQueuedBytes, queuedBytes)
        completion(.success(frame.sequence))
        resumeWriteSource()
    }

    private func resumeWriteSource() {
        guard !writeSourceResumed, let writeSource else { return }
        writeSourceResumed = true
        writeSource.resume()
    }

    private func suspendWriteSource() {
        guard writeSourceResumed, let writeSource else { return }
        writeSourceResumed = false
        writeSource.suspend()
    }

    private static let maxIOVecs = 64

    /// Writes as much queued output as the socket takes: `sendmsg` with up to 64 iovecs and MSG_NOSIGNAL.
    private func flush() {
        while outputHead < output.count {
            if isClosed { return }
            var iovecs = [iovec]()
            iovecs.reserveCapacity(Connection.maxIOVecs)
            var index = outputHead
            while index < output.count && iovecs.count < Connection.maxIOVecs {
                let buffer = output[index].bytes
                let skip = index == outputHead ? outputOffset : 0
                iovecs.append(iovec(iov_base: buffer.baseAddress! + skip, iov_len: buffer.count - skip))
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
        output.removeAll(keepingCapacity: true)
        outputSizes.removeAll(keepingCapacity: true)
        outputHead = 0
        outputOffset = 0
        suspendWriteSource()
        if case .flushing = state { shutdownWrite() }
    }

    private func consume(_ written: Int) {
        var remaining = written
        queuedBytes -= written
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
