import Dispatch
import Foundation
@testable import ProtocolCore

/// One row of a spec example table, rendered from a frame.
struct SpecRow {
    var number: Int
    var direction: String
    var frame: Frame

    static let header = """
        | # | dir | kind | seq | ref | flags | type id | payload |
        |---|-----|------|-----|-----|-------|---------|---------|
        """

    /// The table; `notes[n]` is a line of its own after row n (an empty row with text in the payload column).
    static func table(_ rows: [SpecRow], notes: [Int: String] = [:]) -> String {
        var lines = [header]
        for row in rows {
            lines.append(row.line)
            if let note = notes[row.number] { lines.append("|   |     |      |     |     |       |         | \(note) |") }
        }
        return lines.joined(separator: "\n") + "\n"
    }

    var line: String {
        let kind: String =
            switch frame.kind {
            case .hello: "HELLO"
            case .helloAck: "HELLO_ACK"
            case .refuse: "REFUSE"
            case .message: "MESSAGE"
            case .ping: "PING"
            case .pong: "PONG"
            case .goodbye: "GOODBYE"
            case .streamStart: "STREAM_START"
            case .streamChunk: "STREAM_CHUNK"
            case .streamEnd: "STREAM_END"
            case .session: "SESSION"
            case .ack: "ACK"
            case .auth: "AUTH"
            case .authOK: "AUTH_OK"
            }
        let flags = String(format: "0x%02x", frame.flags)
        let payload: String
        if frame.payload.isEmpty {
            payload = "empty (codec \(frame.codecID))"
        } else if frame.kind == .streamChunk {
            payload = "the \(frame.payload.count) bytes `\(frame.payload.map { String(format: "%02x", $0) }.joined())` (codec 0)"
        } else if frame.kind == .ack {
            let count = frame.payload.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            payload = "`\(frame.payload.map { String(format: "%02x", $0) }.joined())`: \(count) received (codec 0)"
        } else if frame.kind == .goodbye {
            payload = "`\(String(decoding: frame.payload, as: UTF8.self))` (UTF-8, codec 0)"
        } else {
            payload = "`\(String(decoding: frame.payload, as: UTF8.self))`\(frame.codecID == 1 ? "" : " (codec \(frame.codecID))")"
        }
        let type = frame.typeID.isEmpty ? "`\"\"`" : "`\(frame.typeID)`"
        return "| \(number) | \(direction) | \(kind) | \(frame.sequence) | \(frame.reference.map(String.init) ?? "") | \(flags) | \(type) | \(payload) |"
    }
}

func specPath() -> String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../../docs/PROTOCOL.md").path
}

/// A TCP relay on 127.0.0.1 for one connection, keeping a copy of each direction.
final class CaptureRelay: @unchecked Sendable {
    private let listenFD: Int32
    let port: UInt16
    private let lock = NSLock()
    private var up: [UInt8] = []  // guarded by lock
    private var down: [UInt8] = []  // guarded by lock
    private let done = DispatchGroup()

    init(to serverPort: UInt16) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        listen(fd, 1)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        listenFD = fd
        port = UInt16(bigEndian: address.sin_port)
        done.enter()
        DispatchQueue.global().async { [self] in
            defer { done.leave() }
            let client = accept(listenFD, nil, nil)
            close(listenFD)
            guard client >= 0 else { return }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var target = sockaddr_in()
            target.sin_family = sa_family_t(AF_INET)
            target.sin_port = serverPort.bigEndian
            target.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
            let connected = withUnsafePointer(to: &target) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0 else {
                close(client)
                close(server)
                return
            }
            let pumps = DispatchGroup()
            for (from, to, upstream) in [(client, server, true), (server, client, false)] {
                pumps.enter()
                DispatchQueue.global().async {
                    defer { pumps.leave() }
                    self.pump(from: from, to: to, upstream: upstream)
                }
            }
            pumps.wait()
            close(client)
            close(server)
        }
    }

    private func pump(from: Int32, to: Int32, upstream: Bool) {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = recv(from, &buffer, buffer.count, 0)
            guard count > 0 else { break }
            lock.withLock { if upstream { up += buffer[0..<count] } else { down += buffer[0..<count] } }
            var sent = 0
            while sent < count {
                let n = buffer.withUnsafeBytes { send(to, $0.baseAddress! + sent, count - sent, Int32(MSG_NOSIGNAL)) }
                guard n > 0 else { return }
                sent += n
            }
        }
        shutdown(to, Int32(SHUT_WR))
    }

    func captured() -> (up: [UInt8], down: [UInt8]) { lock.withLock { (up, down) } }

    /// Waits (at most 10 s) until both directions ended.
    func waitUntilClosed() { _ = done.wait(timeout: .now() + 10) }
}

/// A fresh directory under /tmp, removed by `remove()`.
struct ExampleDirectory {
    let path: String

    init() throws {
        var template = Array("/tmp/spec-example-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw ExampleError("mkdtemp failed") }
        path = String(cString: made)
    }

    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        let file = path + "/" + name
        guard FileManager.default.createFile(atPath: file, contents: Data(bytes)) else { throw ExampleError("cannot write \(file)") }
        return file
    }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

struct ExampleError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension Frame {
    /// The whole frame in lowercase hex, length prefix included.
    var hex: String { get throws { try encoded().map { String(format: "%02x", $0) }.joined() } }
}
