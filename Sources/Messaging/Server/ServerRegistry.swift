/// A ``MessageServer``'s connections without I/O: the places held by connections in their
/// handshake, the open connections by id, the message sessions by session id (with the key that
/// opened each), and which connections' ends are still to be reported. Each input says what the
/// server does: refuse, register a new connection, resume a session's connection, report an end
/// or not. Beside ``ServerLifecycle`` under the server's lock; generic over the connection and the
/// owner's key so that its tests need no sockets.
struct ServerRegistry<Connection: AnyObject, Owner: Equatable> {
    /// Open connections (their hello completed) by id.
    private(set) var connections: [UInt64: Connection] = [:]
    /// Accepted connections in their handshake or session exchange: they count against the limit.
    private(set) var pending = 0
    /// Connections whose end was not reported yet (``closed(_:)`` reports it once).
    private var unreported: Set<UInt64> = []
    /// Connections with a message session, by session id (kept through the grace period).
    private var sessions: [String: (connection: Connection, owner: Owner?)] = [:]
    private var lastID: UInt64 = 0

    /// Open connections.
    var count: Int { connections.count }

    /// The open connections, oldest first.
    var all: [Connection] { connections.sorted { $0.key < $1.key }.map(\.value) }

    /// Whether a connection accepted now fits under `limit` (open ones and those in their handshake).
    func hasRoom(under limit: Int) -> Bool { connections.count + pending < limit }

    /// A connection accepted (with room: ``hasRoom(under:)``) starts its handshake: it holds a place
    /// until ``register(session:owner:make:)`` or ``released()``.
    mutating func reserve() { pending += 1 }

    /// A connection holding a place failed its handshake or session exchange, or was dropped
    /// before it started (the server stopping).
    mutating func released() { pending -= 1 }

    enum Registration {
        /// It resumes a session another key opened.
        case refused(String)
        /// A new connection (made by `make` with its id), and its session if it named one.
        case new(Connection)
        /// The connection of the session it resumes: the server moves it onto the new channel.
        case resumed(Connection)
    }

    /// A connection holding a place completed its handshake (and session exchange, naming
    /// `session`, opened by `owner`'s key).
    mutating func register(session: String?, owner: Owner?, make: (UInt64) -> Connection) -> Registration {
        pending -= 1
        if let session, let existing = sessions[session] {
            guard existing.owner == owner else {
                return .refused("session \(session.prefix(8))… belongs to another identity key")
            }
            return .resumed(existing.connection)
        }
        let id = makeID()
        let connection = make(id)
        connections[id] = connection
        // From here its end is reported once (by its channel's close, or by a stop() that lists it
        // meanwhile), though `.accepted` comes after the session is attached.
        unreported.insert(id)
        if let session { sessions[session] = (connection, owner) }
        return .new(connection)
    }

    /// A new connection id (for a connection registered here, or one made only for a report).
    mutating func makeID() -> UInt64 {
        lastID += 1
        return lastID
    }

    /// Whether the server may report connection `id` opened (accepted or resumed): not when a
    /// stop() reported its end meanwhile. The report is made in the same critical section.
    func mayReportOpened(_ id: UInt64) -> Bool { unreported.contains(id) }

    /// Connection `id` failed before it was reported accepted: its end is not reported either.
    mutating func neverOpened(_ id: UInt64) { unreported.remove(id) }

    /// The session `id` of `connection` ended: a client naming it again starts a new one.
    mutating func sessionEnded(_ id: String, of connection: Connection) {
        if sessions[id]?.connection === connection { sessions.removeValue(forKey: id) }
    }

    /// Connection `id` ended: whether this is the first report of it (only that one is reported).
    mutating func closed(_ id: UInt64) -> Bool {
        connections.removeValue(forKey: id)
        return unreported.remove(id) != nil
    }
}
