import Crypto
import Foundation
import Testing

import ProtocolCore

/// The cacophony test vectors for `*_25519_ChaChaPoly_SHA256` (../shared/noise): every pattern the
/// specification defines, parsed from its text, run byte for byte — handshake messages, transport
/// messages after `Split()`, and the final handshake hash.
@Suite struct NoiseVectorTests {
    static let shared = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../../shared/noise")

    struct Vector: Decodable {
        struct Message: Decodable {
            var payload: String
            var ciphertext: String
        }
        var protocol_name: String
        var init_prologue: String
        var init_psks: [String]?
        var init_static: String?
        var init_ephemeral: String?
        var init_remote_static: String?
        var resp_prologue: String
        var resp_psks: [String]?
        var resp_static: String?
        var resp_ephemeral: String?
        var resp_remote_static: String?
        var handshake_hash: String?
        var messages: [Message]
    }

    struct File: Decodable { var vectors: [Vector] }

    static func hex(_ text: String) -> [UInt8] {
        var out: [UInt8] = []
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            out.append(UInt8(text[index..<next], radix: 16)!)
            index = next
        }
        return out
    }

    static func key(_ text: String?) throws -> Curve25519.KeyAgreement.PrivateKey? {
        try text.map { try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: hex($0)) }
    }

    static let patterns: [String: NoisePattern] = {
        let text = (try? String(contentsOf: shared.appendingPathComponent("noise.md"), encoding: .utf8)) ?? ""
        return NoisePattern.parseDefinitions(text)
    }()

    /// `XXpsk3` → XX with psk modifiers [3].
    static func pattern(for protocolName: String) -> NoisePattern? {
        let parts = protocolName.split(separator: "_")
        guard parts.count == 5 else { return nil }
        var name = String(parts[1])
        var modifiers: [Int] = []
        while let range = name.range(of: "psk", options: .backwards) {
            guard let position = Int(name[range.upperBound...]) else { return nil }
            modifiers.insert(position, at: 0)
            name = String(name[..<range.lowerBound])
            if name.hasSuffix("+") { name.removeLast() }
        }
        return patterns[name]?.applying(pskModifiers: modifiers)
    }

    @Test func theSpecificationDefinesEveryFundamentalAndDeferredPattern() {
        // 3 one-way + 12 fundamental + 23 deferred interactive patterns.
        #expect(Self.patterns.count >= 38, "parsed \(Self.patterns.keys.sorted())")
        #expect(Self.patterns["XX"] == NoisePattern.XX)
        #expect(Self.patterns["NK"]?.responderPreMessage == [.s])
    }

    @Test func everyVectorPasses() throws {
        let data = try Data(contentsOf: Self.shared.appendingPathComponent("cacophony-25519-ChaChaPoly-SHA256.json"))
        let vectors = try JSONDecoder().decode(File.self, from: data).vectors
        #expect(vectors.count == 59)
        var passed: [String] = []
        for vector in vectors {
            let pattern = try #require(Self.pattern(for: vector.protocol_name), "no pattern for \(vector.protocol_name)")
            var initiator = try NoiseHandshake(
                pattern: pattern, role: .initiator, protocolName: vector.protocol_name,
                prologue: Self.hex(vector.init_prologue), localStatic: Self.key(vector.init_static),
                localEphemeral: Self.key(vector.init_ephemeral), remoteStatic: vector.init_remote_static.map(Self.hex),
                psks: (vector.init_psks ?? []).map(Self.hex))
            var responder = try NoiseHandshake(
                pattern: pattern, role: .responder, protocolName: vector.protocol_name,
                prologue: Self.hex(vector.resp_prologue), localStatic: Self.key(vector.resp_static),
                localEphemeral: Self.key(vector.resp_ephemeral), remoteStatic: vector.resp_remote_static.map(Self.hex),
                psks: (vector.resp_psks ?? []).map(Self.hex))
            var transport: (initiatorSend: NoiseCipherState, initiatorReceive: NoiseCipherState,
                responderSend: NoiseCipherState, responderReceive: NoiseCipherState)?
            for (index, message) in vector.messages.enumerated() {
                let payload = Self.hex(message.payload)
                let fromInitiator = pattern.isOneWay || index % 2 == 0
                let ciphertext: [UInt8]
                let received: [UInt8]
                if !initiator.isComplete || !responder.isComplete {
                    if fromInitiator {
                        ciphertext = try initiator.writeMessage(payload: payload)
                        received = try responder.readMessage(ciphertext)
                    } else {
                        ciphertext = try responder.writeMessage(payload: payload)
                        received = try initiator.readMessage(ciphertext)
                    }
                    if initiator.isComplete && responder.isComplete {
                        let i = try initiator.split()
                        let r = try responder.split()
                        transport = (i.send, i.receive, r.send, r.receive)
                        if let expected = vector.handshake_hash {
                            #expect(initiator.handshakeHash == Self.hex(expected), "\(vector.protocol_name) hash")
                            #expect(responder.handshakeHash == initiator.handshakeHash)
                        }
                    }
                } else {
                    guard var t = transport else { throw NoiseError("no transport") }
                    if fromInitiator {
                        ciphertext = try t.initiatorSend.encrypt(ad: [], payload)
                        received = try t.responderReceive.decrypt(ad: [], ciphertext)
                    } else {
                        ciphertext = try t.responderSend.encrypt(ad: [], payload)
                        received = try t.initiatorReceive.decrypt(ad: [], ciphertext)
                    }
                    transport = t
                }
                #expect(ciphertext == Self.hex(message.ciphertext), "\(vector.protocol_name) message \(index)")
                #expect(received == payload)
            }
            passed.append(vector.protocol_name)
        }
        #expect(passed.count == 59)
    }

    /// A flipped bit in a transport message fails authentication; so does a replay (the nonce moved on).
    @Test func tamperingAndReplayFail() throws {
        var initiator = try NoiseHandshake(
            pattern: .XX, role: .initiator, protocolName: "Noise_XX_25519_ChaChaPoly_SHA256", prologue: [],
            localStatic: .init())
        var responder = try NoiseHandshake(
            pattern: .XX, role: .responder, protocolName: "Noise_XX_25519_ChaChaPoly_SHA256", prologue: [],
            localStatic: .init())
        _ = try responder.readMessage(try initiator.writeMessage(payload: []))
        _ = try initiator.readMessage(try responder.writeMessage(payload: []))
        _ = try responder.readMessage(try initiator.writeMessage(payload: []))
        var (send, _) = try initiator.split()
        var (_, receive) = try responder.split()
        let first = try send.encrypt(ad: [], Array("hello".utf8))
        var flipped = first
        flipped[2] ^= 0x01
        var copy = receive
        #expect(throws: NoiseError.self) { _ = try copy.decrypt(ad: [], flipped) }
        #expect(try receive.decrypt(ad: [], first) == Array("hello".utf8))
        #expect(throws: NoiseError.self) { _ = try receive.decrypt(ad: [], first) }  // replayed
        // Rekey on both sides keeps them in step.
        send.rekey()
        receive.rekey()
        let after = try send.encrypt(ad: [], [1, 2, 3])
        #expect(try receive.decrypt(ad: [], after) == [1, 2, 3])
    }
}
