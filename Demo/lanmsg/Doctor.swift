@_spi(Programs) import Discovery
@_spi(Programs) import ProtocolCore
import Glibc
import Logging
import Messaging

/// One thing the doctor found: how bad, what, and what to do.
struct Finding {
    enum Level: String { case ok = "ok", note = "note", warn = "warn", fail = "FAIL" }
    var level: Level
    var check: String
    var text: String
    var advice: String? = nil
}

/// The checks of `lanmsg doctor`, in the order a user would fix things: the daemon and its bus,
/// the mDNS port, each interface, packets on each interface, then (when named) one service.
struct DoctorChecks {
    var timeout: Duration
    var logger: Logger
    var report: (Finding) -> Void

    func runHostChecks() async {
        checkDBus()
        checkPortHolders()  // before the checks below open sockets on 5353 themselves
        await checkAvahi()
        checkInterfaces()
    }

    // MARK: D-Bus and Avahi

    func checkDBus() {
        let path = systemBusPath()
        if let error = connectUnix(path) {
            report(Finding(
                level: .warn, check: "dbus",
                text: "the system D-Bus is not reachable at \(path): \(errnoText(error))",
                advice: "Avahi is reached through it: start it (`systemctl start dbus`), or set "
                    + "DBUS_SYSTEM_BUS_ADDRESS=unix:path=<socket> when it lives elsewhere"))
        } else {
            report(Finding(level: .ok, check: "dbus", text: "the system D-Bus answers at \(path)"))
        }
    }

    func checkAvahi() async {
        let discovery = ServiceDiscovery(logger: logger, backend: .avahi)
        await checkAvahi(discovery)
        await discovery.shutdown()  // awaited: no task left behind to run (or not) as the process ends
    }

    private func checkAvahi(_ discovery: ServiceDiscovery) async {
        let state = await firstSettled(discovery.daemonStates(), within: timeout) ?? discovery.daemonState
        let startIt = "start it (`systemctl start avahi-daemon`; on Debian `apt-get install avahi-daemon`). "
            + "Without it, programs on this library's automatic backend use their embedded mDNS stack "
            + "(the checks below say whether that can work here)"
        switch state {
        case .running:
            report(Finding(level: .ok, check: "avahi", text: "avahi-daemon is running (host name \(discovery.hostName).local)"))
            await publishAndBrowseOurselves(discovery, check: "avahi-publish", through: "Avahi")
            return
        case .failed(let error):
            report(Finding(
                level: .warn, check: "avahi", text: "avahi-daemon is not reachable: \(error.message)", advice: startIt))
        case .connecting:
            report(Finding(
                level: .warn, check: "avahi",
                text: "avahi-daemon is not reachable: no avahi-daemon answered on D-Bus within \(timeout)", advice: startIt))
        default:
            report(Finding(
                level: .warn, check: "avahi", text: "avahi-daemon did not come up within \(timeout) (state: \(state))",
                advice: "it may be starting, or still claiming its host name: run the doctor again; "
                    + "`journalctl -u avahi-daemon` says more"))
        }
        // What apps on the automatic backend use instead: the embedded mDNS stack, tried for real.
        let embedded = ServiceDiscovery(logger: logger, backend: .embedded)
        await publishAndBrowseOurselves(embedded, check: "embedded-publish", through: "the embedded mDNS stack")
        await embedded.shutdown()
    }

    /// Publishes a service through Avahi and browses for it: proves that Avahi publishes and
    /// reports on this host, and says on which interfaces.
    func publishAndBrowseOurselves(_ discovery: ServiceDiscovery, check: String, through stack: String) async {
        let type = "_lanmsg-doctor._tcp"
        let name = "lanmsg doctor \(getpid())"
        let publication: PublishedService
        do {
            publication = try await discovery.publish(name: name, type: type, port: 9)
        } catch {
            report(Finding(
                level: .fail, check: check, text: "\(stack) refused to publish a test service: \(error.message)",
                advice: stack == "Avahi"
                    ? "check `journalctl -u avahi-daemon`; a host name conflict or disabled publishing "
                        + "(`disable-user-service-publishing` in avahi-daemon.conf) stops every app from publishing"
                    : "see the port-5353 and mdns-packets checks below; run with --verbose for the library's logs"))
            return
        }
        await browseForOurselves(discovery, name: name, type: type, check: check, through: stack)
        await publication.unpublish()  // its goodbyes sent before the doctor goes on (and ends)
    }

    private func browseForOurselves(_ discovery: ServiceDiscovery, name: String, type: String, check: String, through stack: String) async {
        do {
            let browser = try discovery.browse(type: type)
            let seen: DiscoveredService? = await withDeadline(timeout) {
                for await event in browser {
                    if case .added(let service) = event, service.name == name { return service }
                }
                return nil
            }
            if let seen {
                let places = Set(seen.seenOn.map { interfaceName(Int32($0.interfaceIndex)) + " " + "\($0.ipVersion)" })
                report(Finding(
                    level: .ok, check: check,
                    text: "published and browsed a test service through \(stack): seen on \(places.sorted().joined(separator: ", "))"))
            } else {
                report(Finding(
                    level: .fail, check: check,
                    text: "a test service published through \(stack) was not seen by a browse within \(timeout)",
                    advice: stack == "Avahi"
                        ? "a firewall dropping UDP port 5353 stops it (see mdns-packets below), or Avahi is restricted "
                            + "to other interfaces (`allow-interfaces`/`deny-interfaces` in avahi-daemon.conf)"
                        : "a firewall dropping UDP port 5353 stops it (see mdns-packets below)"))
            }
        } catch {
            report(Finding(level: .fail, check: check, text: "cannot browse through \(stack): \(error.message)"))
        }
    }

    // MARK: Port 5353 and interfaces

    func checkPortHolders() {
        var (sockets, holders) = udpPortHolders(5353)
        // The doctor's own sockets (the embedded check's, if its shutdown is still closing them).
        let own = holders.filter { $0.pid == getpid() }.count
        holders.removeAll { $0.pid == getpid() }
        if holders.isEmpty && own > 0 { sockets = 0 }  // only ours
        let programs = Set(holders.map(\.command))
        let list = holders.map { "\($0.command) (pid \($0.pid))" }.joined(separator: ", ")
        if sockets == 0 {
            report(Finding(
                level: .note, check: "port-5353",
                text: "no program holds UDP port 5353 (no mDNS responder runs on this host)",
                advice: "start avahi-daemon, or use a program on this library's embedded backend"))
        } else if programs.count > 1 {
            report(Finding(
                level: .warn, check: "port-5353", text: "several mDNS responders share UDP port 5353: \(list)",
                advice: "two responders answer every query twice and may fight over host and service names; "
                    + "keep one (e.g. `systemctl disable --now systemd-resolved`'s mDNS with MulticastDNS=no, or stop the other)"))
        } else {
            report(Finding(
                level: .ok, check: "port-5353",
                text: "UDP port 5353: \(holders.isEmpty ? "\(sockets) socket(s), owner not visible (run as root to see it)" : list)"))
        }
    }

    func checkInterfaces() {
        let interfaces = readInterfaces().filter { !$0.isLoopback }
        let usable = interfaces.filter {
            $0.isAdministrativelyUp && $0.canMulticast && (!$0.ipv4.isEmpty || !$0.ipv6LinkLocal.isEmpty)
        }
        if interfaces.filter(\.isAdministrativelyUp).isEmpty {
            report(Finding(
                level: .fail, check: "interfaces", text: "no network interface is up besides loopback",
                advice: "bring one up (`ip link set <name> up`) and give it an address; mDNS never uses loopback"))
            return
        }
        for interface in interfaces where interface.isAdministrativelyUp {
            var addresses = interface.ipv4Text + interface.ipv6LinkLocal + interface.ipv6Other
            if addresses.isEmpty { addresses = ["no address"] }
            let summary = "\(interface.name): up\(interface.hasCarrier ? "" : " (no carrier)"), \(addresses.joined(separator: ", "))"
            guard interface.canMulticast else {
                report(Finding(
                    level: .fail, check: "multicast", text: "\(interface.name): multicast is off, so mDNS cannot work on it",
                    advice: "turn it on: `ip link set \(interface.name) multicast on`"))
                continue
            }
            report(Finding(level: .ok, check: "interface", text: summary + ", multicast on"))
            if interface.ipv4.isEmpty && interface.ipv6LinkLocal.isEmpty {
                report(Finding(
                    level: .warn, check: "interface", text: "\(interface.name): no IPv4 address and no IPv6 link-local address",
                    advice: "mDNS needs one of them on the interface"))
            }
            if !interface.ipv6LinkLocal.isEmpty {
                report(Finding(
                    level: .note, check: "ipv6",
                    text: "\(interface.name): IPv6 link-local \(interface.ipv6LinkLocal.joined(separator: ", "))",
                    advice: "a link-local address typed by hand needs its zone (%\(interface.name)); resolved services carry it already"))
            }
            for ipv6 in [false, true] where ipv6 ? !interface.ipv6LinkLocal.isEmpty : !interface.ipv4.isEmpty {
                checkRoundTrip(interface, ipv6: ipv6)
            }
        }
        if usable.isEmpty {
            report(Finding(
                level: .fail, check: "interfaces", text: "no interface is up with multicast and an address: mDNS cannot work on this host",
                advice: "see the lines above"))
        }
    }

    func checkRoundTrip(_ interface: InterfaceInfo, ipv6: Bool) {
        let family = ipv6 ? "IPv6 (ff02::fb)" : "IPv4 (224.0.0.251)"
        switch multicastRoundTrip(interface, ipv6: ipv6, timeoutMilliseconds: Int32(clamping: max(timeout.milliseconds, 100))) {
        case .cameBack(let micros):
            report(Finding(
                level: .ok, check: "mdns-packets",
                text: "\(interface.name) \(family): an mDNS query sent to the group came back (\(micros) µs); port 5353 can be joined"))
        case .silent:
            report(Finding(
                level: .fail, check: "mdns-packets",
                text: "\(interface.name) \(family): an mDNS query sent to the group did not come back within \(timeout)",
                advice: "a firewall on this host drops mDNS: allow UDP port 5353 from the group "
                    + "(nftables: `nft add rule inet filter input udp dport 5353 accept`; firewalld: "
                    + "`firewall-cmd --add-service=mdns`); `nft list ruleset` / `iptables -S` show the rules"))
        case .failed(let step, let code):
            let advice: String
            switch code {
            case EPERM, EACCES: advice = "a firewall refused the packet on its way out (an OUTPUT rule for UDP 5353): allow it"
            case EADDRINUSE: advice = "another program holds UDP port 5353 without sharing it (SO_REUSEADDR): see port-5353 above"
            case ENETUNREACH, ENODEV, EADDRNOTAVAIL:
                advice = "the interface cannot send multicast (no route to the group, or multicast off): `ip link set \(interface.name) multicast on`"
            default: advice = "see the error; run with --verbose for the library's logs"
            }
            report(Finding(
                level: .fail, check: "mdns-packets", text: "\(interface.name) \(family): \(step) failed: \(errnoText(code))",
                advice: advice))
        }
    }

    // MARK: A named service

    /// Where a service was found, for people: "on eth0 IPv4, eth0 IPv6" (the link), "in DNS
    /// (lab.home.arpa)" (wide-area: no interface sighting), or both (issue 45, 3: a service found
    /// only in DNS was "found 'Echo' on " — an empty place).
    static func whereFound(_ service: DiscoveredService, interfaceName: (Int32) -> String) -> String {
        let link = Set(service.seenOn.map { interfaceName(Int32($0.interfaceIndex)) + " " + "\($0.ipVersion)" }).sorted()
        var domains: [String] = []
        for location in service.locations {
            var domain = location.domain.lowercased()
            while domain.hasSuffix(".") { domain.removeLast() }
            if domain != "local", !domain.isEmpty, !domains.contains(domain) { domains.append(domain) }
        }
        var parts: [String] = []
        if !link.isEmpty { parts.append("on " + link.joined(separator: ", ")) }
        if !domains.isEmpty { parts.append("in DNS (" + domains.joined(separator: ", ") + ")") }
        return parts.isEmpty ? "(no place reported by discovery)" : parts.joined(separator: " and ")
    }

    func checkService(name: String, type: String) async {
        let discovery = ServiceDiscovery(logger: logger)
        await checkService(name: name, type: type, discovery: discovery)
        await discovery.shutdown()
    }

    private func checkService(name: String, type: String, discovery: ServiceDiscovery) async {
        let service: DiscoveredService
        do {
            service = try await MessageClient.find(name: name, type: type, discovery: discovery, timeout: timeout)
        } catch {
            report(Finding(
                level: .fail, check: "service", text: "'\(name)' (\(type)) not found: \(error.message)",
                advice: "is it running, on this link, and published with this type? `avahi-browse -r \(type)` lists what is seen"))
            return
        }
        report(Finding(level: .ok, check: "service", text: "found '\(name)' \(Self.whereFound(service, interfaceName: interfaceName))"))
        let resolved: ResolvedService
        do {
            resolved = try await discovery.resolve(service, timeout: timeout)
        } catch {
            report(Finding(
                level: .fail, check: "resolve", text: "'\(name)' was seen but did not resolve: \(error.message)",
                advice: "its host may not answer for its host name (two hosts with one name?); `avahi-resolve -n <host>.local` tells"))
            return
        }
        report(Finding(
            level: .ok, check: "resolve",
            text: "resolved to \(resolved.hostName):\(resolved.port) at \(resolved.addresses.map(\.description).joined(separator: ", ")); TXT \(resolved.txt)"))
        let addresses = resolved.addresses.compactMap { SocketAddress(bytes: $0.ip.bytes, port: $0.port, scopeID: $0.scopeID) }
        var configuration = ChannelConfiguration(name: "lanmsg-doctor")
        configuration.connectTimeout = timeout
        configuration.helloTimeout = timeout
        configuration.pingInterval = .milliseconds(100)
        let encrypted = resolved.txt["proto"].flatMap(Int.init) ?? 1 >= 2
        // The doctor checks that the handshake completes; it trusts no key and stores none.
        configuration.security = encrypted ? .encrypted(identity: .ephemeral(), trust: .anyKey) : .plaintext
        let started = ContinuousClock.now
        let channel: MessageChannel
        do {
            channel = try await MessageChannel.connect(to: addresses, configuration: configuration, logger: logger)
        } catch let error as TransportError {
            let advice: String
            switch error.code {
            case .connectFailed, .connectTimedOut:
                if let stale = await staleRegistration(of: service) {
                    // Found in DNS and nobody answers: a publisher that crashed left its records
                    // (issue 45, 1) — the likeliest cause, so it is named first.
                    advice = stale
                    break
                }
                advice = "the service's host is reachable by mDNS but not on TCP port \(resolved.port): a firewall there, "
                    + "or the program publishes an address it does not listen on"
            case .versionMismatch: advice = "the two sides speak different protocol versions: update the older one"
            case .authenticationFailed: advice = "the server wants another key or a pre-shared key (see docs/SECURITY.md)"
            default: advice = "the server refused or failed the hello; its log says why"
            }
            report(Finding(level: .fail, check: "connect", text: "cannot connect and handshake: \(error.message)", advice: advice))
            return
        } catch {
            report(Finding(level: .fail, check: "connect", text: "cannot connect: \(error)"))
            return
        }
        let elapsed = ContinuousClock.now - started
        var text = "connected to \(channel.remoteAddress.map { "\($0)" } ?? "?") and completed the hello in \(elapsed.milliseconds) ms: "
            + "protocol \(channel.peer.version), peer '\(channel.peer.name)'"
        if let identity = channel.peerIdentity {
            let hint = resolved.txt["fp"]
            text += ", key \(identity.fingerprint.short)"
            if let hint { text += hint == identity.fingerprint.short ? " (matches its TXT fp)" : " (its TXT says fp=\(hint)!)" }
        }
        report(Finding(level: .ok, check: "connect", text: text))
        let health: ConnectionHealth? = await withDeadline(timeout) {
            for await health in channel.healthUpdates where health.samples >= 3 { return health }
            return nil
        }
        if let health, let rtt = health.smoothedRTT {
            report(Finding(level: .ok, check: "rtt", text: "round-trip time \(rtt.microseconds) µs (smoothed over \(health.samples) pings)"))
        } else {
            report(Finding(
                level: .warn, check: "rtt", text: "no answer to pings within \(timeout)",
                advice: "the connection is slow or the peer does not answer PING (an old version?)"))
        }
        channel.close(reason: "lanmsg doctor done")
        _ = await channel.closed()
    }

    /// For a service registered in a unicast DNS domain that does not answer: what its registration
    /// says (valid until when), as the likely cause — a publisher that crashed (kill -9, power loss)
    /// leaves its records until its lease runs out — and how to remove it now. Nil when the service
    /// was not found in DNS or its registration cannot be read.
    func staleRegistration(of service: DiscoveredService) async -> String? {
        let domains = service.locations.map(\.domain).filter { $0.lowercased() != "local" && !$0.isEmpty }
        guard let domain = domains.first,
            let (configuration, _) = try? DiscoveryConfiguration.forProgram()
        else { return nil }
        let administration = WideAreaAdministration(configuration: configuration, logger: logger)
        guard let instances = try? await administration.instances(type: service.identity.type, domain: domain),
            let instance = instances.first(where: { $0.name == service.identity.name })
        else { return nil }
        let now = UInt64(time(nil))
        let validity: String
        if let expires = instance.expires {
            validity = expires > now
                ? "its registration runs out in \(expires - now) s (a crashed publisher's records disappear then)"
                : "its registration ran out \(now - expires) s ago"
        } else {
            validity = "its registration carries no expiry (another publisher's, which never expires)"
        }
        return "'\(service.identity.name)' is registered in \(domain) but nothing answers there: most likely a stale registration "
            + "left by a publisher that crashed; \(validity). Restart the service (it replaces its own stale records), or "
            + "remove it now with `lanmsg wide-area cleanup --not-answering --key KEY --type \(service.identity.type)`"
    }

    // MARK: Helpers

    /// The first state that is not `connecting` (or the last one seen) within `timeout`.
    func firstSettled(_ states: AsyncStream<DaemonState>, within timeout: Duration) async -> DaemonState? {
        await withDeadline(timeout) {
            for await state in states {
                switch state {
                case .running, .failed: return state
                default: continue
                }
            }
            return nil
        }
    }

    func interfaceName(_ index: Int32) -> String {
        var buffer = [CChar](repeating: 0, count: Int(IF_NAMESIZE) + 1)
        guard if_indextoname(UInt32(index), &buffer) != nil else { return "#\(index)" }
        return cString(buffer)
    }
}

/// Runs `body`, giving up (nil) at the deadline.
func withDeadline<T: Sendable>(_ timeout: Duration, _ body: @escaping @Sendable () async -> T?) async -> T? {
    await withTaskGroup(of: T?.self) { group in
        group.addTask { await body() }
        group.addTask {
            try? await Task.sleep(for: timeout)
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
}

extension Duration {
    var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }
    var microseconds: Int64 { components.seconds * 1_000_000 + components.attoseconds / 1_000_000_000_000 }
}
