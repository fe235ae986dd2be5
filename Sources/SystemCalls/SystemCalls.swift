import Glibc

/// An `errno` from a failed system call: the package's one errno type. Transport, Discovery and
/// PreviewKit keep it in their own errors, with the call's name and what to do.
public struct Errno: Error, Sendable, Hashable, CustomStringConvertible {
    public let code: Int32

    @inlinable public init(_ code: Int32) { self.code = code }

    /// EAGAIN or EWOULDBLOCK: a nonblocking call found nothing to do.
    @inlinable public var wouldBlock: Bool { code == EAGAIN || code == EWOULDBLOCK }

    /// `"Connection refused (errno 111)"`.
    public var description: String { "\(String(cString: strerror(code))) (errno \(code))" }
}

/// The package's one system-call loop: runs `body` (a C call returning -1 and setting `errno` on
/// failure) again while it is interrupted by a signal (EINTR), and returns its result or its errno.
/// Inlinable: every socket read and write goes through it, and a generic call across the module
/// boundary, unspecialized, cost each W2 round trip 3 µs (4 %).
@inlinable @inline(__always)
public func retryingInterrupts<T: BinaryInteger>(_ body: () -> T) -> Result<T, Errno> {
    while true {
        let result = body()
        if result >= 0 { return .success(result) }
        let code = errno
        if code == EINTR { continue }
        return .failure(Errno(code))
    }
}

/// `posix_spawn` attributes for a child that starts as a shell would start it: no signal blocked
/// and every signal at its default action, whatever the spawning process set up. A child inherits
/// the calling thread's signal mask and every signal its parent ignores — and a daemon ignores
/// SIGTERM and SIGINT while a signal source takes them (swift-service-lifecycle does), and often
/// SIGPIPE. Spawned without these, a hook could not be stopped with `kill`, nor a `timeout` in it
/// stop its command. `body` gets the attributes to pass to `posix_spawn`.
public func withDefaultSignalsSpawnAttributes<R>(_ body: (UnsafePointer<posix_spawnattr_t>) -> R) -> R {
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var none = sigset_t()
    sigemptyset(&none)
    posix_spawnattr_setsigmask(&attributes, &none)
    var all = sigset_t()
    sigfillset(&all)  // (the child's reset of SIGKILL and SIGSTOP fails, and is ignored: they stay default)
    posix_spawnattr_setsigdefault(&attributes, &all)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    return withUnsafePointer(to: &attributes) { body($0) }
}
