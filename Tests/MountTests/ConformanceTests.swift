// POSIX conformance against ext4: `scripts/posixcheck.py` runs as root in a folder on this
// machine's own disk and in a container folder of a mount with `-o allow_other` (other users'
// calls as nobody), about a hundred checks: errnos of every kind of failure, other users and
// sticky and setgid folders, set-user-ID bits, every file type, and which of atime, mtime and
// ctime each operation changes on the item and its folder. The two must print the same lines,
// but where the mount differs on purpose (each difference listed here says where SEMANTICS.md
// says so).

import Foundation
import Glibc
import XCTest

final class ConformanceTests: MountTestCase {
    /// Lines where the mount differs from ext4 on purpose, with what the mount prints.
    static let documentedDifferences: [String: String] = [
        // SEMANTICS.md, read: "A read never updates atime."
        "times of read of a file whose atime is older than its mtime, item": "---",
    ]

    private func run(in dir: String) throws -> [String: String] {
        let r = Command.run(["python3", Self.packageRoot + "/scripts/posixcheck.py", dir], timeout: 300, environment: environment)
        XCTAssertTrue(r.succeeded, "\(r)")
        var out: [String: String] = [:]
        for line in r.lines {
            guard let colon = line.range(of: ": ", options: .backwards) else { XCTFail("a line without a result: \(line)"); continue }
            XCTAssertNil(out[String(line[..<colon.lowerBound])], "one line per check: \(line)")
            out[String(line[..<colon.lowerBound])] = String(line[colon.upperBound...])
        }
        return out
    }

    func testTheMountAnswersAsExt4ButWhereItSaysOtherwise() throws {
        // Other users must reach both folders: the test's own folder is 0700 (mkdtemp).
        XCTAssertEqual(chmod(workDir, 0o755), 0)
        let native = workDir + "/native"
        XCTAssertEqual(mkdir(native, 0o755), 0)
        XCTAssertTrue(sh("df --output=fstype \(shellQuote(native)) | tail -1").stdout.contains("ext4"),
                      "the reference folder is on ext4")
        try mount(options: "allow_other")
        let mounted = docs("SugoiApp") + "/posix"
        XCTAssertEqual(mkdir(mounted, 0o755), 0)
        let expected = try run(in: native)
        let got = try run(in: mounted)
        XCTAssertGreaterThan(expected.count, 90, "the checks ran")
        XCTAssertEqual(Set(got.keys), Set(expected.keys), "the same checks ran on both")
        for (check, want) in expected.sorted(by: { $0.key < $1.key }) {
            let mountWants = Self.documentedDifferences[check] ?? want
            XCTAssertEqual(got[check], mountWants, "\(check): ext4 says \(want)")
        }
        for check in Self.documentedDifferences.keys {
            XCTAssertNotNil(expected[check], "a documented difference names a check that ran: \(check)")
        }
        try unmount()
        assertStoreWhole()
    }
}
