import ArgumentParser
import Foundation
import Logging
import Messaging
import PreviewKit

/// The editor-side client: pushes files to a preview server found on the LAN.
struct PreviewPushCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "preview-push",
        abstract: "Push files to a preview server (_preview._tcp) on the local network.",
        discussion: """
            Without --to, the only previewer found is used; when several are found they are listed and \
            nothing is sent. --to NAME --to NAME … or --all push to several at once, side by side. \
            --host/--port skip discovery (an IPv6 link-local address needs its interface: fe80::1%eth0).

            Exit status: 0 every file stored on every previewer (or --list found previewers); 1 a file \
            failed (each has its result line), or --list found none; 2 nothing was sent: no previewer \
            found or connected to, its key refused, or another push protocol version; 3 (several \
            previewers) one or more could not be pushed to at all (each named), the others stored \
            every file; 64 a usage error.
            """)

    @Argument(help: "Files to push.")
    var files: [String] = []

    @Flag(help: "List the previewers found on the network and exit.")
    var list = false

    @Flag(
        help: ArgumentHelp(
            "Push FILE, then again on every save (inotify), until SIGINT or SIGTERM: an edit-save-look loop with no "
                + "command. A save whose content the previewer already has (the SHA-256 of the last push) is not sent."))
    var watch = false

    @Option(
        help: ArgumentHelp(
            "The previewer's service name (see --list). Repeat it to push to several at once: one connection each, "
                + "a result line per previewer and file.", valueName: "name"))
    var to: [String] = []

    @Flag(
        help: ArgumentHelp(
            "Push to every previewer found whose key this preview-push trusts (pushed to before). A previewer never "
                + "pushed to is listed and skipped: push to it once with --to NAME, which shows its key."))
    var all = false

    @Option(help: "Connect to this host or address instead of browsing (needs --port).")
    var host: String?

    @Option(help: "The port with --host.")
    var port: UInt16?

    @Option(help: "Seconds to wait for discovery, connecting and the server's answers.")
    var timeout: Double = 10

    @Option(help: "Limit the sending rate, in bytes per second.")
    var limitRate: UInt64?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "warning"

    @Option(help: "A pre-shared key file (≥ 16 bytes): the previewer must prove the same key, and so do we.")
    var keyFile: String?

    @Option(
        help: ArgumentHelp(
            "Seconds to keep retrying when the connection is lost or the previewer restarts: reconnect and resume "
                + "where the previewer's kept bytes end (0: fail at once).", valueName: "seconds"))
    var retryFor: Double = 30

    @Flag(help: "Say more: the connection's round-trip time and reconnects after each file.")
    var verbose = false

    @Flag(help: "Push even to a previewer whose push protocol version (TXT and hello `pv`) is not this program's.")
    var ignoreVersion = false

    @Option(
        help: ArgumentHelp(
            "Also look for previewers in this unicast DNS domain (wide-area DNS-SD, e.g. across routed subnets).",
            discussion: "Domains the network announces are used without it. Environment: LANMSG_WIDE_AREA_DOMAIN."))
    var wideAreaDomain: String?

    /// The environment's discovery settings with --wide-area-domain on top.
    func discoveryConfiguration(logger: Logger) throws(DiscoveryError) -> DiscoveryConfiguration {
        let (configuration, problems) = try DiscoveryConfiguration.forProgram(wideAreaDomain: wideAreaDomain)
        for problem in problems { logger.warning("ignored discovery setting: \(problem)") }
        return configuration
    }

    func validate() throws {
        if list && !files.isEmpty { throw ValidationError("--list takes no files") }
        if watch && (list || files.count != 1) { throw ValidationError("--watch takes exactly one file") }
        if !list && files.isEmpty { throw ValidationError("name at least one file to push (or use --list)") }
        if (host == nil) != (port == nil) { throw ValidationError("--host and --port go together") }
        if host != nil && !to.isEmpty {
            throw ValidationError("--to (discovery) and --host (no discovery) exclude each other")
        }
        if all && (host != nil || !to.isEmpty || list) {
            throw ValidationError("--all finds the previewers itself: it excludes --to, --host and --list")
        }
        if Set(to).count != to.count { throw ValidationError("a previewer is named twice with --to") }
        guard timeout > 0 else { throw ValidationError("--timeout must be positive") }
        guard retryFor >= 0 else { throw ValidationError("--retry-for must be 0 or more") }
        guard Logger.Level(rawValue: logLevel) != nil else { throw ValidationError("unknown log level '\(logLevel)'") }
        if let keyFile {
            do { _ = try PreSharedKey(contentsOfFile: keyFile) } catch { throw ValidationError(error.message) }
        }
        do {
            // The flag only (a usage error): the environment's settings are the run's to say.
            _ = try DiscoveryConfiguration.forProgram(wideAreaDomain: wideAreaDomain, environment: [:])
        } catch {
            throw ValidationError(error.message)
        }
    }

    var timeoutDuration: Duration { .milliseconds(Int64(timeout * 1000)) }

    func run() async throws { try await execute() }

    func execute() async throws {
        var logger = Logger(label: "preview-push") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .warning
        if list {
            try await listPreviewers(logger: logger)
            return
        }
        let discovery: ServiceDiscovery? =
            host == nil
            ? ServiceDiscovery(
                logger: logger, programName: "preview-push", configuration: try discoveryConfiguration(logger: logger))
            : nil
        if all || to.count > 1 {
            try await pushToMany(discovery: discovery!, logger: logger)
            return
        }
        let target: ServiceTarget
        if let host, let port {
            target = .host(host, port: port)
        } else {
            target = .service(name: to.first, type: PreviewProtocol.serviceType, discovery: discovery!)
        }
        let previewer: Previewer
        switch await Previewer.connect(to: target, options: self, logger: logger) {
        case .success(let connected): previewer = connected
        case .failure(let unreachable):
            fail("preview-push: \(unreachable.message)")
            await discovery?.shutdown()
            throw ExitCode(2)
        }
        let client = previewer.client
        let drain = Task { for await _ in client.events {} }
        let interactive = isatty(STDERR_FILENO) == 1
        var failures = 0
        var pageShown = false
        /// Pushes one file; its SHA-256 when stored.
        func push(_ file: String) async -> String? {
            let bar = ProgressBar(interactive: interactive)
            if !interactive { say("pushing \(FileName.printable(file, limit: 300)) to '\(FileName.printable(previewer.name))'") }
            let outcome = await previewer.push(file, options: self, progress: { bar.update($0) })
            bar.finish()
            switch outcome {
            case .stored(let result):
                say(previewer.storedLine(file, result, seconds: bar.elapsedSeconds))
                if !pageShown, let line = await previewer.pageLine(result, discovery: discovery) {
                    say(line)
                    pageShown = true
                }
                if verbose, let health = await client.health { note("preview-push: link: \(health)") }
                return result.sha256
            case .failed(let error):
                failures += 1
                fail("failed \(FileName.printable(file, limit: 300)): \(error.message) [\(error.code)]")
                return nil
            }
        }
        if watch, let file = files.first {
            try await watchAndPush(file, push: push)
        } else {
            for file in files { _ = await push(file) }
        }
        await client.close()
        drain.cancel()
        await discovery?.shutdown()
        if failures > 0 {
            fail("preview-push: \(failures) of \(files.count) file\(files.count == 1 ? "" : "s") failed")
            throw ExitCode(1)
        }
    }

    /// The watcher of `file`'s saves (`--watch`); exit status 2 when it cannot be watched.
    func startWatching(_ file: String) throws -> FileWatcher {
        do {
            return try FileWatcher(path: file)
        } catch {
            fail("preview-push: --watch: \(error)")
            throw ExitCode(2)
        }
    }

    /// `--watch`: pushes `file`, then again after every save whose content differs from what was
    /// last stored, until SIGINT or SIGTERM.
    func watchAndPush(_ file: String, push: (String) async -> String?) async throws {
        let watcher = try startWatching(file)
        defer { watcher.stop() }
        var stored = await push(file)
        note("preview-push: watching \(FileName.printable(file, limit: 300)): every save is pushed (Ctrl-C ends)")
        for await _ in watcher.saves {
            let sha: String
            do {
                sha = try sha256OfFile(atPath: file).hex
            } catch {
                note("preview-push: \(FileName.printable(file, limit: 300)) cannot be read now (\(error)); waiting for the next save")
                continue
            }
            if sha == stored {
                say("unchanged \(FileName.printable(file, limit: 300)) (sha256 \(sha)): the previewer has it, not pushed")
                continue
            }
            stored = await push(file) ?? stored
        }
        note("preview-push: stopped watching \(FileName.printable(file, limit: 300))")
    }

    func listPreviewers(logger: Logger) async throws {
        let discovery = ServiceDiscovery(
            logger: logger, programName: "preview-push", configuration: try discoveryConfiguration(logger: logger))
        do {
            try await listPreviewers(discovery)
        } catch {
            await discovery.shutdown()
            throw error
        }
        await discovery.shutdown()  // awaited: no task left behind to run (or not) as the process ends
    }

    private func listPreviewers(_ discovery: ServiceDiscovery) async throws {
        let found = try await discovery.services(ofType: PreviewProtocol.serviceType, timeout: timeoutDuration) {
            _, allForNow in allForNow
        }
        if found.isEmpty {
            fail(
                "preview-push: no previewers found within \(timeoutDuration) (is a preview-server running on this network?)"
            )
            throw ExitCode(1)
        }
        for service in found {
            let name = FileName.printable(service.name)
            guard let resolved = try? await discovery.resolve(service, timeout: timeoutDuration) else {
                say("\(name)\t(does not resolve)")
                continue
            }
            let version = resolved.txt[PreviewProtocol.TXTKey.protocolVersion] ?? "?"
            if version != String(PreviewProtocol.version) {
                note(
                    "preview-push: warning: '\(name)' speaks push protocol version \(FileName.printable(version)) (this preview-push: \(PreviewProtocol.version)); "
                        + "it is not pushed to without --ignore-version")
            }
            let free = resolved.txt[PreviewProtocol.TXTKey.freeSpace].flatMap(UInt64.init).map(formatBytes) ?? "?"
            let max = resolved.txt[PreviewProtocol.TXTKey.maxSize].flatMap(UInt64.init).map(formatBytes) ?? "?"
            let addresses = resolved.addresses.map(\.description).joined(separator: ", ")
            // The key's short form (TXT `fp`), whether this preview-push knows it (its trust store,
            // trust on first use), and the web page when the previewer publishes one (TXT `web`: only
            // a page beyond loopback, which answers only its link with the token).
            let key = resolved.txt["fp"].map { FileName.printable($0, limit: 24) }
            let page = resolved.txt[PreviewProtocol.TXTKey.webPort].flatMap(UInt16.init).flatMap { port in
                // An IPv4 address first, then a global IPv6 one: a browser takes neither a link-local
                // address's zone nor a host name that only mDNS resolves everywhere.
                (resolved.addresses.first { $0.ip.version == .ipv4 }
                    ?? resolved.addresses.first { !$0.ip.isLinkLocal }).map { address -> String in
                    address.ip.version == .ipv6 ? "http://[\(address.ip)]:\(port)/" : "http://\(address.ip):\(port)/"
                }
            }
            say(
                "\(name)\t\(resolved.hostName):\(resolved.port)\tmax \(max), free \(free)\t\(addresses)\tpv \(FileName.printable(version))\tfound in \(service.foundIn)"
                    + "\tkey \(key ?? "none (plaintext)")\t\(trust(of: service.name, key: key))\tpage \(page.map { "\($0) (needs its token: open the link a push prints)" } ?? "none")")
        }
    }

    /// What this preview-push's trust store says of a previewer's key: `trusted` (remembered on a
    /// first push), `new` (never pushed to), or `KEY CHANGED` (a push would be refused).
    func trust(of name: String, key: String?) -> KeyTrust {
        guard let key else { return .noKey }
        let store = TrustStore(path: TrustStore.defaultPath(app: "preview-push"))
        guard let known = store.fingerprint(for: name) else { return .new }
        return known.short == key ? .trusted : .changed
    }

    /// Whether this preview-push knows a previewer's key; its description is --list's column.
    enum KeyTrust: CustomStringConvertible {
        case trusted, new, noKey, changed

        var description: String {
            switch self {
            case .trusted: "trusted"
            case .new: "new"
            case .noKey: "no key"
            case .changed: "KEY CHANGED (a push is refused)"
            }
        }
    }
}

func note(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

// Top-level code (this target has several files, so no @main): parse, then run asynchronously.
ServiceDiscovery.onBackendChosen { kind, reason in FileHandle.standardError.write(Data("preview-push: discovery backend: \(kind) (\(reason))\n".utf8)) }
do {
    let command = try PreviewPushCommand.parse()
    try await command.execute()
} catch {
    PreviewPushCommand.exit(withError: error)
}
