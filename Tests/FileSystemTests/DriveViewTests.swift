// The drive view (public containers by name, each folder being the container's Documents as
// Finder shows it, a read-only root, folder levels) and the app view (one app's containers whole,
// by identifier).

import Foundation
import XCTest
import UbiquityFileSystem
import UbiquityStore

final class DriveViewTests: XCTestCase {
    var store: BackingStore!
    var fs: UbiquityFileSystem!

    override func setUpWithError() throws {
        store = makeMemoryStore()
        fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
    }

    override func tearDown() {
        fs = nil
        store = nil
    }

    private func appView(_ bundle: String) throws -> UbiquityFileSystem {
        try UbiquityFileSystem(store: store, containers: Sample.all, view: .app(bundleIdentifier: bundle))
    }

    private func rootIno(_ c: ContainerInfo) throws -> UInt64 {
        try XCTUnwrap(fs.registeredContainers.first { $0.identifier == c.identifier }).rootIno
    }

    // MARK: root and container folders

    func testRootListsPublicContainersByName() throws {
        XCTAssertEqual(try fs.names(fsRoot), ["Notes", "SugoiApp", "TestDrive"])
        let root = try fs.getattr(fsRoot)
        XCTAssertEqual(root.kind, .directory)
        XCTAssertEqual(root.nlink, 2 + 3, "root nlink = 2 + container folders")
        XCTAssertEqual(root.mode & 0o222, 0, "the root is read-only")

        // readdir includes "." and "..", and continues from an offset.
        let h = try fs.opendir(fsRoot)
        defer { fs.releasedir(handle: h) }
        let all = try fs.readdir(handle: h, offset: 0)
        XCTAssertEqual(all.map { String(decoding: $0.name, as: UTF8.self) }.sorted(),
                       [".", "..", "Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(all.map(\.nextOffset), Array(1...all.count))
        let rest = try fs.readdir(handle: h, offset: all[1].nextOffset)
        XCTAssertEqual(rest, Array(all[2...]))
        XCTAssertEqual(try fs.readdir(handle: h, offset: all.count), [])
        XCTAssertTrue(all.allSatisfy { $0.kind == .directory })

        // The container folder is the container's Documents: the same node the app sees there.
        let container = try fs.lookup(parent: fsRoot, name: b("SugoiApp"))
        XCTAssertEqual(container.kind, .directory)
        XCTAssertEqual(container.nlink, 2, "an empty Documents folder")
        XCTAssertEqual(container.mode & 0o200, 0o200, "the owner may write in it")
        XCTAssertEqual(all.first { $0.name == b("SugoiApp") }?.ino, container.ino, "readdir and lookup agree")
        XCTAssertEqual(try fs.lookup(parent: container.ino, name: b("..")).ino, fsRoot)
        XCTAssertEqual(try fs.lookup(parent: container.ino, name: b(".")).ino, container.ino)
        assertErrno(ENOENT, try fs.lookup(parent: container.ino, name: b("Documents")), "no Documents inside it")
        assertErrno(ENOENT, try fs.lookup(parent: fsRoot, name: b("iCloud.com.example.SugoiApp")),
                    "the drive view names containers by name, not identifier")
    }

    /// The TestDrive app writes Documents/MyTextFile.txt; in Finder the user finds
    /// iCloud Drive → TestDrive → MyTextFile.txt, and here TestDrive/MyTextFile.txt.
    func testFilesTheAppPutsInDocumentsAreInTheContainerFolder() throws {
        // (One store, one model at a time: each is opened after the other is done.)
        fs = nil
        do {
            let app = try appView("com.example.TestDrive")
            try app.makeFile(try app.ino("iCloud.com.example.TestDrive/Documents"), "MyTextFile.txt", b("Hello"))
        }
        do {
            let drive = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
            XCTAssertEqual(try drive.names("TestDrive"), ["MyTextFile.txt"])
            assertBytes(try drive.contents("TestDrive/MyTextFile.txt"), b("Hello"))
            // And the other way round: what the user makes in the container folder is in Documents.
            try drive.makeFile(try drive.ino("TestDrive"), "FromLinux.txt", b("Hi"))
        }
        let app = try appView("com.example.TestDrive")
        XCTAssertEqual(try app.names("iCloud.com.example.TestDrive/Documents"), ["FromLinux.txt", "MyTextFile.txt"])
        XCTAssertEqual(try app.names("iCloud.com.example.TestDrive"), ["Documents"])
    }

    func testPrivateContainersAreUnreachable() throws {
        // Put something in the private container through its app's view.
        let app = try appView("com.example.Secret")
        let secretDocs = try app.ino("iCloud.com.example.Secret/Documents")
        let file = try app.makeFile(secretDocs, "diary.txt", b("private"))
        let folder = try app.mkdir(parent: secretDocs, name: b("folder"), mode: 0o755, caller: owner).ino
        XCTAssertTrue(app.publishAll().isEmpty)

        let drive = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertFalse(try drive.names(fsRoot).contains("Secret"))
        XCTAssertFalse(try drive.names(fsRoot).contains("SugoiPrivate"))
        assertErrno(ENOENT, try drive.lookup(parent: fsRoot, name: b("Secret")), "lookup by name")
        assertErrno(ENOENT, try drive.lookup(parent: fsRoot, name: b("iCloud.com.example.Secret")), "lookup by id")
        let root = try rootIno(Sample.secret)
        for ino in [root, secretDocs, file, folder] {
            assertErrno(ENOENT, try drive.getattr(ino), "getattr \(ino)")
            assertErrno(ENOENT, try drive.opendir(ino), "opendir \(ino)")
            assertErrno(ENOENT, try drive.lookup(parent: ino, name: b("diary.txt")), "lookup in \(ino)")
            assertErrno(ENOENT, try drive.lookup(parent: ino, name: b("..")), "lookup .. of \(ino)")
            assertErrno(ENOENT, try drive.mkdir(parent: ino, name: b("x"), mode: 0o755, caller: owner), "mkdir in \(ino)")
            assertErrno(ENOENT, try drive.getxattr(ino, name: b("user.x")), "getxattr \(ino)")
        }
        assertErrno(ENOENT, try drive.open(file, flags: O_RDONLY), "open by id")
        assertErrno(ENOENT, try drive.readlink(file), "readlink by id")
        let sugoiDocs = try drive.ino("SugoiApp")
        assertErrno(ENOENT, try drive.link(file, newParent: sugoiDocs, newName: b("stolen")), "link by id")
        assertErrno(ENOENT, try drive.setattr(file, AttributeChanges(mode: 0o777), handle: nil, caller: owner),
                    "setattr by id")
        assertErrno(ENOENT, try drive.rename(parent: secretDocs, name: b("diary.txt"), newParent: sugoiDocs,
                                             newName: b("stolen"), flags: []), "rename out of a private container")
        assertErrno(ENOENT, try drive.unlink(parent: secretDocs, name: b("diary.txt")), "unlink by id")
        assertBytes(try app.contents(file), b("private"))
    }

    func testNothingOutsideDocumentsIsReachable() throws {
        // The app's private data beside Documents is not shown in the drive view.
        let app = try appView("com.example.SugoiApp")
        let containerRoot = try app.ino("iCloud.com.example.SugoiApp")
        let library = try app.mkdir(parent: containerRoot, name: b("Library"), mode: 0o755, caller: owner).ino
        let caches = try app.mkdir(parent: library, name: b("Caches"), mode: 0o755, caller: owner).ino
        let settings = try app.makeFile(containerRoot, "settings.plist", b("<plist/>"))
        XCTAssertEqual(try app.names(containerRoot), ["Documents", "Library", "settings.plist"])

        let drive = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        for name in ["TestDrive", "SugoiApp", "Notes"] {
            XCTAssertEqual(try drive.names(name), [], name)
        }
        let sugoi = try drive.ino("SugoiApp")
        for name in ["Library", "settings.plist", "Documents"] {
            assertErrno(ENOENT, try drive.lookup(parent: sugoi, name: b(name)), name)
        }
        // Not by id either: the container's real root and the folders beside Documents.
        for ino in [containerRoot, library, caches] {
            assertErrno(ENOENT, try drive.getattr(ino), "getattr \(ino)")
            assertErrno(ENOENT, try drive.opendir(ino), "opendir \(ino)")
            assertErrno(ENOENT, try drive.lookup(parent: ino, name: b("..")), "lookup .. of \(ino)")
            assertErrno(ENOENT, try drive.create(parent: ino, name: b("x"), mode: 0o644, flags: O_RDWR, caller: owner),
                        "create in \(ino)")
            assertErrno(ENOENT, try drive.rename(parent: ino, name: b("settings.plist"), newParent: sugoi, newName: b("s"),
                                                 flags: []), "rename out of \(ino)")
            assertErrno(ENOENT, try drive.rename(parent: sugoi, name: b("x"), newParent: ino, newName: b("x"),
                                                 flags: []), "rename into \(ino)")
        }
        assertErrno(ENOENT, try drive.unlink(parent: containerRoot, name: b("settings.plist")), "unlink beside Documents")
        assertBytes(try app.contents(settings), b("<plist/>"))
        // ".." of the container folder is the mount root, not the container's real root.
        XCTAssertEqual(try drive.lookup(parent: sugoi, name: b("..")).ino, fsRoot)
        let h = try drive.opendir(sugoi)
        defer { drive.releasedir(handle: h) }
        XCTAssertEqual(try drive.readdir(handle: h, offset: 0).first { $0.name == b("..") }?.ino, fsRoot)
    }

    func testFilesAndFoldersAreMadeDirectlyInTheContainerFolder() throws {
        let sugoi = try fs.ino("SugoiApp")
        let file = try fs.makeFile(sugoi, "Report.txt", b("draft"))
        let folder = try fs.mkdir(parent: sugoi, name: b("Drafts"), mode: 0o755, caller: owner).ino
        XCTAssertEqual(try fs.getattr(sugoi).nlink, 3)
        _ = try fs.symlink(parent: sugoi, name: b("link"), target: b("Report.txt"), caller: owner)
        try fs.rename(parent: sugoi, name: b("Report.txt"), newParent: folder, newName: b("Report.txt"), flags: [])
        try fs.rename(parent: folder, name: b("Report.txt"), newParent: sugoi, newName: b("Final.txt"), flags: [])
        XCTAssertEqual(try fs.names(sugoi), ["Drafts", "Final.txt", "link"])
        assertBytes(try fs.contents(file), b("draft"))
        try fs.unlink(parent: sugoi, name: b("link"))
        try fs.unlink(parent: sugoi, name: b("Final.txt"))
        try fs.rmdir(parent: sugoi, name: b("Drafts"))
        XCTAssertEqual(try fs.names(sugoi), [])
        XCTAssertNoThrow(try fs.setxattr(sugoi, name: b("user.tag"), value: b("v"), flags: 0))
    }

    func testRootAndContainerFoldersCannotBeChanged() throws {
        let docs = try fs.ino("SugoiApp")
        let file = try fs.makeFile(docs, "f.txt", b("x"))
        assertErrno(EACCES, try fs.create(parent: fsRoot, name: b("new"), mode: 0o644, flags: O_RDWR, caller: owner),
                    "create in root")
        assertErrno(EACCES, try fs.mkdir(parent: fsRoot, name: b("new"), mode: 0o755, caller: owner), "mkdir in root")
        assertErrno(EACCES, try fs.mknod(parent: fsRoot, name: b("fifo"), mode: UInt32(S_IFIFO) | 0o644, rdev: 0,
                                         caller: owner), "mknod in root")
        assertErrno(EACCES, try fs.symlink(parent: fsRoot, name: b("l"), target: b("x"), caller: owner), "symlink in root")
        assertErrno(EACCES, try fs.link(file, newParent: fsRoot, newName: b("hard")), "link into root")
        assertErrno(EACCES, try fs.rename(parent: docs, name: b("f.txt"), newParent: fsRoot, newName: b("f.txt"),
                                          flags: []), "rename into root")
        // The container folders themselves: not removed, renamed, replaced or moved.
        assertErrno(EACCES, try fs.unlink(parent: fsRoot, name: b("SugoiApp")), "unlink at root")
        assertErrno(EACCES, try fs.rmdir(parent: fsRoot, name: b("SugoiApp")), "rmdir at root")
        assertErrno(EACCES, try fs.rmdir(parent: fsRoot, name: b("Notes")), "rmdir an empty container folder")
        assertErrno(EACCES, try fs.rename(parent: fsRoot, name: b("SugoiApp"), newParent: fsRoot, newName: b("Other"),
                                          flags: []), "rename at root")
        assertErrno(EACCES, try fs.rename(parent: fsRoot, name: b("SugoiApp"), newParent: fsRoot, newName: b("Notes"),
                                          flags: .exchange), "exchange at root")
        assertErrno(EACCES, try fs.rename(parent: fsRoot, name: b("Notes"), newParent: docs, newName: b("Notes"),
                                          flags: []), "move a container folder into another")
        assertErrno(EACCES, try fs.setattr(fsRoot, AttributeChanges(mode: 0o777), handle: nil, caller: owner), "chmod root")
        assertErrno(EACCES, try fs.access(fsRoot, mask: W_OK, caller: owner), "access(W_OK) of root")
        XCTAssertNoThrow(try fs.access(docs, mask: W_OK, caller: owner), "the container folder is writable")
        XCTAssertEqual(try fs.names(fsRoot), ["Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(try fs.names(docs), ["f.txt"])
    }

    // MARK: folder levels

    func testMkdirFollowsFolderLevels() throws {
        // None: no folder at all in Documents; files are fine.
        let testDrive = try fs.ino("TestDrive")
        assertErrno(EPERM, try fs.mkdir(parent: testDrive, name: b("folder"), mode: 0o755, caller: owner), "None")
        assertErrno(EPERM, try fs.mknod(parent: testDrive, name: b("folder"), mode: UInt32(S_IFDIR) | 0o755, rdev: 0,
                                        caller: owner), "None, mknod S_IFDIR")
        XCTAssertNoThrow(try fs.makeFile(testDrive, "MyTextFile.txt", b("hello")))
        XCTAssertEqual(try fs.names(testDrive), ["MyTextFile.txt"])

        // One: one level.
        let notes = try fs.ino("Notes")
        let level1 = try fs.mkdir(parent: notes, name: b("level1"), mode: 0o755, caller: owner).ino
        assertErrno(EPERM, try fs.mkdir(parent: level1, name: b("level2"), mode: 0o755, caller: owner), "One")
        XCTAssertNoThrow(try fs.makeFile(level1, "note.txt", b("n")))
        XCTAssertEqual(try fs.names(level1), ["note.txt"])

        // Any: no limit.
        var dir = try fs.ino("SugoiApp")
        for depth in 1...12 {
            dir = try fs.mkdir(parent: dir, name: b("d\(depth)"), mode: 0o755, caller: owner).ino
        }
        XCTAssertNoThrow(try fs.at("SugoiApp/d1/d2/d3/d4/d5/d6/d7/d8/d9/d10/d11/d12"))
    }

    func testRenameOfFolderTreesAcrossFoldersFollowsLevels() throws {
        let notes = try fs.ino("Notes")
        let a = try fs.mkdir(parent: notes, name: b("a"), mode: 0o755, caller: owner).ino
        let c = try fs.mkdir(parent: notes, name: b("c"), mode: 0o755, caller: owner).ino
        try fs.makeFile(notes, "f.txt", b("f"))
        // A folder moved into a level-1 folder would be at level 2.
        assertErrno(EPERM, try fs.rename(parent: notes, name: b("a"), newParent: c, newName: b("a"), flags: []),
                    "folder into folder (One)")
        assertErrno(EPERM, try fs.rename(parent: notes, name: b("a"), newParent: c, newName: b("a"), flags: .noReplace),
                    "folder into folder (One, RENAME_NOREPLACE)")
        // Exchanging a file in c with folder a would put a at level 2.
        try fs.makeFile(c, "g.txt", b("g"))
        assertErrno(EPERM, try fs.rename(parent: c, name: b("g.txt"), newParent: notes, newName: b("a"), flags: .exchange),
                    "exchange puts a folder at level 2")
        assertErrno(EPERM, try fs.rename(parent: notes, name: b("a"), newParent: c, newName: b("g.txt"), flags: .exchange),
                    "exchange puts a folder at level 2 (other order)")
        // Files move freely within the limit.
        XCTAssertNoThrow(try fs.rename(parent: notes, name: b("f.txt"), newParent: a, newName: b("f.txt"), flags: []))
        XCTAssertNoThrow(try fs.rename(parent: a, name: b("f.txt"), newParent: c, newName: b("f2.txt"), flags: []))
        XCTAssertNoThrow(try fs.rename(parent: c, name: b("f2.txt"), newParent: notes, newName: b("f.txt"), flags: []))
        XCTAssertEqual(try fs.names(notes), ["a", "c", "f.txt"])
        XCTAssertEqual(try fs.names(a), [])
        XCTAssertEqual(try fs.names(c), ["g.txt"])

        // Any: deep trees move anywhere.
        let sugoi = try fs.ino("SugoiApp")
        let x = try fs.mkdir(parent: sugoi, name: b("x"), mode: 0o755, caller: owner).ino
        let y = try fs.mkdir(parent: x, name: b("y"), mode: 0o755, caller: owner).ino
        _ = try fs.mkdir(parent: y, name: b("z"), mode: 0o755, caller: owner)
        let w = try fs.mkdir(parent: sugoi, name: b("w"), mode: 0o755, caller: owner).ino
        XCTAssertNoThrow(try fs.rename(parent: sugoi, name: b("x"), newParent: w, newName: b("x"), flags: []))
        XCTAssertNoThrow(try fs.at("SugoiApp/w/x/y/z"))
    }

    func testRenameOfFolderTreeThatWouldPassTheLimitFromAppView() throws {
        // The app made x/y in a One container; in the drive view, moving x (a tree of height 1)
        // into another level-1 folder would put y at level 3 and x at level 2: refused.
        let app = try appView("com.example.Notes")
        let appDocs = try app.ino("iCloud.com.example.Notes/Documents")
        let x = try app.mkdir(parent: appDocs, name: b("x"), mode: 0o755, caller: owner).ino
        _ = try app.mkdir(parent: x, name: b("y"), mode: 0o755, caller: owner)
        _ = try app.mkdir(parent: appDocs, name: b("target"), mode: 0o755, caller: owner)
        XCTAssertTrue(app.publishAll().isEmpty)

        let drive = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        let docs = try drive.ino("Notes")
        let target = try drive.ino("Notes/target")
        assertErrno(EPERM, try drive.rename(parent: docs, name: b("x"), newParent: target, newName: b("x"), flags: []))
        XCTAssertEqual(try drive.names(docs), ["target", "x"])
    }

    func testRenameOfFolderWithinOneFolderInLevelOneContainer() throws {
        // "Allowed within the limit": renaming a level-1 folder in place keeps it at level 1.
        let notes = try fs.ino("Notes")
        _ = try fs.mkdir(parent: notes, name: b("a"), mode: 0o755, caller: owner)
        XCTAssertNoThrow(try fs.rename(parent: notes, name: b("a"), newParent: notes, newName: b("b"), flags: []))
        XCTAssertEqual(try fs.names(notes), ["b"])
    }

    func testFoldersDeeperThanTheLimitMadeByTheAppAreHiddenInLevelOne() throws {
        // The app view (no limit) makes deep folders.
        do {
            let notesApp = try appView("com.example.Notes")
            let docs = try notesApp.ino("iCloud.com.example.Notes/Documents")
            let x = try notesApp.mkdir(parent: docs, name: b("x"), mode: 0o755, caller: owner).ino
            let y = try notesApp.mkdir(parent: x, name: b("y"), mode: 0o755, caller: owner).ino
            _ = try notesApp.mkdir(parent: y, name: b("z"), mode: 0o755, caller: owner)
            try notesApp.makeFile(x, "f.txt", b("level 1 file"))
            try notesApp.makeFile(y, "g.txt", b("level 2 file"))
            XCTAssertTrue(notesApp.publishAll().isEmpty)
        }

        // A drive view opened afterwards on the same store.
        let drive = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertEqual(try drive.names("Notes"), ["x"])
        XCTAssertEqual(try drive.names("Notes/x"), ["f.txt"])
        assertBytes(try drive.contents("Notes/x/f.txt"), b("level 1 file"))
        let x = try drive.ino("Notes/x")
        assertErrno(ENOENT, try drive.lookup(parent: x, name: b("y")), "level-2 folder")
        assertErrno(ENOENT, try drive.rmdir(parent: x, name: b("y")), "rmdir a hidden folder")

        // The app still sees everything.
        let notesApp = try appView("com.example.Notes")
        XCTAssertEqual(try notesApp.names("iCloud.com.example.Notes/Documents/x"), ["f.txt", "y"])
        assertBytes(try notesApp.contents("iCloud.com.example.Notes/Documents/x/y/g.txt"), b("level 2 file"))
    }

    func testFoldersMadeByTheAppAreHiddenInLevelNone() throws {
        do {
            let driveApp = try appView("com.example.TestDrive")
            let tdocs = try driveApp.ino("iCloud.com.example.TestDrive/Documents")
            let hidden = try driveApp.mkdir(parent: tdocs, name: b("hidden"), mode: 0o755, caller: owner).ino
            try driveApp.makeFile(hidden, "inside.txt", b("i"))
            try driveApp.makeFile(tdocs, "MyTextFile.txt", b("hello"))
            XCTAssertTrue(driveApp.publishAll().isEmpty)
        }
        let drive = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertEqual(try drive.names("TestDrive"), ["MyTextFile.txt"])
        let tdocs = try drive.ino("TestDrive")
        assertErrno(ENOENT, try drive.lookup(parent: tdocs, name: b("hidden")), "folder in a None container")
        // Hidden, not missing: it shows once its tree is in the desktop trash, under the same name.
        XCTAssertFalse(drive.absenceMayBeCached(in: tdocs, name: b("hidden")))
        XCTAssertTrue(drive.absenceMayBeCached(in: tdocs, name: b("nothing")))
        assertErrno(ENOENT, try drive.unlink(parent: tdocs, name: b("hidden")), "unlink a hidden folder")
        assertErrno(ENOENT, try drive.rmdir(parent: tdocs, name: b("hidden")), "rmdir a hidden folder")
    }

    /// Kernel node id 1 is the mount root. No container's real root may have inode 1, or that
    /// container is unreachable in the app view (on a fresh store the first registered container
    /// gets the first inode number).
    func testEveryContainerIsReachableInTheAppView() throws {
        for c in fs.registeredContainers {
            XCTAssertNotEqual(c.rootIno, fsRoot, "\(c.identifier) has the mount root's node id")
            let app = try appView(c.bundleIdentifier)
            let attrs = try app.lookup(parent: fsRoot, name: b(c.identifier))
            XCTAssertNotEqual(attrs.ino, fsRoot, "lookup of \(c.identifier) returns the mount root's id")
            XCTAssertNoThrow(try app.lookup(parent: attrs.ino, name: b("Documents")), c.identifier)
            let h = try app.opendir(fsRoot)
            let entries = try app.readdir(handle: h, offset: 0).filter { $0.name == b(c.identifier) }
            app.releasedir(handle: h)
            XCTAssertEqual(entries.count, 1)
            XCTAssertNotEqual(entries.first?.ino, fsRoot, "readdir entry of \(c.identifier) has the mount root's id")
        }
    }

    // MARK: app view

    func testAppViewShowsTheAppsContainersWhole() throws {
        let app = try appView("com.example.SugoiApp")
        XCTAssertEqual(try app.names(fsRoot), ["iCloud.com.example.SugoiApp", "iCloud.com.example.SugoiApp.private"])
        assertErrno(ENOENT, try app.lookup(parent: fsRoot, name: b("iCloud.com.example.TestDrive")), "another app's container")
        assertErrno(ENOENT, try app.lookup(parent: fsRoot, name: b("SugoiApp")), "by name")

        let root = try app.ino("iCloud.com.example.SugoiApp")
        XCTAssertEqual(try app.names(root), ["Documents"])
        _ = try app.mkdir(parent: root, name: b("Library"), mode: 0o755, caller: owner)
        try app.makeFile(root, "state.json", b("{}"))
        XCTAssertEqual(try app.names(root), ["Documents", "Library", "state.json"])
        assertErrno(EPERM, try app.rmdir(parent: root, name: b("Documents")), "remove Documents in the app view")
        assertErrno(EPERM, try app.rename(parent: root, name: b("Documents"), newParent: root, newName: b("Docs"), flags: []),
                    "rename Documents in the app view")
        assertErrno(EACCES, try app.mkdir(parent: fsRoot, name: b("x"), mode: 0o755, caller: owner), "app view root")

        // The private container is there too, and its Documents has no level limit.
        let priv = try app.ino("iCloud.com.example.SugoiApp.private/Documents")
        let deep = try app.mkdir(parent: priv, name: b("one"), mode: 0o755, caller: owner).ino
        XCTAssertNoThrow(try app.mkdir(parent: deep, name: b("two"), mode: 0o755, caller: owner))

        // TestDrive (levels None) in its own app view: folders allowed.
        let tdApp = try appView("com.example.TestDrive")
        let tdocs = try tdApp.ino("iCloud.com.example.TestDrive/Documents")
        XCTAssertNoThrow(try tdApp.mkdir(parent: tdocs, name: b("folder"), mode: 0o755, caller: owner))
        XCTAssertEqual(try tdApp.names(fsRoot), ["iCloud.com.example.TestDrive"])
    }

    func testRenamingAContainerKeepsItsDocuments() throws {
        let docs = try fs.ino("SugoiApp")
        _ = try fs.mkdir(parent: docs, name: b("folder"), mode: 0o755, caller: owner)
        try fs.makeFile(docs, "keep.txt", b("kept across a rename"))
        XCTAssertTrue(fs.publishAll().isEmpty)

        var renamed = Sample.sugoi
        renamed.name = "Sugoi Renamed"
        renamed.registeredVersion = "2"
        let containers = Sample.all.map { $0.identifier == renamed.identifier ? renamed : $0 }
        let again = try UbiquityFileSystem(store: store, containers: containers, view: .drive)
        XCTAssertEqual(try again.names(fsRoot), ["Notes", "Sugoi Renamed", "TestDrive"])
        assertErrno(ENOENT, try again.lookup(parent: fsRoot, name: b("SugoiApp")), "old name")
        XCTAssertEqual(try again.names("Sugoi Renamed"), ["folder", "keep.txt"])
        assertBytes(try again.contents("Sugoi Renamed/keep.txt"), b("kept across a rename"))
        XCTAssertEqual(again.registeredContainers.first { $0.identifier == renamed.identifier }?.name, "Sugoi Renamed")
    }

    func testInactiveContainerIsHiddenButKeepsItsDocuments() throws {
        try fs.makeFile(try fs.ino("Notes"), "n.txt", b("note"))
        XCTAssertTrue(fs.publishAll().isEmpty)
        var gone = Sample.notes
        gone.active = false
        let containers = Sample.all.map { $0.identifier == gone.identifier ? gone : $0 }
        let without = try UbiquityFileSystem(store: store, containers: containers, view: .drive)
        XCTAssertEqual(try without.names(fsRoot), ["SugoiApp", "TestDrive"])
        let back = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        assertBytes(try back.contents("Notes/n.txt"), b("note"))
    }
}
