// The drive view as a user sees it: the root, the container folders, private containers, folder levels.
//
// Samples: TestDrive (public, levels None), SugoiApp (public, binary plist, Any), Notes (public, One),
// Ledger (private, Any).

import Foundation
import Glibc
import XCTest

final class DriveViewTests: MountTestCase {
    func testRootListsPublicContainersByName() throws {
        try mount()
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        for name in ["Notes", "SugoiApp", "TestDrive"] {
            guard let st = Posix.stat("\(mountPoint)/\(name)") else {
                XCTFail("stat \(name): \(Posix.describe(errno))")
                continue
            }
            XCTAssertEqual(Posix.fileType(st), S_IFDIR, "\(name) should be a folder")
        }
        // The folder a user drops files into exists and is writable.
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/hello.txt", "hello\n"), 0)
        XCTAssertEqual(assertShell("cat \(shellQuote(docs("TestDrive") + "/hello.txt"))").stdout, "hello\n")
    }

    /// As in Apple's iCloud Drive: what the app keeps in Documents is what the user sees in the
    /// container folder.
    func testContainerFolderIsTheContainersDocuments() throws {
        try mount(app: "com.example.TestDrive")
        let app = mountPoint + "/iCloud.com.example.TestDrive"
        XCTAssertEqual(Posix.writeFile(app + "/Documents/MyTextFile.txt", "Hello from TestDrive\n"), 0)
        try unmount()

        try mount()
        for name in ["Notes", "SugoiApp"] {
            XCTAssertEqual(ls("\(mountPoint)/\(name)"), [], "a fresh container folder is empty")
        }
        XCTAssertEqual(ls(mountPoint + "/TestDrive"), ["MyTextFile.txt"])
        XCTAssertEqual(assertShell("cat \(shellQuote(mountPoint + "/TestDrive/MyTextFile.txt"))").stdout,
                       "Hello from TestDrive\n")
        XCTAssertFalse(Posix.exists(mountPoint + "/TestDrive/Documents"), "no Documents folder inside it")
        let rootIno = Posix.stat(mountPoint).map { UInt64($0.st_ino) }
        XCTAssertEqual(Posix.stat(mountPoint + "/TestDrive/..").map { UInt64($0.st_ino) }, rootIno)
    }

    func testPrivateContainerIsUnreachable() throws {
        try mount()
        let m = mountPoint
        XCTAssertFalse(ls(m).contains("Ledger"))
        for path in ["\(m)/Ledger", "\(m)/iCloud.com.example.Ledger", "\(m)/Ledger/Documents",
                     "\(m)/TestDrive/../Ledger", "\(m)/TestDrive/../../Ledger", "\(m)/TestDrive/Documents",
                     "\(m)/iCloud.com.example.Ledger/Documents"] {
            assertErrno(ENOENT, "stat \(path)") {
                var st = stat()
                return stat(path, &st)
            }
        }
        assertFails("open \(m)/Ledger") { Posix.open("\(m)/Ledger", O_RDONLY | O_DIRECTORY) }
        XCTAssertFalse(sh("ls \(shellQuote(m + "/Ledger"))").succeeded, "ls MOUNT/Ledger should fail")

        // Symlinks that point at it lead nowhere.
        let sugoi = docs("SugoiApp")
        assertSucceeds("symlink") { symlink("../Ledger", sugoi + "/relative") }
        assertSucceeds("symlink") { symlink("\(m)/Ledger/Documents", sugoi + "/absolute") }
        for link in ["relative", "absolute"] {
            assertErrno(ENOENT, "stat through symlink \(link)") {
                var st = stat()
                return stat(sugoi + "/" + link, &st)
            }
        }
        // Nothing anywhere in the mount names it.
        let find = assertShell("find \(shellQuote(m)) -mindepth 1")
        XCTAssertFalse(find.stdout.contains("Ledger"), "find lists something of Ledger:\n\(find.stdout)")
        // And it cannot be created at the root either.
        assertFails("mkdir MOUNT/Ledger") { mkdir("\(m)/Ledger", 0o755) }
    }

    func testRootIsReadOnly() throws {
        try mount()
        let m = mountPoint
        let before = ls(m)
        assertFails("create MOUNT/new.txt") { Posix.open("\(m)/new.txt", O_WRONLY | O_CREAT, 0o644) }
        assertFails("mkdir MOUNT/NewFolder") { mkdir("\(m)/NewFolder", 0o755) }
        assertFails("rename MOUNT/TestDrive") { rename("\(m)/TestDrive", "\(m)/Renamed") }
        assertFails("rmdir MOUNT/Notes") { rmdir("\(m)/Notes") }
        assertFails("unlink MOUNT/Notes") { unlink("\(m)/Notes") }
        assertFails("symlink at root") { symlink("TestDrive", "\(m)/link") }
        assertFails("mkfifo at root") { mkfifo("\(m)/fifo", 0o644) }
        XCTAssertEqual(ls(m), before, "the root changed")
        // Shell tools see the same.
        XCTAssertFalse(sh("touch \(shellQuote(m + "/t"))").succeeded, "touch at the root should fail")
        XCTAssertFalse(sh("mkdir \(shellQuote(m + "/d"))").succeeded, "mkdir at the root should fail")
        XCTAssertFalse(sh("mv \(shellQuote(m + "/Notes")) \(shellQuote(m + "/Memos"))").succeeded,
                       "mv at the root should fail")
        XCTAssertEqual(ls(m), before, "the root changed")
    }

    func testContainerFolderTakesFilesAndFoldersButStays() throws {
        try mount()
        let c = "\(mountPoint)/SugoiApp"
        XCTAssertEqual(Posix.writeFile(c + "/file.txt", "x"), 0)
        assertSucceeds("mkdir SugoiApp/Folder") { mkdir(c + "/Folder", 0o755) }
        assertSucceeds("rename a file") { rename(c + "/file.txt", c + "/Folder/moved.txt") }
        assertSucceeds("symlink") { symlink("Folder/moved.txt", c + "/link") }
        assertSucceeds("hard link") { link(c + "/Folder/moved.txt", c + "/hard.txt") }
        XCTAssertEqual(ls(c), ["Folder", "hard.txt", "link"])
        XCTAssertEqual(Posix.readText(c + "/link"), "x")
        assertShell("cd \(shellQuote(c)) && rm hard.txt link && rm -r Folder && touch t && rm t")
        XCTAssertEqual(ls(c), [])
        // The container folder itself cannot go, move or be renamed, even when empty.
        assertErrno(EACCES, "rmdir SugoiApp") { rmdir(c) }
        assertErrno(EACCES, "rename SugoiApp") { rename(c, mountPoint + "/Other") }
        assertFails("move SugoiApp into Notes") { rename(c, mountPoint + "/Notes/SugoiApp") }
        assertFails("move a file to the root") {
            XCTAssertEqual(Posix.writeFile(c + "/f", "f"), 0)
            return rename(c + "/f", mountPoint + "/f")
        }
        XCTAssertFalse(sh("rm -rf \(shellQuote(c))").succeeded, "rm -rf of a container folder should fail")
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(ls(c), [], "rm -rf emptied it, and it is still there")
    }

    // MARK: Folder levels

    func testLevelsNoneRefusesFolders() throws {
        try mount()
        let d = docs("TestDrive")
        assertErrno(EPERM, "mkdir TestDrive/x") { mkdir(d + "/x", 0o755) }
        XCTAssertFalse(sh("mkdir \(shellQuote(d + "/y"))").succeeded)
        // Files are fine, and so are renames of files.
        XCTAssertEqual(Posix.writeFile(d + "/a.txt", "a"), 0)
        assertSucceeds("rename a file") { rename(d + "/a.txt", d + "/b.txt") }
        XCTAssertEqual(ls(d), ["b.txt"])
    }

    func testLevelsOneAllowsOneLevel() throws {
        try mount()
        let d = docs("Notes")
        assertSucceeds("mkdir Notes/a") { mkdir(d + "/a", 0o755) }
        assertErrno(EPERM, "mkdir Notes/a/b") { mkdir(d + "/a/b", 0o755) }
        XCTAssertEqual(Posix.writeFile(d + "/a/file.txt", "in a"), 0, "files inside a level-1 folder are fine")
        XCTAssertEqual(ls(d + "/a"), ["file.txt"])
        XCTAssertFalse(sh("mkdir -p \(shellQuote(d + "/x/y"))").succeeded, "mkdir -p x/y should fail")
    }

    func testLevelsAnyAllowsDeepFolders() throws {
        try mount()
        let d = docs("SugoiApp")
        assertShell("mkdir -p \(shellQuote(d))/1/2/3/4/5/6/7/8 && echo deep > \(shellQuote(d))/1/2/3/4/5/6/7/8/f")
        XCTAssertEqual(Posix.readText(d + "/1/2/3/4/5/6/7/8/f"), "deep\n")
    }

    func testRenameOfTreePastTheLimitIsRefused() throws {
        try mount()
        let d = docs("Notes")
        assertSucceeds("mkdir a") { mkdir(d + "/a", 0o755) }
        assertSucceeds("mkdir b") { mkdir(d + "/b", 0o755) }
        XCTAssertEqual(Posix.writeFile(d + "/a/inside.txt", "inside"), 0)
        // a would become b/a: two levels.
        assertErrno(EPERM, "rename a → b/a") { rename(d + "/a", d + "/b/a") }
        assertErrno(EPERM, "renameat2 NOREPLACE a → b/a") { Posix.renameat2(d + "/a", d + "/b/a", flags: renameNoReplace) }
        XCTAssertFalse(sh("mv \(shellQuote(d + "/a")) \(shellQuote(d + "/b/"))").succeeded, "mv a b/ should fail")
        XCTAssertEqual(ls(d), ["a", "b"])
        XCTAssertEqual(ls(d + "/a"), ["inside.txt"])
        XCTAssertEqual(ls(d + "/b"), [])
        // Within the limit: renaming a folder at level 1, moving a file into a folder.
        assertSucceeds("rename a → c") { rename(d + "/a", d + "/c") }
        assertSucceeds("move a file into b") { rename(d + "/c/inside.txt", d + "/b/inside.txt") }
        XCTAssertEqual(ls(d), ["b", "c"])
        XCTAssertEqual(Posix.readText(d + "/b/inside.txt"), "inside")
    }

    func testRenameOfTreeWithinAnyContainer() throws {
        try mount()
        let d = docs("SugoiApp")
        assertShell("cd \(shellQuote(d)) && mkdir -p x/y/z w && echo 1 > x/y/z/f && mv x w/ && cat w/x/y/z/f")
        XCTAssertEqual(Posix.readText(d + "/w/x/y/z/f"), "1\n")
        XCTAssertEqual(ls(d), ["w"])
    }

    func testMovingAFolderIntoALevelNoneContainerFails() throws {
        try mount()
        let from = docs("SugoiApp"), to = docs("TestDrive")
        assertShell("mkdir -p \(shellQuote(from))/tree/sub && echo t > \(shellQuote(from))/tree/sub/f")
        assertErrno(oneOf: [EXDEV, EPERM], "rename across containers") { rename(from + "/tree", to + "/tree") }
        let mv = sh("mv \(shellQuote(from + "/tree")) \(shellQuote(to + "/"))")
        XCTAssertFalse(mv.succeeded, "mv of a folder into a levels-None container should fail")
        XCTAssertEqual(ls(to), [], "nothing of the tree may land in TestDrive")
        XCTAssertEqual(Posix.readText(from + "/tree/sub/f"), "t\n", "the source must stay whole")
    }

    func testMovingAFileAcrossContainersWithMv() throws {
        try mount()
        let from = docs("SugoiApp"), to = docs("Notes")
        XCTAssertEqual(Posix.writeFile(from + "/moved.txt", "content\n"), 0)
        assertShell("mv \(shellQuote(from + "/moved.txt")) \(shellQuote(to + "/"))")
        XCTAssertEqual(Posix.readText(to + "/moved.txt"), "content\n")
        XCTAssertFalse(Posix.exists(from + "/moved.txt"))
    }
}
