import ArgumentParser
import Foundation
import Logging
import Messaging
import PreviewKit
import ServiceLifecycle

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

    func validate() throws {
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("unknown log level '\(logLevel)'")
        }
        guard gracePeriod >= 0 else { throw ValidationError("--grace-period must not be negative") }
        if let keyFile {
            do { _ = try PreSharedKey(contentsOfFile: keyFile) } catch { throw ValidationError(error.message) }
        }
        if let name, name.isEmpty || name.utf8.count > 63 {
            throw ValidationError("--name must be 1 to 63 bytes")
        }
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
        let daemon = PreviewDaemon(
            store: store, name: name ?? "Preview on \(Self.hostName())", port: port, onReceive: onReceive,
            gracePeriod: .milliseconds(Int64(gracePeriod * 1000)),
            key: try keyFile.map { try PreSharedKey(contentsOfFile: $0) }, logger: logger)
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [.init(service: daemon)], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
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
