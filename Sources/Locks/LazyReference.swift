import Synchronization

/// An object made at most once, on first use, by whichever thread asks first — what
/// `Synchronization.AtomicLazyReference` does, with its atomics where ThreadSanitizer sees them.
///
/// Not `AtomicLazyReference`: on Linux its `load()` and `storeIfNil(_:)` are compiled into the
/// precompiled standard library (neither is `@inlinable`), so ThreadSanitizer sees neither the
/// release that publishes the object nor the acquire that reads it, and reports the object's first
/// use on another thread as a data race with its initializer (it stopped a CI run's TSan stage:
/// a channel's message buffer made by the app's `messages`, pushed to by the loop). `Atomic`'s
/// operations are `@_transparent`: they are compiled into the caller, instrumented.
///
/// The object is retained once by the reference and released when the reference goes.
public struct LazyReference<Instance: AnyObject>: ~Copyable, @unchecked Sendable {
    @usableFromInline
    let storage = Atomic<Unmanaged<Instance>?>(nil)

    @inlinable
    public init() {}

    /// The object, if one was stored (acquiring: everything its maker wrote is visible).
    @inlinable
    public func load() -> Instance? {
        storage.load(ordering: .acquiring)?.takeUnretainedValue()
    }

    /// Stores `desired` if nothing was stored yet; returns what the reference holds afterwards
    /// (`desired`, or the object another thread stored first).
    @inlinable
    public func storeIfNil(_ desired: Instance) -> Instance {
        let new = Unmanaged.passRetained(desired)
        let (exchanged, current) = storage.compareExchange(
            expected: nil, desired: new, ordering: .acquiringAndReleasing)
        if exchanged { return desired }
        new.release()
        return current!.takeUnretainedValue()
    }

    deinit {
        storage.load(ordering: .acquiring)?.release()
    }
}
