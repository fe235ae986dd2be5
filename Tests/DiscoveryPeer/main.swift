// A scriptable DNS-SD peer for the integration tests: one ServiceDiscovery (backend chosen on the
// command line), driven by commands on stdin, reporting on stdout, one line each, every line
// prefixed with the CLOCK_MONOTONIC time in nanoseconds (shared by every network namespace, so
// two peers' lines can be compared):
//
//   discovery-peer [avahi|embedded|automatic]
//   publish NAME TYPE PORT [key=value ...]   → PUBLISHED name | RENAMED from to | FAILED ...
//                                              wide-area: REGISTERED name in domain | WA-RENAMED from -> to in domain
//                                              | REGISTER-FAILED domain code: message
//   txt key=value ...                        → TXT-UPDATED        (the last publication)
//   unpublish                                → UNPUBLISHED
//   browse TYPE                              → ADDED name | REMOVED name | ALLFORNOW   (resolves each
//                                              added service once: RESOLVED name host port txt addresses)
//   resolve NAME                             → RESOLVED … (a browsed service, in every place it was found)
//   watch NAME TYPE                          → WATCH name txt
//   rss                                      → RSS kilobytes
//   quit                                     → shutdown, exit 0 (also at end of input)
import Discovery
import Dispatch
import Foundation
import Logging
import Synchronization

signal(SIGPIPE, SIG_IGN)

func monotonic() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

let outputLock = NSLock()
func say(_ text: String) {
    outputLock.lock()
    defer { outputLock.unlock() }
    FileHandle.standardOutput.write(Data("\(monotonic()) \(text)\n".utf8))
}

func residentKiB() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
    else { return 0 }
    return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
}

func txtRecord(_ entries: ArraySlice<String>) -> TXTRecord {
    var txt = TXTRecord()
    for entry in entries {
        let parts = entry.split(separator: "=", maxSplits: 1)
        txt[String(parts[0])] = parts.count > 1 ? String(parts[1]) : ""
    }
    return txt
}

/// Lines of stdin from a Dispatch read source (no blocking read on a Swift concurrency thread).
func stdinLines() -> AsyncStream<String> {
    let (stream, continuation) = AsyncStream.makeStream(of: String.self)
    let queue = DispatchQueue(label: "stdin")
    let source = DispatchSource.makeReadSource(fileDescriptor: 0, queue: queue)
    nonisolated(unsafe) var pending: [UInt8] = []  // touched on `queue` only
    source.setEventHandler {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = read(0, &buffer, buffer.count)
        if count <= 0 {
            source.cancel()
            if !pending.isEmpty { continuation.yield(String(decoding: pending, as: UTF8.self)) }
            continuation.finish()
            return
        }
        pending += buffer[0..<count]
        while let newline = pending.firstIndex(of: 10) {
            continuation.yield(String(decoding: pending[..<newline], as: UTF8.self))
            pending.removeSubrange(...newline)
        }
    }
    source.resume()
    return stream
}

var logger = Logger(label: "discovery-peer") { StreamLogHandler.standardError(label: $0) }
logger.logLevel =
    ProcessInfo.processInfo.environment["PEER_LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? .warning
let choice = CommandLine.arguments.dropFirst().first.flatMap(DiscoveryBackendChoice.init(rawValue:)) ?? .automatic
let discovery = ServiceDiscovery(logger: logger, programName: "discovery-peer", backend: choice)
say("BACKEND \(await discovery.backend())")

var publication: PublishedService?
var tasks: [Task<Void, Never>] = []
/// The services browsed so far, by name (as last reported: added or updated).
let found = Mutex<[String: DiscoveredService]>([:])
for await line in stdinLines() {
    let words = line.split(separator: " ").map(String.init)
    guard let command = words.first else { continue }
    switch command {
    case "publish" where words.count >= 4:
        do {
            let service = try await discovery.publish(
                name: words[1], type: words[2], port: UInt16(words[3]) ?? 1, txt: txtRecord(words[4...]))
            publication = service
            tasks.append(
                Task {
                    for await event in service.events {
                        switch event {
                        case .established(let name): say("PUBLISHED \(name)")
                        case .renamed(let from, let to): say("RENAMED \(from) -> \(to)")
                        case .failed(let error): say("FAILED \(error)")
                        case .suspended: say("SUSPENDED")
                        case .registered(let name, let domain): say("REGISTERED \(name) in \(domain)")
                        case .registrationRenamed(let domain, let from, let to): say("WA-RENAMED \(from) -> \(to) in \(domain)")
                        case .registrationFailed(let domain, let error): say("REGISTER-FAILED \(domain) \(error.code): \(error.message)")
                        }
                    }
                })
        } catch {
            say("FAILED \(error)")
        }
    case "txt":
        do {
            try await publication?.updateTXT(txtRecord(words[1...]))
            say("TXT-UPDATED")
        } catch {
            say("FAILED \(error)")
        }
    case "unpublish":
        await publication?.unpublish()
        say("UNPUBLISHED")
    case "browse" where words.count == 2:
        do {
            let browser = try discovery.browse(type: words[1])
            tasks.append(
                Task {
                    for await event in browser {
                        switch event {
                        case .added(let service):
                            found.withLock { $0[service.name] = service }
                            say("ADDED \(service.name)")
                            say("LOCATIONS \(service.name) \(service.foundIn)")
                            Task {
                                do {
                                    let resolved = try await discovery.resolve(service)
                                    say(
                                        "RESOLVED \(service.name) \(resolved.hostName) \(resolved.port) \(resolved.txt) | \(resolved.addresses.map(\.numericHost).joined(separator: " "))"
                                    )
                                } catch {
                                    say("RESOLVE-FAILED \(service.name) \(error)")
                                }
                            }
                        case .removed(let service): say("REMOVED \(service.name)")
                        case .updated(let service):
                            found.withLock { $0[service.name] = service }
                            say("UPDATED \(service.name) \(service.foundIn)")
                        case .allForNow: say("ALLFORNOW")
                        case .failed(let error): say("BROWSE-FAILED \(error)")
                        }
                    }
                })
        } catch {
            say("FAILED \(error)")
        }
    case "resolve" where words.count >= 2:
        // A service browsed earlier (with every place it was found in), by name.
        let name = words[1...].joined(separator: " ")
        guard let service = found.withLock({ $0[name] }) else {
            say("RESOLVE-FAILED \(name) not browsed")
            continue
        }
        do {
            let resolved = try await discovery.resolve(service)
            say("RESOLVED \(service.name) \(resolved.hostName) \(resolved.port) \(resolved.txt) | \(resolved.addresses.map(\.numericHost).joined(separator: " "))")
        } catch {
            say("RESOLVE-FAILED \(service.name) \(error)")
        }
    case "watch" where words.count == 3:
        do {
            let watcher = try discovery.watch(ServiceIdentity(name: words[1], type: words[2]))
            tasks.append(
                Task {
                    for await resolved in watcher { say("WATCH \(resolved.name) \(resolved.txt)") }
                })
        } catch {
            say("FAILED \(error)")
        }
    case "rss":
        say("RSS \(residentKiB())")
    case "quit":
        break
    default:
        say("UNKNOWN \(line)")
    }
    if command == "quit" { break }
}
await discovery.shutdown()
for task in tasks { task.cancel() }
say("BYE")
