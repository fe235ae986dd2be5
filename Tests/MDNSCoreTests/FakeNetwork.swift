@testable import MDNSCore

/// Several engines on one simulated link with a fake clock: multicast reaches every engine (the
/// sender too, like IP_MULTICAST_LOOP), unicast reaches the engine with that address. Packets
/// arrive 1 ms after they are sent. No sockets, no threads, no real time.
struct FakeNetwork {
    struct Node {
        var engine: MDNSEngine
        var address: [UInt8]
        var events: [(at: MDNSInstant, event: MDNSEvent)] = []
        var sent: [(at: MDNSInstant, packet: MDNSPacket)] = []
        var received: [(at: MDNSInstant, bytes: [UInt8], port: UInt16)] = []
    }

    struct InFlight {
        var at: MDNSInstant
        var from: Int
        var packet: MDNSPacket
        var sourcePort: UInt16
    }

    static let link = LinkID(interfaceIndex: 2, family: .v4)
    var nodes: [Node] = []
    var inFlight: [InFlight] = []
    var now = MDNSInstant(nanoseconds: 1_000_000_000)
    /// Packets a test wants dropped (by sender index), e.g. to silence a node.
    var muted: Set<Int> = []

    /// Adds an engine with host name `host` and address 10.0.0.<n>.
    @discardableResult
    mutating func add(host: String, seed: UInt64? = nil, configure: (inout MDNSConfiguration) -> Void = { _ in }) -> Int
    {
        let index = nodes.count
        var configuration = MDNSConfiguration(hostName: host)
        configure(&configuration)
        let address: [UInt8] = [10, 0, 0, UInt8(index + 1)]
        var engine = MDNSEngine(configuration: configuration, now: now, seed: seed ?? UInt64(index + 1) * 7919)
        engine.setLinks([MDNSLink(id: Self.link, name: "eth0", addresses: [address])], now: now)
        nodes.append(Node(engine: engine, address: address))
        collect(index)
        return index
    }

    /// Lets `body` act on a node's engine at the current time, then collects what it produced.
    mutating func with<T>(_ index: Int, _ body: (inout MDNSEngine, MDNSInstant) -> T) -> T {
        let result = body(&nodes[index].engine, now)
        collect(index)
        return result
    }

    mutating func collect(_ index: Int) {
        for output in nodes[index].engine.drainOutput() {
            switch output {
            case .event(let event): nodes[index].events.append((now, event))
            case .send(let packet):
                nodes[index].sent.append((now, packet))
                if !muted.contains(index) {
                    inFlight.append(
                        InFlight(at: now.adding(milliseconds: 1), from: index, packet: packet, sourcePort: 5353))
                }
            }
        }
    }

    /// Injects a raw datagram as if sent by `address`:`port` (a peer that is not an engine).
    mutating func inject(
        _ bytes: [UInt8], to index: Int, fromAddress address: [UInt8] = [10, 0, 0, 99], port: UInt16 = 5353,
        isLocal: Bool = false
    ) {
        let source = MDNSSource(link: Self.link, address: address, port: port, isLocal: isLocal)
        nodes[index].received.append((now, bytes, port))
        nodes[index].engine.receive(bytes, from: source, now: now)
        collect(index)
    }

    /// Runs the simulation until `end` (bounded by a step count).
    mutating func run(until end: MDNSInstant) {
        var steps = 0
        while steps < 200_000 {
            steps += 1
            var next = inFlight.map(\.at).min()
            for index in nodes.indices {
                if let deadline = nodes[index].engine.nextDeadline() { next = min(next ?? deadline, deadline) }
            }
            guard let at = next, at <= end else { break }
            now = max(now, at)
            let arriving = inFlight.filter { $0.at <= now }
            inFlight.removeAll { $0.at <= now }
            for flight in arriving { deliver(flight) }
            for index in nodes.indices {
                nodes[index].engine.advance(now: now)
                collect(index)
            }
        }
        now = max(now, end)
    }

    mutating func run(forMilliseconds milliseconds: Int64) { run(until: now.adding(milliseconds: milliseconds)) }

    private mutating func deliver(_ flight: InFlight) {
        for index in nodes.indices {
            switch flight.packet.destination {
            case .multicast: break
            case .unicast(let address, _): if address != nodes[index].address { continue }
            }
            let source = MDNSSource(
                link: Self.link, address: nodes[flight.from].address, port: flight.sourcePort,
                isLocal: index == flight.from)
            nodes[index].received.append((now, flight.packet.bytes, flight.sourcePort))
            nodes[index].engine.receive(flight.packet.bytes, from: source, now: now)
            collect(index)
        }
    }

    /// Parsed packets a node sent (in order).
    func messages(sentBy index: Int) -> [(at: MDNSInstant, message: DNSMessage, packet: MDNSPacket)] {
        nodes[index].sent.compactMap { entry in
            (try? DNSMessage(parsing: entry.packet.bytes)).map { (entry.at, $0, entry.packet) }
        }
    }

    func events(of index: Int) -> [MDNSEvent] { nodes[index].events.map(\.event) }
}

extension DNSName {
    /// Test shorthand: `"_x._tcp.local".name`.
    static func make(_ text: String) -> DNSName { DNSName(text)! }
}
