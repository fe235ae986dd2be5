// The frame decoder's harness: length prefix + envelope (kind, codec, flags, type id, sequence,
// reference). Invariants: no crash; the same frames whether the bytes arrive at once or in small
// pieces; every decoded frame re-encodes and decodes to itself.
import ProtocolCore

func decodeAll(_ chunks: [ArraySlice<UInt8>]) -> (frames: [Frame], failed: Bool) {
    var decoder = FrameDecoder(maxFrameSize: 1 << 16, checkSequence: true)
    var frames: [Frame] = []
    for chunk in chunks {
        decoder.append(contentsOf: chunk)
        while frames.count < 20_000 {
            do {
                guard let frame = try decoder.next() else { break }
                frames.append(frame)
            } catch {
                return (frames, true)
            }
        }
    }
    return (frames, false)
}

func fuzzFrames(_ bytes: [UInt8]) {
    let whole = decodeAll([bytes[...]])
    let step = bytes.isEmpty ? 1 : Int(bytes[0] % 7) + 1
    let pieces = stride(from: 0, to: bytes.count, by: step).map { bytes[$0..<min($0 + step, bytes.count)] }
    let split = decodeAll(pieces)
    check(whole.frames == split.frames, "split feeding changed the frames")
    check(whole.failed == split.failed, "split feeding changed the verdict")
    for frame in whole.frames {
        guard let encoded = try? frame.encoded() else { fatalError("a decoded frame does not re-encode") }
        var again = FrameDecoder(maxFrameSize: 1 << 17, checkSequence: false)
        again.append(contentsOf: encoded[...])
        guard let decoded = try? again.next() else { fatalError("a re-encoded frame does not decode") }
        check(decoded == frame, "re-encoding changed the frame")
    }
}
