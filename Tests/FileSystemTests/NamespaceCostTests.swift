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
    /// (a removal moves the last record into the hole), each node with the commit that put it,
    /// whatever its container, kind, version, device number or symlink target.
    func testNodeTableAnswersAsADictionary() {
        var table = NodeTable()
        var model: [InodeNumber: NodeRecord] = [:]
        var changes: [InodeNumber: ChangeSeq] = [:]
        var rng = SplitMix64(seed: 20261207)   // a failure repeats
        let containers = ["iCloud.com.example.TestDrive", "c", "iCloud.com.example.SugoiApp"]
        let kinds: [NodeKind] = [.regular, .directory, .symlink, .fifo, .socket, .characterDevice, .blockDevice]
        func node(_ ino: InodeNumber, _ step: Int) -> NodeRecord {
            let kind = kinds[rng.below(kinds.count)]
            return NodeRecord(ino: ino, container: containers[rng.below(3)], kind: kind, mode: UInt32(rng.below(0o7777)),
                              uid: UInt32(rng.below(3)), gid: UInt32(rng.below(3)), nlink: UInt32(1 + rng.below(3)),
                              size: UInt64(step), atime: Int64(step), mtime: -Int64(step), ctime: Int64(step) << 20,
                              btime: Int64(rng.below(1000)),
                              rdev: kind == .characterDevice || kind == .blockDevice ? UInt64(rng.below(3)) : 0,
                              target: kind == .symlink ? Array("t\(step)".utf8) : [],
                              currentVersion: kind == .regular && rng.below(2) == 0 ? VersionID(step) : nil)
        }
        XCTAssertLessThanOrEqual(NodeTable.recordStride, 88, "a node's record is no longer packed")
        for step in 0..<20_000 {
            let ino = InodeNumber(1 + rng.below(300))
            if rng.below(3) < 2 {
                let n = node(ino, step)
                table.put(n, change: ChangeSeq(step))
                model[ino] = n
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

    /// A folder's entries answer as a dictionary would, through inserts, replacements and
    /// removals (tombstones, the table growing, the name buffer rebuilt once half of it is
    /// removed names, emptied), with names of every length a folder entry can have.
    func testFolderEntriesAnswerAsADictionary() {
        var entries = FolderEntries()
        var model: [[UInt8]: InodeNumber] = [:]
        var rng = SplitMix64(seed: 20261208)   // a failure repeats
        func name(_ k: Int) -> [UInt8] {
            // Short names and long ones (so removals leave more than the buffer's rebuild
            // threshold behind), some alike but for their last byte.
            Array(String(repeating: "n", count: k % 7 == 0 ? 200 : 1).utf8) + Array("\(k)".utf8)
        }
        func check() {
            XCTAssertEqual(Dictionary(uniqueKeysWithValues: entries.map { ($0.key, $0.value) }), model)
            XCTAssertEqual(Set(entries.keys), Set(model.keys))
            XCTAssertEqual(entries.values.sorted(), model.values.sorted())
            XCTAssertEqual(entries.isEmpty, model.isEmpty)
        }
        for step in 0..<45_000 {
            // The population grows, shrinks (to nothing, below), then grows again.
            let k = rng.below(step < 30_000 ? 2_000 : 500)
            if step >= 15_000 && step < 30_000 || rng.below(3) == 0 {
                XCTAssertEqual(entries.removeValue(forKey: name(k)), model.removeValue(forKey: name(k)))
            } else {
                entries[name(k)] = InodeNumber(step)
                model[name(k)] = InodeNumber(step)
            }
            XCTAssertEqual(entries[name(k)], model[name(k)])
            XCTAssertEqual(entries.count, model.count)
            if step % 5_000 == 0 { check() }
            if step == 29_999 {
                check()
                for key in model.keys { XCTAssertEqual(entries.removeValue(forKey: key), model.removeValue(forKey: key)) }
                check()
            }
        }
        check()
        XCTAssertNil(entries[[]])
        XCTAssertNil(FolderEntries()[Array("a".utf8)])
        // Equality is by content, not by the order names came in.
        var a: FolderEntries = [Array("x".utf8): 1, Array("y".utf8): 2]
        let b: FolderEntries = [Array("y".utf8): 2, Array("x".utf8): 1]
        XCTAssertEqual(a, b)
        a[Array("y".utf8)] = 3
        XCTAssertNotEqual(a, b)
        a[Array("y".utf8)] = nil
        XCTAssertNotEqual(a, b)
        // A child's names, found by a scan.
        var links: FolderEntries = [Array("one".utf8): 7, Array("two".utf8): 7, Array("other".utf8): 8]
        XCTAssertEqual(Set(links.names(of: 7)), [Array("one".utf8), Array("two".utf8)])
        XCTAssertEqual(links.name(of: 8), Array("other".utf8))
        XCTAssertNil(links.name(of: 9))
        links[Array("other".utf8)] = nil
        XCTAssertNil(links.name(of: 8))
        // Names no kernel passes, as a damaged store may hold them: empty, and too long for a slot.
        let huge = [UInt8](repeating: UInt8(ascii: "h"), count: FolderEntries.slotNameLimit + 1)
        var odd: FolderEntries = [[]: 3, huge: 4, Array("x".utf8): 5]
        XCTAssertEqual(odd.count, 3)
        XCTAssertEqual(odd[[]], 3)
        XCTAssertEqual(odd[huge], 4)
        XCTAssertEqual(odd.name(of: 4), huge)
        XCTAssertEqual(Dictionary(uniqueKeysWithValues: odd.map { ($0.key, $0.value) }), [[]: 3, huge: 4, Array("x".utf8): 5])
        XCTAssertEqual(odd, [huge: 4, Array("x".utf8): 5, []: 3])
        odd[huge] = 6
        XCTAssertEqual(odd[huge], 6)
        XCTAssertEqual(odd.removeValue(forKey: huge), 6)
        XCTAssertEqual(odd.removeValue(forKey: []), 3)
        XCTAssertEqual(Array(odd.values), [5])
        XCTAssertEqual(odd.removeValue(forKey: Array("x".utf8)), 5)
        XCTAssertTrue(odd.isEmpty)
    }

    /// The position index finds every key its owner put, through growth, removals (which shift
    /// later entries back) and moves, with keys dense, sparse, alike in their low bits, and
    /// beside the ids the daemon makes above inode numbers (stand-ins from 2^62).
    func testPositionIndexFindsWhatWasPut() {
        var rng = SplitMix64(seed: 20261209)   // a failure repeats
        let layouts: [(UInt64) -> InodeNumber] = [
            { 1 + $0 }, { 1 + $0 << 20 }, { 1 + $0 * 4096 }, { 1 + $0 << 48 },
            { $0 % 2 == 0 ? 1 + $0 / 2 : (1 << 62) + $0 / 2 },
        ]
        for layout in layouts {
            var index = PositionIndex()
            var keys: [InodeNumber] = []       // the owner's records, dense
            var model: Set<InodeNumber> = []
            for step in 0..<30_000 {
                let key = layout(UInt64(rng.below(step < 20_000 ? 3_000 : 300)))
                if let i = keys.firstIndex(of: key) {
                    guard rng.below(2) == 0 else { continue }
                    XCTAssertEqual(keys.withUnsafeBufferPointer { all in index.remove(key) { all[$0] } }, i)
                    if i < keys.count - 1 {
                        let moving = keys[keys.count - 1]
                        keys.withUnsafeBufferPointer { all in index.move(moving, to: i) { all[$0] } }
                        keys[i] = moving
                    }
                    keys.removeLast()
                    model.remove(key)
                } else {
                    keys.append(key)
                    keys.withUnsafeBufferPointer { all in index.insert(key, at: keys.count - 1) { all[$0] } }
                    model.insert(key)
                }
                XCTAssertEqual(index.count, keys.count)
                if step % 1_000 == 0 || step > 29_900 {
                    for (i, k) in keys.enumerated() {
                        XCTAssertEqual(keys.withUnsafeBufferPointer { all in index.find(k) { all[$0] } }, i)
                    }
                    XCTAssertNil(keys.withUnsafeBufferPointer { all in index.find(layout(5_000)) { all[$0] } })
                }
            }
            XCTAssertEqual(Set(keys), model)
        }
    }

    /// The kernel's references count up and down per node, and keep the name each node was
    /// last given by, through moves, forgets and the name buffer's compaction.
    func testKernelReferencesCountAndName() {
        var refs = KernelReferences()
        var counts: [InodeNumber: UInt64] = [:]
        var names: [InodeNumber: (InodeNumber, [UInt8])] = [:]
        var rng = SplitMix64(seed: 20261210)   // a failure repeats
        for step in 0..<40_000 {
            let ino = InodeNumber(2 + rng.below(step < 30_000 ? 1_500 : 40))
            let name = Array("entry-\(step % 97)-".utf8) + Array(repeating: UInt8(ascii: "x"), count: rng.below(80))
            switch rng.below(5) {
            case 0, 1:
                let named = rng.below(3) != 0
                refs.add(ino, parent: named ? InodeNumber(step) : nil, name: named ? name : nil)
                counts[ino, default: 0] += 1
                if named { names[ino] = (InodeNumber(step), name) }
            case 2:
                refs.moved(ino, parent: 7, name: name)
                if names[ino] != nil { names[ino] = (7, name) }
            default:
                let n = UInt64(1 + rng.below(2))
                XCTAssertEqual(refs.drop(ino, count: n), counts[ino] ?? 0)
                if let c = counts[ino], c > n { counts[ino] = c - n } else { counts[ino] = nil; names[ino] = nil }
            }
            XCTAssertEqual(refs.references(to: ino), counts[ino])
            XCTAssertEqual(refs.holds(ino), counts[ino] != nil)
            XCTAssertEqual(refs.name(of: ino)?.parent, names[ino]?.0)
            XCTAssertEqual(refs.name(of: ino)?.name, names[ino]?.1)
            XCTAssertEqual(refs.count, counts.count)
            if step % 4_000 == 0 {
                for (i, c) in counts {
                    XCTAssertEqual(refs.references(to: i), c)
                    XCTAssertEqual(refs.name(of: i)?.name, names[i]?.1)
                }
            }
        }
        for (i, c) in counts { XCTAssertEqual(refs.drop(i, count: c), c) }
        XCTAssertEqual(refs.count, 0)
        XCTAssertNil(refs.name(of: 2))
        // A name a record cannot say (from a damaged store, in a listing) leaves no hint.
        refs.add(9, parent: 1, name: Array("kept".utf8))
        refs.add(9, parent: 1, name: [UInt8](repeating: 0x61, count: 70_000))
        XCTAssertEqual(refs.references(to: 9), 2)
        XCTAssertNil(refs.name(of: 9))
        refs.add(9, parent: 1, name: [])
        XCTAssertNil(refs.name(of: 9))
        XCTAssertEqual(refs.drop(9, count: 3), 3)
    }
}
