import FastJSON
import Foundation
import Testing

// MARK: - Helpers

/// Encodes with FastJSON and returns the text.
func fastText<T: Encodable>(_ value: T) throws -> String {
    String(decoding: try FastJSONEncoder().encode(value), as: UTF8.self)
}

func foundationDecode<T: Decodable>(_ type: T.Type, _ text: String) throws -> T {
    try JSONDecoder().decode(type, from: Data(text.utf8))
}

func fastDecode<T: Decodable>(_ type: T.Type, _ text: String) throws -> T {
    try FastJSONDecoder().decode(type, from: Array(text.utf8))
}

/// Round-trips `value` in all directions: FastJSON → Foundation, Foundation → FastJSON and
/// FastJSON → FastJSON, each time expecting an equal value.
func expectRoundTrip<T: Codable & Equatable>(
    _ value: T, sourceLocation: SourceLocation = #_sourceLocation
) throws {
    let ours = try FastJSONEncoder().encode(value)
    let theirs = try JSONEncoder().encode(value)
    let oursByFoundation = try JSONDecoder().decode(T.self, from: Data(ours))
    #expect(oursByFoundation == value, "Foundation decoded \(String(decoding: ours, as: UTF8.self))",
            sourceLocation: sourceLocation)
    let theirsByUs = try FastJSONDecoder().decode(T.self, from: theirs)
    #expect(theirsByUs == value, "FastJSON decoded \(String(decoding: theirs, as: UTF8.self))",
            sourceLocation: sourceLocation)
    let oursByUs = try FastJSONDecoder().decode(T.self, from: ours)
    #expect(oursByUs == value, sourceLocation: sourceLocation)
    // Our output is also valid JSON for JSONSerialization.
    #expect(throws: Never.self, sourceLocation: sourceLocation) {
        try JSONSerialization.jsonObject(with: Data(ours), options: [.fragmentsAllowed])
    }
}

/// Decodes `text` with both decoders, expecting equal values or both failing with the same
/// `DecodingError` case.
func expectSameDecoding<T: Decodable & Equatable>(
    _ type: T.Type, _ text: String, sourceLocation: SourceLocation = #_sourceLocation
) {
    let theirs = Result { try foundationDecode(type, text) }
    let ours = Result { try fastDecode(type, text) }
    switch (theirs, ours) {
    case (.success(let a), .success(let b)):
        #expect(a == b, "\(T.self) from \(text): Foundation \(a), FastJSON \(b)", sourceLocation: sourceLocation)
    case (.failure(let a), .failure(let b)):
        #expect(errorCase(a) == errorCase(b), "\(T.self) from \(text): Foundation \(a), FastJSON \(b)",
                sourceLocation: sourceLocation)
    case (.success(let a), .failure(let b)):
        Issue.record("\(T.self) from \(text): Foundation decoded \(a), FastJSON threw \(b)", sourceLocation: sourceLocation)
    case (.failure(let a), .success(let b)):
        Issue.record("\(T.self) from \(text): Foundation threw \(a), FastJSON decoded \(b)", sourceLocation: sourceLocation)
    }
}

func errorCase(_ error: any Error) -> String {
    switch error as? DecodingError {
    case .typeMismatch?: "typeMismatch"
    case .valueNotFound?: "valueNotFound"
    case .keyNotFound?: "keyNotFound"
    case .dataCorrupted?: "dataCorrupted"
    default: "other: \(type(of: error))"
    }
}

/// Bit-exact floating-point equality (distinguishes -0.0 from 0.0).
struct Bits<F: BinaryFloatingPoint & Codable & Sendable>: Codable, Equatable, Sendable {
    var value: F
    static func == (a: Bits, b: Bits) -> Bool {
        a.value.sign == b.value.sign && a.value == b.value
    }
}

// MARK: - Model types

struct Sample: Codable, Equatable {
    var id: Int
    var name: String
    var value: Double
    var tags: [String]
}

struct Inner: Codable, Equatable, Hashable {
    var a: Int
    var b: String?
}

struct Outer: Codable, Equatable {
    var inner: Inner
    var list: [Inner]
    var map: [String: Inner]
    var optional: Inner?
    var nested: [[Int]]
    var matrix: [String: [Int: [String]]]
}

struct Optionals: Codable, Equatable {
    var int: Int?
    var string: String?
    var double: Double?
    var bool: Bool?
    var array: [Int?]?
    var inner: Inner?
    var float: Float?
    var int8: Int8?
    var uint64: UInt64?
}

enum Color: String, Codable, Equatable { case red, green, blue = "BLUE" }
enum Level: Int, Codable, Equatable { case low = 1, high = 10 }

enum Shape: Codable, Equatable {
    case circle(radius: Double)
    case rect(width: Double, height: Double)
    case point
    case labeled(String, Int)
    case nested(Inner, [Shape])
}

struct Limits: Codable, Equatable {
    var i8: [Int8] = [.min, -1, 0, 1, .max]
    var i16: [Int16] = [.min, .max]
    var i32: [Int32] = [.min, .max]
    var i64: [Int64] = [.min, .min + 1, -1, 0, .max]
    var int: [Int] = [.min, .max, 0, 9, 10, 99, 100, -9, -10]
    var u8: [UInt8] = [0, .max]
    var u16: [UInt16] = [.max]
    var u32: [UInt32] = [.max]
    var u64: [UInt64] = [0, .max, .max - 1, 1 << 63]
    var uint: [UInt] = [.max]
    var single: Int64 = .min
    var singleU: UInt64 = .max
}

struct Foundations: Codable, Equatable {
    var date: Date
    var dates: [Date]
    var data: Data
    var emptyData: Data
    var url: URL
    var urls: [URL]
    var decimal: Decimal
    var uuid: UUID
}

class Animal: Codable, Equatable, @unchecked Sendable {  // immutable after init
    let name: String
    init(name: String) { self.name = name }
    static func == (a: Animal, b: Animal) -> Bool { a.isEqual(to: b) }
    func isEqual(to other: Animal) -> Bool { type(of: self) == type(of: other) && name == other.name }
}

/// A subclass that encodes its superclass through `superEncoder()`, like the Codable docs suggest.
final class Dog: Animal, @unchecked Sendable {
    let tricks: [String]
    init(name: String, tricks: [String]) {
        self.tricks = tricks
        super.init(name: name)
    }
    enum CodingKeys: String, CodingKey { case tricks }
    required init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        tricks = try container.decode([String].self, forKey: .tricks)
        try super.init(from: container.superDecoder())
    }
    override func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(tricks, forKey: .tricks)
        try super.encode(to: container.superEncoder())
    }
    override func isEqual(to other: Animal) -> Bool {
        guard let other = other as? Dog else { return false }
        return name == other.name && tricks == other.tricks
    }
}

/// A subclass that shares its encoder with the superclass (same keyed container).
final class Cat: Animal, @unchecked Sendable {
    let lives: Int
    init(name: String, lives: Int) {
        self.lives = lives
        super.init(name: name)
    }
    enum CodingKeys: String, CodingKey { case lives }
    required init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        lives = try container.decode(Int.self, forKey: .lives)
        try super.init(from: decoder)
    }
    override func encode(to encoder: any Encoder) throws {
        try super.encode(to: encoder)
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(lives, forKey: .lives)
    }
    override func isEqual(to other: Animal) -> Bool {
        guard let other = other as? Cat else { return false }
        return name == other.name && lives == other.lives
    }
}

/// Hand-written Codable using nested keyed and unkeyed containers and `superEncoder(forKey:)`.
struct Manual: Codable, Equatable {
    var x: Int
    var y: Double
    var points: [[Int]]
    var child: Inner
    var label: String

    enum Keys: String, CodingKey { case geometry, points, child, label }
    enum GeometryKeys: String, CodingKey { case x, y }

    init(x: Int, y: Double, points: [[Int]], child: Inner, label: String) {
        (self.x, self.y, self.points, self.child, self.label) = (x, y, points, child, label)
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Keys.self)
        var geometry = container.nestedContainer(keyedBy: GeometryKeys.self, forKey: .geometry)
        try geometry.encode(x, forKey: .x)
        try geometry.encode(y, forKey: .y)
        var points = container.nestedUnkeyedContainer(forKey: .points)
        for point in self.points {
            var pair = points.nestedUnkeyedContainer()
            for coordinate in point { try pair.encode(coordinate) }
        }
        try child.encode(to: container.superEncoder(forKey: .child))
        try container.encode(label, forKey: .label)
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Keys.self)
        let geometry = try container.nestedContainer(keyedBy: GeometryKeys.self, forKey: .geometry)
        x = try geometry.decode(Int.self, forKey: .x)
        y = try geometry.decode(Double.self, forKey: .y)
        var pointsContainer = try container.nestedUnkeyedContainer(forKey: .points)
        var points: [[Int]] = []
        while !pointsContainer.isAtEnd {
            var pair = try pointsContainer.nestedUnkeyedContainer()
            var point: [Int] = []
            while !pair.isAtEnd { point.append(try pair.decode(Int.self)) }
            points.append(point)
        }
        self.points = points
        child = try Inner(from: container.superDecoder(forKey: .child))
        label = try container.decode(String.self, forKey: .label)
    }
}

/// Writes an array of objects through `nestedContainer(keyedBy:)` of an unkeyed container.
struct Rows: Codable, Equatable {
    var rows: [(String, Int)]
    static func == (a: Rows, b: Rows) -> Bool { a.rows.elementsEqual(b.rows) { $0 == $1 } }
    enum RowKeys: String, CodingKey { case name, count }
    init(rows: [(String, Int)]) { self.rows = rows }
    func encode(to encoder: any Encoder) throws {
        var container = encoder.unkeyedContainer()
        for (name, count) in rows {
            var row = container.nestedContainer(keyedBy: RowKeys.self)
            try row.encode(name, forKey: .name)
            try row.encode(count, forKey: .count)
        }
        try container.encodeNil()
    }
    init(from decoder: any Decoder) throws {
        var container = try decoder.unkeyedContainer()
        var rows: [(String, Int)] = []
        while !container.isAtEnd {
            if try container.decodeNil() { continue }
            let row = try container.nestedContainer(keyedBy: RowKeys.self)
            rows.append((try row.decode(String.self, forKey: .name), try row.decode(Int.self, forKey: .count)))
        }
        self.rows = rows
    }
}

/// A value that encodes nothing at all (Foundation writes `{}` for it when nested).
struct Nothing: Codable, Equatable {
    init() {}
    init(from decoder: any Decoder) throws {}
    func encode(to encoder: any Encoder) throws {}
}

struct HoldsNothing: Codable, Equatable {
    var nothing: Nothing
    var list: [Nothing]
}

/// A generic wrapper to round-trip single values inside an object.
struct Box<T: Codable & Equatable & Sendable>: Codable, Equatable, Sendable {
    var value: T
}

/// A ~10 KiB nested document, also used by the benchmark.
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

    static func make(users count: Int = 40) -> Document {
        var users: [User] = []
        for i in 0..<count {
            var address: Address?
            if i % 4 != 0 {
                let location: [Double] = [47.37 + Double(i) / 100, 8.54]
                address = Address(street: "\(i) Main Street", city: "Zürich", zip: "80\(i)", location: location)
            }
            let roles: [String] = i % 2 == 0 ? ["admin", "dev"] : ["guest"]
            let score = Double(i) * 1.25 + 0.1
            users.append(User(id: 1000 + i, name: "User number \(i)", email: "user\(i)@example.org",
                              active: i % 3 != 0, score: score, roles: roles, address: address))
        }
        return Document(version: 3, generated: "2026-11-21T01:00:00Z", users: users,
                        counts: ["alpha": 1, "beta": 2, "gamma": 3])
    }
}
