// libFuzzer target for FastJSON's decoder (and, on inputs it accepts, the encoder).
// Built by run-fuzz-json.sh together with Sources/FastJSON/*.swift:
//   swiftc -sanitize=fuzzer,address -parse-as-library -O FuzzJSON.swift ../../Sources/FastJSON/*.swift
// Every accepted input is re-encoded and decoded again; the result must be the same value.

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct FuzzSample: Codable, Equatable {
    var id: Int
    var name: String
    var value: Double
    var tags: [String]
    var flag: Bool?
    var nested: [String: Int]?
    var small: Int8?
    var big: UInt64?
    var ratio: Float?
    var when: Date?
    var blob: Data?
    var link: URL?
    var amount: Decimal?
}

enum FuzzShape: Codable, Equatable {
    case circle(radius: Double)
    case labeled(String, Int)
    case group([FuzzShape])
    case empty
}

@inline(__always)
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("FastJSON fuzz invariant violated: \(message())") }
}

/// Decodes `bytes` as `T`; if that succeeds, encoding must succeed and decode to an equal value.
func roundTrip<T: Codable & Equatable>(_ type: T.Type, _ bytes: UnsafeRawBufferPointer) {
    guard let value = try? FastJSONDecoder().decode(T.self, from: bytes) else { return }
    let encoded: [UInt8]
    do {
        encoded = try FastJSONEncoder().encode(value)
    } catch {
        fatalError("FastJSON fuzz: decoded \(T.self) but could not encode it: \(error)")
    }
    do {
        let again = try FastJSONDecoder().decode(T.self, from: encoded)
        check(again == value, "\(T.self) changed in a round trip: \(String(decoding: encoded, as: UTF8.self))")
    } catch {
        fatalError("FastJSON fuzz: own output rejected: \(error) in \(String(decoding: encoded, as: UTF8.self))")
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSON(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    roundTrip(JSONValue.self, bytes)
    roundTrip(FuzzSample.self, bytes)
    roundTrip([FuzzSample].self, bytes)
    roundTrip(FuzzShape.self, bytes)
    roundTrip([String: [Int?]].self, bytes)
    roundTrip([Double].self, bytes)
    roundTrip([Int64: String].self, bytes)
    roundTrip(String.self, bytes)
    // The other entry points must agree with the raw-buffer one.
    let viaArray = try? FastJSONDecoder().decode(JSONValue.self, from: Array(bytes))
    let viaRaw = try? FastJSONDecoder().decode(JSONValue.self, from: bytes)
    check(viaArray == viaRaw, "[UInt8] and raw-buffer decoding disagree")
    // A small depth limit exercises the limit on every nested input.
    var shallow = FastJSONDecoder()
    shallow.maximumDepth = 3
    _ = try? shallow.decode(JSONValue.self, from: bytes)
    return 0
}
