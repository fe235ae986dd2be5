import Messaging
import Testing

@testable import PreviewKit

/// preview-server's decisions without sockets, a store or a clock (issue 46, 7): what
/// `PushController` answers to offers, transfers, expiries, closes, drains and aborts.
/// LoopbackPushTests and ResumeTests are the proof that `PreviewService` carries them out.
@Suite struct PushControllerTests {
    static let sha = String(repeating: "ab", count: 32)
    static let key = PartialTransfers.Key(sender: "alice", sha256: sha, size: 1_000)

    static func offer(pushID: String? = "push-1") -> PreviewOffer {
        PreviewOffer(name: "report.pdf", size: 1_000, sha256: sha, pushID: pushID)
    }

    static func resumable(pushID: String = "push-1", offset: UInt64 = 0) -> PushController.Resume {
        PushController.Resume(key: key, offset: offset, completedKey: "alice/" + pushID, pushID: pushID)
    }

    static func reservation(_ id: String, pushID: String? = "push-1") -> Reservation {
        Reservation(id: id, offer: offer(pushID: pushID))
    }

    /// Admits a resumable offer on `connection` as the service does: the decision, then the
    /// reservation. Returns the offset it is accepted at.
    @discardableResult
    static func accept(
        _ controller: inout PushController, _ id: String, connection: UInt64 = 1, pushID: String = "push-1", offset: UInt64 = 0
    ) -> UInt64? {
        guard case .reserve(let resume) = controller.admit(offer(pushID: pushID), resumable: resumable(pushID: pushID, offset: offset)) else {
            return nil
        }
        return controller.reserved(reservation(id, pushID: pushID), connection: connection, resume: resume)
    }

    @Test func aDrainingServerRefusesOffers() {
        var controller = PushController()
        controller.beginDraining()
        guard case .refuse(let failure) = controller.admit(Self.offer(), resumable: nil) else {
            Issue.record("not refused")
            return
        }
        #expect(failure.code == PreviewFailure.shuttingDown)
    }

    /// The first push of a content claims its partial and resumes where it stopped; another push of
    /// the same content meanwhile (another push id) is received whole, without the partial.
    @Test func oneResumablePushOwnsThePartialAtATime() {
        var controller = PushController()
        #expect(Self.accept(&controller, "o1", offset: 400) == 400)
        #expect(controller.claims[Self.key]?.offerID == "o1")
        #expect(controller.admit(Self.offer(pushID: "push-2"), resumable: Self.resumable(pushID: "push-2", offset: 400)) == .reserve(resume: nil))
        let whole = controller.reserved(Self.reservation("o2", pushID: "push-2"), connection: 2, resume: nil)
        #expect(whole == 0)
        #expect(controller.claims[Self.key]?.offerID == "o1")
    }

    /// A retry of a push (same push id) whose earlier attempt still waits for its data: the earlier
    /// one is stopped first (its offer released, its claim dropped), then the retry takes the partial.
    @Test func aRetryStopsItsEarlierAttemptThenTakesThePartial() {
        var controller = PushController()
        Self.accept(&controller, "o1")
        #expect(controller.admit(Self.offer(), resumable: Self.resumable(offset: 300)) == .stopEarlier(offerID: "o1", connection: nil))
        let stopped = controller.earlierStopped("o1")
        #expect(stopped?.reservation.id == "o1")
        #expect(controller.claims.isEmpty && controller.pending.isEmpty)
        #expect(Self.accept(&controller, "o2", connection: 2, offset: 300) == 300)
    }

    /// The earlier attempt is receiving on another connection (one that died unnoticed): the retry
    /// names that connection, to abort it.
    @Test func aRetryOfAReceivingPushNamesItsConnection() {
        var controller = PushController()
        Self.accept(&controller, "o1", connection: 7)
        guard case .receive = controller.transferArrived(typeID: "preview.file", offerID: "o1", connection: 7, totalSize: 1_000) else {
            Issue.record("not received")
            return
        }
        #expect(controller.receiving == ["o1"])
        #expect(controller.admit(Self.offer(), resumable: Self.resumable()) == .stopEarlier(offerID: "o1", connection: 7))
        let resume = PushController.Resume(key: Self.key, offset: 0, completedKey: "alice/push-1", pushID: "push-1")
        let idle = controller.receiveEnded("o1", resume: resume)
        #expect(idle)
        #expect(controller.claims.isEmpty)
    }

    /// A transfer is received only for an offer this connection was given, of the size it said.
    @Test func aTransferIsReceivedOnlyForItsOwnOfferAndSize() {
        var controller = PushController()
        Self.accept(&controller, "o1", connection: 1)
        // Another connection's: refused, and the offer still waits for its own.
        guard case .refuse(let other, nil) = controller.transferArrived(typeID: "preview.file", offerID: "o1", connection: 2, totalSize: 1_000) else {
            Issue.record("another connection's transfer was not refused")
            return
        }
        #expect(other.failure?.message.contains("unknown or expired offer o1") == true)
        #expect(controller.pending["o1"] != nil)
        // Not a file stream, or without an offer id: refused with what to do.
        guard case .refuse(let wrongType, nil) = controller.transferArrived(typeID: "chat.image", offerID: "o1", connection: 1, totalSize: 1_000),
            case .refuse(let noOffer, nil) = controller.transferArrived(typeID: "preview.file", offerID: nil, connection: 1, totalSize: 1_000)
        else {
            Issue.record("a stream without an offer was not refused")
            return
        }
        #expect(wrongType.failure?.message.contains("not 'chat.image'") == true)
        #expect(noOffer.failure?.message.contains("offer the file first") == true)
        // The size it announces must be what was offered: refused, the space released, the claim
        // dropped (a retry takes the partial at once, with nothing to stop).
        guard case .refuse(let mismatch, let release?) = controller.transferArrived(typeID: "preview.file", offerID: "o1", connection: 1, totalSize: 999) else {
            Issue.record("a size mismatch was not refused")
            return
        }
        #expect(mismatch.failure?.code == PreviewFailure.sizeMismatch && release.id == "o1")
        #expect(controller.claims.isEmpty && controller.pending.isEmpty)
        #expect(controller.admit(Self.offer(), resumable: Self.resumable()) == .reserve(resume: Self.resumable()))
    }

    /// A resumable push that was stored answers its retries with its result, for the newest 256.
    @Test func aStoredPushAnswersItsRetriesForTheNewest256() {
        var controller = PushController()
        let resume = PushController.Resume(key: Self.key, offset: 0, completedKey: "alice/push-0", pushID: "push-0")
        let result = PreviewResult(offerID: "o0", storedName: "report.pdf", sha256: Self.sha, size: 1_000)
        controller.stored(resume, result)
        #expect(controller.admit(Self.offer(pushID: "push-0"), resumable: Self.resumable(pushID: "push-0")) == .alreadyStored(result))
        for n in 1...PushController.completedLimit {
            let later = PushController.Resume(key: Self.key, offset: 0, completedKey: "alice/push-\(n)", pushID: "push-\(n)")
            controller.stored(later, PreviewResult(offerID: "o\(n)"))
        }
        #expect(controller.completed.count == PushController.completedLimit)
        #expect(
            controller.admit(Self.offer(pushID: "push-0"), resumable: Self.resumable(pushID: "push-0"))
                == .reserve(resume: Self.resumable(pushID: "push-0")))
    }

    /// A closed connection's waiting offers are dropped; another connection's stay.
    @Test func aClosedConnectionDropsItsWaitingOffersOnly() {
        var controller = PushController()
        Self.accept(&controller, "o1", connection: 1)
        _ = controller.reserved(Self.reservation("o2", pushID: nil), connection: 2, resume: nil)
        let dropped = controller.connectionClosed(1)
        #expect(dropped.map(\.offerID) == ["o1"])
        #expect(Array(controller.pending.keys) == ["o2"] && controller.claims.isEmpty)
        let expired = controller.expire("o2")
        let again = controller.expire("o2")
        #expect(expired?.reservation.id == "o2")
        #expect(again == nil, "expired once")
    }

    /// Shutdown: the waiting offers to release and the receives to cancel; the last receive's end
    /// says nothing is in flight.
    @Test func abortReturnsWhatWaitsAndWhatIsReceived() {
        var controller = PushController()
        Self.accept(&controller, "o1", connection: 1)
        _ = controller.reserved(Self.reservation("o2", pushID: nil), connection: 1, resume: nil)
        _ = controller.reserved(Self.reservation("o3", pushID: nil), connection: 1, resume: nil)
        _ = controller.transferArrived(typeID: "preview.file", offerID: "o2", connection: 1, totalSize: 1_000)
        _ = controller.transferArrived(typeID: "preview.file", offerID: "o3", connection: 1, totalSize: 1_000)
        let (pending, receiving) = controller.abort()
        #expect(pending.map(\.reservation.id) == ["o1"] && receiving == ["o2", "o3"])
        let first = controller.receiveEnded("o2", resume: nil)
        let last = controller.receiveEnded("o3", resume: nil)
        #expect(!first && last)
    }
}
