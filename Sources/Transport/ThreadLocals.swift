import Glibc

/// A key whose value each thread frees when it ends (a pointer made with `allocate`).
private func threadKey() -> pthread_key_t {
    var key = pthread_key_t()
    let status = pthread_key_create(&key) { pointer in pointer?.deallocate() }
    precondition(status == 0, "pthread_key_create failed: \(status)")
    return key
}

/// A buffer per thread that grows as needed. A connection reads on whichever Dispatch worker runs
/// its queue and copies the bytes into its ``FrameDecoder`` before the event handler returns, so
/// one read buffer per thread serves every connection and an idle connection holds none; a sender
/// seals its own frame (version 2) into the thread's write buffer the same way.
struct ThreadScratch: Sendable {
    private let key = threadKey()

    /// The read buffer.
    static let read = ThreadScratch()
    /// The buffer a sender seals its own frame into before writing it.
    static let write = ThreadScratch()

    /// At least `minimumSize` bytes (at least 4 KiB), valid on this thread until the next call on
    /// this thread.
    func buffer(minimumSize: Int) -> UnsafeMutableRawBufferPointer {
        // Layout: one Int (the capacity), then the bytes.
        let header = MemoryLayout<Int>.stride
        if let pointer = pthread_getspecific(key) {
            let capacity = pointer.load(as: Int.self)
            if capacity >= minimumSize {
                return UnsafeMutableRawBufferPointer(start: pointer + header, count: capacity)
            }
            pointer.deallocate()
        }
        let capacity = max(minimumSize, 4096)
        let pointer = UnsafeMutableRawPointer.allocate(byteCount: header + capacity, alignment: 16)
        pointer.storeBytes(of: capacity, as: Int.self)
        pthread_setspecific(key, pointer)
        return UnsafeMutableRawBufferPointer(start: pointer + header, count: capacity)
    }
}

/// When the current thread last sent a frame on the fast path (any connection), in uptime nanoseconds.
enum SendPacing {
    private static let key = threadKey()

    /// Stores `now` for this thread and returns the previous value (0 the first time).
    static func exchange(_ now: UInt64) -> UInt64 {
        let slot: UnsafeMutablePointer<UInt64>
        if let pointer = pthread_getspecific(key) {
            slot = pointer.assumingMemoryBound(to: UInt64.self)
        } else {
            slot = .allocate(capacity: 1)
            slot.initialize(to: 0)
            pthread_setspecific(key, slot)
        }
        defer { slot.pointee = now }
        return slot.pointee
    }
}
