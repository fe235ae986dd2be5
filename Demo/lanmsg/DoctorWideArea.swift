import Discovery
import Foundation

extension DoctorChecks {
    /// The wide-area set-up: resolvers and search domains, the domains the network announces, the
    /// update server of each domain, and with a key: the key file's mode, the key accepted by a
    /// signed no-op, the clocks; and whether the server takes unsigned updates (it should not).
    func checkWideArea(keyFile: String?, domain: String?) async {
        var configuration: DiscoveryConfiguration
        // The key is the doctor's to read (issue 45, 2): a problem with it is a finding, and every
        // other check runs all the same (a readable key is a warning, and still tested).
        var environment = ProcessInfo.processInfo.environment
        let keyPath = keyFile ?? environment["LANMSG_WIDE_AREA_KEY"].flatMap { $0.isEmpty ? nil : $0 }
        environment["LANMSG_WIDE_AREA_KEY"] = nil
        do {
            (configuration, _) = try DiscoveryConfiguration.forProgram(wideAreaDomain: domain, environment: environment)
            configuration.wideArea.queryTimeout = timeout  // --timeout bounds these checks too
            configuration.wideArea.updateTimeout = timeout
        } catch {
            report(Finding(level: .fail, check: "wide-area", text: error.message, advice: "give a domain name such as lab.example.org"))
            return
        }
        if let keyPath { configuration.wideArea.key = readKey(keyPath) }
        let administration = WideAreaAdministration(configuration: configuration, logger: logger)
        let resolvers = administration.resolvers
        if resolvers.isEmpty {
            report(Finding(
                level: .note, check: "wide-area", text: "no DNS server is configured (\(configuration.wideArea.resolverConfigurationPath) has no nameserver)",
                advice: "wide-area DNS-SD (services on other subnets) needs one; the link's mDNS does not"))
            return
        }
        let search = administration.searchDomains
        report(Finding(
            level: search.isEmpty ? .note : .ok, check: "search-domains",
            text: search.isEmpty
                ? "the resolver has no search domain (resolvers: \(resolvers.map(\.description).joined(separator: ", ")))"
                : "search domains: \(search.joined(separator: " ")) (resolvers: \(resolvers.map(\.description).joined(separator: ", ")))",
            advice: "DNS-SD finds the network's domains under the search domains (and the subnets' reverse names); "
                + "add `search <your domain>` to /etc/resolv.conf (or your DHCP server's domain option)"))
        let domains = await administration.domains()
        if domains.browse.isEmpty && domains.registration.isEmpty {
            report(Finding(
                level: .note, check: "wide-area-domains",
                text: "the network announces no DNS-SD domain (no b/db/lb/r/dr._dns-sd._udp PTR under \((search + administration.subnetNames).joined(separator: ", ")))",
                advice: "programs then find services on this link only; an administrator adds the PTR records (docs/DISCOVERY.md, \"Domain enumeration\"), or give --wide-area-domain"))
        } else {
            report(Finding(
                level: .ok, check: "wide-area-domains",
                text: "browse domains: \(domains.browse.joined(separator: " ")); registration domains: \(domains.registration.isEmpty ? "none" : domains.registration.joined(separator: " "))"))
        }
        var toCheck = domain.map { [$0] } ?? domains.registration
        if toCheck.isEmpty { toCheck = Array(domains.browse.prefix(1)) }
        for domain in toCheck {
            do {
                let (zone, servers) = try await administration.updateServers(for: domain)
                report(Finding(
                    level: .ok, check: "update-server",
                    text: "\(domain): zone \(zone), updates go to \(servers.map(\.description).joined(separator: ", "))"))
            } catch {
                report(Finding(
                    level: .fail, check: "update-server", text: "\(domain): \(error.message)",
                    advice: "the zone needs an SOA whose primary has an address, or a _dns-update._udp SRV record"))
                continue
            }
            if let key = configuration.wideArea.key {
                do {
                    let check = try await administration.checkKey(key, domain: domain)
                    report(Finding(
                        level: .ok, check: "wide-area-key",
                        text: "\(domain): \(key) accepted by \(check.server) and allowed to register services (\(check.roundTrip.formatted))"))
                    let skew = check.clockSkew
                    report(Finding(
                        level: abs(skew) > 60 ? .warn : .ok, check: "clock",
                        text: "this host's clock is \(abs(skew)) s \(skew >= 0 ? "ahead of" : "behind") the DNS server's",
                        advice: "signed updates fail beyond 300 s: keep the clock set (NTP: systemd-timesyncd or chrony)"))
                } catch {
                    report(Finding(
                        level: .fail, check: "wide-area-key", text: "\(domain): \(error.message)",
                        advice: error.code == .clockSkew ? "set the clock (NTP)" : "see docs/DISCOVERY.md, \"Keys\""))
                }
            }
            do {
                if try await administration.acceptsUnsignedUpdates(domain: domain) {
                    report(Finding(
                        level: .warn, check: "unsigned-updates",
                        text: "\(domain): the DNS server accepted an unsigned update (removed again)",
                        advice: "anyone on the network can change its services: use `update-policy` with TSIG keys, not `allow-update` by address"))
                } else {
                    report(Finding(level: .ok, check: "unsigned-updates", text: "\(domain): the DNS server refuses unsigned updates"))
                }
            } catch {
                report(Finding(level: .note, check: "unsigned-updates", text: "\(domain): \(error.message)"))
            }
        }
    }

    /// Reads the TSIG key at `path` for the checks, saying what is wrong with it and the hint that
    /// fits: no file (make one), a file others can read (a warning: chmod 600; the programs refuse
    /// it, the doctor still tests it), not a key (what tsig-keygen writes). Nil when unusable.
    func readKey(_ path: String) -> TSIGKey? {
        guard FileManager.default.fileExists(atPath: path) else {
            report(Finding(
                level: .fail, check: "wide-area-key", text: "there is no key file at \(path)",
                advice: "make one with `tsig-keygen -a hmac-sha256 HOST.DOMAIN > \(path) && chmod 600 \(path)` and add "
                    + "it to the DNS server's update policy (docs/DISCOVERY.md, \"Keys\"), or correct the path"))
            return nil
        }
        var text: String?
        if TSIGKey.isReadableByOthers(path: path) {
            report(Finding(
                level: .warn, check: "wide-area-key", text: "the key file \(path) can be read by other users (the programs refuse to use it)",
                advice: "whoever reads it can change the zone's services: `chmod 600 \(path)`"))
            text = try? String(contentsOfFile: path, encoding: .utf8)
        } else {
            do {
                return try TSIGKey(contentsOfFile: path)
            } catch {
                report(Finding(
                    level: .fail, check: "wide-area-key", text: error.message,
                    advice: error.systemErrno != nil
                        ? "check the file's permissions (it must be readable by this user)"
                        : "a key file is what `tsig-keygen -a hmac-sha256 HOST.DOMAIN` prints: `key \"HOST.DOMAIN\" { algorithm …; secret \"…\"; };`"))
                return nil
            }
        }
        guard let text else {
            report(Finding(level: .fail, check: "wide-area-key", text: "cannot read the key file \(path)", advice: "check its permissions"))
            return nil
        }
        do {
            return try TSIGKey.parse(text)
        } catch {
            report(Finding(
                level: .fail, check: "wide-area-key", text: "the key file \(path) is not usable: \(error.message)",
                advice: "a key file is what `tsig-keygen -a hmac-sha256 HOST.DOMAIN` prints"))
            return nil
        }
    }
}

extension Duration {
    /// `1.2 ms`.
    var formatted: String {
        let ms = Double(components.seconds) * 1000 + Double(components.attoseconds) / 1e15
        return String(format: "%.1f ms", ms)
    }

}
