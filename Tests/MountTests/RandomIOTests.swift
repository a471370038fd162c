import Foundation
import XCTest

/// `scripts/fsx.py` through the mount: random writes (across chunk boundaries, past the end),
/// reads, truncates, reads and writes through a shared mapping, reopens, a second descriptor,
/// fsync and dropped page caches, each checked against an in-memory model. 100,000 operations
/// per run with fixed seeds, 40,000 of them while a second mount of the same store reads the
/// file whole after closes. `UBIQUITYFS_FSX_SCALE` scales them (`scripts/test --long`: ten times).
final class RandomIOTests: MountTestCase {
    /// A guard against a hung mount, not a timing: the 60,000 operations take about a minute
    /// here, several on a loaded machine.
    override var testDeadline: Double { 600 * max(1, Double(ProcessInfo.processInfo.environment["UBIQUITYFS_FSX_SCALE"] ?? "") ?? 1) }

    static func operations(_ n: Int) -> Int {
        let scale = Double(ProcessInfo.processInfo.environment["UBIQUITYFS_FSX_SCALE"] ?? "") ?? 1
        return max(100, Int(Double(n) * scale))
    }

    private func fsx(_ arguments: [String]) {
        let r = Command.run(["python3", Self.packageRoot + "/scripts/fsx.py"] + arguments, timeout: 3600)
        XCTAssertEqual(r.status, 0, "\(r)")
        XCTAssertTrue(r.stdout.contains("the file matches the model"), r.stdout)
    }

    func testRandomIOMatchesTheModel() throws {
        try mount()
        fsx([docs("SugoiApp") + "/fsx.bin", String(Self.operations(60_000)), "1", "--drop-every", "2000"])
        try unmount()
    }

    func testRandomIOThroughTwoMountsOfOneStore() throws {
        try mount()
        let second = workDir + "/mnt2"
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(at: second)
        fsx([docs("SugoiApp") + "/fsx.bin", String(Self.operations(40_000)), "2", "--other", second + "/SugoiApp/fsx.bin"])
        try unmount(at: second)
        try unmount()
    }
}
