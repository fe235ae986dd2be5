import ArgumentParser
import Logging

@main
struct LanMsg: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lanmsg",
        abstract: "Tools for apps built on swift-lan-messaging.",
        subcommands: [Doctor.self, WideAreaCommand.self])
}

struct Doctor: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Checks why discovery or a connection does not work on this host, and says what to do.",
        discussion: """
            Checks, in order: the system D-Bus, who holds UDP port 5353, avahi-daemon (and publishes \
            and browses a test service through it, or through the embedded mDNS stack when Avahi is \
            absent), each interface (up, multicast, addresses, \
            IPv6 link-local), whether an mDNS packet sent on each interface comes back (a firewall \
            dropping port 5353 stops it), and the wide-area set-up (search domains, announced domains, \
            the update server, a key's acceptance and the clocks, unsigned updates refused). With --service and --type, also finds, resolves, connects to \
            and handshakes with that service and measures its round-trip time.
            Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed.
            """)

    @Option(help: "A service to check end to end: its name, e.g. \"Preview on projector\".")
    var service: String?

    @Option(help: "The service's type, e.g. _preview._tcp (required with --service).")
    var type: String?

    @Option(help: "Seconds each check may take.")
    var timeout: Double = 3

    @Flag(help: "Show the library's log lines too.")
    var verbose = false

    @Option(help: "Wide-area: a TSIG key file to check (accepted by the update server, not readable by others, clocks agreed). Environment: LANMSG_WIDE_AREA_KEY.")
    var wideAreaKey: String?

    @Option(help: "Wide-area: the unicast DNS domain to check (default: those the network announces). Environment: LANMSG_WIDE_AREA_DOMAIN.")
    var wideAreaDomain: String?

    func validate() throws {
        if service != nil && type == nil { throw ValidationError("--service needs --type, e.g. --type _preview._tcp") }
        guard timeout > 0 && timeout <= 60 else { throw ValidationError("--timeout takes 0 to 60 seconds") }
    }

    func run() async throws {
        var logger = Logger(label: "lanmsg-doctor") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = verbose ? .debug : .critical
        var failures = 0
        var warnings = 0
        let checks = DoctorChecks(timeout: .milliseconds(Int64(timeout * 1000)), logger: logger) { finding in
            if finding.level == .fail { failures += 1 }
            if finding.level == .warn { warnings += 1 }
            print("\(finding.level.rawValue.padding(toLength: 5, withPad: " ", startingAt: 0)) \(finding.check): \(finding.text)")
            if let advice = finding.advice, finding.level != .ok { print("      → \(advice)") }
        }
        await checks.runHostChecks()
        await checks.checkWideArea(keyFile: wideAreaKey, domain: wideAreaDomain)
        if let service, let type { await checks.checkService(name: service, type: type) }
        print("summary: \(failures) failed, \(warnings) warning\(warnings == 1 ? "" : "s")")
        if failures > 0 { throw ExitCode(1) }
    }
}
