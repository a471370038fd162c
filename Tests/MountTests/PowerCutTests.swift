// Power cuts of the embedded store, at the level of its files. The daemon runs with
// scripts/powercut.c preloaded: every write, truncate and sync it makes to a file under the store
// folder (SQLite's database and log included) is recorded with the bytes it replaces. At a random
// moment of a parallel workload the daemon is killed and `powercut.py restore` takes each store
// file back to what a disk may hold had the power failed then: synced writes stay, of the rest a
// random prefix per file, the first lost write maybe torn. The library then says the machine
// started again (a new boot id) and the store is mounted again: its start must repair what the
// cut left, fsck must find it whole, and every name must hold what POSIX promises after a power
// cut (`crashload.py check --power`).
//
// `UBIQUITYFS_POWERCUT_ROUNDS` sets the number of rounds (12 by default; `scripts/stress --long`
// runs more).

import Foundation
import Glibc
import XCTest

final class PowerCutTests: MountTestCase {
    /// A guard against a hung mount (about 5 s a round here), scaled with the rounds.
    override var testDeadline: Double { Double(Self.rounds) * 30 + 300 }

    static var rounds: Int {
        max(1, Int(ProcessInfo.processInfo.environment["UBIQUITYFS_POWERCUT_ROUNDS"] ?? "") ?? 12)
    }

    private var library: String { workDir + "/powercut.so" }
    private var bootFile: String { workDir + "/boot_id" }
    /// The undo log the daemon mounted next records into; nil: mount without the library.
    private var recording: String?

    override var environment: [String: String] {
        var env = super.environment
        if let recording {
            env["LD_PRELOAD"] = library
            env["POWERCUT_ROOT"] = storeDir
            env["POWERCUT_LOG"] = recording
            env["POWERCUT_BOOT_ID"] = bootFile
        }
        return env
    }

    private var tool: String { Self.packageRoot + "/scripts/powercut.py" }
    private var workload: String { Self.packageRoot + "/scripts/crashload.py" }

    /// A new boot id for the machine the daemon runs on.
    private func bootAgain() {
        FileManager.default.createFile(atPath: bootFile, contents: Data((UUID().uuidString.lowercased() + "\n").utf8))
    }

    /// What `crashload.py state` prints for `dir`.
    private func state(_ dir: String) -> String {
        Command.run(["python3", workload, "state", dir], timeout: 60).stdout
    }

    /// Mounts every mount point of `mounts` with the library recording into `log`.
    private func mountAll(_ mounts: [String], recording log: String) throws {
        recording = log
        defer { recording = nil }
        for mnt in mounts { try mount(at: mnt) }
    }

    /// Rounds of: a workload in a new folder through each mount, the power failing at a random
    /// moment under all of them, the restore, a new boot, the mounts again and the checks.
    private func cutRounds(_ rounds: Int, mounts: [String], seed: UInt64) throws {
        let build = Command.run(["python3", tool, "build", library], timeout: 120)
        XCTAssertEqual(build.status, 0, "\(build)")
        var moments = FixedSequence(seed: seed)
        bootAgain()
        for mnt in mounts.dropFirst() {
            try FileManager.default.createDirectory(atPath: mnt, withIntermediateDirectories: true)
        }
        try mountAll(mounts, recording: workDir + "/undo-0.log")
        var lost: [String: Int] = [:]
        var settled: [(dir: String, state: String)] = []
        for round in 1...rounds {
            var loads: [(dir: String, log: String, process: BackgroundProcess)] = []
            for (m, mnt) in mounts.enumerated() {
                let dir = mnt + "/SugoiApp/round-\(round)-\(m)"
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
                let log = workDir + "/work-\(round)-\(m).log"
                let process = try BackgroundProcess(["python3", workload, "run", dir, log, String(round * 10 + m)],
                                                    environment: environment, log: workDir + "/work-\(round)-\(m).out")
                loads.append((dir, log, process))
            }
            for load in loads {
                eventually("round \(round): the workload starts", seconds: 30) {
                    FileManager.default.fileExists(atPath: load.log) || !load.process.isRunning
                }
            }
            usleep(moments.next(300_000...1_500_000))
            // The power fails: every daemon stops at once, and the disk keeps what it keeps.
            let pids = try mounts.map { try daemonPID(of: $0) }
            for pid in pids { kill(pid, SIGKILL) }
            for pid in pids { XCTAssertTrue(waitForExit(pid, seconds: 10), "round \(round): a daemon survived SIGKILL") }
            for load in loads { kill(load.process.pid, SIGKILL) }
            // Before waiting for the loads, which may wait on a mount (see `abortConnection`).
            for mnt in mounts { clearDeadMount(mnt) }
            for load in loads { load.process.stop() }
            let cut = Command.run(["python3", tool, "restore", storeDir, workDir + "/undo-\(round - 1).log",
                                   String(seed &+ UInt64(round))], timeout: 120)
            XCTAssertEqual(cut.status, 0, "round \(round): \(cut)")
            lost.merge(Self.lostWrites(cut.stdout), uniquingKeysWith: +)
            print("round \(round): \(cut.stdout.trimmingCharacters(in: .newlines))")
            bootAgain()
            try mountAll(mounts, recording: workDir + "/undo-\(round).log")
            for (m, load) in loads.enumerated() {
                // Each workload's folder, through every mount.
                for mnt in mounts {
                    let dir = mnt + "/SugoiApp/round-\(round)-\(m)"
                    let r = Command.run(["python3", workload, "check", dir, load.log, "--power"], timeout: 120)
                    XCTAssertEqual(r.status, 0, "round \(round), \(dir) (\(cut.stdout.trimmingCharacters(in: .newlines))): "
                                   + "\(r.stdout)\(r.stderr)\n--- workload:\n"
                                   + ((try? String(contentsOfFile: workDir + "/work-\(round)-\(m).out", encoding: .utf8)) ?? ""))
                }
            }
            // The store is whole after each cut, not only at the end.
            for mnt in mounts.reversed() { try unmount(at: mnt) }
            assertStoreWhole()
            try mountAll(mounts, recording: workDir + "/undo-\(round).log")
            settled += loads.map { ($0.dir, state($0.dir)) }
        }
        // The cuts took unsynced writes of content and of SQLite's log, not only the daemon's log.
        XCTAssertGreaterThan(lost["chunks", default: 0] + lost["work", default: 0], 0, "\(lost)")
        XCTAssertGreaterThan(lost["wal", default: 0], 0, "\(lost)")
        // Every start after a cut knew the machine had stopped (the library's boot id) and
        // checked what the cut may have taken. (With two daemons their appends to one log may
        // be undone together: at least one line is asked for then.)
        let text = (try? String(contentsOfFile: storeDir + "/ubiquityfs.log", encoding: .utf8)) ?? ""
        let starts = text.components(separatedBy: "the machine stopped under").count - 1
        XCTAssertGreaterThanOrEqual(starts, mounts.count == 1 ? rounds : 1, daemonLogTail())
        // What each round left after its cut, later cuts did not change.
        for s in settled {
            XCTAssertEqual(state(s.dir), s.state, "\(s.dir), checked again at the end")
        }
        for mnt in mounts.reversed() { try unmount(at: mnt) }
        assertStoreWhole()
    }

    func testPowerCutsAtRandomMomentsOfAParallelWorkload() throws {
        try cutRounds(Self.rounds, mounts: [mountPoint], seed: 1999)
    }

    /// Two mounts of one store, as two daemons of one machine: the power fails under both.
    func testPowerCutsUnderTwoMountsOfOneStore() throws {
        try cutRounds(max(1, Self.rounds / 3), mounts: [mountPoint, workDir + "/mnt2"], seed: 2718)
    }

    /// The writes lost by kind of store file, as `powercut.py restore` prints them
    /// ("lost by kind: chunks 3, wal 12").
    static func lostWrites(_ output: String) -> [String: Int] {
        guard let r = output.range(of: "lost by kind: ") else { return [:] }
        var out: [String: Int] = [:]
        for part in output[r.upperBound...].split(separator: "\n").first?.split(separator: ",") ?? [] {
            let words = part.split(separator: " ")
            if words.count == 2, let n = Int(words[1]) { out[String(words[0])] = n }
        }
        return out
    }
}
