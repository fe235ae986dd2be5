import FastJSON

/// The hello exchange of protocol version 1, without I/O: feed it the frames the peer sends, send
/// the frames it returns (unnumbered: the connection numbers them), and stop when it returns an
/// outcome. With a pre-shared key it runs the mutual HMAC challenge-response of docs/PROTOCOL.md.
///
/// Every failure says why in a ``TransportError`` whose ``TransportError/closeReason`` the
/// connection closes with; a server explains a refusal to the peer with a REFUSE frame first.
package struct HandshakeStateMachine: Sendable {
    package enum Role: Sendable { case client, server }

    /// This side's part of the hello.
    package struct Settings: Sendable {
        /// Name, metadata and protocol version sent in HELLO / HELLO_ACK.
        package var info: PeerInfo
        /// The largest frame body this side accepts (sent as `max_frame`).
        package var maxFrameSize: Int
        package var preSharedKey: PreSharedKey?
        /// Server side: a non-nil refusal text refuses the peer after its HELLO.
        package var validator: (@Sendable (PeerInfo) -> String?)?
        /// Fresh 32-byte nonces (replaced in tests for fixed vectors).
        package var makeNonce: @Sendable () -> [UInt8]

        package init(
            info: PeerInfo, maxFrameSize: Int, preSharedKey: PreSharedKey? = nil,
            validator: (@Sendable (PeerInfo) -> String?)? = nil,
            makeNonce: @escaping @Sendable () -> [UInt8] = { AuthNonce.make() }
        ) {
            self.info = info
            self.maxFrameSize = maxFrameSize
            self.preSharedKey = preSharedKey
            self.validator = validator
            self.makeNonce = makeNonce
        }
    }

    /// The result of a completed hello.
    package struct Established: Sendable, Equatable {
        /// What the peer said about itself.
        package let peer: PeerInfo
        /// The largest frame body the peer accepts: this side never sends a larger one.
        package let peerMaxFrameSize: Int

        package init(peer: PeerInfo, peerMaxFrameSize: Int) {
            self.peer = peer
            self.peerMaxFrameSize = peerMaxFrameSize
        }
    }

    /// What to do after an event.
    package struct Output: Sendable {
        /// Frames to send, in order (before closing, if the exchange failed).
        package var frames: [Frame] = []
        /// Set once the exchange is over.
        package var outcome: Result<Established, TransportError>?
        /// A line worth logging (a refused or misbehaving peer), if any.
        package var notice: String?
    }

    private enum State: Sendable {
        case clientInitial
        case clientAwaitingAck(nonce: [UInt8]?)
        case clientAwaitingAuthOK(Established)
        case serverAwaitingHello
        case serverAwaitingProof(Established, clientNonce: [UInt8], serverNonce: [UInt8])
        case done
    }

    package let role: Role
    private let settings: Settings
    private var state: State

    package init(role: Role, settings: Settings) {
        self.role = role
        self.settings = settings
        state = role == .client ? .clientInitial : .serverAwaitingHello
    }

    /// Whether the exchange is over (established or failed).
    package var isDone: Bool {
        if case .done = state { return true }
        return false
    }

    private var version: Int { settings.info.version }

    // MARK: Events

    /// The connection is open: a client sends its HELLO.
    package mutating func start() -> Output {
        guard case .clientInitial = state else { return Output() }
        if settings.preSharedKey != nil {
            let nonce = settings.makeNonce()
            state = .clientAwaitingAck(nonce: nonce)
            return Output(frames: [helloFrame(.hello, nonce: nonce)])
        }
        state = .clientAwaitingAck(nonce: nil)
        return Output(frames: [helloFrame(.hello)])
    }

    /// A frame arrived from the peer.
    package mutating func receive(_ frame: Frame) -> Output {
        switch (state, frame.kind) {
        case (.done, _):
            return Output()
        case (.clientAwaitingAck(let nonce), .helloAck):
            return clientReceivedAck(frame, nonce: nonce)
        case (.clientAwaitingAuthOK(let established), .authOK):
            return succeed(established)
        case (.clientAwaitingAck, .refuse), (.clientAwaitingAuthOK, .refuse):
            return refused(frame)
        case (.serverAwaitingHello, .hello):
            return serverReceivedHello(frame)
        case (.serverAwaitingProof(let established, let clientNonce, let serverNonce), .auth):
            return serverReceivedProof(frame, established, clientNonce: clientNonce, serverNonce: serverNonce)
        default:
            let expected =
                switch state {
                case .clientInitial, .clientAwaitingAck: "HELLO_ACK or REFUSE"
                case .clientAwaitingAuthOK: "AUTH_OK or REFUSE"
                case .serverAwaitingHello: "HELLO"
                case .serverAwaitingProof: "AUTH"
                case .done: "nothing"
                }
            return violation("expected \(expected), got \(frame.kind)")
        }
    }

    /// The hello timeout passed (it covers the whole exchange, AUTH included).
    package mutating func timedOut(after timeout: Duration) -> Output {
        guard !isDone else { return Output() }
        state = .done
        let text = "no hello exchange within \(timeout)"
        return Output(
            outcome: .failure(
                TransportError(
                    .helloFailed, "\(text); is the peer speaking this protocol?", closeReason: .helloFailed(text))),
            notice: "\(text); closing")
    }

    /// The connection closed before the exchange completed.
    package mutating func connectionClosed(_ reason: CloseReason) -> Output {
        guard !isDone else { return Output() }
        state = .done
        return Output(
            outcome: .failure(
                TransportError(
                    .helloFailed, "the connection closed during the hello exchange: \(reason)", closeReason: reason)))
    }

    // MARK: Client

    private mutating func clientReceivedAck(_ frame: Frame, nonce: [UInt8]?) -> Output {
        let ack: HelloPayload
        switch decodeHello(frame) {
        case .success(let decoded): ack = decoded
        case .failure(let failure): return fail(failure, text: failure.message)
        }
        guard ack.version == version else {
            let text = "peer acknowledged with protocol version \(ack.version), this side speaks \(version)"
            return fail(TransportError(.versionMismatch, text, closeReason: .helloFailed(text)), text: text)
        }
        if let problem = ack.problem {
            let text = "malformed HELLO_ACK: \(problem)"
            return fail(TransportError(.helloFailed, text, closeReason: .protocolError(text)), text: text)
        }
        let established = Established(
            peer: ack.info, peerMaxFrameSize: ack.maxFrame ?? WireProtocol.defaultMaxFrameSize)
        switch (settings.preSharedKey, nonce, ack.auth) {
        case (nil, _, nil):
            return succeed(established)
        case (nil, _, .some):
            return authFailure(
                "the server '\(ack.name)' requires a pre-shared key; configure this client with the same key")
        case (.some, _, nil):
            return authFailure(
                "the server '\(ack.name)' did not prove the pre-shared key (it runs without one); refusing to talk to an unauthenticated server")
        case (.some(let key), .some(let clientNonce), .some(let challenge)):
            guard challenge.scheme == "hmac-sha256", let serverNonce = Hex.decode(challenge.nonce),
                serverNonce.count == AuthNonce.size, let proof = Hex.decode(challenge.proof)
            else {
                return authFailure("the server sent a malformed authentication challenge")
            }
            guard constantTimeEqual(proof, key.serverProof(clientNonce: clientNonce, serverNonce: serverNonce)) else {
                return authFailure(
                    "the server '\(ack.name)' proved a different pre-shared key; check that both sides use the same key")
            }
            state = .clientAwaitingAuthOK(established)
            let proofPayload = AuthProof(
                proof: Hex.encode(key.clientProof(clientNonce: clientNonce, serverNonce: serverNonce)))
            return Output(frames: [Self.jsonFrame(.auth, proofPayload)])
        case (.some, nil, .some):
            return authFailure("unexpected authentication state")
        }
    }

    private mutating func refused(_ frame: Frame) -> Output {
        let refusal =
            (try? FastJSONDecoder().decode(Refusal.self, from: frame.payload))
            ?? Refusal(code: "unknown", message: String(decoding: frame.payload.prefix(500), as: UTF8.self))
        state = .done
        return Output(
            outcome: .failure(refusal.error("the peer refused the connection: \(refusal.message)")),
            notice: "peer refused the hello: \(refusal.message)")
    }

    // MARK: Server

    private mutating func serverReceivedHello(_ frame: Frame) -> Output {
        // The version first (a later version may change the other keys), then the rest.
        guard let versionOnly = try? FastJSONDecoder().decode(HelloVersion.self, from: frame.payload) else {
            return refuse(
                code: "bad_hello", .helloFailed,
                "malformed HELLO: its payload must be a JSON object with an integer \"version\" and a string \"name\"")
        }
        if versionOnly.version != version {
            return refuse(
                code: "version_mismatch", .versionMismatch,
                "protocol version mismatch: the server speaks version \(version), "
                    + "the client sent version \(versionOnly.version); update the older side")
        }
        let hello: HelloPayload
        switch decodeHello(frame) {
        case .success(let decoded): hello = decoded
        case .failure(let failure): return refuse(code: "bad_hello", .helloFailed, failure.message)
        }
        if let problem = hello.problem {
            return refuse(code: "bad_hello", .helloFailed, "malformed HELLO: \(problem)")
        }
        let info = hello.info
        if let refusal = settings.validator?(info) {
            return refuse(code: "refused", .helloRefused, "refused peer '\(info.name)': \(refusal)")
        }
        // A nonce that is there but not 32 bytes of hex breaks the spec (the client sent a key,
        // badly): bad_hello naming the field, not auth_required (docs/PROTOCOL.md, "Pre-shared key").
        if let nonceText = hello.nonce, Hex.decode(nonceText)?.count != AuthNonce.size {
            return refuse(
                code: "bad_hello", .helloFailed,
                "malformed HELLO: \"nonce\" must be \(AuthNonce.size * 2) hex digits (\(AuthNonce.size) random bytes), "
                    + "got \(nonceText.utf8.count) characters\(Hex.decode(nonceText) == nil ? " that are not hex" : "")")
        }
        let established = Established(peer: info, peerMaxFrameSize: hello.maxFrame ?? WireProtocol.defaultMaxFrameSize)
        guard let key = settings.preSharedKey else {
            state = .done
            return Output(frames: [helloFrame(.helloAck)], outcome: .success(established))
        }
        guard let nonceText = hello.nonce, let clientNonce = Hex.decode(nonceText), clientNonce.count == AuthNonce.size
        else {
            return refuse(
                code: "auth_required", .authenticationFailed,
                "this server requires a pre-shared key; start the client with the same key",
                notice: "refusing unauthenticated client '\(info.name)': no key offered")
        }
        let serverNonce = settings.makeNonce()
        state = .serverAwaitingProof(established, clientNonce: clientNonce, serverNonce: serverNonce)
        let challenge = AuthChallenge(
            scheme: "hmac-sha256", nonce: Hex.encode(serverNonce),
            proof: Hex.encode(key.serverProof(clientNonce: clientNonce, serverNonce: serverNonce)))
        return Output(frames: [helloFrame(.helloAck, auth: challenge)])
    }

    private mutating func serverReceivedProof(
        _ frame: Frame, _ established: Established, clientNonce: [UInt8], serverNonce: [UInt8]
    ) -> Output {
        guard let key = settings.preSharedKey else { return violation("AUTH without a challenge") }
        guard let message = try? FastJSONDecoder().decode(AuthProof.self, from: frame.payload) else {
            // Answered like a wrong proof (the client gets a REFUSE saying why), not a bare close.
            return refuse(
                code: "auth_failed", .authenticationFailed,
                "malformed AUTH: its payload must be a JSON object {\"proof\": <64 hex digits>}",
                notice: "refusing client '\(established.peer.name)': malformed AUTH payload")
        }
        guard let proof = Hex.decode(message.proof),
            constantTimeEqual(proof, key.clientProof(clientNonce: clientNonce, serverNonce: serverNonce))
        else {
            return refuse(
                code: "auth_failed", .authenticationFailed,
                "authentication failed: wrong pre-shared key; use the server's key",
                notice:
                    "refusing client '\(established.peer.name)': wrong pre-shared key (or a replayed hello)")
        }
        state = .done
        return Output(frames: [Frame(kind: .authOK)], outcome: .success(established))
    }

    // MARK: Building blocks

    private func helloFrame(_ kind: FrameKind, nonce: [UInt8]? = nil, auth: AuthChallenge? = nil) -> Frame {
        var payload = HelloPayload(settings.info, nonce: nonce.map(Hex.encode), auth: auth)
        payload.maxFrame = settings.maxFrameSize
        return Self.jsonFrame(kind, payload)
    }

    package static func jsonFrame<T: Encodable>(_ kind: FrameKind, _ value: T) -> Frame {
        Frame(kind: kind, codecID: WireProtocol.jsonCodecID, payload: (try? FastJSONEncoder().encode(value)) ?? [])
    }

    private func decodeHello(_ frame: Frame) -> Result<HelloPayload, TransportError> {
        do {
            return .success(try FastJSONDecoder().decode(HelloPayload.self, from: frame.payload))
        } catch {
            let text =
                "malformed \(frame.kind): \(error); it must be a JSON object with an integer \"version\" "
                + "and a string \"name\" (\"metadata\" and \"max_frame\" optional)"
            return .failure(TransportError(.helloFailed, "hello failed: \(text)", closeReason: .protocolError(text)))
        }
    }

    private mutating func succeed(_ established: Established) -> Output {
        state = .done
        return Output(outcome: .success(established))
    }

    private mutating func fail(_ error: TransportError, text: String) -> Output {
        state = .done
        return Output(outcome: .failure(error), notice: "hello failed: \(text)")
    }

    private mutating func authFailure(_ text: String) -> Output {
        fail(TransportError(.authenticationFailed, text, closeReason: .helloFailed(text)), text: text)
    }

    private mutating func violation(_ text: String) -> Output {
        state = .done
        return Output(
            outcome: .failure(
                TransportError(.helloFailed, "hello failed: \(text)", closeReason: .protocolError(text))),
            notice: "hostile or broken peer during hello: \(text)")
    }

    private mutating func refuse(
        code: String, _ errorCode: TransportError.Code, _ text: String, notice: String? = nil
    ) -> Output {
        state = .done
        return Output(
            frames: [Self.jsonFrame(.refuse, Refusal(code: code, message: text))],
            outcome: .failure(TransportError(errorCode, text, closeReason: .helloFailed(text))),
            notice: notice ?? "refusing peer: \(text)")
    }
}

/// The one key checked before the rest of a HELLO.
package struct HelloVersion: Decodable {
    package var version: Int
}

extension Refusal {
    /// The REFUSE frame a server writes before any handshake (docs/PROTOCOL.md, "Busy"): plaintext,
    /// version 1, sequence 1 (the server's first frame; a version-1 client checks it).
    package var frameBeforeHandshake: Frame {
        var frame = HandshakeStateMachine.jsonFrame(.refuse, self)
        frame.sequence = 1
        return frame
    }
}
