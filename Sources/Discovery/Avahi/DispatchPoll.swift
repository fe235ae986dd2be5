import CAvahiClient
import Dispatch
#if canImport(Glibc)
import Glibc
#endif

/// An `AvahiPoll` implementation on Dispatch: watches become Dispatch read/write sources and
/// timeouts become one-shot Dispatch timers, all on one serial queue reserved for Avahi.
///
/// No helper thread and no polling loop: when Avahi is idle, nothing runs.
///
/// Thread-safety: every member is confined to `queue` (libavahi-client does no locking, and calls
/// into this adapter only from calls we make on `queue` or from the sources' handlers on `queue`).
final class DispatchPoll: @unchecked Sendable {
    let queue: DispatchQueue
    /// Stable storage for the C vtable; its `userdata` points back at `self` (unretained).
    let api: UnsafeMutablePointer<AvahiPoll>
    /// Live objects, for leak checks in tests (queue-confined).
    fileprivate(set) var liveWatches = 0
    fileprivate(set) var liveTimeouts = 0
    /// How many times a watch or timeout fired (queue-confined); an idle client should not move it.
    fileprivate(set) var wakeups = 0

    init(queue: DispatchQueue) {
        self.queue = queue
        self.api = .allocate(capacity: 1)
        self.api.initialize(
            to: AvahiPoll(
                userdata: nil,
                watch_new: pollWatchNew,
                watch_update: pollWatchUpdate,
                watch_get_events: pollWatchGetEvents,
                watch_free: pollWatchFree,
                timeout_new: pollTimeoutNew,
                timeout_update: pollTimeoutUpdate,
                timeout_free: pollTimeoutFree
            )
        )
        self.api.pointee.userdata = Unmanaged.passUnretained(self).toOpaque()
    }

    deinit {
        api.deinitialize(count: 1)
        api.deallocate()
    }

    fileprivate static func from(_ api: UnsafePointer<AvahiPoll>?) -> DispatchPoll {
        Unmanaged<DispatchPoll>.fromOpaque(api!.pointee.userdata!).takeUnretainedValue()
    }
}

// MARK: - Watches

private let watchIn = UInt32(AVAHI_WATCH_IN.rawValue)
private let watchOut = UInt32(AVAHI_WATCH_OUT.rawValue)
private let watchErr = UInt32(AVAHI_WATCH_ERR.rawValue)
private let watchHup = UInt32(AVAHI_WATCH_HUP.rawValue)
/// Upstream bug: the D-Bus glue passes raw D-Bus flags to `watch_update`, where WRITABLE is 0x2
/// (POLLPRI). We treat 0x2 as "writable".
private let dbusWritable: UInt32 = 0x2

/// One watched descriptor. Confined to the poll's queue.
private final class Watch {
    unowned let poll: DispatchPoll
    let fd: Int32
    let callback: AvahiWatchCallback
    let userdata: UnsafeMutableRawPointer?
    var requested: UInt32 = 0
    var happened: UInt32 = 0
    var readSource: (any DispatchSourceRead)?
    var writeSource: (any DispatchSourceWrite)?
    var freed = false

    init(poll: DispatchPoll, fd: Int32, callback: AvahiWatchCallback, userdata: UnsafeMutableRawPointer?) {
        self.poll = poll
        self.fd = fd
        self.callback = callback
        self.userdata = userdata
    }

    var handle: OpaquePointer { OpaquePointer(Unmanaged.passUnretained(self).toOpaque()) }

    func update(_ events: UInt32) {
        requested = events
        let wantIn = events & (watchIn | watchErr | watchHup) != 0
        let wantOut = events & (watchOut | dbusWritable) != 0
        if wantIn, readSource == nil {
            let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: poll.queue)
            // Strong capture: the handler keeps the watch alive while it runs, even when Avahi frees
            // the watch from inside its own callback. Cancelling the source releases the handler.
            source.setEventHandler { self.fire(watchIn) }
            source.resume()
            readSource = source
        } else if !wantIn, let source = readSource {
            source.cancel()
            readSource = nil
        }
        if wantOut, writeSource == nil {
            let source = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: poll.queue)
            source.setEventHandler { self.fire(watchOut) }
            source.resume()
            writeSource = source
        } else if !wantOut, let source = writeSource {
            source.cancel()
            writeSource = nil
        }
    }

    func fire(_ event: UInt32) {
        guard !freed else { return }
        poll.wakeups += 1
        happened = event
        callback(handle, fd, AvahiWatchEvent(rawValue: event), userdata)
        happened = 0
    }

    func free() {
        freed = true
        readSource?.cancel()
        readSource = nil
        writeSource?.cancel()
        writeSource = nil
    }
}

private func pollWatchNew(
    _ api: UnsafePointer<AvahiPoll>?, _ fd: Int32, _ event: AvahiWatchEvent,
    _ callback: AvahiWatchCallback?, _ userdata: UnsafeMutableRawPointer?
) -> OpaquePointer? {
    let poll = DispatchPoll.from(api)
    guard let callback else { return nil }
    let watch = Watch(poll: poll, fd: fd, callback: callback, userdata: userdata)
    watch.update(UInt32(event.rawValue))
    poll.liveWatches += 1
    return OpaquePointer(Unmanaged.passRetained(watch).toOpaque())
}

private func watchFrom(_ pointer: OpaquePointer?) -> Watch {
    Unmanaged<Watch>.fromOpaque(UnsafeRawPointer(pointer!)).takeUnretainedValue()
}

private func pollWatchUpdate(_ watch: OpaquePointer?, _ event: AvahiWatchEvent) {
    watchFrom(watch).update(UInt32(event.rawValue))
}

private func pollWatchGetEvents(_ watch: OpaquePointer?) -> AvahiWatchEvent {
    AvahiWatchEvent(rawValue: watchFrom(watch).happened)
}

private func pollWatchFree(_ pointer: OpaquePointer?) {
    let watch = watchFrom(pointer)
    watch.free()
    watch.poll.liveWatches -= 1
    Unmanaged<Watch>.fromOpaque(UnsafeRawPointer(pointer!)).release()
}

// MARK: - Timeouts

/// One timeout: a one-shot Dispatch timer. Confined to the poll's queue.
private final class Timeout {
    unowned let poll: DispatchPoll
    let timer: any DispatchSourceTimer
    let callback: AvahiTimeoutCallback
    let userdata: UnsafeMutableRawPointer?
    var armed = false
    var freed = false

    init(poll: DispatchPoll, callback: AvahiTimeoutCallback, userdata: UnsafeMutableRawPointer?) {
        self.poll = poll
        self.callback = callback
        self.userdata = userdata
        self.timer = DispatchSource.makeTimerSource(queue: poll.queue)
    }

    var handle: OpaquePointer { OpaquePointer(Unmanaged.passUnretained(self).toOpaque()) }

    /// `tv` is an absolute `gettimeofday` time; nil disables the timeout; `{0,0}` means now.
    func schedule(_ tv: UnsafePointer<timeval>?) {
        guard let tv else {
            armed = false
            timer.schedule(deadline: .distantFuture)
            return
        }
        armed = true
        var now = timeval()
        gettimeofday(&now, nil)
        let target = Int64(tv.pointee.tv_sec) * 1_000_000 + Int64(tv.pointee.tv_usec)
        let current = Int64(now.tv_sec) * 1_000_000 + Int64(now.tv_usec)
        let delay = max(0, target - current)
        timer.schedule(deadline: .now() + .microseconds(Int(delay)), leeway: .milliseconds(1))
    }

    func fire() {
        guard armed, !freed else { return }
        armed = false  // one-shot: disabled after firing until re-armed
        poll.wakeups += 1
        callback(handle, userdata)
    }
}

private func pollTimeoutNew(
    _ api: UnsafePointer<AvahiPoll>?, _ tv: UnsafePointer<timeval>?,
    _ callback: AvahiTimeoutCallback?, _ userdata: UnsafeMutableRawPointer?
) -> OpaquePointer? {
    let poll = DispatchPoll.from(api)
    guard let callback else { return nil }
    let timeout = Timeout(poll: poll, callback: callback, userdata: userdata)
    // Strong capture, released when the timer is cancelled in timeout_free.
    timeout.timer.setEventHandler { timeout.fire() }
    timeout.schedule(tv)
    timeout.timer.resume()
    poll.liveTimeouts += 1
    return OpaquePointer(Unmanaged.passRetained(timeout).toOpaque())
}

private func timeoutFrom(_ pointer: OpaquePointer?) -> Timeout {
    Unmanaged<Timeout>.fromOpaque(UnsafeRawPointer(pointer!)).takeUnretainedValue()
}

private func pollTimeoutUpdate(_ pointer: OpaquePointer?, _ tv: UnsafePointer<timeval>?) {
    timeoutFrom(pointer).schedule(tv)
}

private func pollTimeoutFree(_ pointer: OpaquePointer?) {
    let timeout = timeoutFrom(pointer)
    timeout.freed = true
    timeout.timer.cancel()
    timeout.poll.liveTimeouts -= 1
    Unmanaged<Timeout>.fromOpaque(UnsafeRawPointer(pointer!)).release()
}
