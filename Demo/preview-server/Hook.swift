import Dispatch
import Foundation
import Logging
import SystemCalls

/// Runs the `--on-receive` command for a stored file: `/bin/sh -c '<command> "$1"' preview-on-receive <path>`
/// (posix_spawn; the path is passed as an argument, never interpolated into the command), with no
/// signal blocked or ignored. Its exit status is logged; a failure never affects the daemon.
enum Hook {
    static func run(_ command: String, path: String, logger: Logger) {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        let arguments = ["/bin/sh", "-c", command + " \"$1\"", "preview-on-receive", path]
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        // Signals as a shell would start it: the daemon ignores SIGTERM and SIGINT (the service
        // group's signal source takes them), and a hook that inherited that could not be stopped.
        let result = withDefaultSignalsSpawnAttributes { posix_spawn(&pid, "/bin/sh", &actions, $0, argv, environ) }
        guard result == 0 else {
            logger.error("--on-receive: cannot start /bin/sh: \(String(cString: strerror(result)))")
            return
        }
        let child = pid
        logger.debug("--on-receive started", metadata: ["pid": "\(child)", "path": "\(path)"])
        // Reap it off the cooperative pool (waitpid blocks).
        DispatchQueue.global().async {
            var status: Int32 = 0
            _ = retryingInterrupts { waitpid(child, &status, 0) }
            let exited = status & 0x7f == 0
            let code = exited ? (status >> 8) & 0xff : 128 + (status & 0x7f)
            if code == 0 {
                logger.info("--on-receive finished", metadata: ["path": "\(path)"])
            } else {
                logger.warning(
                    "--on-receive failed (the daemon keeps running)",
                    metadata: ["command": "\(command)", "path": "\(path)", "status": "\(code)"])
            }
        }
    }
}
