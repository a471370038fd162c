import Foundation
import XCTest
@testable import UbiquityStore

/// `checkStore` on a memory store: a whole one has no problems; each kind of damage a commit
/// could not make (the memory store takes any mutation) is one line.
final class StoreCheckTests: XCTestCase {
    private func whole() throws -> BackingStore {
        let store = makeMemoryStore()
        let ref = try writeBlob(store.blobs, Sample.bytes(1000, seed: 3))
        var file = Sample.node(3, size: 1000, version: 7)
        file.nlink = 2
        var docs = Sample.node(2, kind: .directory)
        docs.nlink = 2
        var root = Sample.node(1, kind: .directory)
        root.nlink = 3
        _ = try store.metadata.commit(Batch([
            .putContainer(Sample.containerRecord(root: 1)), .putNode(root), .putNode(docs),
            .putDirent(DirentRecord(parent: 1, name: Array("Documents".utf8), child: 2)),
            .putVersion(VersionRecord(id: 7, ino: 3, created: 1, size: 1000, chunks: [ref], origin: .published, device: "d")),
            .putNode(file),
            .putDirent(DirentRecord(parent: 2, name: Array("a.txt".utf8), child: 3)),
            .putDirent(DirentRecord(parent: 2, name: Array("link".utf8), child: 3)),
        ], writer: "w"), durable: true)
        return store
    }

    /// Names in problem lines never carry a control character to the terminal.
    func testNamesArePrintedWithoutControlCharacters() {
        XCTAssertEqual(printableName(Array("Résumé.txt".utf8)), "'Résumé.txt'")
        XCTAssertEqual(printableName([0x61, 0x0a, 0x62]), "'a\\x0ab'")
        XCTAssertEqual(printableName([0x61, 0xc2, 0x9b, 0x62]), "'a\\xc2\\x9bb'", "C1 CSI (U+009B)")
        XCTAssertEqual(printableName([0x61, 0xe2, 0x80, 0xa8]), "'a\\xe2\\x80\\xa8'", "U+2028 LINE SEPARATOR")
        XCTAssertEqual(printableName([0x61, 0x7f]), "'a\\x7f'")
        XCTAssertEqual(printableName([0xff, 0x41]), "'\\xffA'", "not UTF-8")
    }

    func testAWholeStoreHasNoProblems() throws {
        let report = try checkStore(try whole(), full: true)
        XCTAssertEqual(report.problems, [])
        XCTAssertEqual(report.nodes, 3)
        XCTAssertEqual(report.entries, 3)
        XCTAssertTrue(report.summary.hasSuffix("no problems"), report.summary)
    }

    func testEachKindOfDamageIsOneLine() throws {
        let store = try whole()
        var file = Sample.node(3, size: 999, version: 7)
        file.nlink = 3
        var folder = Sample.node(4, kind: .directory)
        folder.nlink = 2
        _ = try store.metadata.commit(Batch([
            .putNode(file),
            .putNode(folder),   // no name
            .putDirent(DirentRecord(parent: 2, name: Array("ghost".utf8), child: 77)),
            .putXattr(XattrRecord(ino: 88, name: Array("user.k".utf8), value: [1])),
            .putVersion(VersionRecord(id: 9, ino: 55, created: 1, size: 5, chunks: [ChunkRef(blob: 0xabc, length: 5, checksum: 1)],
                                      origin: .published, device: "d")),
        ], writer: "w"), durable: true)
        let report = try checkStore(store, full: false)
        let expected = [
            "the name 'ghost' in folder 2 names inode 77, which does not exist",
            "inode 3 has link count 3 and 2 names",
            "inode 3 has size 999, and its current version 7 1000",
            "folder 4 has no name",
            "version 9 of inode 55: the inode does not exist",
            "version 9 of inode 55: chunk 0 (abc) is missing",
            "extended attribute 'user.k' of inode 88, which does not exist",
        ]
        for line in expected { XCTAssertTrue(report.problems.contains(line), "\(line) in \(report.problems)") }
        XCTAssertEqual(report.problems.count, expected.count, "\(report.problems)")
        XCTAssertTrue(report.summary.hasSuffix("\(expected.count) problems"), report.summary)
    }
}
