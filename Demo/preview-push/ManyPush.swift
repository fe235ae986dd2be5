import ArgumentParser
import Foundation
import Logging
import Messaging
import PreviewKit
import Locks

/// `--to A --to B …` and `--all`: the same files to several previewers at once — one connection
/// each, pushing side by side; a result line per previewer and file; a previewer that cannot be
/// reached, refuses its key or drops out fails alone.
extension PreviewPushCommand {
    /// What became of one previewer in a push to several.
    struct Report: Sendable {
        let name: String
        var stored = 0
        var failed = 0
        /// Nothing was sent to it: why.
        var unreachable: String?
    }

    func pushToMany(discovery: ServiceDiscovery, logger: Logger) async throws {
        let names = all ? try await trustedPreviewers(discovery) : to
        let board = ProgressBoard(interactive: isatty(STDERR_FILENO) == 1)
        // Connect to every one at once: a slow or absent previewer does not hold up the others.
        let connected = await withTaskGroup(of: (Int, Result<Previewer, Previewer.Unreachable>).self) { group in
            for (index, name) in names.enumerated() {
                group.addTask {
                    (index, await Previewer.connect(to: .service(name: name, type: PreviewProtocol.serviceType, discovery: discovery), options: self, logger: logger))
                }
            }
            var results: [(Int, Result<Previewer, Previewer.Unreachable>)] = []
            for await result in group { results.append(result) }
            return results.sorted { $0.0 < $1.0 }.map(\.1)
        }
        var reports: [Report] = []
        var previewers: [Previewer] = []
        for (name, result) in zip(names, connected) {
            switch result {
            case .success(let previewer): previewers.append(previewer)
            case .failure(let unreachable):
                fail("preview-push: '\(FileName.printable(name))': \(unreachable.message)")
                reports.append(Report(name: name, unreachable: unreachable.message))
            }
        }
        let drains = previewers.map { previewer in Task { for await _ in previewer.client.events {} } }
        if !previewers.isEmpty {
            board.start(previewers.map(\.name))
            if watch, let file = files.first {
                reports += try await watchMany(file, previewers, board, discovery: discovery)
            } else {
                // Each file hashed once, not once per previewer.
                let contents = files.map { try? ResumingPusher.hash($0) }
                reports += await withTaskGroup(of: Report.self) { group in
                    for previewer in previewers {
                        group.addTask {
                            var report = Report(name: previewer.name)
                            for (file, content) in zip(files, contents) {
                                if await push(file, content: content, to: previewer, board, discovery: discovery) != nil { report.stored += 1 } else { report.failed += 1 }
                            }
                            return report
                        }
                    }
                    var done: [Report] = []
                    for await report in group { done.append(report) }
                    return done
                }
            }
            board.end()
        }
        for previewer in previewers { await previewer.client.close() }
        for drain in drains { drain.cancel() }
        await discovery.shutdown()
        try finish(reports)
    }

    /// Pushes `file` to one previewer of several; its SHA-256 when stored. (`content`: the file
    /// hashed once for all of them; nil when it could not be read — each push says so.)
    func push(
        _ file: String, content: (sha256: String, size: UInt64)?, to previewer: Previewer, _ board: ProgressBoard,
        discovery: ServiceDiscovery
    ) async -> String? {
        if !board.interactive { say("pushing \(FileName.printable(file, limit: 300)) to '\(FileName.printable(previewer.name))'") }
        let started = ContinuousClock.now
        let outcome = await previewer.push(file, content: content, options: self, progress: { board.update(previewer.name, $0) })
        let elapsed = ContinuousClock.now - started
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        switch outcome {
        case .stored(let result):
            board.finished(previewer.name, ok: true)
            board.print(previewer.storedLine(file, result, seconds: seconds), error: false)
            if board.firstPage(of: previewer.name), let line = await previewer.pageLine(result, discovery: discovery) {
                board.print(line, error: false)
            }
            return result.sha256
        case .failed(let error):
            board.finished(previewer.name, ok: false)
            board.print(
                "failed \(FileName.printable(file, limit: 300)) on '\(FileName.printable(previewer.name))': \(error.message) [\(error.code)]",
                error: true)
            return nil
        }
    }

    /// `--watch` with several previewers: every save whose content a previewer does not have yet
    /// goes to it; all of them side by side.
    func watchMany(
        _ file: String, _ previewers: [Previewer], _ board: ProgressBoard, discovery: ServiceDiscovery
    ) async throws -> [Report] {
        let watcher = try startWatching(file)
        defer { watcher.stop() }
        var reports = previewers.map { Report(name: $0.name) }
        var stored: [String?] = Array(repeating: nil, count: previewers.count)
        /// Pushes `content` (the file hashed once for all; nil: it cannot be read, each push says
        /// so) to the previewers whose last stored content is not its hash (at first: all).
        func round(_ content: (sha256: String, size: UInt64)?) async {
            let sha = content?.sha256
            let results = await withTaskGroup(of: (Int, String?).self) { group in
                for (index, previewer) in previewers.enumerated() {
                    if let sha, stored[index] == sha {
                        board.print(
                            "unchanged \(FileName.printable(file, limit: 300)) on '\(FileName.printable(previewer.name))' (sha256 \(sha)): not pushed",
                            error: false)
                        continue
                    }
                    group.addTask { (index, await push(file, content: content, to: previewer, board, discovery: discovery)) }
                }
                var results: [(Int, String?)] = []
                for await result in group { results.append(result) }
                return results
            }
            for (index, sha) in results {
                if let sha {
                    stored[index] = sha
                    reports[index].stored += 1
                } else {
                    reports[index].failed += 1
                }
            }
        }
        await round(try? ResumingPusher.hash(file))
        note("preview-push: watching \(FileName.printable(file, limit: 300)): every save is pushed to \(previewers.count) previewers (Ctrl-C ends)")
        for await _ in watcher.saves {
            do {
                await round(try ResumingPusher.hash(file))
            } catch {
                note("preview-push: \(FileName.printable(file, limit: 300)) cannot be read now (\(error.message)); waiting for the next save")
            }
        }
        note("preview-push: stopped watching \(FileName.printable(file, limit: 300))")
        return reports
    }

    /// `--all`: the previewers found whose key this preview-push trusts. The others are named with
    /// why they are skipped; none at all is exit status 2.
    func trustedPreviewers(_ discovery: ServiceDiscovery) async throws -> [String] {
        let found: [DiscoveredService]
        do {
            found = try await discovery.services(ofType: PreviewProtocol.serviceType, timeout: timeoutDuration) { _, allForNow in allForNow }
        } catch {
            fail("preview-push: --all: browsing failed: \(error.message)")
            throw ExitCode(2)
        }
        var names: [String] = []
        for service in found where !names.contains(service.name) {
            let name = FileName.printable(service.name)
            guard let resolved = try? await discovery.resolve(service, timeout: timeoutDuration) else {
                note("preview-push: --all: skipped '\(name)': it does not resolve")
                continue
            }
            let key = resolved.txt["fp"].map { FileName.printable($0, limit: 24) }
            switch trust(of: service.name, key: key) {
            case .trusted: names.append(service.name)
            case .new:
                note(
                    "preview-push: --all: skipped '\(name)': never pushed to from here (key \(key ?? "?")); push to it once with "
                        + "--to '\(name)' to see its comparison code and trust its key")
            case .noKey:
                note("preview-push: --all: skipped '\(name)': it publishes no key (plaintext); name it with --to to push to it")
            case .changed:
                note("preview-push: --all: skipped '\(name)': its key changed since the last push here (a push is refused; see --list)")
            }
        }
        if names.isEmpty {
            fail(
                "preview-push: --all: no trusted previewer found within \(timeoutDuration) (\(found.count) found); "
                    + "push to one with --to NAME first (see --list)")
            throw ExitCode(2)
        }
        return names
    }

    /// The summary of a push to several, and the exit status: 0 every file stored on every
    /// previewer; 1 a file failed; 2 nothing was sent anywhere; 3 some previewers were not
    /// reached and the others stored every file.
    func finish(_ reports: [Report]) throws {
        let parts = reports.map { report -> String in
            let name = "'\(FileName.printable(report.name))'"
            if let why = report.unreachable { return "\(name) not reached (\(why))" }
            return "\(name) stored \(report.stored) of \(report.stored + report.failed)"
        }
        let reached = reports.filter { $0.unreachable == nil }
        let failedFiles = reports.reduce(0) { $0 + $1.failed }
        note("preview-push: \(reports.count) previewers: " + parts.joined(separator: "; "))
        if reached.isEmpty { throw ExitCode(2) }
        if failedFiles > 0 { throw ExitCode(1) }
        if reached.count < reports.count { throw ExitCode(3) }
    }
}

/// One line on standard error with every previewer's progress of a push to several (redrawn at
/// most 10 times a second); result lines are printed above it. Silent when standard error is not
/// a terminal.
final class ProgressBoard: Sendable {
    private struct State {
        var names: [String] = []
        var percent: [String: String] = [:]
        var lastDraw: ContinuousClock.Instant?
        var drawn = false
        var pagesShown: Set<String> = []
    }

    let interactive: Bool
    private let state = Locked(State())

    init(interactive: Bool) { self.interactive = interactive }

    func start(_ names: [String]) { state.withLock { $0.names = names } }

    func update(_ name: String, _ progress: PushProgress) {
        let fraction = progress.totalBytes == 0 ? 1 : Double(progress.sentBytes) / Double(progress.totalBytes)
        let now = ContinuousClock.now
        let line = state.withLock { state -> String? in
            state.percent[name] = "\(Int(fraction * 100))%"
            guard interactive else { return nil }
            if let last = state.lastDraw, now - last < .milliseconds(100) { return nil }
            state.lastDraw = now
            state.drawn = true
            return Self.line(state)
        }
        if let line { FileHandle.standardError.write(Data(("\r\u{1B}[K" + line).utf8)) }
    }

    /// True the first time it is asked for `name`: its page's link is printed once.
    func firstPage(of name: String) -> Bool { state.withLock { $0.pagesShown.insert(name).inserted } }

    func finished(_ name: String, ok: Bool) { state.withLock { $0.percent[name] = ok ? "done" : "failed" } }

    /// Prints `text` on its own line (standard output, or standard error), above the board.
    func print(_ text: String, error: Bool) {
        state.withLock { state in
            if state.drawn { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
            (error ? FileHandle.standardError : FileHandle.standardOutput).write(Data((text + "\n").utf8))
            if state.drawn { FileHandle.standardError.write(Data(Self.line(state).utf8)) }
        }
    }

    func end() {
        state.withLock { state in
            if state.drawn { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
            state.drawn = false
        }
    }

    private static func line(_ state: State) -> String {
        state.names.map { "\(FileName.printable($0, limit: 24)) \(state.percent[$0] ?? "0%")" }.joined(separator: " | ")
    }
}
