import Testing

@testable import Messaging

/// The client's lifecycle as a value: every transition, its back-off and its waiters, without
/// sockets, tasks or sleeps.
@Suite struct ClientLifecycleTests {
    final class FakeChannel {}
    typealias Machine = ClientLifecycle<FakeChannel, String>

    let peer = PeerInfo(name: "server")
    let refused = MessagingError(.connectFailed, "connection refused")

    @Test func connectsLosesReconnectsWithBackOffAndConnectsAgain() {
        var machine = Machine(policy: ReconnectPolicy(initialDelay: .milliseconds(100), maxDelay: .milliseconds(300)), target: "t")
        guard case .connecting = machine.state else { Issue.record("\(machine.state)"); return }
        let first = FakeChannel()
        guard case .connected(let waiters) = machine.established(first, peer: peer, via: nil, resumed: false) else {
            Issue.record("not connected"); return
        }
        #expect(waiters.isEmpty)
        #expect(machine.channel === first && machine.state.isConnected)

        let other = machine.channelClosed(FakeChannel(), reason: .closedByPeer)
        #expect(other == .nothing, "not its channel")
        let lost = machine.channelClosed(first, reason: .closedByPeer)
        #expect(lost == .reconnect)
        guard case .reconnecting(.closedByPeer, 0, nil) = machine.state else { Issue.record("\(machine.state)"); return }
        #expect(machine.channel == nil)
        var started = machine.startLoop()
        #expect(started)

        // Back-off doubles up to the maximum; a server's hint is never undercut.
        var waits: [Duration] = []
        for hint in [nil, nil, Duration.seconds(1), nil] as [Duration?] {
            guard case .retry(let wait, reconnecting: true, _) = machine.attemptFailed(refused, retryAfter: hint) else {
                Issue.record("no retry"); return
            }
            waits.append(wait)
        }
        #expect(waits == [.milliseconds(100), .milliseconds(200), .seconds(1), .milliseconds(300)])
        guard case .reconnecting(.closedByPeer, 4, let last?) = machine.state else { Issue.record("\(machine.state)"); return }
        #expect(last.message == "connection refused")
        #expect(machine.lastFailure == "connection refused")

        let second = FakeChannel()
        guard case .connected = machine.established(second, peer: peer, via: nil, resumed: true) else {
            Issue.record("not connected"); return
        }
        #expect(machine.resumed && machine.lastFailure == nil && !machine.loopRunning)
        // A new loop starts its back-off from the beginning.
        _ = machine.channelClosed(second, reason: .heartbeatTimeout)
        started = machine.startLoop()
        #expect(started)
        guard case .retry(let wait, _, let attempt) = machine.attemptFailed(refused, retryAfter: nil) else { Issue.record("no retry"); return }
        #expect(wait == .milliseconds(100))
        #expect(attempt == 1, "a new loop counts its attempts from 1")
    }

    /// Issue 53, 7: every address refused the connection (a server restarting): the wait stays
    /// short — at most half a second — while the back-off of other failures goes on doubling.
    @Test func aRefusedConnectionIsTriedAgainSoon() {
        var machine = Machine(policy: ReconnectPolicy(), target: "t")
        var waits: [Duration] = []
        for refusedNow in [true, true, true, true, false, true] {
            guard case .retry(let wait, _, _) = machine.attemptFailed(refused, retryAfter: nil, refused: refusedNow) else {
                Issue.record("no retry"); return
            }
            waits.append(wait)
        }
        #expect(waits == [.milliseconds(250), .milliseconds(500), .milliseconds(500), .milliseconds(500), .seconds(4), .milliseconds(500)])
    }

    @Test func waitersGetTheChannelTheCloseOrTheirTimeout() {
        var machine = Machine(policy: ReconnectPolicy(), target: "'Lobby' (_chat._tcp)")
        guard case .wait = machine.ready(waiting: .seconds(1)) else { Issue.record("should wait"); return }
        guard case .failure(let now) = machine.ready(waiting: .zero), now.code == .notConnected else {
            Issue.record("a caller that will not wait fails at once"); return
        }
        let (a, _) = machine.addWaiter("a")
        let (b, _) = machine.addWaiter("b")
        _ = machine.attemptFailed(refused, retryAfter: nil)
        let timedOut = machine.waiterTimedOut(a)
        #expect(timedOut == "a")
        let again = machine.waiterTimedOut(a)
        #expect(again == nil, "once")
        #expect(machine.timedOut(.seconds(1)).message == "no connection to 'Lobby' (_chat._tcp) within 1.0 seconds (last attempt: connection refused)")
        let channel = FakeChannel()
        guard case .connected(let waiters) = machine.established(channel, peer: peer, via: nil, resumed: false) else {
            Issue.record("not connected"); return
        }
        #expect(waiters == ["b"])
        let late = machine.waiterTimedOut(b)
        #expect(late == nil, "resumed with the channel already")
        guard case .channel(let ready) = machine.ready(waiting: .seconds(1)), ready === channel else { Issue.record("no channel"); return }

        _ = machine.channelClosed(channel, reason: .closedByPeer)
        let (_, later) = machine.addWaiter("c")
        guard case .wait = later else { Issue.record("should wait while reconnecting"); return }
        let (closedChannel, failed) = machine.close()
        #expect(closedChannel == nil && failed == ["c"])
        guard case .closed(nil) = machine.state, case .failure(let stopped) = machine.ready(waiting: .seconds(1)) else {
            Issue.record("\(machine.state)"); return
        }
        #expect(stopped.code == .stopped)
        let restarted = machine.startLoop()
        #expect(!restarted, "no loop after close")
        guard case .stop = machine.attemptFailed(refused, retryAfter: nil) else { Issue.record("a late failure"); return }
        guard case .closeIt = machine.established(FakeChannel(), peer: peer, via: nil, resumed: false) else {
            Issue.record("a late connection must be closed"); return
        }
    }

    @Test func givesUpAfterItsAttemptsOrAtOnceForAnUntrustedKey() {
        var machine = Machine(policy: ReconnectPolicy(maxAttempts: 2), target: "h:1")
        machine.waiting(MessagingError(.serviceNotFound, "waiting for a _x._tcp service to appear"))
        guard case .waiting(let why) = machine.state, why.code == .serviceNotFound else { Issue.record("\(machine.state)"); return }
        let started = machine.startLoop()
        #expect(started)
        guard case .retry(_, reconnecting: false, attempt: 1) = machine.attemptFailed(refused, retryAfter: nil) else {
            Issue.record("a first connect retries as waiting"); return
        }
        guard case .giveUp(let error) = machine.attemptFailed(refused, retryAfter: nil) else { Issue.record("no give-up"); return }
        #expect(error.message == "gave up connecting to h:1 after 2 attempts: connection refused")
        let (_, _) = machine.addWaiter("w")
        let failed = machine.giveUp(error)
        #expect(failed == ["w"])
        guard case .closed(let final?) = machine.state, final.code == .connectFailed,
            case .failure(let later) = machine.ready(waiting: .seconds(1)), later.code == .connectFailed
        else { Issue.record("\(machine.state)"); return }
        #expect(machine.state.isFinal)

        // Final at once: a key this client does not trust, and a session store that failed (it
        // takes no more records in this process).
        for code in [MessagingError.Code.untrustedServer, .sessionStoreUnusable] {
            var final = Machine(policy: ReconnectPolicy(), target: "h:1")
            let loop = final.startLoop()
            #expect(loop)
            guard case .giveUp(let error) = final.attemptFailed(MessagingError(code, "\(code)"), retryAfter: nil) else {
                Issue.record("\(code) is final"); return
            }
            #expect(error.code == code)
        }
    }

    /// The loop's failed attempt says give up, and the app's `close()` comes before the loop's
    /// `giveUp` (two critical sections; `ClientSimulation` found it): the client stays closed by the
    /// app — nothing to fail, no `closed(error)` after `closed(nil)`.
    @Test func aGiveUpAfterTheAppsCloseChangesNothing() {
        var machine = Machine(policy: ReconnectPolicy(maxAttempts: 1), target: "t")
        _ = machine.startLoop()
        guard case .giveUp(let final) = machine.attemptFailed(refused, retryAfter: nil) else { Issue.record("no give-up"); return }
        _ = machine.addWaiter("a caller")
        let (_, waiters) = machine.close()
        #expect(waiters == ["a caller"])
        let version = machine.stateVersion
        #expect(machine.giveUp(final) == nil)
        guard case .closed(nil) = machine.state else { Issue.record("\(machine.state)"); return }
        #expect(machine.stateVersion == version)
    }

    @Test func withoutAReconnectPolicyALostConnectionIsFinal() {
        var machine = Machine(policy: nil, target: "h:1")
        let channel = FakeChannel()
        _ = machine.established(channel, peer: peer, via: nil, resumed: false)
        let after = machine.channelClosed(channel, reason: .goodbye("bye"))
        #expect(after == .finish)
        guard case .disconnected(.goodbye("bye")) = machine.state else { Issue.record("\(machine.state)"); return }
        #expect(machine.state.isFinal)
        guard case .failure(let error) = machine.ready(waiting: .seconds(5)), error.code == .notConnected else {
            Issue.record("nothing reconnects: fail at once"); return
        }
    }
}
