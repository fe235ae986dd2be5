/// A Noise handshake pattern (Noise Protocol Framework rev. 34, section 7): the public keys each
/// side knows before the handshake, and the tokens of each handshake message. Messages alternate:
/// the initiator sends messages 0, 2, 4, …, the responder 1, 3, 5, ….
package struct NoisePattern: Sendable, Equatable {
    package enum Token: String, Sendable, Equatable {
        case e, s, ee, es, se, ss, psk
    }

    /// The pattern's name with its modifiers, e.g. `XXpsk3`.
    package let name: String
    /// Keys the responder knows of the initiator before the handshake (`-> s` above `...`).
    package let initiatorPreMessage: [Token]
    /// Keys the initiator knows of the responder before the handshake (`<- s` above `...`).
    package let responderPreMessage: [Token]
    /// The tokens of each handshake message, in order.
    package let messages: [[Token]]

    package init(name: String, initiatorPreMessage: [Token] = [], responderPreMessage: [Token] = [], messages: [[Token]]) {
        self.name = name
        self.initiatorPreMessage = initiatorPreMessage
        self.responderPreMessage = responderPreMessage
        self.messages = messages
    }

    /// Whether a pre-shared key takes part (then every `e` also mixes into the key).
    package var hasPSK: Bool { messages.contains { $0.contains(.psk) } }

    /// One-way patterns (`N`, `K`, `X`) have a single message; after it only the initiator sends.
    package var isOneWay: Bool { messages.count == 1 }

    /// The pattern with `psk` modifiers applied: `psk0` puts a `psk` token at the start of the first
    /// message, `pskN` (N ≥ 1) at the end of the N-th (section 9.2).
    package func applying(pskModifiers positions: [Int]) -> NoisePattern? {
        var messages = self.messages
        for position in positions {
            if position == 0 {
                guard !messages.isEmpty else { return nil }
                messages[0].insert(.psk, at: 0)
            } else {
                guard position <= messages.count else { return nil }
                messages[position - 1].append(.psk)
            }
        }
        let suffix = positions.map { "psk\($0)" }.joined(separator: "+")
        return NoisePattern(
            name: name + suffix, initiatorPreMessage: initiatorPreMessage,
            responderPreMessage: responderPreMessage, messages: messages)
    }

    /// `XX`: mutual authentication, both static keys transmitted under encryption.
    /// ```
    /// -> e
    /// <- e, ee, s, es
    /// -> s, se
    /// ```
    package static let XX = NoisePattern(name: "XX", messages: [[.e], [.e, .ee, .s, .es], [.s, .se]])

    /// `XXpsk3`: `XX` with a pre-shared key mixed in at the end of the third message.
    package static let XXpsk3 = XX.applying(pskModifiers: [3])!

    /// Parses pattern definitions as the specification writes them:
    /// ```
    /// NK:
    ///   <- s
    ///   ...
    ///   -> e, es
    ///   <- e, ee
    /// ```
    /// Lines may sit in the columns of a `|`-bordered table (the specification's layout). Returns
    /// every pattern found by name (the first definition of a name wins).
    package static func parseDefinitions(_ text: String) -> [String: NoisePattern] {
        // Flatten the tables: each column's text, top to bottom, column after column per table row.
        var lines: [String] = []
        var columns: [[String]] = []
        func flush() {
            for column in columns { lines += column }
            columns = []
        }
        for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let line = String(raw)
            if line.hasPrefix("+-") {
                flush()
            } else if line.hasPrefix("|") {
                let cells = line.split(separator: "|", omittingEmptySubsequences: false).dropFirst().dropLast()
                for (index, cell) in cells.enumerated() {
                    while columns.count <= index { columns.append([]) }
                    columns[index].append(String(cell))
                }
            } else {
                flush()
                lines.append(line)
            }
        }
        flush()
        var patterns: [String: NoisePattern] = [:]
        var index = 0
        while index < lines.count {
            let header = lines[index].trimmingSpaces
            index += 1
            guard header.hasSuffix(":"), header.count > 1,
                header.dropLast().allSatisfy({ $0.isUppercase || $0.isNumber || $0.isLowercase || $0 == "+" })
            else { continue }
            var pre: [(Bool, [Token])] = []
            var messages: [(Bool, [Token])] = []
            var sawEllipsis = false
            while index < lines.count {
                let line = lines[index].trimmingSpaces
                let outgoing = line.hasPrefix("->")
                guard outgoing || line.hasPrefix("<-") || line == "..." else { break }
                index += 1
                if line == "..." {
                    sawEllipsis = true
                    pre = messages
                    messages = []
                    continue
                }
                let tokens = line.dropFirst(2).split(separator: ",").compactMap {
                    Token(rawValue: String($0).trimmingSpaces)
                }
                messages.append((outgoing, tokens))
            }
            guard !messages.isEmpty, messages.enumerated().allSatisfy({ $0.element.0 == ($0.offset % 2 == 0) }) else {
                continue
            }
            if !sawEllipsis { pre = [] }
            let name = String(header.dropLast())
            if patterns[name] == nil {
                patterns[name] = NoisePattern(
                    name: name, initiatorPreMessage: pre.filter(\.0).flatMap(\.1),
                    responderPreMessage: pre.filter { !$0.0 }.flatMap(\.1), messages: messages.map(\.1))
            }
        }
        return patterns
    }
}

extension StringProtocol {
    fileprivate var trimmingSpaces: String {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice.removeFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice.removeLast() }
        return String(slice)
    }
}
