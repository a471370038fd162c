// Store faults under a running daemon (its store wrapped by the fault-injecting store, driven
// by a file the daemon reads again whenever it changes: UBIQUITYFS_FAULT_FILE). The caller
// gets the store's errno, no version is torn or lost, the daemon keeps serving, and what a
// failed publish wrote is collected, not leaked.

import Foundation
import Glibc
import XCTest

final class FaultMountTests: MountTestCase {
    private var faultFile: String { workDir + "/faults" }

    override var environment: [String: String] {
        var env = super.environment
        env["UBIQUITYFS_FAULT_FILE"] = faultFile
        return env
    }

    /// Puts `lines` in force and waits until the daemon says it read them.
    private func faults(_ lines: String..., file: StaticString = #filePath, line: UInt = #line) {
        let text = lines.joined(separator: "\n")
        XCTAssertTrue(FileManager.default.createFile(atPath: faultFile, contents: Data((text + "\n").utf8)), file: file, line: line)
        guard isMounted(mountPoint) else { return }   // a daemon starting reads them first
        eventually("the daemon reads the faults '\(text)'", file: file, line: line) {
            self.daemonLogTail(lines: 20).contains("fault injection: now " + lines.joined(separator: "; ") + "\n")
        }
    }

    private var d: String { docs("SugoiApp") }

    private func status(_ path: String) -> String? { try? Posix.getxattr(path, "user.ubiquity.status").get() }

    func testAFailedPublishKeepsTheWorkingCopyAndTheLastVersion() throws {
        faults()
        try mount()
        XCTAssertEqual(Posix.writeFile(d + "/doc.txt", "version one\n"), 0)
        // The chunk write fails: close says EIO, the new bytes stay readable here, unpublished.
        faults("blobWrite EIO")
        XCTAssertEqual(Posix.writeFile(d + "/doc.txt", "version two, longer\n"), EIO)
        XCTAssertEqual(Posix.readText(d + "/doc.txt"), "version two, longer\n", "the working copy is kept")
        XCTAssertEqual(status(d + "/doc.txt"), "pending")
        // The commit fails after the chunks were written: the same.
        faults("commit EIO next 1")
        XCTAssertEqual(Posix.writeFile(d + "/other.txt", "x"), EIO, "the create's commit failed")
        XCTAssertFalse(Posix.exists(d + "/other.txt"), "a failed create leaves nothing")
        XCTAssertEqual(ls(d), ["doc.txt"])
        faults("commit ENOSPC")
        assertErrno(ENOSPC, "mkdir on a full store") { mkdir(d + "/Folder", 0o755) }
        assertErrno(ENOSPC, "rename on a full store") { rename(d + "/doc.txt", d + "/renamed.txt") }
        XCTAssertEqual(ls(d), ["doc.txt"], "nothing changed")
        // Faults gone: the idle publish makes the kept copy the current version; the history has
        // both whole versions and nothing torn.
        faults()
        eventually("the kept copy is published") { self.status(self.d + "/doc.txt") == "current" }
        let versions = ubiquityfs(["versions", d + "/doc.txt"])
        let sizes = versions.lines.dropFirst().map { $0.split(separator: " ", omittingEmptySubsequences: true)[3] }
        XCTAssertEqual(sizes, ["12", "20"], versions.stdout)
        XCTAssertEqual(Posix.readText(d + "/doc.txt"), "version two, longer\n")
        try unmount()
        assertStoreWhole()
    }

    /// A publish of a 3 MiB file whose second chunk write fails: the file stays its previous
    /// version for every reader of the store, the first chunk (written, then orphaned) is
    /// collected later, never named by a version.
    func testAFailureInTheMiddleOfAPublish() throws {
        faults()
        try mount()
        let second = workDir + "/mnt2"
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        assertShell("head -c 3000000 /dev/urandom > \(shellQuote(d + "/big.bin"))")
        let before = sh("sha256sum < \(shellQuote(d + "/big.bin"))").stdout
        faults("blobWrite EIO from 2")   // the first chunk lands, every later one fails
        let rewrite = sh("head -c 3000000 /dev/urandom > \(shellQuote(d + "/big.bin"))")
        XCTAssertFalse(rewrite.succeeded, "the close reports the failed publish")
        let written = sh("sha256sum < \(shellQuote(d + "/big.bin"))").stdout
        XCTAssertNotEqual(written, before, "the new bytes are in the working copy here")
        try mount(at: second)
        XCTAssertEqual(sh("sha256sum < \(shellQuote(second + "/SugoiApp/big.bin"))").stdout, before,
                       "another mount of the store reads the last whole version (the new bytes are \(written))")
        faults()
        eventually("the kept copy is published") { self.status(self.d + "/big.bin") == "current" }
        eventually("the other mount reads the new version") {
            self.sh("sha256sum < \(shellQuote(second + "/SugoiApp/big.bin"))").stdout == written
        }
        try unmount(at: second)
        try unmount()
        let fsck = ubiquityfs(["fsck", "--store", storeDir, "--full"])
        XCTAssertEqual(fsck.status, 0, "\(fsck)")
    }

    /// Ninety failed publishes and commits leave nothing behind: once the faults are gone and the
    /// kept copies published, the daemon holds no more descriptors than before them, no
    /// temporary chunk file is left, and no working copy.
    func testFailuresLeakNothing() throws {
        faults()
        try mount()
        let pid = try daemonPID(of: mountPoint)
        let names = (0..<10).map { d + "/file-\($0).bin" }
        // The same calls once without faults first, so that caches are as full before as after.
        for (i, name) in names.enumerated() {
            assertShell("head -c \(100_000 + i) /dev/urandom > \(shellQuote(name))")
            XCTAssertEqual(mkdir(d + "/folder-\(i)", 0o755), 0)
            XCTAssertEqual(rmdir(d + "/folder-\(i)"), 0)
        }
        let descriptorsBefore = descriptors(of: pid)
        faults("blobWrite EIO")
        for i in 0..<60 {
            // Each file's first close reports the failed publish; the later ones within a second
            // leave the publish to the idle retry (at most one publish per close per second).
            let written = sh("head -c \(100_000 + i) /dev/urandom > \(shellQuote(names[i % 10]))").succeeded
            if i < 10 { XCTAssertFalse(written, "publish \(i) fails") }
        }
        faults("commit EIO")
        for i in 0..<30 {
            XCTAssertNotEqual(Posix.writeFile(d + "/new-\(i).txt", "x"), 0, "create \(i) fails")
            assertErrno(EIO, "mkdir \(i)") { mkdir(d + "/folder-\(i)", 0o755) }
        }
        faults()
        eventually("the kept copies are published") { names.allSatisfy { self.status($0) == "current" } }
        XCTAssertEqual(ls(d).filter { !$0.hasPrefix("file-") }, [], "the failed creates left no name")
        let descriptorsAfter = descriptors(of: pid)
        XCTAssertLessThanOrEqual(descriptorsAfter, descriptorsBefore + 4,
                                 "descriptors before the faults \(descriptorsBefore), after \(descriptorsAfter)")
        let temporary = (try? FileManager.default.contentsOfDirectory(atPath: storeDir + "/blobs/.tmp")) ?? []
        XCTAssertEqual(temporary, [], "no temporary chunk file is left")
        let copies = sh("find \(shellQuote(storeDir + "/work")) -type f -not -name lock -not -name 'spare-*'").lines
        XCTAssertEqual(copies, [], "no working copy is left")
        // The emptied files kept for the next working copies: a bounded few, holding nothing.
        let spares = sh("find \(shellQuote(storeDir + "/work")) -type f -name 'spare-*' -size +0").lines
        XCTAssertEqual(spares, [], "spare files are empty")
        XCTAssertLessThanOrEqual(sh("find \(shellQuote(storeDir + "/work")) -type f -name 'spare-*'").lines.count, 32)
        try unmount()
        assertStoreWhole()
    }

    /// The number of descriptors process `pid` holds.
    private func descriptors(of pid: pid_t) -> Int {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []).count
    }

    /// Slow store calls: a create whose commit takes 3 s, while reads and listings of other
    /// files go on being answered.
    func testTheDaemonKeepsServingWhileAStoreCallIsSlow() throws {
        faults()
        try mount()
        XCTAssertEqual(Posix.writeFile(d + "/steady.txt", "steady\n"), 0)
        faults("commit delay 3000")
        let slow = try BackgroundProcess(["sh", "-c", "echo slow > \(shellQuote(d + "/slow.txt")); echo done > \(shellQuote(workDir + "/slow.done"))"],
                                         environment: environment, log: workDir + "/slow.out")
        defer { slow.stop() }
        usleep(300_000)
        var reads = 0
        while !Posix.exists(workDir + "/slow.done") && reads < 10_000 {
            XCTAssertEqual(Posix.readText(d + "/steady.txt"), "steady\n")
            XCTAssertTrue(ls(d).contains("steady.txt"))
            reads += 1
        }
        XCTAssertGreaterThan(reads, 10, "reads and listings were answered while the commit was slow")
        eventually("the slow create ends", seconds: 30) { !slow.isRunning }
        faults()
        XCTAssertEqual(Posix.readText(d + "/slow.txt"), "slow\n")
        try unmount()
        assertStoreWhole()
    }

    /// A lookup's answer read before another mount's change, and still on its way to the kernel
    /// when the change arrives, is not kept for the cache time (10 s): the node counts as held
    /// from when its attributes are read, so the change feed invalidates it, and sends that again
    /// until the kernel, which had no inode to drop yet, has made it from the answer. (This mount
    /// is read-only: it makes no replays of the other's changes, whose own lookups and truncates
    /// through the mount would refresh the attributes too.)
    func testALookupAnswerOlderThanAnotherMountsChangeIsNotKept() throws {
        faults()
        try mount(options: "ro")
        let second = workDir + "/mnt2"
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(at: second)
        let theirs = second + "/SugoiApp"
        XCTAssertEqual(Posix.writeFile(theirs + "/late.txt", "v1\n"), 0)
        XCTAssertEqual(Posix.writeFile(theirs + "/marker.txt", "m\n"), 0)
        // Changes arrive in order: once the marker shows here, so does late.txt, not looked up yet.
        eventually("this mount has the other's files") { Posix.exists(self.d + "/marker.txt") }
        // Past the time another writer's fresh change is answered uncached: this is about the
        // invalidation alone.
        usleep(2_500_000)
        faults("lookupAnswer delay 1500")
        eventually("both daemons read the faults") {
            self.daemonLogTail(lines: 40).components(separatedBy: "fault injection: now lookupAnswer delay 1500").count == 3
        }
        let stat = try BackgroundProcess(["stat", "-c", "%s", d + "/late.txt"], environment: environment, log: workDir + "/stat.out")
        defer { stat.stop() }
        eventually("stat waits for the lookup's answer") {
            ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(stat.pid)/task")) ?? []).contains {
                (try? String(contentsOfFile: "/proc/\(stat.pid)/task/\($0)/wchan", encoding: .utf8)) == "request_wait_answer"
            }
        }
        XCTAssertEqual(Posix.writeFile(theirs + "/late.txt", "version two, longer\n"), 0)
        eventually("the lookup is answered") { !stat.isRunning }
        XCTAssertEqual(Posix.readText(workDir + "/stat.out")?.trimmingCharacters(in: .whitespacesAndNewlines), "3",
                       "the answer was read before the change")
        faults()
        eventually("this mount shows the other's change well within its cache time", seconds: 3) {
            Posix.readText(self.d + "/late.txt") == "version two, longer\n"
        }
        try unmount(at: second)
        try unmount()
        assertStoreWhole()
    }

    /// A daemon killed while one of its threads waits on its own mount (here its replay of the
    /// other mount's change, whose answer is held back) cannot finish exiting by itself: the
    /// kernel waits for that answer even under SIGKILL, and the daemon's /dev/fuse stays open.
    /// The daemon's guard ends the connection: the mount answers ENOTCONN instead of hanging
    /// every program that uses it, the daemon is gone, and the mount clears.
    func testAKilledDaemonWaitingOnItsOwnMountLeavesNoHungMount() throws {
        faults()
        try mount(extra: ["--cache-seconds", "600"])
        let second = workDir + "/mnt2"
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(extra: ["--cache-seconds", "600"], at: second)
        let pid = try daemonPID(of: mountPoint)
        // Stopped is not dying: the guard leaves a daemon stopped for longer than its second alone.
        kill(pid, SIGSTOP)
        usleep(2_500_000)
        kill(pid, SIGCONT)
        XCTAssertEqual(ls(d), [], "the kernel holds the folder, so the other mount's changes in it are replayed here")
        faults("replayAnswer delay 600000")
        eventually("both daemons read the faults") {
            self.daemonLogTail(lines: 40).components(separatedBy: "fault injection: now replayAnswer delay 600000").count == 3
        }
        XCTAssertEqual(Posix.writeFile(second + "/SugoiApp/theirs.txt", "from the other mount\n"), 0)
        eventually("this daemon's replay waits on its own mount") {
            ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []).contains {
                (try? String(contentsOfFile: "/proc/\(pid)/task/\($0)/wchan", encoding: .utf8)) == "request_wait_answer"
            }
        }
        kill(pid, SIGKILL)
        eventually("the mount answers ENOTCONN", seconds: 15) {
            let probe = Command.run(["stat", mountPoint], timeout: 3)
            return probe.status == 1 && probe.stderr.contains("Transport endpoint is not connected")
        }
        eventually("the daemon's last thread is gone") {
            // Reaped, or a zombie waiting for its parent with no thread left.
            let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
            let threads = status.split(separator: "\n").first { $0.hasPrefix("Threads:") }.flatMap { Int($0.dropFirst(8).trimmingCharacters(in: .whitespaces)) }
            return status.isEmpty || (status.contains("State:\tZ") && threads == 1)
        }
        // The guard ends the connection first and logs after.
        eventually("the guard says what it did") {
            self.daemonLogTail().contains("guard: daemon \(pid) died with a thread still waiting on its own mount")
        }
        let clear = ubiquityfs(["unmount", "--if-dead", mountPoint])
        XCTAssertEqual(clear.status, 0, "\(clear)")
        XCTAssertFalse(isMounted(mountPoint))
        faults()
        XCTAssertEqual(Posix.readText(second + "/SugoiApp/theirs.txt"), "from the other mount\n", "the other mount serves on")
        try unmount(at: second)
    }
}
