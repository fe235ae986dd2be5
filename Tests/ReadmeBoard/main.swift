// The README's Getting started as a program (GettingStarted.swift is the README's code, byte for
// byte): `readme-board board` runs the board until SIGTERM or SIGINT, `readme-board client` sets
// and gets an entry and prints it. GettingStartedIntegrationTests runs both and stops the board
// with SIGTERM, as a user would.
import Foundation
import Logging

let role = CommandLine.arguments.dropFirst().first ?? ""
var logger = Logger(label: "readme-\(role)") { StreamLogHandler.standardError(label: $0) }
logger.logLevel = .warning
/// One line on stdout, written at once (a test reads it while the program runs).
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
switch role {
case "board":
    say("board running")
    try await runBoard(logger: logger)
    say("board stopped")
case "client":
    say("greeting: \(try await useBoard(logger: logger) ?? "none")")
default:
    say("usage: readme-board board|client")
    exit(2)
}
