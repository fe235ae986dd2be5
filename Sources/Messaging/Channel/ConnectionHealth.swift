import Dispatch
import Locks
import Logging
import ProtocolCore
import Synchronization
import Transport

/// Connection health, from the heartbeat: round-trip time, when the peer was last heard from, and
/// how often the connection was replaced.
public struct ConnectionHealth: Sendable, CustomStringConvertible {
    /// The smoothed round-trip time of PING/PONG (RFC 6298), nil before the first PONG.
    public var smoothedRTT: Duration?
    /// The round-trip time's mean deviation.
    public var rttVariation: Duration?
    /// The last round-trip sample.
    public var lastRTT: Duration?
    /// How long ago the last frame from the peer arrived.
    public var sinceLastHeard: Duration
    /// PONGs received (RTT samples taken).
    public var samples: Int
    /// Times the connection was replaced by a new one (a reconnect).
    public var reconnects: Int = 0
    /// Of those, the ones that resumed the message session.
    public var resumes: Int = 0

    public var description: String {
        func ms(_ duration: Duration?) -> String {
            guard let duration else { return "–" }
            let (seconds, attoseconds) = duration.components
            let value = Double(seconds) * 1000 + Double(attoseconds) / 1e15
            return value < 10 ? String(format: "%.2f ms", value) : String(format: "%.0f ms", value)
        }
        return "rtt \(ms(smoothedRTT)) ±\(ms(rttVariation)), last heard \(ms(sinceLastHeard)) ago, "
            + "\(reconnects) reconnects (\(resumes) resumed)"
    }
}
