import Dispatch
import Foundation
import Logging
import Messaging
import PreviewKit
@testable import ProtocolCore
import Testing

/// docs/PROTOCOL.md's preview example is produced by this test from the code: a real push (the
/// PreviewPusher against a PreviewService, protocol version 1 on loopback) through a relay that
/// keeps every byte; the frames it captured are rendered as the spec's table and hex lines, which
/// the spec must contain as they are. (The example used to be written by hand: its offer, a
/// request, showed flags 0x00 — an implementer copying it sent a message nobody answered.)
@Suite(.serialized) struct PreviewExampleTests {
    let logger = Logger(label: "preview-spec")
    static let offerID = "3f9a1c0e7b2d4a65"

    @Test func theSpecsPreviewExampleIsWhatTheCodeSends() async throws {
        let directory = try ExampleDirectory()
        defer { directory.remove() }
        _ = try directory.write("notes.txt", Array("older\n".utf8))  // the push is stored as "notes (2).txt"
        let source = try ExampleDirectory()
        defer { source.remove() }
        let file = try source.write("notes.txt", Array("hello\n".utf8))

        var configuration = ServerConfiguration(
            serviceType: PreviewProtocol.serviceType, serviceName: "Preview on bravo", peerName: "Preview on bravo")
        configuration.publish = false
        configuration.channel.security = .plaintext
        configuration.channel.pingInterval = nil  // the example leaves PINGs out
        configuration.channel.metadata = [PreviewProtocol.TXTKey.protocolVersion: String(PreviewProtocol.version)]  // as preview-server
        let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
        try await server.start()
        let store = try PreviewStore(directory: directory.path, maxSize: 1 << 32, logger: logger)
        let service = PreviewService(store: store, logger: logger)
        let events = Task { for await event in server.events { service.handle(event) } }
        let relay = try CaptureRelay(to: try #require(server.port))

        // preview-push's channel as its MessageClient makes it (the codec included), without retries.
        var client = ClientConfiguration(peerName: "preview-push").channel
        client.security = .plaintext
        client.pingInterval = nil
        let channel = try await MessageChannel.connect(to: [.ipv4Loopback(port: relay.port)], configuration: client, logger: logger)
        let pusher = PreviewPusher(channel: channel)
        let stored = try await pusher.push(path: file)
        #expect(stored.storedName == "notes (2).txt")
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  // SHA-256 of nothing
        let refused = try await channel.request(
            PreviewOffer(name: "../etc/passwd", size: 1024, sha256: empty), type: PreviewProtocol.TypeID.offer,
            expecting: PreviewOfferReply.self)
        #expect(refused.accepted == false)
        channel.close(reason: "client closing")
        _ = await channel.closed()
        await server.stop()
        await events.value
        relay.waitUntilClosed()

        let (up, down) = relay.captured()
        let client2server = try Self.frames(up)
        let server2client = try Self.frames(down)
        // The conversation's order: each row names its direction and that direction's next frame.
        let order: [Bool] = [true, false, true, false, true, true, true, false, true, false, true]
        var rows: [SpecRow] = []
        var (c, s) = (0, 0)
        for (index, fromClient) in order.enumerated() {
            let frame = fromClient ? client2server[c] : server2client[s]
            if fromClient { c += 1 } else { s += 1 }
            rows.append(SpecRow(number: index + 1, direction: fromClient ? "C→S" : "S→C", frame: frame))
        }
        #expect(c == client2server.count && s == server2client.count, "frames left: \(client2server.count - c) up, \(server2client.count - s) down")
        // The random offer id becomes the spec's.
        let realID = try #require(rows.compactMap { Self.offerID(in: $0.frame) }.first)
        let table = SpecRow.table(rows).replacingOccurrences(of: realID, with: Self.offerID)
        let spec = try String(contentsOfFile: specPath(), encoding: .utf8)
        #expect(spec.contains(table), "docs/PROTOCOL.md's preview example differs from what the code sends; it should read:\n\(table)")
        // Two frames in full.
        for frame in [rows[5].frame, rows[2].frame] {
            let hex = try frame.encoded().map { String(format: "%02x", $0) }.joined()
            #expect(spec.contains(hex), "the spec lacks the hex of \(frame.kind) \(frame.typeID):\n\(hex)")
        }
        #expect(rows[2].frame.expectsReply, "the offer is a request")
    }

    static func frames(_ bytes: [UInt8]) throws -> [Frame] {
        var decoder = FrameDecoder(checkSequence: true)
        decoder.append(contentsOf: bytes)
        var frames: [Frame] = []
        while let frame = try decoder.next() { frames.append(frame) }
        return frames
    }

    static func offerID(in frame: Frame) -> String? {
        guard frame.kind == .message, let text = String(bytes: frame.payload, encoding: .utf8),
            let range = text.range(of: #""offerID":""#)
        else { return nil }
        return String(text[range.upperBound...].prefix { $0 != "\"" })
    }
}

