// The subcommands: mount, unmount, containers, check.

import Foundation
import UbiquityFileSystem
import UbiquityFuse
import UbiquityManifests
import UbiquitySharedStore
import UbiquityStore

// MARK: - registry glue

extension Registration {
    init(_ r: ContainerRecord) {
        self.init(identifier: r.identifier, bundleIdentifier: r.bundleIdentifier,
                  settings: ContainerSettings(isPublic: r.isPublic, name: r.name,
                                              folderLevels: FolderLevels(rawValue: r.folderLevels) ?? .none),
                  registeredVersion: r.registeredVersion, manifestPath: r.manifestPath, active: false)
    }

    var info: ContainerInfo {
        ContainerInfo(identifier: identifier, bundleIdentifier: bundleIdentifier, name: settings.name,
                      isPublic: settings.isPublic, folderLevels: settings.folderLevels.rawValue,
                      registeredVersion: registeredVersion, manifestPath: manifestPath, active: active)
    }
}

/// Manifests in `apps`, registered against what the store already holds (iCloud's rule).
func registrations(apps: String, previous: [ContainerRecord], applyChanges: Bool) -> (RegistrationResult, [Diagnostic]) {
    let (result, diagnostics, _) = registrationsAndManifests(apps: apps, previous: previous, applyChanges: applyChanges)
    return (result, diagnostics)
}

func registrationsAndManifests(apps: String, previous: [ContainerRecord], applyChanges: Bool)
    -> (RegistrationResult, [Diagnostic], [AppManifest]) {
    let load = loadManifests(directory: apps)
    let result = register(previous: previous.map(Registration.init), manifests: load.manifests, applyChanges: applyChanges)
    return (result, load.diagnostics + result.diagnostics, load.manifests)
}

// MARK: - mount

let mountCommand = Subcommand(
    name: "mount",
    summary: "mount the containers (drive view, or one app's containers with --app)",
    usage: "mount [--apps DIR] [--store DIR|URL [--chunks WHERE] [--local DIR]] [--app BUNDLE_ID] [-o OPTS] [--foreground] [--allow-non-empty] [--keep-versions N] [--retention SPEC] [--keep-deleted-days N] [--cache-seconds S] [--read-ahead KIB] [--io-uring-threads N] MOUNTPOINT",
    options: [
        ("--apps=", "folder of app manifests (default $XDG_CONFIG_HOME/ubiquityfs/apps)"),
        ("--store=", "store folder (default $XDG_DATA_HOME/ubiquityfs), or a shared store's postgres:// URL"),
        ("--chunks=", "shared store: where its chunks live, as init-store set it (postgres or s3://…)"),
        ("--local=", "shared store: this machine's folder for it (default $XDG_DATA_HOME/ubiquityfs-shared/…)"),
        ("--lock-lease=", "shared store: seconds this machine's locks outlast its last word to the server (default 15)"),
        ("--cache-size=", "shared store: most bytes of content kept on this machine, e.g. 20G (default 10G)"),
        ("--timeout=", "shared store: seconds any call to the servers may wait before it fails (default 10)"),
        ("--app=", "mount this app's containers whole (app view) instead of the drive view"),
        ("-o=", "mount options, comma-separated: allow_other, ro, ... (repeatable)"),
        ("--foreground", "stay in the foreground and log to stderr too"),
        ("--allow-non-empty", "mount over a folder that has files in it (they are hidden while mounted)"),
        ("--apply-manifest-changes", "apply container settings edited without raising CFBundleVersion"),
        ("--keep-versions=", "versions kept per file at most, newest first (default 1000, at least 2)"),
        ("--retention=", "old versions kept: all=1d,hourly=7d,daily=30d,space=4G (any of them)"),
        ("--keep-deleted-days=", "days an item stays in Recently Deleted (default 30)"),
        ("--cache-seconds=", "how long the kernel caches names and attributes (default 10, 0 to 3600)"),
        ("--read-ahead=", "KiB the kernel reads ahead in a file read in order (default 4096; 0 keeps the kernel's 128)"),
        ("--io-uring-threads=", "threads per CPU serving requests over io_uring where the kernel offers it (default 4; 0: /dev/fuse only)"),
        ("--ready-fd=", "(internal) descriptor to report readiness on"),
    ],
    positionals: 1...1,
    run: runMount)

private func runMount(_ p: Parsed) throws -> Int32 {
    let mountpoint = absolutePath(p.positionals[0])
    var isDir: ObjCBool = false
    if p.value("--ready-fd") == nil, let problem = mountpointProblem(mountpoint, allowNonEmpty: p.flags.contains("--allow-non-empty")) {
        writeError("ubiquityfs mount: " + problem)
        return ExitCode.failure
    }
    guard FileManager.default.fileExists(atPath: mountpoint, isDirectory: &isDir), isDir.boolValue else {
        writeError("ubiquityfs mount: \(mountpoint) is not an existing folder; create it first (mkdir -p \(mountpoint))")
        return ExitCode.failure
    }
    if let keep = p.value("--keep-versions"), !(Int(keep).map { $0 >= 2 && $0 <= 1_000_000 } ?? false) {
        throw UsageError(message: "--keep-versions needs a number from 2 to 1000000")
    }
    if let spec = p.value("--retention"), RetentionPolicy.parse(spec) == nil {
        throw UsageError(message: "--retention takes all=TIME,hourly=TIME,daily=TIME,space=BYTES (e.g. all=1d,hourly=7d,daily=30d,space=4G), each at least as long as the one before")
    }
    if let days = p.value("--keep-deleted-days"), !(Int(days).map { $0 >= 0 && $0 <= 36_500 } ?? false) {
        throw UsageError(message: "--keep-deleted-days needs a whole number of days from 0 to 36500 (0 empties Recently Deleted at each collection)")
    }
    if let size = p.value("--cache-size"), !(RetentionPolicy.bytes(size).map { $0 >= UInt64(chunkSize) } ?? false) {
        throw UsageError(message: "--cache-size needs a size of at least 1M, e.g. 500M or 20G")
    }
    if let seconds = p.value("--timeout"), !(Double(seconds).map { $0 >= 1 && $0 <= 600 } ?? false) {
        throw UsageError(message: "--timeout needs a number of seconds from 1 to 600")
    }
    if let seconds = p.value("--lock-lease"), !(Int(seconds).map { $0 >= 3 && $0 <= 3600 } ?? false) {
        throw UsageError(message: "--lock-lease needs a whole number of seconds from 3 to 3600")
    }
    if let seconds = p.value("--cache-seconds"), !(Double(seconds).map { $0 >= 0 && $0 <= 3600 } ?? false) {
        throw UsageError(message: "--cache-seconds needs a number of seconds from 0 to 3600")
    }
    if let kib = p.value("--read-ahead"), !(Int(kib).map { $0 >= 0 && $0 <= 1_048_576 } ?? false) {
        throw UsageError(message: "--read-ahead needs a number of KiB from 0 to 1048576")
    }
    if let n = p.value("--io-uring-threads"), !(Int(n).map { $0 >= 0 && $0 <= 64 } ?? false) {
        throw UsageError(message: "--io-uring-threads needs a number from 0 to 64 (0 serves every request through /dev/fuse)")
    }
    if let fd = p.value("--ready-fd") {
        guard let n = Int32(fd) else { throw UsageError(message: "--ready-fd needs a number") }
        return serve(p, mountpoint: mountpoint, readyFD: n)
    }
    if p.flags.contains("--foreground") {
        return serve(p, mountpoint: mountpoint, readyFD: nil)
    }
    return try detach(p)
}

/// Start the daemon as a new session (never fork a running Swift process) and wait on a pipe
/// until it says the mount is ready, or why it failed.
private func detach(_ p: Parsed) throws -> Int32 {
    var fds: [Int32] = [0, 0]
    // Close-on-exec: the child gets only the dup at fd 3, so its exit or close is our EOF.
    guard pipe(&fds) == 0 else { throw FSError(errno, "pipe failed") }
    _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
    _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
    let (pid, rc) = spawnDetached(["ubiquityfs", "mount", "--ready-fd", "3"] + p.raw, passing: [fds[1]])
    close(fds[1])
    guard rc == 0 else {
        close(fds[0])
        throw FSError(rc, "cannot start the daemon")
    }
    // Read the daemon's report: lines to show, then "ready" or "error: ...".
    var data = Data()
    var buffer = [UInt8](repeating: 0, count: 4096)
    while !data.split(separator: UInt8(ascii: "\n")).contains(where: { $0.elementsEqual("ready".utf8) }) {
        let n = read(fds[0], &buffer, buffer.count)
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { break }
        data.append(contentsOf: buffer[0..<n])
    }
    close(fds[0])
    let lines = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
    var ready = false
    for line in lines {
        if line == "ready" { ready = true } else { writeError(line) }
    }
    if ready { return ExitCode.success }
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    if lines.isEmpty { writeError("ubiquityfs mount: the daemon exited before the mount was ready (status \(status))") }
    return ExitCode.failure
}

/// Starts this binary with `args` in a session of its own, its standard streams on /dev/null
/// and `passing` as descriptors 3, 4, …; with `closeOthers`, every other descriptor closed
/// (else only the close-on-exec ones). Returns the pid and posix_spawn's result.
func spawnDetached(_ args: [String], passing: [Int32], closeOthers: Bool = false) -> (pid_t, Int32) {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    for (i, fd) in passing.enumerated() { posix_spawn_file_actions_adddup2(&actions, fd, 3 + Int32(i)) }
    if closeOthers {
        guard let closeFrom = spawnCloseFrom, closeFrom(&actions, 3 + Int32(passing.count)) == 0 else { return (0, ENOSYS) }
    }
    var attr = posix_spawnattr_t()
    posix_spawnattr_init(&attr)
    defer { posix_spawnattr_destroy(&attr) }
    posix_spawnattr_setflags(&attr, Int16(0x80))  // POSIX_SPAWN_SETSID (glibc): not imported
    var pid: pid_t = 0
    let cargs = args.map { strdup($0) } + [nil]
    defer { cargs.forEach { free($0) } }
    let rc = posix_spawn(&pid, "/proc/self/exe", &actions, &attr, cargs, environ)
    return (pid, rc)
}

/// glibc 2.34's posix_spawn_file_actions_addclosefrom_np, which Swift's Glibc does not show.
private let spawnCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? =
    dlsym(nil, "posix_spawn_file_actions_addclosefrom_np").map {
        unsafeBitCast($0, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }

/// Run the daemon in this process until unmounted or signalled.
private func serve(_ p: Parsed, mountpoint: String, readyFD: Int32?) -> Int32 {
    // Programs this daemon starts (libfuse's fusermount3, which stays with auto_unmount) must not
    // hold the caller's pipe open: the caller would wait for them.
    if let readyFD { _ = fcntl(readyFD, F_SETFD, FD_CLOEXEC) }
    raiseDescriptorLimit()
    let apps = absolutePath(p.value("--apps") ?? defaultAppsDirectory())
    let tell: (String) -> Void = { line in
        if let readyFD { _ = (line + "\n").withCString { write(readyFD, $0, strlen($0)) } } else { writeError(line) }
    }
    let storeDir: String
    do { storeDir = try storeFolder(p) } catch {
        tell("ubiquityfs mount: \(error)")
        return ExitCode.failure
    }
    var store: BackingStore
    let lease = p.value("--lock-lease").flatMap { Int($0) } ?? 15
    // The store may log before the log file exists (it is in the store's folder).
    let early = LogRelay()
    let timeout = p.value("--timeout").flatMap { Double($0) } ?? 10
    do { store = try openStore(storeDir, lockLease: lease, timeout: timeout) { early.write($0) } } catch {
        tell("ubiquityfs mount: cannot open the store: \(error)")
        return ExitCode.failure
    }
    let logger = Logger(path: storeDir + "/ubiquityfs.log", toStderr: readyFD == nil)
    let log: @Sendable (String) -> Void = { logger.write($0) }
    log("starting: store \(storeLabel(storeDir)), apps \(apps), mountpoint \(mountpoint)")
    early.attach(log)
    var faults: FaultPlan?
    if let script = ProcessInfo.processInfo.environment["UBIQUITYFS_FAULT_FILE"], !script.isEmpty {
        let plan = FaultPlan()
        store = injectingFaults(into: store, plan: plan, from: script, log: log)
        faults = plan
    }
    // From here on, a failure goes to the log as well as to whoever started the mount.
    let report: (String) -> Void = { line in
        tell(line)
        if readyFD != nil { log(line) }
    }
    // A detached daemon must not keep the caller's working folder busy.
    if readyFD != nil { _ = chdir("/") }

    let snapshot: StoreSnapshot
    do { snapshot = try store.metadata.load() } catch {
        report("ubiquityfs mount: cannot read the store: \(error)")
        return ExitCode.failure
    }
    let (result, diagnostics) = registrations(apps: apps, previous: snapshot.containers,
                                              applyChanges: p.flags.contains("--apply-manifest-changes"))
    for d in diagnostics {
        log(d.description)
        if readyFD != nil { tell(d.description) }
    }
    let view: View
    if let bundle = p.value("--app") {
        guard result.registrations.contains(where: { $0.bundleIdentifier == bundle && $0.active }) else {
            report("ubiquityfs mount: no app with bundle identifier \(bundle) in \(apps); check its manifest with 'ubiquityfs check --apps \(apps)'")
            return ExitCode.failure
        }
        view = .app(bundleIdentifier: bundle)
    } else {
        view = .drive
    }
    // Retention is the store's setting: options given here change it for every daemon on it,
    // before this start's own collection prunes by it.
    var policy = UbiquityFileSystem.storedRetention(in: snapshot.meta)
    if let spec = p.value("--retention"), let parsed = RetentionPolicy.parse(spec, over: policy) { policy = parsed }
    if let keep = p.value("--keep-versions").flatMap({ Int($0) }) { policy.maxPerFile = keep }
    if let days = p.value("--keep-deleted-days").flatMap({ Int64($0) }) { policy.deletedFor = days * RetentionPolicy.day }
    let fs: UbiquityFileSystem
    do {
        fs = try UbiquityFileSystem(store: store, containers: result.registrations.map(\.info), view: view,
                                    snapshot: consume snapshot, retention: policy, log: log)
    } catch {
        report("ubiquityfs mount: cannot open the filesystem: \(error)")
        return ExitCode.failure
    }
    fs.storeLocation = storeDir
    let options = (p.values["-o"] ?? []).flatMap { $0.split(separator: ",").map(String.init) }.filter { !$0.isEmpty }
    let session: FuseSession
    let cacheSeconds = p.value("--cache-seconds").flatMap { Double($0) } ?? FuseSession.defaultCacheSeconds
    // As /proc/self/mountinfo names it (symlinks resolved), before the mount covers the folder.
    let resolved = realpath(mountpoint, nil).map { p in defer { free(p) }; return String(cString: p) } ?? mountpoint
    do {
        session = try FuseSession(fs: fs, mountpoint: mountpoint, options: options, source: "ubiquityfs:" + storeLabel(storeDir),
                                  cacheSeconds: cacheSeconds, faults: faults, log: log)
    } catch {
        report("ubiquityfs mount: \(error)")
        return ExitCode.failure
    }
    if let kib = p.value("--read-ahead").flatMap({ Int($0) }) { session.readAheadKiB = kib }
    if let n = p.value("--io-uring-threads").flatMap({ Int($0) }) { session.ioUringThreadsPerCPU = n }
    if let entry = mountedEntry(at: resolved), entry.type == "fuse.ubiquityfs", entry.device.hasPrefix("0:") {
        session.device = entry.device
        startConnectionGuard(connection: String(entry.device.dropFirst(2)), logPath: storeDir + "/ubiquityfs.log", log: log)
    } else {
        log("\(resolved) is not in /proc/self/mountinfo as this mount: read-ahead stays the kernel's, and nothing ends the "
            + "connection if this daemon dies with a thread waiting on its own mount")
    }
    let pidFile = storeDir + "/daemon.pid"
    writePIDFile(pidFile)
    log("mounted \(mountpoint) (\(view == .drive ? "drive view" : "app view"), pid \(getpid()))")
    if let readyFD {
        tell("ready")
        close(readyFD)
    }

    // The snapshot the namespace was built from (a second copy of every node record and name
    // entry) is freed by now: its pages go back at once, not at the first 10 s tick.
    returnFreedMemory()
    let publisher = IdlePublisher(fs: fs)
    publisher.start()
    let feed = ChangeFeed(fs: fs, session: session, log: log)
    feed.start()
    // `restore`, `resolve` and `status` come through here while the mount runs.
    let control = ControlServer(storeDir: storeDir, fs: fs, log: log, afterChange: { feed.waitForRound() })
    var controlling = true
    do { try control.start() } catch {
        controlling = false
        log("commands cannot reach this daemon (they will open the store themselves): \(error)")
    }
    let signal = session.run()
    if controlling { control.stop() }
    feed.stop()
    publisher.stop()
    log(signal == 0 ? "unmounted; publishing pending work" : "signal \(signal); publishing pending work and unmounting")
    let failures = fs.stop()
    session.close()
    // Another daemon on the store may have written its pid since: remove only our own.
    if (try? String(contentsOfFile: pidFile, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) == String(getpid()) {
        try? FileManager.default.removeItem(atPath: pidFile)
    }
    log(failures.isEmpty ? "stopped cleanly" : "stopped; \(failures.count) working copies kept for recovery")
    return failures.isEmpty ? ExitCode.success : ExitCode.failure
}

/// The soft limit of open descriptors up to the hard one: each file being written holds its
/// working copy's map and up to eight chunk files open, beside 256 cached blob descriptors, and
/// 1,024 (the usual soft limit) would run out with a hundred or so such files at once.
private func raiseDescriptorLimit() {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
    limit.rlim_cur = limit.rlim_max
    _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}

/// glibc keeps what threads free in their own arenas: after a burst on many FUSE workers (1 MiB
/// read and write buffers each) the daemon held tens of MiB it no longer used. `malloc_trim`
/// hands the free pages of every arena back. Not in Swift's Glibc module, hence `dlsym`.
private let mallocTrim: (@convention(c) (Int) -> Int32)? = dlsym(nil, "malloc_trim").map {
    unsafeBitCast($0, to: (@convention(c) (Int) -> Int32).self)
}

func returnFreedMemory() { _ = mallocTrim?(0) }

/// Publishes files held open once they have been idle (so readers elsewhere see them), once a
/// second; and hands freed memory back every 10 s.
final class IdlePublisher: @unchecked Sendable {
    private let fs: UbiquityFileSystem
    private let condition = NSCondition()
    private var stopping = false   // guarded by condition
    private var finished = false   // guarded by condition
    private var thread: Thread?

    init(fs: UbiquityFileSystem) { self.fs = fs }

    func start() {
        let t = Thread { [self] in
            var ticks = 0
            while true {
                condition.lock()
                if !stopping { _ = condition.wait(until: Date().addingTimeInterval(1)) }
                let stop = stopping
                condition.unlock()
                if stop { break }
                fs.publishIdle()
                ticks += 1
                if ticks % 10 == 0 { returnFreedMemory() }
            }
            condition.lock()
            finished = true
            condition.broadcast()
            condition.unlock()
        }
        t.name = "idle-publisher"
        thread = t
        t.start()
    }

    /// Stop, and wait until a publish in progress has finished: the daemon's own stop publishes
    /// everything and then records a clean stop, after which nothing may be published.
    func stop() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while thread != nil && !finished { condition.wait() }
        condition.unlock()
    }
}

/// Applies other writers' changes from the store's change log (ten times a second, or as soon as a
/// shared store signals a commit) and tells the kernel to drop what it cached of them, from a
/// thread of its own.
final class ChangeFeed: @unchecked Sendable {
    private let fs: UbiquityFileSystem
    private let session: FuseSession
    private let log: @Sendable (String) -> Void
    private let condition = NSCondition()
    private var stopping = false   // guarded by condition
    private var finished = false   // guarded by condition
    private var started = false    // guarded by condition
    private var roundsBegun = 0    // guarded by condition
    private var roundsDone = 0     // guarded by condition
    static let interval: TimeInterval = 0.1

    init(fs: UbiquityFileSystem, session: FuseSession, log: @escaping @Sendable (String) -> Void) {
        self.fs = fs
        self.session = session
        self.log = log
    }

    func start() {
        let t = Thread { [self] in
            var failing = false
            while true {
                // A shared store's notification ends the wait early; otherwise this polls.
                fs.waitForStoreChanges(Self.interval)
                condition.lock()
                let stop = stopping
                roundsBegun += 1
                condition.unlock()
                if stop { break }
                defer {
                    condition.lock()
                    roundsDone += 1
                    condition.broadcast()
                    condition.unlock()
                }
                // Changes queued while the store was out of reach go first: the change log is
                // read once they are there.
                fs.sendQueuedChanges()
                do {
                    let (changes, watches) = try fs.catchUpForKernel()
                    let held = fs.heldByKernel(changes)
                    if !held.isEmpty { session.invalidate(held) }
                    session.replay(watches)
                    // Changes queued while the store was out of reach that another machine's
                    // overtook; what settling them changes reaches the kernel at the next round.
                    fs.settleQueuedChanges()
                    if failing { log("change feed: reading the store's change log works again") }
                    failing = false
                } catch {
                    if !failing { log("change feed: cannot read the store's change log: \(error)") }
                    failing = true
                }
            }
            condition.lock()
            finished = true
            condition.broadcast()
            condition.unlock()
        }
        t.name = "change-feed"
        condition.lock()
        started = true
        condition.unlock()
        t.start()
    }

    /// Wait (2 s at most) until a round that began after this call has sent its invalidations:
    /// what was changed before the call has then reached the kernel.
    func waitForRound() {
        condition.lock()
        defer { condition.unlock() }
        let target = roundsBegun + 1
        let deadline = Date().addingTimeInterval(2)
        while started && !finished && roundsDone < target {
            if !condition.wait(until: deadline) { return }
        }
    }

    /// Stop and wait for the thread: the session it notifies is freed next.
    func stop() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while started && !finished { condition.wait() }
        condition.unlock()
    }
}

/// Holds log lines until the log exists, then passes them (and every later one) on.
final class LogRelay: @unchecked Sendable {
    // `lock` guards `held` and `target`.
    private let lock = NSLock()
    private var held: [String] = []
    private var target: (@Sendable (String) -> Void)?

    func write(_ line: String) {
        lock.lock()
        if let target {
            lock.unlock()
            target(line)
            return
        }
        held.append(line)
        lock.unlock()
    }

    func attach(_ log: @escaping @Sendable (String) -> Void) {
        lock.lock()
        let lines = held
        held = []
        target = log
        lock.unlock()
        lines.forEach(log)
    }
}

/// Appends timestamped lines to the daemon's log file (and stderr in the foreground).
final class Logger: @unchecked Sendable {
    private let fd: Int32
    private let toStderr: Bool
    init(path: String, toStderr: Bool) {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        self.toStderr = toStderr
    }
    func write(_ message: String) {
        let stamp = ISO8601DateFormatter.string(from: Date(), timeZone: .current,
                                                formatOptions: [.withInternetDateTime, .withFractionalSeconds])
        let line = "\(stamp) [\(getpid())] \(message)\n"
        line.withCString { p in
            let n = strlen(p)
            if fd >= 0 { _ = Glibc.write(fd, p, n) }
            if toStderr { _ = Glibc.write(2, p, n) }
        }
    }
}

// MARK: - unmount

let unmountCommand = Subcommand(
    name: "unmount",
    summary: "unmount, then wait for the daemon to publish pending work and stop",
    usage: "unmount [--if-dead] MOUNTPOINT",
    options: [("--if-dead", "only clear the mount of a daemon that is gone; anything else is left alone (exit 0)")],
    positionals: 1...1,
    run: { p in
        let mountpoint = absolutePath(p.positionals[0])
        if p.flags.contains("--if-dead") {
            var st = statvfs()
            guard isMounted(mountpoint), statvfs(mountpoint, &st) != 0, errno == ENOTCONN else { return ExitCode.success }
            return runProgram("/bin/fusermount3", ["-uz", mountpoint]) == 0 ? ExitCode.success : ExitCode.failure
        }
        var buffer = [UInt8](repeating: 0, count: 32)
        let n = c_getxattr(mountpoint, "user.ubiquityfs.daemon-pid", &buffer, buffer.count)
        let pid: pid_t? = n > 0 ? pid_t(String(decoding: buffer[0..<n], as: UTF8.self)) : nil
        guard pid != nil || isMounted(mountpoint) else {
            writeError("ubiquityfs unmount: \(mountpoint) is not a ubiquityfs mount")
            return ExitCode.failure
        }
        // The daemon's own replays for watchers hold the mount for a moment at a time: a busy
        // mount is tried again for about a second before it counts as busy.
        var status = runProgram("/bin/fusermount3", ["-u", mountpoint], quiet: true)
        for attempt in 1...10 where status != 0 && isMounted(mountpoint) {
            usleep(100_000)
            status = runProgram("/bin/fusermount3", ["-u", mountpoint], quiet: true)
        }
        guard status == 0 || !isMounted(mountpoint) else {
            writeError("ubiquityfs unmount: \(mountpoint) is busy: a program has a file or folder open there "
                       + "('fuser -m \(mountpoint)' names it); the mount goes on working. Close it and try again")
            return ExitCode.failure
        }
        // The daemon publishes pending work after the kernel lets go; wait for it to finish.
        if let pid {
            for _ in 0..<1200 {
                if hasExited(pid) { return ExitCode.success }
                usleep(50_000)
            }
            writeError("ubiquityfs unmount: unmounted, but daemon \(pid) is still publishing after 60 s")
            return ExitCode.failure
        }
        return ExitCode.success
    })

/// Whether process `pid` has ended: gone, or a zombie. A detached daemon's parent is init, and
/// an init that reaps late (one container's took 1.2 s) left `unmount` waiting on a process
/// that had finished all its work.
func hasExited(_ pid: pid_t) -> Bool {
    if kill(pid, 0) != 0 { return errno == ESRCH }
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return false }
    let state = stat[stat.index(after: close)...].drop { $0 == " " }.first
    return state == "Z" || state == "X"
}

func isMounted(_ path: String) -> Bool {
    guard let mounts = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8) else { return false }
    return mounts.split(separator: "\n").contains { line in
        let fields = line.split(separator: " ")
        return fields.count > 2 && fields[1] == path && fields[2].hasPrefix("fuse")
    }
}

func runProgram(_ path: String, _ args: [String], quiet: Bool = false) -> Int32 {
    var pid: pid_t = 0
    let cargs = ([path] + args).map { strdup($0) } + [nil]
    defer { cargs.forEach { free($0) } }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    if quiet { posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0) }
    guard posix_spawn(&pid, path, &actions, nil, cargs, environ) == 0 else { return 127 }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
}

// MARK: - containers

let containersCommand = Subcommand(
    name: "containers",
    summary: "list the containers the manifests declare, as registered in the store",
    usage: "containers [--apps DIR] [--store DIR] [--apply-manifest-changes]",
    options: [
        ("--apps=", "folder of app manifests (default $XDG_CONFIG_HOME/ubiquityfs/apps)"),
        ("--store=", "store folder (default $XDG_DATA_HOME/ubiquityfs)"),
        ("--apply-manifest-changes", "show the settings as they would be with edits applied"),
    ],
    positionals: 0...0,
    run: { p in
        let storeDir = try storeFolder(p)
        let apps = absolutePath(p.value("--apps") ?? defaultAppsDirectory())
        // A read-only look at the registry: changes nothing, and works while a daemon serves it.
        let previous = try registeredContainers(storeDir)
        let (result, diagnostics, manifests) = registrationsAndManifests(
            apps: apps, previous: previous, applyChanges: p.flags.contains("--apply-manifest-changes"))
        // An app's first declared container is its default (url(forUbiquityContainerIdentifier: nil)).
        let defaults = Set(manifests.compactMap { $0.containers.first?.identifier })
        var rows = [["ID", "NAME", "PUBLIC", "LEVELS", "VERSION", "STATE", "DEFAULT"]]
        for r in result.registrations.sorted(by: { $0.identifier < $1.identifier }) {
            rows.append([r.identifier, r.settings.name, r.settings.isPublic ? "yes" : "no",
                         r.settings.folderLevels.rawValue, r.registeredVersion, r.active ? "active" : "inactive",
                         defaults.contains(r.identifier) ? "yes" : "no"])
        }
        writeTable(rows)
        if !diagnostics.isEmpty {
            writeOut("")
            for d in diagnostics { writeOut(d.description) }
        }
        return ExitCode.success
    })

// MARK: - check

let checkCommand = Subcommand(
    name: "check",
    summary: "validate the app manifests: one line per problem, exit 1 if there is any",
    usage: "check [--apps DIR]",
    options: [("--apps=", "folder of app manifests (default $XDG_CONFIG_HOME/ubiquityfs/apps)")],
    positionals: 0...0,
    run: { p in
        let apps = absolutePath(p.value("--apps") ?? defaultAppsDirectory())
        let (_, diagnostics) = registrations(apps: apps, previous: [], applyChanges: false)
        for d in diagnostics { writeOut(d.description) }
        // Any problem, warnings included (e.g. folder levels left to default), fails the check:
        // it exists to catch mistakes before an app ships.
        if !diagnostics.isEmpty { return ExitCode.failure }
        writeOut("\(apps): all manifests are valid")
        return ExitCode.success
    })

// MARK: - fsck

let fsckCommand = Subcommand(
    name: "fsck",
    summary: "check that a store's names, files, versions and chunks agree: one line per problem, exit 1 if any",
    usage: "fsck [--store DIR|URL [--local DIR]] [--full] [--repair]",
    options: [("--store=", "store folder (default $XDG_DATA_HOME/ubiquityfs), or a shared store's postgres:// URL"),
              ("--local=", "shared store: this machine's folder for it"),
              ("--full", "also read every chunk and compare it with its checksum"),
              ("--repair", "mend what can be mended (no daemon may serve the store): what lost its name goes to "
               + "lost+found in Recently Deleted, nothing a user wrote is deleted; then check again")],
    positionals: 0...0,
    run: { p in
        let folder = try storeFolder(p)
        guard hasStore(folder) else { throw UsageError(message: "no store in \(folder)") }
        let repairing = p.flags.contains("--repair")
        if repairing && sharedStore(in: folder) != nil {
            // Other machines may be writing: a repair would be a blind overwrite of their changes.
            writeError("ubiquityfs fsck: --repair mends the embedded store only; a shared store's machines may be writing")
            return ExitCode.failure
        }
        let store = try openStore(folder)
        if store.work.otherWritersAlive() {
            if repairing {
                writeError("a daemon serves \(storeLabel(folder)): unmount it first (`ubiquityfs unmount MOUNTPOINT`), then repair")
                return ExitCode.failure
            }
            writeError("a daemon serves \(storeLabel(folder)): what it changes while this runs may show as problems")
        }
        let full = p.flags.contains("--full")
        var report = try checkStore(store, full: full)
        for line in report.problems { writeOut("problem: " + line) }
        for line in report.notes { writeOut("note: " + line) }
        if repairing && !report.problems.isEmpty {
            let repair = try repairStore(store, writer: TrashRecord.repairWriter(device: ProcessInfo.processInfo.hostName))
            for line in repair.done { writeOut("repaired: " + line) }
            report = try checkStore(store, full: full)
            for line in report.problems { writeOut("left: " + line) }
            if !report.problems.isEmpty {
                writeOut("what is left cannot be mended here: a missing or damaged chunk loses that version's content; "
                         + "`ubiquityfs versions` lists a file's other versions and `ubiquityfs restore` brings one back")
            }
            writeOut("\(storeLabel(folder)): after repair: " + report.summary)
        } else {
            writeOut("\(storeLabel(folder)): " + report.summary)
        }
        return report.problems.isEmpty ? ExitCode.success : ExitCode.failure
    })

/// getxattr(2): <sys/xattr.h> is not part of Glibc's Swift module.
@_silgen_name("getxattr")
func c_getxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int

/// Write our pid to `path` atomically (temp file + rename). Not Foundation's atomic write: on
/// Linux it leaves a TemporaryDirectory.* folder behind in /tmp on every call.
func writePIDFile(_ path: String) {
    let temp = path + ".tmp"
    let fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else { return }
    let text = "\(getpid())\n"
    _ = text.withCString { write(fd, $0, strlen($0)) }
    close(fd)
    rename(temp, path)
}

/// For the project's own tests of faults through a mount: the store's calls fail or slow down
/// as the file `script` says (see `FaultPlan.load(script:)`), read again whenever it changes.
/// Only when the daemon was started with UBIQUITYFS_FAULT_FILE set, which nothing but those
/// tests does; the log says so at start.
func injectingFaults(into store: BackingStore, plan: FaultPlan, from script: String, log: @escaping @Sendable (String) -> Void) -> BackingStore {
    log("fault injection: the store's calls fail as \(script) says (UBIQUITYFS_FAULT_FILE is set)")
    let thread = Thread {
        var seen: (Int, Int)? = nil
        while true {
            var st = stat()
            let now = stat(script, &st) == 0 ? (Int(st.st_mtim.tv_sec) * 1_000_000_000 + Int(st.st_mtim.tv_nsec), Int(st.st_size)) : (0, -1)
            if seen.map({ $0 != now }) ?? true {
                seen = now
                let text = (try? String(contentsOfFile: script, encoding: .utf8)) ?? ""
                for problem in plan.load(script: text) { log("fault injection: \(script) \(problem)") }
                log("fault injection: now \(text.split(separator: "\n").filter { !$0.hasPrefix("#") }.joined(separator: "; "))")
            }
            usleep(20_000)
        }
    }
    thread.start()
    return faultInjecting(store, plan: plan)
}
