import Foundation
import ProtocolCore

extension PreSharedKey {
    /// Reads a key file: its bytes with surrounding whitespace trimmed (so `base64` output or a
    /// passphrase line works as well as raw random bytes).
    /// - Throws: ``FileError`` when the file is unreadable or its key too short.
    public init(contentsOfFile path: String) throws(FileError) {
        guard let data = FileManager.default.contents(atPath: path) else {
            let code = access(path, R_OK) == 0 ? nil : errno
            throw FileError(path, "cannot read the key file '\(path)'; check the path and its permissions", errno: code)
        }
        var bytes = [UInt8](data)
        while let last = bytes.last, last == 0x0A || last == 0x0D || last == 0x20 || last == 0x09 { bytes.removeLast() }
        while let first = bytes.first, first == 0x0A || first == 0x0D || first == 0x20 || first == 0x09 { bytes.removeFirst() }
        do {
            try self.init(bytes: bytes)
        } catch {
            throw FileError(path, "the key file '\(path)' holds no usable key: \(error.message)")
        }
    }

}
