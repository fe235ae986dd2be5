import Foundation
import ProtocolCore
import Scheduling
import TestWaits

@testable import Messaging

/// A deterministic simulation of a ``MessageClient``'s connection lifecycle (issue 54, 3 — its
/// client part, beside ``SessionSimulation``): the real ``ClientLifecycle`` driven the way
/// `MessageClient` drives it — its connect loop (an attempt, then the lifecycle's back-off slept
/// on the scheduler), `attach`, the channel's close, `close()`, `giveUp`, and callers waiting for a
/// connection with their own timers — on a ``ManualScheduler``, in virtual time. A seed picks every
/// step: an app call needing the connection (with a wait of 0 ms to 3 s), the attempt in flight
/// ending (connected; refused by every address; a busy server's hint to come back later; a
/// timeout; discovery not seeing the service yet; an untrusted key; a store that failed), the
/// connection dropping, a channel that ended earlier reporting its close again, the app closing
/// the client, or the clock running to the next timer (several due at one instant: the seed
/// picks the order). The seed also picks the configuration: a reconnect policy or none, a limit
/// of attempts, waiting for the server or connecting once at first.
///
/// Checked after every step: each change of ``MessageClient/ConnectionState`` is a legal
/// transition (below) and bumps the version the client's watchers go by, and nothing else does;
/// `reconnecting`'s attempt counts 0, 1, 2, … after each loss; every caller waiting for a
/// connection is answered exactly once — the channel (the open, current one), the close, the
/// give-up, or its own timeout — and none waits on while the client is connected or closed; at
/// most one attempt is in flight, and none starts after the close; every wait between attempts
/// honours a server's hint, the policy's maximum and the refused-connection cap; the client gives
/// up exactly at its limit of attempts, and at once for an untrusted key. At the end (the faults
/// stop, the next attempts succeed, every timer runs): a client that reconnects is connected, and
/// after the app's close nothing is left — no channel open, no caller waiting, no timer pending.
///
/// The legal transitions: connecting → waiting, connected, closed; waiting → waiting, connected,
/// closed; connected → reconnecting, disconnected, closed; reconnecting → reconnecting,
/// connected, closed; disconnected → closed (the app's close; the state stream ended at
/// disconnected); closed → nothing.
final class ClientSimulation: @unchecked Sendable {  // one thread: the test's, and the scheduler's work runs on it
    final class Channel {
        let number: Int
        var closes = 0
        init(number: Int) { self.number = number }
    }
    typealias Machine = ClientLifecycle<Channel, Int>

    struct Outcome: SimulationOutcome {
        var failure: String?
        var trace: [String] = []
        var steps = 0
        var counts: [String: Int] = [:]
    }

    /// A caller of `connectedChannel(within:)`/`send`/`request` waiting for a connection.
    struct Caller {
        let wait: Duration
        var timer: ScheduledWork?
    }

    enum Failure {
        case refused, busy, timeout, untrusted, storeFailed
    }

    let seed: UInt64
    var random: SeededRandom
    let clock: ManualScheduler
    let policy: ReconnectPolicy?
    let waitsForServer: Bool
    var machine: Machine
    var outcome = Outcome()

    // The carrier, as MessageClient keeps it.
    /// The connect loop's attempt in flight (an `establish` awaiting).
    var attempting = false
    var loopCancelled = false
    /// The loop's back-off sleep.
    var backOff: ScheduledWork?
    var channels: [Channel] = []
    var callers: [Int: Caller] = [:]
    var lastCaller = 0
    /// The loop decided to give up; its `giveUp(_:)` has not run yet.
    var pendingGiveUp: MessagingError?
    /// A lost connection's close callback said reconnect; `startConnecting()` has not run yet.
    var pendingLoopStart = false
    /// Callers told to wait that have not registered yet.
    var registering: [Int: Duration] = [:]
    /// Failed attempts of the running loop, counted here.
    var loopFailures = 0
    // What the checks compare with.
    var lastState: MessageClient.ConnectionState = .connecting
    var lastVersion: UInt64 = 0

    init(seed: UInt64) {
        self.seed = seed
        random = SeededRandom(seed)
        clock = ManualScheduler(choosingWith: SeededRandom(seed &* 31 &+ 7))
        switch Int.random(in: 0..<4, using: &random) {
        case 0: policy = nil
        case 1: policy = ReconnectPolicy(initialDelay: .milliseconds(100), maxDelay: .seconds(2), maxAttempts: Int.random(in: 1...6, using: &random))
        default: policy = ReconnectPolicy(initialDelay: .milliseconds(Int.random(in: 50...400, using: &random)), maxDelay: .seconds(Int.random(in: 1...5, using: &random)))
        }
        waitsForServer = Bool.random(using: &random)
        machine = Machine(policy: policy, target: "'Lobby' (_chat._tcp)")
    }

    static func run(seed: UInt64, steps: Int = 200) -> Outcome {
        let simulation = ClientSimulation(seed: seed)
        simulation.run(steps: steps)
        return simulation.outcome
    }

    func fail(_ text: String) {
        if outcome.failure == nil { outcome.failure = text }
    }

    func count(_ kind: String) { outcome.counts[kind, default: 0] += 1 }

    var millis: UInt64 { (clock.now - 1_000_000_000) / 1_000_000 }

    func note(_ text: String) {
        outcome.trace.append("\(millis) ms \(text) | \(machine.state)")
    }

    // MARK: Running

    func run(steps: Int) {
        outcome.trace.append(
            "seed \(seed): \(policy.map { "reconnect \($0.initialDelay)…\($0.maxDelay)\($0.maxAttempts.map { ", at most \($0) attempts" } ?? "")" } ?? "no reconnect policy"), "
                + (waitsForServer ? "waits for the server" : "connects once at first"))
        if waitsForServer {
            startConnecting()
        } else {
            attempting = true  // `connect` establishes once; its failure is the caller's error
        }
        for _ in 0..<steps {
            guard outcome.failure == nil, step() else { break }
            outcome.steps += 1
            check()
        }
        guard outcome.failure == nil else { return }
        settle()
    }

    /// One step the seed picks among those possible now; false when the run is over (the first
    /// connect failed, or the client is closed and nothing is left to happen).
    func step() -> Bool {
        var choices: [(weight: Int, action: () -> Void)] = []
        // (a client that connects once at first exists when that connect returned)
        let exists = waitsForServer || !channels.isEmpty
        if exists && (!machine.isClosed || Int.random(in: 0..<8, using: &random) == 0) { choices.append((3, callerAsks)) }  // (an app may call after its close)
        if !registering.isEmpty { choices.append((3, callerRegisters)) }
        if attempting { choices.append((6, { self.attemptEnds(success: Int.random(in: 0..<3, using: &self.random) == 0) })) }
        if attempting { choices.append((1, discoveryHasNotSeenIt)) }
        if pendingGiveUp != nil { choices.append((4, givesUp)) }
        if pendingLoopStart { choices.append((4, loopStarts)) }
        if machine.channel != nil { choices.append((2, connectionDrops)) }
        if channels.contains(where: { $0.closes > 0 }) { choices.append((1, staleClose)) }
        if exists && !machine.isClosed { choices.append((Int.random(in: 0..<30, using: &random) == 0 ? 1 : 0, appCloses)) }
        if clock.nextDeadline != nil { choices.append((4, runNextTimer)) }
        let total = choices.map(\.weight).reduce(0, +)
        guard total > 0 else { return false }
        var pick = Int.random(in: 0..<total, using: &random)
        for choice in choices {
            if pick < choice.weight {
                choice.action()
                return !(firstConnectFailed)
            }
            pick -= choice.weight
        }
        return true
    }

    var firstConnectFailed = false

    // MARK: The carrier (MessageClient's code, step by step)

    /// `startConnecting()`: a loop, unless closed (one critical section: the loop started and its
    /// task kept).
    func startConnecting() {
        guard lifecycle({ $0.startLoop() }) else {
            note("no connect loop: closed")
            return
        }
        loopCancelled = false
        loopFailures = 0
        attempting = true
        note("connect loop starts")
    }

    /// The attempt in flight ends: `attach`, or the loop's failure path.
    func attemptEnds(success: Bool) {
        attempting = false
        if success {
            let channel = Channel(number: channels.count + 1)
            channels.append(channel)
            switch lifecycle({ $0.established(channel, peer: PeerInfo(name: "server"), via: nil, resumed: false) }) {
            case .closeIt:
                closeChannel(channel)
                note("attempt connected channel \(channel.number) after the close: closed it")
                count("connected after close")
            case .connected(let waiters):
                note("connected on channel \(channel.number), \(waiters.count) callers waiting")
                count("connected")
                // (the lifecycle hands its waiters in a dictionary's order, which changes from one
                // process to the next: resumed in the order they came, so that a seed replays)
                for id in waiters.sorted() { answer(id, "channel \(channel.number)", channel: channel) }
            }
            return
        }
        let failure: Failure
        switch Int.random(in: 0..<24, using: &random) {
        case 0: failure = .untrusted
        case 1: failure = .storeFailed
        case 2..<10: failure = .refused
        case 10..<16: failure = .busy
        default: failure = .timeout
        }
        if !waitsForServer && channels.isEmpty {
            // `connect` without waiting for the server: the first attempt's failure is thrown to
            // the app, and no client exists.
            firstConnectFailed = true
            note("the first connect failed (\(failure)): no client")
            count("first connect failed")
            return
        }
        // `if Task.isCancelled { return }` — unless the app's close() came just after that check,
        // before `attemptFailed` (then the lifecycle says stop).
        if loopCancelled && Int.random(in: 0..<3, using: &random) != 0 {
            note("attempt failed after the close: the loop ends")
            return
        }
        let error: MessagingError
        var hint: Duration?
        var refused = false
        switch failure {
        case .refused:
            error = MessagingError(.connectFailed, "connection refused")
            refused = true
        case .busy:
            error = MessagingError(.connectFailed, "server busy")
            hint = .milliseconds(Int.random(in: 1...4, using: &random) * 500)
        case .timeout: error = MessagingError(.connectFailed, "timed out")
        case .untrusted: error = MessagingError(.untrustedServer, "the server's key is not trusted")
        case .storeFailed: error = MessagingError(.sessionStoreUnusable, "the store failed")
        }
        loopFailures += 1
        let decision = lifecycle { $0.attemptFailed(error, retryAfter: hint, refused: refused) }
        if case .stop = decision {} else if machine.isClosed { fail("attempt failed after the close: \(decision), not stop") }
        switch decision {
        case .stop:
            if !machine.isClosed { fail("the loop told to stop though the client is not closed") }
            note("attempt failed (\(failure)): closed meanwhile, the loop stops")
            count("stop")
        case .giveUp(let final):
            let finalFailure = failure == .untrusted || failure == .storeFailed
            let limit = policy?.maxAttempts  // (no policy: a waiting first connect backs off with the default, unlimited)
            if !finalFailure && (limit.map { loopFailures < $0 } ?? true) {
                fail("gave up after \(loopFailures) failed attempts (\(failure)); its limit is \(limit.map(String.init) ?? "none")")
            }
            // `giveUp(_:)` runs in a critical section of its own, after the log line: the app's
            // close() may come first (a step of the seed's).
            pendingGiveUp = final
            note("attempt failed (\(failure)): giving up: \(final.message)")
        case .retry(let wait, let reconnecting, let attempt):
            if failure == .untrusted || failure == .storeFailed { fail("retried after \(failure), which is final") }
            if let max = policy?.maxAttempts, loopFailures >= max { fail("retried after \(loopFailures) failures, its limit \(max)") }
            if attempt != loopFailures { fail("attempt \(attempt) said after \(loopFailures) failures of this loop") }
            if let hint, wait < hint { fail("waits \(wait) though the server said come back in \(hint)") }
            let effective = policy ?? ReconnectPolicy()
            if wait > Swift.max(effective.maxDelay, hint ?? .zero) { fail("waits \(wait), above the policy's \(effective.maxDelay)") }
            if refused && wait > Machine.refusedRetryCap { fail("waits \(wait) after a refused connection (cap \(Machine.refusedRetryCap))") }
            if wait < Swift.min(effective.initialDelay, Machine.refusedRetryCap) { fail("waits only \(wait)") }
            if reconnecting != machine.state.isReconnecting { fail("said reconnecting \(reconnecting) in state \(machine.state)") }
            note("attempt \(attempt) failed (\(failure)): next in \(wait)")
            count("retry")
            backOff = clock.schedule(after: wait) { [self] in
                backOff = nil
                guard !loopCancelled else { return }
                attempting = true
                note("the back-off ended: an attempt")
            }
        }
    }

    /// The loop's `giveUp(_:)`: the lifecycle first — nil when the app closed the client since.
    func givesUp() {
        guard let final = pendingGiveUp else { return }
        pendingGiveUp = nil
        guard let waiters = lifecycle({ $0.giveUp(final) }) else {
            note("closed by the app before giving up: nothing reported")
            count("give-up after close")
            if case .closed(nil) = machine.state {} else { fail("\(machine.state) after a give-up that came after the close") }
            return
        }
        note("gave up: \(final.message)")
        count("gave up")
        for id in waiters.sorted() { answer(id, "gave up") }
    }

    /// The close callback's `.reconnect` starts the loop (`startConnecting()`).
    func loopStarts() {
        pendingLoopStart = false
        startConnecting()
    }

    /// Discovery has not seen the service yet, while an attempt waits for it.
    func discoveryHasNotSeenIt() {
        lifecycle { $0.waiting(MessagingError(.serviceNotFound, "no service 'Lobby' yet")) }
        note("discovery has not seen the service yet")
    }

    /// The connected channel ends (the peer went away, heartbeats unanswered, a reset).
    func connectionDrops() {
        guard let channel = machine.channel else { return }
        let reason = [CloseReason.closedByPeer, .heartbeatTimeout, .reset].randomElement(using: &random)!
        closeChannel(channel)
        channelClosed(channel, reason: reason)
        count("dropped")
    }

    /// The channel's close callback (`route(closed:)` in `attach`).
    func channelClosed(_ channel: Channel, reason: CloseReason) {
        let next = lifecycle { $0.channelClosed(channel, reason: reason) }
        note("channel \(channel.number) closed (\(reason)): \(next)")
        switch next {
        case .nothing: break
        case .reconnect: pendingLoopStart = true  // `startConnecting()`, after the close callback's own section
        case .finish: count("finished")
        }
    }

    /// Runs `body` on the lifecycle and checks the transition it made, as the client's watchers are
    /// told after each critical section (`withState`).
    @discardableResult
    func lifecycle<R>(_ body: (inout Machine) -> R) -> R {
        let result = body(&machine)
        checkTransition()
        return result
    }

    /// A channel that ended before reports its close again (or late): it must change nothing.
    func staleClose() {
        let ended = channels.filter { $0.closes > 0 }
        let channel = ended.randomElement(using: &random)!
        let before = (machine.stateVersion, "\(machine.state)")
        if lifecycle({ $0.channelClosed(channel, reason: .localClose) }) != .nothing {
            fail("channel \(channel.number), closed before, changed the lifecycle when it closed again")
        }
        if before != (machine.stateVersion, "\(machine.state)") { fail("a stale close changed the state") }
        note("stale close of channel \(channel.number)")
    }

    /// `close()`: the lifecycle closed, the loop cancelled (its sleep ends at once; an attempt in
    /// flight may still end), the waiters failed, the channel closed.
    func appCloses() {
        let (channel, waiters) = lifecycle { $0.close() }
        loopCancelled = true
        backOff?.cancel()
        backOff = nil
        for id in waiters.sorted() { answer(id, "closed") }
        if let channel {
            closeChannel(channel)
            channelClosed(channel, reason: .localClose)
        }
        note("the app closed the client")
        count("closed")
    }

    /// An app call needing the connection: `readyChannel(within:)`.
    func callerAsks() {
        let wait = [Duration.zero, .milliseconds(50), .milliseconds(400), .seconds(3)].randomElement(using: &random)!
        lastCaller += 1
        let id = lastCaller
        switch machine.ready(waiting: wait) {  // (reads only)
        case .channel(let channel):
            check(answered: channel, caller: id)
            note("caller \(id) got channel \(channel.number) at once")
            return
        case .failure(let error):
            checkRefusal(error, wait: wait, caller: id)
            return
        case .wait: break
        }
        // `readyChannel` registers the waiter in a second critical section: anything may happen
        // in between (a seed's step of its own).
        registering[id] = wait
        note("caller \(id) will wait up to \(wait)")
    }

    /// A caller told to wait registers (`addWaiter`) and arms its timer.
    func callerRegisters() {
        let id = registering.keys.sorted()[Int.random(in: 0..<registering.count, using: &random)]
        let wait = registering.removeValue(forKey: id)!
        callers[id] = Caller(wait: wait)
        let (waiterID, now) = lifecycle { $0.addWaiter(id) }
        switch now {
        case .channel(let channel):
            callers[id] = nil
            check(answered: channel, caller: id)
            return
        case .failure(let error):
            callers[id] = nil
            checkRefusal(error, wait: wait, caller: id)
            return
        case .wait: break
        }
        callers[id]?.timer = clock.schedule(after: wait) { [self] in
            let waiter = lifecycle { $0.waiterTimedOut(waiterID) }
            if let waiter {
                if waiter != id { fail("waiter \(waiterID) was caller \(waiter), not \(id)") }
                answer(id, "timed out after \(wait)")
            }
        }
        note("caller \(id) waits")
        count("caller waits")
    }

    func check(answered channel: Channel, caller: Int) {
        if channel.closes > 0 { fail("caller \(caller) got channel \(channel.number), which is closed") }
        if machine.channel !== channel { fail("caller \(caller) got channel \(channel.number), not the current one") }
    }

    func checkRefusal(_ error: MessagingError, wait: Duration, caller: Int) {
        note("caller \(caller) (wait \(wait)) refused: \(error.message)")
        count("caller refused")
        switch machine.state {
        case .closed(nil):
            if error.code != .stopped { fail("caller \(caller) of a closed client got \(error.code), not stopped") }
            count("caller after close")
        case .closed(let final?):
            if error.code != final.code { fail("caller \(caller) of a client that gave up got \(error.code), not \(final.code)") }
        default:
            if error.code != .notConnected { fail("caller \(caller) got \(error.code), not notConnected") }
        }
        if wait > .zero && (machine.loopRunning || (policy != nil && !machine.isClosed)) {
            fail("caller \(caller) refused at once (\(error.message)) though the client is connecting")
        }
        if machine.channel != nil { fail("caller \(caller) refused though connected") }
    }

    /// A waiting caller is answered (once: the promise takes only the first).
    func answer(_ id: Int, _ how: String, channel: Channel? = nil) {
        guard let caller = callers[id] else {
            fail("caller \(id) answered (\(how)) but it was not waiting — answered twice?")
            return
        }
        if let channel { check(answered: channel, caller: id) }
        caller.timer?.cancel()  // `defer { timer.cancel() }`
        callers[id] = nil
        note("caller \(id): \(how)")
        count("caller answered")
    }

    func closeChannel(_ channel: Channel) {
        channel.closes += 1
        if channel.closes > 1 { fail("channel \(channel.number) closed \(channel.closes) times") }
    }

    func runNextTimer() {
        guard let deadline = clock.nextDeadline else { return }
        clock.runNext(through: deadline)
    }

    // MARK: Checking

    /// After every call into the lifecycle: the state's change, if any, is legal and has a version.
    func checkTransition() {
        let state = machine.state
        if machine.stateVersion != lastVersion {
            if !Self.legal(from: lastState, to: state) { fail("illegal transition \(lastState) → \(state)") }
            if case .reconnecting(_, let attempt, _) = state {
                let expected: Int
                if case .reconnecting(_, let before, _) = lastState { expected = before + 1 } else { expected = 0 }
                // (an attempt can fail and another fail before a check: never more than one per step here)
                if attempt != expected { fail("reconnecting attempt \(attempt) after \(lastState); \(expected) expected") }
            }
        } else if "\(state)" != "\(lastState)" {
            fail("the state changed \(lastState) → \(state) without a new version: watchers would miss it")
        }
        lastState = state
        lastVersion = machine.stateVersion
        switch state {
        case .disconnected: if policy != nil { fail("disconnected though it reconnects") }
        case .reconnecting: if policy == nil { fail("reconnecting without a reconnect policy") }
        default: break
        }
    }

    /// After every step: the carrier's state agrees with the lifecycle's.
    func check() {
        checkTransition()
        let state = machine.state
        if machine.channel != nil || machine.isClosed {
            if !callers.isEmpty { fail("\(callers.count) callers wait while \(state)") }
        }
        let open = channels.filter { $0.closes == 0 }
        if open.count > 1 { fail("\(open.count) channels open") }
        if let one = open.first, machine.channel !== one { fail("channel \(one.number) open but not the client's") }
        if machine.channel == nil && !open.isEmpty { fail("channel open while \(state)") }
    }

    static func kind(_ state: MessageClient.ConnectionState) -> String {
        switch state {
        case .connecting: "connecting"
        case .waiting: "waiting"
        case .connected: "connected"
        case .reconnecting: "reconnecting"
        case .disconnected: "disconnected"
        case .closed: "closed"
        }
    }

    static let transitions: [String: Set<String>] = [
        "connecting": ["waiting", "connected", "closed"],
        "waiting": ["waiting", "connected", "closed"],
        "connected": ["reconnecting", "disconnected", "closed"],
        "reconnecting": ["reconnecting", "connected", "closed"],
        "disconnected": ["closed"],
        "closed": [],
    ]

    static func legal(from: MessageClient.ConnectionState, to: MessageClient.ConnectionState) -> Bool {
        guard transitions[kind(from), default: []].contains(kind(to)) else { return false }
        if case .disconnected = from, case .closed(let error) = to, error != nil { return false }  // only the app's close
        return true
    }

    // MARK: Settling

    /// The faults stop: attempts succeed, every timer runs; a reconnecting client ends connected;
    /// then the app closes it and nothing may be left.
    func settle() {
        for _ in 0..<1_000 {
            guard outcome.failure == nil else { return }
            if firstConnectFailed { break }
            if !registering.isEmpty {
                callerRegisters()
            } else if pendingGiveUp != nil {
                givesUp()
            } else if pendingLoopStart {
                loopStarts()
            } else if attempting {
                attemptEnds(success: true)
            } else if clock.nextDeadline != nil {
                runNextTimer()
            } else {
                break
            }
            check()
        }
        if firstConnectFailed { return }
        if !machine.isClosed, !machine.state.isFinal, machine.channel == nil {
            fail("settled \(machine.state) without a connection, though it reconnects and every attempt succeeds now")
        }
        if !callers.isEmpty { fail("\(callers.count) callers still waiting after everything settled") }
        appCloses()
        check()
        while !registering.isEmpty { callerRegisters() }
        if pendingGiveUp != nil { givesUp() }
        if pendingLoopStart { loopStarts() }
        while attempting { attemptEnds(success: Bool.random(using: &random)) }
        check()
        if let deadline = clock.nextDeadline { fail("a timer pending after the close (due at \(deadline))") }
        if let open = channels.first(where: { $0.closes == 0 }) { fail("channel \(open.number) open after the close") }
        if !callers.isEmpty { fail("callers waiting after the close") }
        if case .closed = machine.state {} else { fail("\(machine.state) after the close") }
        note("settled")
    }
}

extension MessageClient.ConnectionState {
    var isReconnecting: Bool { if case .reconnecting = self { true } else { false } }
}
