/// The decisions of one unicast browse (one service type in one domain), without I/O: a poll asks
/// the zone's SOA serial; only when it changed is the type's PTR set read, and the TXT and SRV of
/// the instances not shown yet; an instance whose `expires` passed is hidden (and read again when
/// the serial changes, or when a shown one's expiry passes); a server that does not answer keeps
/// what was seen, and an instance that could not be read is read again at the next poll (the serial
/// is not taken as seen until every one was). The first poll ends in "all for now", whatever it
/// found. Then a wait of one poll interval.
///
/// `WideAreaBrowse` carries out the actions (queries, a jittered wait) in its one task and feeds
/// back the answers.
struct UnicastBrowseMachine: Sendable {
    /// The zone's serial and the servers that answer for it (one poll's first answer).
    struct Serial: Sendable, Equatable {
        var serial: UInt32
        var servers: [DNSServerAddress]
    }

    /// The instances read: those found, and the names whose query got no answer (read again later).
    struct Reads: Sendable, Equatable {
        var found: [String: WideAreaInstance]
        var failed: Set<String>
    }

    enum Action: Sendable, Equatable {
        /// Ask the zone's serial: answer `.serial`.
        case askSerial
        /// Read the PTR set: answer `.names`.
        case readNames(servers: [DNSServerAddress])
        /// Read these instances' TXT and SRV: answer `.read`.
        case readInstances([String], servers: [DNSServerAddress])
        case added(WideAreaInstance)
        case removed(WideAreaInstance)
        case allForNow
        /// A poll failed (said once until the problem changes): forget where the zone is.
        case pollFailed(DiscoveryError, firstTime: Bool)
        /// Wait one poll interval (jittered by the driver): answer `.woke`.
        case wait
    }

    enum Input: Sendable {
        case start
        /// The serial, and the time now (seconds since the epoch, for expiries).
        case serial(Result<Serial, DiscoveryError>, now: UInt64)
        case names(Result<Set<String>, DiscoveryError>)
        case read(Reads)
        case woke
    }

    private enum Step: Sendable, Equatable {
        case idle
        case askingSerial
        case readingNames(Serial)
        /// Reading the new (and hidden) instances after a serial change.
        case readingNew(Serial, names: [String])
        /// Reading shown instances whose expiry passed.
        case readingDue([String])
        case waiting
    }

    private var step: Step = .idle
    private(set) var visible: [String: WideAreaInstance] = [:]
    private(set) var hidden: [String: WideAreaInstance] = [:]
    private(set) var lastSerial: UInt32?
    private var firstDone = false
    private var lastProblem: DiscoveryError?
    private var now: UInt64 = 0
    private var servers: [DNSServerAddress] = []

    init() {}

    mutating func apply(_ input: Input) -> [Action] {
        switch (step, input) {
        case (.idle, .start), (.waiting, .woke):
            step = .askingSerial
            return [.askSerial]
        case (.askingSerial, .serial(let result, let now)):
            self.now = now
            switch result {
            case .failure(let error): return pollFailed(error)
            case .success(let answer):
                servers = answer.servers
                if answer.serial != lastSerial {
                    step = .readingNames(answer)
                    return [.readNames(servers: answer.servers)]
                }
                return readDue()
            }
        case (.readingNames(let answer), .names(let result)):
            switch result {
            case .failure(let error): return pollFailed(error)
            case .success(let names):
                var actions: [Action] = []
                for (name, instance) in visible.sorted(by: { $0.key < $1.key }) where !names.contains(name) {
                    visible.removeValue(forKey: name)
                    actions.append(.removed(instance))
                }
                for name in hidden.keys where !names.contains(name) { hidden.removeValue(forKey: name) }
                // The new ones, and the hidden ones (registered again?).
                let toRead = names.filter { visible[$0] == nil }.sorted()
                if toRead.isEmpty {
                    lastSerial = answer.serial
                    return actions + readDue()
                }
                step = .readingNew(answer, names: toRead)
                return actions + [.readInstances(toRead, servers: answer.servers)]
            }
        case (.readingNew(let answer, let names), .read(let reads)):
            var actions: [Action] = []
            for name in names {
                guard let instance = reads.found[name] else { continue }
                if instance.isExpired(now: now) {
                    hidden[name] = instance
                } else {
                    hidden.removeValue(forKey: name)
                    visible[name] = instance
                    actions.append(.added(instance))
                }
            }
            if names.allSatisfy({ !reads.failed.contains($0) }) { lastSerial = answer.serial }
            return actions + readDue()
        case (.readingDue(let names), .read(let reads)):
            var actions: [Action] = []
            for name in names {
                guard let old = visible[name] else { continue }
                if let fresh = reads.found[name], !fresh.isExpired(now: now) {
                    visible[name] = fresh
                    if !fresh.isSameService(as: old) {
                        // Changed meanwhile — its TXT, its port, or its owner (stopped, and the name
                        // taken by another host within one poll): said as gone, then as new, so
                        // that nobody keeps the old host or TXT. (Kept silently until issue 54's
                        // simulation, seed 20, saw a browse show a name's previous owner for good.)
                        actions.append(.removed(old))
                        actions.append(.added(fresh))
                    }
                } else if reads.failed.contains(name) {
                    continue  // not answered: asked again at the next poll
                } else {
                    visible.removeValue(forKey: name)
                    hidden[name] = reads.found[name] ?? old
                    actions.append(.removed(old))
                }
            }
            return actions + pollDone()
        default:
            return []  // an answer nobody asked for
        }
    }

    /// Shown instances whose expiry passed are read again (a refresh may be on its way).
    private mutating func readDue() -> [Action] {
        let due = visible.values.filter { $0.isExpired(now: now) }.map(\.identity.name).sorted()
        guard !due.isEmpty else { return pollDone() }
        step = .readingDue(due)
        return [.readInstances(due, servers: servers)]
    }

    private mutating func pollFailed(_ error: DiscoveryError) -> [Action] {
        let firstTime = lastProblem?.message != error.message
        lastProblem = error
        return [.pollFailed(error, firstTime: firstTime)] + pollDone(succeeded: false)
    }

    private mutating func pollDone(succeeded: Bool = true) -> [Action] {
        if succeeded { lastProblem = nil }
        var actions: [Action] = []
        if !firstDone {
            firstDone = true
            actions.append(.allForNow)
        }
        step = .waiting
        return actions + [.wait]
    }
}
