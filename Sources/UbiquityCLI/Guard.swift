// The connection guard: a small process the daemon starts once mounted, which ends the mount's
// FUSE connection if the daemon dies without being able to finish dying.
//
// Some of the daemon's threads wait on the daemon's own mount: the replay thread makes other
// writers' changes again through it, and an invalidation waits for the folder's lock, which a
// program's request in that folder holds until a worker answers. The kernel waits for the
// answer to a request a worker has read, and for that lock, even under SIGKILL. Killed at such
// a moment, the daemon's workers are gone, the waiting thread never returns, the process never
// finishes exiting, and its /dev/fuse descriptor stays open: the kernel ends a connection only
// when the last descriptor closes, so every program using the mount would hang with it, where
// a daemon that is simply gone leaves an error (ENOTCONN). The guard sees the daemon dying
// (its main thread a zombie while other threads remain, or SIGKILL pending) for a second and
// ends the connection through fusectl, as `umount -f` would: the waits return, the daemon
// finishes exiting, and the mount answers ENOTCONN until it is unmounted. A stopped (SIGSTOP)
// or busy daemon is not dying.

import Foundation
import Glibc

/// The internal first argument that makes `ubiquityfs` a guard.
let guardArgument = "--guard-connection"

/// Starts the guard of the mount whose fusectl connection is `connection` (the N of "0:N").
/// It holds no descriptor of the daemon's but /proc/PID, which names this very process even
/// once its pid is reused, and the connection's `abort` file, opened now: the kernel detaches
/// that file from its connection when the connection ends, so the guard can never end another
/// mount's that got the number since. fusectl is mounted for it if it is not (root only).
func startConnectionGuard(connection: String, logPath: String, log: @Sendable (String) -> Void) {
    let folder = fusectlFolder
    var mountedHere = false
    if access("\(folder)/\(connection)/abort", F_OK) != 0 && !isFusectl(folder) && geteuid() == 0 {
        mountedHere = mount("fusectl", folder, "fusectl", 0, nil) == 0
    }
    let abortFD = open("\(folder)/\(connection)/abort", O_WRONLY | O_CLOEXEC)
    guard abortFD >= 0 else {
        log("no connection guard: cannot open \(folder)/\(connection)/abort (\(String(cString: strerror(errno)))): "
            + "a daemon killed while a thread of its own waits on the mount would leave it hung until 'umount -f'")
        if mountedHere { _ = umount(folder) }
        return
    }
    defer { close(abortFD) }
    let procFD = open("/proc/\(getpid())", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard procFD >= 0 else {
        log("no connection guard: cannot open /proc/\(getpid()): \(String(cString: strerror(errno)))")
        return
    }
    defer { close(procFD) }
    // Every other descriptor closed: above all /dev/fuse, which the guard must never hold open.
    let args = ["ubiquityfs", guardArgument, String(getpid()), connection, logPath, mountedHere ? "unmount-fusectl" : "-"]
    let (_, rc) = spawnDetached(args, passing: [procFD, abortFD], closeOthers: true)
    if rc != 0 { log("no connection guard: cannot start it: \(String(cString: strerror(rc)))") }
}

private let fusectlFolder = "/sys/fs/fuse/connections"

/// Whether fusectl is mounted on `folder`.
private func isFusectl(_ folder: String) -> Bool { mountedEntry(at: folder)?.type == "fusectl" }

/// The guard's life: watch /proc/PID (descriptor 3) four times a second until the daemon is
/// gone; descriptor 4 is the connection's abort file. Arguments: the daemon's pid (for the
/// log), the connection number, the log file, and "unmount-fusectl" if the daemon mounted
/// fusectl for it.
func runConnectionGuard(_ args: [String]) -> Int32 {
    guard args.count == 4, let daemon = pid_t(args[0]), let connection = Int(args[1]) else { return ExitCode.usage }
    _ = chdir("/")
    // The stop of a service (or a terminal's Ctrl-C) is the daemon's; this leaves on its own.
    for s in [SIGTERM, SIGINT, SIGHUP] { signal(s, SIG_IGN) }
    let logger = Logger(path: args[2], toStderr: false)
    defer {
        close(4)
        // Detached lazily: another daemon's guard keeps its abort file open and working.
        if args[3] == "unmount-fusectl" { _ = umount2(fusectlFolder, Int32(MNT_DETACH)) }
    }
    var dyingSince: Date?
    var abortedAt: Date?
    while true {
        usleep(250_000)
        guard let state = processState(procFD: 3) else { return ExitCode.success }   // reaped
        guard state.dying else {
            dyingSince = nil
            continue
        }
        if state.threads <= 1 && state.zombie { return ExitCode.success }   // exited; only unreaped
        let since = dyingSince ?? Date()
        dyingSince = since
        if let abortedAt {
            if Date().timeIntervalSince(abortedAt) > 10 {
                logger.write("guard: daemon \(daemon) has not finished exiting 10 s after its connection was ended; giving up")
                return ExitCode.failure
            }
        } else if Date().timeIntervalSince(since) >= 1 {
            abortedAt = Date()
            if write(4, "1\n", 2) == 2 {
                logger.write("guard: daemon \(daemon) died with a thread still waiting on its own mount; ended FUSE connection "
                             + "\(connection): programs using the mount get ENOTCONN until it is unmounted")
            } else if errno != ENOTCONN {   // ENOTCONN: the connection had ended already
                logger.write("guard: daemon \(daemon) died with a thread still waiting on its own mount, and its FUSE connection "
                             + "\(connection) cannot be ended (\(String(cString: strerror(errno)))): run 'umount -f' on the mount point as root")
                return ExitCode.failure
            }
        }
    }
}

/// What /proc/PID/status says of a process: dying (its main thread a zombie while others
/// remain, or SIGKILL pending), its thread count. nil once the process is reaped.
private func processState(procFD: Int32) -> (dying: Bool, zombie: Bool, threads: Int)? {
    let fd = openat(procFD, "status", O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 4096)
    let n = read(fd, &buffer, buffer.count)
    guard n > 0 else { return nil }
    var zombie = false, threads = 0, killPending = false
    for line in buffer[0..<n].split(separator: UInt8(ascii: "\n")) {
        let text = String(decoding: line, as: UTF8.self)
        guard let colon = text.firstIndex(of: ":") else { continue }
        let value = text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        switch text[..<colon] {
        case "State": zombie = value.hasPrefix("Z") || value.hasPrefix("X")
        case "Threads": threads = Int(value) ?? 0
        case "SigPnd", "ShdPnd":
            // A hex mask; signal 9 is bit 8.
            if let mask = UInt64(value, radix: 16), mask & (1 << 8) != 0 { killPending = true }
        default: break
        }
    }
    return (zombie || killPending, zombie, threads)
}
