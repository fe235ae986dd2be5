import Dispatch
import ProtocolCore

/// Version 2's state of a connection, made only for connections that speak it: while raw, read
/// bytes go to the handler (the handshake); once `receiver` is set, everything read is opened and
/// every byte written is sealed (the sealing half lives in the send state, under its lock: a sender
/// may seal and write its own frame). Confined to the loop.
final class SecureState {
    /// The receiving half, from the end of the handshake on.
    var receiver: SecureReceiver?
    /// Read bytes go to the handler as they are (the handshake).
    var rawInput: Bool { receiver == nil }
    /// Sealed (or raw) bytes the flush took and has not written yet: `sealedOffset..<sealedCount`.
    private(set) var sealedStorage: UnsafeMutableRawBufferPointer?
    var sealedCount = 0
    var sealedOffset = 0

    var sealedPending: Bool { sealedOffset < sealedCount }

    /// Room for `size` sealed bytes from the start of the storage (only when nothing is pending).
    func sealedSpace(_ size: Int) -> UnsafeMutableRawPointer {
        precondition(!sealedPending)
        if let storage = sealedStorage, storage.count >= size { return storage.baseAddress! }
        sealedStorage?.deallocate()
        let storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(size, 64 * 1024), alignment: 16)
        sealedStorage = storage
        return storage.baseAddress!
    }

    /// The next bytes to write as they are (a sender's unwritten sealed bytes, raw handshake
    /// bytes): `pieces` copied in order (only when nothing is pending).
    func hold(_ pieces: some Sequence<UnsafeRawBufferPointer>) {
        var total = 0
        for piece in pieces { total += piece.count }
        var cursor = sealedSpace(total)
        for piece in pieces where piece.count > 0 {
            cursor.copyMemory(from: piece.baseAddress!, byteCount: piece.count)
            cursor += piece.count
        }
        sealedOffset = 0
        sealedCount = total
    }

    /// Idle: hold no sealed storage.
    func releaseSealed() {
        sealedStorage?.deallocate()
        sealedStorage = nil
        sealedCount = 0
        sealedOffset = 0
    }

    deinit { sealedStorage?.deallocate() }
}

/// Version 2 (docs/PROTOCOL.md, "Version 2"): raw bytes during the handshake, then every byte read
/// opened and every frame sealed (the sealing flush is in ConnectionDriver+Writing.swift).
extension ConnectionDriver {
    /// Starts like ``start(handler:)`` but reads raw bytes (reported with
    /// `connection(_:receivedBytes:)`) until ``beginEncryption(_:leftover:)`` or
    /// ``beginFrames(leftover:)``. On the loop, once.
    package func startRaw(handler: any ConnectionHandler) {
        secure = SecureState()
        start(handler: handler)
    }

    /// Queues bytes written as they are, before any frame (the preamble and handshake messages).
    /// Any context.
    package func sendRaw(_ bytes: [UInt8]) {
        let flush = send.withLock { state in (try? state.writes.enqueueRaw(bytes)) == .scheduleFlush }
        if flush { scheduleFlush() }
    }

    /// The handshake is over: from now on every byte read is opened with `transport` (first
    /// `leftover`, bytes that arrived after the handshake) and every frame is sealed. Frames decoded
    /// from `leftover` are delivered once the current read event is handled. On the loop.
    package func beginEncryption(_ transport: SecureTransport, leftover: [UInt8]) {
        dispatchPrecondition(condition: .onQueue(queue))
        let state = secure ?? SecureState()
        secure = state
        state.receiver = transport.receiver
        send.withLock {
            $0.encrypted = true
            $0.sealer = transport.sender
        }
        if !leftover.isEmpty {
            leftover.withUnsafeBytes { _ = openSecure($0, state) }
        }
    }

    /// The peer speaks version 1 after all: read frames from now on, `leftover` first (delivered
    /// once the current read event is handled). On the loop.
    package func beginFrames(leftover: [UInt8]) {
        dispatchPrecondition(condition: .onQueue(queue))
        secure = nil
        leftover.withUnsafeBytes { decoder.append($0) }
    }

    /// Delivers frames already decoded (after ``beginFrames(leftover:)`` outside a read event). On the loop.
    package func deliverBufferedFrames() {
        dispatchPrecondition(condition: .onQueue(queue))
        deliverFrames()
    }

    /// Transport messages sealed and opened so far (nil in plaintext). On the loop.
    package var transportMessageCounts: (sent: UInt64, received: UInt64)? {
        guard let received = secure?.receiver?.messageCount else { return nil }
        return (send.withLock { $0.sealer?.messageCount ?? 0 }, received)
    }

    /// Sets both directions' next nonce (tests only: with nothing in flight and the peer's driver
    /// set to the same value, a test reaches the rekey point in a few messages). On the loop.
    package func setTransportNonces(_ nonce: UInt64) {
        dispatchPrecondition(condition: .onQueue(queue))
        secure?.receiver?.setNonce(nonce)
        send.withLock { $0.sealer?.setNonce(nonce) }
    }

    /// Whether the transport is encrypted (version 2).
    package var isEncrypted: Bool { secure?.receiver != nil }

    /// Opens received transport messages straight into the frame decoder; false when one failed (closed).
    func openSecure(_ bytes: UnsafeRawBufferPointer, _ state: SecureState) -> Bool {
        do throws(NoiseError) {
            try state.receiver!.open(bytes, into: &decoder)
            return true
        } catch {
            failedToOpen(error)
            return false
        }
    }

    /// A received message that does not authenticate ends the connection at once.
    func failedToOpen(_ error: NoiseError) {
        let text =
            "a transport message failed authentication (\(error)): the data was altered or corrupted "
            + "on the way, or the peer's encryption is broken"
        logger.warning("\(text)")
        tearDown(.protocolError(text))
    }

    /// Bytes to read beyond the rest of a message already begun: a few messages' worth, so that a
    /// bulk stream is read in large pieces straight into the incomplete message's buffer.
    static let secureReadExtra = 4 * (SecureProtocol.maxMessage + 2)

}
