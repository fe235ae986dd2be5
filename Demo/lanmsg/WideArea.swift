import ArgumentParser
import Discovery
import Foundation
import Logging

/// `lanmsg wide-area`: the instances registered in a unicast DNS domain, and removing the expired
/// ones a crashed publisher left behind (BIND ignores update leases, so nobody else does).
struct WideAreaCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wide-area",
        abstract: "List the services registered in a unicast DNS domain, and remove the expired ones.",
        subcommands: [WideAreaList.self, WideAreaCleanup.self])
}

/// Options both subcommands share.
struct WideAreaOptions: ParsableArguments {
    @Option(help: "The domain (default: the configured one, else those the network announces).")
    var domain: String?

    @Option(
        name: .customLong("type"),
        help: "A service type; repeat for several (default: _bonjour-chat._tcp, _preview._tcp, _lanmsg-echo._tcp).")
    var types: [String] = []

    @Flag(help: "Show the library's log lines too.")
    var verbose = false

    var serviceTypes: [String] { types.isEmpty ? ["_bonjour-chat._tcp", "_preview._tcp", "_lanmsg-echo._tcp"] : types }

    func logger() -> Logger {
        var logger = Logger(label: "lanmsg-wide-area") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = verbose ? .debug : .error
        return logger
    }

    /// The domains to work on.
    func domains(_ administration: WideAreaAdministration, registration: Bool) async throws -> [String] {
        if let domain { return [domain] }
        let found = await administration.domains()
        var list = registration ? found.registration : found.browse
        for domain in found.browse + found.registration where !list.contains(domain) { list.append(domain) }
        guard !list.isEmpty else {
            throw ValidationError(
                "no domain given (--domain) and the network announces none (search domains: \(administration.searchDomains.joined(separator: " ")))")
        }
        return list
    }
}

struct WideAreaList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list", abstract: "List the instances of each type, with their expiry (expired ones are hidden from browsers).")

    @OptionGroup var options: WideAreaOptions

    func run() async throws {
        let (configuration, _) = DiscoveryConfiguration.fromEnvironment()
        let administration = WideAreaAdministration(configuration: configuration, logger: options.logger())
        let now = Date().timeIntervalSince1970
        for domain in try await options.domains(administration, registration: false) {
            for type in options.serviceTypes {
                let instances: [WideAreaAdministration.Instance]
                do {
                    instances = try await administration.instances(type: type, domain: domain)
                } catch {
                    print("\(type).\(domain): \(error.message)")
                    continue
                }
                for instance in instances {
                    let expiry = instance.expires.map { expires -> String in
                        let left = Int(Double(expires) - now)
                        return left < 0 ? "expired \(-left) s ago" : "expires in \(left) s"
                    } ?? "no expiry"
                    print("\(instance.name)\t\(type)\t\(domain)\t\(expiry)")
                }
            }
        }
    }
}

struct WideAreaCleanup: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cleanup",
        abstract: "Remove the instances whose expiry passed (left by a publisher that crashed), signed with a key.",
        discussion: """
            Each removal is conditional: an instance refreshed meanwhile keeps its records. Any key the \
            update policy lets write the service types can remove them (TSIG gives no per-instance \
            ownership; see docs/SECURITY.md).
            """)

    @Option(help: "The TSIG key file (what tsig-keygen writes). Environment: LANMSG_WIDE_AREA_KEY.")
    var key: String?

    @OptionGroup var options: WideAreaOptions

    func run() async throws {
        let (configuration, _) = try DiscoveryConfiguration.forProgram(wideAreaKeyFile: key)
        guard let tsig = configuration.wideArea.key else {
            throw ValidationError("cleanup needs a key: --key FILE or LANMSG_WIDE_AREA_KEY")
        }
        let administration = WideAreaAdministration(configuration: configuration, logger: options.logger())
        var total = 0
        var failures = 0
        for domain in try await options.domains(administration, registration: true) {
            for type in options.serviceTypes {
                do {
                    let removed = try await administration.removeExpired(type: type, domain: domain, key: tsig)
                    for name in removed { print("removed \(name)\t\(type)\t\(domain)") }
                    total += removed.count
                } catch {
                    print("\(type).\(domain): \(error.message)")
                    failures += 1  // the other types and domains are still cleaned
                }
            }
        }
        print("\(total) expired instance\(total == 1 ? "" : "s") removed\(failures > 0 ? "; \(failures) failed" : "")")
        if failures > 0 { throw ExitCode(1) }
    }
}
