import Foundation
import XCTest
@testable import UbiquitySharedStore
@testable import UbiquityStore

/// What lets a shared-store daemon start while its servers are out of reach: this machine's
/// copy of the namespace, and ids reserved ahead kept on disk. No servers needed: a memory store
/// stands in for them.
final class LocalCopyTests: XCTestCase {
    private var folder = ""

    override func setUpWithError() throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("localcopy-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: folder)
    }

    private func commit(_ server: MetadataStore, _ mutations: [Mutation]) throws -> ChangeRecord {
        let seq = try server.commit(Batch(mutations, writer: "w"), durable: false)
        return ChangeRecord(seq: seq, writer: "w", mutations: mutations)
    }

    /// The copy follows the stream the model applies (a load, then records and this machine's
    /// commits, which may come before the records between) and holds exactly the servers' state
    /// at its position, also once opened again.
    func testTheCopyHoldsTheStateAtItsPosition() throws {
        let server = makeMemoryStore().metadata
        let replica = try LocalReplica(path: folder + "/replica.sqlite", log: { _ in })
        XCTAssertNil(try replica.load(), "no copy before the first load")
        _ = try commit(server, [.putContainer(Sample.containerRecord(root: 1)), .putNode(Sample.node(1, kind: .directory))])
        replica.reset(to: try server.load())
        var mark = try server.changes(since: 0).last!.seq

        // Another machine's commit, then this machine's, which the model hears of first.
        let theirs = try commit(server, [.putNode(Sample.node(2, size: 5, version: 20)),
                                         .putVersion(Sample.version(20, ino: 2)),
                                         .putDirent(DirentRecord(parent: 1, name: Array("a".utf8), child: 2)),
                                         .putXattr(XattrRecord(ino: 2, name: Array("user.k".utf8), value: [7]))])
        let mine = try commit(server, [.putNode(Sample.node(3, kind: .directory)),
                                       .putDirent(DirentRecord(parent: 1, name: Array("d".utf8), child: 3)),
                                       .setMeta(key: "k", value: "v")])
        replica.committed(mine)
        XCTAssertEqual(try replica.load()?.seq, mark, "this machine's commit waits for the one before it")
        replica.read([theirs, mine], after: mark)
        XCTAssertEqual(try replica.load()?.seq, mine.seq)
        // A new version replaces the old one; a deleted node goes with its names and attributes.
        mark = mine.seq
        let edit = try commit(server, [.putVersion(Sample.version(21, ino: 2)), .putNode(Sample.node(2, size: 9, version: 21)),
                                       .deleteDirent(parent: 1, name: Array("d".utf8)), .deleteNode(3), .deleteMeta(key: "k")])
        replica.committed(edit)
        assertSameContent(try XCTUnwrap(replica.load()), try server.load())
        XCTAssertEqual(try replica.load()?.seq, edit.seq)
        XCTAssertEqual(try replica.load()?.nodeChangesByIno(), try server.load().nodeChangesByIno())
        XCTAssertEqual(replica.version(21)?.size, Sample.version(21, ino: 2).size)
        XCTAssertNil(replica.version(20), "only current versions are kept")

        let reopened = try LocalReplica(path: folder + "/replica.sqlite", log: { _ in })
        assertSameContent(try XCTUnwrap(reopened.load()), try server.load())
        XCTAssertEqual(try reopened.load()?.seq, edit.seq)

        // Settled for queued changes, it stays as it is until the next load replaces it.
        XCTAssertEqual(replica.settle(), edit.seq)
        let later = try commit(server, [.putNode(Sample.node(4))])
        replica.committed(later)
        replica.read([later], after: edit.seq)
        XCTAssertEqual(try replica.load()?.seq, edit.seq)
        replica.reset(to: try server.load())
        XCTAssertEqual(try replica.load()?.seq, later.seq)
    }

    /// Records that skip past the copy's position mean it missed some: it is dropped, and stays
    /// dropped when opened again, rather than showing a state the servers never had.
    func testACopyThatMissedRecordsIsDropped() throws {
        let server = makeMemoryStore().metadata
        let lines = LockedBox<[String]>([])
        let replica = try LocalReplica(path: folder + "/replica.sqlite", log: { line in lines.update { $0.append(line) } })
        _ = try commit(server, [.putNode(Sample.node(1, kind: .directory))])
        replica.reset(to: try server.load())
        let missed = try commit(server, [.putNode(Sample.node(2))])
        let next = try commit(server, [.putNode(Sample.node(3))])
        replica.read([next], after: missed.seq)
        XCTAssertNil(replica.settle())
        XCTAssertNil(try replica.load())
        XCTAssertTrue(lines.value.contains { $0.contains("copy of the namespace is dropped") }, "\(lines.value)")
        XCTAssertNil(try LocalReplica(path: folder + "/replica.sqlite", log: { _ in }).load())
        // The next load makes it whole again.
        replica.reset(to: try server.load())
        assertSameContent(try XCTUnwrap(replica.load()), try server.load())
    }

    /// Ids reserved ahead are kept on disk before any is handed out: a daemon killed at any
    /// point, started again (while the servers are out of reach, or not), never hands out an id
    /// twice, and wastes at most a step of them.
    func testReservedIdsAreNeverHandedOutTwiceAcrossKills() throws {
        var counter: Int64 = 100
        let reserve = { (n: Int) throws(StoreError) -> ClosedRange<Int64> in
            defer { counter += Int64(n) }
            return (counter + 1)...(counter + Int64(n))
        }
        let path = folder + "/inodes.ids"
        var handedOut: Set<Int64> = []
        var seed: UInt64 = 9   // a fixed LCG sequence, so a failure repeats
        func next() -> UInt64 {
            seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return seed >> 33
        }
        var offline = 0
        for round in 0..<8 {
            // Every other round starts out of reach: only what the file kept can be handed out,
            // until it is used up.
            let online = round % 2 == 0
            let ids = try IDReserve(path: path, batch: 600, low: 100, reserve: reserve)
            if online { try ids.prime() }
            for _ in 0..<(5 + Int(next() % 40)) {
                let r: ClosedRange<Int64>
                do { r = try ids.take(Int(1 + next() % 30), online: online) } catch {
                    XCTAssertFalse(online, "\(error)")
                    break
                }
                if !online { offline += r.count }
                for id in r { XCTAssertTrue(handedOut.insert(id).inserted, "id \(id) handed out twice (round \(round))") }
            }
            // Killed: whatever memory had is gone.
        }
        XCTAssertGreaterThan(offline, 0, "the file served ids while out of reach")
        // A write of the file that fails hands nothing out, and what follows is still written first.
        let aside = folder + "/aside"
        try FileManager.default.createDirectory(atPath: aside, withIntermediateDirectories: true)
        let failing = try IDReserve(path: aside + "/f.ids", batch: 300, low: 10, reserve: reserve)
        try failing.prime()
        for _ in 0..<3 { for id in try failing.take(100, online: false) { XCTAssertTrue(handedOut.insert(id).inserted) } }
        try FileManager.default.removeItem(atPath: aside)
        XCTAssertThrowsError(try failing.take(100, online: true), "the file cannot be written")
        try FileManager.default.createDirectory(atPath: aside, withIntermediateDirectories: true)
        for id in try failing.take(5, online: true) { XCTAssertTrue(handedOut.insert(id).inserted) }
        let after = try IDReserve(path: aside + "/f.ids", batch: 300, low: 10, reserve: reserve)
        for id in try after.take(50, online: false) { XCTAssertTrue(handedOut.insert(id).inserted, "id \(id) handed out twice") }
        XCTAssertLessThanOrEqual(Int64(handedOut.count), counter - 100, "only reserved ids are handed out")
        // Out of reach with the file used up: a clear failure, not a made-up id.
        let dry = try IDReserve(path: folder + "/dry.ids", reserve: { _ throws(StoreError) in
            throw StoreError(.unavailable, "out of reach")
        })
        XCTAssertThrowsError(try dry.take(1, online: false)) { error in
            XCTAssertEqual((error as? StoreError)?.kind, .unavailable)
        }
    }
}
