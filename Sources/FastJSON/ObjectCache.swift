import Synchronization

/// A lock-free, one-slot cache for a reusable state object (the encoder's or decoder's), so that
/// back-to-back calls on any thread skip allocating it. Under contention a caller simply allocates.
final class _ObjectCache: Sendable {
    /// The cached object as a retained, opaque pointer's bit pattern; 0 when empty.
    private let slot = Atomic<Int>(0)

    /// Takes the cached object, if any.
    func take<T: AnyObject>(_ type: T.Type) -> T? {
        let bits = slot.exchange(0, ordering: .acquiring)
        guard let raw = UnsafeMutableRawPointer(bitPattern: bits) else { return nil }
        return Unmanaged<T>.fromOpaque(raw).takeRetainedValue()
    }

    /// Stores `object` unless the slot is already taken (then `object` is just released).
    func put<T: AnyObject>(_ object: T) {
        let raw = Unmanaged.passRetained(object).toOpaque()
        let (stored, _) = slot.compareExchange(expected: 0, desired: Int(bitPattern: raw), ordering: .releasing)
        if !stored { Unmanaged<T>.fromOpaque(raw).release() }
    }

    deinit {
        _ = take(AnyObject.self)
    }
}
