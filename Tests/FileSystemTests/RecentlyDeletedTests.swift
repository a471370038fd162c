// Recently Deleted: a delete in Documents is a move into the container's Recently Deleted, undone
// by `restoreFromTrash`, emptied by `emptyTrash` or after the retention's `deletedFor`; an app's private
// data outside Documents is deleted for real.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class RecentlyDeletedTests: XCTestCase {
    var store: BackingStore!
    var fs: UbiquityFileSystem!
    var docs: UInt64 = 0
    let day: Int64 = 86_400 * 1_000_000_000

    override func setUpWithError() throws {
        store = makeMemoryStore()
        fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "A")
        docs = try fs.ino("SugoiApp")
    }

    override func tearDown() {
        fs = nil
        store = nil
    }

    func testADeletedFileComesBackWithItsHistory() throws {
        let drafts = try fs.mkdir(parent: docs, name: b("Drafts"), mode: 0o755, caller: owner).ino
        let f = try fs.makeFile(drafts, "a.txt", b("one"))
        try fs.writeFile(f, b("two"))
        try fs.unlink(parent: drafts, name: b("a.txt"))
        XCTAssertEqual(try fs.names(drafts), [])
        let items = fs.trashItems()
        XCTAssertEqual(items.map(\.originalPath), ["SugoiApp/Drafts/a.txt"])
        XCTAssertEqual(items.first?.size, 3)
        XCTAssertEqual(items.first?.device, "A")
        XCTAssertEqual(fs.trashItems(container: "TestDrive"), [])
        XCTAssertEqual(fs.trashItems(container: Sample.sugoi.identifier).count, 1)
        XCTAssertEqual(try fs.restoreFromTrash(f), "SugoiApp/Drafts/a.txt")
        assertBytes(try fs.contents("SugoiApp/Drafts/a.txt"), b("two"))
        XCTAssertEqual(try fs.getattr(f).nlink, 1)
        XCTAssertEqual(try store.metadata.versions(of: f).count, 2, "its versions came with it")
        XCTAssertEqual(fs.trashItems(), [])
        assertErrno(ENOENT, try fs.restoreFromTrash(f))
    }

    func testARestoreNeverReplacesWhatTookTheName() throws {
        let f = try fs.makeFile(docs, "Report.txt", b("old"))
        try fs.unlink(parent: docs, name: b("Report.txt"))
        try fs.makeFile(docs, "Report.txt", b("new"))
        XCTAssertEqual(try fs.restoreFromTrash(f), "SugoiApp/Report 2.txt")
        assertBytes(try fs.contents("SugoiApp/Report.txt"), b("new"))
        assertBytes(try fs.contents("SugoiApp/Report 2.txt"), b("old"))
        XCTAssertEqual(String(decoding: freeName(b("Makefile")) { $0 == b("Makefile") || $0 == b("Makefile 2") }, as: UTF8.self),
                       "Makefile 3")
        // Within the name limit whatever the name: a long stem is shortened, and an extension
        // too long to keep a stem beside it counts as no extension.
        let longStem = String(repeating: "s", count: 250) + ".txt"
        XCTAssertEqual(String(decoding: nameInserting(" 2", into: b(longStem)), as: UTF8.self), String(repeating: "s", count: 249) + " 2.txt")
        let longExtension = "a." + String(repeating: "e", count: 253)
        XCTAssertEqual(String(decoding: nameInserting(" 2", into: b(longExtension)), as: UTF8.self), String(longExtension.prefix(253)) + " 2")
        XCTAssertEqual(nameInserting(" 12", into: b("." + String(repeating: "x", count: 254))).count, 255)
    }

    /// `rm -rf` deletes file by file, then the folders: restoring the top folder brings back
    /// the whole tree.
    func testAFolderComesBackWithWhatWasDeletedFromIt() throws {
        let top = try fs.mkdir(parent: docs, name: b("Project"), mode: 0o755, caller: owner).ino
        let sub = try fs.mkdir(parent: top, name: b("src"), mode: 0o755, caller: owner).ino
        try fs.makeFile(top, "README", b("read me"))
        try fs.makeFile(sub, "main.c", b("int main;"))
        let before = try fs.getattr(docs).nlink
        try fs.unlink(parent: sub, name: b("main.c"))
        try fs.rmdir(parent: top, name: b("src"))
        try fs.unlink(parent: top, name: b("README"))
        try fs.rmdir(parent: docs, name: b("Project"))
        XCTAssertEqual(try fs.names(docs), [])
        XCTAssertEqual(try fs.getattr(docs).nlink, before - 1)
        XCTAssertEqual(Set(fs.trashItems().map(\.originalPath)),
                       ["SugoiApp/Project", "SugoiApp/Project/src", "SugoiApp/Project/README", "SugoiApp/Project/src/main.c"])
        XCTAssertEqual(try fs.restoreFromTrash(top), "SugoiApp/Project")
        assertBytes(try fs.contents("SugoiApp/Project/README"), b("read me"))
        assertBytes(try fs.contents("SugoiApp/Project/src/main.c"), b("int main;"))
        XCTAssertEqual(try fs.getattr(docs).nlink, before)
        XCTAssertEqual(try fs.getattr(top).nlink, 3)
        XCTAssertEqual(fs.trashItems(), [])
    }

    /// Restoring an item whose folder was deleted restores that folder first; one whose folder is
    /// gone for good goes to Documents.
    func testAnItemWhoseFolderWentComesBackSomewhere() throws {
        let d = try fs.mkdir(parent: docs, name: b("d"), mode: 0o755, caller: owner).ino
        let f = try fs.makeFile(d, "f.txt", b("x"))
        try fs.unlink(parent: d, name: b("f.txt"))
        try fs.rmdir(parent: docs, name: b("d"))
        XCTAssertEqual(try fs.restoreFromTrash(f), "SugoiApp/d/f.txt", "its folder came back first")
        try fs.unlink(parent: d, name: b("f.txt"))
        try fs.rmdir(parent: docs, name: b("d"))
        XCTAssertEqual(try fs.emptyTrash(d), 1)
        XCTAssertEqual(try fs.restoreFromTrash(f), "SugoiApp/f.txt")
    }

    func testItemsExpireAfterTheRetention() throws {
        var now = nowNanoseconds()
        let clock = LockedClock(now)
        fs.clock = { clock.now }
        let old = try fs.makeFile(docs, "old.txt", b("old"))
        try fs.unlink(parent: docs, name: b("old.txt"))
        now += 20 * day
        clock.now = now
        let young = try fs.makeFile(docs, "young.txt", b("young"))
        try fs.unlink(parent: docs, name: b("young.txt"))
        now += 11 * day
        clock.now = now
        try fs.collectGarbage()
        XCTAssertEqual(fs.trashItems().map(\.ino), [young], "31 days gone, 11 days kept")
        assertErrno(ENOENT, try fs.getattr(old))
        XCTAssertEqual(try store.metadata.versions(of: old), [])
        fs.retention.deletedFor = 7 * day
        try fs.collectGarbage()
        XCTAssertEqual(fs.trashItems(), [])
        XCTAssertEqual((store.blobs as! MemoryBlobStore).blobIDs.count, 0, "their content is freed")
    }

    /// What `fsck --repair` rescued into lost+found was never deleted by anyone: it stays past
    /// the retention, until someone empties Recently Deleted.
    func testWhatARepairRescuedNeverExpires() throws {
        let clock = LockedClock(nowNanoseconds())
        let f = try fs.makeFile(docs, "kept.txt", b("kept"))
        fs = nil
        // The name goes behind the store's back: the file has a link count and no name.
        try store.metadata.commit(Batch([.deleteDirent(parent: docs, name: b("kept.txt"))]), durable: true)
        let repair = try repairStore(store, writer: TrashRecord.repairWriter(device: "test"))
        XCTAssertTrue(repair.done.contains { $0.contains("moved inode \(f)") }, "\(repair.done)")
        fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "A")
        fs.clock = { clock.now }
        XCTAssertEqual(fs.trashItems().map(\.originalPath), ["SugoiApp/lost+found"])
        clock.now += 400 * day
        try fs.collectGarbage()
        XCTAssertEqual(fs.trashItems().map(\.originalPath), ["SugoiApp/lost+found"], "kept past the retention")
        XCTAssertEqual(try fs.emptyTrash(), 1, "emptying takes it")
    }

    /// A record reads back as written (any bytes in its names, a writer of several words), a
    /// repair's is told apart, and a damaged one is no record.
    func testARecordReadsBackAsWritten() throws {
        let r = TrashRecord(ino: 42, parent: 7, name: [0x52, 0x20, 0xc3, 0xa9, 0xff], deleted: 1_765_000_000_123_456_789,
                            trashName: b("R.2"), writer: "laptop daemon pid 12")
        XCTAssertEqual(TrashRecord(key: r.key, value: r.value), r)
        XCTAssertFalse(r.isRescued)
        let bare = TrashRecord(ino: 43, parent: 7, name: b("x"), deleted: 5, writer: "")
        XCTAssertEqual(TrashRecord(key: bare.key, value: bare.value), bare)
        let rescued = TrashRecord(ino: 44, parent: 7, name: b("y"), deleted: 5, writer: TrashRecord.repairWriter(device: "d"))
        XCTAssertTrue(TrashRecord(key: rescued.key, value: rescued.value)!.isRescued)
        XCTAssertFalse(TrashRecord(ino: 45, parent: 7, name: b("z"), deleted: 5, writer: "fsck-repair").isRescued, "the second word only")
        for bad in ["7 5 7", "7 5 7g -", "x 5 78 -", "7 5", ""] {
            XCTAssertNil(TrashRecord(key: "deleted.46", value: bad), bad)
        }
        XCTAssertNil(TrashRecord(key: "other.46", value: r.value))
    }

    func testEmptyOlderThan() throws {
        let clock = LockedClock(nowNanoseconds())
        fs.clock = { clock.now }
        try fs.makeFile(docs, "a", b("a"))
        try fs.unlink(parent: docs, name: b("a"))
        clock.now += 3 * day
        let bIno = try fs.makeFile(docs, "b", b("b"))
        try fs.unlink(parent: docs, name: b("b"))
        XCTAssertEqual(try fs.emptyTrash(deletedBefore: clock.now - 2 * day), 1)
        XCTAssertEqual(fs.trashItems().map(\.ino), [bIno])
        XCTAssertEqual(try fs.emptyTrash(container: "TestDrive"), 0)
        XCTAssertEqual(try fs.emptyTrash(), 1)
    }

    /// The app view shows the container whole: Recently Deleted is not in it, its name cannot be
    /// taken, Documents deletes are trashed and private data is deleted for real.
    func testTheAppViewNeitherShowsNorTrashesPrivateData() throws {
        let app = try UbiquityFileSystem(store: store, containers: Sample.all, view: .app(bundleIdentifier: Sample.sugoi.bundleIdentifier))
        let root = try app.ino(Sample.sugoi.identifier)
        let appDocs = try app.ino(Sample.sugoi.identifier + "/Documents")
        let priv = try app.makeFile(root, "cache.db", b("private"))
        try app.makeFile(appDocs, "doc.txt", b("doc"))
        try app.unlink(parent: appDocs, name: b("doc.txt"))
        XCTAssertEqual(app.trashItems().map(\.originalPath), ["SugoiApp/doc.txt"])
        XCTAssertEqual(try app.names(root), ["Documents", "cache.db"], "Recently Deleted is the store's")
        assertErrno(ENOENT, try app.lookup(parent: root, name: recentlyDeletedName))
        assertErrno(EEXIST, try app.mkdir(parent: root, name: recentlyDeletedName, mode: 0o755, caller: owner))
        assertErrno(EEXIST, try app.create(parent: root, name: recentlyDeletedName, mode: 0o644, flags: O_CREAT | O_RDWR, caller: owner),
                    "not beside it as Name 2 either")
        try app.unlink(parent: root, name: b("cache.db"))
        assertErrno(ENOENT, try app.getattr(priv), "deleted for real")
        XCTAssertEqual(app.trashItems().count, 1)
    }

    func testAnotherWriterSeesAndRestores() throws {
        let two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
        let f = try fs.makeFile(docs, "shared.txt", b("both"))
        try fs.unlink(parent: docs, name: b("shared.txt"))
        try two.catchUp()
        XCTAssertEqual(two.trashItems().map(\.ino), [f])
        try two.restoreFromTrash(f)
        try fs.catchUp()
        assertBytes(try fs.contents("SugoiApp/shared.txt"), b("both"))
    }

    /// Deleted on one device while the other edits it: the edit survives as the file.
    func testAnEditBringsBackWhatAnotherDeviceDeletedMeanwhile() throws {
        let two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
        let f = try fs.makeFile(docs, "Report.txt", b("draft"))
        try two.catchUp()
        let h = try two.open(f, flags: O_RDWR)
        try two.put(h, b("DRAFT, edited on B"), at: 0)
        try fs.unlink(parent: docs, name: b("Report.txt"))   // A deletes it meanwhile
        try two.catchUp()
        try two.release(handle: h)
        assertBytes(try two.contents("SugoiApp/Report.txt"), b("DRAFT, edited on B"))
        XCTAssertEqual(two.trashItems(), [])
        try fs.catchUp()
        assertBytes(try fs.contents("SugoiApp/Report.txt"), b("DRAFT, edited on B"), "back on A too")
        // Its own delete of a file it has open is this writer's choice: it stays deleted.
        let g = try fs.makeFile(docs, "scratch", b("x"))
        let hg = try fs.open(g, flags: O_RDWR)
        try fs.unlink(parent: docs, name: b("scratch"))
        try fs.put(hg, b("y"), at: 1)
        try fs.release(handle: hg)
        XCTAssertEqual(fs.trashItems().map(\.ino), [g])
    }

    /// Restoring one file of a deleted folder brings back the folder alone: the other items
    /// deleted from it stay in Recently Deleted, and come back with the folder only when the
    /// folder itself is restored.
    func testRestoringOneFileOfADeletedFolderLeavesItsSiblings() throws {
        let d = try fs.mkdir(parent: docs, name: b("Project"), mode: 0o755, caller: owner).ino
        let a = try fs.makeFile(d, "a.txt", b("a"))
        try fs.makeFile(d, "b.txt", b("b"))
        for name in ["a.txt", "b.txt"] { try fs.unlink(parent: d, name: b(name)) }
        try fs.rmdir(parent: docs, name: b("Project"))
        XCTAssertEqual(try fs.restoreFromTrash(a), "SugoiApp/Project/a.txt")
        XCTAssertEqual(try fs.names(d), ["a.txt"])
        XCTAssertEqual(fs.trashItems().map(\.originalPath), ["SugoiApp/Project/b.txt"])
    }

    /// `rm -rf` of a folder on one device while the other edits a file in it: the edit brings
    /// that file back, in its folder; the rest stays deleted.
    func testAnEditBringsBackItsFileFromAFolderAnotherDeviceRemoved() throws {
        let two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
        let d = try fs.mkdir(parent: docs, name: b("Project"), mode: 0o755, caller: owner).ino
        let notes = try fs.makeFile(d, "notes.txt", b("notes"))
        try fs.makeFile(d, "other.txt", b("other"))
        try two.catchUp()
        let h = try two.open(notes, flags: O_RDWR)
        try two.put(h, b("NOTES"), at: 0)
        for name in ["notes.txt", "other.txt"] { try fs.unlink(parent: d, name: b(name)) }
        try fs.rmdir(parent: docs, name: b("Project"))
        try two.catchUp()
        try two.release(handle: h)
        try fs.catchUp()
        assertBytes(try fs.contents("SugoiApp/Project/notes.txt"), b("NOTES"))
        XCTAssertEqual(try fs.names(d), ["notes.txt"])
        XCTAssertEqual(fs.trashItems().map(\.originalPath), ["SugoiApp/Project/other.txt"])
    }

    /// A folder moved to Recently Deleted whole (as the desktop's trash takes it) on one device
    /// while the other edits a file deep inside: the edit brings the folder back.
    func testAnEditBringsBackAFolderAnotherDeviceTrashedWhole() throws {
        let two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
        let d = try fs.mkdir(parent: docs, name: b("Project"), mode: 0o755, caller: owner).ino
        let src = try fs.mkdir(parent: d, name: b("src"), mode: 0o755, caller: owner).ino
        let main = try fs.makeFile(src, "main.c", b("int main;"))
        try two.catchUp()
        let h = try two.open(main, flags: O_RDWR)
        try two.put(h, b("INT MAIN;"), at: 0)
        let files = try fs.lookup(parent: try fs.lookup(parent: UbiquityFileSystem.rootID, name: b(".Trash-\(getuid())")).ino,
                                  name: b("files")).ino
        try fs.rename(parent: docs, name: b("Project"), newParent: files, newName: b("Project"), flags: [])
        XCTAssertEqual(fs.trashItems().map(\.originalPath), ["SugoiApp/Project"])
        try two.catchUp()
        try two.release(handle: h)
        try fs.catchUp()
        assertBytes(try fs.contents("SugoiApp/Project/src/main.c"), b("INT MAIN;"))
        XCTAssertEqual(fs.trashItems(), [])
        // An edit on the device that trashed it leaves it in the trash.
        let h2 = try fs.open(main, flags: O_RDWR)
        try fs.rename(parent: docs, name: b("Project"), newParent: files, newName: b("Project"), flags: [])
        try fs.put(h2, b("again"), at: 0)
        try fs.release(handle: h2)
        XCTAssertEqual(fs.trashItems().map(\.originalPath), ["SugoiApp/Project"])
    }

    /// Renamed on one device while the other edits it: the edit lands in the renamed file.
    func testAnEditLandsInTheFileAnotherDeviceRenamed() throws {
        let two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
        let f = try fs.makeFile(docs, "Report.txt", b("draft"))
        let archive = try fs.mkdir(parent: docs, name: b("Archive"), mode: 0o755, caller: owner).ino
        try two.catchUp()
        let h = try two.open(f, flags: O_RDWR)
        try two.put(h, b("edited"), at: 0)
        try fs.rename(parent: docs, name: b("Report.txt"), newParent: archive, newName: b("Final.txt"), flags: [])
        try two.catchUp()
        try two.release(handle: h)
        try fs.catchUp()
        assertBytes(try fs.contents("SugoiApp/Archive/Final.txt"), b("edited"))
        XCTAssertEqual(try fs.names(docs), ["Archive"])
        XCTAssertEqual(fs.unresolvedConflicts(), [])
    }

    /// A second name of a file just goes; only the last one moves the file.
    func testOnlyTheLastNameMovesTheFile() throws {
        let f = try fs.makeFile(docs, "a", b("x"))
        _ = try fs.link(f, newParent: docs, newName: b("b"))
        try fs.unlink(parent: docs, name: b("a"))
        XCTAssertEqual(fs.trashItems(), [])
        XCTAssertEqual(try fs.getattr(f).nlink, 1)
        try fs.unlink(parent: docs, name: b("b"))
        XCTAssertEqual(fs.trashItems().map(\.originalPath), ["SugoiApp/b"])
    }
}

final class LockedClock: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Int64
    init(_ value: Int64) { self.value = value }
    var now: Int64 {
        get { lock.lock(); defer { lock.unlock() }; return value }
        set { lock.lock(); value = newValue; lock.unlock() }
    }
}
