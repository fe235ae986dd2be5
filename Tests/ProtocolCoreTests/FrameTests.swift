import Foundation
import Testing

import ProtocolCore

/// The hex test vectors of docs/PROTOCOL.md, section "Test vectors".
enum Vectors {
    static let hello = (
        "000000570101000000000000000000017b226d61785f6672616d65223a31363737373231362c226d65746164617461223a7b22617070223a2264656d6f227d2c226e616d65223a22616c696365222c2276657273696f6e223a317d",
        Frame(
            kind: .hello, codecID: 1, typeID: "", sequence: 1,
            payload: Array(#"{"max_frame":16777216,"metadata":{"app":"demo"},"name":"alice","version":1}"#.utf8))
    )
    static let message = (
        "000000251001000c636861742e6d65737361676500000000000000027b2274657874223a226869227d",
        Frame(kind: .message, codecID: 1, typeID: "chat.message", sequence: 2, payload: Array(#"{"text":"hi"}"#.utf8))
    )
    static let reply = (
        "0000002710010108636861742e61636b000000000000000700000000000000027b226f6b223a747275657d",
        Frame(
            kind: .message, codecID: 1, typeID: "chat.ack", sequence: 7, reference: 2,
            payload: Array(#"{"ok":true}"#.utf8))
    )
    static let ping = ("0000000c110000000000000000000003", Frame(kind: .ping, codecID: 0, typeID: "", sequence: 3))
    static let request = (
        "0000001d100102066b762e67657400000000000000047b226b6579223a2278227d",
        Frame(kind: .message, codecID: 1, typeID: "kv.get", sequence: 4, payload: Array(#"{"key":"x"}"#.utf8))
            .flagged(expectsReply: true)
    )
    static let errorReply = (
        "00000043100105066b762e676574000000000000000900000000000000047b22636f6465223a226e6f745f666f756e64222c226d657373616765223a226e6f206b65792078227d",
        Frame(
            kind: .message, codecID: 1, typeID: "kv.get", sequence: 9, reference: 4,
            payload: Array(#"{"code":"not_found","message":"no key x"}"#.utf8)
        ).flagged(isError: true)
    )

    /// A PONG asking for a heartbeat pace of 47,500 ms (docs/PROTOCOL.md, "Heartbeat pacing").
    static let pacedPong = (
        "0000001812000100000000000000000400000000000000030000b98c",
        Frame(kind: .pong, sequence: 4, reference: 3, payload: Frame.pong(reference: 3, pace: 47_500_000_000).payload)
    )

    static let all = [hello, message, reply, ping, request, errorReply, pacedPong]
}

func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
func bytes(hex: String) -> [UInt8] {
    var result: [UInt8] = []
    var index = hex.startIndex
    while index < hex.endIndex {
        let next = hex.index(index, offsetBy: 2)
        result.append(UInt8(hex[index..<next], radix: 16)!)
        index = next
    }
    return result
}

@Suite struct FrameDecoderTests {
    /// The spec carries exactly these vectors (a changed encoding must change the spec too).
    @Test func theSpecListsTheseVectors() throws {
        let spec = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../docs/PROTOCOL.md")
        let text = try String(contentsOf: spec, encoding: .utf8)
        for (hex, _) in Vectors.all { #expect(text.contains(hex)) }
    }

    @Test(arguments: 0..<7)
    func hexVectorsEncode(index: Int) throws {
        let (expected, frame) = Vectors.all[index]
        #expect(hex(try frame.encoded()) == expected)
    }

    @Test(arguments: 0..<7)
    func hexVectorsDecode(index: Int) throws {
        let (encoded, frame) = Vectors.all[index]
        var decoder = FrameDecoder(checkSequence: false)
        decoder.append(contentsOf: bytes(hex: encoded))
        #expect(try decoder.next() == frame)
        #expect(try decoder.next() == nil)
        #expect(decoder.bufferedByteCount == 0)
    }

    static func sampleStream() throws -> (bytes: [UInt8], frames: [Frame]) {
        var frames: [Frame] = []
        for i in 1...40 {
            frames.append(
                Frame(
                    kind: i % 5 == 0 ? .ping : .message, codecID: UInt8(i % 2), typeID: i % 3 == 0 ? "" : "type.\(i)",
                    sequence: UInt64(i), reference: i % 4 == 0 ? UInt64(i - 1) : nil,
                    payload: (0..<(i * 37 % 300)).map { UInt8(truncatingIfNeeded: $0 &* i) }))
        }
        return (try frames.flatMap { try $0.encoded() }, frames)
    }

    @Test func everySplitPoint() throws {
        let (stream, frames) = try Self.sampleStream()
        for split in 0...stream.count {
            var decoder = FrameDecoder()
            var decoded: [Frame] = []
            decoder.append(contentsOf: stream[0..<split])
            while let frame = try decoder.next() { decoded.append(frame) }
            decoder.append(contentsOf: stream[split...])
            while let frame = try decoder.next() { decoded.append(frame) }
            #expect(decoded == frames, "split at \(split)")
        }
    }

    @Test func byteByByteAndManyFramesPerRead() throws {
        let (stream, frames) = try Self.sampleStream()
        var decoder = FrameDecoder()
        var decoded: [Frame] = []
        for byte in stream {
            decoder.append(contentsOf: [byte])
            while let frame = try decoder.next() { decoded.append(frame) }
        }
        #expect(decoded == frames)

        var whole = FrameDecoder()
        stream.withUnsafeBytes { whole.append($0) }
        decoded.removeAll()
        while let frame = try whole.next() { decoded.append(frame) }
        #expect(decoded == frames)
    }

    @Test func oversizedLengthRejectedBeforeTheBodyArrives() {
        var decoder = FrameDecoder(maxFrameSize: 1024)
        decoder.append(contentsOf: [0xFF, 0xFF, 0xFF, 0xFF])
        #expect {
            _ = try decoder.next()
        } throws: { error in
            let error = error as? TransportError
            return error?.code == .frameTooLarge && error?.closeReason == .frameTooLarge(size: 0xFFFF_FFFF, limit: 1024)
        }
    }

    @Test func sequenceMustCount() throws {
        var decoder = FrameDecoder()
        decoder.append(contentsOf: try Frame(kind: .ping, sequence: 1).encoded())
        decoder.append(contentsOf: try Frame(kind: .ping, sequence: 3).encoded())
        #expect(try decoder.next()?.sequence == 1)
        #expect(throws: TransportError.self) { _ = try decoder.next() }
    }

    @Test func malformedFramesAreProtocolErrors() throws {
        for body: [UInt8] in [
            [0x7F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],  // unknown kind
            [0x10, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1],  // type id longer than the frame
            [0x10, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1],  // reference flag, no reference
            [0x10, 0, 0, 2, 0xC3, 0x28, 0, 0, 0, 0, 0, 0, 0, 1],  // invalid UTF-8 type id
            [0x10, 0, 0],  // shorter than the minimum header
        ] {
            var decoder = FrameDecoder()
            decoder.append(contentsOf: withUnsafeBytes(of: UInt32(body.count).bigEndian, Array.init) + body)
            #expect(
                performing: { _ = try decoder.next() }, throws: { ($0 as? TransportError)?.code == .protocolViolation })
        }
    }

    @Test func typeIDsRoundTripAsciiOrNot() throws {
        for typeID in ["", "chat.say", "grüße.ü", "日本語", "emoji.🎉", "x\u{7F}y"] {
            var decoder = FrameDecoder(checkSequence: false)
            decoder.append(contentsOf: try Frame(kind: .message, typeID: typeID, payload: [1]).encoded())
            #expect(try decoder.next()?.typeID == typeID)
        }
        // Valid UTF-8 after an ASCII prefix is decoded; a broken sequence after one is refused.
        #expect(FrameDecoder.typeID(UnsafeRawBufferPointer(start: nil, count: 0)) == "")
        #expect(([0x61, 0xC3, 0xA9] as [UInt8]).withUnsafeBytes { FrameDecoder.typeID($0) } == "aé")
        #expect(([0x61, 0xC3, 0x28] as [UInt8]).withUnsafeBytes { FrameDecoder.typeID($0) } == nil)
        #expect(([0x61, 0xFF] as [UInt8]).withUnsafeBytes { FrameDecoder.typeID($0) } == nil)
    }

    @Test func typeIDLongerThan255BytesIsRejected() {
        #expect(throws: TransportError.self) {
            _ = try Frame(kind: .message, typeID: String(repeating: "x", count: 256)).encoded()
        }
    }
}


extension Frame {
    func flagged(expectsReply: Bool = false, isError: Bool = false) -> Frame {
        var copy = self
        copy.expectsReply = expectsReply
        copy.isError = isError
        return copy
    }
}
