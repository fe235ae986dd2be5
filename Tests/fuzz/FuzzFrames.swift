// libFuzzer target for the wire decoder: frame length prefix + envelope (kind, codec, flags, type id,
// sequence, reference). Built by run-fuzz-wire.sh with Sources/Transport/{Frame,TransportError,
// SocketAddress,Syscall}.swift. Invariants: no crash; the same frames whether the bytes arrive at
// once or in small pieces; every decoded frame re-encodes and decodes to itself.

@inline(__always)
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("frame fuzz invariant violated: \(message())") }
}

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

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrames(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
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
    return 0
}
