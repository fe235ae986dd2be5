// Test support shared by the test targets (issue 46, 4): helpers that lived in the production
// modules, reached through `package` declarations instead of `@testable`.
#if canImport(Glibc)
    import Glibc
#endif
import Logging
import Messaging
@_spi(Programs) import ProtocolCore
import SystemCalls
@_spi(Programs) import Transport

extension MessageChannel {
    /// Two channels joined inside this process by a socket pair (`AF_UNIX` stream), their
    /// handshake done: the in-memory transport for tests of what runs above a channel — no
    /// listener, no port, no address. Everything else is real: the drivers and their loops, the
    /// hello or Noise handshake, the frames. Their ``remoteAddress`` is nil (a socket pair has
    /// no IP address).
    ///
    /// - Throws: `TransportError.Code.syscallFailed` when the kernel refuses the pair, or what
    ///   either side's handshake throws (the other side is closed then).
    public static func pair(
        client clientConfiguration: ChannelConfiguration, server serverConfiguration: ChannelConfiguration,
        logger: Logger
    ) async throws -> (client: MessageChannel, server: MessageChannel) {
        try clientConfiguration.checkFrameLimit()
        try serverConfiguration.checkFrameLimit()
        var fds: [Int32] = [-1, -1]
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        if case .failure(let error) = retryingInterrupts({ socketpair(AF_UNIX, type, 0, &fds) }) {
            throw TransportError(.syscallFailed, "socketpair: \(error)")
        }
        let clientDriver = ConnectionDriver(
            fd: FileDescriptor(fds[0]), loop: clientConfiguration.loopGroup.next(),
            configuration: clientConfiguration.connection, logger: logger)
        let serverDriver = ConnectionDriver(
            fd: FileDescriptor(fds[1]), loop: serverConfiguration.loopGroup.next(),
            configuration: serverConfiguration.connection, logger: logger)
        async let server = Result { () async throws -> MessageChannel in
            try await MessageChannel.handshake(serverDriver, client: false, configuration: serverConfiguration)
        }
        let client = await Result { () async throws -> MessageChannel in
            try await MessageChannel.handshake(clientDriver, client: true, configuration: clientConfiguration)
        }
        switch (client, await server) {
        case (.success(let client), .success(let server)):
            return (client, server)
        case (.failure(let error), let other), (let other, .failure(let error)):
            if case .success(let channel) = other { channel.abort() }
            throw error
        }
    }
}

extension Result where Failure == any Error {
    /// The result of an async throwing body.
    fileprivate init(_ body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

