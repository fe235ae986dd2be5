/// Reuses the boxes behind `KeyedEncodingContainer` / `KeyedDecodingContainer`.
///
/// Creating one of those containers allocates a box whose generic type must be looked up in the
/// runtime's metadata cache (twice) — about a thousand instructions, more than encoding a small
/// struct's fields. Within one encode or decode call (and across calls, since the state itself is
/// recycled) the same key types come back again and again, so boxes are kept per key type and
/// handed out again once `isKnownUniquelyReferenced` shows that user code no longer holds them.
///
/// A reusable box can't carry per-container data (the box's stored container is immutable), so the
/// containers hold a pointer to a `Record` owned by the cache, which is rewritten on reuse.
struct _ContainerCache<Record> {
    private struct Entry {
        let keyType: ObjectIdentifier
        var box: AnyObject
        let record: UnsafeMutablePointer<Record>
    }

    private var entries: [Entry] = []
    /// Records of containers that were not cached (cache full); freed by `reset()`.
    private var loose: [UnsafeMutablePointer<Record>] = []

    /// At most this many boxes are kept (deeply nested documents need one per level).
    private static var capacity: Int { 32 }

    /// The box of a previously created container for key type `keyType` that nobody else references
    /// any more, with its record set to `record`. (Callers bit-cast it back to the container type;
    /// working with the box keeps this code free of generic types that need runtime metadata.)
    @inline(__always)
    mutating func reuse(keyType: ObjectIdentifier, record: Record) -> AnyObject? {
        var i = 0
        while i < entries.count {
            if entries[i].keyType == keyType && isKnownUniquelyReferenced(&entries[i].box) {
                entries[i].record.pointee = record
                return entries[i].box
            }
            i += 1
        }
        return nil
    }

    /// A record for a new container.
    mutating func newRecord(_ record: Record) -> UnsafeMutablePointer<Record> {
        let pointer = UnsafeMutablePointer<Record>.allocate(capacity: 1)
        pointer.initialize(to: record)
        return pointer
    }

    /// Keeps the box of a new container (created with `record` from ``newRecord(_:)``) for reuse,
    /// if there is room; `box` is nil when the container isn't a single class reference.
    mutating func keep(_ box: AnyObject?, keyType: ObjectIdentifier, record: UnsafeMutablePointer<Record>) {
        if let box, entries.count < Self.capacity {
            entries.append(Entry(keyType: keyType, box: box, record: record))
        } else {
            loose.append(record)
        }
    }

    /// Frees the records of uncached containers (which must no longer be used).
    mutating func reset() {
        if loose.isEmpty { return }
        for record in loose {
            record.deinitialize(count: 1)
            record.deallocate()
        }
        loose.removeAll(keepingCapacity: true)
    }

    /// Frees everything.
    mutating func destroy() {
        reset()
        for entry in entries {
            entry.record.deinitialize(count: 1)
            entry.record.deallocate()
        }
        entries.removeAll()
    }
}
