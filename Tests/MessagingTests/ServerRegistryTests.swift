import Testing

@testable import Messaging

/// ``ServerRegistry`` alone: a class for the connections and strings for the owners' keys (no
/// sockets, no server). The limit counts handshakes in progress, a session resumes only for the
/// key that opened it, and every connection's end is reported once — never for one that was not
/// reported open.
@Suite struct ServerRegistryTests {
    final class Connection {
        let id: UInt64
        init(_ id: UInt64) { self.id = id }
    }
    typealias Registry = ServerRegistry<Connection, String>

    /// Reserves a place and registers a connection; returns it (nil when not new).
    func connect(_ registry: inout Registry, session: String? = nil, owner: String? = nil) -> Registry.Registration {
        registry.reserve()
        return registry.register(session: session, owner: owner, make: Connection.init)
    }

    func new(_ registration: Registry.Registration) -> Connection? {
        if case .new(let connection) = registration { connection } else { nil }
    }

    @Test func handshakesInProgressCountAgainstTheLimit() {
        var registry = Registry()
        #expect(registry.hasRoom(under: 2))
        registry.reserve()
        registry.reserve()
        #expect(!registry.hasRoom(under: 2))  // two in their handshake: full
        registry.released()  // one failed
        #expect(registry.hasRoom(under: 2))
        let first = new(registry.register(session: nil, owner: nil, make: Connection.init))
        #expect(first?.id == 1 && registry.count == 1 && registry.pending == 0)
        #expect(registry.hasRoom(under: 2))
        _ = connect(&registry)
        #expect(!registry.hasRoom(under: 2))
        _ = registry.closed(1)
        #expect(registry.hasRoom(under: 2))
    }

    @Test func idsIncreaseAndTheListIsOldestFirst() {
        var registry = Registry()
        for _ in 0..<3 { _ = connect(&registry) }
        _ = registry.closed(2)
        _ = connect(&registry)
        #expect(registry.all.map(\.id) == [1, 3, 4])
    }

    @Test func aSessionResumesOnlyForTheKeyThatOpenedIt() throws {
        var registry = Registry()
        let opened = try #require(new(connect(&registry, session: "s1", owner: "key-a")))
        guard case .resumed(let resumed) = connect(&registry, session: "s1", owner: "key-a") else {
            Issue.record("the same key did not resume its session")
            return
        }
        #expect(resumed === opened)
        #expect(registry.count == 1 && registry.pending == 0)  // the same connection, not a second
        guard case .refused(let reason) = connect(&registry, session: "s1", owner: "key-b") else {
            Issue.record("another key resumed the session")
            return
        }
        #expect(reason.contains("belongs to another identity key"))
        // A plaintext client (no key) cannot take over a key's session either.
        guard case .refused = connect(&registry, session: "s1", owner: nil) else {
            Issue.record("a client without a key resumed the session")
            return
        }
    }

    @Test func anEndedSessionIsNewAgainButOnlyItsOwnConnectionEndsIt() throws {
        var registry = Registry()
        let first = try #require(new(connect(&registry, session: "s1", owner: "key-a")))
        registry.sessionEnded("s1", of: Connection(99))  // another connection's word: ignored
        guard case .resumed = connect(&registry, session: "s1", owner: "key-a") else {
            Issue.record("the session was forgotten")
            return
        }
        registry.sessionEnded("s1", of: first)
        let second = try #require(new(connect(&registry, session: "s1", owner: "key-b")))
        #expect(second !== first)
    }

    @Test func anEndIsReportedOnceAndNeverForAConnectionNotReportedOpen() throws {
        var registry = Registry()
        let connection = try #require(new(connect(&registry)))
        #expect(registry.mayReportOpened(connection.id))
        let first = registry.closed(connection.id)
        let again = registry.closed(connection.id)  // the channel's close after stop() reported it
        #expect(first && !again)
        #expect(!registry.mayReportOpened(connection.id))  // a stop() came first: no `.accepted`
        // Failed while its session was attached: neither accepted nor closed is reported.
        let failed = try #require(new(connect(&registry, session: "s2", owner: nil)))
        registry.neverOpened(failed.id)
        #expect(!registry.mayReportOpened(failed.id))
        let reported = registry.closed(failed.id)
        #expect(!reported && registry.count == 0)
    }
}
