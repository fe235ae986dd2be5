import Crypto
import Locks
import Messaging

#if canImport(Glibc)
    import Glibc
#endif

/// Progress of one push, for a progress bar.
public struct PushProgress: Sendable {
    /// The file's name as offered.
    public let name: String
    /// Bytes sent so far.
    public let sentBytes: UInt64
    /// The file's size.
    public let totalBytes: UInt64
    /// When sending started.
    public let started: ContinuousClock.Instant
    /// Whether this is the final report (all bytes sent).
    public let isFinished: Bool
}

/// The client side of the push protocol over one channel: offer, stream, wait for the result.
/// Several pushes may run one after the other (or concurrently) on the same channel.
public final class PreviewPusher: Sendable {
    private enum Slot {
        case waiting(CheckedContinuation<PreviewResult, any Error>)
        case arrived(PreviewResult)
        case expected
    }

    private struct State {
        var slots: [String: Slot] = [:]
        var closed: String?
    }

    /// The channel to the server.
    public let channel: MessageChannel
    private let state = Locked(State())

    /// Routes `preview.result` messages of `channel` to the pushes waiting for them.
    public init(channel: MessageChannel) {
        self.channel = channel
        channel.on(type: PreviewProtocol.TypeID.result, as: PreviewResult.self) { [weak self] result, _ in
            self?.deliver(result)
        }
        Task { [weak self, channel] in
            let reason = await channel.closed()
            self?.failAll("the connection to the server closed (\(reason))")
        }
    }

    private func deliver(_ result: PreviewResult) {
        let waiter: CheckedContinuation<PreviewResult, any Error>? = state.withLock { state in
            switch state.slots[result.offerID] {
            case .waiting(let continuation)?:
                state.slots.removeValue(forKey: result.offerID)
                return continuation
            case .expected?:
                state.slots[result.offerID] = .arrived(result)
                return nil
            case .arrived?, nil:
                return nil
            }
        }
        waiter?.resume(returning: result)
    }

    private func failAll(_ reason: String) {
        let waiters = state.withLock { state -> [CheckedContinuation<PreviewResult, any Error>] in
            state.closed = reason
            var out: [CheckedContinuation<PreviewResult, any Error>] = []
            for (key, slot) in state.slots {
                if case .waiting(let continuation) = slot {
                    out.append(continuation)
                    state.slots.removeValue(forKey: key)
                }
            }
            return out
        }
        for waiter in waiters { waiter.resume(throwing: PreviewFailure(PreviewFailure.connection, reason)) }
    }

    /// A result that arrived early (the server gave up before the transfer ended), if any.
    private func earlyFailure(_ id: String) -> PreviewFailure? {
        state.withLock { state in
            if case .arrived(let result)? = state.slots[id] { return result.failure }
            return nil
        }
    }

    private func waitForResult(_ id: String, timeout: Duration) async throws -> PreviewResult {
        try await withThrowingTaskGroup(of: PreviewResult?.self) { group in
            group.addTask {
                try await withCheckedThrowingContinuation { continuation in
                    enum Now {
                        case result(PreviewResult)
                        case failure(String)
                        case wait
                    }
                    let now: Now = self.state.withLock { state in
                        if case .arrived(let result)? = state.slots[id] {
                            state.slots.removeValue(forKey: id)
                            return .result(result)
                        }
                        if let closed = state.closed { return .failure(closed) }
                        state.slots[id] = .waiting(continuation)
                        return .wait
                    }
                    switch now {
                    case .result(let result): continuation.resume(returning: result)
                    case .failure(let reason):
                        continuation.resume(throwing: PreviewFailure(PreviewFailure.connection, reason))
                    case .wait: break
                    }
                }
            }
            group.addTask {
                await timerSleep(for: timeout)
                return nil
            }
            let first = try await group.next() ?? nil
            if first == nil {
                let waiter: CheckedContinuation<PreviewResult, any Error>? = state.withLock { state in
                    guard case .waiting(let continuation)? = state.slots.removeValue(forKey: id) else { return nil }
                    return continuation
                }
                waiter?.resume(throwing: CancellationError())
            }
            group.cancelAll()
            guard let result = first else {
                throw PreviewFailure(PreviewFailure.connection, "no result from the server within \(timeout)")
            }
            return result
        }
    }

    /// Pushes one file: hashes it, offers it, streams it in chunks (never holding the file), and
    /// waits for the server's result.
    ///
    /// - Parameters:
    ///   - path: The local file.
    ///   - name: The name to store it under (default: the path's last component).
    ///   - chunkSize: Bytes per chunk.
    ///   - bytesPerSecond: Limit the sending rate (nil: as fast as the link goes).
    ///   - timeout: How long to wait for the offer's answer.
    ///   - resultTimeout: How long to wait for the result after the last byte was sent.
    ///   - pushID: This push's id, the same in each retry (see ``PreviewOffer/pushID``): the server
    ///     resumes after the bytes it kept and answers a retry of a stored push with its result.
    ///   - content: The file's SHA-256 and size when already known (a retry does not hash again).
    ///   - progress: Called after every chunk (bytes count from the file's start, a resume included).
    /// - Returns: The stored file's name and hash.
    /// - Throws: ``PreviewFailure``: the server's refusal or failure, or a local/connection problem.
    public func push(
        path: String, name: String? = nil, chunkSize: Int = 256 * 1024, bytesPerSecond: UInt64? = nil,
        timeout: Duration = .seconds(10), resultTimeout: Duration = .seconds(120), pushID: String? = nil,
        content: (sha256: String, size: UInt64)? = nil, progress: (@Sendable (PushProgress) -> Void)? = nil
    ) async throws(PreviewFailure) -> PreviewResult {
        let name = name ?? String(path.split(separator: "/").last ?? Substring(path))
        let fd: Int32
        do {
            fd = try posix("open(\(path))") { open(path, O_RDONLY | O_CLOEXEC) }
        } catch {
            throw PreviewFailure(PreviewFailure.localFile, "cannot open '\(path)': \(error)")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw PreviewFailure(PreviewFailure.localFile, "'\(path)' is not a regular file")
        }
        let size: UInt64
        let digest: String
        if let content {
            (digest, size) = content
            guard UInt64(info.st_size) == size else {
                throw PreviewFailure(PreviewFailure.localFile, "'\(path)' changed size since it was hashed")
            }
        } else {
            do {
                (digest, size) = try sha256(fd: fd, path: path)
            } catch {
                throw PreviewFailure(PreviewFailure.localFile, "cannot read '\(path)': \(error)")
            }
        }

        // 1. Offer; refused offers end here, before any data flows.
        let reply: PreviewOfferReply
        do {
            reply = try await channel.request(
                PreviewOffer(name: name, size: size, sha256: digest, pushID: pushID), type: PreviewProtocol.TypeID.offer,
                expecting: PreviewOfferReply.self, timeout: timeout)
        } catch {
            throw PreviewFailure(PreviewFailure.connection, "the server did not answer the offer: \(error)")
        }
        if let stored = reply.stored { return stored }  // a retry of a push the server already stored
        guard reply.accepted, let id = reply.offerID else {
            throw reply.failure
                ?? PreviewFailure(PreviewFailure.badRequest, "the server refused the offer without a reason")
        }
        let offset = reply.offset ?? 0
        guard offset <= size, lseek(fd, off_t(offset), SEEK_SET) == off_t(offset) else {
            throw PreviewFailure(PreviewFailure.localFile, "cannot seek '\(path)' to the server's offset \(offset)")
        }
        state.withLock { $0.slots[id] = .expected }

        // 2. Stream (from where the server's kept bytes end).
        let started = ContinuousClock.now
        do {
            try await send(
                fd: fd, path: path, name: name, size: size, offset: offset, offerID: id, chunkSize: chunkSize,
                bytesPerSecond: bytesPerSecond, started: started, progress: progress)
        } catch {
            state.withLock { _ = $0.slots.removeValue(forKey: id) }
            throw error
        }

        // 3. Result.
        let result: PreviewResult
        do {
            result = try await waitForResult(id, timeout: resultTimeout)
        } catch let failure as PreviewFailure {
            throw failure
        } catch {
            throw PreviewFailure(PreviewFailure.connection, "waiting for the result: \(error)")
        }
        if let failure = result.failure { throw failure }
        guard result.sha256 == digest else {
            throw PreviewFailure(
                PreviewFailure.hashMismatch, "the server stored SHA-256 \(result.sha256 ?? "?"), expected \(digest)")
        }
        return result
    }

    private func send(
        fd: Int32, path: String, name: String, size: UInt64, offset: UInt64, offerID: String, chunkSize: Int,
        bytesPerSecond: UInt64?, started: ContinuousClock.Instant, progress: (@Sendable (PushProgress) -> Void)?
    ) async throws(PreviewFailure) {
        let transfer: OutgoingTransfer
        var metadata = [PreviewProtocol.offerMetadataKey: offerID, "name": name]
        if offset > 0 { metadata["offset"] = "\(offset)" }
        do {
            transfer = try await channel.startTransfer(
                type: PreviewProtocol.TypeID.file, totalSize: size - offset, metadata: metadata)
        } catch {
            throw PreviewFailure(PreviewFailure.connection, "cannot start the transfer: \(error)")
        }
        progress?(PushProgress(name: name, sentBytes: offset, totalBytes: size, started: started, isFinished: false))
        var buffer = [UInt8](repeating: 0, count: max(1, chunkSize))
        var sent: UInt64 = 0
        let remaining = size - offset
        while sent < remaining {
            if let failure = earlyFailure(offerID) {
                await transfer.abort(reason: "the server gave up: \(failure.message)")
                throw failure
            }
            let count: Int
            do {
                let wanted = min(buffer.count, Int(clamping: remaining - sent))
                count = try posix("read(\(path))") {
                    buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, wanted) }
                }
            } catch {
                await transfer.abort(reason: "the sender cannot read its file")
                throw PreviewFailure(PreviewFailure.localFile, "cannot read '\(path)': \(error)")
            }
            guard count > 0 else {
                await transfer.abort(reason: "the file shrank while being sent")
                throw PreviewFailure(PreviewFailure.localFile, "'\(path)' shrank while being sent")
            }
            do {
                try await transfer.send(count == buffer.count ? buffer : Array(buffer[0..<count]))
            } catch {
                throw PreviewFailure(PreviewFailure.connection, "sending failed after \(sent) bytes: \(error)")
            }
            sent += UInt64(count)
            progress?(
                PushProgress(name: name, sentBytes: offset + sent, totalBytes: size, started: started, isFinished: false))
            if let rate = bytesPerSecond, rate > 0 {
                let due = started + .nanoseconds(Int64(clamping: sent * 1_000_000_000 / rate))
                if due > .now { await timerSleep(for: due - .now) }
            }
        }
        do {
            try await transfer.finish()
        } catch {
            throw PreviewFailure(PreviewFailure.connection, "finishing the transfer failed: \(error)")
        }
        progress?(
            PushProgress(name: name, sentBytes: offset + sent, totalBytes: size, started: started, isFinished: true))
    }
}

/// Pushes files through a ``MessageClient`` and, when the connection is lost or the server restarts,
/// retries for a while: reconnects (the client's reconnect policy), offers the same push again, and
/// resumes after the bytes the server kept (it verifies the whole file at the end).
public struct ResumingPusher: Sendable {
    /// What happened to an attempt that will be retried.
    public struct Retry: Sendable {
        /// 1 for the first retry.
        public let attempt: Int
        /// Why the previous attempt stopped.
        public let failure: PreviewFailure
        /// Bytes the previous attempt had sent (counted from the file's start).
        public let sentBytes: UInt64
    }

    public let client: MessageClient
    /// How long to keep retrying after a failure that a retry may fix (connection lost, transfer
    /// interrupted, server restarting).
    public let retryFor: Duration

    public init(client: MessageClient, retryFor: Duration) {
        self.client = client
        self.retryFor = retryFor
    }

    /// The SHA-256 and size of the file at `path`, as a push offers them.
    public static func hash(_ path: String) throws(PreviewFailure) -> (sha256: String, size: UInt64) {
        do {
            let hashed = try sha256OfFile(atPath: path)
            return (hashed.hex, hashed.size)
        } catch {
            throw PreviewFailure(PreviewFailure.localFile, "cannot read '\(path)': \(error)")
        }
    }

    /// Failures a retry may fix.
    static func isRetryable(_ failure: PreviewFailure) -> Bool {
        [PreviewFailure.connection, PreviewFailure.transferFailed, PreviewFailure.shuttingDown].contains(failure.code)
    }

    /// Pushes `path` (see ``PreviewPusher/push(path:name:chunkSize:bytesPerSecond:timeout:resultTimeout:pushID:content:progress:)``),
    /// retrying within ``retryFor`` of the first failure.
    /// - Parameter content: The file's SHA-256 and size when the caller hashed it already (a push
    ///   of one file to several previewers hashes it once: 10 MiB cost 47 ms of CPU here); nil:
    ///   hashed now.
    public func push(
        path: String, bytesPerSecond: UInt64? = nil, timeout: Duration, resultTimeout: Duration,
        content known: (sha256: String, size: UInt64)? = nil,
        onRetry: @escaping @Sendable (Retry) -> Void = { _ in }, onResume: @escaping @Sendable (UInt64) -> Void = { _ in },
        progress: (@Sendable (PushProgress) -> Void)? = nil
    ) async throws(PreviewFailure) -> PreviewResult {
        let content: (sha256: String, size: UInt64)
        if let known {
            content = known
        } else {
            content = try Self.hash(path)
        }
        let pushID = PreviewStore.randomID() + PreviewStore.randomID()
        var deadline: ContinuousClock.Instant?
        var attempt = 0
        var previous: MessageChannel?
        while true {
            let channel: MessageChannel
            do {
                channel = try await nextChannel(after: previous, until: deadline ?? .now + timeout)
            } catch {
                throw PreviewFailure(PreviewFailure.connection, "no connection to the server: \(error)")
            }
            previous = channel
            let sent = Locked<UInt64>(0)
            let resumedAt = Locked<UInt64?>(nil)
            do {
                return try await PreviewPusher(channel: channel).push(
                    path: path, bytesPerSecond: bytesPerSecond, timeout: timeout, resultTimeout: resultTimeout,
                    pushID: pushID, content: content,
                    progress: { report in
                        sent.withLock { $0 = report.sentBytes }
                        let first = resumedAt.withLock { value -> Bool in
                            defer { if value == nil { value = report.sentBytes } }
                            return value == nil
                        }
                        if first && report.sentBytes > 0 { onResume(report.sentBytes) }
                        progress?(report)
                    })
            } catch {
                guard Self.isRetryable(error) else { throw error }
                let end = deadline ?? .now + retryFor
                deadline = end
                guard ContinuousClock.now < end else { throw error }
                attempt += 1
                onRetry(Retry(attempt: attempt, failure: error, sentBytes: sent.withLock { $0 }))
            }
        }
    }

    /// The client's connection once it is not `old` (a reconnect), waiting until `deadline`.
    private func nextChannel(after old: MessageChannel?, until deadline: ContinuousClock.Instant) async throws
        -> MessageChannel
    {
        while true {
            let left = deadline - .now
            guard left > .zero else { throw PreviewFailure(PreviewFailure.connection, "the retry window ended") }
            let channel = try await client.connectedChannel(within: left)
            if channel !== old { return channel }
            _ = await raceClosed(channel, within: left)  // the old one: wait for the client to notice it closed
        }
    }

    private func raceClosed(_ channel: MessageChannel, within: Duration) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                _ = await channel.closed()
                return true
            }
            group.addTask {
                await timerSleep(for: min(within, .milliseconds(200)))
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }
}
