import Dispatch
import ProtocolCore

/// Version 2's state of a connection, made only for connections that speak it: while raw, read
/// bytes go to the handler (the handshake); once `transport` is set, everything read is opened and
/// every byte written is sealed. Confined to the loop.
final class SecureState {
    var rawInput = true
    var transport: SecureTransport?
    /// Sealed (or raw) bytes taken from the queue and not yet written.
    var sealed: [UInt8] = []
    var sealedOffset = 0

    var sealedPending: Bool { sealedOffset < sealed.count }
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
        state.rawInput = false
        state.transport = transport
        send.withLock { $0.encrypted = true }
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
    package var transportMessageCounts: (sent: UInt64, received: UInt64)? { secure?.transport?.messageCounts }

    /// Whether the transport is encrypted (version 2).
    package var isEncrypted: Bool { secure?.transport != nil }

    /// Opens received transport messages into the frame decoder; false when one failed (closed).
    func openSecure(_ bytes: UnsafeRawBufferPointer, _ state: SecureState) -> Bool {
        do {
            let plaintext = try state.transport!.open(bytes)
            plaintext.withUnsafeBytes { decoder.append($0) }
            return true
        } catch {
            let text =
                "a transport message failed authentication (\(error)): the data was altered or corrupted "
                + "on the way, or the peer's encryption is broken"
            logger.warning("\(text)")
            tearDown(.protocolError(text))
            return false
        }
    }

}
