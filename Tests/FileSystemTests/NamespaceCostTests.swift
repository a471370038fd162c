// What a metadata change costs must not depend on how big the namespace is. Timing that belongs in
// `scripts/bench`; here the tables' storage identity shows whether a change copied them.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class NamespaceCostTests: XCTestCase {
    func testChangesDoNotCopyTheNamespace() throws {
        let fs = try UbiquityFileSystem(store: makeMemoryStore(), containers: Sample.all, view: .drive)
        let docs = try fs.ino("SugoiApp")
        var files: [UInt64] = []
        for i in 0..<300 { files.append(try fs.makeFile(docs, "f\(i)", b("x"))) }
        let folder = try fs.mkdir(parent: docs, name: b("folder"), mode: 0o755, caller: owner).ino
        try fs.setxattr(files[0], name: b("user.tag"), value: b("one"), flags: 0)

        try fs.unlink(parent: docs, name: b("f5"))   // makes the container's Recently Deleted
        // Changes that add no entry to any table, so no table needs to grow.
        let before = fs.namespaceStorageIdentity
        _ = try fs.setattr(files[1], AttributeChanges(mode: 0o600), handle: nil, caller: owner)
        XCTAssertEqual(fs.namespaceStorageIdentity, before, "chmod copied the namespace")
        try fs.rename(parent: docs, name: b("f2"), newParent: docs, newName: b("renamed"), flags: [])
        try fs.setxattr(files[0], name: b("user.tag"), value: b("two"), flags: 0)
        try fs.unlink(parent: docs, name: b("f3"))
        try fs.rmdir(parent: docs, name: b("folder"))
        try fs.writeFile(files[4], b("content"))   // a publish
        XCTAssertEqual(fs.namespaceStorageIdentity, before, "a change copied the namespace")
        _ = folder
    }

    /// The node table answers as a dictionary would, through puts, replacements and removals
    /// (a removal moves the last record into the hole), each node with the commit that put it.
    func testNodeTableAnswersAsADictionary() {
        var table = NodeTable()
        var model: [InodeNumber: NodeRecord] = [:]
        var changes: [InodeNumber: ChangeSeq] = [:]
        var rng = SplitMix64(seed: 20261207)   // a failure repeats
        func node(_ ino: InodeNumber, _ size: UInt64) -> NodeRecord {
            NodeRecord(ino: ino, container: "c", kind: .regular, mode: 0o644, uid: 0, gid: 0, nlink: 1, size: size,
                       atime: 0, mtime: 0, ctime: 0, btime: 0)
        }
        for step in 0..<20_000 {
            let ino = InodeNumber(1 + rng.below(300))
            if rng.below(3) < 2 {
                table.put(node(ino, UInt64(step)), change: ChangeSeq(step))
                model[ino] = node(ino, UInt64(step))
                changes[ino] = ChangeSeq(step)
            } else {
                table.remove(ino)
                model[ino] = nil
                changes[ino] = nil
            }
            XCTAssertEqual(table[ino], model[ino])
            XCTAssertEqual(table.change(of: ino), changes[ino])
        }
        XCTAssertEqual(table.count, model.count)
        for ino in model.keys { XCTAssertEqual(table.change(of: ino), changes[ino]) }
        XCTAssertEqual(Dictionary(uniqueKeysWithValues: table.map { ($0.key, $0.value) }), model)
        XCTAssertEqual(Set(table.values.map(\.ino)), Set(model.keys))
        for ino in model.keys { table.remove(ino) }
        XCTAssertTrue(table.isEmpty)
        XCTAssertNil(table[1])
    }
}
