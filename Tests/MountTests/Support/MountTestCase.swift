// The fixture every mount test builds on.
//
// Each test gets its own temporary folder:
//
//     /tmp/ubiquityfs-mt-XXXXXX/
//         apps/      copies of samples/apps/*.plist (plus any manifest the test writes)
//         store/     the store (`--store`): daemon.pid and ubiquityfs.log live here
//         mnt/       the mount point
//         scratch/   plain local files to compare the mount against
//         home/ …    HOME and the XDG folders of every program the test runs
//
// and drives the built `ubiquityfs` binary (`.build/debug/ubiquityfs`, or `$UBIQUITYFS_BIN`).
// Clean-up runs after every test, failed or not: `fusermount3 -u` (then `-uz`), SIGKILL of any daemon
// of ours still alive (by the pid it wrote, after checking /proc that it is ours), removal of the folder.
// A watchdog kills the daemon if a test runs past its deadline: that aborts the FUSE connection, so
// a system call blocked on a hung mount returns ENOTCONN and the test fails instead of hanging.

import Foundation
import Glibc
import XCTest

struct FixtureError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One container entry of a test manifest.
struct ContainerSpec {
    var identifier = "iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)"
    var isPublic: Bool? = true
    var name: String?
    var levels: String?
}

class MountTestCase: XCTestCase {
    /// The package root, found from this file's path: Tests/MountTests/Support/MountTestCase.swift.
    static let packageRoot: String = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<4 { url.deleteLastPathComponent() }
        return url.path
    }()

    static var binary: String {
        if let path = ProcessInfo.processInfo.environment["UBIQUITYFS_BIN"], !path.isEmpty { return path }
        return packageRoot + "/.build/debug/ubiquityfs"
    }

    /// Seconds a single test may run before the watchdog kills its daemon (times `Command.slack`).
    var testDeadline: Double { 150 }

    private(set) var workDir = ""
    var appsDir: String { workDir + "/apps" }
    /// The store folder: `--store` of every mount, unless a test mounts with the default locations.
    var storeDir: String { storeDirOverride ?? workDir + "/store" }
    /// Set by a test that lets the daemon pick its default store folder.
    var storeDirOverride: String?
    /// Where the daemon keeps its store when no --store is given ($XDG_DATA_HOME/ubiquityfs).
    var defaultStoreDir: String { homeDir + "/.local/share/ubiquityfs" }
    var mountPoint: String { workDir + "/mnt" }
    var scratchDir: String { workDir + "/scratch" }
    var homeDir: String { workDir + "/home" }

    /// Every mount point and daemon this test has used, for clean-up.
    private var usedMountPoints: Set<String> = []
    private var daemonPIDs: Set<pid_t> = []
    private var watchdog: Watchdog?

    /// The environment of every program the tests run: a private HOME and XDG folders, UTC, UTF-8.
    var environment: [String: String] {
        var env = ProcessInfo.processInfo.environment
        env["HOME"] = homeDir
        env["XDG_CONFIG_HOME"] = homeDir + "/.config"
        env["XDG_DATA_HOME"] = homeDir + "/.local/share"
        env["XDG_CACHE_HOME"] = homeDir + "/.cache"
        env["TZ"] = "UTC"
        env["LC_ALL"] = "C.UTF-8"
        env["GIT_CONFIG_NOSYSTEM"] = "1"
        // Daemons check even the expectations they skip: a model drifting from its store fails.
        env["UBIQUITYFS_CHECK_EXPECTATIONS"] = "1"
        env.removeValue(forKey: "UBIQUITYFS_BIN")
        return env
    }

    // MARK: Life cycle

    override func setUpWithError() throws {
        try super.setUpWithError()
        guard FileManager.default.isExecutableFile(atPath: Self.binary) else {
            let message = "the ubiquityfs binary is missing at \(Self.binary): build it with `swift build` "
                + "(or point UBIQUITYFS_BIN at it); mount tests drive the real binary and cannot run without it"
            XCTFail(message)
            throw FixtureError(message)
        }
        var template = Array("/tmp/ubiquityfs-mt-XXXXXX".utf8CString)
        guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else {
            throw FixtureError("mkdtemp failed: \(Posix.describe(errno))")
        }
        workDir = stringFromCBuffer(template)
        for dir in [appsDir, storeDir, mountPoint, scratchDir, homeDir] {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        }
        watchdog = Watchdog(seconds: testDeadline * Command.slack, test: name,
                            pidFiles: [storeDir + "/daemon.pid", defaultStoreDir + "/daemon.pid"])
        try installSampleManifests()
    }

    override func tearDown() {
        if watchdog?.cancel() == true {
            XCTFail("the watchdog stopped this test after \(Int(testDeadline * Command.slack)) s and killed the daemon (hung mount?)")
        }
        if let run = testRun, run.totalFailureCount > 0 {
            print("--- daemon log (tail) of \(name):\n\(daemonLogTail())")
        }
        cleanUp()
        super.tearDown()
    }

    /// Unmounts, kills and removes whatever this test left; safe to call more than once.
    private func cleanUp() {
        guard !workDir.isEmpty else { return }
        usedMountPoints.formUnion(fuseMounts(under: workDir))
        for mnt in usedMountPoints.union([mountPoint]) where isMounted(mnt) {
            if !Command.run(["fusermount3", "-u", mnt], timeout: 20).succeeded || isMounted(mnt) {
                _ = Command.run(["fusermount3", "-uz", mnt], timeout: 20)
            }
        }
        var pids = daemonPIDs
        let folders = ((try? FileManager.default.contentsOfDirectory(atPath: workDir)) ?? []).map { workDir + "/" + $0 }
        for dir in folders + [defaultStoreDir] {
            if let pid = readDaemonPID(storeDir: dir) { pids.insert(pid) }
        }
        for pid in pids where isOurDaemon(pid) {
            if !waitForExit(pid, seconds: 3) {
                kill(pid, SIGKILL)
                _ = waitForExit(pid, seconds: 5)
            }
        }
        for mnt in usedMountPoints.union([mountPoint]) where isMounted(mnt) {
            _ = Command.run(["fusermount3", "-uz", mnt], timeout: 20)
        }
        let stillMounted = usedMountPoints.union([mountPoint]).filter { isMounted($0) }
        if !stillMounted.isEmpty {
            XCTFail("clean-up could not unmount \(stillMounted.sorted()); left \(workDir) in place")
            return
        }
        let rm = Command.run(["rm", "-rf", "--one-file-system", workDir], timeout: 120)
        if !rm.succeeded { XCTFail("clean-up could not remove \(workDir): \(rm)") }
        workDir = ""
    }

    // MARK: Manifests

    /// Copies samples/apps/*.plist into the test's apps folder.
    func installSampleManifests() throws {
        let samples = Self.packageRoot + "/samples/apps"
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: samples)) ?? [])
            .filter { $0.hasSuffix(".plist") }
        guard !names.isEmpty else {
            let message = "no sample manifests in \(samples): the mount tests need samples/apps/*.plist"
            XCTFail(message)
            throw FixtureError(message)
        }
        for name in names {
            try FileManager.default.copyItem(atPath: samples + "/" + name, toPath: appsDir + "/" + name)
        }
    }

    /// Writes an XML Info.plist into the apps folder.
    func writeManifest(_ fileName: String, bundleID: String, bundleName: String, version: String,
                       containers: [ContainerSpec]) throws {
        func escape(_ s: String) -> String {
            s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
        }
        var xml = """
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
            <plist version="1.0">
            <dict>
            \t<key>CFBundleIdentifier</key>
            \t<string>\(escape(bundleID))</string>
            \t<key>CFBundleName</key>
            \t<string>\(escape(bundleName))</string>
            \t<key>CFBundleVersion</key>
            \t<string>\(escape(version))</string>
            \t<key>NSUbiquitousContainers</key>
            \t<dict>

            """
        for c in containers {
            xml += "\t\t<key>\(escape(c.identifier))</key>\n\t\t<dict>\n"
            if let p = c.isPublic {
                xml += "\t\t\t<key>NSUbiquitousContainerIsDocumentScopePublic</key>\n\t\t\t<\(p)/>\n"
            }
            if let n = c.name {
                xml += "\t\t\t<key>NSUbiquitousContainerName</key>\n\t\t\t<string>\(escape(n))</string>\n"
            }
            if let l = c.levels {
                xml += "\t\t\t<key>NSUbiquitousContainerSupportedFolderLevels</key>\n\t\t\t<string>\(escape(l))</string>\n"
            }
            xml += "\t\t</dict>\n"
        }
        xml += "\t</dict>\n</dict>\n</plist>\n"
        try xml.write(toFile: appsDir + "/" + fileName, atomically: false, encoding: .utf8)
    }

    // MARK: The ubiquityfs command

    /// Runs `ubiquityfs ARGS…` with the test's environment.
    func ubiquityfs(_ arguments: [String], timeout: Int = 60) -> CommandResult {
        Command.run([Self.binary] + arguments, timeout: timeout, environment: environment)
    }

    /// What runs `ubiquityfs mount` for a mount at `mnt` (a test's network namespace, say).
    func launcher(at mnt: String) -> [String] { [] }

    /// How a mount at `mnt` names its store (a shared store's tests give each mount its own
    /// local folder, as two machines have).
    func storeArguments(at mnt: String) -> [String] { ["--store", storeDir] }

    /// The arguments of `ubiquityfs mount`; with `defaultLocations`, no --apps and no --store.
    func mountArguments(app: String? = nil, options: String? = nil, extra: [String] = [],
                        at mnt: String? = nil, defaultLocations: Bool = false) -> [String] {
        var args = defaultLocations ? ["mount"] : ["mount", "--apps", appsDir] + storeArguments(at: mnt ?? mountPoint)
        if let app { args += ["--app", app] }
        if let options { args += ["-o", options] }
        return args + extra + [mnt ?? mountPoint]
    }

    /// Mounts and checks that the mount is ready when the command returns; throws (after recording
    /// the failure) if it is not.
    @discardableResult
    func mount(app: String? = nil, options: String? = nil, extra: [String] = [], at mnt: String? = nil,
               defaultLocations: Bool = false,
               file: StaticString = #filePath, line: UInt = #line) throws -> CommandResult {
        let target = mnt ?? mountPoint
        usedMountPoints.insert(target)
        let arguments = mountArguments(app: app, options: options, extra: extra, at: target,
                                       defaultLocations: defaultLocations)
        let result = Command.run(launcher(at: target) + [Self.binary] + arguments, timeout: 60, environment: environment)
        if let pid = waitForDaemonPID() { daemonPIDs.insert(pid) }
        guard result.succeeded else {
            let message = "mount failed: \(result)\n--- daemon log:\n\(daemonLogTail())"
            XCTFail(message, file: file, line: line)
            throw FixtureError(message)
        }
        guard isMounted(target) else {
            let message = "`ubiquityfs mount` returned 0 but \(target) is not in /proc/mounts"
            XCTFail(message, file: file, line: line)
            throw FixtureError(message)
        }
        if Posix.stat(target) == nil {
            let message = "the mount is not ready when `ubiquityfs mount` returns: stat \(target): \(Posix.describe(errno))"
            XCTFail(message, file: file, line: line)
            throw FixtureError(message)
        }
        return result
    }

    /// `ubiquityfs unmount`, then checks that the mount is gone and the daemon has exited.
    func unmount(at mnt: String? = nil, file: StaticString = #filePath, line: UInt = #line) throws {
        let target = mnt ?? mountPoint
        let pid = (try? Posix.getxattr(target, "user.ubiquityfs.daemon-pid").get()).flatMap { pid_t($0) } ?? readDaemonPID()
        let result = ubiquityfs(["unmount", target], timeout: 90)
        guard result.succeeded else {
            let message = "unmount failed: \(result)"
            XCTFail(message, file: file, line: line)
            throw FixtureError(message)
        }
        if isMounted(target) {
            let message = "`ubiquityfs unmount` returned 0 but \(target) is still mounted"
            XCTFail(message, file: file, line: line)
            throw FixtureError(message)
        }
        if let pid, !waitForExit(pid, seconds: 5) {
            XCTFail("the daemon (pid \(pid)) is still running 5 s after `ubiquityfs unmount` returned",
                    file: file, line: line)
        }
    }

    func remount(app: String? = nil, file: StaticString = #filePath, line: UInt = #line) throws {
        try unmount(file: file, line: line)
        try mount(app: app, file: file, line: line)
    }

    /// kill -9 of the daemon, then `fusermount3 -u` to clear the dead mount.
    func killDaemonHard(file: StaticString = #filePath, line: UInt = #line) throws {
        guard let pid = readDaemonPID(), isOurDaemon(pid) else {
            throw FixtureError("no live daemon pid in \(storeDir)/daemon.pid")
        }
        kill(pid, SIGKILL)
        guard waitForExit(pid, seconds: 10) else { throw FixtureError("daemon \(pid) survived SIGKILL") }
        if !Command.run(["fusermount3", "-u", mountPoint], timeout: 20).succeeded || isMounted(mountPoint) {
            _ = Command.run(["fusermount3", "-uz", mountPoint], timeout: 20)
        }
        if isMounted(mountPoint) {
            throw FixtureError("the dead mount at \(mountPoint) could not be cleared with fusermount3")
        }
    }

    /// Poll until `check` holds (another mount's change, a daemon's background work); fail after
    /// `seconds`.
    func eventually(_ what: String, seconds: Double = 10, file: StaticString = #filePath, line: UInt = #line,
                    _ check: () -> Bool) {
        let seconds = seconds * Command.slack
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if check() { return }
            usleep(20_000)
        }
        XCTFail("not seen within \(seconds) s: \(what)", file: file, line: line)
    }

    /// Every kind of change through folder `a` of one mount, each seen through folder `b` (the
    /// same folder) of another, then back from `b` to `a`.
    func changeEveryKind(from a: String, seenThrough b: String, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(ls(b), [], file: file, line: line)
        // Names looked for and missing first: the kernel may remember them as missing, until told.
        for name in ["Report.txt", "Drafts", "link"] { XCTAssertFalse(Posix.exists(b + "/" + name), name, file: file, line: line) }
        XCTAssertEqual(Posix.writeFile(a + "/Report.txt", "from A\n"), 0, file: file, line: line)
        eventually("a new file", file: file, line: line) { Posix.readText(b + "/Report.txt") == "from A\n" }
        // The kernel keeps a folder's listing from one opendir to the next: it must be told too.
        eventually("a new file listed", file: file, line: line) { ls(b) == ["Report.txt"] }
        XCTAssertEqual(Posix.writeFile(a + "/Report.txt", "changed on A\n"), 0, file: file, line: line)
        eventually("new content", file: file, line: line) { Posix.readText(b + "/Report.txt") == "changed on A\n" }
        assertSucceeds("mkdir", file: file, line: line) { mkdir(a + "/Drafts", 0o755) }
        eventually("a folder", file: file, line: line) { Posix.isDirectory(b + "/Drafts") }
        eventually("a folder listed", file: file, line: line) { ls(b) == ["Drafts", "Report.txt"] }
        XCTAssertEqual(ls(b + "/Drafts"), [], file: file, line: line)
        assertSucceeds("rename", file: file, line: line) { rename(a + "/Report.txt", a + "/Drafts/Final.txt") }
        eventually("a rename", file: file, line: line) {
            !Posix.exists(b + "/Report.txt") && Posix.readText(b + "/Drafts/Final.txt") == "changed on A\n"
        }
        eventually("a rename listed", file: file, line: line) { ls(b) == ["Drafts"] && ls(b + "/Drafts") == ["Final.txt"] }
        assertSucceeds("chmod", file: file, line: line) { chmod(a + "/Drafts/Final.txt", 0o600) }
        eventually("a chmod", file: file, line: line) { Posix.stat(b + "/Drafts/Final.txt").map { $0.st_mode & 0o777 } == 0o600 }
        assertSucceeds("setxattr", file: file, line: line) { Posix.setxattr(a + "/Drafts/Final.txt", "user.tag", "blue") }
        eventually("an xattr", file: file, line: line) { (try? Posix.getxattr(b + "/Drafts/Final.txt", "user.tag").get()) == "blue" }
        assertSucceeds("symlink", file: file, line: line) { symlink("Drafts/Final.txt", a + "/link") }
        eventually("a symlink", file: file, line: line) { Posix.readlink(b + "/link") == "Drafts/Final.txt" }
        assertSucceeds("unlink", file: file, line: line) { unlink(a + "/Drafts/Final.txt") }
        eventually("a delete", file: file, line: line) { !Posix.exists(b + "/Drafts/Final.txt") && ls(b + "/Drafts") == [] }
        // And back, B to A.
        XCTAssertFalse(Posix.exists(a + "/Drafts/fromB.txt"), file: file, line: line)
        XCTAssertEqual(Posix.writeFile(b + "/Drafts/fromB.txt", "from B\n"), 0, file: file, line: line)
        eventually("B's file on A", file: file, line: line) { Posix.readText(a + "/Drafts/fromB.txt") == "from B\n" }
        assertSucceeds("rmdir on B", file: file, line: line) { unlink(b + "/Drafts/fromB.txt") == 0 ? rmdir(b + "/Drafts") : -1 }
        eventually("B's rmdir on A", file: file, line: line) { !Posix.exists(a + "/Drafts") }
        assertSucceeds("unlink of the symlink", file: file, line: line) { unlink(a + "/link") }
    }

    /// The pid of the daemon serving the mount at `mnt` (its root's `user.ubiquityfs.daemon-pid`).
    func daemonPID(of mnt: String) throws -> pid_t {
        guard let text = try? Posix.getxattr(mnt, "user.ubiquityfs.daemon-pid").get(), let pid = pid_t(text) else {
            throw FixtureError("no daemon pid on the mount at \(mnt)")
        }
        return pid
    }

    /// Clears the mount at `mnt` whose daemon is gone (lazily, if a plain unmount cannot).
    /// `fsck --full` finds the (unmounted) store whole.
    func assertStoreWhole(file: StaticString = #filePath, line: UInt = #line) {
        let fsck = ubiquityfs(["fsck", "--store", storeDir, "--full"], timeout: 300)
        XCTAssertEqual(fsck.status, 0, "\(fsck)", file: file, line: line)
        XCTAssertTrue(fsck.stdout.contains("no problems"), fsck.stdout, file: file, line: line)
    }

    func clearDeadMount(_ mnt: String) {
        abortConnection(mnt)
        if !Command.run(["fusermount3", "-u", mnt], timeout: 20).succeeded {
            _ = Command.run(["fusermount3", "-uz", mnt], timeout: 20)
        }
    }

    /// Ends the FUSE connection of the mount at `mnt`, whose daemon was killed. A daemon killed
    /// while its replay thread waited on a request to its own mount that a worker had already
    /// read leaves that thread waiting for good, holding the connection open: programs using
    /// the mount would hang, where a power cut leaves nothing. (fusectl is mounted if needed.)
    func abortConnection(_ mnt: String) {
        guard let info = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return }
        let fields = info.split(separator: "\n").map { $0.split(separator: " ") }
        guard let device = fields.last(where: { $0.count > 4 && $0[4] == mnt })?[2],
              device.hasPrefix("0:") else { return }
        let connections = "/sys/fs/fuse/connections"
        let mountedHere = !FileManager.default.fileExists(atPath: "\(connections)/\(device.dropFirst(2))")
            && Command.run(["mount", "-t", "fusectl", "none", connections], timeout: 20).succeeded
        try? Data("1\n".utf8).write(to: URL(fileURLWithPath: "\(connections)/\(device.dropFirst(2))/abort"))
        if mountedHere { _ = Command.run(["umount", connections], timeout: 20) }
    }

    // MARK: Daemon and mount state

    func readDaemonPID(storeDir dir: String? = nil) -> pid_t? {
        guard let text = try? String(contentsOfFile: (dir ?? storeDir) + "/daemon.pid", encoding: .utf8) else {
            return nil
        }
        return pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Waits up to 5 s for daemon.pid to name a live daemon.
    func waitForDaemonPID() -> pid_t? {
        for _ in 0..<100 {
            if let pid = readDaemonPID(), isOurDaemon(pid) { return pid }
            usleep(50_000)
        }
        return nil
    }

    /// A mount made by something other than `mount()` (mount(8), a script): cleaned up like ours.
    func adoptMount(at mnt: String) {
        usedMountPoints.insert(mnt)
        if let pid = waitForDaemonPID() { daemonPIDs.insert(pid) }
    }

    /// FUSE mounts whose mount point is under `folder` (a command's private mount, say).
    func fuseMounts(under folder: String) -> [String] {
        guard let text = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line in
            let f = line.split(separator: " ")
            guard f.count > 2, f[2].hasPrefix("fuse"), f[1].hasPrefix(folder + "/") else { return nil }
            return String(f[1])
        }
    }

    /// The pid of a running `ubiquityfs` whose arguments include all of `arguments`.
    func ubiquityfsPID(withArguments arguments: [String], seconds: Double = 10) -> pid_t? {
        let deadline = Date().addingTimeInterval(seconds * Command.slack)
        while Date() < deadline {
            for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
                guard let pid = pid_t(entry), let data = FileManager.default.contents(atPath: "/proc/\(entry)/cmdline") else { continue }
                let args = data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
                // argv[0] itself: a wrapper (`timeout … ubiquityfs …`) has the words too.
                guard let program = args.first, (program as NSString).lastPathComponent == "ubiquityfs" else { continue }
                if arguments.allSatisfy(args.contains), isOurDaemon(pid) { return pid }
            }
            usleep(5_000)
        }
        return nil
    }

    /// The pid of a daemon of this test's store that is still starting (it writes daemon.pid
    /// only once mounted): found by its arguments in /proc, and kept for clean-up.
    func startingDaemonPID(seconds: Double = 10) -> pid_t? {
        guard let pid = ubiquityfsPID(withArguments: ["--ready-fd", storeDir], seconds: seconds) else { return nil }
        daemonPIDs.insert(pid)
        return pid
    }

    /// True if `pid` is alive (not a zombie) and runs the ubiquityfs binary.
    func isOurDaemon(_ pid: pid_t) -> Bool {
        Watchdog.isLiveProcess(pid, named: "ubiquityfs")
    }

    func waitForExit(_ pid: pid_t, seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds * Command.slack)
        while Date() < deadline {
            if !Watchdog.isLiveProcess(pid, named: nil) { return true }
            usleep(20_000)
        }
        return !Watchdog.isLiveProcess(pid, named: nil)
    }

    func isMounted(_ path: String) -> Bool {
        guard let text = try? String(contentsOfFile: "/proc/mounts", encoding: .utf8) else { return false }
        let escaped = path.replacingOccurrences(of: " ", with: "\\040")
        return text.split(separator: "\n").contains { line in
            let fields = line.split(separator: " ")
            return fields.count > 1 && fields[1] == escaped
        }
    }

    func daemonLogTail(lines: Int = 60) -> String {
        guard let text = try? String(contentsOfFile: storeDir + "/ubiquityfs.log", encoding: .utf8) else {
            return "(no \(storeDir)/ubiquityfs.log)"
        }
        return text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
    }

    // MARK: Paths

    /// A drive-view container folder, which is the container's Documents: MOUNT/NAME.
    func docs(_ container: String) -> String { "\(mountPoint)/\(container)" }

    // MARK: Shell helpers

    /// Runs a bash script (`set -euo pipefail`) with the test's environment.
    func sh(_ script: String, cwd: String? = nil, timeout: Int = 60) -> CommandResult {
        Command.bash(script, timeout: timeout, cwd: cwd, environment: environment)
    }

    /// Runs a bash script and records a failure if it does not exit 0.
    @discardableResult
    func assertShell(_ script: String, cwd: String? = nil, timeout: Int = 60,
                     file: StaticString = #filePath, line: UInt = #line) -> CommandResult {
        let result = sh(script, cwd: cwd, timeout: timeout)
        if !result.succeeded { XCTFail("shell step failed: \(result)", file: file, line: line) }
        return result
    }

    /// `ls -A` of a folder, sorted; records a failure if ls fails.
    func ls(_ path: String, file: StaticString = #filePath, line: UInt = #line) -> [String] {
        let result = Command.run(["ls", "-A1", path], timeout: 30, environment: environment)
        if !result.succeeded { XCTFail("ls failed: \(result)", file: file, line: line) }
        return result.lines.sorted()
    }

    // MARK: errno assertions

    /// Records a failure if `call` returns a negative value; returns what it returned.
    @discardableResult
    func assertSucceeds<T: BinaryInteger>(_ what: @autoclosure () -> String,
                                          file: StaticString = #filePath, line: UInt = #line,
                                          _ call: () -> T) -> T {
        errno = 0
        let result = call()
        let code = errno
        if result < 0 { XCTFail("\(what()) failed with \(Posix.describe(code)); expected success", file: file, line: line) }
        return result
    }

    /// Records a failure unless `call` fails with `expected`.
    func assertErrno<T: BinaryInteger>(_ expected: Int32, _ what: @autoclosure () -> String,
                                       file: StaticString = #filePath, line: UInt = #line,
                                       _ call: () -> T) {
        assertErrno(oneOf: [expected], what(), file: file, line: line, call)
    }

    /// Records a failure unless `call` fails with one of `expected` (any errno if `expected` is empty).
    func assertErrno<T: BinaryInteger>(oneOf expected: [Int32], _ what: @autoclosure () -> String,
                                       file: StaticString = #filePath, line: UInt = #line,
                                       _ call: () -> T) {
        errno = 0
        let result = call()
        let code = errno
        let wanted = expected.isEmpty ? "a failure" : expected.map(Posix.describe).joined(separator: " or ")
        if result >= 0 {
            XCTFail("\(what()) succeeded; expected \(wanted)", file: file, line: line)
        } else if !expected.isEmpty && !expected.contains(code) {
            XCTFail("\(what()) failed with \(Posix.describe(code)); expected \(wanted)", file: file, line: line)
        }
    }

    /// Records a failure unless `call` fails (any errno).
    func assertFails<T: BinaryInteger>(_ what: @autoclosure () -> String,
                                       file: StaticString = #filePath, line: UInt = #line,
                                       _ call: () -> T) {
        assertErrno(oneOf: [], what(), file: file, line: line, call)
    }
}

/// Kills the daemon of a test that runs past its deadline.
final class Watchdog: @unchecked Sendable {
    private let lock = NSLock()
    private var cancelled = false // protected by lock
    private var fired = false     // protected by lock
    private let test: String
    private let pidFiles: [String]

    init(seconds: Double, test: String, pidFiles: [String]) {
        self.test = test
        self.pidFiles = pidFiles
        DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [self] in fire() }
    }

    /// Stops the watchdog; returns true if it had already fired.
    func cancel() -> Bool {
        lock.lock()
        defer { lock.unlock() }
        cancelled = true
        return fired
    }

    private func fire() {
        lock.lock()
        if cancelled {
            lock.unlock()
            return
        }
        fired = true
        lock.unlock()
        for pidFile in pidFiles {
            let text = (try? String(contentsOfFile: pidFile, encoding: .utf8)) ?? ""
            if let pid = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)),
               Self.isLiveProcess(pid, named: "ubiquityfs") {
                kill(pid, SIGKILL)
            }
        }
        let message = "watchdog: \(test) ran past its deadline; killed its daemon\n"
        _ = message.withCString { Glibc.write(2, $0, strlen($0)) }
    }

    /// True if `pid` exists and is not a zombie (and, given a name, its command line mentions it).
    static func isLiveProcess(_ pid: pid_t, named name: String?) -> Bool {
        guard pid > 0, kill(pid, 0) == 0 || errno == EPERM else { return false }
        if let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
           let close = stat.lastIndex(of: ")") {
            let state = stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).first
            if state == "Z" || state == "X" { return false }
        }
        guard let name else { return true }
        // The daemon's argv[0] is "ubiquityfs"; its executable may be a copy under another name.
        if let cmdline = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline"),
           String(decoding: cmdline, as: UTF8.self).contains(name) {
            return true
        }
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")) ?? ""
        let binary = URL(fileURLWithPath: MountTestCase.binary).resolvingSymlinksInPath().path
        return !exe.isEmpty && exe.hasPrefix(binary)
    }
}

/// A fixed sequence of numbers (an LCG), so a test's random moments repeat from run to run.
struct FixedSequence {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next(_ range: ClosedRange<UInt32>) -> UInt32 {
        state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        return range.lowerBound + UInt32(state >> 33) % (range.upperBound - range.lowerBound + 1)
    }
}
