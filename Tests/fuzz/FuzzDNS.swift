// libFuzzer target for the DNS message parser and the mDNS engine that consumes it: everything a
// hostile responder controls; and the unicast reply parser (TSIG split off, its MAC input built,
// SOA and EDNS read), which a hostile DNS server or an off-path spoofer controls. Built by run-fuzz-mdns.sh with Sources/MDNSCore/*.swift.
// Invariants: no crash, no hang; a parsed message re-encodes to bytes that parse again, and a
// second round is stable; an engine fed the datagram keeps its cache within its capacity.

@inline(__always)
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("DNS fuzz invariant violated: \(message())") }
}

let serviceType = DNSName("_fuzz._tcp.local")!
let link = LinkID(interfaceIndex: 2, family: .v4)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzDNS(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    if let message = try? DNSMessage(parsing: bytes) {
        _ = message.questions.map(\.description)
        _ = message.records.map(\.description)
        let again = message.encoded(maxSize: 1 << 20)
        guard let reparsed = try? DNSMessage(parsing: again) else { fatalError("a re-encoded message does not parse") }
        check(reparsed.questions.count == message.questions.count, "questions lost")
        check(reparsed.records.count == message.records.count, "records lost")
        let third = try? DNSMessage(parsing: reparsed.encoded(maxSize: 1 << 20))
        check(third == reparsed, "re-encoding is not stable")
    }
    // The same bytes as a unicast DNS server's reply: TSIG split off (and re-encoded stably), the MAC
    // input of a response built, SOA and EDNS read.
    if let signed = try? SignedDNSMessage(parsing: bytes) {
        _ = signed.message.extendedRcode
        for record in signed.message.records {
            _ = record.soa
            _ = record.ednsOptions.map(\.updateLease)
        }
        if let tsig = signed.tsig {
            let input = tsig.responseDigestInput(requestMAC: [1, 2, 3], unsignedResponse: signed.unsignedBytes)
            check(input.count > signed.unsignedBytes.count, "the MAC input lost bytes")
            _ = tsig.serverTime
            check((try? TSIGRecord(keyName: tsig.keyName, rdata: tsig.rdata)) == tsig, "a TSIG record does not re-encode stably")
            check(signed.unsignedBytes.count <= bytes.count, "the unsigned part is longer than the message")
        }
    }
    // The engine, with a publication, a browse and a resolve, fed the datagram as a query and as a
    // response from another host, then run 2 minutes ahead.
    var configuration = MDNSConfiguration(hostName: "fuzz")
    configuration.cacheCapacity = 64
    var engine = MDNSEngine(
        configuration: configuration, now: MDNSInstant(nanoseconds: 1_000_000_000), seed: UInt64(size))
    var now = MDNSInstant(nanoseconds: 1_000_000_000)
    engine.setLinks([MDNSLink(id: link, name: "eth0", addresses: [[10, 0, 0, 1]])], now: now)
    _ = engine.publish(MDNSService(instance: "Fuzzed", type: serviceType, port: 1, txt: [Array("a=1".utf8)]), now: now)
    _ = engine.startBrowse(type: serviceType, links: .all, now: now)
    let resolve = engine.startResolve(
        instance: DNSName(instance: "Other", service: serviceType)!, links: .all, now: now)
    now = now.adding(milliseconds: 3000)
    engine.advance(now: now)
    for port: UInt16 in [5353, 40000] {
        engine.receive(
            bytes, from: MDNSSource(link: link, address: [10, 0, 0, 2], port: port, isLocal: false), now: now)
    }
    for _ in 0..<20 {
        guard let next = engine.nextDeadline(), next < now.adding(milliseconds: 120_000) else { break }
        now = max(now, next)
        engine.advance(now: now)
    }
    _ = engine.resolution(resolve)
    _ = engine.drainOutput()
    check(engine.cache.count <= 64, "cache over capacity: \(engine.cache.count)")
    return 0
}
