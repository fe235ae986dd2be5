import Discovery
import ProtocolCore
import Transport

/// Back-off for automatic reconnection (and for waiting for the server): re-browse and re-resolve
/// (the server may come back on a new port), then connect; the delay doubles from `initialDelay` up
/// to `maxDelay`.
public struct ReconnectPolicy: Sendable {
    /// The delay before the first retry.
    public var initialDelay: Duration
    /// The longest delay between retries (the delay doubles up to it).
    public var maxDelay: Duration
    /// Give up after this many failed attempts in a row (nil: never).
    public var maxAttempts: Int?

    /// A policy retrying after 250 ms, then 500 ms, 1 s, … up to `maxDelay`, forever unless
    /// `maxAttempts` is set.
    public init(initialDelay: Duration = .milliseconds(250), maxDelay: Duration = .seconds(5), maxAttempts: Int? = nil) {
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.maxAttempts = maxAttempts
    }
}
