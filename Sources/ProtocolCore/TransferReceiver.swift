import FastJSON

/// The streams a channel is receiving (STREAM_START, STREAM_CHUNK, STREAM_END), without I/O: checks
/// each frame against the protocol and says what to deliver. `Sink` is the channel's handle on the
/// app-side buffer of one transfer.
package struct TransferReceiver<Sink> {
    /// A stream announced by STREAM_START.
    package struct Stream {
        package let streamID: UInt64
        package let typeID: String
        package let totalSize: UInt64
        package let sink: Sink
        package fileprivate(set) var received: UInt64 = 0
    }

    /// What a STREAM_CHUNK means.
    package enum Chunk {
        /// Deliver these bytes to the stream's sink.
        case deliver(Stream, [UInt8])
        /// The peer violated the protocol (close the connection with this text).
        case violation(String)
    }

    /// What a STREAM_END means.
    package enum End {
        /// The stream is complete: every announced byte arrived.
        case completed(Stream)
        /// The sender aborted it with this reason, or it ended short (the text says how).
        case failed(Stream, String)
        /// The peer violated the protocol.
        case violation(String)
    }

    private var streams: [UInt64: Stream] = [:]

    package init() {}

    /// Streams in progress.
    package var count: Int { streams.count }

    /// Whether stream `id` is open (a STREAM_START with its id would reuse it).
    package func isOpen(_ id: UInt64) -> Bool { streams[id] != nil }

    /// Parses a STREAM_START's JSON header `{"size":…, "metadata":{…}}`.
    package static func header(of frame: Frame) -> Result<TransferHeader, ProtocolViolation> {
        do {
            return .success(try FastJSONDecoder().decode(TransferHeader.self, from: frame.payload))
        } catch {
            return .failure(ProtocolViolation("STREAM_START #\(frame.sequence) has a malformed header: \(error)"))
        }
    }

    /// Starts a stream (after ``header(of:)`` succeeded). A stream id already in use is a violation.
    package mutating func start(_ frame: Frame, header: TransferHeader, sink: Sink) -> ProtocolViolation? {
        guard streams[frame.sequence] == nil else {
            return ProtocolViolation("STREAM_START #\(frame.sequence) reuses an open stream id")
        }
        streams[frame.sequence] = Stream(
            streamID: frame.sequence, typeID: frame.typeID, totalSize: header.size, sink: sink)
        return nil
    }

    /// A STREAM_CHUNK arrived.
    package mutating func chunk(_ frame: Frame) -> Chunk {
        guard let id = frame.reference, var stream = streams[id] else {
            return .violation("STREAM_CHUNK for unknown stream \(frame.reference.map(String.init) ?? "nil")")
        }
        let received = stream.received + UInt64(frame.payload.count)
        guard received <= stream.totalSize else {
            return .violation("stream \(id) sent \(received) bytes, more than the announced \(stream.totalSize)")
        }
        stream.received = received
        streams[id] = stream
        return .deliver(stream, frame.payload)
    }

    /// A STREAM_END arrived.
    package mutating func end(_ frame: Frame) -> End {
        guard let id = frame.reference, let stream = streams.removeValue(forKey: id) else {
            return .violation("STREAM_END for unknown stream \(frame.reference.map(String.init) ?? "nil")")
        }
        if !frame.payload.isEmpty {
            return .failed(stream, "the sender aborted the transfer: \(String(decoding: frame.payload, as: UTF8.self))")
        }
        if stream.received != stream.totalSize {
            return .failed(
                stream, "the transfer ended after \(stream.received) of \(stream.totalSize) announced bytes")
        }
        return .completed(stream)
    }

    /// Every stream in progress (the connection closed).
    package mutating func removeAll() -> [Stream] {
        defer { streams = [:] }
        return streams.values.sorted { $0.streamID < $1.streamID }
    }
}

/// A protocol violation by the peer: the connection is closed with this text.
package struct ProtocolViolation: Error, Sendable, Equatable {
    package let text: String
    package init(_ text: String) { self.text = text }
}
