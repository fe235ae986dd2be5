import Synchronization

/// A mutex stored inline in the object that owns it: no allocation of its own.
///
/// It wraps the standard library's `Mutex` (a 4-byte futex word on Linux), which is `~Copyable`, so
/// a lock is a `let` property of the one object whose state it guards. A connection holds several
/// locks, and idle connections should cost as little memory as possible: the earlier
/// `pthread_mutex_t` in a `ManagedBuffer` cost one 56-byte allocation (72 with malloc's header) per
/// lock, and `NSLock` three on Linux.
///
/// `@unchecked Sendable`: the guarded state lives outside the mutex, in fields of the owner that
/// are only touched inside ``withLock(_:)``.
struct Lock: ~Copyable, @unchecked Sendable {
    private let mutex = Mutex<Void>(())

    init() {}

    /// Runs `body` with the mutex held.
    @inline(__always)
    func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        try mutex.withLock { _ throws(E) -> T in try body() }
    }
}
