// Load: 8 writers, 8 readers and 4 `ls -l` loops (scripts/loadtest.py) for 40 s on one
// mount, and on two mounts of one store; no error, no lost update, no torn read of a version
// that was whole. Each run is made twice: the daemons' memory and open descriptors, sampled
// twice a second, are reported, bounded, and must not grow from the first run to the second.
//
// `UBIQUITYFS_LOAD_SECONDS` sets the length of a run (40 by default; `--long`: 30 minutes).

import Foundation
import Glibc
import XCTest

final class LoadTests: MountTestCase {
    static var seconds: Int {
        max(5, Int(ProcessInfo.processInfo.environment["UBIQUITYFS_LOAD_SECONDS"] ?? "") ?? 40)
    }
    override var testDeadline: Double { Double(Self.seconds) * 2 * 1.5 + 120 }

    /// A daemon's resident memory (KiB) and open descriptors.
    struct Usage { var rss: Int; var fds: Int }

    static func usage(of pid: pid_t) -> Usage? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? ""),
              let fds = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd") else { return nil }
        return Usage(rss: kib, fds: fds.count)
    }

    /// Runs the load in `dirs` (one folder seen through each mount) while sampling `pids`;
    /// returns each daemon's peak and its usage once the load is over.
    private func run(_ round: Int, in dirs: [String], daemons pids: [pid_t]) throws -> (peak: [Usage], after: [Usage]) {
        for d in dirs where !Posix.exists(d) {
            XCTAssertEqual(mkdir(d, 0o755), 0, "mkdir \(d): \(Posix.describe(errno))")
        }
        let result = workDir + "/load-\(round).json"
        let load = try BackgroundProcess(["python3", Self.packageRoot + "/scripts/loadtest.py", "run", String(Self.seconds), result] + dirs,
                                         environment: environment, log: workDir + "/load-\(round).out")
        defer { load.stop() }
        var peak = pids.map { _ in Usage(rss: 0, fds: 0) }
        let deadline = Date().addingTimeInterval(Double(Self.seconds) + 120 * Command.slack)
        while load.isRunning && Date() < deadline {
            for (i, pid) in pids.enumerated() {
                guard let u = Self.usage(of: pid) else { continue }
                peak[i].rss = max(peak[i].rss, u.rss)
                peak[i].fds = max(peak[i].fds, u.fds)
            }
            usleep(500_000)
        }
        XCTAssertFalse(load.isRunning, "round \(round): the load did not end")
        let out = (try? String(contentsOfFile: workDir + "/load-\(round).out", encoding: .utf8)) ?? ""
        let json = try XCTUnwrap(FileManager.default.contents(atPath: result), "round \(round): no result: \(out)")
        let parsed = try XCTUnwrap(try JSONSerialization.jsonObject(with: json) as? [String: Any])
        let problems = parsed["problems"] as? [String] ?? ["no problems list"]
        XCTAssertEqual(problems, [], "round \(round): \(out)")
        let counts = parsed["counts"] as? [String: Int] ?? [:]
        XCTAssertGreaterThan(counts["save", default: 0] + counts["atomic save", default: 0], 100, "round \(round): the writers worked: \(out)")
        XCTAssertGreaterThan(counts["read", default: 0], 100, "round \(round): the readers worked: \(out)")
        XCTAssertGreaterThan(counts["read checked whole", default: 0], 100, "round \(round): reads were checked whole: \(out)")
        XCTAssertGreaterThan(counts["ls -l", default: 0], 10, "round \(round): the listings worked: \(out)")
        sleep(2)   // idle publishes and the change feed settle
        let after = pids.map { Self.usage(of: $0) ?? Usage(rss: 0, fds: 0) }
        for (i, p) in peak.enumerated() {
            print("load round \(round), daemon \(i + 1) of \(pids.count): \(out.split(separator: "\n").last ?? ""); "
                  + "peak RSS \(p.rss / 1024) MiB, \(p.fds) descriptors; after it \(after[i].rss / 1024) MiB, \(after[i].fds) descriptors")
        }
        return (peak, after)
    }

    /// Bounds on each run, and no growth from the first run to the second.
    private func assertBoundedWithoutGrowth(_ first: (peak: [Usage], after: [Usage]), _ second: (peak: [Usage], after: [Usage])) {
        for (i, p) in (first.peak + second.peak).enumerated() {
            XCTAssertLessThan(p.rss, 512 * 1024, "daemon \(i % first.peak.count + 1): peak RSS \(p.rss / 1024) MiB")
            XCTAssertLessThan(p.fds, 1024, "daemon \(i % first.peak.count + 1): \(p.fds) descriptors open at the peak")
        }
        for i in first.after.indices {
            let a = first.after[i], b = second.after[i]
            XCTAssertLessThanOrEqual(b.rss, a.rss + a.rss / 4 + 16 * 1024,
                                     "daemon \(i + 1): RSS grew from \(a.rss / 1024) MiB after the first run to \(b.rss / 1024) MiB")
            // libfuse's workers come and go with the load, each holding a splice pipe (two
            // descriptors) while it lives, up to 16 of them: a leak grows with the thousands of
            // operations of a run, far past that.
            XCTAssertLessThanOrEqual(b.fds, a.fds + 40, "daemon \(i + 1): descriptors grew from \(a.fds) to \(b.fds)")
        }
    }

    func testWritersReadersAndListingsOnOneMount() throws {
        try mount()
        let pid = try daemonPID(of: mountPoint)
        let first = try run(1, in: [docs("SugoiApp") + "/load-1"], daemons: [pid])
        let second = try run(2, in: [docs("SugoiApp") + "/load-2"], daemons: [pid])
        assertBoundedWithoutGrowth(first, second)
        try unmount()
        assertStoreWhole()
    }

    func testWritersReadersAndListingsOnTwoMountsOfOneStore() throws {
        let second = workDir + "/mnt2"
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount()
        try mount(at: second)
        let pids = [try daemonPID(of: mountPoint), try daemonPID(of: second)]
        var rounds: [(peak: [Usage], after: [Usage])] = []
        for round in 1...2 {
            let dir = "/SugoiApp/load-\(round)"
            XCTAssertEqual(mkdir(mountPoint + dir, 0o755), 0)
            eventually("the other mount shows load-\(round)") { Posix.isDirectory(second + dir) }
            rounds.append(try run(round, in: [mountPoint + dir, second + dir], daemons: pids))
        }
        assertBoundedWithoutGrowth(rounds[0], rounds[1])
        try unmount(at: second)
        try unmount()
        assertStoreWhole()
    }
}
