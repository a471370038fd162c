import Foundation
import XCTest
@testable import UbiquityStore

/// The shared suite on the embedded store (SQLite + local files), plus what only it has.
final class EmbeddedStoreTests: XCTestCase {
    private var fixture: EmbeddedFixture!

    override func setUpWithError() throws {
        fixture = try EmbeddedFixture()
    }

    override func tearDown() {
        fixture?.remove()  // runs after a failing test too
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
    func testConcurrentReadsOfManyBlobs() throws { try StoreSuite.concurrentReadsOfManyBlobs(fixture) }
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

    /// A daemon that goes (its table's descriptors close, as when it is killed) releases its
    /// locks; lock files are cleared only by a table that finds itself the store's only user.
    func testLocksOfAGoneWriterAreReleasedAndLockFilesCleared() throws {
        let a = LockOwner(writer: "one", id: 1, style: .posix)
        let f = LockOwner(writer: "one", id: 2, style: .flock)
        let b = LockOwner(writer: "two", id: 1, style: .posix)
        let g = LockOwner(writer: "two", id: 2, style: .flock)
        var one: LocalLockTable? = try LocalLockTable(directory: fixture.directory)
        var two: LocalLockTable? = try LocalLockTable(directory: fixture.directory)
        XCTAssertTrue(try one!.set(5, owner: a, mode: .write, range: .wholeFile, pid: 1))
        XCTAssertTrue(try one!.set(5, owner: f, mode: .write, range: .wholeFile, pid: 1))
        XCTAssertFalse(try two!.set(5, owner: b, mode: .read, range: .wholeFile, pid: 2))
        XCTAssertFalse(try two!.set(5, owner: g, mode: .read, range: .wholeFile, pid: 2))
        one = nil
        XCTAssertTrue(try two!.set(5, owner: b, mode: .write, range: .wholeFile, pid: 2))
        XCTAssertTrue(try two!.set(5, owner: g, mode: .write, range: .wholeFile, pid: 2))
        let lockFile = fixture.directory + "/locks/5"
        XCTAssertTrue(FileManager.default.fileExists(atPath: lockFile))
        var three: LocalLockTable? = try LocalLockTable(directory: fixture.directory)
        XCTAssertTrue(FileManager.default.fileExists(atPath: lockFile), "kept while another table is open")
        XCTAssertFalse(try three!.set(5, owner: a, mode: .read, range: .wholeFile, pid: 3), "and its lock still holds")
        two = nil
        var four: LocalLockTable? = try LocalLockTable(directory: fixture.directory)
        XCTAssertTrue(FileManager.default.fileExists(atPath: lockFile), "three is still open")
        withExtendedLifetime(four) {}
        three = nil
        four = nil
        let alone = try LocalLockTable(directory: fixture.directory)
        XCTAssertFalse(FileManager.default.fileExists(atPath: lockFile), "cleared by a table that is alone")
        withExtendedLifetime(alone) {}
    }

    func testADeletedNodesLockFileGoesUnlessALockIsHeld() throws {
        let table = try LocalLockTable(directory: fixture.directory)
        let owner = LockOwner(writer: "w", id: 1, style: .posix)
        XCTAssertTrue(try table.set(12, owner: owner, mode: .write, range: .wholeFile, pid: 1))
        table.forget(12)
        XCTAssertTrue(FileManager.default.fileExists(atPath: fixture.directory + "/locks/12"), "still locked")
        table.release(12, owner: owner)
        table.forget(12)
        XCTAssertFalse(FileManager.default.fileExists(atPath: fixture.directory + "/locks/12"))
        table.forget(13)   // never locked: nothing to do
    }

    func testALoneLockTableClearsLockFiles() throws {
        do {
            let one = try LocalLockTable(directory: fixture.directory)
            XCTAssertTrue(try one.set(9, owner: LockOwner(writer: "w", id: 1, style: .posix), mode: .read,
                                      range: .wholeFile, pid: 1))
        }
        XCTAssertTrue(FileManager.default.fileExists(atPath: fixture.directory + "/locks/9"))
        _ = try LocalLockTable(directory: fixture.directory)
        XCTAssertFalse(FileManager.default.fileExists(atPath: fixture.directory + "/locks/9"))
        let mode = try FileManager.default.attributesOfItem(atPath: fixture.directory + "/locks")[.posixPermissions] as? Int
        XCTAssertEqual(mode, 0o700)
    }

    // MARK: Embedded only

    /// Daemons of this version share a store, each with a work area of its own; a daemon of the
    /// single-writer version (which locked the store exclusively) and they keep each other out.
    func testDaemonsShareTheStoreAndKeepTheSingleWriterVersionOut() throws {
        do {
            let one = try fixture.open()
            let two = try openEmbeddedStore(directory: fixture.directory)
            XCTAssertNotEqual((one.work as? LocalWorkArea)?.workPath, (two.work as? LocalWorkArea)?.workPath)
            // Durable: a non-durable one joins a group, which another daemon sees once it
            // commits (GroupCommitTests).
            try one.metadata.commit([.putNode(Sample.node(2))], durable: true)
            XCTAssertEqual(try two.metadata.load().nodes.map(\.ino), [2])
            // The old version's exclusive lock cannot be taken meanwhile.
            let fd = open(fixture.directory + "/lock", O_RDWR)
            XCTAssertNotEqual(flock(fd, LOCK_EX | LOCK_NB), 0)
            close(fd)
        }
        // An old daemon holds the store: a new one is refused, saying why.
        let fd = open(fixture.directory + "/lock", O_RDWR)
        XCTAssertEqual(flock(fd, LOCK_EX | LOCK_NB), 0)
        XCTAssertEqual(pwrite(fd, "4242\n", 5, 0), 5)
        let error = assertStoreError(EBUSY) { try openEmbeddedStore(directory: fixture.directory) }
        XCTAssertTrue(error?.message.contains("in use by an older ubiquityfs that cannot share it (pid 4242)") ?? false,
                      error?.message ?? "")
        close(fd)
        _ = try fixture.open()
    }

    func testFolderLayout() throws {
        let nested = fixture.directory + "/a/b/store"
        let store = try openEmbeddedStore(directory: nested + "/")
        _ = store
        let fm = FileManager.default
        for name in ["lock", "metadata.sqlite3", "blobs", "blobs/00", "blobs/ff", "blobs/7a", "work"] {
            XCTAssertTrue(fm.fileExists(atPath: nested + "/" + name), name)
        }
        let mode = try fm.attributesOfItem(atPath: nested)[.posixPermissions] as? Int
        XCTAssertEqual(mode, 0o700)
        let ref = try writeBlob(store.blobs, [1, 2, 3])
        let expected = String(format: "%@/blobs/%02x/%016llx", nested, UInt32(ref.blob & 0xff), ref.blob)
        XCTAssertEqual((store.blobs as? LocalBlobStore)?.path(of: ref.blob), expected)
        XCTAssertTrue(fm.fileExists(atPath: expected))
        XCTAssertEqual(try fm.contentsOfDirectory(atPath: nested + "/blobs/.tmp"), [])
        let file = try store.work.create(ino: 77)
        let own = try XCTUnwrap(store.work as? LocalWorkArea).workPath
        XCTAssertTrue(own.hasPrefix(nested + "/work/d-"), own)
        XCTAssertTrue(fm.fileExists(atPath: own + "/lock"))
        XCTAssertTrue(fm.fileExists(atPath: own + "/77.map"))
        XCTAssertEqual(try fm.contentsOfDirectory(atPath: own).sorted(), ["77.map", "lock"], "no chunk file until one is written")
        try writeWork(file, [1, 2, 3], at: chunkSize + 5)
        let chunk = try XCTUnwrap(try fm.contentsOfDirectory(atPath: own).first { $0.hasPrefix("77.") && $0 != "77.map" })
        XCTAssertTrue(chunk.hasSuffix(".1"), "chunk 1's file: \(chunk)")
        XCTAssertEqual(fm.contents(atPath: own + "/" + chunk), Data([0, 0, 0, 0, 0, 1, 2, 3]))
        file.remove()
        XCTAssertEqual(try fm.contentsOfDirectory(atPath: own).filter { !$0.hasPrefix("spare-") }, ["lock"])
    }

    /// A write that starts a chunk takes an empty file made ahead (its inode allocation is off
    /// the request path); the pool refills in the background and holds empty files only; the
    /// daemon's end removes them, and a crashed daemon's are removed with its folder.
    func testNewChunkFilesAreEmptyFilesMadeAhead() throws {
        let directory = fixture.directory + "/ahead"
        var work: LocalWorkArea? = try LocalWorkArea(directory: directory)
        let folder = work!.workPath
        func spares() -> [String: stat] {
            var found: [String: stat] = [:]
            for name in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
            where name.hasPrefix(SpareMaps.prefix) && name.hasSuffix(SpareChunkFiles.suffix) {
                var st = stat()
                if stat(folder + "/" + name, &st) == 0 { found[name] = st }
            }
            return found
        }
        func waitForFullPool() throws -> [String: stat] {
            let deadline = Date().addingTimeInterval(10)
            while spares().count < SpareChunkFiles.kept && Date() < deadline { usleep(10_000) }
            let pool = spares()
            XCTAssertEqual(pool.count, SpareChunkFiles.kept, "\(pool.keys.sorted())")
            XCTAssertTrue(pool.values.allSatisfy { $0.st_size == 0 && $0.st_mode & 0o777 == 0o600 })
            return pool
        }
        XCTAssertTrue(spares().isEmpty, "none before a chunk is written")
        let file = try work!.create(ino: 5)
        try writeWork(file, [1, 2, 3], at: 10)   // made as before; starts the pool
        let pool = try waitForFullPool()
        try writeWork(file, [4, 5, 6], at: chunkSize + 1)
        let copy = try XCTUnwrap((file as? ChunkedWorkFile)?.copyID)
        var st = stat()
        XCTAssertEqual(stat(folder + "/" + ChunkedWorkFile.chunkName(ino: 5, copyID: copy, index: 1), &st), 0)
        XCTAssertTrue(pool.values.contains { $0.st_ino == st.st_ino }, "chunk 1's file is a spare, renamed")
        XCTAssertEqual(st.st_size, 4)
        XCTAssertEqual(try readWork(file, at: chunkSize, count: 10), [0, 4, 5, 6])
        XCTAssertEqual(try readWork(file, at: 8, count: 5), [0, 0, 1, 2, 3])
        let refilled = try waitForFullPool()
        XCTAssertFalse(refilled.values.contains { $0.st_ino == st.st_ino })
        file.remove()
        work = nil
        XCTAssertTrue(spares().isEmpty, "the daemon's end removes its spares")
        // What a crash leaves: the next daemon's recovery removes them with the folder.
        let left = folder + "/" + SpareMaps.prefix + "12" + SpareChunkFiles.suffix
        XCTAssertTrue(FileManager.default.createFile(atPath: left, contents: Data()))
        let next = try LocalWorkArea(directory: directory)
        XCTAssertEqual(try next.leftovers().count, 0)
        next.recoveryFinished()
        XCTAssertFalse(FileManager.default.fileExists(atPath: folder))
    }

    /// A working copy of the single-file format (before chunk files) is still recovered, and
    /// published by copy; chunk files no map claims (another copy id, no map) are removed.
    func testSingleFileWorkingCopyIsRecoveredAndStrayChunkFilesRemoved() throws {
        do { _ = try fixture.open() }
        let work = fixture.directory + "/work"
        var map = Array("UBQWMAP2".utf8)
        for word: UInt64 in [1, 42, 10] { withUnsafeBytes(of: word.littleEndian) { map += $0 } }
        map += [UInt8](repeating: 0, count: 32)
        map += [0, 1]   // chunk 1 is dirty
        var data = Data(count: chunkSize)
        data.append(Data("abc".utf8))
        XCTAssertTrue(FileManager.default.createFile(atPath: work + "/7.map", contents: Data(map)))
        XCTAssertTrue(FileManager.default.createFile(atPath: work + "/7.data", contents: data))
        XCTAssertTrue(FileManager.default.createFile(atPath: work + "/7.abc.0", contents: Data([1])))   // claimed by no map
        XCTAssertTrue(FileManager.default.createFile(atPath: work + "/9.abc.0", contents: Data([1])))
        let store = try fixture.open()
        let found = try store.work.leftovers()
        XCTAssertEqual(found.map(\.ino), [7])
        XCTAssertEqual(found.first?.base, 42)
        XCTAssertEqual(found.first?.size, UInt64(chunkSize + 3))
        XCTAssertEqual(found.first?.dirtyChunks, [1])
        let file = try XCTUnwrap(found.first?.file)
        XCTAssertNil(try file.chunkFile(1, length: 3), "one file for every chunk: nothing to adopt")
        XCTAssertEqual(try readWork(file, at: chunkSize, count: 10), Array("abc".utf8))
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: work).filter { !$0.hasPrefix("d-") && $0 != "recovery.lock" }.sorted(),
                       ["7.data", "7.map"])
        file.remove()
        store.work.recoveryFinished()
    }

    /// A chunk file becomes a blob by a second name: the blob has its bytes and checksum; the
    /// working copy keeps its own name until it is removed, and the blob outlives it.
    func testAChunkFileIsAdoptedAsABlobWithoutACopy() throws {
        let store = try fixture.open()
        let file = try store.work.create(ino: 12)
        let bytes = Sample.bytes(5000, seed: 3)
        try writeWork(file, bytes, at: 2 * chunkSize)
        try file.markDirty(2)
        let path = try XCTUnwrap(try file.chunkFile(2, length: 6000))
        var before = stat()
        XCTAssertEqual(stat(path, &before), 0)
        XCTAssertEqual(before.st_size, 6000, "made the chunk's length: its tail is zeros")
        let expected = bytes + [UInt8](repeating: 0, count: 1000)
        let adopting = try XCTUnwrap(store.blobs as? ChunkAdopting)
        let ref = try expected.withUnsafeBytes { raw in
            try adopting.adopt(path, length: 6000, checksum: contentChecksum(raw), durable: false)
        }
        XCTAssertEqual(ref.length, 6000)
        XCTAssertTrue(store.blobs.verify(ref))
        let blob = try XCTUnwrap((store.blobs as? LocalBlobStore)?.path(of: ref.blob))
        var after = stat()
        XCTAssertEqual(stat(blob, &after), 0)
        XCTAssertEqual(after.st_ino, before.st_ino, "the same file, not a copy")
        XCTAssertEqual(try readWork(file, at: 2 * chunkSize, count: 6000), expected)
        // Changed again (its publish failed, say): the chunk file is copied first, the blob stays.
        try writeWork(file, [9, 9, 9], at: 2 * chunkSize + 1)
        try file.truncate(to: 2 * chunkSize + 5500)
        XCTAssertEqual(try readWork(file, at: 2 * chunkSize, count: 6000), [expected[0], 9, 9, 9] + Array(expected[4..<5500]))
        XCTAssertEqual(try readBlob(store.blobs, ref.blob, count: 6000), expected)
        XCTAssertTrue(store.blobs.verify(ref))
        var copied = stat()
        XCTAssertEqual(stat(path, &copied), 0)
        XCTAssertNotEqual(copied.st_ino, before.st_ino, "a file of its own now")
        file.remove()
        XCTAssertFalse(FileManager.default.fileExists(atPath: path))
        XCTAssertEqual(try readBlob(store.blobs, ref.blob, count: 6000), expected)
        XCTAssertTrue(try store.work.leftovers().isEmpty)
        try store.blobs.syncWritten()
    }

    /// A working copy left by a daemon from before the finished mark (32-byte "UBQWMAP1" map) is
    /// still recovered, as neither finished nor known intact.
    func testOldFormatWorkingCopyIsRecovered() throws {
        do { _ = try fixture.open() }
        let work = fixture.directory + "/work"
        var map = Array("UBQWMAP1".utf8)
        for word: UInt64 in [1, 42, 10] { withUnsafeBytes(of: word.littleEndian) { map += $0 } }
        map += [1]   // chunk 0 is dirty
        XCTAssertTrue(FileManager.default.createFile(atPath: work + "/7.map", contents: Data(map)))
        XCTAssertTrue(FileManager.default.createFile(atPath: work + "/7.data", contents: Data("0123456789".utf8)))
        let found = try fixture.open().work.leftovers()
        XCTAssertEqual(found.map(\.ino), [7])
        XCTAssertEqual(found.first?.base, 42)
        XCTAssertEqual(found.first?.dirtyChunks, [0])
        XCTAssertEqual(found.first?.finished, false)
        XCTAssertEqual(found.first?.intact, false)
        XCTAssertNoThrow(try found.first?.file.setFinished(mtime: 1), "an old map takes no mark, and says nothing")
        XCTAssertEqual(try fixture.open().work.leftovers().first?.finished, false)
    }

    /// A store made by the single-writer version (schema 1: no change log, no per-node change, no
    /// versions' `moved_from`) is read as it is by a read-only look, and opens with a forward
    /// migration, keeping its data; a newer schema is refused clearly.
    func testSchemaOneIsMigratedAndNewerIsRefused() throws {
        try FileManager.default.createDirectory(atPath: fixture.directory, withIntermediateDirectories: true)
        let db = fixture.directory + "/metadata.sqlite3"
        let v1 = """
            PRAGMA journal_mode=WAL;
            CREATE TABLE store_meta(key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
            CREATE TABLE meta(key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
            CREATE TABLE nodes(ino INTEGER PRIMARY KEY, container TEXT NOT NULL, kind INTEGER NOT NULL,
                mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL, nlink INTEGER NOT NULL,
                size INTEGER NOT NULL, atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
                btime INTEGER NOT NULL, rdev INTEGER NOT NULL, target BLOB NOT NULL, current_version INTEGER);
            CREATE TABLE versions(id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, created INTEGER NOT NULL,
                size INTEGER NOT NULL, origin TEXT NOT NULL, device TEXT NOT NULL, chunks BLOB NOT NULL);
            INSERT INTO store_meta VALUES('schema_version', 1), ('max_ino', 40), ('max_version', 7);
            INSERT INTO nodes VALUES(40, 'iCloud.x', 1, 420, 0, 0, 1, 0, 1, 2, 3, 4, 0, x'', NULL);
            INSERT INTO versions VALUES(7, 40, 5, 0, 'published', 'host', x'');
            """
        let sqlite = Process()
        sqlite.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        sqlite.arguments = [db, v1]
        try sqlite.run()
        sqlite.waitUntilExit()
        XCTAssertEqual(sqlite.terminationStatus, 0)
        let version7 = VersionRecord(id: 7, ino: 40, created: 5, size: 0, chunks: [], origin: .published, device: "host")
        XCTAssertEqual(try SQLiteMetadataStore(readOnlyPath: db).versions(of: 40), [version7], "read as it is")
        // Schema 3 (versions' `moved_from`, no shared lists), read as it is too.
        let db3 = fixture.directory + "/three.sqlite3"
        let three = Process()
        three.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        three.arguments = [db3, v1 + """
            ALTER TABLE versions ADD COLUMN moved_from INTEGER;
            UPDATE versions SET moved_from = 39;
            UPDATE store_meta SET value = 3 WHERE key = 'schema_version';
            """]
        try three.run()
        three.waitUntilExit()
        XCTAssertEqual(three.terminationStatus, 0)
        var moved7 = version7
        moved7.movedFrom = 39
        XCTAssertEqual(try SQLiteMetadataStore(readOnlyPath: db3).versions(of: 40), [moved7])
        // A daemon of an earlier version still running on the store: no migration under it.
        var running: LocalWorkArea? = try LocalWorkArea(directory: fixture.directory)
        XCTAssertThrowsError(try fixture.open()) { error in
            XCTAssertTrue("\(error)".contains("the earlier ubiquityfs still running on it cannot read: stop every mount"), "\(error)")
        }
        XCTAssertEqual(try SQLiteMetadataStore(readOnlyPath: db).versions(of: 40), [version7], "nothing changed")
        withExtendedLifetime(running) {}
        running = nil
        do {
            let m = try fixture.open().metadata
            XCTAssertEqual(try m.versions(of: 40), [version7])
            let s = try m.load()
            XCTAssertEqual(s.nodes.map(\.ino), [40])
            XCTAssertEqual(s.nodeChangesByIno()[40], 0)
            XCTAssertEqual(s.seq, 0)
            let seq = try m.commit(Batch([.putNode(Sample.node(41))], expecting: [.nodeAt(ino: 40, change: 0)]), durable: true)
            XCTAssertEqual(seq, 1)
            XCTAssertEqual(try m.reserveInodes(1), 42...42)
            // The migrated store shares big files' chunk lists.
            let big = VersionRecord(id: 8, ino: 40, created: 6, size: 0,
                                    chunks: (1...70).map { ChunkRef(blob: UInt64($0), length: 1, checksum: 0) },
                                    origin: .published, device: "host")
            try m.commit([.putVersion(big)], durable: true)
            XCTAssertEqual(try m.versions(of: 40), [version7, big])
            XCTAssertEqual(try XCTUnwrap(m as? SQLiteMetadataStore).chunkListStorage().lists.count, 1)
        }
        let later = Process()
        later.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        later.arguments = [db, "UPDATE store_meta SET value = 99 WHERE key = 'schema_version'"]
        try later.run()
        later.waitUntilExit()
        XCTAssertThrowsError(try fixture.open()) { error in
            XCTAssertTrue("\(error)".contains("schema version 99, and this ubiquityfs knows versions 1 to 4: use a newer ubiquityfs"),
                          "\(error)")
        }
    }

    /// A big file's versions share a chunk list: each row holds what it changed from the list
    /// (an append's new tail and added chunk, a hole), read back whole everywhere a version is
    /// read; a version that changed most chunks starts a new list; a short list is stored
    /// whole; a list goes with the last version that names it (deleted, or with its file).
    func testBigFilesVersionsShareAChunkList() throws {
        let store = try fixture.open()
        let m = try XCTUnwrap(store.metadata as? SQLiteMetadataStore)
        let n = ChunkDelta.sharedListMinimum + 36
        var appended = Sample.chunks(1, count: n)
        appended[50] = .hole
        appended[n - 1] = ChunkRef(blob: 77, length: UInt32(chunkSize), checksum: 7)
        appended.append(ChunkRef(blob: 78, length: 12, checksum: 8))
        let v1 = Sample.version(1, ino: 5, chunks: Sample.chunks(1, count: n)), v2 = Sample.version(2, ino: 5, chunks: appended)
        let v3 = Sample.version(3, ino: 5, chunks: Sample.chunks(2, count: n + 1))
        let short = Sample.version(4, ino: 6, chunks: Sample.chunks(3, count: 3))
        try m.commit([.putVersion(v1), .putVersion(v2)], durable: true)
        try m.commit([.putVersion(v3), .putVersion(short), .putNode(Sample.node(5, version: 2))], durable: true)
        let stored = try m.chunkListStorage()
        XCTAssertEqual(stored.lists, [1, 3], "a list takes the id of the version it was made for")
        XCTAssertEqual(stored.versions.map(\.list), [stored.lists[0], stored.lists[0], stored.lists[1], nil])
        XCTAssertEqual(stored.versions.map(\.bytes), [4, 4 + 3 * ChunkDelta.entrySize, 4, 3 * ChunkPacking.entrySize])
        XCTAssertEqual(try m.versions(of: 5), [v1, v2, v3])
        XCTAssertEqual(try m.version(2), v2)
        XCTAssertEqual(try m.allVersions(), [v1, v2, v3, short])
        XCTAssertEqual(try m.versions(withOrigin: .published), [v1, v2, v3, short])
        XCTAssertEqual(try m.load().currentVersions, [v2])
        let named = Set([v1, v2, v3, short].flatMap { $0.chunks.filter { !$0.isHole }.map(\.blob) })
        XCTAssertTrue(try m.referencedBlobs().isSuperset(of: named))
        // The list v1 started stays while v2 names it.
        try m.commit([.deleteVersion(1)], durable: true)
        XCTAssertEqual(try m.versions(of: 5), [v2, v3])
        XCTAssertEqual(try m.chunkListStorage().lists, stored.lists)
        // Put again (as a replica does): the list of its id is its own whole list.
        try m.commit([.putVersion(v1)], durable: true)
        XCTAssertEqual(try m.versions(of: 5), [v1, v2, v3])
        XCTAssertEqual(try m.chunkListStorage().versions.first?.list, 1)
        try m.commit([.deleteVersion(1)], durable: true)
        try m.commit([.deleteVersion(2)], durable: true)
        XCTAssertEqual(try m.chunkListStorage().lists, [stored.lists[1]])
        // A file's next version builds on its newest version's list, wherever that list began.
        let v5 = Sample.version(5, ino: 7, chunks: Sample.chunks(2, count: n + 1) + [ChunkRef(blob: 79, length: 1, checksum: 9)])
        try m.commit([.moveVersions(from: 5, to: 7), .putVersion(v5)], durable: true)
        var moved = v3
        moved.ino = 7
        moved.movedFrom = 5
        XCTAssertEqual(try m.versions(of: 7), [moved, v5])
        XCTAssertEqual(try m.chunkListStorage().versions.map(\.list), [stored.lists[1], nil, stored.lists[1]])
        try m.commit([.deleteNode(7)], durable: true)
        XCTAssertEqual(try m.chunkListStorage().lists, [])
        XCTAssertEqual(try m.allVersions(), [short])
        // A list cut short, a change past its length: malformed, said so.
        let bad = ChunkDelta.pack(count: 2, [(index: 3, chunk: ChunkRef(blob: 1, length: 1, checksum: 1))])
        let list = ChunkPacking.pack(Sample.chunks(4, count: 2))
        XCTAssertNil(bad.withUnsafeBytes { b in list.withUnsafeBytes { ChunkDelta.resolve(b, over: $0) } })
        let gap = ChunkDelta.pack(count: 4, [(index: 3, chunk: ChunkRef(blob: 1, length: 1, checksum: 1))])
        XCTAssertNil(gap.withUnsafeBytes { b in list.withUnsafeBytes { ChunkDelta.resolve(b, over: $0) } })
    }

    /// Read-only commands look without writing: no schema set-up, and a commit fails.
    func testReadOnlyConnectionReadsAndWritesNothing() throws {
        do {
            let m = try fixture.open().metadata
            try m.commit([.putContainer(Sample.containerRecord(root: 2)), .putNode(Sample.node(2))], durable: true)
            let reader = try SQLiteMetadataStore(readOnlyPath: fixture.directory + "/metadata.sqlite3")
            XCTAssertEqual(try reader.containers().map(\.rootIno), [2], "while the writer has it open")
            XCTAssertEqual(try reader.load().nodes.map(\.ino), [2])
            XCTAssertThrowsError(try reader.commit([.putNode(Sample.node(3))], durable: false))
        }
        XCTAssertEqual(try fixture.open().metadata.load().nodes.map(\.ino), [2])
        XCTAssertThrowsError(try SQLiteMetadataStore(readOnlyPath: fixture.directory + "/missing.sqlite3"),
                             "a read-only look creates nothing")
        XCTAssertFalse(FileManager.default.fileExists(atPath: fixture.directory + "/missing.sqlite3"))
    }

    /// Nodes loaded from the store share one string per container: an identifier longer than a
    /// string holds inline would otherwise be a heap allocation in every node.
    func testLoadedNodesShareTheirContainersText() throws {
        let m = try fixture.open().metadata
        var nodes = (2...5).map { Sample.node($0) }
        for i in nodes.indices { nodes[i].container = i == 2 ? "iCloud.com.example.Other" : "iCloud.com.example.SugoiApp" }
        try m.commit(nodes.map { .putNode($0) }, durable: false)
        let loaded = try m.load().nodes.filter { $0.ino >= 2 && $0.ino <= 5 }.sorted { $0.ino < $1.ino }
        XCTAssertEqual(loaded, nodes)
        func storage(_ s: String) -> UnsafeRawPointer? {
            s.utf8.withContiguousStorageIfAvailable { UnsafeRawPointer($0.baseAddress) } ?? nil
        }
        XCTAssertNotNil(storage(loaded[0].container))
        XCTAssertEqual(storage(loaded[0].container), storage(loaded[1].container))
        XCTAssertEqual(storage(loaded[0].container), storage(loaded[3].container))
        XCTAssertNotEqual(storage(loaded[0].container), storage(loaded[2].container))
        let names = TextInterner()
        XCTAssertEqual([UInt8]().withUnsafeBytes { names.text($0) }, "")
        XCTAssertEqual(Array("é".utf8).withUnsafeBytes { names.text($0) }, "é")
    }

    /// The change log's encoding: every kind of mutation comes back equal, and damaged bytes are
    /// refused, never misread.
    func testBatchCodingRoundTripsEveryMutation() {
        let all: [Mutation] = [
            .putNode(Sample.node(2, size: 5, version: 9)),
            .putNode(Sample.node(UInt64.max, kind: .symlink, target: [0, 0xff, 0x41])),
            .putNode(Sample.node(3, kind: .characterDevice, rdev: 0xdead_beef)),
            .deleteNode(4),
            .putDirent(DirentRecord(parent: 1, name: Array("é.txt".utf8), child: 2)),
            .deleteDirent(parent: 1, name: []),
            .putXattr(XattrRecord(ino: 2, name: Array("user.x".utf8), value: [UInt8](repeating: 7, count: 300))),
            .deleteXattr(ino: 2, name: Array("user.x".utf8)),
            .putVersion(Sample.version(9, ino: 2, origin: .conflict)),
            .putVersion(VersionRecord(id: -1, ino: 0, created: Int64.min, size: 0, chunks: [], origin: .recovered, device: "")),
            .putVersion(VersionRecord(id: 3, ino: 2, created: 1, size: 0, chunks: [], origin: .published, device: "h",
                                      movedFrom: UInt64.max)),
            .putContainer(Sample.containerRecord(root: 7)),
            .setMeta(key: "running/host ✓", value: "ab"),
            .deleteMeta(key: "k"),
            .moveVersions(from: 5, to: 6),
            .deleteVersion(Int64.max),
        ]
        let bytes = BatchCoding.encode(all)
        XCTAssertEqual(BatchCoding.decode(bytes), all)
        XCTAssertEqual(BatchCoding.decode(BatchCoding.encode([])), [])
        for cut in 0..<bytes.count {
            XCTAssertNil(BatchCoding.decode(Array(bytes.prefix(cut))), "cut at \(cut)")
        }
        // A chunk list is written as a version row packs it, and read back from that layout.
        let v = Sample.version(9, ino: 2)
        let packed = ChunkPacking.pack(v.chunks)
        XCTAssertEqual(packed.count, 3 * 20)
        XCTAssertEqual(Array(packed.prefix(12)), [0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, 0, 0, 0x10, 0],
                       "blob, then length, little endian")
        XCTAssertEqual(packed.withUnsafeBytes { ChunkPacking.unpack($0) }, v.chunks)
        XCTAssertNil(packed.dropLast().withUnsafeBytes { ChunkPacking.unpack($0) })
        XCTAssertNotNil(BatchCoding.encode([.putVersion(v)]).firstRange(of: packed))
        XCTAssertNil(BatchCoding.decode(bytes + [0]), "trailing bytes")
        var wrongFormat = bytes
        wrongFormat[0] = 9
        XCTAssertNil(BatchCoding.decode(wrongFormat))
        let json = (try? JSONEncoder().encode(all))?.count ?? 0
        XCTAssertLessThan(bytes.count * 2, json, "half the JSON or less")
    }

    /// A working copy from another boot (the machine restarted: its unsynced bytes may be torn)
    /// is not intact, even when marked finished.
    func testWorkingCopyFromAnotherBootIsNotIntact() throws {
        do {
            let file = try fixture.open().work.create(ino: 5)
            try file.setBase(nil, size: 0)
            try writeWork(file, [1, 2, 3], at: 0)
            try file.markDirty(0)
            try file.setFinished(mtime: 42)
        }
        let leftover = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertTrue(leftover.intact, "same boot")
        let map = try XCTUnwrap((leftover.file as? ChunkedWorkFile)?.mapFilePath)
        let fd = open(map, O_WRONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        XCTAssertEqual(pwrite(fd, [UInt8](repeating: 0x5A, count: 16), 16, 32), 16)   // another boot id
        close(fd)
        let found = try fixture.open().work.leftovers()
        XCTAssertEqual(found.map(\.intact), [false])
        XCTAssertEqual(found.map(\.finished), [true])
        XCTAssertEqual(found.map(\.modified), [42])
    }

    /// A page set's 32 bytes, as a map stores them: page p is bit p % 8 of byte p / 8.
    func testAPageSetRoundTripsThroughItsBytes() {
        var pages = PageSet()
        for p in [0, 7, 8, 63, 64, 130, 255] { pages.insert(p) }
        let bytes = pages.bytes
        XCTAssertEqual(bytes.count, 32)
        XCTAssertEqual(bytes[0], 0b1000_0001)
        XCTAssertEqual(bytes[1], 1)
        XCTAssertEqual(bytes[7], 0x80)
        XCTAssertEqual(bytes[8], 1)
        XCTAssertEqual(bytes[16], 0b100)
        XCTAssertEqual(bytes[31], 0x80)
        XCTAssertEqual(PageSet(bytes), pages)
        XCTAssertEqual((0..<PageSet.count).filter(PageSet(bytes).contains), [0, 7, 8, 63, 64, 130, 255])
        XCTAssertTrue(PageSet(touching: 0, chunkSize).isFull)
        XCTAssertEqual(PageSet(touching: 4095, 4097), { var p = PageSet(); p.insert(0); p.insert(1); return p }())
    }

    /// A copy an fsync marked synced: after a kill its live marks hold (the page cache kept
    /// every byte); on a new boot only the marks its last sync made durable, written after the
    /// chunk files' fdatasync (a mark written later may be on the disk before its bytes).
    func testASyncedCopyOnANewBootHasOnlyItsSyncedMarks() throws {
        do {
            let file = try fixture.open().work.create(ino: 6)
            try file.setBase(nil, size: UInt64(3 * chunkSize))
            try writeWork(file, [UInt8](repeating: 7, count: 3 * pageSize), at: 0)
            try file.markPages(0, PageSet(touching: 0, pageSize))
            try file.markDirty(1)
            XCTAssertTrue(try file.markSynced())
            try file.sync()
            // After the fsync: more pages of chunk 0, and chunk 2 made whole, never synced.
            try file.markPages(0, PageSet(touching: 0, 3 * pageSize))
            try file.markDirty(2)
        }
        let leftover = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertTrue(leftover.intact && leftover.synced)
        XCTAssertEqual(leftover.partialChunks, [0: PageSet(touching: 0, 3 * pageSize)])
        XCTAssertEqual(leftover.dirtyChunks, [1, 2])
        let map = try XCTUnwrap((leftover.file as? ChunkedWorkFile)?.mapFilePath)
        let fd = open(map, O_WRONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        XCTAssertEqual(pwrite(fd, [UInt8](repeating: 0x5A, count: 16), 16, 32), 16)   // another boot id
        close(fd)
        let found = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertFalse(found.intact)
        XCTAssertTrue(found.synced)
        XCTAssertEqual(found.partialChunks, [0: PageSet(touching: 0, pageSize)], "the pages as of the sync")
        XCTAssertEqual(found.dirtyChunks, [1])
    }

    /// The size of the file at `path` (-1 when missing).
    private func fileSize(_ path: String) -> Int {
        var st = stat()
        return stat(path, &st) == 0 ? Int(st.st_size) : -1
    }

    /// The batches the copy's page log holds for its map's epoch.
    private func loggedBatches(_ log: String, map: String) throws -> [PageLog.Batch] {
        let header = try XCTUnwrap(WorkMap.parse([UInt8](try XCTUnwrap(FileManager.default.contents(atPath: map)))))
        return PageLog.decode([UInt8](try XCTUnwrap(FileManager.default.contents(atPath: log))), epoch: header.logEpoch)
    }

    /// A new working copy of inode 6 holding `bytes` of ones in chunk 0, after its first fsync
    /// (a full sync).
    private func syncedCopy(bytes: Int) throws -> ChunkedWorkFile {
        let file = try fixture.open().work.create(ino: 6)
        try file.setBase(nil, size: 0)
        try writeWork(file, [UInt8](repeating: 1, count: bytes), at: 0)
        try file.markDirty(0)
        XCTAssertTrue(try file.markSynced())
        try file.sync()
        return try XCTUnwrap(file as? ChunkedWorkFile)
    }

    /// Makes the copy's map say another boot made it: a power cut, not a kill.
    private func pretendAnotherBoot(_ map: String) {
        let fd = open(map, O_WRONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        XCTAssertEqual(pwrite(fd, [UInt8](repeating: 0x5A, count: 16), 16, 32), 16)
        close(fd)
    }

    /// A synced copy's first fsync is a full sync, which makes its page log; each later fsync of
    /// a few pages appends one batch to the log and syncs it alone (no slot's synced half is
    /// written). After a power cut, recovery writes the batches' pages back into the chunk
    /// files in order, and the copy is what the last fsync made it.
    func testFsyncsAfterTheFirstAreLoggedAndComeBackAfterAPowerCut() throws {
        var log = "", map = "", lostChunk = ""
        do {
            let chunked = try syncedCopy(bytes: pageSize)
            let file: any WorkFile = chunked
            (log, map) = (chunked.logPath, chunked.mapFilePath)
            lostChunk = (map as NSString).deletingLastPathComponent + "/" + ChunkedWorkFile.chunkName(ino: 6, copyID: chunked.copyID, index: 2)
            XCTAssertEqual(fileSize(log), -1, "made by the first fsync that needs it")
            try writeWork(file, [UInt8](repeating: 2, count: pageSize), at: 0)
            try writeWork(file, [UInt8](repeating: 2, count: 100), at: 2 * chunkSize + pageSize + 10)
            try file.markDirty(2)
            try file.sync()
            XCTAssertEqual(try loggedBatches(log, map: map).map(\.pages.count), [2])
            XCTAssertEqual(fileSize(log), PageLog.growth, "zeros ahead of the batches")
            try writeWork(file, [UInt8](repeating: 3, count: pageSize), at: 0)
            try file.sync()
            XCTAssertEqual(try loggedBatches(log, map: map).map(\.pages.count), [2, 1])
            try file.sync()
            XCTAssertEqual(try loggedBatches(log, map: map).map(\.pages.count), [2, 1], "nothing written: nothing logged")
            let bytes = try XCTUnwrap(FileManager.default.contents(atPath: map))
            let synced = WorkMap.slotsAt + 2 * WorkMap.slotSize + WorkMap.syncedHalf
            XCTAssertTrue(bytes.count <= synced || bytes[synced] == 0, "no full sync since the first")
            // After the last fsync: not promised.
            try writeWork(file, [UInt8](repeating: 4, count: 10), at: 5)
        }
        // The power cut: chunk 2's file never reached the disk.
        XCTAssertEqual(unlink(lostChunk), 0)
        pretendAnotherBoot(map)
        let found = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertFalse(found.intact)
        XCTAssertTrue(found.synced)
        XCTAssertEqual(found.size, UInt64(2 * chunkSize + pageSize + 110))
        XCTAssertEqual(try readWork(found.file, at: 0, count: pageSize), [UInt8](repeating: 3, count: pageSize),
                       "the later batch's page, not the write after it")
        XCTAssertEqual(try readWork(found.file, at: 2 * chunkSize + pageSize, count: 110),
                       [UInt8](repeating: 0, count: 10) + [UInt8](repeating: 2, count: 100))
        XCTAssertEqual(found.dirtyChunks, [0])
        XCTAssertEqual(found.partialChunks, [2: PageSet(touching: pageSize, pageSize + 1)], "the page its fsync logged")
    }

    /// Recovery applies batches while they are whole: a torn one (its checksum fails) and all
    /// after it are left out.
    func testATornBatchIsNotApplied() throws {
        var log = "", map = ""
        do {
            let chunked = try syncedCopy(bytes: 2 * pageSize)
            let file: any WorkFile = chunked
            (log, map) = (chunked.logPath, chunked.mapFilePath)
            try writeWork(file, [UInt8](repeating: 2, count: pageSize), at: 0)
            try file.sync()
            try writeWork(file, [UInt8](repeating: 3, count: pageSize), at: 0)
            try writeWork(file, [UInt8](repeating: 3, count: pageSize), at: pageSize)
            try file.sync()
        }
        // The second batch's last page is torn.
        let fd = open(log, O_WRONLY)
        XCTAssertEqual(pwrite(fd, [0xEE], 1, off_t(PageLog.batchBytes(1) + PageLog.batchBytes(2) - 1)), 1)
        close(fd)
        pretendAnotherBoot(map)
        let found = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertEqual(try readWork(found.file, at: 0, count: pageSize), [UInt8](repeating: 2, count: pageSize), "the first batch only")
    }

    /// A full sync (an fsync of more pages than a batch holds) makes the chunk files and the
    /// synced halves hold everything, then gives the map a new epoch: the old batches, still in
    /// the log, are never applied over newer bytes.
    func testAFullSyncRetiresTheLogsBatches() throws {
        var log = "", map = "", stale: [UInt8] = []
        do {
            let chunked = try syncedCopy(bytes: pageSize)
            let file: any WorkFile = chunked
            (log, map) = (chunked.logPath, chunked.mapFilePath)
            try writeWork(file, [UInt8](repeating: 2, count: pageSize), at: 0)
            try file.sync()
            stale = try XCTUnwrap(FileManager.default.contents(atPath: log).map { [UInt8]($0) })
            XCTAssertEqual(try loggedBatches(log, map: map).count, 1)
            try writeWork(file, [UInt8](repeating: 7, count: (PageLog.batchPages + 44) * pageSize), at: 0)
            try file.markDirty(1)
            try file.sync()
            XCTAssertEqual(try loggedBatches(log, map: map), [], "retired: the map has a new epoch")
        }
        XCTAssertTrue(FileManager.default.createFile(atPath: log, contents: Data(stale)))
        pretendAnotherBoot(map)
        let found = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertTrue(found.synced)
        XCTAssertEqual(found.dirtyChunks, [0, 1])
        XCTAssertEqual(try readWork(found.file, at: 0, count: pageSize), [UInt8](repeating: 7, count: pageSize))
        XCTAssertEqual(found.size, UInt64((PageLog.batchPages + 44) * pageSize))
    }

    /// After a full sync retired the log, the next fsync's batch (of the new epoch, written from
    /// the log's start over the old batches) comes back after a power cut, and the old batches
    /// after it do not.
    func testABatchAfterARetirementComesBack() throws {
        var map = "", chunk = ""
        do {
            let chunked = try syncedCopy(bytes: pageSize)
            let file: any WorkFile = chunked
            map = chunked.mapFilePath
            chunk = (map as NSString).deletingLastPathComponent + "/" + ChunkedWorkFile.chunkName(ino: 6, copyID: chunked.copyID, index: 0)
            for value in 2...4 {
                try writeWork(file, [UInt8](repeating: UInt8(value), count: pageSize), at: value * pageSize)
                try file.sync()
            }
            try writeWork(file, [UInt8](repeating: 7, count: (PageLog.batchPages + 1) * pageSize), at: 0)
            try file.markDirty(1)
            try file.sync()
            try writeWork(file, [UInt8](repeating: 9, count: pageSize), at: 0)
            try file.sync()
        }
        // The chunk file's last write did not reach the disk.
        let fd = open(chunk, O_WRONLY)
        XCTAssertEqual(pwrite(fd, [UInt8](repeating: 7, count: pageSize), pageSize, 0), pageSize)
        close(fd)
        pretendAnotherBoot(map)
        let found = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertTrue(found.synced)
        XCTAssertEqual(try readWork(found.file, at: 0, count: pageSize), [UInt8](repeating: 9, count: pageSize), "the new batch")
        XCTAssertEqual(try readWork(found.file, at: 3 * pageSize, count: pageSize), [UInt8](repeating: 7, count: pageSize),
                       "an old batch's page is not put back over the full sync's")
    }

    /// A chunk file with another name (a publish adopted it as a blob, and the power cut came
    /// before the copy was removed) is copied before recovery writes logged pages into it: a blob
    /// never changes.
    func testRecoveryNeverWritesIntoABlob() throws {
        var map = "", chunk = ""
        let blob = fixture.directory + "/adopted"
        do {
            let file = try fixture.open().work.create(ino: 6)
            try file.setBase(nil, size: 0)
            try writeWork(file, [UInt8](repeating: 1, count: 2 * pageSize), at: 0)
            try file.markDirty(0)
            XCTAssertTrue(try file.markSynced())
            try file.sync()
            try writeWork(file, [UInt8](repeating: 3, count: pageSize), at: 0)
            try file.sync()
            try writeWork(file, [UInt8](repeating: 4, count: pageSize), at: 0)
            let chunked = try XCTUnwrap(file as? ChunkedWorkFile)
            map = chunked.mapFilePath
            chunk = (map as NSString).deletingLastPathComponent + "/" + ChunkedWorkFile.chunkName(ino: 6, copyID: chunked.copyID, index: 0)
        }
        XCTAssertEqual(link(chunk, blob), 0)
        pretendAnotherBoot(map)
        let found = try XCTUnwrap(try fixture.open().work.leftovers().first)
        XCTAssertEqual(try readWork(found.file, at: 0, count: pageSize), [UInt8](repeating: 3, count: pageSize), "the logged page")
        let kept = try XCTUnwrap(FileManager.default.contents(atPath: blob))
        XCTAssertEqual([UInt8](kept.prefix(pageSize)), [UInt8](repeating: 4, count: pageSize), "the blob as it was")
    }

    func testPageLogBatchesRoundTrip() {
        let pages = [PageLog.Page(chunk: 3, page: 255, bytes: [1, 2, 3]),
                     PageLog.Page(chunk: 0, page: 0, bytes: [UInt8](repeating: 9, count: pageSize))]
        let one = PageLog.encode(epoch: 42, size: 12345, pages: pages)
        let two = PageLog.encode(epoch: 42, size: 99, pages: [])
        XCTAssertEqual(PageLog.decode(one + two, epoch: 42), [PageLog.Batch(size: 12345, pages: pages), PageLog.Batch(size: 99, pages: [])])
        XCTAssertEqual(PageLog.decode(one + two, epoch: 43), [], "another epoch's")
        XCTAssertEqual(PageLog.decode(Array(one.dropLast()), epoch: 42), [], "cut short")
        XCTAssertEqual(PageLog.decode(two + one, epoch: 42).count, 2)
    }

    /// Every file and folder of the store, with its permission bits.
    private func modes(under root: String) throws -> [String: Int] {
        var out: [String: Int] = [:]
        let fm = FileManager.default
        out["."] = try fm.attributesOfItem(atPath: root)[.posixPermissions] as? Int
        for relative in try fm.subpathsOfDirectory(atPath: root) {
            out[relative] = try fm.attributesOfItem(atPath: root + "/" + relative)[.posixPermissions] as? Int
        }
        return out
    }

    /// The store holds private containers' names and content: other users may read nothing of it,
    /// whatever the umask.
    func testEverythingTheStoreCreatesIsPrivate() throws {
        let old = umask(0)
        defer { umask(old) }
        let root = fixture.directory + "/fresh"
        do {
            let store = try openEmbeddedStore(directory: root)
            try store.metadata.commit([.setMeta(key: "k", value: "v")], durable: true)
            _ = try writeBlob(store.blobs, [1, 2, 3])
            let work = try store.work.create(ino: 9)
            try work.markDirty(0)
            let found = try modes(under: root)
            XCTAssertNotNil(found["metadata.sqlite3-wal"], "the WAL exists while the store is open")
            XCTAssertNotNil(found["metadata.sqlite3-shm"])
            XCTAssertTrue(found.keys.contains { $0.hasPrefix("work/d-") && $0.hasSuffix("/9.map") }, "\(found.keys)")
            for (path, mode) in found {
                var st = stat()
                XCTAssertEqual(lstat(root + "/" + path, &st), 0, path)
                let expected = (st.st_mode & S_IFMT) == S_IFDIR ? 0o700 : 0o600
                XCTAssertEqual(String(mode, radix: 8), String(expected, radix: 8), path)
            }
            work.remove()
        }
    }

    func testAnOpenStoreFolderIsMadePrivate() throws {
        let root = fixture.directory + "/old"
        do { _ = try openEmbeddedStore(directory: root) }
        // As an earlier version left it: folder 0755, database 0644.
        XCTAssertEqual(chmod(root, 0o755), 0)
        XCTAssertEqual(chmod(root + "/metadata.sqlite3", 0o644), 0)
        XCTAssertTrue(FileManager.default.createFile(atPath: root + "/daemon.pid", contents: Data("1\n".utf8),
                                                    attributes: [.posixPermissions: 0o644]))
        let said = Said()
        do { _ = try openEmbeddedStore(directory: root) { said.append($0) } }
        var notes = said.lines
        let found = try modes(under: root)
        XCTAssertEqual(found["."], 0o700)
        XCTAssertEqual(found["metadata.sqlite3"], 0o600)
        XCTAssertEqual(found["daemon.pid"], 0o600)
        XCTAssertEqual(notes.count, 1)
        XCTAssertTrue(notes.first?.contains("made the store folder \(root) private (mode 755 -> 700)") ?? false, "\(notes)")
        // Already private: nothing to say.
        let again = Said()
        do { _ = try openEmbeddedStore(directory: root) { again.append($0) } }
        notes = again.lines
        XCTAssertEqual(notes, [])
    }

    func testSmallFDCacheEvictsUnderConcurrentReads() throws {
        let blobs = try LocalBlobStore(directory: fixture.directory, fdCacheCapacity: 8)
        try StoreSuite.concurrentReadsOfManyBlobs(fixture, blobs: blobs, count: 64)
        XCTAssertLessThanOrEqual(blobs.cachedFDCount, 8)
        XCTAssertGreaterThan(blobs.cachedFDCount, 0)
    }

    /// A sync makes durable the chunks this writer wrote, one by one (no syncfs of the disk), but
    /// syncs everything on a writer's first sync and whenever another writer put versions since
    /// its last: their chunks sit in another process's writes, which only a syncfs reaches.
    func testASyncCoversThisWritersChunksAndEverythingAfterAnothersVersions() throws {
        let plan = FaultPlan()
        let store = faultInjecting(try fixture.open(), plan: plan)
        _ = try store.durability.begin(writer: "A", snapshot: try store.metadata.load())
        func publish(_ ino: InodeNumber, version: VersionID, by writer: String) throws {
            let chunk = try writeBlob(store.blobs, [UInt8(truncatingIfNeeded: version), 1, 2])
            try store.metadata.commit(Batch([.putVersion(Sample.version(version, ino: ino, chunks: [chunk])),
                                             .putNode(Sample.node(ino, size: 3, version: version))], writer: writer),
                                      durable: false)
        }
        func syncs() -> (all: Int, written: Int) { (plan.callCount(.syncAll), plan.callCount(.syncWritten)) }

        try publish(5, version: 1, by: "A")
        try store.durability.sync()
        XCTAssertTrue(syncs() == (1, 0), "a writer's first sync covers everything: \(syncs())")
        try publish(5, version: 2, by: "A")
        try store.metadata.commit(Batch([.putNode(Sample.node(6))], writer: "B"), durable: false)
        try store.durability.sync()
        XCTAssertTrue(syncs() == (1, 1), "its own versions and another's node: its own chunks only: \(syncs())")
        try publish(7, version: 3, by: "B")
        try store.durability.sync()
        XCTAssertTrue(syncs() == (2, 1), "another writer's version: everything: \(syncs())")
        try store.durability.sync()
        XCTAssertTrue(syncs() == (2, 1), "nothing committed since: nothing to sync: \(syncs())")
    }

    /// The embedded blob store lists the chunks it wrote unsynced, up to a limit past which it
    /// syncs the whole disk; a sync empties the list, a failed one keeps it, a deleted chunk
    /// leaves it.
    func testTheBlobStoreListsItsUnsyncedChunks() throws {
        let blobs = try LocalBlobStore(directory: fixture.directory)
        let first = try writeBlob(blobs, [1])
        let second = try writeBlob(blobs, [2])
        _ = try writeBlob(blobs, [3], durable: true)
        XCTAssertEqual(blobs.unsyncedChunks.ids, [first.blob, second.blob])
        try blobs.delete(second.blob)
        XCTAssertEqual(blobs.unsyncedChunks.ids, [first.blob])
        // A chunk deleted behind its back (another daemon's collection) is no failure.
        let third = try writeBlob(blobs, [4])
        XCTAssertEqual(unlink(blobs.path(of: third.blob)), 0)
        try blobs.syncWritten()
        XCTAssertEqual(blobs.unsyncedChunks.ids, [])
        XCTAssertFalse(blobs.unsyncedChunks.overflow)
        for i in 0...LocalBlobStore.unsyncedLimit { _ = try writeBlob(blobs, [UInt8(truncatingIfNeeded: i), 9]) }
        XCTAssertEqual(blobs.unsyncedChunks.ids.count, LocalBlobStore.unsyncedLimit)
        XCTAssertTrue(blobs.unsyncedChunks.overflow, "past the limit, the next sync is one syncfs")
        try blobs.syncWritten()
        XCTAssertEqual(blobs.unsyncedChunks.ids, [])
        XCTAssertFalse(blobs.unsyncedChunks.overflow)
        // A chunk that cannot be synced (a symlink planted at its name, which O_NOFOLLOW
        // refuses) fails the sync and stays listed for the next one.
        let fourth = try writeBlob(blobs, [5])
        let file = blobs.path(of: fourth.blob)
        XCTAssertEqual(rename(file, file + ".away"), 0)
        XCTAssertEqual(symlink(file + ".away", file), 0)
        XCTAssertThrowsError(try blobs.syncWritten())
        XCTAssertEqual(blobs.unsyncedChunks.ids, [fourth.blob])
        XCTAssertEqual(unlink(file), 0)
        XCTAssertEqual(rename(file + ".away", file), 0)
        try blobs.syncWritten()
        XCTAssertEqual(blobs.unsyncedChunks.ids, [])
    }

    /// Chunks written one after another share their folder (64 to a folder, then the next), so
    /// a sync of many fresh chunks fsyncs few folders; over time they spread over all of them.
    func testChunksWrittenTogetherShareAFolder() throws {
        let blobs = try LocalBlobStore(directory: fixture.directory)
        var ids: [BlobID] = []
        for i in 0..<(64 * 5) { ids.append(try writeBlob(blobs, [UInt8(truncatingIfNeeded: i), 7]).blob) }
        let folders = ids.map { UInt8(truncatingIfNeeded: $0) }
        let runs = folders.indices.dropFirst().filter { folders[$0] != folders[$0 - 1] }.count + 1
        XCTAssertTrue((5...6).contains(runs), "320 chunks in runs of 64 per folder: \(runs) runs")
        XCTAssertEqual(Set(folders).count, runs, "each run its own folder")
        XCTAssertEqual(Set(ids).count, ids.count, "the other 56 bits tell them apart")
        var st = stat()
        XCTAssertTrue(ids.allSatisfy { lstat(blobs.path(of: $0), &st) == 0 })
    }

    /// Several daemons on one store: a live one's working copies are never another's leftovers;
    /// once it is gone, exactly one other daemon takes them.
    func testALiveDaemonsWorkingCopiesAreNotLeftovers() throws {
        var first: LocalWorkArea? = try LocalWorkArea(directory: fixture.directory)
        let copy = try first!.create(ino: 12)
        try copy.setBase(nil, size: 0)
        try writeWork(copy, [1, 2], at: 0)
        try copy.markDirty(0)
        let second = try LocalWorkArea(directory: fixture.directory)
        XCTAssertNotEqual(second.workPath, first!.workPath)
        XCTAssertEqual(try second.leftovers().map(\.ino), [], "its daemon is alive")
        XCTAssertTrue(second.otherWritersAlive())
        XCTAssertTrue(first!.otherWritersAlive())
        first = nil   // the daemon dies (its lock goes with it)
        XCTAssertFalse(second.otherWritersAlive())
        _ = copy
        XCTAssertEqual(try second.leftovers().map(\.ino), [12])
        let third = try LocalWorkArea(directory: fixture.directory)
        XCTAssertTrue(second.otherWritersAlive(), "the third runs")
        XCTAssertEqual(try third.leftovers().map(\.ino), [], "taken by the second already")
        second.recoveryFinished()
        XCTAssertEqual(try third.leftovers().map(\.ino), [], "and gone once it is done")
        let folders = try FileManager.default.contentsOfDirectory(atPath: fixture.directory + "/work")
        XCTAssertEqual(Set(folders), Set([second.workPath, third.workPath].map { ($0 as NSString).lastPathComponent }))
    }

    func testMalformedLeftoversAreRemoved() throws {
        var work = ""
        do {
            let area = try LocalWorkArea(directory: fixture.directory)
            work = area.workPath
            let good = try area.create(ino: 5)
            try good.setBase(3, size: 10)
            try good.markDirty(0)
            let lost = try area.create(ino: 6)  // will lose its map
            try lost.markDirty(0)
        }
        let fm = FileManager.default
        try fm.removeItem(atPath: work + "/6.map")
        XCTAssertTrue(fm.createFile(atPath: work + "/7.data", contents: Data()))
        XCTAssertTrue(fm.createFile(atPath: work + "/7.map", contents: Data("not a map".utf8)))
        XCTAssertTrue(fm.createFile(atPath: work + "/8.data", contents: Data()))
        XCTAssertTrue(fm.createFile(atPath: work + "/8.map", contents: Data("UBQWMAP1".utf8) + Data(count: 8)))
        XCTAssertTrue(fm.createFile(atPath: work + "/junk.tmp", contents: Data([1])))
        XCTAssertTrue(fm.createFile(atPath: work + "/007.data", contents: Data()))

        let area = try LocalWorkArea(directory: fixture.directory)
        let found = try area.leftovers()
        XCTAssertEqual(found.map(\.ino), [5])
        XCTAssertEqual(found.first?.base, 3)
        XCTAssertEqual(found.first?.size, 10)
        XCTAssertEqual(found.first?.dirtyChunks, [0])
        XCTAssertEqual(try fm.contentsOfDirectory(atPath: work).filter { $0 != "lock" }.map { $0.hasSuffix(".0") ? "5.chunk0" : $0 }.sorted(),
                       ["5.chunk0", "5.map"], "6's chunk file, the others' files and the junk are gone")
        found.first?.file.remove()
        area.recoveryFinished()
        XCTAssertFalse(fm.fileExists(atPath: work), "a gone daemon's folder is removed once recovered")
    }

    func testStandalonePartsAndReopen() throws {
        let path = fixture.directory + "/meta.db"
        try FileManager.default.createDirectory(atPath: fixture.directory, withIntermediateDirectories: true)
        do {
            let m = try SQLiteMetadataStore(path: path)
            try m.commit([.putNode(Sample.node(9)), .putVersion(Sample.version(4, ino: 9))], durable: true)
        }
        let m = try SQLiteMetadataStore(path: path)
        let s = try m.load()
        XCTAssertEqual(s.nodes, [Sample.node(9)])
        XCTAssertEqual(s.maxIno, 9)
        XCTAssertEqual(try m.versions(of: 9), [Sample.version(4, ino: 9)])
        assertStoreError(ENOENT) { try SQLiteMetadataStore(path: fixture.directory + "/no/such/dir/x.db") }
    }

    func testSQLiteErrorsMapToErrno() {
        XCTAssertEqual(errnoForSQLite(13 /* SQLITE_FULL */), ENOSPC)
        XCTAssertEqual(errnoForSQLite(10 /* SQLITE_IOERR */), EIO)
        XCTAssertEqual(errnoForSQLite(10 | (3 << 8) /* SQLITE_IOERR_WRITE */), EIO)
        XCTAssertEqual(errnoForSQLite(19 /* SQLITE_CONSTRAINT */), EIO)
        XCTAssertEqual(errnoForSQLite(5 /* SQLITE_BUSY */), EIO)
    }

    func testChunkListPackingIsLittleEndian20BytesEach() {
        let chunks = [ChunkRef(blob: 0x0102_0304_0506_0708, length: 0x0a0b_0c0d, checksum: 0x1112_1314_1516_1718), .hole]
        let packed = ChunkPacking.pack(chunks)
        XCTAssertEqual(packed.count, 40)
        XCTAssertEqual(Array(packed[0..<20]), [8, 7, 6, 5, 4, 3, 2, 1, 0x0d, 0x0c, 0x0b, 0x0a,
                                               0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11])
        XCTAssertEqual(packed.withUnsafeBytes { ChunkPacking.unpack($0) }, chunks)
        XCTAssertNil([UInt8](repeating: 0, count: 21).withUnsafeBytes { ChunkPacking.unpack($0) })
    }

    /// A removed working copy's map is emptied and kept (a few at most) for the next working
    /// copy, which starts empty; its chunk files go (they may live on as blobs); a map whose
    /// recorded inode differs from its name is no working copy; another daemon's recovery of
    /// the folder removes the spares.
    func testARemovedWorkingCopysFilesAreReusedEmpty() throws {
        let directory = fixture.directory + "/reuse"
        var work: LocalWorkArea? = try LocalWorkArea(directory: directory)
        let folder = work!.workPath
        func inode(_ path: String) -> ino_t? { var st = stat(); return stat(path, &st) == 0 ? st.st_ino : nil }
        let first = try work!.create(ino: 8)
        try writeWork(first, [UInt8](repeating: 7, count: 3000), at: 0)
        try first.markDirty(0)
        try first.setFinished(mtime: 5)
        let used = inode(folder + "/8.map")
        first.remove()
        XCTAssertTrue(try workingCopies(work!).isEmpty)
        XCTAssertEqual(Set(try FileManager.default.contentsOfDirectory(atPath: folder).filter { !$0.hasSuffix(SpareChunkFiles.suffix) }),
                       ["lock", "spare-0.map"])
        let second = try work!.create(ino: 9)
        XCTAssertEqual(inode(folder + "/9.map"), used, "the same file, renamed")
        XCTAssertEqual(try readWork(second, at: 0, count: 10), [])
        let left = try workingCopies(work!)
        XCTAssertEqual(left.map(\.ino), [9])
        XCTAssertEqual(left.first?.dirtyChunks, [])
        XCTAssertEqual(left.first?.finished, false)
        XCTAssertEqual(left.first?.size, 0)
        // A map that says it is another inode's (a spare whose emptying a power cut undid).
        XCTAssertEqual(rename(folder + "/9.map", folder + "/10.map"), 0)
        XCTAssertTrue(try workingCopies(work!).isEmpty)
        // Many at once: the maps beyond the pool are deleted.
        let many = try (100..<140).map { try work!.create(ino: InodeNumber($0)) }
        for f in many { f.remove() }
        let names = try FileManager.default.contentsOfDirectory(atPath: folder)
        XCTAssertEqual(names.filter { $0.hasPrefix("spare-") && $0.hasSuffix(".map") }.count, SpareMaps.kept, "\(names.sorted())")
        XCTAssertEqual(Set(names.filter { !$0.hasPrefix("spare-") }), ["lock"])
        // The daemon is gone: the next one's recovery finds nothing and removes the folder.
        work = nil
        let next = try LocalWorkArea(directory: directory)
        XCTAssertEqual(try next.leftovers().count, 0)
        next.recoveryFinished()
        XCTAssertFalse(FileManager.default.fileExists(atPath: folder))
    }
}

/// The shared suite on the in-memory store, plus its power-cut simulation.
final class MemoryStoreTests: XCTestCase {
    private var fixture: MemoryFixture!

    override func setUp() {
        fixture = MemoryFixture()
    }

    override func tearDown() {
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
    func testConcurrentReadsOfManyBlobs() throws { try StoreSuite.concurrentReadsOfManyBlobs(fixture) }
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

    // MARK: Memory only

    /// The memory store's parts, for the tests that commit, write chunks and cut the power.
    private struct MemoryParts {
        let store: BackingStore
        let metadata: MemoryMetadataStore
        let blobs: MemoryBlobStore
        let work: MemoryWorkArea
        /// What did not reach the disk is gone: unsynced commits, chunks and working-copy bytes.
        func powerCut() {
            metadata.simulatePowerCut()
            blobs.simulatePowerCut()
            work.simulatePowerCut()
        }
    }

    private func memoryParts() throws -> MemoryParts {
        let store = fixture.store
        return MemoryParts(store: store, metadata: try XCTUnwrap(store.metadata as? MemoryMetadataStore),
                           blobs: try XCTUnwrap(store.blobs as? MemoryBlobStore),
                           work: try XCTUnwrap(store.work as? MemoryWorkArea))
    }

    /// The local-disk durability: a sync makes content and commits durable and records how far;
    /// after a power cut under a running writer, the next writer's start sends a file whose
    /// current content did not reach the disk back to its last whole version, as a batch of the
    /// change log, and clears the dead writer's mark.
    func testDurabilityRepairsWhatAPowerCutLost() throws {
        let parts = try memoryParts()
        let (store, metadata, blobs, work) = (parts.store, parts.metadata, parts.blobs, parts.work)
        XCTAssertEqual(try store.durability.begin(writer: "A", snapshot: try metadata.load()), [])
        XCTAssertEqual(try metadata.load().meta[LocalDurability.runningKey("A")], work.bootID)

        let first = try writeBlob(blobs, [1, 2, 3])
        try metadata.commit([.putVersion(Sample.version(1, ino: 7, chunks: [first])),
                             .putNode(Sample.node(7, size: 3, version: 1))], durable: false)
        try store.durability.sync()
        let synced = try metadata.load()
        XCTAssertEqual(synced.meta[LocalDurability.syncedKey], String(synced.seq - 1), "synced through the commit before the mark")
        let durableBefore = metadata.commitCounts.durable
        try store.durability.sync()
        XCTAssertEqual(metadata.commitCounts.durable, durableBefore, "nothing new: no durable commit")

        // A second version whose commit reached the disk but whose chunk did not.
        let second = try writeBlob(blobs, [4, 5, 6, 7])
        try metadata.commit([.putVersion(Sample.version(2, ino: 7, chunks: [second])),
                             .putNode(Sample.node(7, size: 4, version: 2))], durable: true)
        parts.powerCut()

        let after = try metadata.load()
        let repairs = try store.durability.begin(writer: "B", snapshot: after)
        XCTAssertEqual(repairs.count, 2, "\(repairs)")
        XCTAssertTrue(repairs.last?.contains("went back to version 1") ?? false, "\(repairs)")
        let now = try metadata.load()
        XCTAssertEqual(now.nodes.first { $0.ino == 7 }?.currentVersion, 1)
        XCTAssertEqual(now.nodes.first { $0.ino == 7 }?.size, try metadata.version(1)?.size, "and the size of version 1")
        XCTAssertNil(now.meta[LocalDurability.runningKey("A")], "the dead writer's mark is cleared once verified")
        XCTAssertEqual(now.meta[LocalDurability.runningKey("B")], work.bootID)
        let log = try metadata.changes(since: after.seq)
        XCTAssertTrue(log.contains { $0.mutations.contains { if case .putNode(let n) = $0 { return n.ino == 7 && n.currentVersion == 1 }; return false } },
                      "the revert is in the change log, for the other writers")
        try store.durability.end(writer: "B")
        XCTAssertNil(try metadata.load().meta[LocalDurability.runningKey("B")])
    }

    /// Versions before the current one lose content in a power cut too: they leave the history
    /// (a restore of one would give garbage), whether or not the current version is whole.
    func testAPowerCutTakesVersionsThatLostContentOutOfTheHistory() throws {
        let parts = try memoryParts()
        let (store, metadata, blobs, _) = (parts.store, parts.metadata, parts.blobs, parts.work)
        _ = try store.durability.begin(writer: "A", snapshot: try metadata.load())
        let first = try writeBlob(blobs, [1])
        try metadata.commit([.putVersion(Sample.version(1, ino: 7, chunks: [first])),
                             .putNode(Sample.node(7, size: 1, version: 1))], durable: false)
        try store.durability.sync()
        // Version 2's chunk is not synced; version 3's is (an fsync writes its chunks durably).
        let second = try writeBlob(blobs, [2, 2])
        let third = try writeBlob(blobs, [3, 3, 3], durable: true)
        try metadata.commit([.putVersion(Sample.version(2, ino: 7, chunks: [second])),
                             .putNode(Sample.node(7, size: 2, version: 2))], durable: true)
        try metadata.commit([.putVersion(Sample.version(3, ino: 7, chunks: [third])),
                             .putNode(Sample.node(7, size: 3, version: 3))], durable: true)
        parts.powerCut()

        let repairs = try store.durability.begin(writer: "B", snapshot: try metadata.load())
        XCTAssertEqual(repairs.dropFirst(), ["inode 7: version 2 did not reach the disk before the machine stopped; removed from its history"])
        XCTAssertTrue(repairs.first?.hasPrefix("the machine stopped under 1 running writer") ?? false, "\(repairs)")
        XCTAssertTrue(repairs.first?.hasSuffix("checked 2 versions of 1 file committed since") ?? false,
                      "only the versions after the last sync are read: \(repairs)")
        XCTAssertEqual(try metadata.versions(of: 7).map(\.id), [1, 3])
        XCTAssertEqual(try metadata.load().nodes.first { $0.ino == 7 }?.currentVersion, 3, "the current version is whole and stays")
    }

    /// A file renamed over another holds that one's versions in its history, but never as its
    /// content after a power cut while it has a whole version of its own (even an older one);
    /// with none of its own, the name goes back to what the rename replaced, not to nothing.
    func testAPowerCutRevertsToTheFilesOwnVersionNotOneARenameMovedIn() throws {
        let parts = try memoryParts()
        let (store, metadata, blobs, _) = (parts.store, parts.metadata, parts.blobs, parts.work)
        _ = try store.durability.begin(writer: "A", snapshot: try metadata.load())
        // File 7 has version 1 of its own, then file 8 gets version 2 (newer): both synced.
        try metadata.commit([.putVersion(Sample.version(1, ino: 7, chunks: [try writeBlob(blobs, [1])])),
                             .putNode(Sample.node(7, size: 1, version: 1)),
                             .putVersion(Sample.version(2, ino: 8, chunks: [try writeBlob(blobs, [2, 2])])),
                             .putNode(Sample.node(8, size: 2, version: 2)),
                             .putVersion(Sample.version(4, ino: 10, chunks: [try writeBlob(blobs, [4, 4, 4, 4])])),
                             .putNode(Sample.node(10, size: 4, version: 4)),
                             .putNode(Sample.node(9))], durable: false)
        try store.durability.sync()
        // 7 is renamed over 8, 9 (which never had content) over 10; then each gets a version
        // whose commit reaches the disk and whose chunk does not.
        try metadata.commit([.moveVersions(from: 8, to: 7), .deleteNode(8),
                             .moveVersions(from: 10, to: 9), .deleteNode(10)], durable: false)
        try metadata.commit([.putVersion(Sample.version(3, ino: 7, chunks: [try writeBlob(blobs, [3, 3, 3])])),
                             .putNode(Sample.node(7, size: 3, version: 3)),
                             .putVersion(Sample.version(5, ino: 9, chunks: [try writeBlob(blobs, [5])])),
                             .putNode(Sample.node(9, size: 1, version: 5))], durable: true)
        parts.powerCut()

        let repairs = try store.durability.begin(writer: "B", snapshot: try metadata.load())
        let now = try metadata.load()
        XCTAssertEqual(now.nodes.first { $0.ino == 7 }?.currentVersion, 1, "its own, not the newer one moved in: \(repairs)")
        XCTAssertEqual(now.nodes.first { $0.ino == 7 }?.size, try metadata.version(1)?.size)
        XCTAssertEqual(now.nodes.first { $0.ino == 9 }?.currentVersion, 4, "what the rename replaced: \(repairs)")
        XCTAssertEqual(now.nodes.first { $0.ino == 9 }?.size, try metadata.version(4)?.size)
        XCTAssertEqual(try metadata.versions(of: 7).map(\.id), [1, 2], "the replaced file's version stays in the history")
        XCTAssertEqual(try metadata.versions(of: 9).map(\.id), [4])
    }

    /// A commit that lands while a sync's syncfs runs may name chunks the syncfs missed: the next
    /// sync must not count it as synced already.
    func testACommitDuringASyncIsSyncedByTheNext() throws {
        let plan = FaultPlan()
        let store = faultInjecting(fixture.store, plan: plan)
        let metadata = try XCTUnwrap(fixture.store.metadata as? MemoryMetadataStore)
        _ = try store.durability.begin(writer: "A", snapshot: try store.metadata.load())
        try store.metadata.commit([.putNode(Sample.node(3))], durable: false)
        plan.hold(.syncAll)
        let done = DispatchSemaphore(value: 0)
        Thread {
            try? store.durability.sync()
            done.signal()
        }.start()
        let deadline = Date().addingTimeInterval(10)
        while plan.waiting(.syncAll) == 0 && Date() < deadline { usleep(1_000) }
        XCTAssertEqual(plan.waiting(.syncAll), 1)
        let late = try writeBlob(store.blobs, [9, 9])
        try store.metadata.commit([.putVersion(Sample.version(4, ino: 3, chunks: [late])),
                                   .putNode(Sample.node(3, size: 2, version: 4))], durable: false)
        plan.resume(.syncAll)
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        let syncsBefore = plan.callCount(.syncAll)
        try store.durability.sync()
        XCTAssertEqual(plan.callCount(.syncAll), syncsBefore + 1, "the late commit's chunks are synced now")
        let durableBefore = metadata.commitCounts.durable
        try store.durability.sync()
        XCTAssertEqual(metadata.commitCounts.durable, durableBefore, "and then nothing is left to sync")
    }

    /// A trim is not durable by itself: a power cut before the next durable commit brings back
    /// both the records and the commits after the last durable one, consistently.
    func testATrimBeforeAPowerCutLeavesACoherentLog() throws {
        let metadata = try XCTUnwrap(fixture.store.metadata as? MemoryMetadataStore)
        let durable = try metadata.commit(Batch([.setMeta(key: "k", value: "1")]), durable: true)
        for i in 2...5 { try metadata.commit(Batch([.setMeta(key: "k", value: "\(i)")]), durable: false) }
        try metadata.trimChanges(keepingLast: 1)
        metadata.simulatePowerCut()
        let snapshot = try metadata.load()
        XCTAssertEqual(snapshot.seq, durable)
        XCTAssertEqual(try metadata.changes(since: snapshot.seq), [], "no trim mark past what survived")
        XCTAssertEqual(try metadata.commit(Batch([.setMeta(key: "k", value: "6")]), durable: false), durable + 1)
        XCTAssertEqual(try metadata.changes(since: 0).map(\.seq), [durable, durable + 1])
    }

    func testSimulatedPowerCutKeepsOnlyWhatWasMadeDurable() throws {
        let parts = try memoryParts()
        let (_, metadata, blobs, work) = (parts.store, parts.metadata, parts.blobs, parts.work)

        try metadata.commit([.putNode(Sample.node(1))], durable: true)
        try metadata.commit([.putNode(Sample.node(2))], durable: false)
        let durable = try writeBlob(blobs, [1], durable: true)
        let synced = try writeBlob(blobs, [2])
        try blobs.syncAll()
        let lost = try writeBlob(blobs, [3])
        let kept = try work.create(ino: 1)
        try writeWork(kept, [1, 2], at: 0)
        try kept.markDirty(0)
        try kept.sync()
        try writeWork(kept, [9, 9, 9], at: 0)  // after the sync: lost
        let gone = try work.create(ino: 2)
        try writeWork(gone, [1], at: 0)

        parts.powerCut()

        XCTAssertEqual(try metadata.load().nodes.map(\.ino), [1])
        XCTAssertEqual(try metadata.load().maxIno, 1)
        XCTAssertEqual(blobs.blobIDs, [durable.blob, synced.blob])
        XCTAssertFalse(blobs.verify(lost))
        let left = try work.leftovers()
        XCTAssertEqual(left.map(\.ino), [1])
        XCTAssertEqual(left.first?.dirtyChunks, [0])
        XCTAssertEqual(try readWork(kept, at: 0, count: 10), [1, 2])
    }

    func testDroppedAreaDoesNotLeakOrCrash() throws {
        var file: (any WorkFile)?
        do {
            let area = MemoryWorkArea()
            file = try area.create(ino: 3)
        }
        file?.remove()  // its area is gone: a no-op
        try writeWork(try XCTUnwrap(file), [1], at: 0)
    }
}

/// Lines a store logged (from any thread).
final class Said: @unchecked Sendable {
    private let lock = NSLock()
    private var said: [String] = []
    func append(_ line: String) { lock.withLock { said.append(line) } }
    var lines: [String] { lock.withLock { said } }
}
