import CEpoll
import Dispatch
import ProtocolCore

#if canImport(Glibc)
    import Glibc
#endif

/// Which of a loop's connections have something to read: one epoll set per loop, watched by one
/// Dispatch read source on the loop's queue, instead of a Dispatch read source per connection.
///
/// A read source costs about 500 bytes of heap for a connection's whole life (the source object,
/// its kernel-event note, the handler block and its context: docs/PERFORMANCE.md) — a fifth of an
/// idle connection. An epoll registration costs the process nothing (the kernel keeps it) plus a
/// slot here. It also batches: when many connections are readable at once (a broadcast's replies,
/// the heartbeats of thousands of idle peers), one wake-up of the loop serves up to ``batch`` of
/// them instead of one Dispatch hand-off each.
///
/// The set is level-triggered, like a read source: a connection that leaves bytes unread (it reads
/// a bounded amount per turn) is reported again at the next turn, and Dispatch runs the handler
/// again as long as the epoll descriptor is readable. Pausing a connection takes its socket out of
/// the set (a paused socket whose peer hung up would otherwise be reported on every turn).
///
/// Confined to the loop's queue: every method runs there (checked in debug builds).
package final class LoopReadiness: @unchecked Sendable {
    /// The most connections served in one turn; more are served in the next.
    package static let batch: Int32 = 64

    private let queue: DispatchQueue
    private var epoll: Int32 = -1
    private var source: (any DispatchSourceRead)?
    private let events: UnsafeMutablePointer<epoll_event>
    /// Registered connections by slot; a slot's generation changes when it is freed, so an event
    /// fetched for a connection that closed earlier in the same turn never reaches its successor.
    private var drivers: [ConnectionDriver?] = []
    private var generations: [UInt32] = []
    private var freeSlots: [Int32] = []
    /// How many times the set was read (diagnostics and tests: a socket reported over and over
    /// would show here). On the loop.
    package private(set) var turns: UInt64 = 0

    init(queue: DispatchQueue) {
        self.queue = queue
        events = .allocate(capacity: Int(Self.batch))
    }

    deinit {
        events.deallocate()
        guard let source else { return }
        let epoll = self.epoll
        source.setCancelHandler { _ = close(epoll) }
        source.cancel()
    }

    /// The epoll descriptor, -1 before the first connection (tests read the kernel's view of the
    /// set from `/proc/self/fdinfo`). On the loop.
    package var descriptor: Int32 {
        dispatchPrecondition(condition: .onQueue(queue))
        return epoll
    }

    /// How many connections are registered (diagnostics and tests). On the loop.
    package var count: Int {
        dispatchPrecondition(condition: .onQueue(queue))
        return drivers.count - freeSlots.count
    }

    /// Registers `driver`'s socket, watched for reading: the driver's `handleReadable()` runs on the
    /// loop when there is something to read. Returns its slot. On the loop.
    /// - Throws: the errno of `epoll_create1` or `epoll_ctl` (out of descriptors or memory).
    func add(_ driver: ConnectionDriver) throws(TransportError) -> Int32 {
        dispatchPrecondition(condition: .onQueue(queue))
        if epoll < 0 { try open() }
        let slot: Int32
        if let free = freeSlots.popLast() {
            slot = free
            drivers[Int(slot)] = driver
        } else {
            slot = Int32(drivers.count)
            drivers.append(driver)
            generations.append(0)
        }
        do throws(TransportError) {
            try watch(slot, fd: driver.fd.rawValue, true)
        } catch {
            release(slot)
            throw error
        }
        return slot
    }

    /// Starts (`true`) or stops watching a registered socket: a paused connection's socket leaves
    /// the set. On the loop.
    func watch(_ slot: Int32, fd: Int32, _ watched: Bool) throws(TransportError) {
        dispatchPrecondition(condition: .onQueue(queue))
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.u64 = UInt64(UInt32(bitPattern: slot)) | UInt64(generations[Int(slot)]) << 32
        if epoll_ctl(epoll, watched ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &event) != 0 {
            throw TransportError.syscall("epoll_ctl", errno: errno)
        }
    }

    /// Forgets a slot (its socket must be out of the set, or about to be closed). On the loop.
    func remove(_ slot: Int32, fd: Int32, watched: Bool) {
        dispatchPrecondition(condition: .onQueue(queue))
        if watched { try? watch(slot, fd: fd, false) }
        release(slot)
    }

    private func release(_ slot: Int32) {
        drivers[Int(slot)] = nil
        generations[Int(slot)] &+= 1
        freeSlots.append(slot)
    }

    private func open() throws(TransportError) {
        let fd = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard fd >= 0 else { throw TransportError.syscall("epoll_create1", errno: errno) }
        epoll = fd
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        source.setEventHandler { [weak self] in self?.serve() }
        self.source = source
        source.resume()
    }

    /// One turn: the connections readable now (up to ``batch``) read.
    private func serve() {
        turns &+= 1
        let count = epoll_wait(epoll, events, Self.batch, 0)
        guard count > 0 else { return }
        for index in 0..<Int(count) {
            let data = events[index].data.u64
            let slot = Int(UInt32(truncatingIfNeeded: data))
            guard slot < drivers.count, generations[slot] == UInt32(truncatingIfNeeded: data >> 32),
                let driver = drivers[slot]
            else { continue }
            driver.handleReadable()
        }
    }
}
