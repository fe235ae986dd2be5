import Crypto
import Messaging
import Synchronization

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
    private let state = Mutex(State())

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
                try? await Task.sleep(for: timeout)
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
    ///   - progress: Called after every chunk.
    /// - Returns: The stored file's name and hash.
    /// - Throws: ``PreviewFailure``: the server's refusal or failure, or a local/connection problem.
    public func push(
        path: String, name: String? = nil, chunkSize: Int = 256 * 1024, bytesPerSecond: UInt64? = nil,
        timeout: Duration = .seconds(10), resultTimeout: Duration = .seconds(120),
        progress: (@Sendable (PushProgress) -> Void)? = nil
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
        do {
            (digest, size) = try sha256(fd: fd, path: path)
        } catch {
            throw PreviewFailure(PreviewFailure.localFile, "cannot read '\(path)': \(error)")
        }
        guard lseek(fd, 0, SEEK_SET) == 0 else {
            throw PreviewFailure(PreviewFailure.localFile, "cannot rewind '\(path)'")
        }

        // 1. Offer; refused offers end here, before any data flows.
        let reply: PreviewOfferReply
        do {
            reply = try await channel.request(
                PreviewOffer(name: name, size: size, sha256: digest), type: PreviewProtocol.TypeID.offer,
                expecting: PreviewOfferReply.self, timeout: timeout)
        } catch {
            throw PreviewFailure(PreviewFailure.connection, "the server did not answer the offer: \(error)")
        }
        guard reply.accepted, let id = reply.offerID else {
            throw reply.failure
                ?? PreviewFailure(PreviewFailure.badRequest, "the server refused the offer without a reason")
        }
        state.withLock { $0.slots[id] = .expected }

        // 2. Stream.
        let started = ContinuousClock.now
        do {
            try await send(
                fd: fd, path: path, name: name, size: size, offerID: id, chunkSize: chunkSize,
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
        fd: Int32, path: String, name: String, size: UInt64, offerID: String, chunkSize: Int,
        bytesPerSecond: UInt64?, started: ContinuousClock.Instant, progress: (@Sendable (PushProgress) -> Void)?
    ) async throws(PreviewFailure) {
        let transfer: OutgoingTransfer
        do {
            transfer = try await channel.startTransfer(
                type: PreviewProtocol.TypeID.file, totalSize: size,
                metadata: [PreviewProtocol.offerMetadataKey: offerID, "name": name])
        } catch {
            throw PreviewFailure(PreviewFailure.connection, "cannot start the transfer: \(error)")
        }
        progress?(PushProgress(name: name, sentBytes: 0, totalBytes: size, started: started, isFinished: false))
        var buffer = [UInt8](repeating: 0, count: max(1, chunkSize))
        var sent: UInt64 = 0
        while sent < size {
            if let failure = earlyFailure(offerID) {
                await transfer.abort(reason: "the server gave up: \(failure.message)")
                throw failure
            }
            let count: Int
            do {
                let wanted = min(buffer.count, Int(clamping: size - sent))
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
            progress?(PushProgress(name: name, sentBytes: sent, totalBytes: size, started: started, isFinished: false))
            if let rate = bytesPerSecond, rate > 0 {
                let due = started + .nanoseconds(Int64(clamping: sent * 1_000_000_000 / rate))
                if due > .now { try? await Task.sleep(until: due, clock: .continuous) }
            }
        }
        do {
            try await transfer.finish()
        } catch {
            throw PreviewFailure(PreviewFailure.connection, "finishing the transfer failed: \(error)")
        }
        progress?(PushProgress(name: name, sentBytes: sent, totalBytes: size, started: started, isFinished: true))
    }
}
