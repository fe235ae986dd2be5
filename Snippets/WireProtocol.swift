// The wire protocol by hand: a plaintext (version 1) server, and a client that writes and
// reads raw frames on a loopback socket — HELLO, HELLO_ACK, a request and its reply, GOODBYE.

import Foundation
import Logging
import Messaging

// snippet.hide
// Bounded: this program ends within 10 seconds whatever happens.
DispatchQueue.global().asyncAfter(deadline: .now() + 10) {
    print("wire: timed out")
    exit(1)
}
func fail(_ message: String) -> Never {
    print("wire: \(message)")
    exit(1)
}
extension Array where Element == UInt8 {
    var hex: String { map { String(format: "%02x", $0) }.joined() }
}
// snippet.show

// snippet.frame
/// One frame: a 4-byte length, then kind, codec, flags, the type id, the sequence number,
/// the optional reference and the payload. Every integer is big-endian.
struct RawFrame {
    var kind: UInt8
    var codec: UInt8 = 1  // 0 raw bytes, 1 JSON
    var flags: UInt8 = 0  // 0x01 reference present, 0x02 request, 0x04 error reply
    var type = ""
    var sequence: UInt64
    var reference: UInt64? = nil
    var payload: [UInt8] = []

    var bytes: [UInt8] {
        var body: [UInt8] = [kind, codec, flags | (reference == nil ? 0 : 0x01), UInt8(type.utf8.count)]
        body += Array(type.utf8)
        body += withUnsafeBytes(of: sequence.bigEndian, Array.init)
        if let reference { body += withUnsafeBytes(of: reference.bigEndian, Array.init) }
        body += payload
        return withUnsafeBytes(of: UInt32(body.count).bigEndian, Array.init) + body
    }
}
// snippet.end

// snippet.hide
/// Blocking reads on a socket with a receive timeout (this is a demo, not how the library reads).
func readExactly(_ socket: Int32, _ count: Int) -> [UInt8] {
    var buffer = [UInt8](repeating: 0, count: count)
    var done = 0
    while done < count {
        let n = buffer.withUnsafeMutableBytes { recv(socket, $0.baseAddress! + done, count - done, 0) }
        guard n > 0 else { fail("the connection ended or timed out (read \(done) of \(count) bytes)") }
        done += n
    }
    return buffer
}

func readFrame(_ socket: Int32) -> RawFrame {
    let length = readExactly(socket, 4).reduce(0) { $0 << 8 | Int($1) }
    let body = readExactly(socket, length)
    let typeLength = Int(body[3])
    func integer(at offset: Int) -> UInt64 { body[offset..<offset + 8].reduce(0) { $0 << 8 | UInt64($1) } }
    let hasReference = body[2] & 0x01 != 0
    let afterSequence = 4 + typeLength + 8
    return RawFrame(
        kind: body[0], codec: body[1], flags: body[2] & ~0x01,
        type: String(decoding: body[4..<4 + typeLength], as: UTF8.self),
        sequence: integer(at: 4 + typeLength),
        reference: hasReference ? integer(at: afterSequence) : nil,
        payload: Array(body[(afterSequence + (hasReference ? 8 : 0))...]))
}

func send(_ socket: Int32, _ frame: RawFrame) {
    let bytes = frame.bytes
    guard bytes.withUnsafeBytes({ Glibc.send(socket, $0.baseAddress, $0.count, 0) }) == bytes.count else {
        fail("send failed")
    }
}

func connectLoopback(port: UInt16) -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var timeout = timeval(tv_sec: 5, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let result = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard result == 0 else { fail("cannot connect to port \(port)") }
    return fd
}

var logger = Logger(label: "wire")
logger.logLevel = .error
// snippet.show

// snippet.server
// A server that speaks protocol version 1 (plaintext): frames directly on TCP.
var configuration = ServerConfiguration(serviceType: "_echo._tcp", serviceName: "echo")
configuration.publish = false
configuration.channel.security = .plaintext
let server = MessageServer(configuration: configuration, discovery: nil, logger: logger)
try await server.start()
let serving = Task.detached {
    for await event in server.events {
        if case .received(let connection, let request) = event, request.expectsReply,
            let value = try? request.decode([String: String].self)
        {
            try? await connection.reply(to: request, with: value, type: "echoed")
        }
    }
}
// snippet.end

// snippet.exchange
let fd = connectLoopback(port: server.port!)

// HELLO (kind 0x01, sequence 1): version, name, the largest frame this side accepts.
let hello = RawFrame(kind: 0x01, sequence: 1, payload: Array(#"{"max_frame":16777216,"name":"raw","version":1}"#.utf8))
print("HELLO     ", hello.bytes.hex)
send(fd, hello)
let ack = readFrame(fd)  // HELLO_ACK (0x02), or REFUSE (0x03) with a code and a message
guard ack.kind == 0x02 else { fail("no HELLO_ACK: kind \(ack.kind) \(String(decoding: ack.payload, as: UTF8.self))") }
print("HELLO_ACK ", String(decoding: ack.payload, as: UTF8.self))

// A request: MESSAGE (0x10) with flag 0x02, type id "echo", JSON payload, sequence 2.
let request = RawFrame(kind: 0x10, flags: 0x02, type: "echo", sequence: 2, payload: Array(#"{"text":"hi"}"#.utf8))
print("request   ", request.bytes.hex)
send(fd, request)

// The reply is a MESSAGE whose reference is the request's sequence number. A PING (0x11) may
// come first: answer it with a PONG (0x12) that names it, as the heartbeat expects.
var sequence: UInt64 = 2
var reply = readFrame(fd)
while reply.kind == 0x11 {
    sequence += 1
    send(fd, RawFrame(kind: 0x12, codec: 0, sequence: sequence, reference: reply.sequence))
    reply = readFrame(fd)
}
guard reply.kind == 0x10, reply.reference == 2 else { fail("unexpected frame: kind \(reply.kind)") }
print("reply     ", reply.type, String(decoding: reply.payload, as: UTF8.self), "to #\(reply.reference!)")

// GOODBYE (0x13) with a reason; nothing is sent after it.
send(fd, RawFrame(kind: 0x13, codec: 0, sequence: sequence + 1, payload: Array("done".utf8)))
close(fd)
// snippet.end

await server.stop()
await serving.value
print("wire: ok")
