import Foundation
import Glibc
import XCTest

/// `kill -9` of the daemon at random moments of a parallel workload (`scripts/crashload.py`:
/// writes ending in fsync or close, appends, truncates, atomic saves, renames, deletes,
/// extended attributes, four workers). After each remount every file holds what the workload's
/// log says it must: what its last finished operation left, whole, or for the files of an
/// operation under way, what was there before it or after it. At the end every round's files
/// are checked again and `fsck --full` finds the unmounted store whole.
///
/// `UBIQUITYFS_CRASH_ROUNDS` sets the number of rounds (20 by default; `scripts/test --long`
/// runs more).
final class CrashTests: MountTestCase {
    /// A guard against a hung mount (about 2 s a round here), scaled with the rounds.
    override var testDeadline: Double { Double(Self.rounds) * 15 + 300 }

    static var rounds: Int {
        max(1, Int(ProcessInfo.processInfo.environment["UBIQUITYFS_CRASH_ROUNDS"] ?? "") ?? 20)
    }

    /// `kill -9` of the daemon `pid` while `load` works, then of `load`; the mount point is
    /// mounted again.
    private func killAndMountAgain(_ pid: pid_t, under load: BackgroundProcess, round: Int) throws {
        kill(pid, SIGKILL)
        XCTAssertTrue(waitForExit(pid, seconds: 10), "round \(round): the daemon survived SIGKILL")
        kill(load.pid, SIGKILL)
        clearDeadMount(mountPoint)   // before waiting for the load, which may wait on the mount
        load.stop()
        try mount()
    }

    /// Waits until the workload has opened its log: the kill moment counts from there, as a
    /// loaded machine can take longer than the shortest moment to start Python.
    private func waitUntilStarted(_ load: BackgroundProcess, log: String, round: Int) {
        eventually("round \(round): the workload starts", seconds: 30) {
            FileManager.default.fileExists(atPath: log) || !load.isRunning
        }
    }

    /// The count the checker prints ("after N finished operations").
    static func finishedOperations(_ output: String) -> Int {
        guard let r = output.range(of: #"after [0-9]+ finished"#, options: .regularExpression) else { return 0 }
        return Int(output[r].split(separator: " ")[1]) ?? 0
    }

    func testKillMinus9AtRandomMomentsOfAParallelWorkload() throws {
        let script = Self.packageRoot + "/scripts/crashload.py"
        var moments = FixedSequence(seed: 2026)   // the same kill moments each run, so a failure repeats
        try mount()
        var checked: [(dir: String, log: String)] = []
        var finished = 0
        for round in 1...Self.rounds {
            let dir = docs("SugoiApp") + "/round-\(round)"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            let log = workDir + "/crash-\(round).log"
            let load = try BackgroundProcess(["python3", script, "run", dir, log, String(round)],
                                             environment: environment, log: workDir + "/crash-\(round).out")
            waitUntilStarted(load, log: log, round: round)
            usleep(moments.next(300_000...1_500_000))
            guard let pid = readDaemonPID() else { throw FixtureError("round \(round): no daemon pid") }
            try killAndMountAgain(pid, under: load, round: round)
            let r = Command.run(["python3", script, "check", dir, log], timeout: 120)
            XCTAssertEqual(r.status, 0, "round \(round): \(r.stdout)\(r.stderr)\n--- workload:\n"
                           + ((try? String(contentsOfFile: workDir + "/crash-\(round).out", encoding: .utf8)) ?? ""))
            XCTAssertTrue(r.stdout.contains("as logged"), "round \(round): \(r.stdout)")
            finished += Self.finishedOperations(r.stdout)
            checked.append((dir, log))
        }
        // (A kill may come before a round's first operation ends, not before all rounds' do.)
        XCTAssertGreaterThan(finished, 10 * Self.rounds, "the workload worked between the kills")
        // Later kills and recoveries changed nothing of what earlier rounds left.
        for (round, c) in checked.enumerated() {
            let r = Command.run(["python3", script, "check", c.dir, c.log], timeout: 120)
            XCTAssertEqual(r.status, 0, "round \(round + 1), checked again at the end: \(r.stdout)")
        }
        try unmount()
        assertStoreWhole()
    }

    /// Two mounts of one store, each with a workload; one is killed at random moments and
    /// mounted again while the other goes on. What the killed one's workload finished is there,
    /// seen through either mount, and the other's workload is untouched.
    func testKillOneOfTwoMountsOfOneStore() throws {
        let script = Self.packageRoot + "/scripts/crashload.py"
        var moments = FixedSequence(seed: 4711)
        let second = workDir + "/mnt2"
        try mount()
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(at: second)
        let steady = second + "/SugoiApp/steady"
        try FileManager.default.createDirectory(atPath: steady, withIntermediateDirectories: false)
        let steadyLog = workDir + "/steady.log"
        let other = try BackgroundProcess(["python3", script, "run", steady, steadyLog, "99", "2"],
                                          environment: environment, log: workDir + "/steady.out")
        defer { other.stop() }
        for round in 1...max(1, Self.rounds / 2) {
            let name = "killed-\(round)"
            try FileManager.default.createDirectory(atPath: docs("SugoiApp") + "/" + name, withIntermediateDirectories: false)
            let log = workDir + "/\(name).log"
            let load = try BackgroundProcess(["python3", script, "run", docs("SugoiApp") + "/" + name, log, String(100 + round), "2"],
                                             environment: environment, log: workDir + "/\(name).out")
            waitUntilStarted(load, log: log, round: round)
            usleep(moments.next(300_000...1_500_000))
            try killAndMountAgain(try daemonPID(of: mountPoint), under: load, round: round)
            let mine = Command.run(["python3", script, "check", docs("SugoiApp") + "/" + name, log], timeout: 120)
            XCTAssertEqual(mine.status, 0, "round \(round), through the mount killed: \(mine.stdout)")
            // The other mount learns of the recovered files from the change log.
            var seen: CommandResult?
            eventually("round \(round) through the other mount") {
                seen = Command.run(["python3", script, "check", second + "/SugoiApp/" + name, log], timeout: 120)
                return seen?.status == 0
            }
            XCTAssertEqual(seen?.status, 0, "round \(round), through the other mount: \(seen?.stdout ?? "")")
        }
        // Stopped between two operations: a process killed in a write leaves what it wrote.
        FileManager.default.createFile(atPath: steadyLog + ".stop", contents: Data())
        eventually("the other mount's workload stops", seconds: 30) { !other.isRunning }
        for through in [second + "/SugoiApp/steady", docs("SugoiApp") + "/steady"] {
            var seen: CommandResult?
            eventually("the other mount's workload through \(through)") {
                seen = Command.run(["python3", script, "check", through, steadyLog], timeout: 120)
                return seen?.status == 0
            }
            XCTAssertEqual(seen?.status, 0, "\(through): \(seen?.stdout ?? "")")
        }
        try unmount(at: second)
        try unmount()
        assertStoreWhole()
    }
}
