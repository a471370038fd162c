// The desktop's trash at the drive view's root, driven the way GIO drives it (glib's
// g_local_file_trash, then its g_file_set_contents of the info file; restore and emptying as a
// file manager does them): every step lands in Recently Deleted.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class DesktopTrashTests: XCTestCase {
    var fs: UbiquityFileSystem!
    var docs: UInt64 = 0
    var top: UInt64 = 0, files: UInt64 = 0, info: UInt64 = 0

    override func setUpWithError() throws {
        fs = try UbiquityFileSystem(store: makeMemoryStore(), containers: Sample.all, view: .drive)
        docs = try fs.ino("SugoiApp")
        let t = try fs.lookup(parent: UbiquityFileSystem.rootID, name: b(".Trash-\(getuid())"))
        XCTAssertEqual(t.kind, .directory)
        XCTAssertEqual(t.uid, getuid(), "GIO checks that its trash folder is the user's")
        XCTAssertEqual(t.mode & 0o7777, 0o700)
        top = t.ino
        // GIO makes info/ and files/, and takes EEXIST as there.
        assertErrno(EEXIST, try fs.mkdir(parent: top, name: b("info"), mode: 0o700, caller: owner))
        assertErrno(EEXIST, try fs.mkdir(parent: top, name: b("files"), mode: 0o700, caller: owner))
        files = try fs.lookup(parent: top, name: b("files")).ino
        info = try fs.lookup(parent: top, name: b("info")).ino
    }

    override func tearDown() { fs = nil }

    /// The kernel may remember a missing name only in a container's folders: the names at the
    /// mount root and in the desktop trash are worked out, not stored, and no invalidation names
    /// one that appears there.
    func testMissingNamesAreRememberedOnlyInContainerFolders() throws {
        let nope = b("nope")
        XCTAssertTrue(fs.absenceMayBeCached(in: docs, name: nope))
        let sub = try fs.mkdir(parent: docs, name: b("Sub"), mode: 0o755, caller: owner).ino
        XCTAssertTrue(fs.absenceMayBeCached(in: sub, name: nope))
        XCTAssertFalse(fs.absenceMayBeCached(in: docs, name: b("Sub")), "there")
        XCTAssertFalse(fs.absenceMayBeCached(in: try fs.makeFile(docs, "f", b("x")), name: nope), "not a folder")
        for ino in [UbiquityFileSystem.rootID, top, files, info] { XCTAssertFalse(fs.absenceMayBeCached(in: ino, name: nope), "\(ino)") }
        // A folder inside the desktop trash is a folder of the namespace: its names change only
        // through the kernel, or by a restore, which tells the kernel.
        try gioTrash(docs, "Sub")
        XCTAssertTrue(fs.absenceMayBeCached(in: sub, name: nope))
    }

    /// GIO's trashing of `name` in `dir`: claim the info name (the next `name.N.ext` while it is
    /// taken), rename the file into files/, write the info through a temporary file.
    @discardableResult
    private func gioTrash(_ dir: UInt64, _ name: String) throws -> String {
        var n = 1
        var trashName = name
        while try !claim(trashName + ".trashinfo") {
            n += 1
            trashName = String(decoding: gioUniqueName(b(name), n), as: UTF8.self)
        }
        try fs.rename(parent: dir, name: b(name), newParent: files, newName: b(trashName), flags: [])
        let tmp = trashName + ".trashinfo.XY12ZW"
        let (_, h) = try fs.create(parent: info, name: b(tmp), mode: 0o666, flags: O_CREAT | O_EXCL | O_RDWR, caller: owner)
        try fs.put(h, b("[Trash Info]\nPath=whatever\nDeletionDate=2026-12-01T10:00:00\n"), at: 0)
        try fs.fsync(handle: h, dataOnly: false)
        try fs.release(handle: h)
        try fs.rename(parent: info, name: b(tmp), newParent: info, newName: b(trashName + ".trashinfo"), flags: [])
        return trashName
    }

    /// GIO's exclusive create of an info file; false when the name is taken.
    private func claim(_ name: String) throws -> Bool {
        let result: (Attributes, UInt64)
        do { result = try fs.create(parent: info, name: b(name), mode: 0o666, flags: O_CREAT | O_EXCL | O_WRONLY, caller: owner) } catch {
            if errnoOf(error) == EEXIST { return false }
            throw error
        }
        try fs.release(handle: result.1)
        return true
    }

    private func infoText(_ name: String) throws -> String {
        let a = try fs.lookup(parent: info, name: b(name))
        let h = try fs.open(a.ino, flags: O_RDONLY)
        defer { try? fs.release(handle: h) }
        return String(decoding: try fs.get(h, at: 0, count: Int(a.size) + 10), as: UTF8.self)
    }

    func testTrashingAFileIsAMoveToRecentlyDeleted() throws {
        let drafts = try fs.mkdir(parent: docs, name: b("My Drafts"), mode: 0o755, caller: owner).ino
        let f = try fs.makeFile(drafts, "Report.txt", b("report"))
        XCTAssertEqual(try gioTrash(drafts, "Report.txt"), "Report.txt")
        XCTAssertEqual(try fs.names(drafts), [])
        XCTAssertEqual(fs.trashItems().map(\.ino), [f])
        XCTAssertEqual(fs.trashItems().first?.originalPath, "SugoiApp/My Drafts/Report.txt")
        XCTAssertEqual(try fs.names(files), ["Report.txt"])
        XCTAssertEqual(try fs.names(info), ["Report.txt.trashinfo"], "the temporary and the claim are gone")
        let text = try infoText("Report.txt.trashinfo")
        XCTAssertTrue(text.hasPrefix("[Trash Info]\nPath=SugoiApp/My%20Drafts/Report.txt\nDeletionDate=20"), text)
        XCTAssertNotNil(text.range(of: #"DeletionDate=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\n$"#, options: .regularExpression), text)
        assertBytes(try fs.contents(try fs.lookup(parent: files, name: b("Report.txt")).ino), b("report"))
        // A second file of that name: GIO's next name.
        try fs.makeFile(drafts, "Report.txt", b("second"))
        XCTAssertEqual(try gioTrash(drafts, "Report.txt"), "Report.2.txt")
        XCTAssertEqual(try fs.names(files), ["Report.2.txt", "Report.txt"])
        XCTAssertEqual(try fs.names(info), ["Report.2.txt.trashinfo", "Report.txt.trashinfo"])
        // Deleted with rm: in the trash too, under its own name made unique.
        try fs.makeFile(docs, "Report.txt", b("third"))
        try fs.unlink(parent: docs, name: b("Report.txt"))
        XCTAssertEqual(Set(try fs.names(files)), ["Report.txt", "Report.2.txt", "Report.3.txt"])
    }

    func testRestoreAndEmptyAsAFileManagerDoes() throws {
        let f = try fs.makeFile(docs, "Report.txt", b("report"))
        try gioTrash(docs, "Report.txt")
        // Restore: the file back to where the info says, then the info goes.
        try fs.rename(parent: files, name: b("Report.txt"), newParent: docs, newName: b("Report.txt"), flags: [])
        try fs.unlink(parent: info, name: b("Report.txt.trashinfo"))
        XCTAssertEqual(try fs.names(docs), ["Report.txt"])
        XCTAssertEqual(try fs.getattr(f).nlink, 1)
        XCTAssertEqual(fs.trashItems(), [])
        XCTAssertEqual(try fs.names(files), [])
        // A name taken meanwhile: the restore says so, nothing is replaced.
        try gioTrash(docs, "Report.txt")
        try fs.makeFile(docs, "Report.txt", b("new"))
        assertErrno(EEXIST, try fs.rename(parent: files, name: b("Report.txt"), newParent: docs, newName: b("Report.txt"), flags: []))
        // Empty: deleted for good.
        try fs.unlink(parent: files, name: b("Report.txt"))
        try fs.unlink(parent: info, name: b("Report.txt.trashinfo"))
        assertErrno(ENOENT, try fs.getattr(f))
        XCTAssertEqual(try fs.names(files), [])
        XCTAssertEqual(try fs.names(info), [])
    }

    /// GVfs deletes for good by moving the item into expunged/; the info GIO wrote stays
    /// readable under the number the kernel bound it to, and goes with the item.
    func testGVfsDeletesThroughExpunged() throws {
        let f = try fs.makeFile(docs, "Report.txt", b("report"))
        try gioTrash(docs, "Report.txt")
        let bound = try fs.lookup(parent: info, name: b("Report.txt.trashinfo"))
        XCTAssertTrue(try infoText("Report.txt.trashinfo").contains("Path=SugoiApp/Report.txt"))
        let expunged = try fs.lookup(parent: top, name: b("expunged")).ino
        try fs.rename(parent: files, name: b("Report.txt"), newParent: expunged, newName: b("1"), flags: [])
        assertErrno(ENOENT, try fs.getattr(f), "deleted for good")
        XCTAssertEqual(try fs.names(expunged), [])
        assertErrno(ENOENT, try fs.getattr(bound.ino), "its info went with it")
        XCTAssertEqual(try fs.names(info), [])
        try fs.makeFile(docs, "Report.txt", b("again"))
        XCTAssertEqual(try gioTrash(docs, "Report.txt"), "Report.txt", "the name is free again")
    }

    /// A folder goes whole (GIO renames it, contents and all); emptying deletes it bottom up.
    func testAFolderGoesWholeAndIsEmptiedBottomUp() throws {
        let d = try fs.mkdir(parent: docs, name: b("Project"), mode: 0o755, caller: owner).ino
        let sub = try fs.mkdir(parent: d, name: b("src"), mode: 0o755, caller: owner).ino
        try fs.makeFile(sub, "main.c", b("int main;"))
        try gioTrash(docs, "Project")
        XCTAssertEqual(try fs.names(docs), [])
        XCTAssertEqual(try fs.names(files), ["Project"])
        XCTAssertEqual(try fs.names(d), ["src"], "browsable in the trash")
        assertBytes(try fs.contents(try fs.lookup(parent: sub, name: b("main.c")).ino), b("int main;"))
        assertErrno(ENOENT, try fs.create(parent: sub, name: b("new"), mode: 0o644, flags: O_RDWR, caller: owner),
                    "nothing new goes into a deleted folder")
        assertErrno(ENOTEMPTY, try fs.rmdir(parent: files, name: b("Project")), "rmdir is rmdir, even here")
        assertErrno(EISDIR, try fs.unlink(parent: files, name: b("Project")))
        try fs.unlink(parent: sub, name: b("main.c"))
        try fs.rmdir(parent: d, name: b("src"))
        try fs.rmdir(parent: files, name: b("Project"))
        XCTAssertEqual(fs.trashItems(), [])
        XCTAssertEqual(try fs.getattr(docs).nlink, 2)
    }

    /// A trash name is chosen at the delete and never moves: restoring an older alike item leaves
    /// the later one's name as it was, so a name a listing showed still means that item.
    func testTrashNamesDoNotMove() throws {
        let a = try fs.makeFile(docs, "x.txt", b("a"))
        try fs.unlink(parent: docs, name: b("x.txt"))
        let bIno = try fs.makeFile(docs, "x.txt", b("b"))
        try fs.unlink(parent: docs, name: b("x.txt"))
        XCTAssertEqual(try fs.names(files), ["x.2.txt", "x.txt"])
        try fs.restoreFromTrash(a)
        XCTAssertEqual(try fs.names(files), ["x.2.txt"])
        XCTAssertEqual(try fs.lookup(parent: files, name: b("x.2.txt")).ino, bIno)
        assertErrno(ENOENT, try fs.unlink(parent: files, name: b("x.txt")), "not the other item")
    }

    /// GIO lists the trash again after each item it deletes: the names follow each change one
    /// by one (worked out from scratch once), and every listing shows exactly the items there.
    func testTheTrashNamesFollowEachChangeWithoutStartingOver() throws {
        var expected: Set<String> = []
        for i in 0..<300 {
            let name = "f\(i % 100).txt"   // three alike items per name
            try fs.makeFile(docs, name, b("x"))
            try fs.unlink(parent: docs, name: b(name))
            let names = try fs.names(files)
            XCTAssertEqual(names, names.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }, "in name order")
            let new = Set(names).subtracting(expected)
            XCTAssertEqual(new.count, 1, "one new name after delete \(i)")
            expected.formUnion(new)
            XCTAssertEqual(Set(names), expected)
        }
        XCTAssertTrue(expected.contains("f7.2.txt") && expected.contains("f7.3.txt"), "\(expected.sorted())")
        for name in expected.sorted() {
            try fs.unlink(parent: files, name: b(name))
            expected.remove(name)
            XCTAssertEqual(Set(try fs.names(files)), expected)
            XCTAssertEqual(Set(try fs.names(info)), Set(expected.map { $0 + ".trashinfo" }))
        }
        XCTAssertEqual(fs.trashItems(), [])
        XCTAssertLessThanOrEqual(fs.trashNameCache.lock.withLock { fs.trashNameCache.rebuilds }, 2,
                                 "a rebuild at the first listing (and one when the edits kept run out)")
    }

    /// However an item comes or goes (a plain unlink, the CLI's restore), files/ and info/ get a
    /// new mtime (GVfs lists them again only then) and the kernel is told to drop what it holds.
    func testTheTrashFoldersChangeWithRecentlyDeleted() throws {
        _ = try fs.catchUp()
        let before = try fs.getattr(files).mtime
        try fs.makeFile(docs, "gone.txt", b("x"))
        _ = try fs.catchUp()
        tick()
        try fs.unlink(parent: docs, name: b("gone.txt"))
        let afterDelete = try fs.getattr(files).mtime
        XCTAssertGreaterThan(afterDelete, before)
        XCTAssertEqual(try fs.getattr(info).mtime, afterDelete)
        let told = try fs.catchUp()
        for expected: KernelInvalidation in [.node(files), .node(info), .entry(parent: files, name: b("gone.txt")),
                                             .entry(parent: info, name: b("gone.txt.trashinfo"))] {
            XCTAssertTrue(told.contains(expected), "\(expected) in \(told)")
        }
        tick()
        let item = fs.trashItems(container: nil).first!
        _ = try fs.restoreFromTrash(item.ino)
        XCTAssertGreaterThan(try fs.getattr(files).mtime, afterDelete)
        XCTAssertTrue(try fs.catchUp().contains(.entry(parent: files, name: b("gone.txt"))))
    }

    func testNothingElseAtTheRoot() throws {
        assertErrno(ENOENT, try fs.lookup(parent: UbiquityFileSystem.rootID, name: b(".Trash-12345")), "another user's")
        assertErrno(ENOENT, try fs.lookup(parent: UbiquityFileSystem.rootID, name: b(".Trash")))
        assertErrno(EACCES, try fs.mkdir(parent: UbiquityFileSystem.rootID, name: b(".Trash-12345"), mode: 0o700, caller: owner))
        assertErrno(EEXIST, try fs.mkdir(parent: UbiquityFileSystem.rootID, name: b(".Trash-\(getuid())"), mode: 0o700, caller: owner))
        assertErrno(EPERM, try fs.mkdir(parent: top, name: b("other"), mode: 0o700, caller: owner))
        assertErrno(EPERM, try fs.create(parent: files, name: b("x"), mode: 0o644, flags: O_RDWR, caller: owner))
        assertErrno(EPERM, try fs.rmdir(parent: top, name: b("files")))
        XCTAssertEqual(try fs.names(top), ["expunged", "files", "info"])
        assertErrno(EEXIST, try fs.mkdir(parent: top, name: b("expunged"), mode: 0o700, caller: owner), "GVfs makes it")
        // One name of a hard-linked file is not the file: the file manager may delete just it.
        let f = try fs.makeFile(docs, "a", b("x"))
        _ = try fs.link(f, newParent: docs, newName: b("b"))
        assertErrno(EXDEV, try fs.rename(parent: docs, name: b("a"), newParent: files, newName: b("a"), flags: []))
        // The container folders at the root are not the user's to trash.
        assertErrno(EACCES, try fs.rename(parent: UbiquityFileSystem.rootID, name: b("TestDrive"), newParent: files,
                                          newName: b("TestDrive"), flags: []))
        XCTAssertFalse(try fs.names(UbiquityFileSystem.rootID).contains(".Trash-\(getuid())"), "not listed: only GIO asks for it")
        // The app view has none.
        let app = try UbiquityFileSystem(store: makeMemoryStore(), containers: Sample.all, view: .app(bundleIdentifier: Sample.sugoi.bundleIdentifier))
        assertErrno(ENOENT, try app.lookup(parent: UbiquityFileSystem.rootID, name: b(".Trash-\(getuid())")))
    }
}
