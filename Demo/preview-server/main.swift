import ArgumentParser
import Foundation
import Logging
import Messaging
import Metrics
import PreviewKit
import PreviewWeb
import Prometheus
import ProtocolCore
import ServiceLifecycle
import Locks

/// The viewer-side daemon: receives documents pushed by preview-push and stores them in a directory.
struct PreviewServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "preview-server",
        abstract: "Receive documents pushed with preview-push into a directory (published as _preview._tcp).",
        discussion: """
            Files arrive in a temporary file in DIR and are renamed into place only when complete and \
            their SHA-256 verified; an existing name gets a " (2)" suffix. SIGTERM or SIGINT: unpublish, \
            refuse new pushes, let pushes in flight finish within the grace period, abort the rest \
            (deleting their partial data), exit 0.
            """)

    @Option(help: "Directory to store received files in (must exist and be writable).")
    var directory: String

    @Option(help: "Service name to publish (default: \"Preview on <hostname>\").")
    var name: String?

    @Option(help: "TCP port (0: kernel-assigned).")
    var port: UInt16 = 0

    @Option(help: "Largest file accepted, in bytes.")
    var maxSize: UInt64 = 4 << 30

    @Option(help: "Command run with the stored file's path as its last argument (through /bin/sh).")
    var onReceive: String?

    @Option(help: "Seconds pushes in flight may take to finish after SIGTERM/SIGINT before they are aborted.")
    var gracePeriod: Double = 10

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    @Option(help: "A pre-shared key file (≥ 16 bytes): only pushers proving the same key are accepted.")
    var keyFile: String?

    @Option(
        help: ArgumentHelp(
            "Which pushers to accept: any (every pusher proves its key; default), paired (only pushers paired with "
                + "--pair-for), or pinned:<fingerprint>[,<fingerprint>…].",
            valueName: "policy"))
    var accept: String = "any"

    @Option(
        help: ArgumentHelp(
            "Pairing window, in seconds: pushers that connect meanwhile are paired (remembered) after you compare "
                + "the code both sides show. For --accept paired.", valueName: "seconds"))
    var pairFor: Double = 0

    @Option(help: "Identity file (default: $XDG_DATA_HOME/lanmsg/preview-server/identity, created mode 0600).")
    var identity: String?

    /// The identity file (`--identity`, or the default); the page's token lives beside it.
    var identityPath: String { identity ?? Identity.defaultPath(app: "preview-server") }

    @Option(
        help: ArgumentHelp(
            "Seconds an interrupted push is kept (in DIRECTORY/.lanmsg-partial) for the pusher to resume it "
                + "(0: interrupted pushes start over).", valueName: "seconds"))
    var keepPartial: Double = 3600

    @Option(
        help: ArgumentHelp(
            "Serve the metrics (connections, frames, bytes, messages, handshakes, requests, discovery) in "
                + "Prometheus' text format at http://<metrics-address>:<port>/metrics (off unless given; 0: "
                + "kernel-assigned, printed at start).", valueName: "port"))
    var metricsPort: UInt16?

    @Option(help: "The address the metrics endpoint listens on (an IPv4 or IPv6 address; default: loopback only).")
    var metricsAddress: String = "127.0.0.1"

    @Option(
        help: ArgumentHelp(
            "Serve a live web page of the pushed files at http://<web-address>:<port>/ (off unless given; 0: "
                + "kernel-assigned, printed at start). New pushes show at once, without a reload. It also serves "
                + "/metrics.", valueName: "port"))
    var webPort: UInt16?

    @Option(
        help: ArgumentHelp(
            "The address the web page listens on (an IPv4 or IPv6 address; default: loopback only). Another "
                + "address (0.0.0.0, ::, this host's) lets phones and tablets on the network open it, and the page's "
                + "port is published in TXT (web).", valueName: "address"))
    var webAddress: String = "127.0.0.1"

    @Flag(
        help: ArgumentHelp(
            "Let pushed HTML files run their scripts on the web page (still sandboxed: no same origin, no access to "
                + "the page). Off by default: anyone who can push could run code in every viewer's browser."))
    var allowScripts = false

    @Option(
        help: ArgumentHelp(
            "Also register the previewer in a unicast DNS domain (wide-area DNS-SD), signing the updates with this "
                + "TSIG key file (what tsig-keygen writes). Environment: LANMSG_WIDE_AREA_KEY.", valueName: "file"))
    var wideAreaKey: String?

    @Option(
        help: ArgumentHelp(
            "The unicast DNS domain to register in (default: the one the network announces, dr._dns-sd._udp). "
                + "Environment: LANMSG_WIDE_AREA_DOMAIN.", valueName: "domain"))
    var wideAreaDomain: String?

    /// The environment's discovery settings with the wide-area options on top.
    func discoveryConfiguration() throws(DiscoveryError) -> (DiscoveryConfiguration, problems: [String]) {
        try DiscoveryConfiguration.forProgram(wideAreaDomain: wideAreaDomain, wideAreaKeyFile: wideAreaKey)
    }

    func validate() throws {
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("unknown log level '\(logLevel)'")
        }
        guard gracePeriod >= 0 else { throw ValidationError("--grace-period must not be negative") }
        if let keyFile {
            do { _ = try PreSharedKey(contentsOfFile: keyFile) } catch { throw ValidationError(error.message) }
        }
        guard accept == "any" || accept == "paired" || accept.hasPrefix("pinned:") else {
            throw ValidationError("--accept must be any, paired or pinned:<fingerprint>,…")
        }
        if accept.hasPrefix("pinned:") {
            let list = accept.dropFirst("pinned:".count).split(separator: ",")
            guard !list.isEmpty, list.allSatisfy({ Fingerprint(String($0)) != nil }) else {
                throw ValidationError("--accept pinned: needs full fingerprints (64 hex digits), comma-separated")
            }
        }
        guard pairFor >= 0 else { throw ValidationError("--pair-for must not be negative") }
        if pairFor > 0 && accept != "paired" { throw ValidationError("--pair-for needs --accept paired") }
        if let name, name.isEmpty || name.utf8.count > 63 {
            throw ValidationError("--name must be 1 to 63 bytes")
        }
        do {
            _ = try discoveryConfiguration()
        } catch {
            throw ValidationError(error.message)
        }
        for (option, address) in [("--metrics-address", metricsAddress), ("--web-address", webAddress)] {
            guard (try? SocketAddress(ipAddress: address, port: 0)) != nil else {
                throw ValidationError("\(option) must be an IP address, e.g. 127.0.0.1, ::1 or 0.0.0.0 (got '\(address)')")
            }
        }
        if allowScripts && webPort == nil { throw ValidationError("--allow-scripts needs --web-port") }
    }

    func run() async throws { try await execute() }

    func execute() async throws {
        var logger = Logger(label: "preview-server") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        let store: PreviewStore
        do {
            store = try PreviewStore(directory: directory, maxSize: maxSize, logger: logger)
        } catch {
            throw ValidationError(error.message)
        }
        store.removeStaleTempFiles()
        var partials: PartialTransfers?
        if keepPartial > 0 {
            do {
                partials = try PartialTransfers(
                    directory: store.directory + "/.lanmsg-partial", keepFor: .milliseconds(Int64(keepPartial * 1000)),
                    logger: logger)
            } catch {
                throw ValidationError(error.message)
            }
        }
        let serverIdentity: Identity
        do {
            serverIdentity = try Identity.loadOrCreate(at: identityPath)
        } catch {
            throw ValidationError(error.message)
        }
        FileHandle.standardError.write(Data("preview-server: key \(serverIdentity.fingerprint.full)\n".utf8))
        // Metrics: bootstrapped before the server is made (it takes the back end it finds then),
        // when something serves them (--metrics-port, or the web page's /metrics).
        var registry: PrometheusCollectorRegistry?
        if metricsPort != nil || webPort != nil {
            let made = PrometheusCollectorRegistry()
            MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: made))
            registry = made
        }
        // Who pushed which file, kept beside the identity (one record per inbox folder) so that
        // the page still shows it after a restart.
        let inbox = webPort.map { _ in
            PreviewInbox(directory: store.directory, record: identityPath + ".pushed-" + Self.folderKey(store.directory))
        }
        if allowScripts {
            logger.warning(
                "--allow-scripts: pushed HTML files run their scripts in every viewer's browser (sandboxed: no same origin); anyone who can push can run code there")
        }
        let (discoveryConfiguration, problems) = try discoveryConfiguration()
        for problem in problems { logger.warning("ignored discovery setting: \(problem)") }
        let daemon = PreviewDaemon(
            store: store, partials: partials, name: name ?? "Preview on \(Self.hostName())", port: port,
            discovery: discoveryConfiguration,
            onReceive: onReceive,
            gracePeriod: .milliseconds(Int64(gracePeriod * 1000)),
            key: try keyFile.map { try PreSharedKey(contentsOfFile: $0) },
            security: .encrypted(identity: serverIdentity, trust: acceptPolicy(logger: logger)), inbox: inbox,
            logger: logger)
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [.init(service: daemon)]
        let web = PreviewWeb(
            inbox: inbox ?? PreviewInbox(directory: store.directory), name: daemon.name, allowScripts: allowScripts,
            registry: registry, logger: logger)
        if let metricsPort {
            let address = metricsAddress
            services.append(
                .init(
                    service: WebService.make(
                        router: web.router(pageless: true), address: address, port: metricsPort, logger: logger,
                        inbox: nil
                    ) { port in
                        Self.say("preview-server: metrics at http://\(Self.urlHost(address)):\(port)/metrics")
                    }))
        }
        if let webPort, let inbox {
            let address = webAddress
            let published = !Self.isLoopback(address)
            // Beyond loopback the page needs its link with a token (issue 56, 2), kept beside the
            // identity so that links survive a restart.
            var token: String?
            if published {
                do { token = try PageToken.loadOrCreate(at: identityPath + ".page-token") } catch { throw ValidationError(error.message) }
            }
            let path = token.map { "/t/\($0)/" } ?? "/"
            services.append(
                .init(
                    service: WebService.make(
                        router: web.router(), address: address, port: webPort, logger: logger, inbox: inbox, token: token
                    ) { port in
                        Self.say("preview-server: web page at http://\(Self.urlHost(address)):\(port)\(path)")
                        if published {
                            Self.say(
                                "preview-server: the page answers only this link (its token is in \(identityPath).page-token; "
                                    + "delete that file for a new one); pushers this previewer accepts get it with each result")
                            Task { await daemon.webPageListening(port: UInt16(port), path: path) }
                        }
                    }))
        }
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
    }

    /// A line on standard error (where the metrics' and the page's addresses have always gone).
    static func say(_ line: String) { FileHandle.standardError.write(Data((line + "\n").utf8)) }

    /// A short stable key of an inbox folder (its resolved path's SHA-256, 16 hex digits): the
    /// name of its record of pushes.
    static func folderKey(_ directory: String) -> String {
        let resolved = URL(fileURLWithPath: directory).resolvingSymlinksInPath().path
        return String(sha256Hex(Array(resolved.utf8)).prefix(16))
    }

    /// An address as the host of a URL (an IPv6 address in brackets).
    static func urlHost(_ address: String) -> String { address.contains(":") ? "[\(address)]" : address }

    static func isLoopback(_ address: String) -> Bool { address.hasPrefix("127.") || address == "::1" }

    /// The trust policy of `--accept` (and the pairing window of `--pair-for`).
    func acceptPolicy(logger: Logger) -> TrustPolicy {
        if accept.hasPrefix("pinned:") {
            return .pinned(accept.dropFirst("pinned:".count).split(separator: ",").compactMap { Fingerprint(String($0)) })
        }
        guard accept == "paired" else { return .anyKey }
        let paired = TrustStore(path: Identity.defaultPath(app: "preview-server").replacingOccurrences(
            of: "/identity", with: "/paired_pushers"))
        let pairingEnds = ContinuousClock.now + .milliseconds(Int64(pairFor * 1000))
        if pairFor > 0 {
            FileHandle.standardError.write(
                Data("preview-server: pairing for \(Int(pairFor)) s: pushers that connect now are paired\n".utf8))
        }
        // The paired keys live in memory (read once here); the handshake asks on the connection's
        // loop, where no file is read. A new pairing is written through (rare: the window only).
        let pairedKeys = Locked(Set(paired.entries.map(\.fingerprint)))
        return .custom { peer in
            if pairedKeys.withLock({ $0.contains(peer.fingerprint) }) { return nil }
            guard ContinuousClock.now < pairingEnds else {
                return "this preview server accepts paired pushers only, and '\(peer.name)' (key "
                    + "\(peer.fingerprint.short)) is not paired; on the server, run it with --accept paired "
                    + "--pair-for 60 and push again within that minute, comparing the code both sides show"
            }
            do {
                try paired.trust(peer.fingerprint, name: "\(peer.name) \(peer.fingerprint.short)")
                pairedKeys.withLock { _ = $0.insert(peer.fingerprint) }
            } catch {
                return "cannot remember the pairing: \(error)"
            }
            FileHandle.standardError.write(
                Data(
                    ("preview-server: paired with '\(peer.name)': key \(peer.fingerprint.full), comparison code "
                        + "\(peer.comparisonCode) — preview-push shows the same code\n").utf8))
            return nil
        }
    }

    static func hostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "this host" }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return String(name.split(separator: ".").first ?? "this host")
    }
}

// Top-level code (this target has several files, so no @main): parse, then run asynchronously.
ServiceDiscovery.onBackendChosen { kind, reason in FileHandle.standardError.write(Data("preview-server: discovery backend: \(kind) (\(reason))\n".utf8)) }
do {
    let command = try PreviewServerCommand.parse()
    try await command.execute()
} catch {
    PreviewServerCommand.exit(withError: error)
}
