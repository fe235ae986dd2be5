/// The kind of a wire frame (byte 0 of the frame body). See `docs/PROTOCOL.md`.
package enum FrameKind: UInt8, Sendable, Hashable, CaseIterable {
    /// First frame from the connecting side: protocol version, peer name, metadata (JSON payload).
    case hello = 0x01
    /// The accepting side's answer to a compatible HELLO (same JSON shape).
    case helloAck = 0x02
    /// The accepting side refuses the HELLO (JSON `{"code":…, "message":…}`); it closes afterwards.
    case refuse = 0x03
    /// Client's proof of the pre-shared key (JSON `{"proof": hex}`), only when the server asked for it.
    case auth = 0x04
    /// The server accepted the client's proof; the hello exchange is complete.
    case authOK = 0x05
    /// An application message: type id, codec id, payload, optional reply-to.
    case message = 0x10
    /// Liveness probe; the receiver answers with PONG.
    case ping = 0x11
    /// Answer to PING; its reference is the PING's sequence number.
    case pong = 0x12
    /// Orderly close; payload is a UTF-8 reason. The sender sends nothing after it.
    case goodbye = 0x13
    /// Opens or resumes a message session (JSON `{"id":…,"received":…[,"resumed":…]}`), see "Sessions".
    case session = 0x14
    /// Acknowledges session messages: payload = 8-byte count received so far in the session.
    case ack = 0x15
    /// Starts a streamed transfer: type id, JSON `{"size":…, "metadata":{…}}`. Its sequence is the stream id.
    case streamStart = 0x20
    /// A chunk of a streamed transfer; reference = stream id; payload = the bytes.
    case streamChunk = 0x21
    /// Ends a streamed transfer; reference = stream id; empty payload = success, else a UTF-8 abort reason.
    case streamEnd = 0x22
}

/// One decoded wire frame (the envelope after the 4-byte length prefix).
package struct Frame: Sendable, Hashable {
    /// Flag bit 0: the 8-byte reference (reply-to / stream id) field is present.
    package static let flagHasReference: UInt8 = 0x01
    /// Flag bit 1: a MESSAGE the sender awaits a reply to (a request).
    package static let flagExpectsReply: UInt8 = 0x02
    /// Flag bit 2: a reply MESSAGE that reports an error (JSON `{"code":…, "message":…}`).
    package static let flagError: UInt8 = 0x04
    /// Bytes of the fixed header after the length prefix, without the type id and reference.
    package static let fixedHeaderSize = 4 + 8

    /// The frame kind.
    package var kind: FrameKind
    /// The codec of the payload: 0 raw bytes, 1 JSON; other values are app-defined.
    package var codecID: UInt8
    /// The app-chosen stable type id, UTF-8, at most 255 bytes (for example `"chat.message"`).
    package var typeID: String
    /// The per-direction sequence number: 1 for the first frame a side sends, +1 for every following frame.
    package var sequence: UInt64
    /// The reply-to sequence number (MESSAGE), the stream id (STREAM_CHUNK/END) or the ping's sequence (PONG).
    package var reference: UInt64?
    /// The payload bytes.
    package var payload: [UInt8]
    /// A request: the sender awaits a reply (flag bit 1).
    package var expectsReply = false
    /// An error reply (flag bit 2).
    package var isError = false

    /// Creates a frame.
    package init(
        kind: FrameKind, codecID: UInt8 = 0, typeID: String = "", sequence: UInt64 = 0, reference: UInt64? = nil,
        payload: [UInt8] = []
    ) {
        self.kind = kind
        self.codecID = codecID
        self.typeID = typeID
        self.sequence = sequence
        self.reference = reference
        self.payload = payload
    }

    /// The flags byte: reference present, expects a reply, error.
    package var flags: UInt8 {
        (reference == nil ? 0 : Frame.flagHasReference) | (expectsReply ? Frame.flagExpectsReply : 0)
            | (isError ? Frame.flagError : 0)
    }

    /// The number of bytes after the length prefix.
    package var bodySize: Int {
        Frame.fixedHeaderSize + typeID.utf8.count + (reference == nil ? 0 : 8) + payload.count
    }

    /// The complete encoding, length prefix included.
    ///
    /// - Throws: ``TransportError/Code/invalidArgument`` when the type id is longer than 255 UTF-8 bytes.
    package func encoded() throws(TransportError) -> [UInt8] {
        let size = try Frame.validatedSize(self)
        var out = [UInt8](repeating: 0, count: size)
        out.withUnsafeMutableBytes { write(into: $0) }
        return out
    }

    package static func validatedSize(_ frame: Frame) throws(TransportError) -> Int {
        guard frame.typeID.utf8.count <= 255 else {
            throw TransportError(
                .invalidArgument, "type id '\(frame.typeID)' is longer than 255 UTF-8 bytes; use a shorter id")
        }
        return 4 + frame.bodySize
    }

    /// Writes the encoding (length prefix included) into `out`, which must hold exactly `4 + bodySize` bytes
    /// (without `includePayload`: everything but the payload, `4 + bodySize - payload.count` bytes).
    package func write(into out: UnsafeMutableRawBufferPointer, includePayload: Bool = true) {
        var i = 0
        func put<I: FixedWidthInteger>(_ value: I) {
            withUnsafeBytes(of: value.bigEndian) { bytes in
                for b in bytes {
                    out[i] = b
                    i += 1
                }
            }
        }
        put(UInt32(bodySize))
        put(kind.rawValue)
        put(codecID)
        put(flags)
        put(UInt8(typeID.utf8.count))
        for b in typeID.utf8 {
            out[i] = b
            i += 1
        }
        put(sequence)
        if let reference { put(reference) }
        if includePayload && !payload.isEmpty {
            payload.withUnsafeBytes { src in
                UnsafeMutableRawBufferPointer(rebasing: out[i..<(i + src.count)]).copyMemory(from: src)
            }
        }
    }
}

