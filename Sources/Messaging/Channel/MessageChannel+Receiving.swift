import Dispatch
import FastJSON
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

// MARK: Receiving (on the loop)

extension MessageChannel: ConnectionHandler {
    package func connection(_ connection: ConnectionDriver, received frame: Frame) {
        assertOnLoop()
        // Behind a session message held for its epoch's records: in order, after it.
        if let link = sessionLink, !link.heldForEpoch.isEmpty { return link.heldForEpoch.append(frame) }
        switch machine.received(frame, from: peer) {
        case .message:
            deliverMessage(frame)
        case .reply(let request):
            configuration.metrics?.requestAnswered(type: request.typeID, nanoseconds: driver.now &- request.sentAt)
            request.token.resume(returning: IncomingMessage(frame: frame, codecs: configuration.codecs))
        case .lateReply(let replyTo):
            logger.notice("dropping late reply '\(frame.typeID)' to request #\(replyTo), which timed out")
        case .sessionMessage:
            receivedSessionMessage(frame)
        case .ping:
            let pace = configuration.heartbeatPacer?.pace ?? 0
            driver.enqueue(Frame.pong(reference: frame.sequence, pace: pace), bypassLimit: true) { _ in }
            pingAlongIfDueSoon()
        case .pong:
            peerPaced(frame.pongPace)
            if let reference = frame.reference, rtt.pongReceived(reference: reference, now: driver.now),
                let watchers = sessionLink?.healthWatchers, !watchers.isEmpty
            {
                let health = healthOnLoop()
                for watcher in watchers { watcher.yield(health) }
            }
        case .sessionAnswer(let waiter, let hello):
            sessionAnswered(hello, waiter)
        case .sessionHello(let waiter, let hello):
            waiter.succeed(hello)
        case .sessionKept:
            break
        case .lateSessionAnswer:
            logger.debug("the server answered the SESSION frame after the wait for it timed out; the connection is closing, and the session continues on the next one")
        case .ack(let count):
            if let text = sessionLink?.session?.acknowledged(count, on: self) { violation(text) }
        case .goodbye(let reason):
            logger.debug("peer said goodbye: \(reason)")
            driver.closeGracefully(reason: .goodbye(reason))
        case .startTransfer(let header):
            startTransfer(frame, header)
        case .chunk(let stream, let bytes):
            stream.sink.buffer.push(bytes)
            stream.sink.progressContinuation.yield(
                TransferProgress(
                    streamID: stream.streamID, typeID: stream.typeID, completedBytes: stream.received,
                    totalBytes: stream.totalSize, isFinished: false))
        case .transferCompleted(let stream):
            stream.sink.progressContinuation.yield(
                TransferProgress(
                    streamID: stream.streamID, typeID: stream.typeID, completedBytes: stream.received,
                    totalBytes: stream.totalSize, isFinished: true))
            stream.sink.buffer.finish()
            stream.sink.progressContinuation.finish()
        case .transferFailed(let stream, let text):
            logger.info("transfer '\(stream.typeID)' #\(stream.streamID) failed: \(text)")
            stream.sink.buffer.finish(throwing: TransportError(.transferFailed, text))
            stream.sink.progressContinuation.finish()
        case .violation(let text):
            violation(text)
        }
    }

    package func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) {
        assertOnLoop()
        switch kind {
        case .heartbeat: heartbeatTick()
        case .request: requestsTimedOut()
        case .ack:
            sessionLink?.session?.ackDeadlinePassed(on: self)
            sendAck()
        case .handshake, .idleCheck, .linger: break
        }
    }

    package func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
        assertOnLoop()
        configuration.metrics?.closed(reason)
        let error = TransportError.closed(reason)
        let waiting = machine.closed()
        for request in waiting.requests { request.token.resume(throwing: error) }
        for stream in waiting.transfers {
            stream.sink.buffer.finish(
                throwing: TransportError(.transferFailed, "the connection closed during the transfer (\(reason))"))
            stream.sink.progressContinuation.finish()
        }
        handlers.removeAll()
        installs.load()?.list.withLock { $0.removeAll() }
        if let link = sessionLink {
            for watcher in link.healthWatchers { watcher.finish() }
            link.healthWatchers = []
            link.heldForEpoch = []  // never counted: the peer sends the session message again
            link.session?.detach(self)
            link.session = nil  // (the session may hold this channel: no cycle after the close)
        }
        waiting.hello?.fail(error)
        waiting.answer?.fail(error)
        messageBuffer.finish()
        transferBuffer.finish()
        if let route {
            self.route = nil
            route.closed(reason, self)  // after the last message
        }
    }

    /// A session message (the channel machine saw it): numbered and delivered, dropped, or held.
    private func receivedSessionMessage(_ frame: Frame) {
        guard let link = sessionLink, let session = link.session else { return deliverMessage(frame) }
        switch session.received(on: self) {
        case .deliver(let token): deliverMessage(frame, session: token)
        // Not delivered: this connection was replaced (the new one resends it), or the app has it
        // already (resent after a reconnect before the app handled it).
        case .ignore: break
        case .hold: holdForEpoch(frame, link, session)
        }
    }

    /// Power-loss durability, the first message of a session's new epoch, whose records are not
    /// synced yet (`SessionMachine.epochPending`): it waits — not counted, not delivered — with
    /// every frame after it, and the connection stops reading, until the sync; then they go on in
    /// order. No thread waits: the sync's completion hops to the loop. A close meanwhile drops
    /// them: the session message was never counted, and the peer sends it again.
    private func holdForEpoch(_ frame: Frame, _ link: SessionLink, _ session: MessageSession) {
        link.heldForEpoch = [frame]
        session.epochHolds.add(1, ordering: .relaxed)
        driver.pauseReading()
        session.whenEpochDurable { [self] in queue.async { self.releaseEpochHold() } }
    }

    private func releaseEpochHold() {
        assertOnLoop()
        defer { driver.resumeReading() }  // (balances this hold's pause; a new hold paused again)
        // (The link stays the channel's once made; a close emptied it.)
        guard let link = sessionLink, !driver.isClosed else { return }
        var frames = link.heldForEpoch
        link.heldForEpoch = []
        guard !frames.isEmpty else { return }
        receivedSessionMessage(frames.removeFirst())
        for (index, frame) in frames.enumerated() {
            // Closed by one of them (a GOODBYE, a violation): the rest goes with the connection, as
            // the driver's own delivery stops at a close.
            guard !driver.isClosed else { return }
            // Held again (a newer epoch): the rest waits behind it.
            guard link.heldForEpoch.isEmpty else { return link.heldForEpoch += frames[index...] }
            connection(driver, received: frame)
        }
    }

    func violation(_ text: String) {
        assertOnLoop()
        logger.warning("peer \(remoteAddress.map { "\($0)" } ?? "?") violated the protocol: \(text)")
        driver.enqueue(Frame(kind: .goodbye, payload: Array("protocol error: \(text)".utf8)), bypassLimit: true) { _ in }
        driver.closeGracefully(reason: .protocolError(text))
    }

    /// A message for the app: to its handler, else the route or ``messages``.
    private func deliverMessage(_ frame: Frame, session: SessionMessageToken? = nil) {
        let message = IncomingMessage(frame: frame, codecs: configuration.codecs, session: session)
        mergeInstalls()
        if let handler = handlers[frame.typeID] {
            handler(message)
        } else {
            deliverUnhandled(message)
        }
    }

    /// A message no handler or request took: to the server's route, or to ``messages``. On the loop.
    func deliverUnhandled(_ message: IncomingMessage) {
        assertOnLoop()
        if let route { deliver(message, to: route) } else { messageBuffer.push(message) }
    }

    private func deliver(_ message: IncomingMessage, to route: any MessageRoute) {
        if !route.deliver(message, from: self) { stopReadingForRoute() }
    }

    /// The route's receiver is full: stop reading until its ``resumeProducing()``. On the loop.
    private func stopReadingForRoute() {
        if !routeStopped {
            routeStopped = true
            driver.pauseReading()
        }
    }

    /// Server or client: hands the messages no handler or request takes, and the transfers, to `route`, on
    /// the loop and in order, instead of ``messages`` and ``transfers``, and then the close — so
    /// that no task waits per connection to move them on (a waiting task costs ~2.9 KB). What
    /// arrived before goes first. Any context; takes effect on the loop.
    func route(to route: any MessageRoute) {
        queue.async { [self] in
            for message in lazyMessageBuffer.load()?.takeAll() ?? [] { deliver(message, to: route) }
            for transfer in lazyTransferBuffer.load()?.takeAll() ?? [] where !route.transfer(transfer, from: self) {
                stopReadingForRoute()
            }
            if driver.isClosed {
                route.closed(driver.closeReason ?? .localClose, self)
            } else {
                self.route = route
            }
        }
    }

    private func startTransfer(_ frame: Frame, _ header: TransferHeader) {
        let buffer: BoundedQueue<[UInt8]> = Self.inboundBuffer(driver, limit: configuration.transferChunkBufferLimit)
        let transfer = IncomingTransfer(streamID: frame.sequence, typeID: frame.typeID, header: header, buffer: buffer)
        machine.transferStarted(frame, header: header, sink: transfer)
        transfer.progressContinuation.yield(
            TransferProgress(
                streamID: frame.sequence, typeID: frame.typeID, completedBytes: 0, totalBytes: header.size,
                isFinished: false))
        if let route {
            if !route.transfer(transfer, from: self) { stopReadingForRoute() }
        } else {
            transferBuffer.push(transfer)
        }
    }
}

/// Where a channel hands its messages, its transfers and then its close
/// (``MessageChannel/route(to:)``), on the channel's loop: the events of its server or client.
/// A protocol so that the receiver can be an object the connection has anyway (a server's
/// ``ServerConnection``): three closures and their contexts cost about 270 bytes for each of
/// thousands of idle connections.
protocol MessageRoute: AnyObject, Sendable {
    /// Takes a message; false when the receiver is full: the channel stops reading until its
    /// ``QueueProducer/resumeProducing()``.
    func deliver(_ message: IncomingMessage, from channel: MessageChannel) -> Bool
    /// Takes a transfer; false when the receiver is full, as for ``deliver(_:from:)``.
    func transfer(_ transfer: IncomingTransfer, from channel: MessageChannel) -> Bool
    /// The channel closed, after its last message.
    func closed(_ reason: CloseReason, _ channel: MessageChannel)
}

/// A ``MessageRoute`` made of closures (a client's: one connection at a time).
final class ClosureRoute: MessageRoute {
    private let onMessage: @Sendable (IncomingMessage, MessageChannel) -> Bool
    private let onTransfer: @Sendable (IncomingTransfer, MessageChannel) -> Bool
    private let onClose: @Sendable (CloseReason, MessageChannel) -> Void

    init(
        deliver: @escaping @Sendable (IncomingMessage, MessageChannel) -> Bool,
        transfer: @escaping @Sendable (IncomingTransfer, MessageChannel) -> Bool,
        closed: @escaping @Sendable (CloseReason, MessageChannel) -> Void
    ) {
        onMessage = deliver
        onTransfer = transfer
        onClose = closed
    }

    func deliver(_ message: IncomingMessage, from channel: MessageChannel) -> Bool { onMessage(message, channel) }
    func transfer(_ transfer: IncomingTransfer, from channel: MessageChannel) -> Bool { onTransfer(transfer, channel) }
    func closed(_ reason: CloseReason, _ channel: MessageChannel) { onClose(reason, channel) }
}

extension MessageChannel: QueueProducer {
    /// The route's receiver has room again: read again (when its being full stopped reading).
    func resumeProducing() {
        queue.async { [self] in
            guard routeStopped else { return }
            routeStopped = false
            driver.resumeReading()
        }
    }
}
