import Locks

@testable import Discovery
@testable import MDNSCore

/// One authoritative DNS server for one zone, in memory, on a fake clock — the wide-area
/// counterpart of MDNSCoreTests' `FakeNetwork`. It answers what `UnicastDNS` sends it (a
/// `DNSExchanging` in its place): queries from the zone (NXDOMAIN with the SOA in the authority
/// section for a missing name), and signed DNS UPDATEs as RFC 2136 says — the TSIG checked
/// (unknown key: BADKEY; wrong secret: BADSIG, both unsigned, as BIND answers), an update policy
/// (REFUSED), the prerequisites (§3.2: YXDOMAIN, NXDOMAIN, YXRRSET, NXRRSET), the updates (§3.4),
/// the serial raised on every change, and the answer signed. A record added with an Update Lease
/// (RFC 9664) expires with it when the server `honorsLeases` (BIND 9 does not: it keeps them,
/// ../shared/WIDEAREA.md). `down`: no answer at all. No sockets, no threads, no real time.
final class FakeDNSServer: DNSExchanging {
    struct Stored: Sendable {
        var record: ResourceRecord
        /// Seconds since the epoch (fake clock); nil: kept until deleted.
        var expires: UInt64?
    }

    /// One update the server answered.
    struct Answered: Sendable {
        var at: UInt64
        var key: String?
        var rcode: UInt16
        var tsigError: UInt16
    }

    struct State: Sendable {
        /// The fake clock, in milliseconds since the epoch.
        var milliseconds: UInt64
        var serial: UInt32 = 1
        var records: [Stored] = []
        var down = false
        var honorsLeases = true
        var updates: [Answered] = []
        var queries: [(name: DNSName, type: UInt16)] = []
        var expired: [ResourceRecord] = []
    }

    let zone: DNSName
    let primary: DNSName
    /// The address it is reached at (the resolvers and the update server).
    let address = DNSServerAddress(.v4(10, 81, 3, 53))
    let keys: [DNSName: TSIGKey]
    /// Whether the key named (first) may change the name (second): BIND's `update-policy`.
    let policy: @Sendable (DNSName, DNSName) -> Bool
    let state: Locked<State>

    init(
        zone: String, keys: [TSIGKey], now: UInt64,
        policy: @escaping @Sendable (DNSName, DNSName) -> Bool = { _, _ in true }
    ) {
        self.zone = DNSName(zone)!
        self.primary = DNSName("ns." + zone)!
        self.keys = Dictionary(uniqueKeysWithValues: keys.map { ($0.dnsName, $0) })
        self.policy = policy
        var initial = State(milliseconds: now * 1_000)
        initial.records = [Stored(record: ResourceRecord(name: primary, data: .a([10, 81, 3, 53]), ttl: 3600))]
        state = Locked(initial)
    }

    /// Seconds since the epoch on the fake clock.
    var now: UInt64 { state.withLock { $0.milliseconds / 1_000 } }

    /// Moves the clock to `milliseconds`; records whose lease ended go (raising the serial).
    func advance(to milliseconds: UInt64) {
        state.withLock { state in
            state.milliseconds = max(state.milliseconds, milliseconds)
            let now = state.milliseconds / 1_000
            let gone = state.records.filter { $0.expires.map { $0 <= now } ?? false }
            guard !gone.isEmpty else { return }
            state.records.removeAll { $0.expires.map { $0 <= now } ?? false }
            state.expired += gone.map(\.record)
            state.serial &+= 1
        }
    }

    /// The records under `name` (any type when `type` is nil).
    func records(_ name: DNSName, _ type: UInt16? = nil) -> [ResourceRecord] {
        state.withLock { $0.records.map(\.record).filter { $0.name == name && (type == nil || $0.type == type) } }
    }

    var serial: UInt32 { state.withLock { $0.serial } }

    // MARK: DNSExchanging

    func exchange(_ bytes: [UInt8], id: UInt16, servers: [DNSServerAddress], timeout: Duration, tcp: Bool) async
        -> Result<DNSReply, DNSExchangeError>
    {
        guard servers.contains(address), !state.withLock({ $0.down }) else {
            return .failure(DNSExchangeError(servers: servers, reason: "no answer within \(timeout)"))
        }
        guard let request = try? SignedDNSMessage(parsing: bytes) else {
            return .failure(DNSExchangeError(servers: servers, reason: "the fake server could not parse the request"))
        }
        let reply = request.message.opcode == DNSOpcode.update ? update(request) : query(request.message)
        guard let signed = try? SignedDNSMessage(parsing: reply) else {
            return .failure(DNSExchangeError(servers: servers, reason: "the fake server's reply does not parse"))
        }
        return .success(DNSReply(signed: signed, server: address, overTCP: tcp))
    }

    // MARK: Queries

    private func soaRecord(serial: UInt32) -> ResourceRecord {
        var writer = ByteWriter()
        writer.appendUncompressed(primary)
        writer.appendUncompressed(DNSName("hostmaster." + zone.description)!)
        for value in [serial, 3600, 600, 86_400, 60] { writer.append32(value) }
        return ResourceRecord(name: zone, data: .other(type: DNSType.soa, rdata: writer.bytes), ttl: 60)
    }

    private func query(_ message: DNSMessage) -> [UInt8] {
        guard let question = message.questions.first else { return respond(to: message, rcode: DNSRcode.formErr) }
        return state.withLock { state in
            state.queries.append((question.name, question.type))
            guard question.name.hasSuffix(zone) else {
                return respond(to: message, rcode: DNSRcode.refused)
            }
            let soa = soaRecord(serial: state.serial)
            if question.name == zone && question.type == DNSType.soa {
                return respond(to: message, rcode: DNSRcode.noError, answers: [soa])
            }
            let owned = state.records.map(\.record).filter { $0.name == question.name }
            if owned.isEmpty && question.name != zone {
                return respond(to: message, rcode: DNSRcode.nxDomain, authorities: [soa])
            }
            let answers = owned.filter { $0.type == question.type }
            return respond(to: message, rcode: DNSRcode.noError, answers: answers, authorities: answers.isEmpty ? [soa] : [])
        }
    }

    private func respond(
        to message: DNSMessage, rcode: UInt16, answers: [ResourceRecord] = [], authorities: [ResourceRecord] = []
    ) -> [UInt8] {
        let flags = DNSMessage.responseFlag | DNSMessage.authoritativeFlag | (message.opcode << 11) | rcode
        return DNSMessage(
            id: message.id, flags: flags, questions: message.questions, answers: answers, authorities: authorities
        ).encoded(maxSize: 65535)
    }

    // MARK: Updates (RFC 2136 §3)

    private func update(_ request: SignedDNSMessage) -> [UInt8] {
        let message = request.message
        guard let tsig = request.tsig else {
            record(nil, DNSRcode.refused, 0)
            return respond(to: message, rcode: DNSRcode.refused)
        }
        guard let key = keys[tsig.keyName], key.algorithm.dnsName == tsig.algorithm else {
            return unsignedError(message, tsig, error: DNSRcode.badKey)
        }
        guard key.mac(tsig.requestDigestInput(message: request.unsignedBytes)) == tsig.mac else {
            return unsignedError(message, tsig, error: DNSRcode.badSig)
        }
        let rcode = state.withLock { state in apply(message, key: key, &state) }
        record(key.name, rcode, 0)
        let reply = respond(to: message, rcode: rcode)
        var signature = TSIGRecord(
            keyName: key.dnsName, algorithm: key.algorithm.dnsName, timeSigned: now, originalID: message.id)
        signature.mac = key.mac(signature.responseDigestInput(requestMAC: tsig.mac, unsignedResponse: reply))
        return signature.appended(to: reply)
    }

    /// NOTAUTH with a TSIG error and no MAC (RFC 8945 §5.2: BADKEY and BADSIG answers are unsigned).
    private func unsignedError(_ message: DNSMessage, _ tsig: TSIGRecord, error: UInt16) -> [UInt8] {
        record(tsig.keyName.description, DNSRcode.notAuth, error)
        let signature = TSIGRecord(
            keyName: tsig.keyName, algorithm: tsig.algorithm, timeSigned: now, originalID: message.id, error: error)
        return signature.appended(to: respond(to: message, rcode: DNSRcode.notAuth))
    }

    private func record(_ key: String?, _ rcode: UInt16, _ tsigError: UInt16) {
        state.withLock { $0.updates.append(Answered(at: $0.milliseconds / 1_000, key: key, rcode: rcode, tsigError: tsigError)) }
    }

    private func apply(_ message: DNSMessage, key: TSIGKey, _ state: inout State) -> UInt16 {
        guard message.questions.first?.name == zone else { return DNSRcode.notAuth }
        let present = state.records.map(\.record)
        // §3.2: the prerequisites, all of them, before anything changes.
        var valueDependent: [DNSName: [UInt16: [RecordData]]] = [:]
        for prerequisite in message.answers {
            let owned = present.filter { $0.name == prerequisite.name }
            switch (prerequisite.recordClass, prerequisite.type) {
            case (DNSClass.any, DNSType.any):
                if owned.isEmpty { return DNSRcode.nxDomain }
            case (DNSClass.any, let type):
                if !owned.contains(where: { $0.type == type }) { return DNSRcode.nxRRSet }
            case (DNSClass.none, DNSType.any):
                if !owned.isEmpty { return DNSRcode.yxDomain }
            case (DNSClass.none, let type):
                if owned.contains(where: { $0.type == type }) { return DNSRcode.yxRRSet }
            case (dnsClassIN, let type):
                valueDependent[prerequisite.name, default: [:]][type, default: []].append(prerequisite.data)
            default:
                return DNSRcode.formErr
            }
        }
        for (name, types) in valueDependent {
            for (type, wanted) in types {
                let have = present.filter { $0.name == name && $0.type == type }.map(\.data)
                guard Set(have) == Set(wanted) else { return DNSRcode.nxRRSet }
            }
        }
        // The update policy, for every name the update changes.
        for change in message.authorities where !policy(key.dnsName, change.name) { return DNSRcode.refused }
        // §3.4.2: the updates, in order.
        let lease = message.additionals.flatMap(\.ednsOptions).compactMap(\.updateLease).first
        let now = state.milliseconds / 1_000
        let expires = state.honorsLeases ? lease.map { now + UInt64($0) } : nil
        var records = state.records
        for change in message.authorities {
            switch (change.recordClass, change.type) {
            case (DNSClass.any, DNSType.any):
                records.removeAll { $0.record.name == change.name }
            case (DNSClass.any, let type):
                records.removeAll { $0.record.name == change.name && $0.record.type == type }
            case (DNSClass.none, _):
                records.removeAll { $0.record.name == change.name && $0.record.data == change.data }
            default:
                records.removeAll { $0.record.name == change.name && $0.record.data == change.data }
                records.append(Stored(record: change, expires: expires))
            }
        }
        let before = state.records.map { "\($0.record)" }.sorted()
        state.records = records
        if records.map({ "\($0.record)" }).sorted() != before || expires != nil { state.serial &+= 1 }
        return DNSRcode.noError
    }
}
