// Running external programs from the mount tests, always under a deadline.
//
// Every command runs as `/usr/bin/timeout --kill-after=5 SECONDS argv…`, so a program stuck on a hung
// mount is killed and the test fails instead of hanging CI. As a second line of defence the runner
// itself SIGKILLs `timeout` if it outlives its own deadline. Output goes to temporary files, not pipes:
// `ubiquityfs mount` leaves a daemon behind that may inherit the output descriptors, and a pipe would
// only reach end-of-file when that daemon exits.

import Foundation
import Glibc

/// What a finished command did.
struct CommandResult: CustomStringConvertible {
    let argv: [String]
    let status: Int32
    let stdout: String
    let stderr: String
    let timedOut: Bool

    var succeeded: Bool { status == 0 && !timedOut }

    /// Non-empty lines of standard output.
    var lines: [String] { stdout.split(separator: "\n").map(String.init) }

    /// Non-empty lines of standard output and standard error together.
    var allLines: [String] { (stdout + "\n" + stderr).split(separator: "\n").map(String.init) }

    var description: String {
        let shown = argv.map { $0.contains(" ") || $0.isEmpty ? "'\($0)'" : $0 }.joined(separator: " ")
        return "`\(shown)` exited \(status)\(timedOut ? " (TIMED OUT)" : "")"
            + "\n--- stdout:\n\(stdout.suffix(4000))\n--- stderr:\n\(stderr.suffix(4000))"
    }
}

enum Command {
    /// How many times longer than its nominal deadline a command, a wait or a test may take
    /// (`UBIQUITYFS_TEST_SLACK`, 3 by default). The deadlines only catch hangs: on a loaded CI host
    /// whose neighbours steal CPU every part runs two to three times slower, and a slow test that
    /// is making progress must not fail as if it were hung.
    static let slack: Double = max(1, Double(ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_SLACK"] ?? "") ?? 3)

    /// Runs `argv` (looked up on PATH) with a deadline of `timeout` seconds.
    ///
    /// posix_spawn + waitpid rather than Foundation's Process: Process learns that its child ended
    /// through a descriptor the child inherits, and `ubiquityfs mount` hands that descriptor on to the
    /// daemon it leaves running, so Process would wait for the daemon.
    static func run(_ argv: [String], timeout: Int = 60, cwd: String? = nil,
                    environment: [String: String]? = nil) -> CommandResult {
        let outPath = temporaryFile("out")
        let errPath = temporaryFile("err")
        defer {
            unlink(outPath)
            unlink(errPath)
        }
        let timeout = Int((Double(timeout) * slack).rounded(.up))
        var full = ["/usr/bin/timeout", "--kill-after=5", String(timeout)] + argv
        if let cwd { full = ["/usr/bin/env", "-C", cwd] + full }
        let env = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_TRUNC, 0o600)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // The child starts with no blocked signals and default dispositions, whatever the test
        // runner's threads have set.
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP, SIGQUIT] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var pid: pid_t = 0
        let spawned = withCStrings(full) { cArgv in
            withCStrings(env) { cEnv in
                posix_spawn(&pid, full[0], &actions, &attributes, cArgv, cEnv)
            }
        }
        guard spawned == 0 else {
            return CommandResult(argv: argv, status: 127, stdout: "",
                                 stderr: "test harness: cannot start \(full[0]): \(Posix.describe(spawned))",
                                 timedOut: false)
        }

        var status: Int32 = 0
        var killedByHarness = false
        let deadline = Date().addingTimeInterval(Double(timeout) + 15)
        var delay: useconds_t = 500
        while true {
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid || (r < 0 && errno != EINTR) { break }
            if Date() > deadline {
                kill(pid, SIGKILL)
                killedByHarness = true
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                break
            }
            usleep(delay)
            delay = min(delay * 2, 20_000)
        }
        let exitStatus: Int32 = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        return CommandResult(argv: argv, status: exitStatus,
                             stdout: readText(outPath), stderr: readText(errPath),
                             timedOut: killedByHarness || exitStatus == 124 || exitStatus == 137)
    }

    /// Runs a bash script with `set -euo pipefail`.
    static func bash(_ script: String, timeout: Int = 60, cwd: String? = nil,
                     environment: [String: String]? = nil) -> CommandResult {
        run(["bash", "-c", "set -euo pipefail\n" + script], timeout: timeout, cwd: cwd, environment: environment)
    }

    private static func withCStrings<R>(_ strings: [String],
                                        _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
        let pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) } + [nil]
        defer { pointers.forEach { free($0) } }
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }

    /// One folder of the test process's own for commands' output: files made and removed in
    /// /tmp itself for each command would flood a file manager watching /tmp (Nautilus watches
    /// each folder on its path bar) and keep it busy.
    private static let outputFolder: String = {
        var template = Array("/tmp/ubiquityfs-mounttests-io-XXXXXX".utf8CString)
        guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else { return "/tmp" }
        let folder = stringFromCBuffer(template)
        // Removed when the test process ends.
        atexit { _ = Command.removeOutputFolder() }
        return folder
    }()

    fileprivate static func removeOutputFolder() -> Int32 {
        guard outputFolder != "/tmp" else { return 0 }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: outputFolder)) ?? [] {
            unlink(outputFolder + "/" + name)
        }
        return rmdir(outputFolder)
    }

    private static func temporaryFile(_ kind: String) -> String {
        var template = Array("\(outputFolder)/\(kind)-XXXXXX".utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        if fd >= 0 { close(fd) }
        return stringFromCBuffer(template)
    }

    private static func readText(_ path: String) -> String {
        guard let data = FileManager.default.contents(atPath: path) else { return "" }
        return String(decoding: data, as: UTF8.self)
    }
}

/// Quotes a string for a bash script.
func shellQuote(_ s: String) -> String {
    "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'"
}

/// A program left running while a test drives it (an X server, a D-Bus daemon, a file manager),
/// stopped by its pid, never by name.
final class BackgroundProcess {
    let pid: pid_t
    let argv: [String]

    /// Starts `argv` (looked up on PATH) with stdout and stderr into `log`.
    init(_ argv: [String], environment: [String: String], log: String) throws {
        self.argv = argv
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        let env = environment.map { "\($0.key)=\($0.value)" }
        var pid: pid_t = 0
        let cargs = argv.map { strdup($0) } + [nil]
        let cenv = env.map { strdup($0) } + [nil]
        defer { cargs.forEach { free($0) }; cenv.forEach { free($0) } }
        let rc = posix_spawnp(&pid, argv[0], &actions, nil, cargs, cenv)
        guard rc == 0 else { throw FixtureError("cannot start \(argv[0]): \(Posix.describe(rc))") }
        self.pid = pid
    }

    var isRunning: Bool {
        var status: Int32 = 0
        return waitpid(pid, &status, WNOHANG) == 0
    }

    /// SIGTERM, then SIGKILL after `seconds`; reaps it.
    func stop(seconds: Double = 5) {
        guard isRunning else { return }
        kill(pid, SIGTERM)
        let deadline = Date().addingTimeInterval(seconds)
        var status: Int32 = 0
        while Date() < deadline {
            if waitpid(pid, &status, WNOHANG) == pid { return }
            usleep(20_000)
        }
        kill(pid, SIGKILL)
        _ = waitpid(pid, &status, 0)
    }
}
