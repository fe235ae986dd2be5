/// A small line editor for a terminal in raw mode: feed it the bytes typed, it keeps the line and
/// the cursor and says what happened; ``render(prompt:)`` and ``printAbove(_:prompt:)`` give the bytes
/// that draw it, so a line arriving while someone types never garbles what they typed.
///
/// Keys: printable text (UTF-8), Backspace, Delete, ←/→, Home/End (also Ctrl-A/Ctrl-E), Ctrl-U (clear),
/// Ctrl-W (delete word), Ctrl-K (kill to end), Enter, Ctrl-D (on an empty line: end), Ctrl-L (redraw).
public struct LineEditor: Sendable {
    /// What one byte did.
    public enum Event: Sendable, Equatable {
        /// Nothing visible (inside an escape sequence or a partial UTF-8 character).
        case none
        /// The line or cursor changed: redraw.
        case changed
        /// Enter: the finished line (the editor is empty again).
        case submit(String)
        /// Ctrl-D on an empty line.
        case endOfInput
        /// Ctrl-C arrived as a byte (when the terminal does not turn it into SIGINT).
        case interrupt
        /// Ctrl-L: clear the screen and redraw.
        case clearScreen
    }

    private enum Escape: Sendable {
        case none, escape
        case csi([UInt8])
        case ss3
    }

    public private(set) var characters: [Character] = []
    /// Cursor position, in characters from the start of the line.
    public private(set) var cursor = 0
    private var escape = Escape.none
    private var pending: [UInt8] = []

    public init() {}

    /// The line typed so far.
    public var text: String { String(characters) }

    /// Feeds one byte.
    public mutating func feed(_ byte: UInt8) -> Event {
        switch escape {
        case .escape:
            if byte == UInt8(ascii: "[") {
                escape = .csi([])
                return .none
            }
            if byte == UInt8(ascii: "O") {
                escape = .ss3
                return .none
            }
            escape = .none
            return .none
        case .ss3:
            escape = .none
            return key(final: byte, parameters: [])
        case .csi(var parameters):
            if byte >= 0x40 && byte <= 0x7E {
                escape = .none
                return key(final: byte, parameters: parameters)
            }
            parameters.append(byte)
            escape = parameters.count > 16 ? .none : .csi(parameters)
            return .none
        case .none:
            break
        }
        if !pending.isEmpty || byte >= 0x80 { return utf8(byte) }
        switch byte {
        case 0x1B:
            escape = .escape
            return .none
        case 0x0D, 0x0A:
            let line = text
            characters = []
            cursor = 0
            return .submit(line)
        case 0x7F, 0x08:
            guard cursor > 0 else { return .none }
            characters.remove(at: cursor - 1)
            cursor -= 1
            return .changed
        case 0x01:
            cursor = 0
            return .changed
        case 0x05:
            cursor = characters.count
            return .changed
        case 0x02: return move(-1)
        case 0x06: return move(1)
        case 0x03: return .interrupt
        case 0x04:
            if characters.isEmpty { return .endOfInput }
            return deleteForward()
        case 0x0B:
            characters.removeSubrange(cursor...)
            return .changed
        case 0x0C: return .clearScreen
        case 0x15:
            characters.removeSubrange(..<cursor)
            cursor = 0
            return .changed
        case 0x17:
            var start = cursor
            while start > 0 && characters[start - 1] == " " { start -= 1 }
            while start > 0 && characters[start - 1] != " " { start -= 1 }
            characters.removeSubrange(start..<cursor)
            cursor = start
            return .changed
        case 0x09: return insert(" ")
        case 0x20...0x7E: return insert(Character(Unicode.Scalar(byte)))
        default: return .none
        }
    }

    /// Feeds several bytes; returns the events that are not `.none`.
    public mutating func feed(_ bytes: some Sequence<UInt8>) -> [Event] {
        bytes.map { feed($0) }.filter { $0 != .none }
    }

    private mutating func utf8(_ byte: UInt8) -> Event {
        pending.append(byte)
        let lead = pending[0]
        let expected = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1
        guard pending.count >= expected else { return .none }
        defer { pending = [] }
        guard let decoded = String(validating: pending, as: UTF8.self), let character = decoded.first else {
            return .none
        }
        return insert(character)
    }

    private mutating func insert(_ character: Character) -> Event {
        // Combining marks join the previous character.
        if cursor > 0, String(characters[cursor - 1]).appending(String(character)).count == 1 {
            characters[cursor - 1] = Character(String(characters[cursor - 1]) + String(character))
            return .changed
        }
        characters.insert(character, at: cursor)
        cursor += 1
        return .changed
    }

    private mutating func move(_ delta: Int) -> Event {
        let target = min(max(cursor + delta, 0), characters.count)
        guard target != cursor else { return .none }
        cursor = target
        return .changed
    }

    private mutating func deleteForward() -> Event {
        guard cursor < characters.count else { return .none }
        characters.remove(at: cursor)
        return .changed
    }

    private mutating func key(final: UInt8, parameters: [UInt8]) -> Event {
        switch final {
        case UInt8(ascii: "C"): return move(1)
        case UInt8(ascii: "D"): return move(-1)
        case UInt8(ascii: "H"):
            cursor = 0
            return .changed
        case UInt8(ascii: "F"):
            cursor = characters.count
            return .changed
        case UInt8(ascii: "~"):
            switch parameters {
            case [UInt8(ascii: "3")]: return deleteForward()
            case [UInt8(ascii: "1")], [UInt8(ascii: "7")]:
                cursor = 0
                return .changed
            case [UInt8(ascii: "4")], [UInt8(ascii: "8")]:
                cursor = characters.count
                return .changed
            default: return .none
            }
        default: return .none
        }
    }

    /// Bytes that redraw the prompt line: back to column 0, clear the line, prompt + text, cursor placed.
    /// A line longer than `width` columns scrolls sideways (the part around the cursor is shown), so the
    /// prompt never wraps onto a second row that a redraw could not clear.
    public func render(prompt: String, width: Int = Int.max) -> String {
        let available = max(width - prompt.count - 1, 8)
        var start = 0
        if characters.count > available {
            start = min(max(0, cursor - available / 2), characters.count - available)
            if cursor < start { start = cursor }
        }
        let end = min(characters.count, start + available)
        var out = "\r\u{1B}[2K" + prompt + String(characters[start..<end])
        let back = end - cursor
        if back > 0 { out += "\u{1B}[\(back)D" }
        return out
    }

    /// Bytes that print `line` above the prompt line and redraw the prompt with what is being typed.
    public func printAbove(_ line: String, prompt: String, width: Int = Int.max) -> String {
        "\r\u{1B}[2K" + line + "\r\n" + render(prompt: prompt, width: width)
    }
}
