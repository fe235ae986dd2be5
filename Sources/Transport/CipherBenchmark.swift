import CLanmsgAEAD
import ProtocolCore

/// Not API (`@_spi(Benchmarks) import Transport`): the transport's AEAD alone, as a connection uses it (the length-prefixed messages of
/// protocol version 2, sealed from and opened into plain buffers), for the cipher-limit row of
/// Benchmarks/run.sh. No sockets, no frames.
@_spi(Benchmarks) public enum _CipherBenchmark {
    /// Seals `count` messages of `size` bytes (at most 65,519) and opens them again, on the calling
    /// thread, in batches of about 4 MiB. Returns the nanoseconds spent sealing and opening.
    public static func measure(size: Int, count: Int) -> (sealNanoseconds: UInt64, openNanoseconds: UInt64) {
        precondition(size >= 0 && size <= SecureProtocol.maxPlaintext)
        let key = [UInt8](repeating: 0x42, count: 32)
        var sender = SecureSender(cipher: NoiseCipherState(key: key))
        let receiver = SecureReceiver(cipher: NoiseCipherState(key: key))
        let plaintext = [UInt8](repeating: 0x5a, count: size)
        let batch = max(1, (4 << 20) / SecureSender.sealedSize(size))
        var sealed = [UInt8](repeating: 0, count: batch * SecureSender.sealedSize(size))
        var sink = DiscardingSink(capacity: size)
        var sealTime: UInt64 = 0
        var openTime: UInt64 = 0
        var done = 0
        while done < count {
            let n = min(batch, count - done)
            let sealStart = uptimeNanoseconds()
            plaintext.withUnsafeBufferPointer { source in
                sealed.withUnsafeMutableBytes { out in
                    var span = lanmsg_span(base: source.baseAddress, length: size)
                    withUnsafePointer(to: &span) { span in
                        for index in 0..<n {
                            try! sender.seal(
                                UnsafeBufferPointer(start: span, count: 1), plaintextCount: size,
                                into: out.baseAddress! + index * SecureSender.sealedSize(size))
                        }
                    }
                }
            }
            let openStart = uptimeNanoseconds()
            sealed.withUnsafeBufferPointer { raw in
                try! receiver.open(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(raw)[0..<(n * SecureSender.sealedSize(size))]), into: &sink)
            }
            let end = uptimeNanoseconds()
            sealTime += openStart - sealStart
            openTime += end - openStart
            done += n
        }
        return (sealTime, openTime)
    }

    /// Opened plaintext written into one reused buffer (as a decoder's buffer would hold it).
    private struct DiscardingSink: PlaintextSink {
        var buffer: [UInt8]
        init(capacity: Int) { buffer = [UInt8](repeating: 0, count: max(capacity, 1)) }

        mutating func receive<E: Error>(
            count: Int, _ write: (UnsafeMutableRawBufferPointer, UnsafeMutableRawBufferPointer) throws(E) -> Void
        ) throws(E) {
            try buffer.withUnsafeMutableBytesTyped { (raw) throws(E) in
                try write(UnsafeMutableRawBufferPointer(start: nil, count: 0), UnsafeMutableRawBufferPointer(rebasing: raw[0..<count]))
            }
        }
    }
}
