import Dispatch
import ProtocolCore
import SystemCalls

import Glibc

/// An open file descriptor (a socket, here). A value: whoever holds it decides when to close it.
@_spi(Programs) public struct FileDescriptor: Sendable, Hashable, CustomStringConvertible {
    public let rawValue: Int32

    package init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// Closes the descriptor, ignoring EINTR (on Linux it is released even when close reports EINTR).
    /// The corresponding C function is `close`.
    public func close() { _ = Glibc.close(rawValue) }

    public var description: String { "fd \(rawValue)" }
}

/// The result of a nonblocking system call.
package enum IOResult<T> {
    /// The call completed and returned this value.
    case processed(T)
    /// The call would block (EAGAIN / EWOULDBLOCK); try again when the fd is ready.
    case wouldBlock
}

/// Transport's system calls: the package's one loop (``retryingInterrupts(_:)``, EINTR retried),
/// EAGAIN/EWOULDBLOCK as ``IOResult/wouldBlock`` (when `nonblocking` is true), any other failure
/// thrown as `TransportError.Code.syscallFailed` with errno and the call's name. `body` returns the
/// raw C result; any negative value means failure.
@inline(__always)
package func syscall<T: FixedWidthInteger>(
    _ name: @autoclosure () -> String, nonblocking: Bool = false, _ body: () -> T
) throws(TransportError) -> IOResult<T> {
    switch retryingInterrupts(body) {
    case .success(let result): return .processed(result)
    case .failure(let error) where nonblocking && error.wouldBlock: return .wouldBlock
    case .failure(let error): throw TransportError.syscall(name(), errno: error.code)
    }
}

/// ``syscall(_:nonblocking:_:)`` for calls that cannot block: returns the value directly.
@inline(__always)
@discardableResult
package func syscallValue<T: FixedWidthInteger>(_ name: @autoclosure () -> String, _ body: () -> T)
    throws(TransportError) -> T
{
    switch try syscall(name(), nonblocking: false, body) {
    case .processed(let value): return value
    case .wouldBlock: throw TransportError.syscall(name(), errno: EAGAIN)
    }
}

/// The current uptime in nanoseconds (Dispatch's clock): the clock of every deadline the core
/// keeps, so a timer armed with `DispatchTime(uptimeNanoseconds:)` fires when the core expects.
@inline(__always)
package func uptimeNanoseconds() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

extension Duration {
    /// Whole nanoseconds (0 for negative durations).
    package var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 { return 0 }
        return UInt64(seconds) &* 1_000_000_000 &+ UInt64(attoseconds / 1_000_000_000)
    }
}
