import Discovery
import Foundation

extension DoctorChecks {
    /// The wide-area set-up: resolvers and search domains, the domains the network announces, the
    /// update server of each domain, and with a key: the key file's mode, the key accepted by a
    /// signed no-op, the clocks; and whether the server takes unsigned updates (it should not).
    func checkWideArea(keyFile: String?, domain: String?) async {
        var configuration: DiscoveryConfiguration
        do {
            (configuration, _) = try DiscoveryConfiguration.forProgram(wideAreaDomain: domain, wideAreaKeyFile: keyFile)
            configuration.wideArea.queryTimeout = timeout  // --timeout bounds these checks too
            configuration.wideArea.updateTimeout = timeout
        } catch {
            report(Finding(level: .fail, check: "wide-area-key", text: error.message,
                advice: "make a key with `tsig-keygen -a hmac-sha256 HOST.DOMAIN > FILE` and add it to the DNS server (docs/DISCOVERY.md)"))
            return
        }
        let keyPath = keyFile ?? ProcessInfo.processInfo.environment["LANMSG_WIDE_AREA_KEY"]
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
                if let keyPath, TSIGKey.isReadableByOthers(path: keyPath) {
                    report(Finding(
                        level: .warn, check: "wide-area-key", text: "the key file \(keyPath) can be read by other users",
                        advice: "whoever reads it can change the zone's services: `chmod 600 \(keyPath)`"))
                }
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
}

extension Duration {
    /// `1.2 ms`.
    var formatted: String {
        let ms = Double(components.seconds) * 1000 + Double(components.attoseconds) / 1e15
        return String(format: "%.1f ms", ms)
    }
}
