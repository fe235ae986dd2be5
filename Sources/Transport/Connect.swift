import ProtocolCore
import Dispatch
import Logging
import Scheduling

import Glibc

/// Outbound TCP connects: nonblocking `connect` with a timeout, raced across addresses (RFC 8305).
@_spi(Programs) public enum TCPConnector {
    /// Orders addresses for Happy Eyeballs: families interleaved, IPv6 first, relative order kept.
    package static func interleave(_ addresses: [SocketAddress]) -> [SocketAddress] {
        let v6 = addresses.filter { $0.family == .ipv6 }
        let v4 = addresses.filter { $0.family == .ipv4 }
        var result: [SocketAddress] = []
        result.reserveCapacity(addresses.count)
        for index in 0..<max(v6.count, v4.count) {
            if index < v6.count { result.append(v6[index]) }
            if index < v4.count { result.append(v4[index]) }
        }
        return result
    }

    /// Connects to the first address that answers (Happy Eyeballs, RFC 8305).
    ///
    /// Addresses are interleaved by family (IPv6 first). A new attempt starts every `attemptDelay`,
    /// or immediately when the previous one fails; the first established connection wins and the
    /// others are cancelled. Link-local IPv6 addresses need a scope id (EINVAL otherwise).
    ///
    /// - Returns: The connected, nonblocking fd and the address it is connected to.
    /// - Throws: `TransportError.Code.connectFailed` when every address failed, or
    ///   `TransportError.Code.connectTimedOut` after `timeout`; `TransportError.connectFailures`
    ///   lists each address's failure.
    public static func connect(
        to addresses: [SocketAddress], attemptDelay: Duration = .milliseconds(250), timeout: Duration = .seconds(10),
        logger: Logger
    ) async throws -> (fd: FileDescriptor, address: SocketAddress) {
        try await connect(to: addresses, attemptDelay: attemptDelay, timeout: timeout, scheduler: DispatchScheduler(), logger: logger)
    }

    /// ``connect(to:attemptDelay:timeout:logger:)`` with the attempt delay and the timeout on
    /// `scheduler`'s clock (a channel's; tests: a `ManualScheduler`).
    package static func connect(
        to addresses: [SocketAddress], attemptDelay: Duration = .milliseconds(250), timeout: Duration = .seconds(10),
        scheduler: any Scheduler, logger: Logger
    ) async throws -> (fd: FileDescriptor, address: SocketAddress) {
        guard !addresses.isEmpty else {
            throw TransportError(.invalidArgument, "no addresses to connect to; resolve the service first")
        }
        let race = HappyEyeballsRace(
            addresses: interleave(addresses), attemptDelay: attemptDelay, timeout: timeout, scheduler: scheduler, logger: logger)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                race.start(continuation)
            }
        } onCancel: {
            race.cancel()
        }
    }
}

/// One Happy Eyeballs race. `@unchecked Sendable`: all mutable state is confined to `queue`.
final class HappyEyeballsRace: @unchecked Sendable {
    private final class Attempt {
        let address: SocketAddress
        let fd: FileDescriptor
        var source: (any DispatchSourceWrite)?
        var closeOnCancel = true
        init(address: SocketAddress, fd: FileDescriptor) {
            self.address = address
            self.fd = fd
        }
    }

    private let queue = DispatchQueue(label: "transport.connect")
    private let logger: Logger
    private let attemptDelay: Duration
    private let timeout: Duration
    private var pending: [SocketAddress]
    private var attempts: [Attempt] = []
    private var failures: [TransportError.ConnectFailure] = []
    private var continuation: CheckedContinuation<(fd: FileDescriptor, address: SocketAddress), any Error>?
    private let scheduler: any Scheduler
    /// Starts the next attempt after the attempt delay.
    private var nextAttempt: ScheduledWork?
    /// Ends the race after the overall timeout.
    private var overallTimeout: ScheduledWork?
    private var finished = false

    init(addresses: [SocketAddress], attemptDelay: Duration, timeout: Duration, scheduler: any Scheduler, logger: Logger) {
        self.pending = addresses
        self.scheduler = scheduler
        self.attemptDelay = attemptDelay
        self.timeout = timeout
        self.logger = logger
    }

    func start(_ continuation: CheckedContinuation<(fd: FileDescriptor, address: SocketAddress), any Error>) {
        queue.async {
            self.continuation = continuation
            if self.finished {  // cancelled before start
                self.fail(TransportError(.connectFailed, "connecting was cancelled"))
                return
            }
            self.overallTimeout = self.timer(after: self.timeout) { $0.timedOut() }
            self.startNext()
        }
    }

    func cancel() {
        queue.async {
            guard !self.finished else { return }
            self.finished = true
            self.cancelAll()
            self.overallTimeout?.cancel()
            self.continuation?.resume(throwing: CancellationError())
            self.continuation = nil
        }
    }

    private func startNext() {
        nextAttempt?.cancel()
        nextAttempt = nil
        guard !finished else { return }
        guard !pending.isEmpty else {
            if attempts.isEmpty { allFailed() }
            return
        }
        let address = pending.removeFirst()
        logger.debug("connecting to \(address)")
        let fd: FileDescriptor
        do {
            fd = try SocketOps.makeSocket(domain: address.domain)
        } catch {
            record(address, error.message)
            startNext()
            return
        }
        do {
            _ = try address.withSockAddr { (sa, len) throws(TransportError) in
                try syscallValue("connect(\(address))") { Glibc.connect(fd.rawValue, sa, len) }
            }
        } catch  where error.errno == EINPROGRESS || error.errno == EALREADY {
            // Completes asynchronously; watched below.
        } catch {
            fd.close()
            var message = error.message
            if error.errno == EINVAL && address.isLinkLocalIPv6 && address.scopeID == 0 {
                message += " (link-local IPv6 address without a scope id; pass the interface index)"
            }
            record(address, message, errno: error.errno)
            startNext()
            return
        }
        let attempt = Attempt(address: address, fd: fd)
        attempts.append(attempt)
        let source = DispatchSource.makeWriteSource(fileDescriptor: fd.rawValue, queue: queue)
        source.setEventHandler { [weak self, unowned attempt] in self?.attemptReady(attempt) }
        source.setCancelHandler { [weak self, attempt] in
            if attempt.closeOnCancel {
                attempt.fd.close()
            } else {
                self?.handOver(attempt)
            }
        }
        attempt.source = source
        source.resume()
        nextAttempt = timer(after: attemptDelay) { $0.startNext() }
    }

    /// A one-shot timer of the scheduler on the race's queue; cancelled when no longer needed.
    private func timer(after delay: Duration, _ action: @escaping @Sendable (HappyEyeballsRace) -> Void) -> ScheduledWork {
        scheduler.schedule(after: delay, on: queue) { [weak self] in
            guard let self else { return }
            action(self)
        }
    }

    private func attemptReady(_ attempt: Attempt) {
        guard !finished, attempt.source != nil else { return }
        let error = SocketOps.socketError(attempt.fd)
        if error == 0 {
            logger.debug("connected to \(attempt.address)")
            finished = true
            attempt.closeOnCancel = false
            attempts.removeAll { $0 === attempt }
            let source = attempt.source
            attempt.source = nil
            cancelAll()
            source?.cancel()  // its cancel handler hands the fd over
            return
        }
        record(attempt.address, "connect: \(errnoString(error)) (errno \(error))", errno: error)
        attempts.removeAll { $0 === attempt }
        attempt.source?.cancel()
        attempt.source = nil
        startNext()
    }

    private func handOver(_ attempt: Attempt) {
        overallTimeout?.cancel()
        if let continuation {
            self.continuation = nil
            continuation.resume(returning: (attempt.fd, attempt.address))
        } else {
            attempt.fd.close()
        }
    }

    private func record(_ address: SocketAddress, _ reason: String, errno: Int32? = nil) {
        logger.debug("connect to \(address) failed: \(reason)")
        failures.append(.init(address: address, reason: reason, errno: errno))
    }

    private func cancelAll() {
        nextAttempt?.cancel()
        nextAttempt = nil
        for attempt in attempts {
            attempt.source?.cancel()
            attempt.source = nil
        }
        attempts.removeAll()
    }

    private func timedOut() {
        guard !finished else { return }
        for attempt in attempts { failures.append(.init(address: attempt.address, reason: "timed out")) }
        for address in pending { failures.append(.init(address: address, reason: "not tried before the timeout")) }
        fail(
            TransportError(
                .connectTimedOut,
                "could not connect within \(timeout): \(failures.map(\.description).joined(separator: "; ")); "
                    + "check that the peer is running and reachable",
                connectFailures: failures))
    }

    private func allFailed() {
        fail(
            TransportError(
                .connectFailed,
                "could not connect to any address: \(failures.map(\.description).joined(separator: "; ")); "
                    + "check that the peer is running and reachable",
                connectFailures: failures))
    }

    private func fail(_ error: TransportError) {
        finished = true
        overallTimeout?.cancel()
        cancelAll()
        continuation?.resume(throwing: error)
        continuation = nil
    }
}
