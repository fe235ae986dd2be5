import Dispatch
import ProtocolCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// An open file descriptor (a socket, here). A value: whoever holds it decides when to close it.
package struct FileDescriptor: Sendable, Hashable, CustomStringConvertible {
    package let rawValue: Int32

    package init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// Closes the descriptor, ignoring EINTR (on Linux it is released even when close reports EINTR).
    /// The corresponding C function is `close`.
    package func close() { _ = Glibc.close(rawValue) }

    package var description: String { "fd \(rawValue)" }
}

/// The result of a nonblocking system call.
package enum IOResult<T> {
    /// The call completed and returned this value.
    case processed(T)
    /// The call would block (EAGAIN / EWOULDBLOCK); try again when the fd is ready.
    case wouldBlock
}

/// The one system-call helper: retries EINTR, maps EAGAIN/EWOULDBLOCK to ``IOResult/wouldBlock``
/// (when `nonblocking` is true) and throws `TransportError.Code.syscallFailed` with errno and the
/// call's name otherwise. `body` returns the raw C result; any negative value means failure.
@inline(__always)
package func syscall<T: FixedWidthInteger>(
    _ name: @autoclosure () -> String, nonblocking: Bool = false, _ body: () -> T
) throws(TransportError) -> IOResult<T> {
    while true {
        let result = body()
        if result >= 0 { return .processed(result) }
        let err = errno
        switch err {
        case EINTR: continue
        case EAGAIN where nonblocking, EWOULDBLOCK where nonblocking: return .wouldBlock
        default: throw TransportError.syscall(name(), errno: err)
        }
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
