// Settling batches a shared store queued while its servers were out of reach, and could not
// send as they were made because another writer changed what they read first: what the user
// wrote is kept beside the other's change, never over it. The batches here are the ones the
// model stages for these operations, made by hand over the state `one` had.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class QueuedChangesTests: TwoWritersTestCase {
    private func change(of fs: UbiquityFileSystem, _ ino: UInt64) -> ChangeSeq {
        fs.ns.read { fs.state.nodes.change(of: ino) ?? -1 }
    }

    private func node(of fs: UbiquityFileSystem, _ ino: UInt64) throws -> NodeRecord {
        try XCTUnwrap(fs.ns.read { fs.state.nodes[ino] })
    }

    /// What `one` would have queued for a new file `name` in `parent` holding `content`.
    private func queuedCreate(_ parent: UInt64, _ name: String, _ content: [UInt8]) throws -> Batch {
        let ino = try store.metadata.reserveInodes(1).lowerBound
        let version = try store.metadata.reserveVersions(1).lowerBound
        let chunk = try writeBlob(store.blobs, content)
        let folder = try node(of: one, parent)
        let now = Int64(Date().timeIntervalSince1970 * 1e9)
        let file = NodeRecord(ino: ino, container: folder.container, kind: .regular, mode: 0o644, uid: 0, gid: 0, nlink: 1,
                              size: UInt64(content.count), atime: now, mtime: now, ctime: now, btime: now, currentVersion: version)
        var touched = folder
        touched.mtime = now
        touched.ctime = now
        return Batch([.putNode(file), .putDirent(DirentRecord(parent: parent, name: b(name), child: ino)), .putNode(touched),
                      .putVersion(VersionRecord(id: version, ino: ino, created: now, size: UInt64(content.count), chunks: [chunk],
                                                origin: .published, device: "A"))],
                     expecting: [.nameFree(parent: parent, name: b(name)), .nodeAt(ino: parent, change: change(of: one, parent))],
                     writer: "A")
    }

    /// What `one` would have queued for a publish of `content` as `ino`'s new version.
    private func queuedPublish(_ ino: UInt64, _ content: [UInt8]) throws -> Batch {
        let version = try store.metadata.reserveVersions(1).lowerBound
        let chunk = try writeBlob(store.blobs, content)
        var file = try node(of: one, ino)
        file.currentVersion = version
        file.size = UInt64(content.count)
        file.mtime += 1
        return Batch([.putVersion(VersionRecord(id: version, ino: ino, created: file.mtime, size: file.size, chunks: [chunk],
                                                origin: .published, device: "A")), .putNode(file)],
                     expecting: [.nodeAt(ino: ino, change: change(of: one, ino))], writer: "A")
    }

    func testABatchThatStillHoldsLandsAsItWasMade() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "plain.txt", b("before"))
        try two.catchUp()
        let create = try queuedCreate(docs, "new.txt", b("made offline"))
        let publish = try queuedPublish(f, b("edited offline"))
        let (created, createdNodes) = try one.settle(create)
        XCTAssertNotNil(created, "committed")
        XCTAssertNil(createdNodes, "as it was made: every node as the batch had it")
        XCTAssertNotNil(try one.settle(publish).0)
        try two.catchUp()
        for fs in [one!, two!] {
            XCTAssertEqual(try fs.names("SugoiApp"), ["new.txt", "plain.txt"])
            assertBytes(try fs.contents("SugoiApp/new.txt"), b("made offline"))
            assertBytes(try fs.contents("SugoiApp/plain.txt"), b("edited offline"))
        }
        XCTAssertEqual(one.unresolvedConflicts(), [])
    }

    func testAMadeItemWhoseNameWasTakenIsKeptBesideIt() throws {
        let docs = try one.ino("SugoiApp")
        let queued = try queuedCreate(docs, "both.txt", b("A's"))
        try two.makeFile(try two.ino("SugoiApp"), "both.txt", b("B's"))
        try one.catchUp()
        let (seq, nodes) = try one.settle(queued)
        XCTAssertNotNil(seq)
        let made = try XCTUnwrap(queued.mutations.compactMap { m -> UInt64? in
            if case .putDirent(let d) = m { return d.child } else { return nil }
        }.first)
        XCTAssertEqual(nodes, [made], "the new file as made; the folder is not as the batch had it")
        try two.catchUp()
        for fs in [one!, two!] {
            XCTAssertEqual(try fs.names("SugoiApp"), ["both 2.txt", "both.txt"])
            assertBytes(try fs.contents("SugoiApp/both.txt"), b("B's"), "the first stays")
            assertBytes(try fs.contents("SugoiApp/both 2.txt"), b("A's"), "the queued one beside it")
            XCTAssertEqual(try fs.at("SugoiApp").nlink, try fs.at("Notes").nlink, "the folder's link count is still right")
        }
    }

    func testAPublishOverAnotherWritersEditBecomesAConflictCopy() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "report.txt", b("original"))
        try two.catchUp()
        let queued = try queuedPublish(f, b("A's edit"))
        try two.writeFile(f, b("B's edit"))
        try one.catchUp()
        try one.settle(queued)
        try two.catchUp()
        for fs in [one!, two!] {
            assertBytes(try fs.contents("SugoiApp/report.txt"), b("B's edit"), "the other's edit stays current")
            let copy = try XCTUnwrap(try fs.names("SugoiApp").first { $0.hasPrefix("report (conflict from A ") })
            assertBytes(try fs.contents("SugoiApp/" + copy), b("A's edit"), "the queued edit is kept beside it")
        }
        XCTAssertEqual(one.unresolvedConflicts().count, 1)
    }

    func testAnItemWhoseFolderWentLandsInDocuments() throws {
        let docs = try one.ino("Notes")
        let folder = try one.mkdir(parent: docs, name: b("Drafts"), mode: 0o755, caller: owner).ino
        try two.catchUp()
        let queued = try queuedCreate(folder, "idea.txt", b("written in a folder deleted elsewhere"))
        try two.rmdir(parent: try two.ino("Notes"), name: b("Drafts"))
        try one.catchUp()
        try one.settle(queued)
        try two.catchUp()
        for fs in [one!, two!] {
            XCTAssertEqual(try fs.names("Notes"), ["idea.txt"])
            assertBytes(try fs.contents("Notes/idea.txt"), b("written in a folder deleted elsewhere"))
        }
    }

    /// An atomic save (a temporary file renamed over the original) over an original another
    /// writer changed meanwhile keeps the saved file beside it as a conflict copy, not under
    /// its temporary name.
    func testAnOvertakenAtomicSaveIsKeptAsAConflictCopy() throws {
        let docs = try one.ino("SugoiApp")
        let original = try one.makeFile(docs, "essay.txt", b("first"))
        let temp = try one.makeFile(docs, ".essay.txt.swp", b("saved here"))
        try two.catchUp()
        let queued = Batch([.putDirent(DirentRecord(parent: docs, name: b("essay.txt"), child: temp)),
                            .deleteDirent(parent: docs, name: b(".essay.txt.swp")), .moveVersions(from: original, to: temp)],
                           expecting: [.nameIs(parent: docs, name: b("essay.txt"), child: original),
                                       .nameIs(parent: docs, name: b(".essay.txt.swp"), child: temp),
                                       .nodeAt(ino: original, change: change(of: one, original))], writer: "A")
        try two.writeFile(original, b("edited on B"))
        try one.catchUp()
        try one.settle(queued)
        try two.catchUp()
        for fs in [one!, two!] {
            let names = try fs.names("SugoiApp")
            XCTAssertFalse(names.contains(".essay.txt.swp"), "\(names)")
            assertBytes(try fs.contents("SugoiApp/essay.txt"), b("edited on B"))
            let copy = try XCTUnwrap(names.first { $0.hasPrefix("essay (conflict from ") }, "\(names)")
            assertBytes(try fs.contents("SugoiApp/" + copy), b("saved here"))
        }
    }

    /// An unlink of one of two links, overtaken: the name stays and so does the link count.
    func testAnOvertakenUnlinkKeepsTheLinkCount() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "a.txt", b("linked"))
        _ = try one.link(f, newParent: docs, newName: b("b.txt"))
        try two.catchUp()
        var node = try node(of: one, f)
        node.nlink = 1
        node.ctime += 1
        let queued = Batch([.deleteDirent(parent: docs, name: b("b.txt")), .putNode(node)],
                           expecting: [.nameIs(parent: docs, name: b("b.txt"), child: f), .nodeAt(ino: f, change: change(of: one, f)),
                                       .nodeAt(ino: docs, change: change(of: one, docs))], writer: "A")
        try two.makeFile(try two.ino("SugoiApp"), "other.txt", b("B's"))
        try one.catchUp()
        try one.settle(queued)
        try two.catchUp()
        for fs in [one!, two!] {
            XCTAssertEqual(try fs.names("SugoiApp"), ["a.txt", "b.txt", "other.txt"])
            XCTAssertEqual(try fs.at("SugoiApp/a.txt").nlink, 2, "both names are there, so both links count")
        }
    }

    /// A rename over what another writer changed is dropped (the other's change stands); the
    /// file stays whole where the other left it.
    func testARenameOvertakenByAnotherWriterIsDropped() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "a.txt", b("content"))
        try two.catchUp()
        let queued = Batch([.deleteDirent(parent: docs, name: b("a.txt")), .putDirent(DirentRecord(parent: docs, name: b("b.txt"), child: f))],
                           expecting: [.nameIs(parent: docs, name: b("a.txt"), child: f), .nameFree(parent: docs, name: b("b.txt"))],
                           writer: "A")
        try two.rename(parent: try two.ino("SugoiApp"), name: b("a.txt"), newParent: try two.ino("SugoiApp"), newName: b("c.txt"), flags: [])
        try one.catchUp()
        try one.settle(queued)
        try two.catchUp()
        for fs in [one!, two!] {
            XCTAssertEqual(try fs.names("SugoiApp"), ["c.txt"])
            assertBytes(try fs.contents("SugoiApp/c.txt"), b("content"))
        }
    }

    /// The queue as the model sees it: batches to settle, and files sent as they were made.
    final class FakeQueue: OfflineQueue, @unchecked Sendable {
        let lock = NSLock()
        var unsettled: [QueuedBatch] = []
        var sent: Set<InodeNumber> = []
        var settledIDs: [UInt64] = []
        var asideIDs: [UInt64] = []
        func prepare() throws(StoreError) {}
        var queued: QueueState { QueueState() }
        func sendIfDue() {}
        func nextUnsettled() -> QueuedBatch? { lock.withLock { unsettled.first } }
        func settled(_ id: UInt64, at seq: ChangeSeq?, nodes: Set<InodeNumber>?) throws(StoreError) {
            lock.withLock { unsettled.removeAll { $0.id == id }; settledIDs.append(id) }
        }
        func setAside(_ id: UInt64) { lock.withLock { unsettled.removeAll { $0.id == id }; asideIDs.append(id) } }
        func takeSent() -> Set<InodeNumber> { lock.withLock { defer { sent = [] }; return sent } }
    }

    /// A file sent as it was made, into a folder another machine put in Recently Deleted
    /// meanwhile, comes back from there; a batch that keeps failing is set aside, and the
    /// queue goes on.
    func testQueuedFilesComeBackFromRecentlyDeletedAndAStuckBatchIsSetAside() throws {
        let queue = FakeQueue()
        let three = try UbiquityFileSystem(store: BackingStore(metadata: store.metadata, blobs: store.blobs, work: MemoryWorkArea(),
                                                               locks: store.locks, offline: queue),
                                           containers: Sample.all, view: .drive, device: "C")
        let docs = try three.ino("Notes")
        let folder = try three.mkdir(parent: docs, name: b("Trip"), mode: 0o755, caller: owner).ino
        let file = try three.makeFile(folder, "plan.txt", b("day one"))
        try two.catchUp()
        try two.unlink(parent: try two.ino("Notes/Trip"), name: b("plan.txt"))
        try two.rmdir(parent: try two.ino("Notes"), name: b("Trip"))
        try three.catchUp()
        XCTAssertEqual(try three.names("Notes"), [])
        // The batch that made it landed as it was (its folder and name were unchanged then).
        queue.sent = [file]
        // A batch that can never commit: a version whose id another batch already used.
        let bad = Batch([.putVersion(VersionRecord(id: try XCTUnwrap(three.ns.read { three.state.nodes[file]?.currentVersion }),
                                                   ino: file, created: 0, size: 0, chunks: [], origin: .published, device: "C"))],
                        writer: "C")
        let good = try queuedCreate(docs, "after.txt", b("goes on"))
        queue.unsettled = [QueuedBatch(id: 1, batch: bad), QueuedBatch(id: 2, batch: good)]
        three.settleBackoff = 1_000_000   // 1 ms, doubling
        let start = Date()
        let deadline = start.addingTimeInterval(10)
        while queue.settledIDs.isEmpty && Date() < deadline {
            three.settleQueuedChanges()
            usleep(20_000)
        }
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(start), 0.015, "tried again after 1, 2, 4 and 8 ms, not at once")
        XCTAssertEqual(try three.names("Notes/Trip"), ["plan.txt"], "back in sight")
        assertBytes(try three.contents("Notes/Trip/plan.txt"), b("day one"))
        XCTAssertEqual(queue.asideIDs, [1])
        XCTAssertEqual(queue.settledIDs, [2])
        XCTAssertEqual(try three.names("Notes"), ["Trip", "after.txt"])
    }
}
