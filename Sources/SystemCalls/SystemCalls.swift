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
