import Foundation
import Glibc
import XCTest

/// A mount test on the shared store: a database of its own on the test server (scripts/services,
/// which scripts/test runs every test under), created with `ubiquityfs init-store` and dropped at
/// the end. Each mount point has a local folder of its own, as each machine has: the first
/// mount's is `storeDir`, so the daemon-log and pid helpers work for it unchanged.
class SharedStoreTestCase: MountTestCase {
    private(set) var database = ""
    private(set) var storeURL = ""
    /// Where the store keeps its chunks (`init-store --chunks`): in PostgreSQL unless a subclass
    /// says otherwise.
    var chunksOption: String? { nil }

    /// The test server's URL (no password: it comes from PGPASSFILE).
    static func serverURL() throws -> String {
        guard let url = ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_POSTGRES"], !url.isEmpty else {
            let message = "UBIQUITYFS_TEST_POSTGRES is not set: run the tests under 'scripts/services run …' "
                + "(scripts/test does), which starts PostgreSQL and Ceph"
            XCTFail(message)
            throw FixtureError(message)
        }
        return url
    }

    /// A bucket for this test on the test object store (Ceph's RGW).
    func bucketOption() -> String {
        let endpoint = ProcessInfo.processInfo.environment["S3_ENDPOINT"] ?? "http://S3_ENDPOINT-is-not-set"
        return "s3://ubqm-\(database.dropFirst(5).prefix(16))?endpoint=\(endpoint)"
    }

    /// `psql` on the test server's database `db` (the server's own by default).
    func psql(_ sql: String, database db: String? = nil) -> CommandResult {
        var args = ["psql", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql]
        if let db { args += ["-d", db] }
        return Command.run(args, timeout: 60, environment: environment)
    }

    override func setUpWithError() throws {
        try super.setUpWithError()
        let base = try Self.serverURL()
        database = "ubqm_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(20)
        let created = psql("CREATE DATABASE \(database)")
        guard created.succeeded else { throw FixtureError("cannot create the test database: \(created)") }
        storeURL = String(base[..<base.range(of: "/", options: .backwards)!.lowerBound]) + "/" + database
        let initialized = ubiquityfs(["init-store", "--store", storeURL] + (chunksOption.map { ["--chunks", $0] } ?? []))
        guard initialized.succeeded else { throw FixtureError("init-store failed: \(initialized)") }
    }

    override func tearDown() {
        super.tearDown()   // unmounts and stops every daemon first
        if !database.isEmpty { _ = psql("DROP DATABASE IF EXISTS \(database) WITH (FORCE)") }
    }

    /// The local folder of the mount at `mnt`.
    func localFolder(at mnt: String) -> String {
        mnt == mountPoint ? storeDir : workDir + "/local-" + (mnt as NSString).lastPathComponent
    }

    /// The second machine's mount point.
    var second: String { workDir + "/mnt2" }

    /// Mounts machine A at the mount point and machine B at `second`, with long kernel caches
    /// (what they show of each other comes through invalidations).
    func mountBoth(extra: [String] = []) throws {
        try mount(extra: TwoMountsTests.longCache + extra)
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(extra: TwoMountsTests.longCache + extra, at: second)
    }

    override func storeArguments(at mnt: String) -> [String] {
        ["--store", storeURL, "--local", localFolder(at: mnt)]
    }
}
