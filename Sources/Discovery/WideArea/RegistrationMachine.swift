import MDNSCore

/// Where a registration goes: the zone, the servers that take its updates, this host's name in the
/// zone and the addresses to publish (what `WideAreaRegistration` looks up before each update).
struct RegistrationPlan: Sendable, Equatable {
    var zone: UnicastDNS.Zone
    var servers: [DNSServerAddress]
    var host: DNSName
    var addresses: [IPAddress]
}

/// The records one registration put in the zone (or tried to): what a refresh checks and what
/// stop deletes.
struct RegisteredRecords: Sendable, Equatable {
    var name: String
    var zone: DNSName
    var servers: [DNSServerAddress]
    var srv: ResourceRecord
}

/// The decisions of one wide-area registration, without I/O: register ("name must not exist"),
/// rename on a conflict with someone else, replace our own stale records, refresh at half the
/// lease, register again when the records vanished, back off while the server does not answer,
/// try a refusal again rarely, and at stop delete what was registered (or attempted).
///
/// `WideAreaRegistration` carries out its actions — look the zone up, send an update, read the
/// records under a name, wait — and feeds back what came of each as the next input. Every wait is
/// an action (a timer the driver arms), never a sleeping task; the clock is the driver's.
struct RegistrationMachine: Sendable {
    /// What an update is for.
    enum Update: Sendable, Equatable {
        /// A first registration of `name`, on condition that the name is not in use.
        case register(name: String)
        /// Our own stale records under `name` replaced, on condition that they are still `earlier`.
        case replace(name: String, earlier: [ResourceRecord])
        /// The same records with a new expiry, on condition that our SRV is still there.
        case refresh(RegisteredRecords)
        /// Our records removed, on condition that our SRV is still there.
        case delete(RegisteredRecords)
    }

    /// What to tell the app and the log.
    enum Report: Sendable, Equatable {
        case registered(name: String)
        /// Our stale records (a crash) were replaced: registered under the same name.
        case replacedStale(name: String)
        case renamed(from: String, to: String)
        /// A failure, said once until another comes or it succeeds, with when it is tried again.
        case failed(DiscoveryError, retryingIn: Duration)
        /// The records were gone at a refresh: registering again.
        case recordsGone(name: String)
        case removed(name: String)
        /// The removal found the records gone or taken over.
        case alreadyGone(name: String)
        case removalFailed(name: String, DiscoveryError)
    }

    enum Action: Sendable, Equatable {
        /// Look up the zone, its update servers, the host name and addresses: answer `.located`.
        case locate
        /// Build and send this update (with `plan`; a deletion uses the records' own zone and
        /// servers): answer `.answered` with the records the update would create.
        case send(Update, RegistrationPlan?)
        /// Read the SRV and TXT under `name`: answer `.earlierRead` with them when they are an
        /// earlier registration of this same service, else nil.
        case readEarlier(name: String, RegistrationPlan)
        /// Wait `duration`, or less when woken (a TXT or address change): answer `.woke`.
        case wait(Duration)
        case report(Report)
        /// Nothing more to do: stopped, and the removal done or not needed.
        case finished
    }

    /// The answers to the actions, and the driver's own inputs. The driver feeds an input only
    /// between actions (never while one is out), so a stop never races an update in flight.
    enum Input: Sendable {
        case start
        case located(Result<RegistrationPlan, DiscoveryError>)
        /// An update's outcome, with the records it would create (register, replace, refresh) —
        /// in the zone now or not, they are what a stop must delete.
        case answered(Result<UnicastDNS.UpdateOutcome, DiscoveryError>, records: RegisteredRecords?)
        case earlierRead(Result<[ResourceRecord]?, DiscoveryError>)
        case woke
        case stop
    }

    /// What the machine waits for.
    enum Phase: Sendable, Equatable {
        case idle
        case locating
        case sending(Update)
        case readingEarlier
        case waiting
        case finished
    }

    private(set) var phase: Phase = .idle
    /// The instance name now (it changes after a conflict).
    private(set) var name: String
    /// The records in the zone, as far as this side knows.
    private(set) var registered: RegisteredRecords?
    /// The records of the last update that could have created them, answered or not: what stop
    /// deletes when no answer confirmed them (the deletion is conditional on our SRV).
    private(set) var attempted: RegisteredRecords?
    private(set) var isStopping = false
    private var plan: RegistrationPlan?
    /// Registration updates sent in this round (bounded: a name that stays taken is a collision).
    private var attempts = 0
    private var backoff: Duration = .seconds(1)
    private let maxBackoff: Duration
    private let lease: Duration
    private var lastFailure: DiscoveryError?
    /// The wait after a refusal (policy, key, clock), which does not go away by itself.
    static let refusalRetry: Duration = .seconds(300)
    static let maxAttempts = 32

    init(name: String, lease: Duration) {
        self.name = name
        self.lease = lease
        self.maxBackoff = min(.seconds(60), lease / 4)
    }

    var isRegistered: Bool { registered != nil }

    /// One input in, the actions to carry out in order out. At most one of them needs an answer
    /// (locate, send, readEarlier, wait), and it comes last.
    mutating func apply(_ input: Input) -> [Action] {
        switch input {
        case .start:
            guard phase == .idle, !isStopping else { return [] }
            return locate()
        case .stop:
            guard !isStopping else { return [] }
            isStopping = true
            return remove()
        case .woke:
            guard phase == .waiting else { return [] }
            return locate()
        case .located(let result):
            guard phase == .locating else { return [] }
            switch result {
            case .failure(let error): return failed(error)
            case .success(let plan):
                self.plan = plan
                if let current = registered { return send(.refresh(current), plan) }
                attempts = 0
                return register(plan)
            }
        case .answered(let result, let records):
            return answered(result, records: records)
        case .earlierRead(let result):
            guard phase == .readingEarlier, let plan else { return [] }
            switch result {
            case .failure(let error): return failed(error)
            case .success(let earlier?): return send(.replace(name: name, earlier: earlier), plan)
            case .success(nil): return renamed(plan)
            }
        }
    }

    private mutating func answered(_ result: Result<UnicastDNS.UpdateOutcome, DiscoveryError>, records: RegisteredRecords?) -> [Action] {
        guard case .sending(let update) = phase else { return [] }
        if case .delete(let removed) = update {
            phase = .finished
            registered = nil
            attempted = nil
            switch result {
            case .success(.done): return [.report(.removed(name: removed.name)), .finished]
            case .success: return [.report(.alreadyGone(name: removed.name)), .finished]
            case .failure(let error): return [.report(.removalFailed(name: removed.name, error)), .finished]
            }
        }
        if let records { attempted = records }
        guard let plan else { return locate() }
        switch (update, result) {
        case (_, .failure(let error)):
            return failed(error)
        case (.register, .success(.done)):
            registered = records
            return succeeded([.report(.registered(name: name))])
        case (.replace, .success(.done)):
            registered = records
            return succeeded([.report(.replacedStale(name: name))])
        case (.refresh, .success(.done)):
            registered = records
            // After a failure the publication said so (and still says it): registered again.
            // (Said nothing until issue 54's simulation, seed 2, found a host that stayed "failed"
            // for good after an outage shorter than its lease.)
            return succeeded(lastFailure == nil ? [] : [.report(.registered(name: name))])
        case (.register, .success(.nameExists)):
            phase = .readingEarlier
            return [.readEarlier(name: name, plan)]
        case (.register, .success(.prerequisiteFailed(let rcode))):
            return failed(DiscoveryError(.dnsFailure, "the registration of '\(name)' failed its prerequisite (\(DNSRcode.name(rcode)))"))
        case (.replace, .success):
            // The stale records went away meanwhile (cleaned up, taken over): register afresh.
            return register(plan)
        case (.refresh(let current), .success):
            // Our SRV was gone (deleted, or the server lost its zone): register again.
            registered = nil
            attempts = 0
            return [.report(.recordsGone(name: current.name))] + register(plan)
        case (.delete, _):
            return []  // answered above
        }
    }

    // MARK: Steps

    private mutating func locate() -> [Action] {
        phase = .locating
        return [.locate]
    }

    private mutating func send(_ update: Update, _ plan: RegistrationPlan?) -> [Action] {
        phase = .sending(update)
        return [.send(update, plan)]
    }

    /// A registration update under the current name, unless this round has tried too many.
    private mutating func register(_ plan: RegistrationPlan) -> [Action] {
        attempts += 1
        guard attempts <= Self.maxAttempts else {
            return failed(DiscoveryError(.collision, "no free name found for '\(name)' after \(Self.maxAttempts) attempts"))
        }
        return send(.register(name: name), plan)
    }

    /// The records under our name belong to someone else: the next alternative name.
    private mutating func renamed(_ plan: RegistrationPlan) -> [Action] {
        let from = name
        name = alternativeName(for: name, isHost: false)
        return [.report(.renamed(from: from, to: name))] + register(plan)
    }

    /// Registered or refreshed: the next refresh at half the lease.
    private mutating func succeeded(_ reports: [Action]) -> [Action] {
        backoff = .seconds(1)
        lastFailure = nil
        phase = .waiting
        return reports + [.wait(lease / 2)]
    }

    /// A failure: said once (until another comes or it succeeds), then waited out — with back-off
    /// while the server does not answer or a name stays taken, rarely after a refusal.
    private mutating func failed(_ error: DiscoveryError) -> [Action] {
        let wait: Duration
        switch error.code {
        case .dnsUnreachable, .dnsFailure, .collision:
            wait = backoff
            backoff = min(backoff * 2, maxBackoff)
        default:
            wait = Self.refusalRetry
        }
        var actions: [Action] = []
        if lastFailure != error {
            lastFailure = error
            actions.append(.report(.failed(error, retryingIn: wait)))
        }
        phase = .waiting
        return actions + [.wait(wait)]
    }

    /// Stopping: delete what is (or may be) in the zone, else finish.
    private mutating func remove() -> [Action] {
        guard let records = registered ?? attempted else {
            phase = .finished
            return [.finished]
        }
        return send(.delete(records), nil)
    }
}
