import Foundation

/// Where, and how durably, a server's or client's message sessions are kept on disk, so that a
/// restarted process continues them: it answers (server) or asks for (client) a resume, resends
/// what the peer has not acknowledged, and remembers what its app handled. Opt-in:
/// ``SessionConfiguration/store``.
///
/// ```swift
/// var configuration = ServerConfiguration(serviceType: "_collector._tcp")
/// configuration.session?.store = SessionStore(directory: "/var/lib/collector/sessions")
/// ```
///
/// One process per directory (a lock; a second process is refused with the name of the first).
/// The directory is made with mode 0700, its files 0600. What survives what, the file's format and
/// its recovery rules: <doc:MessageSessions>.
public struct SessionStore: Sendable {
    /// How far a message or an acknowledgement is kept before the library goes on.
    public struct Durability: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: Sendable, Hashable { case processCrash, powerLoss }
        private let kind: Kind

        /// Survives the crash of the process (`kill -9`, a fault): each record is handed to the
        /// operating system (`write`) before `send` returns or a handled message is acknowledged.
        /// A crash of the machine itself, or a power loss, may lose the last ones.
        public static let processCrash = Durability(kind: .processCrash)
        /// Survives a power loss as well: each record is on the disk (`fdatasync`) before `send`
        /// returns, before the message goes on the wire, and before a handled message is
        /// acknowledged. Senders that wait at once share one sync (group commit): concurrent sends
        /// cost about one sync per batch, a lone sender one sync per message.
        public static let powerLoss = Durability(kind: .powerLoss)

        var syncs: Bool { kind == .powerLoss }

        public var description: String { kind == .processCrash ? "process crash" : "power loss" }
    }

    /// The directory of the store (made when it does not exist).
    public var directory: String
    /// What a stored record survives (``Durability/processCrash`` by default).
    public var durability: Durability
    /// Most bytes of unacknowledged messages the store keeps, for all its sessions together; a send
    /// beyond it waits until acknowledgements make room (back-pressure, never a drop).
    public var maxBytes: Int = 256 << 20
    /// Tests only: the boot of the machine the store takes itself to run in (a power loss is a new
    /// boot); nil: the kernel's (`/proc/sys/kernel/random/boot_id`).
    package var boot: String?

    /// - Parameters:
    ///   - directory: Where the store lives; one process per directory.
    ///   - durability: ``Durability/processCrash`` (written to the system) or
    ///     ``Durability/powerLoss`` (synced to the disk).
    public init(directory: String, durability: Durability = .processCrash) {
        self.directory = directory
        self.durability = durability
    }

    /// This boot of the machine (`/proc/sys/kernel/random/boot_id`), nil when it cannot be read.
    static func machineBoot() -> String? {
        guard let text = try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8) else { return nil }
        let boot = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return boot.isEmpty ? nil : boot
    }
}
