import Discovery
import Foundation
import Logging
import Messaging
import PreviewKit
import PreviewWeb
import ServiceLifecycle
import Locks

/// The daemon as a swift-service-lifecycle service: listen, publish, receive pushes; on graceful
/// shutdown unpublish, stop accepting, drain (or abort) pushes in flight and stop.
final class PreviewDaemon: Service, Sendable {
    let store: PreviewStore
    let partials: PartialTransfers?
    let name: String
    let port: UInt16
    let onReceive: String?
    let gracePeriod: Duration
    let key: PreSharedKey?
    let security: ChannelSecurity
    let discoveryConfiguration: DiscoveryConfiguration?
    /// The web page's list and live updates (`--web-port`), told of each stored file.
    let inbox: PreviewInbox?
    /// The web page's port once it listens beyond loopback: published in TXT (`web`).
    let webPort = Locked<UInt16?>(nil)
    /// The web page's link (port, `/t/TOKEN/`) once it listens beyond loopback.
    let pageLink = Locked<PreviewResult.PageLink?>(nil)
    let logger: Logger

    init(
        store: PreviewStore, partials: PartialTransfers? = nil, name: String, port: UInt16,
        discovery: DiscoveryConfiguration? = nil, onReceive: String?, gracePeriod: Duration,
        key: PreSharedKey? = nil, security: ChannelSecurity = .standard, inbox: PreviewInbox? = nil, logger: Logger
    ) {
        self.inbox = inbox
        self.discoveryConfiguration = discovery
        self.key = key
        self.security = security
        self.store = store
        self.partials = partials
        self.name = name
        self.port = port
        self.onReceive = onReceive
        self.gracePeriod = gracePeriod
        self.logger = logger
    }

    func run() async throws {
        let logger = self.logger
        let discovery = ServiceDiscovery(
            logger: logger, programName: "preview-server", configuration: discoveryConfiguration)
        let stopping = Locked(false)
        let service = PreviewService(
            store: store, partials: partials, logger: logger, page: { [weak self] in self?.pageLink.withLock { $0 } }
        ) {
            [weak self] file in
            await self?.stored(file)
        }

        var configuration = ServerConfiguration(
            serviceType: PreviewProtocol.serviceType, serviceName: name, peerName: name)
        configuration.publish = false  // published below, so shutdown can unpublish before draining
        configuration.listener.port = port
        configuration.channel.preSharedKey = key
        configuration.channel.security = security
        configuration.stopGracePeriod = .seconds(2)
        // The push protocol's version in the hello too (as in TXT `pv`), for a pusher that did not browse.
        configuration.channel.metadata = [PreviewProtocol.TXTKey.protocolVersion: String(PreviewProtocol.version)]
        configuration.channel.helloValidator = { _ in
            stopping.withLock { $0 } ? "the preview server is shutting down" : nil
        }
        let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
        try await server.start()
        let port = server.port ?? 0
        say("listening on port \(port)")

        let txt = security.stampTXT(
            PreviewProtocol.txt(maxSize: store.maxSize, freeSpace: store.freeSpace(), webPort: webPort.withLock { $0 }))
        let publication = try await discovery.publish(
            name: name, type: PreviewProtocol.serviceType, port: port, txt: txt)
        publicationBox.set(publication)
        await updateTXT()  // the web page's port, if it came while publishing
        let publicationEvents = Task {
            for await event in publication.events {
                switch event {
                case .established(let name): self.say("published as '\(name)'")
                case .renamed(let from, let to): logger.notice("name collision: renamed '\(from)' → '\(to)'")
                case .suspended:
                    logger.warning("publication suspended (avahi-daemon lost); it comes back with the daemon")
                case .failed(let error): logger.error("publishing failed: \(error.message)")
                case .registered(let name, let domain): self.say("registered as '\(name)' in \(domain)")
                case .registrationRenamed(let domain, let from, let to):
                    logger.notice("name taken in \(domain): registered as '\(to)' instead of '\(from)'")
                case .registrationFailed(let domain, let error):
                    logger.warning("wide-area registration in \(domain) failed: \(error.message)")
                }
            }
        }
        let events = Task {
            for await event in server.events { service.handle(event) }
        }
        // Keep the advertised free space current even when something else fills the disk.
        let refresher = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(60))
                if Task.isCancelled { break }
                await self.updateTXT()
            }
        }

        try? await gracefulShutdown()

        logger.info("shutting down: unpublishing, refusing new pushes")
        refresher.cancel()
        stopping.withLock { $0 = true }
        service.beginDraining()
        await publication.unpublish()
        publicationEvents.cancel()
        if service.inFlightCount > 0 {
            logger.info(
                "waiting for pushes in flight",
                metadata: ["count": "\(service.inFlightCount)", "grace": "\(gracePeriod)"])
        }
        if await !service.waitForInFlight(timeout: gracePeriod) {
            logger.warning("grace period over: aborting pushes in flight (their partial data is deleted)")
        }
        await service.abortInFlight()  // what is left, and offers whose data never started
        await server.stop()
        await events.value
        await discovery.shutdown()
        say("stopped")
    }

    private let publicationBox = PublicationBox()

    private func stored(_ file: StoredFile) async {
        inbox?.stored(file)  // first: the page shows it within milliseconds of the pusher's result
        say("stored '\(FileName.printable(file.name, limit: 300))' (\(file.size) bytes, sha256 \(file.sha256))")
        await updateTXT()
        if let onReceive { Hook.run(onReceive, path: file.path, logger: logger) }
    }

    /// The web page listens on `port` beyond loopback: the TXT record says so, and each stored
    /// result carries the page's link (`path`: with its token) to the pusher.
    func webPageListening(port: UInt16, path: String) async {
        webPort.withLock { $0 = port }
        pageLink.withLock { $0 = PreviewResult.PageLink(port: port, path: path) }
        await updateTXT()
    }

    private func updateTXT() async {
        guard let publication = publicationBox.value else { return }
        let txt = security.stampTXT(
            PreviewProtocol.txt(maxSize: store.maxSize, freeSpace: store.freeSpace(), webPort: webPort.withLock { $0 }))
        guard txt != publication.txt else { return }
        do {
            try await publication.updateTXT(txt)
        } catch {
            logger.notice("cannot update the TXT record: \(error.message)")
        }
    }

    /// A line on standard output (the log goes to standard error).
    func say(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }
}

/// The current publication, for TXT updates from push tasks.
final class PublicationBox: Sendable {
    private let box = Locked<PublishedService?>(nil)
    var value: PublishedService? { box.withLock { $0 } }
    func set(_ publication: PublishedService?) { box.withLock { $0 = publication } }
}
