#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A mutex in a single allocation: the `pthread_mutex_t` lives in the tail of its storage object
/// (the way NIO's `NIOLock` does it). On Linux `NSLock` costs three allocations (the object, a
/// mutex and a condition variable for `lock(before:)`); a connection holds several locks, and
/// idle connections should cost as little memory as possible.
///
/// Not `Synchronization.Mutex`, although it would live inline in its owner (4 bytes instead of a
/// 72-byte allocation): on Linux its lock and unlock happen inside the precompiled standard
/// library, invisible to ThreadSanitizer, which then reports every access it guards as a data race
/// — in our tests and in the TSan runs of every app using this library. pthread mutexes are
/// intercepted by TSan.
///
/// `@unchecked Sendable`: the storage is only touched through the mutex it holds.
struct Lock: @unchecked Sendable {
    private final class Storage: ManagedBuffer<Void, pthread_mutex_t> {
        deinit {
            _ = withUnsafeMutablePointerToElements { pthread_mutex_destroy($0) }
        }
    }

    private let storage: Storage

    init() {
        let buffer = Storage.create(minimumCapacity: 1) { _ in () }
        storage = unsafeDowncast(buffer, to: Storage.self)
        storage.withUnsafeMutablePointerToElements { mutex in
            let status = pthread_mutex_init(mutex, nil)
            precondition(status == 0, "pthread_mutex_init failed: \(status)")
        }
    }

    /// Runs `body` with the mutex held.
    @inline(__always)
    func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        storage.withUnsafeMutablePointerToElements { _ = pthread_mutex_lock($0) }
        defer { storage.withUnsafeMutablePointerToElements { _ = pthread_mutex_unlock($0) } }
        return try body()
    }
}
