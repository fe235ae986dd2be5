import Dispatch
import Scheduling
import TestWaits
import Testing

@testable import Discovery
@testable import MDNSCore

#if canImport(Glibc)
    import Glibc
#endif

/// The unicast DNS client's retransmissions, failover and deadline on a manual clock (issue 54, 1),
/// with real UDP sockets on loopback as the servers: what each received is read from its socket,
/// and the clock says when it was sent.
@Suite struct DNSClientTests {
    /// A UDP "server" on 127.0.0.1 that answers only when told to.
    final class UDPPeer {
        let fd: Int32
        let port: UInt16

        init() {
            let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                    _ = bind(fd, pointer, length)
                    _ = getsockname(fd, pointer, &length)
                }
            }
            (self.fd, port) = (fd, UInt16(bigEndian: address.sin_port))
        }

        deinit { close(fd) }

        var server: DNSServerAddress { DNSServerAddress(.v4(127, 0, 0, 1), port: port) }

        /// The datagrams waiting, each with where it came from (nonblocking: what has arrived).
        func received() -> [(bytes: [UInt8], from: sockaddr_in)] {
            var all: [(bytes: [UInt8], from: sockaddr_in)] = []
            var buffer = [UInt8](repeating: 0, count: 2048)
            while true {
                var from = sockaddr_in()
                var length = socklen_t(MemoryLayout<sockaddr_in>.size)
                let count = withUnsafeMutablePointer(to: &from) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                        buffer.withUnsafeMutableBytes { recvfrom(fd, $0.baseAddress, $0.count, 0, pointer, &length) }
                    }
                }
                guard count > 0 else { return all }
                all.append((Array(buffer[0..<count]), from))
            }
        }

        func send(_ bytes: [UInt8], to address: sockaddr_in) {
            var address = address
            _ = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                    bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, 0, pointer, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                }
            }
        }
    }

    static let id: UInt16 = 0x4242

    /// A query for `lab.home.arpa. SOA`, ID `id`.
    static var query: [UInt8] {
        var message = DNSMessage(id: id, flags: 0x0100)
        message.questions = [DNSQuestion(name: DNSName("lab.home.arpa")!, type: DNSType.soa)]
        return message.encoded()
    }

    typealias Outcome = Result<DNSReply, DNSExchangeError>

    /// The query asked of `peers` by a client on a manual clock; returns once it went out to the
    /// first (the exchange's deadline and first retransmission armed).
    static func asking(_ peers: [UDPPeer], timeout: Duration = .seconds(5)) async throws -> (clock: ManualScheduler, exchange: Task<Outcome, Never>) {
        let clock = ManualScheduler()
        let client = DNSClient(scheduler: clock)
        let servers = peers.map(\.server)
        let exchange = Task { await client.exchange(query, id: id, servers: servers, timeout: timeout) }
        try #require(await clock.waitForPending(2), "the query was not sent: \(clock.pendingDeadlines)")
        return (clock, exchange)
    }

    @Test func aQueryNobodyAnswersIsSentAgainToTheNextServerAt700msThenDoublingAndEndsAtItsTimeout() async throws {
        let (first, second) = (UDPPeer(), UDPPeer())
        let (clock, exchange) = try await Self.asking([first, second], timeout: .seconds(5))
        // The query went to the first server.
        #expect(first.received().map(\.bytes) == [Self.query])
        #expect(second.received().isEmpty)
        clock.advance(by: .milliseconds(699))
        #expect(second.received().isEmpty, "retransmitted before 700 ms")
        clock.advance(by: .milliseconds(1))
        #expect(second.received().map(\.bytes) == [Self.query], "the retransmission goes to the next server")
        clock.advance(by: .milliseconds(1_400))  // 2.1 s
        #expect(first.received().count == 1, "the third try, back at the first server, 1.4 s later")
        #expect(second.received().isEmpty)
        clock.advance(by: .milliseconds(2_899))  // 4.999 s: the fourth try is due at 4.9 s
        #expect(second.received().count == 1)
        clock.advance(by: .milliseconds(1))  // 5 s: the deadline
        guard case .failure(let error) = try await value(of: exchange, "the exchange") else { Issue.record("an answer from nobody"); return }
        #expect(error.reason.hasPrefix("no answer within 5.0 seconds"), "\(error)")
        #expect(clock.pendingCount == 0, "a timer of the exchange was left: \(clock.pendingDeadlines)")
    }

    @Test func theFirstReplyWithTheQuerysIDEndsTheExchangeAndItsTimers() async throws {
        let server = UDPPeer()
        let (clock, exchange) = try await Self.asking([server])
        let asked = server.received()
        try #require(asked.count == 1)
        // A reply with another ID is ignored; the one with the query's ends the exchange.
        var wrong = DNSMessage(id: Self.id &+ 1, flags: 0x8180)
        wrong.questions = [DNSQuestion(name: DNSName("lab.home.arpa")!, type: DNSType.soa)]
        server.send(wrong.encoded(), to: asked[0].from)
        var reply = DNSMessage(id: Self.id, flags: 0x8180)
        reply.questions = [DNSQuestion(name: DNSName("lab.home.arpa")!, type: DNSType.soa)]
        server.send(reply.encoded(), to: asked[0].from)
        let answered = try await value(of: exchange, "the exchange").get()
        #expect(answered.message.id == Self.id && answered.server == server.server && !answered.overTCP)
        #expect(clock.pendingCount == 0, "the deadline or the retransmission was left: \(clock.pendingDeadlines)")
    }

    @Test func aCancelledExchangeEndsAtOnceAndLeavesNoTimer() async throws {
        let server = UDPPeer()
        let (clock, exchange) = try await Self.asking([server])
        exchange.cancel()
        guard case .failure(let error) = try await value(of: exchange, "the cancelled exchange") else { Issue.record("answered"); return }
        #expect(error.reason == "cancelled")
        #expect(clock.pendingCount == 0, "\(clock.pendingDeadlines)")
    }
}
