/// An error the peer sent back in answer to a request: ``code`` is machine-readable (the app's own
/// vocabulary, e.g. `"not_found"`), ``message`` is for humans.
///
/// `request(...)` throws it when the reply is an error reply; a handler sends one with
/// ``MessageChannel/reply(to:error:)`` (or ``ServerConnection/reply(to:error:)``). On the wire it is
/// a reply MESSAGE with flag bit 2 (0x04) and the JSON payload `{"code":…, "message":…}`.
public struct RemoteError: Error, Sendable, Hashable, Codable, CustomStringConvertible {
    /// The error's code, chosen by the app (for example `"not_found"`, `"forbidden"`).
    public var code: String
    /// What happened, for humans.
    public var message: String

    /// An error to send back with ``MessageChannel/reply(to:error:)``.
    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "the peer answered with an error (\(code)): \(message)" }

    /// The code of the error reply a side sends instead of a reply larger than the requester's
    /// `max_frame` (docs/PROTOCOL.md, "Requests"): `too_large`.
    public static let tooLarge = "too_large"
}
