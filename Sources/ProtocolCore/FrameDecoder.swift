/// A pure, incremental frame decoder: feed it bytes as they arrive, take complete frames out.
///
/// It does no I/O. Bytes are kept in one compacting buffer (no quadratic copying), the length prefix
/// is checked against ``maxFrameSize`` before anything is allocated for the frame, and, unless disabled,
/// sequence numbers must count 1, 2, 3, … .
package struct FrameDecoder: Sendable {
    // Field order matters for memory (every connection holds a decoder): 40 bytes, not 48.
    private var buffer: [UInt8] = []
    private var readIndex = 0
    /// A large frame whose header is parsed and whose payload is being filled in place: zero or
    /// one element (an array keeps an idle decoder small, and value semantics).
    private var partials: [PartialFrame] = []
    private var expectedSequence: UInt64?
    private let storedMaxFrameSize: UInt32

    /// The largest accepted frame body (bytes after the length prefix; a frame's length field has
    /// 32 bits, so larger limits are 4 GiB).
    package var maxFrameSize: Int { Int(storedMaxFrameSize) }

    /// Payloads at least this large are received into their own array (see ``fillPayload(_:)``)
    /// instead of through the reassembly buffer, which saves two copies of every byte.
    package static let inPlacePayloadThreshold = 64 * 1024

    private struct PartialFrame: Sendable {
        var header: Frame  // everything but the payload
        var payload: [UInt8]
        var filled: Int
    }

    /// Creates a decoder.
    /// - Parameters:
    ///   - maxFrameSize: The largest accepted frame body; larger length prefixes throw before allocation.
    ///   - checkSequence: When true, frames must carry sequence numbers 1, 2, 3, … in order.
    package init(maxFrameSize: Int = WireProtocol.defaultMaxFrameSize, checkSequence: Bool = true) {
        storedMaxFrameSize = UInt32(clamping: maxFrameSize)
        self.expectedSequence = checkSequence ? 1 : nil
    }

    /// The number of received bytes not yet consumed by ``next()``.
    package var bufferedByteCount: Int {
        buffer.count - readIndex + (partials.first.map { 4 + $0.header.bodySize + $0.filled } ?? 0)
    }

    /// While a large frame's payload is being received: how many of its bytes are still missing.
    /// Read them straight into the payload with ``fillPayload(_:)``; plain ``append(_:)`` works too.
    package var missingPayloadBytes: Int {
        guard let partial = partials.first else { return 0 }
        return partial.payload.count - partial.filled
    }

    /// Lets `read` write into the missing part of a large frame's payload; `read` returns the number
    /// of bytes it wrote (0 for none). Call ``next()`` afterwards. Does nothing without such a frame.
    package mutating func fillPayload(_ read: (UnsafeMutableRawBufferPointer) -> Int) {
        guard !partials.isEmpty else { return }
        let filled = partials[0].filled
        let count = partials[0].payload.withUnsafeMutableBytes { raw in
            read(UnsafeMutableRawBufferPointer(rebasing: raw[filled...]))
        }
        partials[0].filled += min(max(0, count), partials[0].payload.count - filled)
    }

    /// Appends received bytes.
    package mutating func append(_ bytes: UnsafeRawBufferPointer) {
        compactIfUseful()
        buffer.append(contentsOf: bytes)
    }

    /// Appends received bytes.
    package mutating func append(contentsOf bytes: some Collection<UInt8>) {
        compactIfUseful()
        buffer.append(contentsOf: bytes)
    }

    /// Lets `write` put the next `count` received bytes straight into the decoder: the first region
    /// is the missing part of a large frame's payload (empty when none is being received), the
    /// second the end of the reassembly buffer; their lengths add up to `count`. The bytes count as
    /// received only when `write` returns (a throw leaves the decoder as it was). Version 2 opens
    /// transport messages with this: the plaintext is decrypted into place, not copied.
    package mutating func receive<E: Error>(
        count: Int, _ write: (UnsafeMutableRawBufferPointer, UnsafeMutableRawBufferPointer) throws(E) -> Void
    ) throws(E) {
        let direct = partials.isEmpty ? 0 : min(count, partials[0].payload.count - partials[0].filled)
        let rest = count - direct
        if rest > 0 { compactIfUseful() }
        if direct > 0 {
            let filled = partials[0].filled
            try partials[0].payload.withUnsafeMutableBytesTyped { (payload) throws(E) in
                try buffer.append(count: rest) { (tail) throws(E) in
                    try write(UnsafeMutableRawBufferPointer(rebasing: payload[filled..<(filled + direct)]), tail)
                }
            }
            partials[0].filled += direct
        } else {
            try buffer.append(count: rest) { (tail) throws(E) in try write(UnsafeMutableRawBufferPointer(start: nil, count: 0), tail) }
            if partials.isEmpty { beginLargeFrameIfPossible() }
        }
    }

    /// When the buffer holds the header of a large frame that is not complete, starts receiving its
    /// payload in place (what ``next()`` does), so that the next ``receive(count:_:)`` writes into it.
    private mutating func beginLargeFrameIfPossible() {
        let available = buffer.count - readIndex
        guard available >= 8 else { return }
        let length = buffer.withUnsafeBytes { raw -> UInt32 in
            UInt32(bigEndian: raw.loadUnaligned(fromByteOffset: readIndex, as: UInt32.self))
        }
        // Anything wrong with the length is next()'s to report.
        guard UInt64(length) <= UInt64(maxFrameSize), Int(length) >= Frame.fixedHeaderSize, available < 4 + Int(length) else { return }
        try? startPartialIfLarge(bodySize: Int(length), available: available)
    }

    /// Frees the reassembly buffer when it holds no bytes (an idle connection keeps no storage).
    package mutating func releaseStorageIfEmpty() {
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
    package mutating func next() throws(TransportError) -> Frame? {
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

    package static func violation(_ text: String) -> TransportError {
        TransportError(.protocolViolation, "peer violated the protocol: \(text)", closeReason: .protocolError(text))
    }

    /// Parses one frame body (the bytes after the length prefix).
    package static func parse(_ body: UnsafeRawBufferPointer) throws(TransportError) -> Frame {
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
        guard let typeID = typeID(UnsafeRawBufferPointer(rebasing: body[4..<(4 + typeLength)])) else {
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
        var frame = Frame(
            kind: kind, codecID: codec, typeID: typeID, sequence: sequence, reference: reference,
            payload: Array(body[offset...]))
        frame.expectsReply = flags & Frame.flagExpectsReply != 0
        frame.isError = flags & Frame.flagError != 0
        return frame
    }

    /// A frame's type id, or nil when it is not UTF-8. ASCII (nearly every type id) is checked
    /// byte by byte and decoded without the standard library's generic validator, which looks up
    /// type metadata on every call (about 2 % of a small message's receive path in W4).
    package static func typeID(_ bytes: UnsafeRawBufferPointer) -> String? {
        bytes.allSatisfy({ $0 < 0x80 }) ? String(decoding: bytes, as: UTF8.self) : String(validating: bytes, as: UTF8.self)
    }
}
