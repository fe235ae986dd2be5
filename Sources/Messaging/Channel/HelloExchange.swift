import Locks
import Logging
import ProtocolCore
import Transport

/// Carries out the hello exchange (``HandshakeStateMachine``) on a fresh connection, then hands the
/// connection to a new ``MessageChannel``.
///
/// `@unchecked Sendable`: `machine` is confined to the connection's loop.
final class HelloExchange: ConnectionHandler, @unchecked Sendable {
    private let driver: ConnectionDriver
    private let configuration: ChannelConfiguration
    private var machine: HandshakeStateMachine
    /// The channel, or why there is none: completed on the loop, awaited by ``run(adopting:)``.
    private let result = Promise<MessageChannel>()

    private let role: HandshakeStateMachine.Role

    init(driver: ConnectionDriver, role: HandshakeStateMachine.Role, configuration: ChannelConfiguration) {
        self.driver = driver
        self.configuration = configuration
        self.role = role
        machine = HandshakeStateMachine(role: role, settings: configuration.handshakeSettings())
    }

    /// Runs the exchange. `adopting`: the driver was started by the version-2 exchange, which
    /// found a version-1 peer; these are the bytes it read so far.
    func run(adopting leftover: [UInt8]? = nil) async throws -> MessageChannel {
        driver.queue.async {
            if let leftover {
                self.driver.setHandler(self)
                self.driver.beginFrames(leftover: leftover)
                self.driver.deliverBufferedFrames()
            } else {
                self.driver.start(handler: self)
            }
            self.driver.setDeadline(
                .handshake, at: self.driver.now &+ self.configuration.helloTimeout.nanoseconds)
            self.perform(self.machine.start())
        }
        return try await result.value()
    }

    func connection(_ connection: ConnectionDriver, received frame: Frame) {
        connection.assertOnLoop("HelloExchange")
        perform(machine.receive(frame))
    }

    func connection(_ connection: ConnectionDriver, deadlinePassed kind: Deadlines.Kind) {
        connection.assertOnLoop("HelloExchange")
        guard kind == .handshake else { return }
        perform(machine.timedOut(after: configuration.helloTimeout), closeAtOnce: true)
    }

    func connection(_ connection: ConnectionDriver, closedWith reason: CloseReason) {
        connection.assertOnLoop("HelloExchange")
        perform(machine.connectionClosed(reason))
    }

    private func perform(_ output: HandshakeStateMachine.Output, closeAtOnce: Bool = false) {
        if let notice = output.notice {
            // A failure, thrown to the caller too. A server's caller says it (a MessageServer as a
            // summary: RefusalLog), so a flood of bad hellos is not a line each here.
            if role == .server { driver.logger.debug("\(notice)") } else { driver.logger.warning("\(notice)") }
        }
        for frame in output.frames { driver.enqueue(frame, bypassLimit: true) { _ in } }
        guard let outcome = output.outcome else { return }
        driver.setDeadline(.handshake, at: nil)
        switch outcome {
        case .success(let established):
            driver.logger.debug("hello complete with '\(established.peer.name)' (version \(established.peer.version))")
            let channel = MessageChannel(
                driver: driver, established: established, configuration: configuration,
                awaitsSession: role == .server && configuration.offersSessions && established.peer.sessions)
            channel.activate()
            result.succeed(channel)
        case .failure(let error):
            if closeAtOnce {
                driver.tearDown(error.closeReason ?? .localClose)
            } else if !driver.isClosed {
                driver.closeGracefully(reason: error.closeReason)
            }
            result.fail(error)
        }
    }
}
