#if canImport(Glibc)
import Glibc
#endif

/// A value behind a `pthread_mutex_t` (package-wide: Messaging uses it too).
///
/// Used instead of `Synchronization.Mutex` because ThreadSanitizer sees pthread locking: Mutex's
/// futex-based implementation is invisible to it on Linux and makes every guarded access look racy.
/// `@unchecked Sendable`: `value` is only touched with `mutex` held.
package final class Locked<Value>: @unchecked Sendable {
    /// Heap-allocated: a mutex must never move, and `&storedProperty` is not guaranteed stable.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    package init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the lock held.
    package func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
