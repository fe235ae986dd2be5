#if canImport(Glibc)
    import Glibc
#endif
import Logging
@_spi(Programs) import ProtocolCore
import SystemCalls
@_spi(Programs) import Transport

extension MessageChannel {
    /// A channel that is closed from the start, on no socket: what a ``ServerConnection`` shows
    /// that was made only to report a session restored from the store whose client never came back.
    static func closedPlaceholder(peerName: String, configuration: ChannelConfiguration, logger: Logger) -> MessageChannel {
        let driver = ConnectionDriver(
            fd: FileDescriptor(open("/dev/null", O_RDWR | O_CLOEXEC)), loop: configuration.loopGroup.next(),
            configuration: configuration.connection, logger: logger)
        let channel = MessageChannel(
            driver: driver, established: .init(peer: PeerInfo(name: peerName), peerMaxFrameSize: 0), configuration: configuration)
        driver.abort(.localClose)
        return channel
    }
}
