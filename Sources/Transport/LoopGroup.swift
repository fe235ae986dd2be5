import Dispatch
import Scheduling
import Synchronization

import Glibc

/// The serial queues connections run on, like an event-loop group: each connection is given one
/// loop (round robin) and does all its work there, so at most this many threads run connection work
/// at once — thousands of connections do not make Dispatch spawn dozens of threads — and an idle
/// connection holds no queue of its own.
///
/// Servers and clients use ``shared`` (one loop per core) unless given another group: a test or an
/// app that wants its connections apart from everyone else's creates its own.
public final class LoopGroup: Sendable {
    /// One loop per core (at most 64), made on first use.
    public static let shared = LoopGroup(loopCount: LoopGroup.coreCount, label: "lanmsg.loop")

    static var coreCount: Int { max(1, min(sysconf(Int32(_SC_NPROCESSORS_ONLN)), 64)) }

    package let loops: [Loop]
    private let counter = Atomic<Int>(0)

    /// Creates a group of `loopCount` serial queues (at least 1).
    /// - Parameters:
    ///   - loopCount: How many loops; nil for one per core.
    ///   - label: The queues' label prefix (shown in debuggers and crash logs).
    public init(loopCount: Int? = nil, label: String = "lanmsg.loop") {
        let count = max(1, loopCount ?? LoopGroup.coreCount)
        loops = (0..<count).map { Loop(index: $0, label: "\(label).\($0)") }
    }

    /// A group of the given loops (a client pins its connections to one loop of a group: every
    /// reconnect runs where the last connection ran).
    package init(loops: [Loop]) {
        precondition(!loops.isEmpty, "a loop group needs a loop")
        self.loops = loops
    }

    /// The number of loops.
    public var count: Int { loops.count }

    /// The loop for a new connection, round robin.
    package func next() -> Loop {
        let ticket = counter.wrappingAdd(1, ordering: .relaxed).oldValue
        return loops[Int(UInt(bitPattern: ticket) % UInt(loops.count))]
    }
}

/// One serial queue of a ``LoopGroup`` and a task executor running on it.
package final class Loop: Sendable {
    package let index: Int
    package let queue: DispatchQueue
    /// Runs tasks on ``queue`` (see `MessageChannel.taskExecutor`).
    package let executor: LoopExecutor
    /// The one timer for the coarse deadlines of this loop's connections.
    package let sweep: LoopSweep
    /// The sweeps of connections on virtual clocks (tests' `ManualScheduler`s), by clock. On the loop.
    private nonisolated(unsafe) var virtualSweeps: [ObjectIdentifier: LoopSweep] = [:]
    /// The one epoll set (and read source) for this loop's connections.
    package let readiness: LoopReadiness

    private static let key = DispatchSpecificKey<ObjectIdentifier>()

    init(index: Int, label: String) {
        self.index = index
        let queue = DispatchQueue(label: label)
        self.queue = queue
        executor = LoopExecutor(queue: queue)
        sweep = LoopSweep(queue: queue)
        readiness = LoopReadiness(queue: queue)
        queue.setSpecific(key: Loop.key, value: ObjectIdentifier(self))
    }

    /// The sweep for connections on `clock`, made at first use and kept for the loop's life (tests
    /// only: production connections use `sweep`). On the loop. `clock` must be a class (as
    /// `ManualScheduler` is): a struct would be boxed anew at each call and find no sweep twice.
    func sweep(for clock: any Scheduler) -> LoopSweep {
        dispatchPrecondition(condition: .onQueue(queue))
        let key = ObjectIdentifier(clock as AnyObject)
        if let sweep = virtualSweeps[key] { return sweep }
        let sweep = LoopSweep(queue: queue, clock: clock)
        virtualSweeps[key] = sweep
        return sweep
    }

    /// Whether the calling code runs on this loop (also from a queue that targets it).
    package var isCurrent: Bool { DispatchQueue.getSpecific(key: Loop.key) == ObjectIdentifier(self) }

    /// Runs `body` on this loop and returns its result: directly when already on it (for example
    /// from a handler of another connection of the same loop), else with `queue.sync`.
    package func run<T>(_ body: () -> T) -> T {
        isCurrent ? body() : queue.sync(execute: body)
    }
}

/// A task executor that runs jobs on one loop's queue.
///
/// A task that prefers it (`withTaskExecutorPreference`) runs on the same serial queue as the
/// connections of that loop: its sends need no hand-off to another thread (the frames it sends pile
/// up and are written in one `sendmsg` when it suspends), and its awaits on a channel resume without
/// waking a cooperative-pool thread.
package final class LoopExecutor: TaskExecutor, Sendable {
    package let queue: DispatchQueue

    init(queue: DispatchQueue) { self.queue = queue }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}
