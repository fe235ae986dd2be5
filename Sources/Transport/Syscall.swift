#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The result of a nonblocking system call.
enum IOResult<T> {
    /// The call completed and returned this value.
    case processed(T)
    /// The call would block (EAGAIN / EWOULDBLOCK); try again when the fd is ready.
    case wouldBlock
}

/// The one system-call helper: retries EINTR, maps EAGAIN/EWOULDBLOCK to ``IOResult/wouldBlock``
/// (when `nonblocking` is true) and throws ``TransportError/Code/syscallFailed`` with errno and the
/// call's name otherwise. `body` returns the raw C result; any negative value means failure.
@inline(__always)
func syscall<T: FixedWidthInteger>(
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
func syscallValue<T: FixedWidthInteger>(_ name: @autoclosure () -> String, _ body: () -> T) throws(TransportError) -> T
{
    switch try syscall(name(), nonblocking: false, body) {
    case .processed(let value): return value
    case .wouldBlock: throw TransportError.syscall(name(), errno: EAGAIN)
    }
}

/// Closes `fd`, ignoring EINTR (on Linux the fd is released even when close reports EINTR).
func closeFD(_ fd: Int32) {
    _ = close(fd)
}
