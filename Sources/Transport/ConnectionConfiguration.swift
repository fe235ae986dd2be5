import ProtocolCore
import Scheduling

/// Frame-level settings shared by every connection made with one configuration.

/// A configuration's values in one immutable object, replaced (not mutated) on change: copies of
/// the configuration share it, so thousands of connections made with one configuration hold one
/// pointer each instead of their own copy of every field.
///
/// `box` is a stored property of a non-resilient struct and `values` a `let` of a final class, so a
/// reader in another module (a channel reading its send codec for every message) reads
/// `storage.box.values.field` directly instead of copying every value.
package struct SharedValues<Values: Sendable>: Sendable {
    package final class Box: Sendable {
        package let values: Values
        init(_ values: Values) { self.values = values }
    }

    package private(set) var box: Box

    package init(_ values: Values) { box = Box(values) }

    package var values: Values { box.values }

    package mutating func update(_ body: (inout Values) -> Void) {
        var values = box.values
        body(&values)
        box = Box(values)
    }
}

/// Frame-level settings of a connection.
public struct ConnectionConfiguration: Sendable {
    // Shared immutable storage, replaced on change (see SharedValues).
    struct Values: Sendable {
        var maxFrameSize: Int = WireProtocol.defaultMaxFrameSize
        var sendHighWaterMark: Int = 1024 * 1024
        var sendLowWaterMark: Int = 256 * 1024
        var idleTimeout: Duration? = nil
        var closeLinger: Duration = .seconds(2)
        var readBufferSize: Int = 64 * 1024
        var metrics: TransportMetrics? = nil
        var scheduler: any Scheduler = DispatchScheduler()
        /// `scheduler` unless it is Dispatch's (the loop's fast path: its uptime clock and timer
        /// sources, no existential call).
        var virtualClock: (any Scheduler)? = nil
    }

    private var storage: SharedValues<Values>

    /// The largest accepted frame body in bytes (default 16 MiB). Larger length prefixes close the
    /// connection with `CloseReason.frameTooLarge(size:limit:)` before anything is allocated.
    public var maxFrameSize: Int {
        get { storage.box.values.maxFrameSize }
        set { storage.update { $0.maxFrameSize = newValue } }
    }

    /// Senders suspend while more than this many bytes are queued for the socket (default 1 MiB).
    public var sendHighWaterMark: Int {
        get { storage.box.values.sendHighWaterMark }
        set { storage.update { $0.sendHighWaterMark = newValue } }
    }

    /// Suspended senders resume once the queue drains to this many bytes (default 256 KiB).
    public var sendLowWaterMark: Int {
        get { storage.box.values.sendLowWaterMark }
        set { storage.update { $0.sendLowWaterMark = newValue } }
    }

    /// Close with `CloseReason.idleTimeout` when no complete frame arrived for this long (nil: never).
    public var idleTimeout: Duration? {
        get { storage.box.values.idleTimeout }
        set { storage.update { $0.idleTimeout = newValue } }
    }

    /// How long a graceful close waits for the peer to close its side after ours was shut down.
    public var closeLinger: Duration {
        get { storage.box.values.closeLinger }
        set { storage.update { $0.closeLinger = newValue } }
    }

    /// The clock of every timer of the connection: its deadlines (handshake, requests,
    /// acknowledgements), the loop's sweep of its heartbeat, idle check and linger, when it last
    /// heard a frame, `closed(within:)`. Dispatch's by default; tests turn a `ManualScheduler`.
    package var scheduler: any Scheduler {
        get { storage.box.values.scheduler }
        set {
            storage.update {
                $0.scheduler = newValue
                $0.virtualClock = newValue is DispatchScheduler ? nil : newValue
            }
        }
    }

    /// The scheduler when it is not Dispatch's (nil: Dispatch's uptime clock and timer sources).
    package var virtualClock: (any Scheduler)? { storage.box.values.virtualClock }

    /// Size of the reusable read buffer (default 64 KiB).
    public var readBufferSize: Int {
        get { storage.box.values.readBufferSize }
        set { storage.update { $0.readBufferSize = newValue } }
    }

    /// Where the connections' traffic is counted (nil: nowhere). Set by the messaging layer.
    package var metrics: TransportMetrics? {
        get { storage.box.values.metrics }
        set { storage.update { $0.metrics = newValue } }
    }

    /// Creates the default configuration.
    public init() { storage = SharedValues(Values()) }
}
