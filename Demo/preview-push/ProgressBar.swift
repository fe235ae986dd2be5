import Foundation
import PreviewKit
import Locks

/// A one-line progress bar on standard error (bytes, rate, ETA), redrawn at most 10 times a second;
/// silent when standard error is not a terminal.
final class ProgressBar: Sendable {
    private struct State {
        var lastDraw: ContinuousClock.Instant?
        var started: ContinuousClock.Instant?
        var ended: ContinuousClock.Instant?
        var drawn = false
    }

    private let interactive: Bool
    private let state = Locked(State())

    init(interactive: Bool) { self.interactive = interactive }

    /// Seconds from the first byte to the last (0 before).
    var elapsedSeconds: Double {
        state.withLock { state in
            guard let started = state.started else { return 0 }
            let duration = (state.ended ?? .now) - started
            return Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
        }
    }

    func update(_ progress: PushProgress) {
        let now = ContinuousClock.now
        let draw = state.withLock { state -> Bool in
            if state.started == nil { state.started = progress.started }
            if progress.isFinished { state.ended = now }
            guard interactive else { return false }
            if !progress.isFinished, let last = state.lastDraw, now - last < .milliseconds(100) { return false }
            state.lastDraw = now
            state.drawn = true
            return true
        }
        guard draw else { return }
        let elapsed = now - progress.started
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let rate = seconds > 0 ? Double(progress.sentBytes) / seconds : 0
        let fraction = progress.totalBytes == 0 ? 1 : Double(progress.sentBytes) / Double(progress.totalBytes)
        let width = 24
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
        let eta: String
        if rate > 0, progress.sentBytes < progress.totalBytes {
            eta = formatDuration(Double(progress.totalBytes - progress.sentBytes) / rate)
        } else {
            eta = progress.isFinished ? "done" : "--:--"
        }
        let line = String(
            format: "%@ [%@] %3d%% %@/%@ %@/s ETA %@", progress.name, bar, Int(fraction * 100),
            formatBytes(progress.sentBytes), formatBytes(progress.totalBytes), formatBytes(UInt64(rate)), eta)
        FileHandle.standardError.write(Data(("\r\u{1B}[K" + line).utf8))
    }

    /// Ends the bar's line.
    func finish() {
        let drawn = state.withLock { state -> Bool in
            if state.ended == nil { state.ended = .now }
            defer { state.drawn = false }
            return state.drawn
        }
        if drawn { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

func formatBytes(_ bytes: UInt64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(bytes)
    var unit = 0
    while value >= 1024 && unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return unit == 0 ? "\(bytes) B" : String(format: "%.1f %@", value, units[unit])
}

func formatDuration(_ seconds: Double) -> String {
    let total = Int(seconds.rounded())
    return total >= 3600
        ? String(format: "%d:%02d:%02d", total / 3600, total / 60 % 60, total % 60)
        : String(format: "%d:%02d", total / 60, total % 60)
}
