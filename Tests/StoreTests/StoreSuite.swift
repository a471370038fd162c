import Foundation
import XCTest
@testable import UbiquityStore

/// The test suite every backing store must pass. Each test class (one per store kind) calls
/// every function here with its fixture.
enum StoreSuite {

    // MARK: Metadata

    static func commitLoadRoundTripOfEveryMutation(_ f: StoreFixture) throws {
        let store = try f.open()
        let m = store.metadata
        let empty = try m.load()
        XCTAssertTrue(empty.nodes.isEmpty && empty.dirents.isEmpty && empty.meta.isEmpty)
        XCTAssertEqual(empty.maxIno, 0)
        XCTAssertEqual(empty.maxVersion, 0)

        let root = Sample.node(1, kind: .directory)
        let file = Sample.node(2, size: UInt64(2 * chunkSize + 17), version: 10)
        let link = Sample.node(3, kind: .symlink, target: Array("../a/b\u{0}c".utf8))
        let device = Sample.node(UInt64.max - 1, kind: .characterDevice, rdev: 0xdead_beef_0000_0001)
        let empty2 = Sample.node(5, version: nil)
        let v9 = Sample.version(9, ino: 2, origin: .recovered)
        let v10 = Sample.version(10, ino: 2)
        let vEmpty = Sample.version(11, ino: 5, chunks: [])
        var expected = StoreSnapshot()
        try m.commit([
            .putContainer(Sample.containerRecord(root: 1)),
            .putNode(root), .putNode(file), .putNode(link), .putNode(device), .putNode(empty2),
            .putDirent(DirentRecord(parent: 1, name: Array("file.txt".utf8), child: 2)),
            .putDirent(DirentRecord(parent: 1, name: [0xff, 0x00, 0x41], child: 3)),
            .putDirent(DirentRecord(parent: 1, name: Array("dev".utf8), child: UInt64.max - 1)),
            .putXattr(XattrRecord(ino: 2, name: Array("user.color".utf8), value: [1, 2, 3])),
            .putXattr(XattrRecord(ino: 2, name: Array("user.empty".utf8), value: [])),
            .putXattr(XattrRecord(ino: 1, name: Array("user.x".utf8), value: [0])),
            .putVersion(v9), .putVersion(v10), .putVersion(vEmpty),
            .setMeta(key: "device", value: "host ✓"),
            .setMeta(key: "empty", value: ""),
        ], durable: false)
        expected.nodes = [root, file, link, empty2, device]
        expected.dirents = [DirentRecord(parent: 1, name: Array("file.txt".utf8), child: 2),
                            DirentRecord(parent: 1, name: [0xff, 0x00, 0x41], child: 3),
                            DirentRecord(parent: 1, name: Array("dev".utf8), child: UInt64.max - 1)]
        expected.xattrs = [XattrRecord(ino: 2, name: Array("user.color".utf8), value: [1, 2, 3]),
                           XattrRecord(ino: 2, name: Array("user.empty".utf8), value: []),
                           XattrRecord(ino: 1, name: Array("user.x".utf8), value: [0])]
        expected.containers = [Sample.containerRecord(root: 1)]
        expected.currentVersions = [v10]
        expected.meta = ["device": "host ✓", "empty": ""]
        expected.maxIno = UInt64.max - 1
        expected.maxVersion = 11
        assertSameContent(try m.load(), expected)
        XCTAssertEqual(try m.version(9), v9)
        XCTAssertEqual(try m.version(11), vEmpty)

        // Replace, delete and update.
        var file2 = file
        file2.size = 17
        file2.currentVersion = 9
        file2.nlink = 2
        var container2 = Sample.containerRecord(root: 1)
        container2.registeredVersion = "43"
        container2.isPublic = false
        try m.commit([
            .putNode(file2),
            .putDirent(DirentRecord(parent: 1, name: Array("file.txt".utf8), child: 3)),  // rename over
            .deleteDirent(parent: 1, name: [0xff, 0x00, 0x41]),
            .deleteDirent(parent: 1, name: Array("missing".utf8)),
            .putXattr(XattrRecord(ino: 2, name: Array("user.color".utf8), value: [9])),
            .deleteXattr(ino: 2, name: Array("user.empty".utf8)),
            .putContainer(container2),
            .setMeta(key: "device", value: "other"),
        ], durable: false)
        expected.nodes = [root, file2, link, empty2, device]
        expected.dirents = [DirentRecord(parent: 1, name: Array("file.txt".utf8), child: 3),
                            DirentRecord(parent: 1, name: Array("dev".utf8), child: UInt64.max - 1)]
        expected.xattrs = [XattrRecord(ino: 2, name: Array("user.color".utf8), value: [9]),
                           XattrRecord(ino: 1, name: Array("user.x".utf8), value: [0])]
        expected.containers = [container2]
        expected.currentVersions = [v9]
        expected.meta["device"] = "other"
        assertSameContent(try m.load(), expected)

        // deleteNode takes the node's xattrs and versions along; dirents are the model's business.
        try m.commit([.deleteNode(2)], durable: false)
        expected.nodes = [root, link, empty2, device]
        expected.xattrs = [XattrRecord(ino: 1, name: Array("user.x".utf8), value: [0])]
        expected.currentVersions = []
        assertSameContent(try m.load(), expected)
        XCTAssertEqual(try m.versions(of: 2), [])
        XCTAssertNil(try m.version(9))
        XCTAssertNil(try m.version(10))
        XCTAssertEqual(try m.version(11), vEmpty)
        XCTAssertEqual(try m.versions(of: 5), [vEmpty])
    }

    static func failingMutationLeavesNothing(_ f: StoreFixture) throws {
        let m = try f.open().metadata
        try m.commit([.putNode(Sample.node(10)), .putVersion(Sample.version(1, ino: 10))], durable: false)
        let before = try m.load()
        // The last mutation violates "versions are immutable": nothing of the batch may stay.
        assertStoreError(EIO) {
            try m.commit([.putNode(Sample.node(11)), .setMeta(key: "k", value: "v"),
                          .putVersion(Sample.version(2, ino: 11)),
                          .putVersion(Sample.version(1, ino: 11)), .deleteNode(10)], durable: true)
        }
        let after = try m.load()
        assertSameContent(after, before)
        XCTAssertEqual(after.maxIno, 10)
        XCTAssertEqual(after.maxVersion, 1)
        XCTAssertNil(try m.version(2))
        // And the store still works.
        try m.commit([.putNode(Sample.node(11))], durable: false)
        XCTAssertEqual(try m.load().nodes.map(\.ino), [10, 11])
    }

    static func failedCommitByFaultPlanAppliesNothing(_ f: StoreFixture) throws {
        let plan = FaultPlan()
        let m = faultInjecting(try f.open(), plan: plan).metadata
        plan.fail(.commit, errno: ENOSPC, .nthCall(2))
        try m.commit([.putNode(Sample.node(1)), .setMeta(key: "a", value: "1")], durable: false)
        let error = assertStoreError(ENOSPC) {
            try m.commit([.putNode(Sample.node(2)), .setMeta(key: "b", value: "2")], durable: true)
        }
        XCTAssertTrue(error?.message.contains("commit") ?? false)
        try m.commit([.putNode(Sample.node(3))], durable: false)
        let s = try m.load()
        XCTAssertEqual(s.nodes.map(\.ino), [1, 3])
        XCTAssertEqual(s.meta, ["a": "1"])
        XCTAssertEqual(s.maxIno, 3)
        XCTAssertEqual(plan.callCount(.commit), 3)
        XCTAssertEqual(plan.failureCount(.commit), 1)
    }

    static func idsAreNeverReused(_ f: StoreFixture) throws {
        do {
            let m = try f.open().metadata
            try m.commit([.putNode(Sample.node(5, version: 7)), .putVersion(Sample.version(7, ino: 5)),
                          .putNode(Sample.node(3))], durable: false)
            try m.commit([.deleteNode(5)], durable: false)
            let s = try m.load()
            XCTAssertEqual(s.nodes.map(\.ino), [3])
            XCTAssertEqual(s.maxIno, 5)
            XCTAssertEqual(s.maxVersion, 7)
            // Smaller ids don't lower the marks.
            try m.commit([.putNode(Sample.node(4)), .putVersion(Sample.version(2, ino: 4))], durable: false)
            XCTAssertEqual(try m.load().maxIno, 5)
            XCTAssertEqual(try m.load().maxVersion, 7)
        }
        let s = try f.open().metadata.load()  // after a reopen too
        XCTAssertEqual(s.maxIno, 5)
        XCTAssertEqual(s.maxVersion, 7)
    }

    // MARK: Several writers

    /// Ids reserved through two connections at once never overlap, and never include 1 (the mount
    /// root) or an id already used.
    static func reservedIdsNeverClash(_ f: StoreFixture) throws {
        let a = try f.open().metadata
        try a.commit([.putNode(Sample.node(7))], durable: false)
        let b = try f.secondWriter()
        let inodes = LockedBox<[ClosedRange<InodeNumber>]>([])
        let versions = LockedBox<[ClosedRange<VersionID>]>([])
        let failures = LockedBox<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 2) { i in
            let m = i == 0 ? a : b
            for n in 1...100 {
                do {
                    let r = try m.reserveInodes(n % 7 + 1)
                    inodes.update { $0.append(r) }
                    let v = try m.reserveVersions(n % 5 + 1)
                    versions.update { $0.append(v) }
                } catch { failures.update { $0.append("\(error)") } }
            }
        }
        XCTAssertEqual(failures.value, [])
        func disjoint<T: Comparable>(_ ranges: [ClosedRange<T>]) -> Bool {
            let sorted = ranges.sorted { $0.lowerBound < $1.lowerBound }
            return zip(sorted, sorted.dropFirst()).allSatisfy { $0.upperBound < $1.lowerBound }
        }
        XCTAssertEqual(inodes.value.count, 200)
        XCTAssertTrue(disjoint(inodes.value), "inode reservations overlap")
        XCTAssertTrue(disjoint(versions.value), "version reservations overlap")
        XCTAssertGreaterThan(inodes.value.map(\.lowerBound).min() ?? 0, 7, "above every id already used")
        XCTAssertGreaterThanOrEqual(versions.value.map(\.lowerBound).min() ?? 0, 1)
        // A snapshot's high-water marks cover every reservation, through either connection.
        let maxIno = inodes.value.map(\.upperBound).max() ?? 0
        XCTAssertEqual(try b.load().maxIno, maxIno)
        XCTAssertEqual(try a.load().maxVersion, versions.value.map(\.upperBound).max())
    }

    static func firstReservedInodeIsTwo(_ f: StoreFixture) throws {
        XCTAssertEqual(try f.open().metadata.reserveInodes(3), 2...4, "1 is the mount root")
    }

    /// A batch whose expectation no longer holds fails whole, with `.conflict`, and changes nothing.
    static func conflictingBatchFailsWhole(_ f: StoreFixture) throws {
        let m = try f.open().metadata
        let name = Array("a".utf8)
        let first = try m.commit(Batch([.putNode(Sample.node(1, kind: .directory)), .putNode(Sample.node(2)),
                                        .putDirent(DirentRecord(parent: 1, name: name, child: 2)),
                                        .putContainer(Sample.containerRecord(root: 1)), .setMeta(key: "r", value: "1")],
                                       expecting: [.nameFree(parent: 1, name: name)], writer: "A"), durable: false)
        let before = try m.load()
        XCTAssertEqual(before.nodeChangesByIno()[2], first)
        let bad: [Expectation] = [
            .nameFree(parent: 1, name: name),
            .nameIs(parent: 1, name: name, child: 3),
            .nameIs(parent: 1, name: Array("b".utf8), child: 2),
            .nodeAt(ino: 2, change: first - 1),
            .nodeAt(ino: 9, change: 0),
            .containerRoot(identifier: Sample.container, root: 5),
            .containerRoot(identifier: "iCloud.other", root: 1),
            .metaIs(key: "r", value: "2"),
            .metaIs(key: "r", value: nil),
            .metaIs(key: "absent", value: "1"),
        ]
        for e in bad {
            XCTAssertThrowsError(try m.commit(Batch([.putNode(Sample.node(3)), .setMeta(key: "k", value: "v")],
                                                    expecting: [.nodeAt(ino: 2, change: first), e]), durable: false),
                                 "\(e)") { error in
                XCTAssertEqual((error as? StoreError)?.kind, .conflict, "\(e): \(error)")
            }
        }
        let after = try m.load()
        XCTAssertEqual(after.nodes, before.nodes, "a failed batch applies nothing")
        XCTAssertEqual(after.meta, before.meta)
        XCTAssertEqual(after.seq, before.seq, "and logs nothing")
        // The same batch with expectations that hold commits.
        let good: [Expectation] = [.nameIs(parent: 1, name: name, child: 2), .nameFree(parent: 1, name: Array("b".utf8)),
                                   .nodeAt(ino: 2, change: first), .containerRoot(identifier: Sample.container, root: 1),
                                   .containerRoot(identifier: "iCloud.other", root: nil),
                                   .metaIs(key: "r", value: "1"), .metaIs(key: "absent", value: nil)]
        let second = try m.commit(Batch([.putNode(Sample.node(2, size: 5))], expecting: good), durable: false)
        XCTAssertEqual(second, first + 1)
        XCTAssertEqual(try m.load().nodeChangesByIno()[2], second)
        XCTAssertThrowsError(try m.commit(Batch([.putNode(Sample.node(2))], expecting: [.nodeAt(ino: 2, change: first)]),
                                          durable: false), "the node moved on")
    }

    /// Every commit is one entry of the change log; a reader resumes from any position with no gap
    /// and no duplicate, through another connection and after a reopen.
    static func changeLogResumesWithNoGap(_ f: StoreFixture) throws {
        var seqs: [ChangeSeq] = []
        var batches: [[Mutation]] = []
        do {
            let a = try f.open().metadata
            XCTAssertEqual(try a.load().seq, 0)
            XCTAssertEqual(try a.changes(since: 0), [])
            for i in 1...3 {
                let batch: [Mutation] = [.putNode(Sample.node(InodeNumber(10 + i))), .setMeta(key: "i", value: "\(i)")]
                seqs.append(try a.commit(Batch(batch, writer: "A"), durable: i == 2))
                batches.append(batch)
            }
            XCTAssertEqual(try a.commit([], durable: true), seqs.last, "an empty batch logs nothing")
            let b = try f.secondWriter()
            let seen = try b.changes(since: 0)
            XCTAssertEqual(seen.map(\.seq), seqs)
            XCTAssertEqual(seen.map(\.mutations), batches)
            XCTAssertEqual(seen.map(\.writer), ["A", "A", "A"])
            XCTAssertEqual(zip(seqs, seqs.dropFirst()).map { $1 - $0 }, [1, 1], "dense and ordered")
            let batch: [Mutation] = [.deleteNode(11), .putXattr(XattrRecord(ino: 12, name: Array("user.x".utf8), value: [0, 1]))]
            seqs.append(try b.commit(Batch(batch, writer: "B"), durable: false))
            batches.append(batch)
            XCTAssertEqual(try a.changes(since: seqs[2]).map(\.seq), [seqs[3]])
            XCTAssertEqual(try a.changes(since: seqs[2]).first?.mutations, batch)
            XCTAssertEqual(try a.changes(since: 0, notBy: "A").map(\.seq), [seqs[3]], "only the other writers'")
            XCTAssertEqual(try a.changes(since: 0, notBy: "A").first?.mutations, batch)
            XCTAssertEqual(try a.changes(since: seqs[0], notBy: "B").map(\.seq), [seqs[1], seqs[2]])
            XCTAssertEqual(try a.load().seq, seqs[3], "a snapshot says where the log continues")
        }
        let m = try f.open().metadata
        XCTAssertEqual(try m.changes(since: seqs[1]).map(\.seq), Array(seqs[2...]))
        XCTAssertEqual(try m.changes(since: seqs[3]), [])
        XCTAssertEqual(try m.commit(Batch([.setMeta(key: "j", value: "1")]), durable: false), seqs[3] + 1)
    }

    static func versionsAreListedOldestFirst(_ f: StoreFixture) throws {
        let m = try f.open().metadata
        try m.commit([.putVersion(Sample.version(30, ino: 1))], durable: false)
        try m.commit([.putVersion(Sample.version(4, ino: 2)), .putVersion(Sample.version(10, ino: 1))], durable: false)
        try m.commit([.putVersion(Sample.version(20, ino: 1)), .putVersion(Sample.version(31, ino: 1))], durable: false)
        XCTAssertEqual(try m.versions(of: 1).map(\.id), [10, 20, 30, 31])
        XCTAssertEqual(try m.versions(of: 1), [10, 20, 30, 31].map { Sample.version($0, ino: 1) })
        XCTAssertEqual(try m.versions(of: 2).map(\.id), [4])
        XCTAssertEqual(try m.versions(of: 3), [])
        XCTAssertEqual(try [1, 2, 3].map { try m.versionCount(of: $0) }, [4, 1, 0])
        XCTAssertEqual(try m.version(20), Sample.version(20, ino: 1))
        XCTAssertNil(try m.version(99))
        XCTAssertEqual(try m.allVersions().map(\.id), [4, 10, 20, 30, 31])
        try m.commit([.putVersion(Sample.version(40, ino: 2, origin: .recovered)),
                      .putVersion(Sample.version(41, ino: 1, origin: .restored))], durable: false)
        XCTAssertEqual(try m.versions(withOrigin: .recovered), [Sample.version(40, ino: 2, origin: .recovered)])
        XCTAssertEqual(try m.versions(withOrigin: .restored).map(\.id), [41])
        XCTAssertEqual(try m.versions(withOrigin: .published).map(\.id), [4, 10, 20, 30, 31])
        // Only current versions are in the snapshot.
        try m.commit([.putNode(Sample.node(1, version: 20))], durable: false)
        XCTAssertEqual(try m.load().currentVersions, [Sample.version(20, ino: 1)])
    }

    /// A rename over a file gives its versions to the file that replaced it; each remembers the
    /// file it was published for (a power cut's revert goes back only to a file's own), through
    /// a second move, a reopen and the change log.
    static func movedVersionsRememberTheirFile(_ f: StoreFixture) throws {
        let m = try f.open().metadata
        try m.commit([.putVersion(Sample.version(1, ino: 5)), .putVersion(Sample.version(2, ino: 6)),
                      .putNode(Sample.node(5, version: 1)), .putNode(Sample.node(6, version: 2))], durable: false)
        let from = try m.load().seq
        try m.commit([.moveVersions(from: 5, to: 6), .deleteNode(5)], durable: false)
        try m.commit([.putVersion(Sample.version(3, ino: 6))], durable: false)
        XCTAssertEqual(try m.versions(of: 6).map(\.movedFrom), [5, nil, nil])
        try m.commit([.putNode(Sample.node(7)), .moveVersions(from: 6, to: 7), .putNode(Sample.node(7, version: 1)),
                      .deleteNode(6)], durable: true)
        XCTAssertEqual(try m.versions(of: 7).map(\.movedFrom), [5, 6, 6], "a second move keeps the first file")
        XCTAssertEqual(try m.version(1)?.movedFrom, 5)
        XCTAssertEqual(try m.load().currentVersions.map(\.movedFrom), [5])
        XCTAssertEqual(try m.allVersions().map(\.movedFrom), [5, 6, 6])
        XCTAssertEqual(try m.versions(withOrigin: .published).map(\.ino), [7, 7, 7])
        XCTAssertEqual(try f.open().metadata.versions(of: 7).map(\.movedFrom), [5, 6, 6], "after a reopen")
        let moves = try m.changes(since: from).flatMap(\.mutations).filter { if case .moveVersions = $0 { true } else { false } }
        XCTAssertEqual(moves, [.moveVersions(from: 5, to: 6), .moveVersions(from: 6, to: 7)])
    }

    static func durableCommitAndEmptyBatches(_ f: StoreFixture) throws {
        do {
            let m = try f.open().metadata
            try m.commit([], durable: false)
            try m.commit([], durable: true)
            try m.commit([.putNode(Sample.node(1)), .setMeta(key: "k", value: "durable")], durable: true)
            try m.commit([.putNode(Sample.node(2))], durable: false)
            try m.commit([], durable: true)  // a barrier for the commit before it
            if let sqlite = m as? SQLiteMetadataStore {
                // Back to NORMAL (1) after the durable transaction; WAL mode.
                XCTAssertEqual(try sqlite.pragma("synchronous"), "1")
                XCTAssertEqual(try sqlite.pragma("journal_mode"), "wal")
            }
            if let memory = m as? MemoryMetadataStore {
                XCTAssertEqual(memory.commitCounts.all, 5)  // empty batches count: they are barriers
                XCTAssertEqual(memory.commitCounts.durable, 3)
            }
        }
        let s = try f.open().metadata.load()
        XCTAssertEqual(s.nodes.map(\.ino), [1, 2])
        XCTAssertEqual(s.meta["k"], "durable")
    }

    static func reopenKeepsData(_ f: StoreFixture) throws {
        let first: StoreSnapshot
        let ref: ChunkRef
        let content = Sample.bytes(10_000, seed: 1)
        do {
            let store = try f.open()
            ref = try writeBlob(store.blobs, content)
            try store.blobs.syncAll()
            try store.metadata.commit([
                .putContainer(Sample.containerRecord(root: 1)),
                .putNode(Sample.node(1, kind: .directory)),
                .putNode(Sample.node(2, size: 10_000, version: 1)),
                .putDirent(DirentRecord(parent: 1, name: Array("a".utf8), child: 2)),
                .putXattr(XattrRecord(ino: 2, name: Array("user.k".utf8), value: [7])),
                .putVersion(Sample.version(1, ino: 2, chunks: [ref])),
                .setMeta(key: "m", value: "v"),
            ], durable: false)
            first = try store.metadata.load()
        }
        let store = try f.open()
        assertSameContent(try store.metadata.load(), first)
        XCTAssertEqual(try readBlob(store.blobs, ref.blob, count: 20_000), content)
        XCTAssertTrue(store.blobs.verify(ref))
        XCTAssertEqual(try store.metadata.versions(of: 2).first?.chunks, [ref])
    }

    static func concurrentCommitsAndReads(_ f: StoreFixture) throws {
        let m = try f.open().metadata
        let failures = Counter()
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            for i in 0..<40 {
                let ino = InodeNumber(thread * 1000 + i + 1)
                do {
                    try m.commit([.putNode(Sample.node(ino)),
                                  .putVersion(Sample.version(VersionID(ino), ino: ino))], durable: i % 10 == 0)
                    if try m.version(VersionID(ino))?.ino != ino { failures.add() }
                    if i % 8 == 0 { _ = try m.load() }
                } catch {
                    failures.add()
                }
            }
        }
        XCTAssertEqual(failures.count, 0)
        let s = try m.load()
        XCTAssertEqual(s.nodes.count, 320)
        XCTAssertEqual(s.maxIno, 7040)
        XCTAssertEqual(s.maxVersion, 7040)
    }

    static func capacityIsReported(_ f: StoreFixture) throws {
        let c = try f.open().metadata.capacity()
        XCTAssertGreaterThan(c.blockSize, 0)
        XCTAssertGreaterThan(c.totalBlocks, 0)
        XCTAssertLessThanOrEqual(c.availableBlocks, c.freeBlocks)
        XCTAssertLessThanOrEqual(c.freeBlocks, c.totalBlocks)
    }

    // MARK: Blobs

    static func blobWriteReadPartialVerifyDelete(_ f: StoreFixture) throws {
        let blobs = try f.open().blobs
        let small = Sample.bytes(1000, seed: 2)
        let full = Sample.bytes(chunkSize, seed: 3)
        let a = try writeBlob(blobs, small)
        let b = try writeBlob(blobs, full, durable: true)
        let e = try writeBlob(blobs, [])
        for ref in [a, b, e] { XCTAssertNotEqual(ref.blob, 0) }
        XCTAssertEqual(Set([a.blob, b.blob, e.blob]).count, 3)
        XCTAssertEqual(a.length, 1000)
        XCTAssertEqual(b.length, UInt32(chunkSize))
        XCTAssertEqual(e.length, 0)
        XCTAssertEqual(a.checksum, small.withUnsafeBytes { contentChecksum($0) })

        XCTAssertEqual(try readBlob(blobs, a.blob, count: 1000), small)
        XCTAssertEqual(try readBlob(blobs, a.blob, count: 4096), small)           // short at the end
        XCTAssertEqual(try readBlob(blobs, a.blob, at: 100, count: 50), Array(small[100..<150]))
        XCTAssertEqual(try readBlob(blobs, a.blob, at: 990, count: 50), Array(small[990...]))
        XCTAssertEqual(try readBlob(blobs, a.blob, at: 1000, count: 50), [])
        XCTAssertEqual(try readBlob(blobs, a.blob, at: 5000, count: 50), [])
        XCTAssertEqual(try readBlob(blobs, b.blob, count: chunkSize), full)
        XCTAssertEqual(try readBlob(blobs, b.blob, at: chunkSize - 3, count: 10), Array(full[(chunkSize - 3)...]))
        XCTAssertEqual(try readBlob(blobs, e.blob, count: 10), [])
        XCTAssertEqual(try readBlob(blobs, 0, count: 10), [])                      // the hole
        assertStoreError(EINVAL) { try readBlob(blobs, a.blob, at: -1, count: 1) }

        for ref in [a, b, e, .hole] { XCTAssertTrue(blobs.verify(ref)) }
        XCTAssertFalse(blobs.verify(ChunkRef(blob: a.blob, length: a.length, checksum: a.checksum ^ 1)))
        XCTAssertFalse(blobs.verify(ChunkRef(blob: a.blob, length: a.length + 1, checksum: a.checksum)))

        try blobs.delete(a.blob)
        try blobs.delete(a.blob)  // deleting twice is fine
        XCTAssertFalse(blobs.verify(a))
        assertStoreError(ENOENT) { try readBlob(blobs, a.blob, count: 10) }
        XCTAssertEqual(try readBlob(blobs, b.blob, at: 7, count: 3), Array(full[7..<10]))

        let tooBig = [UInt8](repeating: 1, count: chunkSize + 1)
        assertStoreError(EINVAL) { try writeBlob(blobs, tooBig) }
        try blobs.syncAll()
    }

    static func corruptBlobFailsVerify(_ f: StoreFixture) throws {
        let store = try f.open()
        let ref = try writeBlob(store.blobs, Sample.bytes(5000, seed: 4))
        _ = try readBlob(store.blobs, ref.blob, count: 10)  // cached fd: verify must not trust it
        XCTAssertTrue(store.blobs.verify(ref))
        try f.corrupt(ref, in: store)
        XCTAssertFalse(store.blobs.verify(ref))
    }

    static func concurrentReadsOfManyBlobs(_ f: StoreFixture, blobs blobStore: (any BlobStore)? = nil,
                                           count: Int = 300, readsPerThread: Int = 1500) throws {
        let blobs = try blobStore ?? f.open().blobs
        var refs: [ChunkRef] = []
        for i in 0..<count {
            refs.append(try writeBlob(blobs, Sample.bytes(512 + i % 7 * 100, seed: UInt64(i + 100))))
        }
        let frozen = refs
        let contents = (0..<count).map { i in Sample.bytes(512 + i % 7 * 100, seed: UInt64(i + 100)) }
        let failures = Counter()
        let reads = Counter()
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            var rng = UInt64(thread + 1) &* 0x2545_f491_4f6c_dd1d
            for _ in 0..<readsPerThread {
                rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17
                let i = Int(rng % UInt64(frozen.count))
                let expected = contents[i]
                let offset = Int((rng >> 20) % 400)
                do {
                    let got = try readBlob(blobs, frozen[i].blob, at: offset, count: 64)
                    if got != Array(expected[offset..<(offset + 64)]) { failures.add() }
                } catch {
                    failures.add()
                }
                reads.add()
            }
        }
        XCTAssertEqual(reads.count, 8 * readsPerThread)
        XCTAssertEqual(failures.count, 0)
        for ref in frozen.prefix(20) { XCTAssertTrue(blobs.verify(ref)) }
    }

    // MARK: Work area

    static func workFileReadWriteTruncateMark(_ f: StoreFixture) throws {
        let work = try f.open().work
        let file = try work.create(ino: 42)
        XCTAssertEqual(file.ino, 42)
        XCTAssertEqual(try readWork(file, at: 0, count: 10), [])  // empty, size 0
        let hello = Array("hello, world".utf8)
        try writeWork(file, hello, at: 0)
        let far = Sample.bytes(3000, seed: 5)
        try writeWork(file, far, at: chunkSize + 10)                  // sparse gap in between
        try file.markDirty(0)
        try file.markDirty(1)
        try file.markDirty(1)
        XCTAssertEqual(try readWork(file, at: 0, count: 12), hello)
        XCTAssertEqual(try readWork(file, at: 7, count: 5), Array("world".utf8))
        XCTAssertEqual(try readWork(file, at: 100, count: 4), [0, 0, 0, 0])
        XCTAssertEqual(try readWork(file, at: chunkSize + 10, count: 3000), far)
        XCTAssertEqual(try readWork(file, at: chunkSize + 3000, count: 100), Array(far[2990...]))  // short
        XCTAssertEqual(try readWork(file, at: chunkSize + 3010, count: 100), [])                 // at the end

        try file.truncate(to: 5)
        XCTAssertEqual(try readWork(file, at: 0, count: 100), Array("hello".utf8))
        try file.truncate(to: 10)                                     // grows with zeros
        XCTAssertEqual(try readWork(file, at: 0, count: 100), Array("hello".utf8) + [0, 0, 0, 0, 0])
        try file.setBase(7, size: UInt64(3 * chunkSize))
        XCTAssertEqual(try readWork(file, at: 3 * chunkSize - 2, count: 10), [0, 0])
        try file.sync()
        assertStoreError(EINVAL) { try file.markDirty(-1) }
        assertStoreError(EINVAL) { try file.truncate(to: -1) }

        let recovered = try workingCopies(work).first { $0.ino == 42 }
        XCTAssertEqual(recovered?.base, 7)
        XCTAssertEqual(recovered?.size, UInt64(3 * chunkSize))
        XCTAssertEqual(recovered?.dirtyChunks, [0, 1])
        file.remove()
        XCTAssertTrue(try workingCopies(work).isEmpty)
    }

    static func leftoversAfterCrash(_ f: StoreFixture) throws {
        let a = Sample.bytes(5000, seed: 6)
        let b = Sample.bytes(100, seed: 7)
        do {
            let work = try f.open().work
            let one = try work.create(ino: 1)
            try one.setBase(nil, size: 0)
            try writeWork(one, a, at: 0)
            try one.markDirty(0)
            try one.sync()
            let two = try work.create(ino: 2)
            try two.setBase(17, size: UInt64(4 * chunkSize))
            try writeWork(two, b, at: 2 * chunkSize + 5)
            try two.markDirty(2)
            try two.markDirty(9)  // beyond the end: not reported
            let three = try work.create(ino: 3)
            try writeWork(three, b, at: 0)
            three.remove()        // published and removed: not a leftover
            // "Crash": drop everything without remove().
        }
        let work = try f.open().work
        let found = try work.leftovers().sorted { $0.ino < $1.ino }
        XCTAssertEqual(found.map(\.ino), [1, 2])
        guard found.count == 2 else { return }
        XCTAssertNil(found[0].base)
        XCTAssertEqual(found[0].size, 5000)
        XCTAssertEqual(found[0].dirtyChunks, [0])
        XCTAssertEqual(try readWork(found[0].file, at: 0, count: 6000), a)
        XCTAssertEqual(found[1].base, 17)
        XCTAssertEqual(found[1].size, UInt64(4 * chunkSize))
        XCTAssertEqual(found[1].dirtyChunks, [2])
        XCTAssertEqual(try readWork(found[1].file, at: 2 * chunkSize + 5, count: 100), b)
        // The recovered file is usable, and remove() finishes it.
        try writeWork(found[1].file, [1], at: 0)
        try found[1].file.markDirty(0)
        XCTAssertEqual(try work.leftovers().first { $0.ino == 2 }?.dirtyChunks, [0, 2])
        for w in found { w.file.remove() }
        XCTAssertTrue(try work.leftovers().isEmpty)
    }

    /// A working copy marked finished comes back finished (and intact, on the same boot), with
    /// its base; unmarking, or a new base, clears the mark.
    static func finishedMarkSurvivesACrash(_ f: StoreFixture) throws {
        do {
            let work = try f.open().work
            let done = try work.create(ino: 1)
            try done.setBase(5, size: 0)
            try writeWork(done, [1, 2, 3], at: 0)
            try done.markDirty(0)
            try done.setFinished(mtime: 1_234_567_890_123)
            let undone = try work.create(ino: 2)
            try undone.setBase(nil, size: 0)
            try writeWork(undone, [9], at: 0)
            try undone.setFinished(mtime: 5)
            try undone.setFinished(mtime: nil)
            let rebased = try work.create(ino: 3)
            try rebased.setFinished(mtime: 6)
            try rebased.setBase(8, size: 10)
        }
        let found = try f.open().work.leftovers().sorted { $0.ino < $1.ino }
        XCTAssertEqual(found.map(\.ino), [1, 2, 3])
        guard found.count == 3 else { return }
        XCTAssertEqual(found.map(\.finished), [true, false, false])
        XCTAssertEqual(found.map(\.intact), [true, true, true], "the machine did not restart")
        XCTAssertEqual(found.map(\.base), [5, nil, 8])
        XCTAssertEqual(found[0].dirtyChunks, [0])
        XCTAssertEqual(found[0].modified, 1_234_567_890_123, "the time recorded with the mark")
        XCTAssertGreaterThan(found[1].modified, 0, "else when the data last changed")
        for w in found { w.file.remove() }
    }

    /// Garbage collection's view: blobs written before a time, so that younger ones (another
    /// writer's, not committed yet) are left alone.
    static func blobsListedByAge(_ f: StoreFixture) throws {
        let store = try f.open()
        let before = nowForTests()
        let ref = try writeBlob(store.blobs, [1, 2, 3])
        XCTAssertTrue(try store.blobs.allBlobs().contains(ref.blob))
        XCTAssertFalse(try store.blobs.allBlobs(writtenBefore: before - 1_000_000_000).contains(ref.blob), "too young")
        XCTAssertTrue(try store.blobs.allBlobs(writtenBefore: nowForTests() + 1_000_000_000).contains(ref.blob))
    }

    static func createReplacesAndStaleRemoveIsHarmless(_ f: StoreFixture) throws {
        let work = try f.open().work
        let old = try work.create(ino: 8)
        try writeWork(old, [1, 2, 3], at: 0)
        try old.markDirty(0)
        try old.setBase(3, size: 3)
        let new = try work.create(ino: 8)
        XCTAssertEqual(try readWork(new, at: 0, count: 10), [])
        let left = try workingCopies(work)
        XCTAssertEqual(left.count, 1)
        XCTAssertNil(left.first?.base)
        XCTAssertEqual(left.first?.dirtyChunks, [])
        XCTAssertEqual(left.first?.size, 0)
        old.remove()  // must not remove the new working copy
        XCTAssertEqual(try workingCopies(work).map(\.ino), [8])
        new.remove()
        XCTAssertTrue(try workingCopies(work).isEmpty)
    }

    // MARK: Fault plan

    static func faultPlanTriggers(_ f: StoreFixture) throws {
        let plan = FaultPlan()
        let store = faultInjecting(try f.open(), plan: plan)
        let bytes = Sample.bytes(100, seed: 8)

        // nthCall: only that one.
        plan.fail(.blobWrite, errno: EIO, .nthCall(2))
        let first = try writeBlob(store.blobs, bytes)
        assertStoreError(EIO) { try writeBlob(store.blobs, bytes) }
        _ = try writeBlob(store.blobs, bytes)
        XCTAssertEqual(plan.callCount(.blobWrite), 3)
        XCTAssertEqual(plan.failureCount(.blobWrite), 1)

        // nextCalls: the next N.
        plan.fail(.blobRead, errno: EAGAIN, .nextCalls(2))
        assertStoreError(EAGAIN) { try readBlob(store.blobs, first.blob, count: 10) }
        assertStoreError(EAGAIN) { try readBlob(store.blobs, first.blob, count: 10) }
        XCTAssertEqual(try readBlob(store.blobs, first.blob, count: 100), bytes)

        // fromNthCall: that one and every later.
        plan.fail(.syncAll, errno: ENOSPC, .fromNthCall(2))
        try store.blobs.syncAll()
        assertStoreError(ENOSPC) { try store.blobs.syncAll() }
        assertStoreError(ENOSPC) { try store.blobs.syncAll() }
        plan.clear(.syncAll)
        try store.blobs.syncAll()

        // always, on the work area and work files; verify faults read as "bad blob".
        plan.fail(.workCreate, errno: EMFILE)
        assertStoreError(EMFILE) { try store.work.create(ino: 1) }
        plan.clear(.workCreate)
        let file = try store.work.create(ino: 1)
        plan.fail(.workWrite, errno: ENOSPC)
        plan.fail(.workSync, errno: EIO)
        plan.fail(.workMarkDirty, errno: EROFS)
        assertStoreError(ENOSPC) { try writeWork(file, [1], at: 0) }
        assertStoreError(EIO) { try file.sync() }
        assertStoreError(EROFS) { try file.markDirty(0) }
        XCTAssertEqual(try readWork(file, at: 0, count: 1), [])  // the failed write wrote nothing
        plan.fail(.blobVerify, errno: EIO, .nthCall(1))
        XCTAssertFalse(store.blobs.verify(first))
        XCTAssertTrue(store.blobs.verify(first))
        plan.fail(.workLeftovers, errno: EIO)
        assertStoreError(EIO) { try store.work.leftovers() }
        plan.clearAll()
        if f.isOnDisk {
            // A live daemon's own working copies are never leftovers (crash recovery of the
            // embedded store's is in leftoversAfterCrash); the memory store shows the wrapping.
            XCTAssertEqual(try store.work.leftovers().map(\.ino), [])
        } else {
            let left = try store.work.leftovers()
            XCTAssertEqual(left.map(\.ino), [1])
            XCTAssertTrue(left.first?.file is FaultInjectingWorkFile)
            plan.fail(.workRead, errno: EIO)
            assertStoreError(EIO) { try readWork(left[0].file, at: 0, count: 1) }
        }
        plan.clearAll()
        file.remove()
        XCTAssertTrue(try store.work.leftovers().isEmpty)

        // Metadata reads.
        plan.fail(.load, errno: EIO, .nthCall(1))
        assertStoreError(EIO) { try store.metadata.load() }
        _ = try store.metadata.load()
        plan.fail(.versions, errno: EIO)
        plan.fail(.version, errno: EIO)
        assertStoreError(EIO) { try store.metadata.versions(of: 1) }
        assertStoreError(EIO) { try store.metadata.version(1) }
        XCTAssertEqual(Set(FaultOperation.allCases.map(\.rawValue)).count, FaultOperation.allCases.count)
    }

    static func failedBlobWriteStoresNothing(_ f: StoreFixture) throws {
        let plan = FaultPlan()
        let inner = try f.open()
        let store = faultInjecting(inner, plan: plan)
        plan.fail(.blobWrite, errno: ENOSPC)
        assertStoreError(ENOSPC) { try writeBlob(store.blobs, [1, 2, 3]) }
        if let memory = inner.blobs as? MemoryBlobStore { XCTAssertTrue(memory.blobIDs.isEmpty) }
        if let fixture = f as? EmbeddedFixture {
            let names = try FileManager.default.subpathsOfDirectory(atPath: fixture.directory + "/blobs")
            XCTAssertFalse(names.contains { $0.count == 19 })  // "XX/<16 hex>"
        }
    }

    /// Trimming keeps the newest records; asking for what was trimmed is a `.trimmed` error (the
    /// caller reloads), never a silent gap; sequence numbers go on from where they were.
    static func trimmedChangeLogSaysSo(_ f: StoreFixture) throws {
        var seqs: [ChangeSeq] = []
        do {
            let m = try f.open().metadata
            for i in 1...5 {
                seqs.append(try m.commit(Batch([.setMeta(key: "k", value: "\(i)")], writer: "A"), durable: false))
            }
            try m.trimChanges(keepingLast: 10)
            XCTAssertEqual(try m.changes(since: 0).count, 5, "nothing to trim yet")
            try m.trimChanges(keepingLast: 2)
            XCTAssertEqual(try m.changes(since: seqs[2]).map(\.seq), [seqs[3], seqs[4]])
            XCTAssertEqual(try m.changes(since: seqs[4]), [])
            let error = assertStoreError(EIO) { try m.changes(since: seqs[1]) }
            XCTAssertEqual(error?.kind, .trimmed)
            XCTAssertEqual(assertStoreError(EIO) { try m.changes(since: seqs[1], notBy: "B") }?.kind, .trimmed,
                           "whoever wrote what is gone")
            XCTAssertEqual(try m.load().meta["k"], "5", "the state is whole")
            try m.trimChanges(keepingLast: 2)
            XCTAssertEqual(try m.changes(since: seqs[2]).count, 2, "trimming again keeps what it kept")
        }
        let m = try f.open().metadata
        XCTAssertEqual(assertStoreError(EIO) { try m.changes(since: 0) }?.kind, .trimmed, "after a reopen too")
        XCTAssertEqual(try m.commit(Batch([.setMeta(key: "k", value: "6")]), durable: false), seqs[4] + 1)
        XCTAssertEqual(try m.changes(since: seqs[4]).map(\.seq), [seqs[4] + 1])
    }

    // MARK: Locks
    // MARK: Locks

    /// Two writers' lock tables on one store: POSIX ranges split, merge and conflict across them;
    /// an owner never conflicts with itself; a holder in the same writer is named by pid.
    static func posixLocksConflictAcrossWriters(_ f: StoreFixture) throws {
        let store = try f.open()
        let one = store.locks, two = try f.secondLockTable()
        let a = LockOwner(writer: "one", id: 1, style: .posix)
        let a2 = LockOwner(writer: "one", id: 2, style: .posix)
        let b = LockOwner(writer: "two", id: 1, style: .posix)   // same kernel id, other writer
        let r = { (s: Int64, n: Int64) in LockRange(start: s, length: n) }

        XCTAssertTrue(try one.set(7, owner: a, mode: .write, range: r(0, 100), pid: 11))
        XCTAssertTrue(try one.set(7, owner: a, mode: .read, range: r(50, 0), pid: 11), "own locks never conflict")
        XCTAssertFalse(try two.set(7, owner: b, mode: .read, range: r(10, 1), pid: 99))
        XCTAssertFalse(try two.set(7, owner: b, mode: .write, range: r(1_000_000, 1), pid: 99), "to the end of the file")
        XCTAssertTrue(try two.set(8, owner: b, mode: .write, range: r(0, 0), pid: 99), "another node is free")
        XCTAssertEqual(try two.test(7, owner: b, mode: .read, range: r(0, 10)),
                       HeldLock(mode: .write, range: r(0, 50), pid: 0), "another writer's holder has no pid here")
        XCTAssertNil(try two.test(7, owner: b, mode: .read, range: r(60, 10)), "read locks share")
        XCTAssertEqual(try one.test(7, owner: a2, mode: .write, range: r(60, 10)),
                       HeldLock(mode: .read, range: r(50, 0), pid: 11))
        XCTAssertNil(try one.test(7, owner: a, mode: .write, range: r(0, 0)), "own locks are not reported")

        // Unlocking the middle splits the write lock.
        XCTAssertTrue(try one.set(7, owner: a, mode: nil, range: r(20, 10), pid: 11))
        XCTAssertTrue(try two.set(7, owner: b, mode: .write, range: r(20, 10), pid: 99))
        XCTAssertFalse(try two.set(7, owner: b, mode: .write, range: r(19, 1), pid: 99))
        XCTAssertFalse(try one.set(7, owner: a2, mode: .read, range: r(25, 1), pid: 12))
        XCTAssertEqual(try one.test(7, owner: a2, mode: .read, range: r(25, 1)),
                       HeldLock(mode: .write, range: r(20, 10), pid: 0))

        // Releasing all of an owner's locks (a close) frees everything it held.
        one.release(7, owner: a)
        XCTAssertTrue(try two.set(7, owner: b, mode: .write, range: r(0, 0), pid: 99))
        XCTAssertTrue(try one.set(7, owner: a, mode: nil, range: r(0, 0), pid: 11), "unlocking nothing is fine")
        two.release(7, owner: b)
        two.release(8, owner: b)
        XCTAssertTrue(try one.set(7, owner: a, mode: .write, range: r(0, 0), pid: 11))
        XCTAssertTrue(try one.set(8, owner: a2, mode: .write, range: r(0, 0), pid: 12))
        one.release(7, owner: a)
        one.release(8, owner: a2)
        if let local = one as? LocalLockTable { XCTAssertEqual(local.openDescriptors, 0) }
        if let local = two as? LocalLockTable { XCTAssertEqual(local.openDescriptors, 0) }
    }

    /// `flock` locks: whole file, shared or exclusive, per open file description; a conversion
    /// that fails leaves no lock (Linux's rule).
    static func flockLocksConflictAcrossWriters(_ f: StoreFixture) throws {
        let store = try f.open()
        let one = store.locks, two = try f.secondLockTable()
        let a = LockOwner(writer: "one", id: 1, style: .flock)
        let b = LockOwner(writer: "two", id: 2, style: .flock)
        let p = LockOwner(writer: "two", id: 2, style: .posix)
        XCTAssertTrue(try one.set(3, owner: a, mode: .read, range: .wholeFile, pid: 1))
        XCTAssertTrue(try two.set(3, owner: b, mode: .read, range: .wholeFile, pid: 2))
        XCTAssertFalse(try two.set(3, owner: b, mode: .write, range: .wholeFile, pid: 2))
        // b's failed conversion dropped its shared lock: a can now convert.
        XCTAssertTrue(try one.set(3, owner: a, mode: .write, range: .wholeFile, pid: 1))
        XCTAssertFalse(try two.set(3, owner: b, mode: .read, range: .wholeFile, pid: 2))
        XCTAssertTrue(try two.set(3, owner: p, mode: .write, range: .wholeFile, pid: 2), "flock and fcntl locks are independent")
        XCTAssertTrue(try one.set(3, owner: a, mode: nil, range: .wholeFile, pid: 1))
        XCTAssertTrue(try two.set(3, owner: b, mode: .write, range: .wholeFile, pid: 2))
        two.release(3, owner: b)
        two.release(3, owner: p)
        XCTAssertTrue(try one.set(3, owner: a, mode: .write, range: .wholeFile, pid: 1))
        one.release(3, owner: a)
        if let local = one as? LocalLockTable { XCTAssertEqual(local.openDescriptors, 0) }
    }
}
