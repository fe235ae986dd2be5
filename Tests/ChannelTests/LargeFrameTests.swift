import Foundation
import TestWaits
import Testing

@testable import Messaging
import ProtocolCore
import Transport

/// Large payloads skip the reassembly buffer on receive (``FrameDecoder/fillPayload(_:)``) and are
/// written from the payload array on send (``WireBuffer``); the bytes must not change.
@Suite struct LargeFrameTests {
    /// Small and large frames (around the in-place threshold), numbered 1, 2, 3, ….
    static func mixedFrames() -> [Frame] {
        let threshold = FrameDecoder.inPlacePayloadThreshold
        let sizes = [0, 5, threshold - 1, threshold, 3, threshold + 1, 1 << 20, 7, 2 * threshold + 13]
        return sizes.enumerated().map { index, size in
            Frame(
                kind: index % 2 == 0 ? .message : .streamChunk, codecID: 0, typeID: index % 2 == 0 ? "bulk" : "",
                sequence: UInt64(index + 1), reference: index % 2 == 0 ? nil : 9,
                payload: (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ index) })
        }
    }

    @Test(arguments: [1, 7, 4096, 65_536, 300_000])
    func appendInChunks(chunk: Int) throws {
        let frames = Self.mixedFrames()
        let stream = try frames.flatMap { try $0.encoded() }
        var decoder = FrameDecoder()
        var decoded: [Frame] = []
        var offset = 0
        while offset < stream.count {
            let end = min(offset + chunk, stream.count)
            decoder.append(contentsOf: stream[offset..<end])
            offset = end
            while let frame = try decoder.next() { decoded.append(frame) }
        }
        #expect(decoded == frames)
        #expect(decoder.bufferedByteCount == 0)
        #expect(decoder.missingPayloadBytes == 0)
    }

    /// The way Connection reads: into the payload while one is missing, else through `append`.
    @Test(arguments: [1000, 65_536, 1 << 20])
    func fillPayloadLikeTheSocketReader(readSize: Int) throws {
        let frames = Self.mixedFrames()
        let stream = try frames.flatMap { try $0.encoded() }
        var decoder = FrameDecoder()
        var decoded: [Frame] = []
        var offset = 0
        var sawInPlace = false
        while offset < stream.count {
            if decoder.missingPayloadBytes > 0 {
                sawInPlace = true
                #expect(decoder.bufferedByteCount > 0)
                decoder.fillPayload { space in
                    let count = min(space.count, readSize, stream.count - offset)
                    stream.withUnsafeBytes { raw in
                        UnsafeMutableRawBufferPointer(rebasing: space[0..<count])
                            .copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[offset..<(offset + count)]))
                    }
                    offset += count
                    return count
                }
            } else {
                let end = min(offset + readSize, stream.count)
                decoder.append(contentsOf: stream[offset..<end])
                offset = end
            }
            while let frame = try decoder.next() { decoded.append(frame) }
        }
        #expect(sawInPlace)
        #expect(decoded == frames)
        #expect(decoder.bufferedByteCount == 0)
    }

    @Test func largeFrameWithTheWrongSequenceIsAViolation() throws {
        var decoder = FrameDecoder()
        let frame = Frame(kind: .message, sequence: 2, payload: [UInt8](repeating: 1, count: 1 << 17))
        let encoded = try frame.encoded()
        decoder.append(contentsOf: encoded[0..<1000])
        #expect(try decoder.next() == nil)
        #expect(decoder.missingPayloadBytes > 0)
        decoder.append(contentsOf: encoded[1000...])
        #expect(throws: TransportError.self) { _ = try decoder.next() }
    }

    @Test func largeLengthIsStillCheckedBeforeAllocating() {
        var decoder = FrameDecoder(maxFrameSize: 100_000)
        let frame = Frame(kind: .message, sequence: 1, payload: [UInt8](repeating: 1, count: 200_000))
        decoder.append(contentsOf: (try? frame.encoded())!.prefix(64))
        #expect(throws: TransportError.self) { _ = try decoder.next() }
        #expect(decoder.missingPayloadBytes == 0)
    }

    /// A large payload is sent from its own array: header buffer + payload buffer = the encoding.
    @Test(arguments: [0, 100, WireBuffer.inPlacePayloadThreshold - 1, WireBuffer.inPlacePayloadThreshold, 1 << 20])
    func wireBuffersConcatenateToTheEncoding(size: Int) throws {
        let frame = Frame(
            kind: .message, codecID: 0, typeID: "raw", sequence: 5, reference: 3,
            payload: (0..<size).map { UInt8(truncatingIfNeeded: $0) })
        var numbered = frame
        numbered.sequence = 1
        let encoded = try numbered.encoded()
        var writes = PendingWrites(highWaterMark: 1 << 30, lowWaterMark: 0)
        writes.open()
        _ = try writes.enqueue(frame, size: encoded.count)
        var joined: [UInt8] = []
        let buffers = writes.forEachUnwritten(maxBuffers: 64) { _, base, count in
            joined += UnsafeRawBufferPointer(start: base, count: count)
        }
        #expect(buffers == (size >= WireBuffer.inPlacePayloadThreshold ? 2 : 1))
        #expect(joined == encoded)
    }

    /// While a large payload is incomplete, the socket's `SO_RCVLOWAT` asks the kernel to wake the
    /// reader only when the rest is there; it must go back to 1 once the payload is complete, or a
    /// small frame behind it would never be reported readable. Here reading pauses right after the
    /// large frame (a buffer of one message), so only that reset lets the small frame through.
    @Test func receiveLowWaterFollowsALargePayloadAndIsReset() async throws {
        try await withDeadline {
            var configuration = config("server")
            configuration.incomingBufferLimit = 1
            let server = try TestServer(configuration, families: [.ipv4])
            let raw = try RawClient(port: server.port)
            defer { raw.close() }
            try raw.hello()
            let channel = try await server.nextChannel()
            #expect(try raw.readFrame().kind == .helloAck)
            let payload = (0..<(300 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let large = try Frame(kind: .message, typeID: "big", sequence: 2, payload: payload).encoded()
            try raw.write(Array(large[0..<(100 * 1024)]))
            // The reader has taken the first part and now waits for the rest of the payload.
            let expected = Int32(large.count - 100 * 1024)
            try await waitUntil("SO_RCVLOWAT raised for the rest of the payload") {
                channel.driver.loop.run { channel.driver.receiveLowWater } == expected
            }
            let small = try Frame(kind: .message, typeID: "small", sequence: 3, payload: [1, 2, 3]).encoded()
            try raw.write(Array(large[(100 * 1024)...]) + small)
            try await waitUntil("reading paused by the full buffer") { channel.driver.loop.run { channel.driver.isReadPaused } }
            #expect(channel.driver.loop.run { channel.driver.receiveLowWater } == 1)
            var iterator = channel.messages.makeAsyncIterator()
            let first = await iterator.next()
            #expect(first?.typeID == "big")
            #expect(first?.payload == payload)
            let second = await iterator.next()  // reading resumes; the 3-byte frame must be reported readable
            #expect(second?.typeID == "small")
            #expect(second?.payload == [1, 2, 3])
        }
    }
}
