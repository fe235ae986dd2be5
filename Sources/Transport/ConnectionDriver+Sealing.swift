import CLanmsgAEAD
import Dispatch
import ProtocolCore

import Glibc

/// Version 2's half of sending: a sender seals and writes its own frame, or the loop's flush seals
/// what is queued (the plaintext paths and the queue are in ConnectionDriver+Writing.swift).
extension ConnectionDriver {
    /// The most plaintext a sender seals and writes itself (larger batches go to the loop's flush).
    static let directSealLimit = 4 * SecureProtocol.maxPlaintext

    /// Version 2's ``writeDirectly(_:maxBuffers:)``: the sender seals its frame with the connection's
    /// sealer, under the lock (nothing else is unwritten and no flush is pending, so the nonce order
    /// is the byte order) and writes it with one `send`. What the socket does not take goes to the
    /// loop's flush as sealed bytes. Returns whether the flush must be scheduled.
    func sealDirectly(_ state: inout SendState, maxBuffers: Int) -> Bool {
        guard var sealer = state.sealer, state.sealedRemainder.isEmpty, state.writes.headIsRaw == false else {
            return state.writes.requestFlush()
        }
        return withUnsafeTemporaryAllocation(of: lanmsg_span.self, capacity: maxBuffers) { spans -> Bool in
            var used = 0
            var total = 0
            _ = state.writes.forEachUnwritten(maxBuffers: maxBuffers, sameKindOnly: true) { _, base, length in
                spans[used] = lanmsg_span(base: base.assumingMemoryBound(to: UInt8.self), length: length)
                used += 1
                total += length
            }
            guard total > 0, total <= Self.directSealLimit else { return state.writes.requestFlush() }
            let size = Self.sealedSize(total)
            let scratch = ThreadScratch.write.buffer(minimumSize: size)
            do throws(NoiseError) {
                try Self.seal(UnsafeBufferPointer(rebasing: spans[0..<used]), total: total, with: &sealer, into: scratch.baseAddress!)
            } catch {
                return state.writes.requestFlush()  // nothing sealed (the flush meets the error again)
            }
            state.sealer = sealer
            var vec = iovec(iov_base: scratch.baseAddress, iov_len: size)
            let written = withUnsafeMutablePointer(to: &vec) { sendDirectly(UnsafeMutableBufferPointer(start: $0, count: 1)) }
            var admitted: [PendingWrites.Admitted] = []
            let after = state.writes.didWrite(total, admitted: &admitted)
            assert(admitted.isEmpty)  // nobody waits while nothing was unwritten
            if written < size {
                // The socket is full (or failed): the flush writes the rest, and meets any error.
                state.sealedRemainder = Array(UnsafeRawBufferPointer(rebasing: scratch[written..<size]))
                return state.writes.requestFlush()
            }
            return after == .drained ? false : state.writes.requestFlush()
        }
    }

    /// The wire size of `total` plaintext bytes cut into transport messages.
    static func sealedSize(_ total: Int) -> Int {
        let messages = max(1, (total + SecureProtocol.maxPlaintext - 1) / SecureProtocol.maxPlaintext)
        return total + messages * SecureSender.sealedSize(0)
    }

    /// Seals the concatenation of `spans` (`total` bytes) as transport messages of up to
    /// ``SecureProtocol/maxPlaintext`` bytes each, written one after the other at `out` (room for
    /// ``sealedSize(_:)``): no copy of the plaintext first.
    static func seal(
        _ spans: UnsafeBufferPointer<lanmsg_span>, total: Int, with sealer: inout SecureSender, into out: UnsafeMutableRawPointer
    ) throws(NoiseError) {
        var failure: NoiseError?
        withUnsafeTemporaryAllocation(of: lanmsg_span.self, capacity: spans.count + 1) { message in
            var index = 0  // the span being sealed
            var offset = 0  // how much of it is sealed
            var cursor = out
            var left = total
            while left > 0 {
                let size = min(left, SecureProtocol.maxPlaintext)
                var count = 0
                var filled = 0
                while filled < size {
                    let span = spans[index]
                    let take = min(span.length - offset, size - filled)
                    message[count] = lanmsg_span(base: span.base! + offset, length: take)
                    count += 1
                    filled += take
                    offset += take
                    if offset == span.length {
                        index += 1
                        offset = 0
                    }
                }
                do throws(NoiseError) {
                    try sealer.seal(UnsafeBufferPointer(rebasing: message[0..<count]), plaintextCount: size, into: cursor)
                } catch {
                    failure = error
                    return
                }
                cursor += SecureSender.sealedSize(size)
                left -= size
            }
        }
        if let failure { throw failure }
    }

    /// Version 2's flush: takes up to about 1 MiB of queued frames, seals it into transport messages
    /// straight from the queued buffers (raw handshake bytes still queued go as they are), writes,
    /// repeats.
    func flushEncrypted(_ secure: SecureState) {
        while !isClosed {
            if !secure.sealedPending {
                guard refillSealed(secure) else { return }
                continue
            }
            let result: IOResult<Int>
            do {
                // send with MSG_NOSIGNAL, not write: a peer that reset the connection must give
                // EPIPE, not a SIGPIPE that kills the process.
                result = try syscall("send", nonblocking: true) { () -> Int in
                    Glibc.send(
                        fd.rawValue, secure.sealedStorage!.baseAddress! + secure.sealedOffset,
                        secure.sealedCount - secure.sealedOffset, Int32(MSG_NOSIGNAL))
                }
            } catch {
                return tearDown(Self.reason(for: error))
            }
            guard case .processed(let written) = result else { return resumeWriteSource() }
            configuration.metrics?.bytesOut.increment(by: written)
            secure.sealedOffset += written
        }
    }

    /// Fills `secure`'s sealed bytes: a sender's unwritten remainder, raw handshake bytes, or up to
    /// 1 MiB of queued frames sealed with the sealer (taken out of the send state while it seals,
    /// outside the lock: only the flush consumes queued buffers, so they stay put). False when
    /// there is nothing more (drained) or the connection closed.
    func refillSealed(_ secure: SecureState) -> Bool {
        let budget = 16 * SecureProtocol.maxPlaintext
        return withUnsafeTemporaryAllocation(of: lanmsg_span.self, capacity: Self.maxIOVecs) { spans -> Bool in
            var admitted: [PendingWrites.Admitted] = []
            var used = 0
            var total = 0
            var sealer: SecureSender?
            var filled = false  // bytes to write as they are are in `secure`'s storage
            let drainedNow = send.withLock { state -> Bool in
                if !state.sealedRemainder.isEmpty {
                    state.sealedRemainder.withUnsafeBytes { secure.hold(CollectionOfOne($0)) }
                    state.sealedRemainder = []
                    filled = true
                    return false
                }
                let raw = state.writes.headIsRaw ?? false
                _ = state.writes.forEachUnwritten(maxBuffers: Self.maxIOVecs, sameKindOnly: true) { _, base, length in
                    let take = min(length, budget - total)
                    guard take > 0 else { return }
                    spans[used] = lanmsg_span(base: base.assumingMemoryBound(to: UInt8.self), length: take)
                    used += 1
                    total += take
                }
                if total > 0 {
                    if raw {
                        secure.hold(spans[0..<used].lazy.map { UnsafeRawBufferPointer(start: $0.base, count: $0.length) })
                        _ = state.writes.didWrite(total, admitted: &admitted)
                        filled = true
                    } else {
                        sealer = state.sealer
                        state.sealer = nil
                    }
                    return false
                }
                state.writes.admitIfRoom(&admitted)
                if admitted.isEmpty { state.writes.flushDone() }
                return admitted.isEmpty
            }
            if filled {
                resume(admitted)
                return true
            }
            guard total > 0 else {
                resume(admitted)
                if drainedNow {
                    secure.releaseSealed()  // idle: hold no storage
                    drained()
                }
                return !drainedNow
            }
            guard var sealing = sealer else {
                tearDown(.protocolError("cannot encrypt: the transport has no sealer"))
                return false
            }
            let size = Self.sealedSize(total)
            do throws(NoiseError) {
                try Self.seal(UnsafeBufferPointer(rebasing: spans[0..<used]), total: total, with: &sealing, into: secure.sealedSpace(size))
            } catch {
                tearDown(.protocolError("cannot encrypt: \(error)"))
                return false
            }
            send.withLock { state in
                state.sealer = sealing
                _ = state.writes.didWrite(total, admitted: &admitted)
            }
            resume(admitted)
            secure.sealedOffset = 0
            secure.sealedCount = size
            return true
        }
    }
}
