import ChatKit
import Dispatch
import Foundation
import Messaging
import Locks
import SystemCalls

/// Raw mode for the line editor. The original settings are restored on every way out: normal exit,
/// errors (``ChatExit``), signals we handle, and `atexit` as the last resort.
enum RawTerminal {
    private static let saved = Locked<termios?>(nil)

    /// Turns off canonical input and echo on stdin (keeps ISIG so Ctrl-C is SIGINT, keeps output processing).
    static func enter() {
        var original = termios()
        guard tcgetattr(STDIN_FILENO, &original) == 0 else { return }
        saved.withLock { $0 = original }
        atexit { RawTerminal.restore() }
        var raw = original
        raw.c_lflag &= ~tcflag_t(ICANON | ECHO | IEXTEN)
        raw.c_iflag &= ~tcflag_t(IXON | ICRNL | INLCR)
        withUnsafeMutableBytes(of: &raw.c_cc) { cc in
            cc[Int(VMIN)] = 1
            cc[Int(VTIME)] = 0
        }
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw)
    }

    /// Puts the terminal back as it was (idempotent).
    static func restore() {
        guard
            var original = saved.withLock({ value -> termios? in
                defer { value = nil }
                return value
            })
        else { return }
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &original)
    }
}

/// Columns of the terminal on stdout (80 when unknown).
func terminalWidth() -> Int {
    var size = winsize()
    guard ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 else { return 80 }
    return Int(size.ws_col)
}

/// Writes all of `text` to a file descriptor (retrying on EINTR / short writes).
func writeAll(_ fd: Int32, _ text: String) {
    var bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        switch retryingInterrupts({ bytes.withUnsafeMutableBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) } }) {
        case .success(let written): offset += written
        case .failure(let error) where error.wouldBlock: continue
        case .failure: return
        }
    }
    bytes.removeAll()
}

/// All terminal output goes through here. On a TTY it keeps the line being typed at the bottom and
/// prints arriving lines above it (redrawing the prompt); in scripted mode it prints plain lines.
final class Console: Sendable {
    private struct State {
        var editor = LineEditor()
        var prompt = ""
        var active = false
    }

    let interactive: Bool
    private let state = Locked(State())

    init(interactive: Bool) { self.interactive = interactive }

    /// Prints lines (above the prompt on a TTY).
    func show(_ lines: [String]) {
        guard !lines.isEmpty else { return }
        state.withLock { state in
            if interactive && state.active {
                var out = ""
                for line in lines { out += "\r\u{1B}[2K" + line + "\r\n" }
                out += state.editor.render(prompt: state.prompt, width: terminalWidth())
                writeAll(STDOUT_FILENO, out)
            } else {
                writeAll(STDOUT_FILENO, lines.map { $0 + "\n" }.joined())
            }
        }
    }

    func show(_ line: String) { show([line]) }

    /// Starts showing the prompt line (TTY only).
    func activate(prompt: String) {
        guard interactive else { return }
        state.withLock { state in
            state.prompt = prompt
            state.active = true
            writeAll(STDOUT_FILENO, state.editor.render(prompt: prompt, width: terminalWidth()))
        }
    }

    func setPrompt(_ prompt: String) {
        guard interactive else { return }
        state.withLock { state in
            guard state.prompt != prompt else { return }
            state.prompt = prompt
            if state.active { writeAll(STDOUT_FILENO, state.editor.render(prompt: prompt, width: terminalWidth())) }
        }
    }

    /// Feeds typed bytes to the line editor and redraws; returns the events that matter to the caller.
    func feed(_ bytes: [UInt8]) -> [LineEditor.Event] {
        state.withLock { state in
            var out: [LineEditor.Event] = []
            var redraw = false
            for event in state.editor.feed(bytes) {
                switch event {
                case .changed: redraw = true
                case .clearScreen:
                    writeAll(STDOUT_FILENO, "\u{1B}[H\u{1B}[2J")
                    redraw = true
                case .submit:
                    redraw = true
                    out.append(event)
                default: out.append(event)
                }
            }
            if redraw && state.active {
                writeAll(STDOUT_FILENO, state.editor.render(prompt: state.prompt, width: terminalWidth()))
            }
            return out
        }
    }

    /// Removes the prompt line (before leaving).
    func deactivate() {
        guard interactive else { return }
        state.withLock { state in
            if state.active { writeAll(STDOUT_FILENO, "\r\u{1B}[2K") }
            state.active = false
        }
    }
}

/// What the chat loop reacts to, from every source merged into one stream.
enum LoopInput: Sendable {
    case line(String)
    case endOfInput
    case interrupt(Int32)
    case client(ClientEvent)
    case server(ServerEvent)
    case rejoinDeadline(Int)
    case byeTimeout
    case output([String])
}

/// Reads stdin on its own thread: on a TTY, bytes through the console's line editor; otherwise lines.
enum InputReader {
    static func start(console: Console, into continuation: AsyncStream<LoopInput>.Continuation) {
        let thread = Thread {
            var buffer = [UInt8](repeating: 0, count: 4096)
            var partial: [UInt8] = []
            while true {
                let count = (try? retryingInterrupts({ buffer.withUnsafeMutableBytes { read(STDIN_FILENO, $0.baseAddress!, $0.count) } }).get()) ?? -1
                if count <= 0 {
                    if !partial.isEmpty { continuation.yield(.line(String(decoding: partial, as: UTF8.self))) }
                    continuation.yield(.endOfInput)
                    return
                }
                let bytes = Array(buffer[0..<count])
                if console.interactive {
                    for event in console.feed(bytes) {
                        switch event {
                        case .submit(let line): continuation.yield(.line(line))
                        case .endOfInput:
                            continuation.yield(.endOfInput)
                            return
                        case .interrupt: continuation.yield(.interrupt(SIGINT))
                        default: break
                        }
                    }
                } else {
                    partial += bytes
                    while let newline = partial.firstIndex(of: UInt8(ascii: "\n")) {
                        var line = Array(partial[..<newline])
                        if line.last == UInt8(ascii: "\r") { line.removeLast() }
                        partial.removeSubrange(...newline)
                        continuation.yield(.line(String(decoding: line, as: UTF8.self)))
                    }
                }
            }
        }
        thread.name = "stdin"
        thread.start()
    }
}

/// SIGINT, SIGTERM and SIGHUP as loop inputs (Dispatch signal sources; the default actions ignored first).
enum Signals {
    // Written only by forward(), which runs once on the main task before anything reads it.
    nonisolated(unsafe) private static var sources: [any DispatchSourceSignal] = []
    private static let queue = DispatchQueue(label: "bonjour-chat.signals")

    static func forward(into continuation: AsyncStream<LoopInput>.Continuation) {
        signal(SIGPIPE, SIG_IGN)
        for number in [SIGINT, SIGTERM, SIGHUP] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler { continuation.yield(.interrupt(number)) }
            source.resume()
            sources.append(source)
        }
    }
}
