import ArgumentParser
import Discovery
import Foundation
import Logging
@_spi(Programs) import ProtocolCore
@_spi(Programs) import Transport

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
        abstract: "Remove the instances a crashed publisher left behind, signed with a key.",
        discussion: """
            Removes the instances whose expiry passed. Every other instance is checked with a TCP \
            connection to each address its SRV record names: one that refuses or does not answer is \
            reported as registered but not answering (a publisher that crashed within its lease), and \
            removed too with --not-answering. Check from a host that can reach the services: an \
            instance this host cannot reach is not answering from here. A live publisher removed by \
            mistake registers again at its next refresh (at half its lease).

            Each removal is conditional: an instance refreshed meanwhile keeps its records. Any key the \
            update policy lets write the service types can remove them (TSIG gives no per-instance \
            ownership; see docs/SECURITY.md).
            """)

    @Option(help: "The TSIG key file (what tsig-keygen writes). Environment: LANMSG_WIDE_AREA_KEY.")
    var key: String?

    @Flag(
        name: .customLong("not-answering"),
        help: "Also remove registered instances that refuse connections or do not answer within --timeout.")
    var notAnswering = false

    @Option(help: "Seconds to wait for each instance's connection when checking it.")
    var timeout: Double = 3

    @OptionGroup var options: WideAreaOptions

    func validate() throws {
        guard timeout > 0, timeout <= 60 else { throw ValidationError("--timeout wants seconds between 0 and 60, not \(timeout)") }
    }

    func run() async throws {
        let (configuration, _) = try DiscoveryConfiguration.forProgram(wideAreaKeyFile: key)
        guard let tsig = configuration.wideArea.key else {
            throw ValidationError("cleanup needs a key: --key FILE or LANMSG_WIDE_AREA_KEY")
        }
        let logger = options.logger()
        let administration = WideAreaAdministration(configuration: configuration, logger: logger)
        var expired = 0
        var silent = 0
        var silentRemoved = 0
        var failures = 0
        let now = UInt64(time(nil))
        for domain in try await options.domains(administration, registration: true) {
            for type in options.serviceTypes {
                do {
                    for instance in try await administration.instances(type: type, domain: domain) {
                        if instance.isExpired {
                            if try await administration.remove(instance, key: tsig) {
                                print("removed \(instance.name)\t\(type)\t\(domain)\texpired")
                                expired += 1
                            }
                            continue
                        }
                        guard let reason = await Self.notAnswering(instance, administration, timeout: timeout, logger: logger) else { continue }
                        silent += 1
                        let left = instance.expires.map { $0 > now ? "registered for \($0 - now) s more" : "registered" } ?? "registered without expiry"
                        if notAnswering {
                            if try await administration.remove(instance, key: tsig) {
                                print("removed \(instance.name)\t\(type)\t\(domain)\tnot answering: \(reason)")
                                silentRemoved += 1
                            } else {
                                print("kept \(instance.name)\t\(type)\t\(domain)\tits publisher refreshed it meanwhile")
                            }
                        } else {
                            print("not answering \(instance.name)\t\(type)\t\(domain)\t\(reason); \(left)")
                        }
                    }
                } catch {
                    print("\(type).\(domain): \(error.message)")
                    failures += 1  // the other types and domains are still cleaned
                }
            }
        }
        var summary = "\(expired) expired instance\(expired == 1 ? "" : "s") removed"
        if notAnswering {
            summary += "; \(silentRemoved) registered but not answering removed"
        } else if silent > 0 {
            summary += "; \(silent) registered but not answering (add --not-answering to remove \(silent == 1 ? "it" : "them"))"
        }
        if failures > 0 { summary += "; \(failures) failed" }
        print(summary)
        if failures > 0 { throw ExitCode(1) }
    }

    /// Why `instance` does not answer — every address its SRV names refused a TCP connection or
    /// gave no answer within `timeout` — or nil when one accepted it (or it is not a `_tcp` service:
    /// those are not checked).
    static func notAnswering(
        _ instance: WideAreaAdministration.Instance, _ administration: WideAreaAdministration, timeout: Double, logger: Logger
    ) async -> String? {
        // Only a TCP service is checked with a TCP connection (a _udp one never accepts one).
        guard instance.type.lowercased().hasSuffix("._tcp") else { return nil }
        guard let port = instance.port, let host = instance.host else { return "it has no SRV record" }
        let addresses = await administration.addresses(of: instance).compactMap { SocketAddress(bytes: $0.bytes, port: port) }
        guard !addresses.isEmpty else { return "its host \(host) has no address" }
        do {
            let connected = try await TCPConnector.connect(to: addresses, timeout: .milliseconds(Int64(timeout * 1000)), logger: logger)
            connected.fd.close()
            return nil
        } catch let error as TransportError {
            if error.code == .connectTimedOut { return "no answer from \(host) port \(port) within \(timeout) s" }
            let each = error.connectFailures.map(\.description)
            return each.isEmpty ? error.message : each.joined(separator: ", ")
        } catch {
            return "\(error)"
        }
    }
}
