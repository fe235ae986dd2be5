import ProtocolCore
import Dispatch

/// A task executor that runs jobs on one of the ``ConnectionLoops`` queues.
///
/// A task that prefers it (`withTaskExecutorPreference`) runs on the same serial queue as the
/// connections of that loop: its sends need no hand-off to another thread (the frames it sends
/// pile up and are written in one `sendmsg` when it suspends), and its awaits on the channel resume
/// without waking a cooperative-pool thread. One executor per loop, made once.
final class LoopExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked Sendable: immutable after init.
    let queue: DispatchQueue

    private init(loop: Int) { queue = ConnectionLoops.loops[loop] }

    static let executors: [LoopExecutor] = ConnectionLoops.loops.indices.map { LoopExecutor(loop: $0) }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }
}

extension MessageChannel {
    /// A task executor that runs on this channel's loop queue (the serial queue its socket events
    /// and handlers run on, shared with other connections of the same loop, like a NIO event loop).
    ///
    /// A task that streams to this channel can prefer it, so that sending needs no thread hand-off:
    /// ```swift
    /// try await withTaskExecutorPreference(channel.taskExecutor) {
    ///     for sample in samples { try await channel.send(sample, type: "sample") }
    /// }
    /// ```
    /// The frames such a task sends pile up while it runs and are written together when it
    /// suspends (at the latest when the send queue reaches its high-water mark). While the task
    /// runs, the other connections of its loop wait, as they do for a handler: keep CPU-heavy work
    /// off it, or let it suspend often.
    public var taskExecutor: any TaskExecutor { LoopExecutor.executors[Int(connection.loop)] }
}
