import Glibc

extension Array where Element == UInt8 {
    /// Appends `count` bytes and lets `fill` write them (it gets exactly the new region); when
    /// `fill` throws, the array is as it was. The room is made with ``ZeroBytes``.
    package mutating func append<E: Error>(
        count: Int, filledBy fill: (UnsafeMutableRawBufferPointer) throws(E) -> Void
    ) throws(E) {
        let start = self.count
        ZeroBytes.append(count, to: &self)
        do throws(E) {
            try withUnsafeMutableBytesTyped { (raw) throws(E) in try fill(UnsafeMutableRawBufferPointer(rebasing: raw[start...])) }
        } catch {
            removeSubrange(start...)
            throw error
        }
    }
}

extension Array {
    /// `withUnsafeMutableBytes` for a body with a typed error (the standard one is `rethrows`,
    /// which turns it into `any Error`).
    package mutating func withUnsafeMutableBytesTyped<R, E: Error>(
        _ body: (UnsafeMutableRawBufferPointer) throws(E) -> R
    ) throws(E) -> R {
        var result: Result<R, E>?
        withUnsafeMutableBytes { raw in result = Result { () throws(E) -> R in try body(raw) } }
        return try result!.get()
    }
}

/// 64 KiB of zeros: appended (copied) to make room in an array, which is a `memcpy` in every build
/// (appending a `repeatElement` goes element by element in a debug build).
package enum ZeroBytes {
    nonisolated(unsafe) private static let page = UnsafeRawBufferPointer(
        start: UnsafeMutableRawPointer(calloc(1, 65_536)), count: 65_536)

    /// Appends `count` zero bytes to `array`.
    package static func append(_ count: Int, to array: inout [UInt8]) {
        var left = count
        while left > 0 {
            let take = min(left, page.count)
            array.append(contentsOf: UnsafeRawBufferPointer(rebasing: page[0..<take]))
            left -= take
        }
    }
}
