import Foundation
import ProtocolCore

extension PreSharedKey {
    /// Reads a key file: its bytes with surrounding whitespace trimmed (so `base64` output or a
    /// passphrase line works as well as raw random bytes).
    /// - Throws: `TransportError` `.invalidArgument` when unreadable or too short.
    public init(contentsOfFile path: String) throws(TransportError) {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw TransportError(.invalidArgument, "cannot read the key file '\(path)'; check the path and its permissions")
        }
        var bytes = [UInt8](data)
        while let last = bytes.last, last == 0x0A || last == 0x0D || last == 0x20 || last == 0x09 { bytes.removeLast() }
        while let first = bytes.first, first == 0x0A || first == 0x0D || first == 0x20 || first == 0x09 { bytes.removeFirst() }
        try self.init(bytes: bytes)
    }

}
