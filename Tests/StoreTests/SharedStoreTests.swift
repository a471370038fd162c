import Foundation
import XCTest
@testable import UbiquitySharedStore
@testable import UbiquityStore

/// The server the shared-store tests use: `scripts/services` starts one and exports its URL
/// (scripts/test runs every test under it).
func testPostgresURL() throws -> String {
    guard let url = ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_POSTGRES"], !url.isEmpty else {
        throw StoreError(errno: EINVAL, "UBIQUITYFS_TEST_POSTGRES is not set: run the tests under "
                         + "'scripts/services run …' (scripts/test does), which starts PostgreSQL and Ceph")
    }
    return url
}

/// The URL of database `name` on the test server.
func postgresURL(_ base: String, database name: String) -> String {
    var url = base
    if let slash = url.range(of: "/", options: .backwards), slash.lowerBound > url.index(url.startIndex, offsetBy: 12) {
        url = String(url[..<slash.lowerBound])
    }
    return url + "/" + name
}

/// The test object store's endpoint (scripts/services starts Ceph's RGW).
func testS3Endpoint() throws -> String {
    guard let endpoint = ProcessInfo.processInfo.environment["S3_ENDPOINT"], !endpoint.isEmpty else {
        throw StoreError(errno: EINVAL, "S3_ENDPOINT is not set: run the tests under 'scripts/services run …' (scripts/test does)")
    }
    return endpoint
}

/// A fresh database per fixture, dropped at the end, with chunks in it or in a fresh bucket;
/// this writer's working copies in a temporary folder.
final class PostgresFixture: StoreFixture {
    let url: String
    let database: String
    let admin: PGConnection
    let local: String
    let chunks: ChunkLocation
    var isOnDisk: Bool { true }

    init(s3: Bool = false) throws {
        let base = try testPostgresURL()
        // Only [a-z0-9_]: a database name cannot be a statement parameter.
        database = "ubqt_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(20)
        admin = PGConnection(PGTarget(url: base, timeout: 10))
        try admin.run("CREATE DATABASE \(database)", [])
        url = postgresURL(base, database: database)
        local = FileManager.default.temporaryDirectory.appendingPathComponent("storetests-pg-\(UUID().uuidString)").path
        if s3 {
            let bucket = "ubqt-" + database.dropFirst(5).prefix(16)
            chunks = try parseChunkLocation("s3://\(bucket)?endpoint=\(try testS3Endpoint())")
        } else {
            chunks = .postgres
        }
        _ = try initSharedStore(url: url, chunks: chunks)
    }

    func open() throws -> BackingStore {
        try openSharedStore(url: url, chunks: chunks, localDirectory: local)
    }

    func secondWriter() throws -> any MetadataStore { try PostgresMetadataStore(url: url) }
    func secondLockTable() throws -> any LockTable { try PostgresLockTable(url: url) }

    /// A connection of the test's own to the fixture's database.
    func connection() -> PGConnection { PGConnection(PGTarget(url: url, timeout: 10)) }

    func corrupt(_ ref: ChunkRef, in store: BackingStore) throws {
        if let s3 = (store.blobs as? ChunkCache)?.remote as? S3BlobStore {
            var bytes = try readBlob(s3, ref.blob, count: Int(ref.length))
            bytes[0] ^= 0xff
            var body: [UInt8] = []
            var n = 0
            let status = try bytes.withUnsafeBytes { (b) throws -> Int in
                try s3.client.perform("PUT", s3.client.url(s3.key(ref.blob)), body: b, collected: &body, received: &n)
            }
            XCTAssertEqual(status, 200)
            return
        }
        let r = try connection().query("""
            UPDATE ubiquityfs.blobs SET data = overlay(data PLACING decode('ff', 'hex') FROM 1 FOR 1)
            WHERE id = $1 AND get_byte(data, 0) <> 255
            """, [.int(Int64(bitPattern: ref.blob))])
        if r.affected == 0 {
            _ = try connection().query("UPDATE ubiquityfs.blobs SET data = overlay(data PLACING decode('00', 'hex') FROM 1 FOR 1) WHERE id = $1",
                                       [.int(Int64(bitPattern: ref.blob))])
        }
    }

    func remove() {
        // The replica's SQLite may still be closing on another thread (it deletes its -wal file
        // then), which fails a removal walking the folder: again until it is gone.
        for _ in 0..<100 where FileManager.default.fileExists(atPath: local) {
            if (try? FileManager.default.removeItem(atPath: local)) == nil { usleep(20_000) }
        }
        if case .s3(let location) = chunks, let client = try? S3Client(location, timeout: 10),
           let blobs = try? S3BlobStore(location, timeout: 10, ids: IDReserve { _ in 1...1 }) {
            for id in (try? blobs.allBlobs()) ?? [] { try? blobs.delete(id) }
            var body: [UInt8] = []
            var n = 0
            _ = try? client.perform("DELETE", client.url("ubiquityfs-store"), collected: &body, received: &n)
            _ = try? client.perform("DELETE", client.url(nil), collected: &body, received: &n)
        }
        _ = try? admin.run("DROP DATABASE IF EXISTS \(database) WITH (FORCE)", [])
    }
}

/// The shared suite on the shared store (PostgreSQL metadata, locks and chunks), plus what only
/// it has.
final class PostgresStoreTests: XCTestCase {
    private var fixture: PostgresFixture!

    override func setUpWithError() throws {
        fixture = try PostgresFixture()
    }

    override func tearDown() {
        fixture?.remove()
        fixture = nil
        super.tearDown()
    }

    func testCommitLoadRoundTripOfEveryMutation() throws { try StoreSuite.commitLoadRoundTripOfEveryMutation(fixture) }
    func testFailingMutationLeavesNothing() throws { try StoreSuite.failingMutationLeavesNothing(fixture) }
    func testFailedCommitByFaultPlanAppliesNothing() throws { try StoreSuite.failedCommitByFaultPlanAppliesNothing(fixture) }
    func testIdsAreNeverReused() throws { try StoreSuite.idsAreNeverReused(fixture) }
    func testVersionsAreListedOldestFirst() throws { try StoreSuite.versionsAreListedOldestFirst(fixture) }
    func testMovedVersionsRememberTheirFile() throws { try StoreSuite.movedVersionsRememberTheirFile(fixture) }
    func testDurableCommitAndEmptyBatches() throws { try StoreSuite.durableCommitAndEmptyBatches(fixture) }
    func testReopenKeepsData() throws { try StoreSuite.reopenKeepsData(fixture) }
    func testConcurrentCommitsAndReads() throws { try StoreSuite.concurrentCommitsAndReads(fixture) }
    func testCapacityIsReported() throws { try StoreSuite.capacityIsReported(fixture) }
    func testBlobWriteReadPartialVerifyDelete() throws { try StoreSuite.blobWriteReadPartialVerifyDelete(fixture) }
    func testCorruptBlobFailsVerify() throws { try StoreSuite.corruptBlobFailsVerify(fixture) }
    func testConcurrentReadsOfManyBlobs() throws { try StoreSuite.concurrentReadsOfManyBlobs(fixture, count: 100) }
    func testWorkFileReadWriteTruncateMark() throws { try StoreSuite.workFileReadWriteTruncateMark(fixture) }
    func testLeftoversAfterCrash() throws { try StoreSuite.leftoversAfterCrash(fixture) }
    func testBlobsListedByAge() throws { try StoreSuite.blobsListedByAge(fixture) }
    func testReservedIdsNeverClash() throws { try StoreSuite.reservedIdsNeverClash(fixture) }
    func testFirstReservedInodeIsTwo() throws { try StoreSuite.firstReservedInodeIsTwo(fixture) }
    func testConflictingBatchFailsWhole() throws { try StoreSuite.conflictingBatchFailsWhole(fixture) }
    func testChangeLogResumesWithNoGap() throws { try StoreSuite.changeLogResumesWithNoGap(fixture) }
    func testTrimmedChangeLogSaysSo() throws { try StoreSuite.trimmedChangeLogSaysSo(fixture) }
    func testFinishedMarkSurvivesACrash() throws { try StoreSuite.finishedMarkSurvivesACrash(fixture) }
    func testCreateReplacesAndStaleRemoveIsHarmless() throws { try StoreSuite.createReplacesAndStaleRemoveIsHarmless(fixture) }
    func testFaultPlanTriggers() throws { try StoreSuite.faultPlanTriggers(fixture) }
    func testFailedBlobWriteStoresNothing() throws { try StoreSuite.failedBlobWriteStoresNothing(fixture) }
    func testPosixLocksConflictAcrossWriters() throws { try StoreSuite.posixLocksConflictAcrossWriters(fixture) }
    func testFlockLocksConflictAcrossWriters() throws { try StoreSuite.flockLocksConflictAcrossWriters(fixture) }

    // MARK: Shared store only

    /// Two machines committing at once: positions follow commit order (a reader that saw N saw
    /// every commit before it), and of two batches expecting one free name only one lands.
    func testConcurrentWritersGetOrderedPositionsAndOneWinsAName() throws {
        let a = try fixture.secondWriter()
        let b = try fixture.secondWriter()
        let reader = try fixture.secondWriter()
        let seen = LockedBox<[ChangeSeq]>([])
        let wins = Counter()
        let stop = LockedBox(false)
        let readerDone = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            var last: ChangeSeq = 0
            while !stop.value {
                if let records = try? reader.changes(since: last) {
                    for r in records {
                        seen.update { $0.append(r.seq) }
                        last = r.seq
                    }
                }
            }
            readerDone.signal()
        }
        DispatchQueue.concurrentPerform(iterations: 2) { i in
            let m = i == 0 ? a : b
            for k in 0..<60 {
                let name = Array("name-\(k)".utf8)
                do {
                    try m.commit(Batch([.putDirent(DirentRecord(parent: 1, name: name, child: UInt64(100 + i)))],
                                       expecting: [.nameFree(parent: 1, name: name)], writer: "w\(i)"), durable: false)
                    wins.add()
                } catch let error as StoreError {
                    XCTAssertEqual(error.kind, .conflict, "\(error)")
                } catch {
                    XCTFail("\(error)")
                }
            }
        }
        Thread.sleep(forTimeInterval: 0.3)
        stop.update { $0 = true }
        readerDone.wait()
        XCTAssertEqual(wins.count, 60, "each name is taken exactly once")
        XCTAssertEqual(seen.value, Array(1...60), "the reader saw every position, in order, with no gap")
        XCTAssertEqual(try reader.load().dirents.count, 60)
    }

    /// A missing schema is a clear error pointing at init-store; a newer one is refused; a
    /// second init-store changes nothing.
    /// A store of schema version 1 is brought forward when opened; the tokens of trimmed change
    /// log rows still say where a COMMIT whose answer was lost landed; versions gain `moved_from`,
    /// and big files' versions share chunk lists.
    func testAnOlderSchemaIsBroughtForwardAndTokensOutliveTheLog() throws {
        let c = fixture.connection()
        try c.query("DROP TABLE ubiquityfs.tokens")
        try c.query("DROP TABLE ubiquityfs.chunk_lists")
        try c.query("ALTER TABLE ubiquityfs.versions DROP COLUMN moved_from")
        try c.query("ALTER TABLE ubiquityfs.versions DROP COLUMN list")
        try c.query("UPDATE ubiquityfs.store SET value = 1 WHERE key = 'schema_version'")
        // A daemon of an earlier version still present: no migration under it.
        try c.query("INSERT INTO ubiquityfs.presence(writer, lease_until) VALUES('old-machine', 9223372036854775807)")
        let refused = assertStoreError(EBUSY) { _ = try PostgresMetadataStore(url: fixture.url) }
        XCTAssertTrue(refused?.message.contains("still running on it cannot read (old-machine)") ?? false, "\(String(describing: refused))")
        XCTAssertEqual(try c.query("SELECT value FROM ubiquityfs.store WHERE key = 'schema_version'").int(0, 0), 3,
                       "the steps before it landed")
        try c.query("DELETE FROM ubiquityfs.presence")
        let store = try PostgresMetadataStore(url: fixture.url)
        XCTAssertEqual(try c.query("SELECT value FROM ubiquityfs.store WHERE key = 'schema_version'").int(0, 0), 4)
        let big = VersionRecord(id: 9, ino: 4, created: 1, size: 0,
                                chunks: (1...70).map { ChunkRef(blob: UInt64($0), length: 1, checksum: 0) },
                                origin: .published, device: "host")
        try store.commit([.putVersion(big)], durable: false)
        XCTAssertEqual(try store.versions(of: 4), [big])
        XCTAssertEqual(try c.query("SELECT count(*) FROM ubiquityfs.chunk_lists").int(0, 0), 1)
        try store.commit([.putVersion(Sample.version(1, ino: 2)), .moveVersions(from: 2, to: 3)], durable: false)
        XCTAssertEqual(try store.versions(of: 3).map(\.movedFrom), [2])
        var unknown: Int32?
        let seq = try store.commit(Batch([.setMeta(key: "k", value: "v")], writer: "w"), token: "token-1", unknownOutcome: &unknown)
        try store.trimChanges(keepingLast: 0)
        XCTAssertEqual(try c.query("SELECT count(*) FROM ubiquityfs.changes").int(0, 0), 0, "the log row went")
        XCTAssertEqual(try store.landed(token: "token-1", backend: 0), seq)
        XCTAssertNil(try store.landed(token: "token-2", backend: 0))
        // Opening again finds nothing to do.
        _ = try PostgresMetadataStore(url: fixture.url)
        XCTAssertEqual(try store.landed(token: "token-1", backend: 0), seq)
    }

    /// A big file's versions share a chunk list: each row, and each change-log row, holds what
    /// it changed from the list; every read gives the whole list back; a list goes with the
    /// last version naming it, and the change log then leaves the versions it named out.
    func testBigFilesVersionsShareAChunkList() throws {
        let store = try PostgresMetadataStore(url: fixture.url)
        let c = fixture.connection()
        let n = ChunkDelta.sharedListMinimum + 1
        var tail = Sample.chunks(1, count: n)
        tail[n - 1] = .hole
        let v1 = Sample.version(1, ino: 5, chunks: Sample.chunks(1, count: n))
        let v2 = Sample.version(2, ino: 5, chunks: tail + Sample.chunks(2, count: 1))
        let v3 = Sample.version(3, ino: 5, chunks: Sample.chunks(3, count: n))
        try store.commit([.putNode(Sample.node(5, version: 2)), .putVersion(v1), .putVersion(v2)], durable: true)
        try store.commit([.putVersion(v3)], durable: true)
        let rows = try c.query("SELECT id, list, length(chunks)::bigint FROM ubiquityfs.versions ORDER BY id")
        XCTAssertEqual((0..<rows.count).map { rows.int($0, 1) }, [1, 1, 3])
        XCTAssertEqual((0..<rows.count).map { rows.int($0, 2) }, [4, 4 + 2 * Int64(ChunkDelta.entrySize), 4])
        let log = try c.query("SELECT max(length(batch))::bigint FROM ubiquityfs.changes")
        XCTAssertLessThan(log.int(0, 0), Int64(n * ChunkPacking.entrySize), "the log names the list")
        XCTAssertEqual(try store.versions(of: 5), [v1, v2, v3])
        XCTAssertEqual(try store.version(2), v2)
        XCTAssertEqual(try store.allVersions(), [v1, v2, v3])
        XCTAssertEqual(try store.load().currentVersions, [v2])
        func versions(_ records: [ChangeRecord]) -> [VersionRecord] {
            records.flatMap(\.mutations).compactMap { if case .putVersion(let v) = $0 { v } else { nil } }
        }
        XCTAssertEqual(versions(try store.changes(since: 0)), [v1, v2, v3])
        XCTAssertTrue(try store.referencedBlobs().isSuperset(of: Set([v1, v2, v3].flatMap { $0.chunks.filter { !$0.isHole }.map(\.blob) })))
        try store.commit([.deleteVersion(1)], durable: true)
        XCTAssertEqual(try store.versions(of: 5), [v2, v3])
        XCTAssertEqual(try c.query("SELECT count(*) FROM ubiquityfs.chunk_lists").int(0, 0), 2, "v2 still names v1's list")
        try store.commit([.deleteNode(5)], durable: true)
        XCTAssertEqual(try c.query("SELECT count(*) FROM ubiquityfs.chunk_lists").int(0, 0), 0)
        XCTAssertEqual(versions(try store.changes(since: 0)), [], "their lists are gone; later rows delete them")
    }

    func testSchemaMissingNewerAndInitAgain() throws {
        let base = try testPostgresURL()
        let name = "ubqt_empty_" + String(UInt32.random(in: 0...UInt32.max))
        try fixture.admin.run("CREATE DATABASE \(name)", [])
        defer { _ = try? fixture.admin.run("DROP DATABASE IF EXISTS \(name) WITH (FORCE)", []) }
        let empty = postgresURL(base, database: name)
        let error = assertStoreError(ENOENT) { _ = try PostgresMetadataStore(url: empty) }
        XCTAssertTrue(error?.message.contains("ubiquityfs init-store --store \(empty)") ?? false, "\(String(describing: error))")

        XCTAssertTrue(try initSharedStore(url: fixture.url, chunks: .postgres).first?.contains("already holds") ?? false)
        try fixture.connection().query("UPDATE ubiquityfs.store SET value = 99 WHERE key = 'schema_version'")
        let newer = assertStoreError(EIO) { _ = try PostgresMetadataStore(url: fixture.url) }
        XCTAssertTrue(newer?.message.contains("schema version 99") ?? false, "\(String(describing: newer))")
        XCTAssertTrue(newer?.message.contains("use a newer ubiquityfs") ?? false)
    }

    /// A password never goes on the command line: a URL with one is refused, and so is a password
    /// file others can read (libpq would silently ignore it).
    func testPasswordsStayOffTheCommandLine() throws {
        let withPassword = fixture.url.replacingOccurrences(of: "://ubiquityfs@", with: "://ubiquityfs:secret@")
        XCTAssertNotEqual(withPassword, fixture.url)
        let error = assertStoreError(EINVAL) { _ = try PostgresMetadataStore(url: withPassword) }
        XCTAssertFalse(error?.message.contains("secret") ?? true, "the password is not repeated")
        let file = fixture.local + "-pgpass"
        try "127.0.0.1:*:*:ubiquityfs:x\n".write(toFile: file, atomically: false, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        chmod(file, 0o644)
        let loose = assertStoreError(EACCES) { _ = try PostgresMetadataStore(url: fixture.url + "?passfile=" + file) }
        XCTAssertTrue(loose?.message.contains("chmod 600 \(file)") ?? false, "\(String(describing: loose))")
    }

    /// A server that cannot be reached is `unavailable` within the timeout, not a hang.
    func testAnUnreachableServerFailsWithinTheTimeout() throws {
        // A port nothing listens on, and an address that drops packets (TEST-NET-1).
        // And a name no resolver knows (looked up within the timeout too, not inside libpq).
        for url in ["postgres://ubiquityfs@127.0.0.1:9/ubiquityfs", "postgres://ubiquityfs@192.0.2.1:5432/ubiquityfs",
                    "postgres://ubiquityfs@no-such-host.invalid:5432/ubiquityfs"] {
            let start = Date()
            let error = assertStoreError(EHOSTUNREACH) { _ = try PostgresMetadataStore(url: url, timeout: 2) }
            XCTAssertEqual(error?.kind, .unavailable)
            XCTAssertLessThan(Date().timeIntervalSince(start), 10, url)
        }
    }

    /// A host name is looked up by the store (libpq's lookup would block past the timeout), and
    /// connecting by name works.
    func testAHostNameIsLookedUpWithinTheTimeout() throws {
        XCTAssertEqual(hostName(of: "postgres://u@db.example.net:5432/d"), "db.example.net")
        XCTAssertNil(hostName(of: "postgres://u@127.0.0.1/d"), "an address needs no lookup")
        XCTAssertNil(hostName(of: "postgres://u@[::1]/d"))
        XCTAssertNil(hostName(of: "postgresql:///d?host=/run/postgresql"), "a socket folder")
        XCTAssertNil(hostName(of: "postgres://u@a,b/d"), "several hosts are libpq's to try")
        XCTAssertTrue(["127.0.0.1", "::1"].contains(try lookUp("localhost", timeout: 5)))
        let error = assertStoreError(EHOSTUNREACH) { _ = try lookUp("no-such-host.invalid", timeout: 2) }
        XCTAssertEqual(error?.kind, .unavailable)
    }

    /// The change feed's wait returns early when another machine commits.
    func testANotificationWakesTheWaiter() throws {
        let waiter = try PostgresMetadataStore(url: fixture.url)
        let writer = try fixture.secondWriter()
        waiter.waitForChanges(0.05)   // subscribes
        let woke = LockedBox<Double>(0)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let start = Date()
            waiter.waitForChanges(20)
            woke.update { $0 = Date().timeIntervalSince(start) }
            done.signal()
        }
        Thread.sleep(forTimeInterval: 0.2)
        try writer.commit([.setMeta(key: "k", value: "v")], durable: false)
        done.wait()
        XCTAssertLessThan(woke.value, 10, "woken by the commit, long before the 20 s wait ran out")
    }

    func testTheRemoteSaysWhatItHas() throws { try remoteSaysWhatItHas(fixture) }

    /// A chunk connection the server ended while it sat idle (a server restart) costs nothing:
    /// the next read is tried again on a new connection.
    func testChunkReadsOutliveConnectionsTheServerEnded() throws {
        let store = try fixture.open()
        let ref = try writeBlob(store.blobs, Sample.bytes(5000, seed: 31))
        store.localChunks?.evict([ref.blob])
        let ended = try fixture.connection().query("""
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE datname = current_database() AND application_name = 'ubiquityfs chunks'
            """)
        XCTAssertGreaterThan(ended.int(0, 0), 0, "the pool's connections were ended")
        XCTAssertEqual(try readBlob(store.blobs, ref.blob, count: 5000), Sample.bytes(5000, seed: 31))
    }

    /// A writer whose lease ran out (a machine that died or lost its link) holds nothing while it
    /// is away; when it comes back, the locks its programs still hold are held again.
    func testLocksOfAWriterWhoseLeaseRanOutCountForNothingUntilItIsBack() throws {
        let one = try PostgresLockTable(url: fixture.url)
        let two = try PostgresLockTable(url: fixture.url)
        let a = LockOwner(writer: "machine-a", id: 1, style: .posix)
        let b = LockOwner(writer: "machine-b", id: 1, style: .posix)
        XCTAssertTrue(try one.set(5, owner: a, mode: .write, range: .wholeFile, pid: 10))
        XCTAssertFalse(try two.set(5, owner: b, mode: .write, range: .wholeFile, pid: 20))
        XCTAssertEqual(try two.test(5, owner: b, mode: .read, range: .wholeFile)?.pid, 0, "another machine's holder")
        try fixture.connection().query("UPDATE ubiquityfs.writers SET lease_until = 0 WHERE writer = 'machine-a'")
        XCTAssertNil(try two.test(5, owner: b, mode: .write, range: .wholeFile))
        XCTAssertTrue(try two.set(5, owner: b, mode: .write, range: .wholeFile, pid: 20))
        // Machine A is back: its program still holds its lock, which goes back on the servers
        // beside B's (each took it while they could not see each other), so a third program
        // on either machine waits for both.
        let c = LockOwner(writer: "machine-a", id: 2, style: .posix)
        XCTAssertTrue(try one.set(6, owner: c, mode: .read, range: .wholeFile, pid: 10))
        XCTAssertNotNil(try one.test(5, owner: a, mode: .read, range: .wholeFile), "B holds node 5")
        let rows = try fixture.connection().query("SELECT count(*) FROM ubiquityfs.locks WHERE node = 5 AND writer = 'machine-a'")
        XCTAssertEqual(rows.int(0, 0), 1)
        XCTAssertFalse(try one.set(5, owner: c, mode: .read, range: .wholeFile, pid: 11))
        XCTAssertFalse(try two.set(5, owner: LockOwner(writer: "machine-b", id: 2, style: .posix), mode: .read,
                                   range: .wholeFile, pid: 21))
        // Once A's program lets go, only B's holds.
        one.release(5, owner: a)
        XCTAssertFalse(try one.set(5, owner: c, mode: .read, range: .wholeFile, pid: 11))
        two.release(5, owner: b)
        XCTAssertTrue(try one.set(5, owner: c, mode: .read, range: .wholeFile, pid: 11))
    }
}

/// The shared suite with chunks in an S3-compatible object store (Ceph's RGW), plus what only it
/// has.
final class S3StoreTests: XCTestCase {
    private var fixture: PostgresFixture!

    override func setUpWithError() throws {
        fixture = try PostgresFixture(s3: true)
    }

    override func tearDown() {
        fixture?.remove()
        fixture = nil
        super.tearDown()
    }

    func testTheRemoteSaysWhatItHas() throws { try remoteSaysWhatItHas(fixture) }
    func testCommitLoadRoundTripOfEveryMutation() throws { try StoreSuite.commitLoadRoundTripOfEveryMutation(fixture) }
    func testFailingMutationLeavesNothing() throws { try StoreSuite.failingMutationLeavesNothing(fixture) }
    func testFailedCommitByFaultPlanAppliesNothing() throws { try StoreSuite.failedCommitByFaultPlanAppliesNothing(fixture) }
    func testIdsAreNeverReused() throws { try StoreSuite.idsAreNeverReused(fixture) }
    func testVersionsAreListedOldestFirst() throws { try StoreSuite.versionsAreListedOldestFirst(fixture) }
    func testMovedVersionsRememberTheirFile() throws { try StoreSuite.movedVersionsRememberTheirFile(fixture) }
    func testDurableCommitAndEmptyBatches() throws { try StoreSuite.durableCommitAndEmptyBatches(fixture) }
    func testReopenKeepsData() throws { try StoreSuite.reopenKeepsData(fixture) }
    func testConcurrentCommitsAndReads() throws { try StoreSuite.concurrentCommitsAndReads(fixture) }
    func testCapacityIsReported() throws { try StoreSuite.capacityIsReported(fixture) }
    func testBlobWriteReadPartialVerifyDelete() throws { try StoreSuite.blobWriteReadPartialVerifyDelete(fixture) }
    func testCorruptBlobFailsVerify() throws { try StoreSuite.corruptBlobFailsVerify(fixture) }
    func testConcurrentReadsOfManyBlobs() throws { try StoreSuite.concurrentReadsOfManyBlobs(fixture, count: 40, readsPerThread: 40) }
    func testWorkFileReadWriteTruncateMark() throws { try StoreSuite.workFileReadWriteTruncateMark(fixture) }
    func testLeftoversAfterCrash() throws { try StoreSuite.leftoversAfterCrash(fixture) }
    func testBlobsListedByAge() throws { try StoreSuite.blobsListedByAge(fixture) }
    func testReservedIdsNeverClash() throws { try StoreSuite.reservedIdsNeverClash(fixture) }
    func testFirstReservedInodeIsTwo() throws { try StoreSuite.firstReservedInodeIsTwo(fixture) }
    func testConflictingBatchFailsWhole() throws { try StoreSuite.conflictingBatchFailsWhole(fixture) }
    func testChangeLogResumesWithNoGap() throws { try StoreSuite.changeLogResumesWithNoGap(fixture) }
    func testTrimmedChangeLogSaysSo() throws { try StoreSuite.trimmedChangeLogSaysSo(fixture) }
    func testFinishedMarkSurvivesACrash() throws { try StoreSuite.finishedMarkSurvivesACrash(fixture) }
    func testCreateReplacesAndStaleRemoveIsHarmless() throws { try StoreSuite.createReplacesAndStaleRemoveIsHarmless(fixture) }
    func testFaultPlanTriggers() throws { try StoreSuite.faultPlanTriggers(fixture) }
    func testFailedBlobWriteStoresNothing() throws { try StoreSuite.failedBlobWriteStoresNothing(fixture) }
    func testPosixLocksConflictAcrossWriters() throws { try StoreSuite.posixLocksConflictAcrossWriters(fixture) }
    func testFlockLocksConflictAcrossWriters() throws { try StoreSuite.flockLocksConflictAcrossWriters(fixture) }

    /// Chunk locations are checked when given, and a second init-store finds the bucket.
    func testChunkLocationsAreCheckedAndTheBucketIsKept() throws {
        for bad in ["s3://ab?endpoint=http://x", "s3://Upper?endpoint=http://x", "s3://bucket?endpoint=ftp://x",
                    "s3://bucket?colour=red", "tape"] {
            assertStoreError(EINVAL) { _ = try parseChunkLocation(bad) }
        }
        let again = try initSharedStore(url: fixture.url, chunks: fixture.chunks)
        XCTAssertTrue(again.contains { $0.contains("is there already") }, "\(again)")
        assertStoreError(EINVAL) { _ = try initSharedStore(url: fixture.url, chunks: .postgres) }
        assertStoreError(EINVAL) { _ = try openSharedStore(url: fixture.url, chunks: .postgres, localDirectory: fixture.local) }
        // The same bucket through another endpoint (another name for the server) is this
        // machine's way to it, not another place.
        guard case .s3(var location) = fixture.chunks else { return XCTFail("not an S3 fixture") }
        location.endpoint = location.endpoint.replacingOccurrences(of: "127.0.0.1", with: "localhost")
        let store = try openSharedStore(url: fixture.url, chunks: .s3(location), localDirectory: fixture.local)
        let ref = try writeBlob(store.blobs, [7, 7, 7])
        XCTAssertEqual((store.blobs as? ChunkCache).flatMap { ($0.remote as? S3BlobStore)?.client.location.endpoint }, location.endpoint)
        XCTAssertTrue(store.blobs.verify(ref))
        location.bucket = "another-bucket"
        assertStoreError(EINVAL) { _ = try openSharedStore(url: fixture.url, chunks: .s3(location), localDirectory: fixture.local) }
        // A bucket without the store's marker (another service's bucket of that name, reached
        // through a wrong endpoint) is refused before a chunk goes there.
        guard let s3 = (store.blobs as? ChunkCache)?.remote as? S3BlobStore else { return XCTFail("not S3 chunks") }
        XCTAssertNotNil(try s3.readMarker())
        var body: [UInt8] = []
        var n = 0
        XCTAssertEqual(try s3.client.perform("DELETE", s3.client.url("ubiquityfs-store"), collected: &body, received: &n), 204)
        let refused = assertStoreError(EINVAL) { _ = try openSharedStore(url: fixture.url, localDirectory: fixture.local) }
        XCTAssertTrue(refused?.message.contains("does not hold this store's chunks") ?? false, "\(String(describing: refused))")
        XCTAssertTrue(try initSharedStore(url: fixture.url, chunks: fixture.chunks).contains { $0.contains("is there already") },
                      "init-store at the recorded endpoint puts the marker back")
        XCTAssertNoThrow(try openSharedStore(url: fixture.url, localDirectory: fixture.local))
    }

    /// Many chunks list in pages, and each is read back.
    func testManyChunksListAcrossPages() throws {
        let blobs = try fixture.open().blobs
        var refs: [ChunkRef] = []
        for i in 0..<1_100 { refs.append(try writeBlob(blobs, [UInt8(i & 0xff), UInt8(i >> 8)])) }
        XCTAssertEqual(Set(try blobs.allBlobs()), Set(refs.map(\.blob)))
        XCTAssertEqual(try readBlob(blobs, refs[1_099].blob, count: 2), [UInt8(1_099 & 0xff), UInt8(1_099 >> 8)])
    }
}

private func chunk(_ seed: UInt64, size: Int = 400_000) -> [UInt8] { Sample.bytes(size, seed: seed) }

/// The remote says whether a chunk is there (what a queued change's chunks are checked by).
func remoteSaysWhatItHas(_ f: PostgresFixture) throws {
    let store = try f.open()
    let remote = try XCTUnwrap((store.blobs as? ChunkCache)?.remote)
    let ref = try writeBlob(store.blobs, Sample.bytes(3000, seed: 41))
    XCTAssertTrue(try remote.has(ref.blob))
    try remote.delete(ref.blob)
    XCTAssertFalse(try remote.has(ref.blob))
    XCTAssertFalse(try remote.has(0xdead_beef))
}

/// A blob store that counts reads (downloads, for the cache above it).
/// A blob store as the chunk cache's remote: ids handed out first are mapped to the ids the
/// store gives the chunk when it is put.
final class AsRemote: RemoteChunks, @unchecked Sendable {
    let base: any BlobStore
    private let lock = NSLock()
    private var next: BlobID = 1 << 40
    private var ids: [BlobID: BlobID] = [:]
    init(_ base: any BlobStore) { self.base = base }
    private func mapped(_ id: BlobID) -> BlobID { lock.withLock { ids[id] ?? id } }
    func newBlobID() throws(StoreError) -> BlobID { lock.withLock { next += 1; return next } }
    func primeIDs() throws(StoreError) {}
    func put(_ id: BlobID, _ bytes: UnsafeRawBufferPointer) throws(StoreError) {
        let ref = try base.write(bytes, durable: true)
        lock.withLock { ids[id] = ref.blob }
    }
    func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef { try base.write(bytes, durable: durable) }
    func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        try base.read(mapped(blob), at: offset, into: buffer)
    }
    func syncAll() throws(StoreError) { try base.syncAll() }
    func delete(_ blob: BlobID) throws(StoreError) { try base.delete(mapped(blob)) }
    func verify(_ ref: ChunkRef) -> Bool { var r = ref; r.blob = mapped(ref.blob); return base.verify(r) }
    func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID] { try base.allBlobs(writtenBefore: cutoff) }
    func has(_ id: BlobID) throws(StoreError) -> Bool { try base.allBlobs(writtenBefore: nil).contains(mapped(id)) }
}

final class CountingBlobStore: BlobStore, @unchecked Sendable {
    let wrapped: any BlobStore
    let reads = Counter()
    init(_ wrapped: any BlobStore) { self.wrapped = wrapped }
    func write(_ bytes: UnsafeRawBufferPointer, durable: Bool) throws(StoreError) -> ChunkRef { try wrapped.write(bytes, durable: durable) }
    func read(_ blob: BlobID, at offset: Int, into buffer: UnsafeMutableRawBufferPointer) throws(StoreError) -> Int {
        reads.add()
        Thread.sleep(forTimeInterval: 0.01)   // a network: concurrent readers of one chunk overlap
        return try wrapped.read(blob, at: offset, into: buffer)
    }
    func syncAll() throws(StoreError) { try wrapped.syncAll() }
    func delete(_ blob: BlobID) throws(StoreError) { try wrapped.delete(blob) }
    func verify(_ ref: ChunkRef) -> Bool { wrapped.verify(ref) }
    func allBlobs(writtenBefore cutoff: Int64?) throws(StoreError) -> [BlobID] { try wrapped.allBlobs(writtenBefore: cutoff) }
}

/// The local chunk cache over a remote store: reads download once, the size limit holds by
/// dropping the least recently used chunks, pinned chunks stay, evicted ones download again.
final class ChunkCacheTests: XCTestCase {
    private var folder = ""

    override func setUp() {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("chunkcache-\(UUID().uuidString)").path
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: folder)
        super.tearDown()
    }

    /// Chunks a queued change names that another machine freed meanwhile go up again from this
    /// machine's copies; those it never had are reported, not invented.
    func testChunksAnotherMachineFreedAreUploadedAgainFromHere() throws {
        let memory = makeMemoryStore().blobs
        let remote = AsRemote(memory)
        let cache = try ChunkCache(remote: remote, directory: folder, limit: 10_000_000)
        let here = try writeBlob(cache, chunk(1))
        let elsewhere = try writeBlob(memory, chunk(2))
        let kept = try writeBlob(memory, chunk(3))
        try remote.delete(here.blob)
        try memory.delete(elsewhere.blob)
        XCTAssertFalse(try remote.has(here.blob))
        XCTAssertEqual(try cache.secure([here.blob, elsewhere.blob, kept.blob, 0]), [elsewhere.blob])
        XCTAssertTrue(try remote.has(here.blob))
        XCTAssertEqual(try readBlob(remote, here.blob, count: 400_000), chunk(1))
        XCTAssertTrue(try remote.has(kept.blob))
    }

    func testReadsDownloadOnceAndTheLimitHolds() throws {
        let memory = makeMemoryStore().blobs
        let remote = CountingBlobStore(memory)
        // Written elsewhere (straight to the remote): nothing local yet.
        let refs = try (0..<6).map { try writeBlob(remote, chunk(UInt64($0))) }
        let cache = try ChunkCache(remote: AsRemote(remote), directory: folder, limit: 1_300_000)
        XCTAssertFalse(cache.isLocal(refs[0].blob))
        // Eight threads read the same chunk at once: one download.
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            XCTAssertEqual(try? readBlob(cache, refs[0].blob, at: 1000, count: 10), Array(chunk(0)[1000..<1010]))
        }
        XCTAssertEqual(remote.reads.count, 1)
        XCTAssertTrue(cache.isLocal(refs[0].blob))
        XCTAssertEqual(try readBlob(cache, refs[0].blob, count: 400_000), chunk(0))
        XCTAssertEqual(remote.reads.count, 1, "a cached chunk is read locally")
        // Pin chunk 1, then read 2…5: the limit (3 chunks) drops the oldest unpinned ones.
        try cache.keep([refs[1]])
        for i in 2..<6 { _ = try readBlob(cache, refs[i].blob, count: 1) }
        XCTAssertLessThanOrEqual(cache.usage.bytes, 1_300_000 + 400_000, "within the limit, apart from pins")
        XCTAssertTrue(cache.isLocal(refs[1].blob), "pinned")
        XCTAssertFalse(cache.isLocal(refs[0].blob), "least recently used goes first")
        XCTAssertTrue(cache.isLocal(refs[5].blob), "the newest stays")
        // A chunk that went is downloaded again, whole and right.
        XCTAssertEqual(try readBlob(cache, refs[0].blob, count: 400_000), chunk(0))
        // Evicting a pinned chunk drops the pin too.
        cache.evict([refs[1].blob])
        XCTAssertFalse(cache.isLocal(refs[1].blob))
        XCTAssertEqual(try readBlob(cache, refs[1].blob, count: 400_000), chunk(1))
    }

    func testWritesAreKeptAndTheCacheSurvivesARestart() throws {
        let remote = CountingBlobStore(makeMemoryStore().blobs)
        let shared = AsRemote(remote)
        var ref: ChunkRef
        do {
            let cache = try ChunkCache(remote: shared, directory: folder, limit: 10_000_000)
            ref = try writeBlob(cache, chunk(9))
            XCTAssertTrue(cache.isLocal(ref.blob), "what this machine writes, it keeps")
            let other = try writeBlob(remote, chunk(10))
            try cache.keep([other])
        }
        let again = try ChunkCache(remote: shared, directory: folder, limit: 10_000_000)
        XCTAssertTrue(again.isLocal(ref.blob))
        XCTAssertEqual(again.usage.chunks, 2)
        XCTAssertEqual(again.usage.pinned, 1)
        XCTAssertEqual(try readBlob(again, ref.blob, count: 400_000), chunk(9))
        XCTAssertEqual(remote.reads.count, 1, "only the pinned chunk was ever downloaded")
        // Deleting a chunk deletes the store's copy and this one.
        try again.delete(ref.blob)
        XCTAssertFalse(again.isLocal(ref.blob))
        assertStoreError(ENOENT) { try readBlob(again, ref.blob, count: 1) }
    }

    /// Pins that fill the cache leave room for the chunk being read: it is never evicted as it
    /// arrives, and a pin is never evicted by the fetches of the pin itself.
    func testPinsFillingTheCacheStillLeaveReadsWorking() throws {
        let remote = CountingBlobStore(makeMemoryStore().blobs)
        let refs = try (0..<6).map { try writeBlob(remote, chunk(UInt64(20 + $0))) }
        let cache = try ChunkCache(remote: AsRemote(remote), directory: folder, limit: Int64(chunkSize))
        try cache.keep(Array(refs[0..<3]))
        for r in refs[0..<3] { XCTAssertTrue(cache.isLocal(r.blob), "pinned, beyond the limit") }
        for (i, r) in refs.enumerated().dropFirst(3) {
            XCTAssertEqual(try readBlob(cache, r.blob, count: 400_000), chunk(UInt64(20 + i)))
        }
        XCTAssertEqual(remote.reads.count, 6, "each chunk downloaded once")
    }

    /// A download that does not match its checksum (a damaged transfer, a damaged object) is
    /// refused and never kept: no read is served wrong data from the cache later.
    func testADamagedDownloadIsNeverKept() throws {
        let memory = makeMemoryStore().blobs
        let ref = try writeBlob(memory, chunk(40))
        var bad = chunk(40)
        bad[17] ^= 0xff
        (memory as! MemoryBlobStore).corrupt(ref.blob, with: bad)
        let cache = try ChunkCache(remote: AsRemote(memory), directory: folder, limit: 10_000_000)
        let error = assertStoreError(EIO) { try cache.fetch(ref) }
        XCTAssertEqual(error?.kind, .corrupt)
        XCTAssertFalse(cache.isLocal(ref.blob))
        assertStoreError(EIO) { try cache.keep([ref]) }
        XCTAssertFalse(cache.isLocal(ref.blob))
        (memory as! MemoryBlobStore).corrupt(ref.blob, with: chunk(40))   // mended at the source
        try cache.fetch(ref)
        XCTAssertEqual(try readBlob(cache, ref.blob, count: 400_000), chunk(40))
    }

    /// A download that fails reports the store's error to every reader waiting for it, and a
    /// later read tries again.
    func testAFailedDownloadFailsItsReadersAndIsTriedAgain() throws {
        let plan = FaultPlan()
        let memory = makeMemoryStore().blobs
        let ref = try writeBlob(memory, chunk(3))
        let cache = try ChunkCache(remote: AsRemote(FaultInjectingBlobStore(memory, plan: plan)), directory: folder, limit: 10_000_000)
        plan.fail(.blobRead, errno: EHOSTUNREACH)
        assertStoreError(EHOSTUNREACH) { try readBlob(cache, ref.blob, count: 1) }
        XCTAssertFalse(cache.isLocal(ref.blob))
        plan.clearAll()
        XCTAssertEqual(try readBlob(cache, ref.blob, count: 400_000), chunk(3))
    }
}
