// Compares FastJSON with Foundation's JSONEncoder/JSONDecoder in one run.
// Build and run with `Benchmarks/run-codec.sh` (release mode).
import FastJSON
import Foundation

struct Sample: Codable, Equatable {
    var id: Int
    var name: String
    var value: Double
    var tags: [String]
}

/// A nested document of about 10 KiB (54 users with addresses, roles and scores).
struct Document: Codable, Equatable {
    struct User: Codable, Equatable {
        var id: Int
        var name: String
        var email: String
        var active: Bool
        var score: Double
        var roles: [String]
        var address: Address?
    }
    struct Address: Codable, Equatable {
        var street: String
        var city: String
        var zip: String
        var location: [Double]
    }
    var version: Int
    var generated: String
    var users: [User]
    var counts: [String: Int]

    static func make(users count: Int = 54) -> Document {
        var users: [User] = []
        for i in 0..<count {
            var address: Address?
            if i % 4 != 0 {
                let location: [Double] = [47.37 + Double(i) / 100, 8.54]
                address = Address(street: "\(i) Main Street", city: "Zürich", zip: "80\(i)", location: location)
            }
            let roles: [String] = i % 2 == 0 ? ["admin", "dev"] : ["guest"]
            users.append(User(id: 1000 + i, name: "User number \(i)", email: "user\(i)@example.org",
                              active: i % 3 != 0, score: Double(i) * 1.25 + 0.1, roles: roles, address: address))
        }
        return Document(version: 3, generated: "2026-11-21T01:00:00Z", users: users,
                        counts: ["alpha": 1, "beta": 2, "gamma": 3])
    }
}

@inline(never)
func blackHole<T>(_ value: T) {
    withExtendedLifetime(value) {}
}

/// ns per call of `body` over one batch of `count` calls.
func time(_ count: Int, _ body: () throws -> Void) rethrows -> Double {
    let clock = ContinuousClock()
    let start = clock.now
    for _ in 0..<count { try body() }
    let elapsed = clock.now - start
    let ns = Double(elapsed.components.seconds) * 1e9 + Double(elapsed.components.attoseconds) / 1e9
    return ns / Double(count)
}

/// A batch size that takes about 10 ms.
func batchSize(_ body: () throws -> Void) rethrows -> Int {
    var count = 1
    while try time(count, body) * Double(count) < 10_000_000 { count *= 2 }
    return count
}

/// Times both codecs in alternating ~10 ms batches for `seconds` in total, so that both see the
/// same machine conditions, and returns each one's best batch (ns per operation).
func compare(seconds: Double, foundation: () throws -> Void, fast: () throws -> Void) rethrows -> (Double, Double) {
    let foundationBatch = try batchSize(foundation)
    let fastBatch = try batchSize(fast)
    var best = (Double.infinity, Double.infinity)
    let clock = ContinuousClock()
    let deadline = clock.now + .milliseconds(Int64(seconds * 1000))
    repeat {
        best.0 = min(best.0, try time(foundationBatch, foundation))
        best.1 = min(best.1, try time(fastBatch, fast))
    } while clock.now < deadline
    return best
}

func format(_ ns: Double) -> String {
    ns >= 10_000 ? String(format: "%8.1f µs", ns / 1000) : String(format: "%8.0f ns", ns)
}

func padded(_ text: String, _ width: Int) -> String {
    text.count >= width ? text : text + String(repeating: " ", count: width - text.count)
}

func row(_ name: String, foundation: Double, fast: Double) {
    let speedup = foundation / fast
    print(padded(name, 24) + format(foundation) + "  " + format(fast)
        + String(format: "  %11.0f  %11.0f  %6.1f×", 1e9 / foundation, 1e9 / fast, speedup))
}

let seconds = Double(CommandLine.arguments.dropFirst().first ?? "") ?? 1.0

let sample = Sample(id: 123_456, name: "abcdefghijklmnop", value: 3.14159, tags: ["red", "green", "blue"])
let document = Document.make()

let foundationEncoder = JSONEncoder()
let foundationDecoder = JSONDecoder()
let fastEncoder = FastJSONEncoder()
let fastDecoder = FastJSONDecoder()

let sampleBytes = try fastEncoder.encode(sample)
let sampleData = try foundationEncoder.encode(sample)
let documentBytes = try fastEncoder.encode(document)
let documentData = try foundationEncoder.encode(document)

// Sanity: both directions agree before timing anything.
let checks = [
    try foundationDecoder.decode(Sample.self, from: Data(sampleBytes)) == sample,
    try fastDecoder.decode(Sample.self, from: sampleData) == sample,
    try foundationDecoder.decode(Document.self, from: Data(documentBytes)) == document,
    try fastDecoder.decode(Document.self, from: documentData) == document,
]
precondition(!checks.contains(false), "codecs disagree")

print("Sample: \(sampleBytes.count) bytes \(String(decoding: sampleBytes, as: UTF8.self))")
print("Document: \(documentBytes.count) bytes (FastJSON), \(documentData.count) bytes (Foundation)")
print("Each case: alternating ~10 ms batches for \(seconds) s, best batch per codec; ops/s = 1e9 / ns.")
print("")
print(padded("operation", 24) + "Foundation    FastJSON   Foundation/s   FastJSON/s  speed-up")

let sampleEncode = try compare(seconds: seconds,
                               foundation: { blackHole(try foundationEncoder.encode(sample)) },
                               fast: { blackHole(try fastEncoder.encode(sample)) })
row("Sample encode", foundation: sampleEncode.0, fast: sampleEncode.1)

var reusable: [UInt8] = []
reusable.reserveCapacity(256)
let sampleEncodeReuse = try compare(seconds: seconds,
                                    foundation: { blackHole(try foundationEncoder.encode(sample)) },
                                    fast: {
                                        reusable.removeAll(keepingCapacity: true)
                                        try fastEncoder.encode(sample, into: &reusable)
                                    })
row("Sample encode(into:)", foundation: sampleEncodeReuse.0, fast: sampleEncodeReuse.1)

let sampleDecode = try compare(seconds: seconds,
                               foundation: { blackHole(try foundationDecoder.decode(Sample.self, from: sampleData)) },
                               fast: { blackHole(try fastDecoder.decode(Sample.self, from: sampleBytes)) })
row("Sample decode", foundation: sampleDecode.0, fast: sampleDecode.1)

let documentEncode = try compare(seconds: seconds,
                                 foundation: { blackHole(try foundationEncoder.encode(document)) },
                                 fast: { blackHole(try fastEncoder.encode(document)) })
row("10 KiB document encode", foundation: documentEncode.0, fast: documentEncode.1)

let documentDecode = try compare(seconds: seconds,
                                 foundation: { blackHole(try foundationDecoder.decode(Document.self, from: documentData)) },
                                 fast: { blackHole(try fastDecoder.decode(Document.self, from: documentBytes)) })
row("10 KiB document decode", foundation: documentDecode.0, fast: documentDecode.1)

let mibPerSecond = Double(documentBytes.count) / documentDecode.1 * 1e9 / 1_048_576
print("")
print(String(format: "FastJSON 10 KiB decode throughput: %.0f MiB/s", mibPerSecond))
