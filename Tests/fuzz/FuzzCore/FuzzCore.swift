// libFuzzer target over the protocol core (the ProtocolCore target, linked as a whole): the frame
// decoder and the hello exchange fed hostile bytes. Built by Tests/fuzz/run-fuzz-wire.sh with
// `swift build --sanitize=fuzzer --sanitize=address -Xswiftc -DFUZZING`; without FUZZING this is a
// small program that replays inputs given as files (crash reproduction, the corpus as a test).
//
// The first input byte picks the harness: 0, 2 (mod 4) → frames (decoder invariants), 1 → hello (the
// server side of the hello exchange fed whatever frames the bytes decode to), 3 → version 2 (the
// Noise handshake and transport decoders, FuzzNoise.swift; a second byte with both top bits set →
// the receiving half fed sealed frames in pieces, compared with a plaintext decoder).
import ProtocolCore

@inline(__always)
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("fuzz invariant violated: \(message())") }
}

func fuzzOne(_ bytes: [UInt8]) {
    guard let selector = bytes.first else { return }
    switch selector & 3 {
    case 1: fuzzHello(Array(bytes.dropFirst()))
    case 3: fuzzNoise(Array(bytes.dropFirst()))
    default: fuzzFrames(bytes)
    }
}

/// The server side of the hello: every frame the bytes decode to goes to the state machine, which
/// must end (established or failed) or keep waiting, never crash, and never answer with more than a
/// couple of frames per input frame.
func fuzzHello(_ bytes: [UInt8]) {
    let key = try? PreSharedKey(bytes: Array("fuzzing-key-0123456789".utf8))
    var machine = HandshakeStateMachine(
        role: bytes.count % 3 == 0 ? .client : .server,
        settings: .init(
            info: PeerInfo(name: "fuzz"), maxFrameSize: 1 << 16, preSharedKey: bytes.count % 2 == 0 ? key : nil,
            validator: { $0.name == "refused" ? "no" : nil },
            makeNonce: { [UInt8](repeating: 9, count: 32) }))
    _ = machine.start()
    var decoder = FrameDecoder(maxFrameSize: 1 << 16, checkSequence: false)
    decoder.append(contentsOf: bytes[...])
    var frames = 0
    while frames < 1000, let frame = try? decoder.next() {
        frames += 1
        let output = machine.receive(frame)
        check(output.frames.count <= 2, "the hello answered one frame with \(output.frames.count)")
        if output.outcome != nil { check(machine.isDone, "an outcome but not done") }
        if machine.isDone { check(machine.receive(frame).frames.isEmpty, "a finished hello still answers") }
    }
}

#if FUZZING
    @_cdecl("LLVMFuzzerTestOneInput")
    public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
        fuzzOne(Array(UnsafeBufferPointer(start: data, count: size)))
        return 0
    }
#else
    import Foundation

    /// Replays the inputs in the files given as arguments (a crash artifact, a corpus directory).
    @main struct Replay {
        static func main() throws {
            var files: [String] = []
            for path in CommandLine.arguments.dropFirst() {
                var isDirectory: ObjCBool = false
                _ = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
                if isDirectory.boolValue {
                    files += try FileManager.default.contentsOfDirectory(atPath: path).map { "\(path)/\($0)" }
                } else {
                    files.append(path)
                }
            }
            for file in files { fuzzOne(Array(try Data(contentsOf: URL(fileURLWithPath: file)))) }
            print("replayed \(files.count) inputs")
        }
    }
#endif
