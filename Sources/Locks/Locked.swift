import Glibc

/// The package's one lock: a value and a `pthread_mutex_t` in a single allocation (the mutex lives
/// in the tail of the storage object, the way NIO's `NIOLockedValueBox` does it). ``Lock`` is the
/// same type guarding nothing but a critical section.
///
/// Not `Synchronization.Mutex`, although it would live inline in its owner: on Linux its lock and
/// unlock happen inside the precompiled standard library, invisible to ThreadSanitizer, which then
/// reports every access it guards as a data race — in our tests and in the TSan runs of every app
/// using this library. pthread mutexes are intercepted by TSan. Not `NSLock` either: three
/// allocations (object, mutex, condition) where one will do.
///
/// `@unchecked Sendable`: the value is only touched with the mutex held.
///
/// Public and `@inlinable`, so that the modules using it (Transport's send path, once per frame;
/// Messaging's queues) get it specialized and inlined, as if the lock were their own. `package` did
/// not do that: Swift 6.3 inlines no `package` declaration into another module, `@inlinable` or not,
/// so every critical section called a generic `withLock` that looked up `Locked<Value>.Storage`'s
/// metadata at run time (464 such calls in the benchmark binary). Locks is no product: apps cannot
/// name it.
public struct Locked<Value>: @unchecked Sendable {
    @usableFromInline
    final class Storage: ManagedBuffer<Value, pthread_mutex_t> {
        deinit {
            _ = withUnsafeMutablePointerToElements { pthread_mutex_destroy($0) }
        }
    }

    @usableFromInline
    let storage: Storage

    @inlinable
    public init(_ value: Value) {
        let buffer = Storage.create(minimumCapacity: 1) { _ in value }
        storage = unsafeDowncast(buffer, to: Storage.self)
        storage.withUnsafeMutablePointerToElements { mutex in
            // Adaptive: a thread that finds the mutex held spins briefly before it sleeps in the
            // kernel. Our critical sections are a few hundred nanoseconds (a queue's append, a
            // state machine's step), shorter than a `futex` sleep and wake-up.
            var attributes = pthread_mutexattr_t()
            let made = pthread_mutexattr_init(&attributes)
            let typed = pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ADAPTIVE_NP))
            precondition(made == 0 && typed == 0, "pthread_mutexattr_init or _settype failed: \(made), \(typed)")
            let status = pthread_mutex_init(mutex, &attributes)
            pthread_mutexattr_destroy(&attributes)
            precondition(status == 0, "pthread_mutex_init failed: \(status)")
        }
    }

    /// Runs `body` with the mutex held, on the guarded value.
    @inlinable @inline(__always)
    public func withLock<T, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        try storage.withUnsafeMutablePointerToElements { (mutex) throws(E) -> T in
            _ = pthread_mutex_lock(mutex)
            defer { _ = pthread_mutex_unlock(mutex) }
            // The header is touched only with the mutex held (ThreadSanitizer checks Swift accesses).
            return try storage.withUnsafeMutablePointerToHeader { (value) throws(E) -> T in try body(&value.pointee) }
        }
    }

    /// Locks the mutex without touching the value (``Lock``).
    @inlinable @inline(__always)
    func withMutexHeld<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        try storage.withUnsafeMutablePointerToElements { (mutex) throws(E) -> T in
            _ = pthread_mutex_lock(mutex)
            defer { _ = pthread_mutex_unlock(mutex) }
            return try body()
        }
    }
}

/// A mutex guarding a critical section rather than a value.
public typealias Lock = Locked<Void>

extension Locked where Value == Void {
    @inlinable
    public init() { self.init(()) }

    /// Runs `body` with the mutex held.
    @inlinable @inline(__always)
    public func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        try withMutexHeld(body)
    }
}
