/// The kind of a wire frame (byte 0 of the frame body). See `docs/PROTOCOL.md`.
public enum FrameKind: UInt8, Sendable, Hashable, CaseIterable {
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
    /// Starts a streamed transfer: type id, JSON `{"size":…, "metadata":{…}}`. Its sequence is the stream id.
    case streamStart = 0x20
    /// A chunk of a streamed transfer; reference = stream id; payload = the bytes.
    case streamChunk = 0x21
    /// Ends a streamed transfer; reference = stream id; empty payload = success, else a UTF-8 abort reason.
    case streamEnd = 0x22
}

/// One decoded wire frame (the envelope after the 4-byte length prefix).
public struct Frame: Sendable, Hashable {
    /// Flag bit 0: the 8-byte reference (reply-to / stream id) field is present.
    static let flagHasReference: UInt8 = 0x01
    /// Bytes of the fixed header after the length prefix, without the type id and reference.
    static let fixedHeaderSize = 4 + 8

    /// The frame kind.
    public var kind: FrameKind
    /// The codec of the payload: 0 raw bytes, 1 JSON; other values are app-defined.
    public var codecID: UInt8
    /// The app-chosen stable type id, UTF-8, at most 255 bytes (for example `"chat.message"`).
    public var typeID: String
    /// The per-direction sequence number: 1 for the first frame a side sends, +1 for every following frame.
    public var sequence: UInt64
    /// The reply-to sequence number (MESSAGE), the stream id (STREAM_CHUNK/END) or the ping's sequence (PONG).
    public var reference: UInt64?
    /// The payload bytes.
    public var payload: [UInt8]

    /// Creates a frame.
    public init(
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

    /// The number of bytes after the length prefix.
    var bodySize: Int {
        Frame.fixedHeaderSize + typeID.utf8.count + (reference == nil ? 0 : 8) + payload.count
    }

    /// The complete encoding, length prefix included.
    ///
    /// - Throws: ``TransportError/Code/invalidArgument`` when the type id is longer than 255 UTF-8 bytes.
    public func encoded() throws(TransportError) -> [UInt8] {
        let size = try Frame.validatedSize(self)
        var out = [UInt8](repeating: 0, count: size)
        out.withUnsafeMutableBytes { write(into: $0) }
        return out
    }

    static func validatedSize(_ frame: Frame) throws(TransportError) -> Int {
        guard frame.typeID.utf8.count <= 255 else {
            throw TransportError(
                .invalidArgument, "type id '\(frame.typeID)' is longer than 255 UTF-8 bytes; use a shorter id")
        }
        return 4 + frame.bodySize
    }

    /// Writes the encoding (length prefix included) into `out`, which must hold exactly `4 + bodySize` bytes
    /// (without `includePayload`: everything but the payload, `4 + bodySize - payload.count` bytes).
    func write(into out: UnsafeMutableRawBufferPointer, includePayload: Bool = true) {
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
        put(reference == nil ? UInt8(0) : Frame.flagHasReference)
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

/// A pure, incremental frame decoder: feed it bytes as they arrive, take complete frames out.
///
/// It does no I/O. Bytes are kept in one compacting buffer (no quadratic copying), the length prefix
/// is checked against ``maxFrameSize`` before anything is allocated for the frame, and, unless disabled,
/// sequence numbers must count 1, 2, 3, … .
public struct FrameDecoder: Sendable {
    /// The largest accepted frame body (bytes after the length prefix).
    public let maxFrameSize: Int
    private var buffer: [UInt8] = []
    private var readIndex = 0
    private var expectedSequence: UInt64?
    /// A large frame whose header is parsed and whose payload is being filled in place: zero or
    /// one element (an array keeps an idle decoder small, and value semantics).
    private var partials: [PartialFrame] = []

    /// Payloads at least this large are received into their own array (see ``fillPayload(_:)``)
    /// instead of through the reassembly buffer, which saves two copies of every byte.
    static let inPlacePayloadThreshold = 64 * 1024

    private struct PartialFrame: Sendable {
        var header: Frame  // everything but the payload
        var payload: [UInt8]
        var filled: Int
    }

    /// Creates a decoder.
    /// - Parameters:
    ///   - maxFrameSize: The largest accepted frame body; larger length prefixes throw before allocation.
    ///   - checkSequence: When true, frames must carry sequence numbers 1, 2, 3, … in order.
    public init(maxFrameSize: Int = 16 * 1024 * 1024, checkSequence: Bool = true) {
        self.maxFrameSize = maxFrameSize
        self.expectedSequence = checkSequence ? 1 : nil
    }

    /// The number of received bytes not yet consumed by ``next()``.
    public var bufferedByteCount: Int {
        buffer.count - readIndex + (partials.first.map { 4 + $0.header.bodySize + $0.filled } ?? 0)
    }

    /// While a large frame's payload is being received: how many of its bytes are still missing.
    /// Read them straight into the payload with ``fillPayload(_:)``; plain ``append(_:)`` works too.
    public var missingPayloadBytes: Int {
        guard let partial = partials.first else { return 0 }
        return partial.payload.count - partial.filled
    }

    /// Lets `read` write into the missing part of a large frame's payload; `read` returns the number
    /// of bytes it wrote (0 for none). Call ``next()`` afterwards. Does nothing without such a frame.
    public mutating func fillPayload(_ read: (UnsafeMutableRawBufferPointer) -> Int) {
        guard !partials.isEmpty else { return }
        let filled = partials[0].filled
        let count = partials[0].payload.withUnsafeMutableBytes { raw in
            read(UnsafeMutableRawBufferPointer(rebasing: raw[filled...]))
        }
        partials[0].filled += min(max(0, count), partials[0].payload.count - filled)
    }

    /// Appends received bytes.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        compactIfUseful()
        buffer.append(contentsOf: bytes)
    }

    /// Appends received bytes.
    public mutating func append(contentsOf bytes: some Collection<UInt8>) {
        compactIfUseful()
        buffer.append(contentsOf: bytes)
    }

    /// Frees the reassembly buffer when it holds no bytes (an idle connection keeps no storage).
    mutating func releaseStorageIfEmpty() {
        if readIndex == buffer.count && buffer.capacity > 0 {
            buffer = []
            readIndex = 0
        }
    }

    private mutating func compactIfUseful() {
        if readIndex == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            readIndex = 0
        } else if readIndex >= 4096 && readIndex * 2 >= buffer.count {
            buffer.removeSubrange(0..<readIndex)
            readIndex = 0
        }
    }

    /// Returns the next complete frame, or nil when more bytes are needed.
    ///
    /// - Throws: ``TransportError`` with code ``TransportError/Code/frameTooLarge`` or
    ///   ``TransportError/Code/protocolViolation`` and a matching ``TransportError/closeReason``.
    ///   After an error the decoder is unusable; close the connection.
    public mutating func next() throws(TransportError) -> Frame? {
        if !partials.isEmpty { return try completePartial() }
        let available = buffer.count - readIndex
        guard available >= 4 else { return nil }
        let length = buffer.withUnsafeBytes { raw -> UInt32 in
            UInt32(bigEndian: raw.loadUnaligned(fromByteOffset: readIndex, as: UInt32.self))
        }
        if UInt64(length) > UInt64(maxFrameSize) {
            throw TransportError(
                .frameTooLarge,
                "peer announced a frame of \(length) bytes; the limit is \(maxFrameSize) bytes",
                closeReason: .frameTooLarge(size: UInt64(length), limit: maxFrameSize))
        }
        let bodySize = Int(length)
        if bodySize < Frame.fixedHeaderSize {
            throw FrameDecoder.violation("frame body of \(bodySize) bytes is shorter than the 12-byte minimum")
        }
        guard available >= 4 + bodySize else {
            try startPartialIfLarge(bodySize: bodySize, available: available)
            return partials.isEmpty ? nil : try completePartial()
        }
        let start = readIndex + 4
        let end = start + bodySize
        let parsed = buffer.withUnsafeBytes { raw in
            Result { () throws(TransportError) -> Frame in
                try FrameDecoder.parse(UnsafeRawBufferPointer(rebasing: raw[start..<end]))
            }
        }
        let frame = try parsed.get()
        readIndex = end
        try checkSequence(frame)
        return frame
    }

    private mutating func checkSequence(_ frame: Frame) throws(TransportError) {
        if let expected = expectedSequence {
            guard frame.sequence == expected else {
                throw FrameDecoder.violation("sequence number \(frame.sequence) where \(expected) was expected")
            }
            expectedSequence = expected &+ 1
        }
    }

    /// With the header of an incomplete frame buffered and a payload of at least
    /// ``inPlacePayloadThreshold`` bytes: parses the header, allocates the payload (the length was
    /// already checked against ``maxFrameSize``) and moves the buffered part of the payload into it.
    private mutating func startPartialIfLarge(bodySize: Int, available: Int) throws(TransportError) {
        guard bodySize - Frame.fixedHeaderSize >= FrameDecoder.inPlacePayloadThreshold, available >= 8 else { return }
        let (flags, typeLength) = buffer.withUnsafeBytes { raw in (raw[readIndex + 6], Int(raw[readIndex + 7])) }
        let headerSize = Frame.fixedHeaderSize + typeLength + (flags & Frame.flagHasReference != 0 ? 8 : 0)
        let payloadSize = bodySize - headerSize
        guard payloadSize >= FrameDecoder.inPlacePayloadThreshold, available >= 4 + headerSize else { return }
        let start = readIndex + 4
        let header = try buffer.withUnsafeBytes { raw in
            Result { () throws(TransportError) -> Frame in
                try FrameDecoder.parse(UnsafeRawBufferPointer(rebasing: raw[start..<(start + headerSize)]))
            }
        }.get()
        let buffered = min(available - 4 - headerSize, payloadSize)
        let payloadStart = start + headerSize
        let payload = [UInt8](unsafeUninitializedCapacity: payloadSize) { out, count in
            buffer.withUnsafeBytes { raw in
                UnsafeMutableRawBufferPointer(out).copyMemory(
                    from: UnsafeRawBufferPointer(rebasing: raw[payloadStart..<(payloadStart + buffered)]))
            }
            // The rest is written by fillPayload/append before the frame is handed out.
            count = payloadSize
        }
        readIndex = payloadStart + buffered
        partials = [PartialFrame(header: header, payload: payload, filled: buffered)]
    }

    /// Moves buffered bytes into the partial frame's payload; returns the frame once it is complete.
    private mutating func completePartial() throws(TransportError) -> Frame? {
        let missing = missingPayloadBytes
        let take = min(missing, buffer.count - readIndex)
        if take > 0 {
            let from = readIndex
            let filled = partials[0].filled
            buffer.withUnsafeBytes { raw in
                partials[0].payload.withUnsafeMutableBytes { out in
                    UnsafeMutableRawBufferPointer(rebasing: out[filled..<(filled + take)])
                        .copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[from..<(from + take)]))
                }
            }
            partials[0].filled += take
            readIndex += take
        }
        guard missingPayloadBytes == 0, let done = partials.popLast() else { return nil }
        var frame = done.header
        frame.payload = done.payload
        try checkSequence(frame)
        return frame
    }

    static func violation(_ text: String) -> TransportError {
        TransportError(.protocolViolation, "peer violated the protocol: \(text)", closeReason: .protocolError(text))
    }

    /// Parses one frame body (the bytes after the length prefix).
    static func parse(_ body: UnsafeRawBufferPointer) throws(TransportError) -> Frame {
        guard let kind = FrameKind(rawValue: body[0]) else {
            throw violation("unknown frame kind 0x\(String(body[0], radix: 16))")
        }
        let codec = body[1]
        let flags = body[2]
        let typeLength = Int(body[3])
        let hasReference = flags & Frame.flagHasReference != 0
        let headerSize = Frame.fixedHeaderSize + typeLength + (hasReference ? 8 : 0)
        guard body.count >= headerSize else {
            throw violation("\(kind) frame of \(body.count) bytes is too short for its \(headerSize)-byte header")
        }
        guard let typeID = String(validating: body[4..<(4 + typeLength)], as: UTF8.self) else {
            throw violation("type id is not valid UTF-8")
        }
        var offset = 4 + typeLength
        let sequence = UInt64(bigEndian: body.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
        offset += 8
        var reference: UInt64?
        if hasReference {
            reference = UInt64(bigEndian: body.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            offset += 8
        }
        return Frame(
            kind: kind, codecID: codec, typeID: typeID, sequence: sequence, reference: reference,
            payload: Array(body[offset...]))
    }
}
