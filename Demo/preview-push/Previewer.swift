import Discovery
import Foundation
import Logging
import Messaging
import PreviewKit

/// One previewer this preview-push is connected to: its client, the name it goes by, and the
/// pusher that retries through reconnects. Shared by a push to one previewer and to many.
struct Previewer: Sendable {
    let client: MessageClient
    /// The previewer's service name (or address), as printed.
    let name: String
    let pusher: ResumingPusher

    /// Why a previewer cannot be pushed to (nothing was sent to it): the text says what happened
    /// and what to do.
    struct Unreachable: Error {
        let message: String
    }

    /// What a push of one file came to.
    enum Outcome: Sendable {
        case stored(PreviewResult)
        case failed(PreviewFailure)
    }

    /// Connects to `target` and checks it: the push protocol version (unless `ignoreVersion`) and,
    /// at first contact, prints its key and comparison code.
    static func connect(
        to target: ServiceTarget, options command: PreviewPushCommand, logger: Logger
    ) async -> Result<Previewer, Unreachable> {
        var configuration = ClientConfiguration(
            peerName: "preview-push",
            reconnect: command.retryFor > 0 ? ReconnectPolicy(initialDelay: .milliseconds(200), maxDelay: .seconds(2)) : nil)
        configuration.browseTimeout = command.timeoutDuration
        configuration.resolveTimeout = command.timeoutDuration
        configuration.channel.connectTimeout = command.timeoutDuration
        if let keyFile = command.keyFile {
            do {
                configuration.channel.preSharedKey = try PreSharedKey(contentsOfFile: keyFile)
            } catch {
                return .failure(Unreachable(message: error.message))
            }
        }
        let client: MessageClient
        do {
            client = try await MessageClient.connect(to: target, configuration: configuration, logger: logger)
        } catch {
            var message = error.message
            if error.code == .ambiguousService { message += "; pick one with --to NAME (see --list)" }
            return .failure(Unreachable(message: message))
        }
        // A previewer of another push protocol version is not pushed to unless asked.
        if let version = client.peer?.metadata[PreviewProtocol.TXTKey.protocolVersion], version != String(PreviewProtocol.version),
            !command.ignoreVersion
        {
            await client.close()
            return .failure(
                Unreachable(
                    message: "'\(FileName.printable(client.peer?.name ?? "?"))' speaks push protocol version \(FileName.printable(version)), "
                        + "this preview-push speaks \(PreviewProtocol.version); nothing was sent (update one of them, or push anyway with --ignore-version)"
                ))
        }
        guard let channel = client.channel else {
            await client.close()
            return .failure(Unreachable(message: "the connection closed at once"))
        }
        let server = channel.peer.name
        if let identity = channel.peerIdentity, identity.isFirstContact {
            note(
                "preview-push: first contact with '\(FileName.printable(server))': its key is \(identity.fingerprint.full), comparison "
                    + "code \(identity.comparisonCode). The server shows the same code when it is really the one you "
                    + "mean; its key is remembered from now on, and a different key will be refused.")
        }
        let pusher = ResumingPusher(client: client, retryFor: .milliseconds(Int64(command.retryFor * 1000)))
        return .success(Previewer(client: client, name: server, pusher: pusher))
    }

    /// Pushes `file`, reporting retries and resumes on standard error and progress to `progress`.
    func push(
        _ file: String, content: (sha256: String, size: UInt64)? = nil, options command: PreviewPushCommand,
        progress: @escaping @Sendable (PushProgress) -> Void
    ) async -> Outcome {
        let shown = FileName.printable(file, limit: 300)
        let where_ = FileName.printable(name)
        let retryFor = command.retryFor
        do {
            return .stored(
                try await pusher.push(
                    path: file, bytesPerSecond: command.limitRate, timeout: command.timeoutDuration,
                    resultTimeout: max(command.timeoutDuration, .seconds(120)), content: content,
                    onRetry: { retry in
                        note(
                            "preview-push: \(shown) to '\(where_)': \(retry.failure.message) after \(formatBytes(retry.sentBytes)); "
                                + "retrying (attempt \(retry.attempt + 1), for up to \(Int(retryFor)) s)")
                    },
                    onResume: { offset in
                        note("preview-push: \(shown) to '\(where_)': resuming at \(formatBytes(offset)) (the previewer kept them)")
                    },
                    progress: progress))
        } catch {
            return .failed(error)
        }
    }

    /// The line that tells where the previewer's page is (with its token), when its result
    /// carries the link. The host is the address this push reached, unless that is a link-local
    /// IPv6 address (a browser takes no zone): then the previewer's IPv4 or global IPv6 address,
    /// resolved through `discovery` (as --list shows them).
    func pageLine(_ result: PreviewResult, discovery: ServiceDiscovery?) async -> String? {
        guard let page = result.page, let address = client.channel?.remoteAddress else { return nil }
        var host = address.family == .ipv6 ? "[\(address.host)]" : address.host
        if address.isLinkLocalIPv6, let discovery,
            let resolved = try? await discovery.resolve(
                ServiceIdentity(name: name, type: PreviewProtocol.serviceType), timeout: .seconds(2)),
            let usable = resolved.addresses.first(where: { $0.ip.version == .ipv4 })
                ?? resolved.addresses.first(where: { !$0.ip.isLinkLocal })
        {
            host = usable.ip.version == .ipv6 ? "[\(usable.ip)]" : "\(usable.ip)"
        }
        return "page of '\(FileName.printable(name))': http://\(host):\(page.port)\(FileName.printable(page.path, limit: 100))"
    }

    /// The line a stored push prints.
    func storedLine(_ file: String, _ result: PreviewResult, seconds: Double) -> String {
        let rate = seconds > 0 ? Double(result.size ?? 0) / seconds / 1_048_576 : 0
        return "stored \(FileName.printable(file, limit: 300)) on '\(FileName.printable(name))' as "
            + "'\(FileName.printable(result.storedName ?? "?", limit: 300))' (\(result.size ?? 0) bytes, "
            + "sha256 \(result.sha256 ?? "?"), \(String(format: "%.1f", rate)) MiB/s)"
    }
}
