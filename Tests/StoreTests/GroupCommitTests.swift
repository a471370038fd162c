import Foundation
import Synchronization
import XCTest
@testable import UbiquityStore

/// Grouped commits of the embedded store: a batch is acknowledged once journaled, before its
/// group's transaction commits, so a daemon that dies with its group open loses nothing that it
/// acknowledged — whoever writes to the store next applies the journal first, at the positions
/// that were acknowledged.
final class GroupCommitTests: XCTestCase {
    private var root = ""

    override func setUpWithError() throws {
        root = FileManager.default.temporaryDirectory.appendingPathComponent("groupcommit-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: root + "/a/journal", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: root + "/b/journal", withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: root)
        super.tearDown()
    }

    /// A daemon's store whose group stays open until something closes it.
    private func daemon(_ folder: String, checksCurrentExpectations: Bool = SQLiteMetadataStore.checksCurrentExpectationsByDefault,
                        log: @escaping @Sendable (String) -> Void = { _ in }) throws -> SQLiteMetadataStore {
        try SQLiteMetadataStore(path: folder + "/metadata.sqlite3", storeLock: nil, journalFolder: folder + "/journal",
                                groupNanoseconds: .max, checksCurrentExpectations: checksCurrentExpectations, log: log)
    }

    private func nodes(_ folder: String) throws -> [InodeNumber] {
        try SQLiteMetadataStore(readOnlyPath: folder + "/metadata.sqlite3").load().nodes.map(\.ino)
    }

    private func journals(_ folder: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: folder + "/journal").filter { $0.hasSuffix(".journal") }
    }

    /// Copies the store's metadata files from `from` to `to`, and the journals unless `journals` is false.
    private func copyFiles(from: String, to: String, journals copyJournals: Bool = true) throws {
        let fm = FileManager.default
        try fm.createDirectory(atPath: to + "/journal", withIntermediateDirectories: true)
        for name in ["metadata.sqlite3", "metadata.sqlite3-wal", "metadata.sqlite3-shm"] where fm.fileExists(atPath: from + "/" + name) {
            try fm.copyItem(atPath: from + "/" + name, toPath: to + "/" + name)
        }
        for name in try journals(from) where copyJournals {
            try fm.copyItem(atPath: from + "/journal/" + name, toPath: to + "/journal/" + name)
        }
    }

    /// Ten acknowledged batches in an open group, with the store's files as they were on disk
    /// meanwhile (what a killed daemon leaves) saved in `saved`. Returns the batches' positions.
    private func killedWithGroupOpen() throws -> [ChangeSeq] {
        let a = try daemon(root + "/a")
        _ = try a.commit(Batch([.putNode(Sample.node(2, kind: .directory))], writer: "a"), durable: true)
        var seqs: [ChangeSeq] = []
        for ino in InodeNumber(3)...12 {
            seqs.append(try a.commit(Batch([.putNode(Sample.node(ino)),
                                            .putDirent(DirentRecord(parent: 2, name: Array("f\(ino)".utf8), child: ino))],
                                           expecting: [.nameFree(parent: 2, name: Array("f\(ino)".utf8))], writer: "a"),
                                     durable: false))
        }
        XCTAssertEqual(try journals(root + "/a").count, 1)
        try copyFiles(from: root + "/a", to: root + "/saved")
        withExtendedLifetime(a) {}
        return seqs
    }

    /// The saved files into `folder`, the journal only if `journal`; returns the journal's name.
    @discardableResult
    private func restore(into folder: String, journal: Bool) throws -> String {
        try copyFiles(from: root + "/saved", to: folder, journals: journal)
        return try XCTUnwrap(try journals(root + "/saved").first)
    }

    /// A big file's versions acknowledged in a group that never committed land from the
    /// journal (whose records carry whole lists) on the list the committed one started; the
    /// change log's rows name that list instead of carrying it, and read back whole; once the
    /// file is deleted (its lists with it) the records leave its versions out, not the delete.
    func testBigVersionsFromAJournalLandOnTheirSharedList() throws {
        let n = ChunkDelta.sharedListMinimum + 1
        let first = Sample.chunks(1, count: n)
        let v1 = Sample.version(1, ino: 5, chunks: first), v2 = Sample.version(2, ino: 5, chunks: first + Sample.chunks(2, count: 1))
        let v3 = Sample.version(3, ino: 5, chunks: Array(first.dropLast()) + Sample.chunks(3, count: 2))
        do {
            let a = try daemon(root + "/a")
            _ = try a.commit(Batch([.putNode(Sample.node(5, version: 1)), .putVersion(v1)], writer: "a"), durable: true)
            for v in [v2, v3] {
                _ = try a.commit(Batch([.putVersion(v), .putNode(Sample.node(5, version: v.id))], writer: "a"), durable: false)
            }
            try copyFiles(from: root + "/a", to: root + "/saved")
            withExtendedLifetime(a) {}
        }
        try restore(into: root + "/b", journal: true)
        XCTAssertEqual(try SQLiteMetadataStore(readOnlyPath: root + "/b/metadata.sqlite3").versions(of: 5), [v1])
        let b = try daemon(root + "/b")
        XCTAssertEqual(try b.versions(of: 5), [v1, v2, v3])
        let stored = try b.chunkListStorage()
        XCTAssertEqual(stored.lists, [1])
        XCTAssertEqual(stored.versions.map(\.list), [1, 1, 1])
        XCTAssertEqual(stored.changeBytes.count, 3)
        XCTAssertTrue(stored.changeBytes.allSatisfy { $0 < n * ChunkPacking.entrySize / 2 }, "\(stored.changeBytes)")
        func versions(_ records: [ChangeRecord]) -> [VersionRecord] {
            records.flatMap(\.mutations).compactMap { if case .putVersion(let v) = $0 { v } else { nil } }
        }
        XCTAssertEqual(versions(try b.changes(since: 0)), [v1, v2, v3])
        _ = try b.commit(Batch([.deleteNode(5)], writer: "b"), durable: true)
        XCTAssertEqual(try b.chunkListStorage().lists, [])
        let after = try b.changes(since: 0)
        XCTAssertEqual(versions(after), [], "their list is gone, and a later record deletes them")
        XCTAssertEqual(after.map(\.seq), [1, 2, 3, 4])
        XCTAssertTrue(after.last?.mutations.contains { if case .deleteNode(5) = $0 { true } else { false } } ?? false)
    }

    func testAKilledDaemonsOpenGroupLandsWhenTheStoreOpensAgain() throws {
        let seqs = try killedWithGroupOpen()
        try restore(into: root + "/b", journal: true)
        XCTAssertEqual(seqs, Array(2...11))
        XCTAssertEqual(try nodes(root + "/b"), [2], "the group never committed")
        let said = Said()
        let b = try daemon(root + "/b", log: said.append)
        XCTAssertEqual(try b.load().nodes.map(\.ino), Array(2...12))
        let records = try b.changes(since: 1)
        XCTAssertEqual(records.map(\.seq), seqs, "at the positions they were acknowledged with")
        XCTAssertEqual(Set(records.map(\.writer)), ["a"])
        XCTAssertEqual(try journals(root + "/b").count, 1, "the dead daemon's journal is gone; the new one's is there")
        XCTAssertEqual(said.lines, [])
        // And the next commit follows on.
        XCTAssertEqual(try b.commit(Batch([.putNode(Sample.node(13))], writer: "b"), durable: false), 12)
    }

    /// Another daemon of the store, already running, applies the journal at its next write,
    /// before its own batch, and at its change feed's next poll.
    func testARunningDaemonAppliesADeadOnesJournalFirst() throws {
        _ = try killedWithGroupOpen()
        let name = try restore(into: root + "/b", journal: false)
        let b = try daemon(root + "/b")
        XCTAssertEqual(try b.load().nodes.map(\.ino), [2])
        try FileManager.default.copyItem(atPath: root + "/saved/journal/" + name, toPath: root + "/b/journal/" + name)
        // Its batch expects what the dead daemon's last batch made.
        let seq = try b.commit(Batch([.deleteDirent(parent: 2, name: Array("f12".utf8))],
                                     expecting: [.nameIs(parent: 2, name: Array("f12".utf8), child: 12)], writer: "b"),
                               durable: false)
        XCTAssertEqual(seq, 12)
        XCTAssertEqual(try b.changes(since: 1).map(\.writer), Array(repeating: "a", count: 10) + ["b"])
        XCTAssertFalse(try journals(root + "/b").contains(name))

        // The change feed's poll (no write of its own).
        try restore(into: root + "/c", journal: false)
        let c = try daemon(root + "/c")
        try FileManager.default.copyItem(atPath: root + "/saved/journal/" + name, toPath: root + "/c/journal/" + name)
        XCTAssertEqual(try c.changes(since: 1).map(\.seq), Array(2...11))
        XCTAssertEqual(try nodes(root + "/c"), Array(2...12), "committed, not only read")
    }

    /// A daemon alone on its store lists the journal folder once, not at every group: it
    /// watches the folder, and lists it again when a journal comes in (made there, or renamed
    /// into it) — whose records it then applies before its own.
    func testADaemonAloneListsItsJournalFolderOnlyWhenAJournalMayHaveComeIn() throws {
        _ = try killedWithGroupOpen()
        let name = try restore(into: root + "/b", journal: false)
        let b = try daemon(root + "/b")
        XCTAssertEqual(try b.changes(since: 1), [], "a poll lists the folder: only its own journal")
        let listed = b.journalListings
        XCTAssertGreaterThan(listed, 0)
        _ = try b.changes(since: 1)
        XCTAssertEqual(b.journalListings, listed, "nothing came in: no listing")

        // A dead daemon's journal renamed into the folder (as a starting daemon names its own).
        try FileManager.default.copyItem(atPath: root + "/saved/journal/" + name, toPath: root + "/b/" + name)
        try FileManager.default.moveItem(atPath: root + "/b/" + name, toPath: root + "/b/journal/" + name)
        let seq = try b.commit(Batch([.deleteDirent(parent: 2, name: Array("f12".utf8))],
                                     expecting: [.nameIs(parent: 2, name: Array("f12".utf8), child: 12)], writer: "b"),
                               durable: false)
        XCTAssertEqual(seq, 12, "the dead daemon's ten records first")
        XCTAssertGreaterThan(b.journalListings, listed)
        _ = try b.changes(since: 12)    // commits the group, and the dead journal goes
        XCTAssertFalse(try journals(root + "/b").contains(name))

        // Its own groups after that: at most one more listing (the folder changed), then none.
        _ = try b.commit(Batch([.putNode(Sample.node(19))], writer: "b"), durable: false)
        _ = try b.changes(since: 12)
        let settled = b.journalListings
        for ino in InodeNumber(20)..<25 {
            _ = try b.commit(Batch([.putNode(Sample.node(ino))], writer: "b"), durable: false)
            _ = try b.changes(since: 12)    // closes the group: the next commit opens another
        }
        XCTAssertEqual(b.journalListings, settled, "five groups, no listing")

        // A journal made in the folder by a daemon starting beside it.
        let other = try daemon(root + "/b")
        _ = try b.commit(Batch([.putNode(Sample.node(30))], writer: "b"), durable: false)
        XCTAssertGreaterThan(b.journalListings, settled)
        withExtendedLifetime(other) {}
        XCTAssertEqual(try nodes(root + "/b").filter { $0 >= 20 }, [20, 21, 22, 23, 24])
    }

    /// A batch whose expectation fails inside a group is undone alone; the group goes on.
    func testAConflictInAGroupUndoesThatBatchAlone() throws {
        let a = try daemon(root + "/a")
        XCTAssertEqual(try a.commit(Batch([.putNode(Sample.node(2))], writer: "a"), durable: false), 1)
        XCTAssertThrowsError(try a.commit(Batch([.putNode(Sample.node(3))], expecting: [.nodeAt(ino: 2, change: 7)],
                                                writer: "a"), durable: false)) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .conflict)
        }
        XCTAssertEqual(try a.commit(Batch([.putNode(Sample.node(4))], expecting: [.nodeAt(ino: 2, change: 1)],
                                          writer: "a"), durable: false), 2)
        XCTAssertEqual(try a.load().nodes.map(\.ino), [2, 4])
        XCTAssertEqual(try a.changes(since: 0).map(\.seq), [1, 2])
        XCTAssertEqual(try nodes(root + "/a"), [2, 4], "a read closes the group")
    }

    /// A batch staged over the log's last position needs no expectation read again (the model
    /// read them from that very state); one staged over an earlier position, or that does not
    /// say where its expectations come from, has them checked. (The expectation below is false
    /// on purpose: it shows which batches were checked.)
    func testExpectationsReadAtTheLogsLastPositionAreTakenAsTheyAre() throws {
        let a = try daemon(root + "/a", checksCurrentExpectations: false)
        XCTAssertEqual(try a.commit(Batch([.putNode(Sample.node(2))], writer: "a"), durable: false), 1)
        let stale: [Expectation] = [.nodeAt(ino: 2, change: 7)]
        func batch(_ ino: InodeNumber, position: ChangeSeq, read: Bool) -> Batch {
            Batch([.putNode(Sample.node(ino))], expecting: stale, writer: "a", position: position, expectationsReadAtPosition: read)
        }
        XCTAssertEqual(try a.commit(batch(3, position: 1, read: true), durable: false), 2, "staged at the last position")
        XCTAssertEqual(try a.commit(batch(4, position: 2, read: true), durable: true), 3, "a durable one too")
        for (b, why) in [(batch(5, position: 2, read: true), "another batch came after its position"),
                         (batch(5, position: 3, read: false), "it does not say where its expectations come from"),
                         (batch(5, position: 0, read: true), "no position")] {
            XCTAssertThrowsError(try a.commit(b, durable: false), why) { error in
                XCTAssertEqual((error as? StoreError)?.kind, .conflict, why)
            }
        }
        XCTAssertEqual(try a.load().nodes.map(\.ino), [2, 3, 4])

        // What the test suite runs with: the skipped ones checked too, a disagreement an error.
        let logged = Mutex<[String]>([])
        let b = try daemon(root + "/b", checksCurrentExpectations: true, log: { line in logged.withLock { $0.append(line) } })
        XCTAssertEqual(try b.commit(Batch([.putNode(Sample.node(2))], writer: "b"), durable: false), 1)
        XCTAssertThrowsError(try b.commit(batch(3, position: 1, read: true), durable: false)) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .corrupt)
        }
        XCTAssertTrue(logged.withLock { $0.contains { $0.contains("the model disagrees with the store at position 1") } })
        XCTAssertEqual(try b.commit(Batch([.putNode(Sample.node(3))], expecting: [.nodeAt(ino: 2, change: 1)], writer: "b",
                                          position: 1, expectationsReadAtPosition: true), durable: false), 2, "true ones pass")
    }

    /// A journal's records past a gap (the positions before them are not in the store, as after
    /// a power cut) or whose expectations fail are not applied, and the log says so.
    func testRecordsThatNoLongerFitAreDroppedAndSaid() throws {
        do {
            let a = try daemon(root + "/a")
            try a.commit([.putNode(Sample.node(2))], durable: true)
        }
        do {
            let dead = try CommitJournal(folder: root + "/a/journal")
            try dead.append(BatchCoding.encodeRecord(seq: 5, batch: Batch([.putNode(Sample.node(9))], writer: "x")))
        }
        let said = Said()
        do {
            let a = try daemon(root + "/a", log: said.append)
            XCTAssertEqual(try a.load().nodes.map(\.ino), [2])
        }
        XCTAssertEqual(said.lines.count, 1)
        XCTAssertTrue(said.lines.first?.contains("1 journaled commits from position 5 cannot be applied") ?? false,
                      said.lines.first ?? "")
        do {
            let dead = try CommitJournal(folder: root + "/a/journal")
            try dead.append(BatchCoding.encodeRecord(seq: 2, batch: Batch([.putNode(Sample.node(9))],
                                                                          expecting: [.nameIs(parent: 1, name: [0x61], child: 3)],
                                                                          writer: "x")))
        }
        let a = try daemon(root + "/a", log: said.append)
        XCTAssertEqual(try a.load().nodes.map(\.ino), [2])
        XCTAssertTrue(said.lines.last?.contains("no longer holds") ?? false, said.lines.last ?? "")
        XCTAssertEqual(try journals(root + "/a").count, 1, "the dropped ones' journals are gone")
    }

    /// Records are applied in order of position whichever journal holds each (a journal whose
    /// emptying failed still starts with old positions).
    func testRecordsAreAppliedInOrderAcrossJournals() throws {
        do {
            let a = try daemon(root + "/a")
            try a.commit([.putNode(Sample.node(2))], durable: true)
        }
        for seqs in [[2, 5], [3, 4]] as [[ChangeSeq]] {
            let dead = try CommitJournal(folder: root + "/a/journal")
            for seq in seqs {
                try dead.append(BatchCoding.encodeRecord(seq: seq, batch: Batch([.putNode(Sample.node(InodeNumber(seq + 10)))],
                                                                                writer: "x")))
            }
        }
        let said = Said()
        let a = try daemon(root + "/a", log: said.append)
        XCTAssertEqual(try a.load().nodes.map(\.ino), [2, 12, 13, 14, 15])
        XCTAssertEqual(try a.changes(since: 1).map(\.seq), [2, 3, 4, 5])
        XCTAssertEqual(said.lines, [])
    }

    /// A group whose first batch failed holds no write lock: another writer commits at once.
    func testAFailedFirstBatchLeavesNoGroupOpen() throws {
        let a = try daemon(root + "/a")
        XCTAssertThrowsError(try a.commit(Batch([.putNode(Sample.node(3))], expecting: [.nodeAt(ino: 2, change: 7)]),
                                          durable: false))
        let other = try SQLiteMetadataStore(path: root + "/a/metadata.sqlite3")
        XCTAssertEqual(try other.commit([.putNode(Sample.node(2))], durable: true), 1)
        withExtendedLifetime(a) {}
    }

    /// A torn last frame (the daemon died inside the write) ends the journal: it was never
    /// acknowledged. The frames before it are read whole.
    func testATornLastFrameEndsTheJournal() throws {
        let batch = Batch([.putNode(Sample.node(2)), .setMeta(key: "k", value: "v")],
                          expecting: [.nameFree(parent: 1, name: [1, 2]), .nameIs(parent: 1, name: [3], child: 4),
                                      .nodeAt(ino: 5, change: -6), .containerRoot(identifier: "c", root: 7),
                                      .containerRoot(identifier: "d", root: nil), .metaIs(key: "m", value: ""),
                                      .metaIs(key: "n", value: nil)],
                          writer: "w")
        var path = ""
        do {
            let journal = try CommitJournal(folder: root + "/a/journal")
            path = journal.path
            try journal.append(BatchCoding.encodeRecord(seq: 41, batch: batch))
            try journal.append(BatchCoding.encodeRecord(seq: 42, batch: batch))
        }
        let whole = try XCTUnwrap(FileManager.default.contents(atPath: path))
        let read = CommitJournal.records([UInt8](whole))
        XCTAssertEqual(read.map(\.seq), [41, 42])
        XCTAssertEqual(read.map(\.batch), [batch, batch])
        XCTAssertEqual(BatchCoding.encodeRecord(seq: 41, batch: batch, encoded: BatchCoding.encode(batch.mutations)),
                       BatchCoding.encodeRecord(seq: 41, batch: batch), "the change log's encoding reused")
        XCTAssertEqual(CommitJournal.records([UInt8](whole.dropLast())).map(\.seq), [41])
        var flipped = [UInt8](whole)
        flipped[flipped.count - 3] ^= 1
        XCTAssertEqual(CommitJournal.records(flipped).map(\.seq), [41])
    }

    /// The open group commits by itself within moments (other daemons wait on it), and 64
    /// batches close it at once.
    func testAGroupCommitsByItself() throws {
        let store = try openEmbeddedStore(directory: root + "/d")
        try store.metadata.commit([.putNode(Sample.node(2))], durable: false)
        let deadline = Date().addingTimeInterval(10)
        while try nodes(root + "/d") != [2] && Date() < deadline { usleep(1000) }
        XCTAssertEqual(try nodes(root + "/d"), [2])

        let a = try daemon(root + "/a")
        for ino in InodeNumber(2)...65 { try a.commit([.putNode(Sample.node(ino))], durable: false) }
        XCTAssertEqual(try nodes(root + "/a").count, 64, "the 64th batch commits the group")
        try a.commit([.putNode(Sample.node(66))], durable: false)
        XCTAssertEqual(try nodes(root + "/a").count, 64)
        try a.commit([], durable: true)
        XCTAssertEqual(try nodes(root + "/a").count, 65, "a durable barrier commits it")
    }
}
