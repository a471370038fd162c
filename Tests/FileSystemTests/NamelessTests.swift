// Files and folders whose last name is gone while the kernel still refers to them (an O_PATH
// descriptor, a dentry not yet forgotten): they stay usable, are never published, leave no
// content behind once forgotten, and the versions they still show are never pruned. These are
// deletes for real, so outside Documents (an app's private data, through the app view): inside
// it a delete is a move to Recently Deleted (RecentlyDeletedTests).

import Foundation
import XCTest
import UbiquityFileSystem
import UbiquityStore

final class NamelessTests: XCTestCase {
    private func open() throws -> (UbiquityFileSystem, BackingStore, UInt64) {
        let store = makeMemoryStore()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .app(bundleIdentifier: Sample.sugoi.bundleIdentifier))
        return (fs, store, try fs.ino(Sample.sugoi.identifier))
    }

    func testUnlinkedFileKeepsItsBytesWhileReferencedAndLeavesNothingWhenForgotten() throws {
        let (fs, store, docs) = try open()
        let blobs = store.blobs as! MemoryBlobStore
        let (attrs, h) = try fs.create(parent: docs, name: b("p"), mode: 0o644, flags: O_RDWR, caller: owner)
        fs.remember(attrs.ino)                       // the kernel's reference from the create reply
        try fs.put(h, b("data"), at: 0)
        try fs.unlink(parent: docs, name: b("p"))
        try fs.release(handle: h)
        XCTAssertEqual(blobs.blobIDs.count, 0, "a nameless file is not published")
        XCTAssertEqual(try fs.getattr(attrs.ino).nlink, 0)

        // Reopened by node (as through /proc/self/fd of an O_PATH descriptor): same bytes.
        let again = try fs.open(attrs.ino, flags: O_RDONLY)
        assertBytes(try fs.get(again, at: 0, count: 10), b("data"))
        try fs.release(handle: again)

        fs.forget(attrs.ino, count: 1)
        assertErrno(ENOENT, try fs.getattr(attrs.ino), "gone once forgotten")
        XCTAssertEqual(blobs.blobIDs.count, 0)
        XCTAssertEqual(try store.work.leftovers().count, 0, "its working copy is removed too")
    }

    /// A removed folder that is still a process's working folder: stat works (link count 0),
    /// creating in it fails with ENOENT, and it is gone once the kernel forgets it.
    func testRemovedFolderLivesWhileReferenced() throws {
        let (fs, _, docs) = try open()
        let d = try fs.mkdir(parent: docs, name: b("d"), mode: 0o755, caller: owner).ino
        fs.remember(d)
        try fs.rmdir(parent: docs, name: b("d"))
        XCTAssertEqual(try fs.getattr(d).nlink, 0)
        XCTAssertEqual(try fs.names(d), [])
        assertErrno(ENOENT, try fs.create(parent: d, name: b("x"), mode: 0o644, flags: O_RDWR, caller: owner),
                    "create in a removed folder")
        fs.forget(d, count: 1)
        assertErrno(ENOENT, try fs.getattr(d), "gone once forgotten")
    }

    func testVersionShownByAReplacedFileIsNeverPruned() throws {
        let (fs, store, docs) = try open()
        fs.versionsToKeep = 2
        try fs.makeFile(docs, "t1", b("one"))
        let old = try fs.makeFile(docs, "t2", b("two"))
        fs.remember(old)                               // an O_PATH descriptor on t2
        try fs.rename(parent: docs, name: b("t1"), newParent: docs, newName: b("t2"), flags: [])
        let replacement = try fs.ino(Sample.sugoi.identifier + "/t2")
        for i in 0..<20 { try fs.writeFile(replacement, b("v\(i)")) }
        XCTAssertLessThan(try store.metadata.versions(of: replacement).count, 10, "pruning ran")
        assertBytes(try fs.contents(old), b("two"), "the replaced file still reads its content")
        fs.forget(old, count: 1)
        assertBytes(try fs.contents(Sample.sugoi.identifier + "/t2"), b("v19"))
    }
}
