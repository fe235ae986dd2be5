import Crypto
import Foundation
import Locks
import ProtocolCore
import Glibc

/// Known peers, like ssh's `known_hosts`: one line per peer name, `<full fingerprint> <name>`.
/// Every lookup reads the file, so several processes can share it; changes are written to a
/// temporary file and renamed into place (mode 0600).
public final class TrustStore: Sendable {
    /// The file.
    public var path: String { file.path }
    private let file: LineFile<(name: String, fingerprint: Fingerprint)>

    /// A store in `path` (created on the first ``trust(_:name:)``).
    public init(path: String) {
        file = LineFile(
            path: path, header: "# lanmsg known peers: <fingerprint> <name>", what: "the trust store",
            parse: { line in
                guard let space = line.firstIndex(of: " "), let fingerprint = Fingerprint(String(line[..<space])) else { return nil }
                return (String(line[line.index(after: space)...]), fingerprint)
            },
            format: { "\($0.fingerprint.full) \($0.name)" })
    }

    /// Where an app's trust store lives by default: `$XDG_DATA_HOME/lanmsg/<app>/known_peers`.
    public static func defaultPath(app: String) -> String { Identity.dataDirectory(app: app) + "/known_peers" }

    /// Every known peer: name and fingerprint, in file order.
    public var entries: [(name: String, fingerprint: Fingerprint)] { file.entries }

    /// The fingerprint remembered for `name`, if any.
    public func fingerprint(for name: String) -> Fingerprint? {
        file.entries.first { $0.name == name }?.fingerprint
    }

    /// Remembers `fingerprint` for `name`, replacing what was remembered for it.
    /// - Throws: ``FileError`` when the file cannot be written.
    public func trust(_ fingerprint: Fingerprint, name: String) throws(FileError) {
        try file.update { list in
            list.removeAll { $0.name == name }
            list.append((name, fingerprint))
            return true
        }
    }

    /// Forgets `name`; returns whether it was known.
    @discardableResult
    public func forget(name: String) throws(FileError) -> Bool {
        try file.update { list in
            let count = list.count
            list.removeAll { $0.name == name }
            return list.count != count
        }
    }
}
