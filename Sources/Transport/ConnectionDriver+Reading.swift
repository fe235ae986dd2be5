import Dispatch
import Locks
import Logging
import ProtocolCore

import Glibc

/// Reading: the socket is read when the loop's epoll set reports it (``LoopReadiness``), a bounded
/// amount per turn, and complete frames go to the handler. On the loop.
extension ConnectionDriver {
    /// Stops reading the socket until a matching ``resumeReading()`` (calls are counted). On the loop.
    package func pauseReading() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !isClosed else { return }
        readPauseCount += 1
        if readPauseCount == 1 { watchSocket(false) }
    }

    /// Balances one ``pauseReading()``. On the loop.
    package func resumeReading() {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !isClosed, readPauseCount > 0 else { return }
        readPauseCount -= 1
        if readPauseCount == 0 {
            lastFrameTime = now
            watchSocket(true)
        }
    }

    /// The largest `SO_RCVLOWAT` asked for: the kernel grows the receive buffer to hold it.
    package static let maxReceiveLowWater = 1024 * 1024

    private func setReceiveLowWater(_ bytes: Int) {
        var value = Int32(clamping: max(bytes, 1))
        guard value != receiveLowWater else { return }
        if setsockopt(fd.rawValue, SOL_SOCKET, SO_RCVLOWAT, &value, socklen_t(MemoryLayout<Int32>.size)) == 0 {
            receiveLowWater = value
        }
    }

    /// Takes the socket out of the loop's epoll set while reading is paused, and puts it back.
    private func watchSocket(_ watched: Bool) {
        guard readSlot >= 0 else { return }
        do throws(TransportError) {
            try loop.readiness.watch(readSlot, fd: fd.rawValue, watched)
        } catch {
            logger.warning("cannot \(watched ? "resume" : "pause") reading the socket: \(error)")
            tearDown(.error(error.errno ?? EIO))
        }
    }

    /// Reads what the socket has (a bounded amount per turn). Run by the loop's ``LoopReadiness``.
    func handleReadable() {
        for _ in 0..<8 {
            guard readPauseCount == 0, lifecycle.isReading else { return }
            var result: IOResult<Int> = .wouldBlock
            var failure: TransportError?
            /// One nonblocking read into `space`: the bytes read (0 at end of file, would-block or
            /// an error, which `result` and `failure` tell apart).
            func readInto(_ space: UnsafeMutableRawBufferPointer) -> Int {
                do throws(TransportError) {
                    result = try syscall("read", nonblocking: true) { read(fd.rawValue, space.baseAddress, space.count) }
                } catch {
                    failure = error
                }
                if case .processed(let count) = result { return count }
                return 0
            }
            do throws(TransportError) {
                if let receiver = secure?.receiver, receiver.pendingBytes > 0 {
                    // A transport message is incomplete: read the rest (and more) straight after it.
                    do throws(NoiseError) {
                        _ = try receiver.readIntoPending(extra: Self.secureReadExtra, into: &decoder, readInto)
                    } catch {
                        return failedToOpen(error)
                    }
                } else if secure == nil && decoder.missingPayloadBytes > 0 {
                    // A large payload: read straight into its array (no reassembly copies).
                    decoder.fillPayload(readInto)
                } else {
                    let buffer = ThreadScratch.read.buffer(minimumSize: configuration.readBufferSize)
                    let count = readInto(buffer)
                    if count > 0 {
                        let bytes = UnsafeRawBufferPointer(rebasing: buffer[0..<count])
                        if let secure {
                            if secure.rawInput {
                                handler?.connection(self, receivedBytes: Array(bytes))
                            } else if !openSecure(bytes, secure) {
                                return
                            }
                        } else {
                            decoder.append(bytes)
                        }
                    }
                }
                if let failure { throw failure }
            } catch {
                tearDown(Self.reason(for: error))
                return
            }
            switch result {
            case .wouldBlock:
                decoder.releaseStorageIfEmpty()  // drained: hold no storage while idle
                secure?.receiver?.releaseStorageIfIdle()
                // While a large payload is incomplete, ask the kernel to report the socket readable
                // only once the rest (up to 1 MiB) is there: one wake-up per megabyte, not per few
                // segments. End of file and errors are reported regardless.
                if secure == nil { setReceiveLowWater(min(decoder.missingPayloadBytes, Self.maxReceiveLowWater)) }
                return
            case .processed(0):
                perform(lifecycle.endOfFile(partialFrameBytes: decoder.bufferedByteCount))
                return
            case .processed(let count):
                configuration.metrics?.bytesIn.increment(by: count)
                if receiveLowWater > 1 && decoder.missingPayloadBytes == 0 { setReceiveLowWater(1) }
                deliverFrames()
            }
        }
    }

    func deliverFrames() {
        while !isClosed {
            let frame: Frame?
            do {
                frame = try decoder.next()
            } catch {
                logger.warning("hostile or broken input: \(error.message)")
                tearDown(error.closeReason ?? .protocolError(error.message))
                return
            }
            guard let frame else { return }
            configuration.metrics?.received(frame)
            lastFrameTime = now
            handler?.connection(self, received: frame)
        }
    }
}
