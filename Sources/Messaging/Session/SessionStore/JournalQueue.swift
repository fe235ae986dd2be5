import Synchronization

/// Records handed to the journal's writer, in the order of the calls that handed them over, without
/// a lock: a session queues its records while it holds its own lock (that fixes their order), and
/// whoever writes takes them all at once after. A Treiber stack of batches (one compare-and-swap
/// per push), taken whole and reversed by the writer.
final class JournalQueue: Sendable {
    /// What one call queued.
    final class Batch: @unchecked Sendable {
        // @unchecked: every field is set before the batch is published by the push (a releasing
        // compare-and-swap) and read after the take (an acquiring exchange); `next` is the stack's.
        let records: [Journal.Record]
        /// The session the records are of, and its write generation: once a batch of a generation
        /// failed, the later batches of that generation fail too, unwritten (the session learns of
        /// the failure, undoes what it kept, and goes on in the next generation) — so the file never
        /// holds a record whose session lacks one queued before it.
        let chain: (key: Journal.Key, generation: UInt32)?
        /// Runs once the batch is written, with the journal's position after it, or its failure.
        let done: (@Sendable (Result<UInt64, FileError>) -> Void)?
        fileprivate var next: Unmanaged<Batch>?

        init(
            _ records: [Journal.Record], chain: (key: Journal.Key, generation: UInt32)?,
            done: (@Sendable (Result<UInt64, FileError>) -> Void)?
        ) {
            self.records = records
            self.chain = chain
            self.done = done
        }
    }

    private let head = Atomic<Unmanaged<Batch>?>(nil)

    /// Adds a batch (any context; no lock, no system call).
    func push(_ batch: Batch) {
        let node = Unmanaged.passRetained(batch)
        var expected = head.load(ordering: .relaxed)
        while true {
            batch.next = expected
            let (exchanged, current) = head.compareExchange(expected: expected, desired: node, ordering: .sequentiallyConsistent)
            if exchanged { return }
            expected = current
        }
    }

    /// Whether anything is queued.
    var isEmpty: Bool { head.load(ordering: .sequentiallyConsistent) == nil }

    /// Takes everything queued, oldest first.
    func takeAll() -> [Batch] {
        guard var node = head.exchange(nil, ordering: .sequentiallyConsistent) else { return [] }
        var batches: [Batch] = []
        while true {
            let batch = node.takeRetainedValue()
            batches.append(batch)
            guard let next = batch.next else { break }
            batch.next = nil
            node = next
        }
        batches.reverse()
        return batches
    }

    deinit { _ = takeAll() }
}
