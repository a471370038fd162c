// Real programs at work in a container without a folder limit (SugoiApp, levels Any).

import Foundation
import Glibc
import XCTest

final class ProgramsTests: MountTestCase {
    private var dir: String { docs("SugoiApp") }

    /// A tree with the shapes programs meet: nested folders, an empty folder, files of awkward sizes,
    /// a symlink, odd modes, old timestamps.
    private func makeTree(at root: String) {
        assertShell("""
            mkdir -p \(shellQuote(root)) && cd \(shellQuote(root))
            mkdir -p src/lib/deep empty docs
            : > empty.txt
            printf x > one-byte
            head -c 4095 /dev/urandom > src/4095.bin
            head -c 4096 /dev/urandom > src/4096.bin
            head -c 1048579 /dev/urandom > src/lib/big.bin
            for i in $(seq 1 40); do echo "line $i" > "docs/note $i.txt"; done
            printf '#!/bin/sh\\necho hi\\n' > src/run.sh && chmod 755 src/run.sh
            chmod 600 docs/'note 1.txt'
            ln -s lib/big.bin src/link-to-big
            echo deep > src/lib/deep/file
            touch -d '2020-01-02 03:04:05.5' src/lib/deep/file docs
            """)
    }

    /// `find` listing of type, mode, size, mtime (not of symlinks) and link target, for comparisons.
    private func manifestOfTree(_ root: String) -> String {
        assertShell("cd \(shellQuote(root)) && find . -mindepth 1 \\( -type l -printf '%p %y -> %l\\n' \\) "
                    + "-o \\( -type d -printf '%p %y %m %T@\\n' \\) -o -printf '%p %y %m %s %T@\\n' | sort").stdout
    }

    func testVimSavesAFile() throws {
        try mount()
        let f = dir + "/fruit.txt"
        XCTAssertEqual(Posix.writeFile(f, "banana\napple\n"), 0)
        // Default save: swap file in the same folder, write-backup dance. (backupskip= because Vim skips
        // backups under /tmp by default, and the test folder is there.)
        assertShell("vim -u NONE -i NONE -N -E -s -c 'set backupskip=' -c '%s/a/o/g' -c 'wq' \(shellQuote(f))", cwd: dir, timeout: 60)
        XCTAssertEqual(Posix.readText(f), "bonono\nopple\n")
        // With a swap file and a backup made by renaming the original away.
        let inodeBefore = Posix.stat(f)?.st_ino
        assertShell("vim -u NONE -i NONE -N -E -s -c 'set backup writebackup backupcopy=no backupskip=' "
                    + "-c '%s/o/u/g' -c 'wq' \(shellQuote(f))", cwd: dir, timeout: 60)
        XCTAssertEqual(Posix.readText(f), "bununu\nupple\n")
        XCTAssertEqual(Posix.readText(f + "~"), "bonono\nopple\n", "vim's backup holds the previous version")
        XCTAssertNotEqual(Posix.stat(f)?.st_ino, inodeBefore, "backupcopy=no saves a new file")
        XCTAssertEqual(ls(dir), ["fruit.txt", "fruit.txt~"], "no swap file left behind")
    }

    func testSedInPlace() throws {
        try mount()
        let f = dir + "/config.ini"
        XCTAssertEqual(Posix.writeFile(f, "name=old\nmode=fast\n"), 0)
        assertShell("sed -i 's/old/new/; s/fast/safe/' \(shellQuote(f))")
        XCTAssertEqual(Posix.readText(f), "name=new\nmode=safe\n")
        assertShell("sed -i.bak '1d' \(shellQuote(f))")
        XCTAssertEqual(Posix.readText(f), "mode=safe\n")
        XCTAssertEqual(Posix.readText(f + ".bak"), "name=new\nmode=safe\n")
        XCTAssertEqual(ls(dir), ["config.ini", "config.ini.bak"], "no temporary files left behind")
    }

    func testCpArchiveRoundTrip() throws {
        try mount()
        let source = scratchDir + "/tree"
        makeTree(at: source)
        assertShell("cp -a \(shellQuote(source)) \(shellQuote(dir + "/tree"))", timeout: 120)
        assertShell("diff -r \(shellQuote(source)) \(shellQuote(dir + "/tree"))")
        XCTAssertEqual(manifestOfTree(dir + "/tree"), manifestOfTree(source),
                       "cp -a keeps types, modes, sizes, times and link targets")
        // And back out again.
        assertShell("cp -a \(shellQuote(dir + "/tree")) \(shellQuote(scratchDir + "/back"))", timeout: 120)
        assertShell("diff -r \(shellQuote(source)) \(shellQuote(scratchDir + "/back"))")
        XCTAssertEqual(manifestOfTree(scratchDir + "/back"), manifestOfTree(source))
    }

    /// `getfattr -d` shows an item's read-only status attributes, and `cp -a` into, within and
    /// out of the mount still succeeds (writes of them are accepted and change nothing).
    func testStatusAttributesWithGetfattrAndCp() throws {
        try mount()
        let f = dir + "/a.txt"
        XCTAssertEqual(Posix.writeFile(f, "hi\n"), 0)
        let dump = assertShell("getfattr -d --absolute-names \(shellQuote(f))").stdout
        XCTAssertTrue(dump.contains("user.ubiquity.container=\"iCloud.com.example.SugoiApp\""), dump)
        XCTAssertTrue(dump.contains("user.ubiquity.status=\"current\""), dump)
        XCTAssertNotNil(dump.range(of: #"user\.ubiquity\.version="\d+""#, options: .regularExpression), dump)
        assertShell("setfattr -n user.tag -v blue \(shellQuote(f))")
        assertShell("cp -a \(shellQuote(f)) \(shellQuote(dir + "/b.txt")) && cp -a \(shellQuote(f)) \(shellQuote(scratchDir + "/a.txt")) "
                    + "&& cp -a \(shellQuote(scratchDir + "/a.txt")) \(shellQuote(dir + "/c.txt"))")
        for copy in ["b.txt", "c.txt"] {
            XCTAssertEqual(try Posix.getxattr(dir + "/" + copy, "user.tag").get(), "blue", copy)
            XCTAssertEqual(Posix.readText(dir + "/" + copy), "hi\n", copy)
        }
        // Writing them changes nothing, and succeeds (rsync -X writes and removes what it copies).
        assertShell("setfattr -n user.ubiquity.status -v conflict \(shellQuote(f)) && setfattr -x user.ubiquity.version \(shellQuote(f))")
        XCTAssertEqual(try Posix.getxattr(f, "user.ubiquity.status").get(), "current")
    }

    /// `gio trash` (GLib's own trashing, as Nautilus and PCManFM do it) on the mount lands in
    /// Recently Deleted, with true `.trashinfo` files; a move back out restores, `rm -rf` in
    /// files/ empties; `ubiquityfs trash` sees the same items.
    func testGioTrashIsRecentlyDeleted() throws {
        try mount(extra: ["--cache-seconds", "600"])
        let trash = mountPoint + "/.Trash-\(getuid())"
        XCTAssertEqual(Posix.writeFile(dir + "/My Report.txt", "report\n"), 0)
        assertShell("mkdir -p \(shellQuote(dir))/Project/src && echo code > \(shellQuote(dir))/Project/src/main.c")
        assertShell("gio trash \(shellQuote(dir + "/My Report.txt")) \(shellQuote(dir + "/Project"))")
        XCTAssertEqual(ls(dir), [])
        XCTAssertEqual(ls(trash), ["expunged", "files", "info"])
        XCTAssertEqual(ls(trash + "/files"), ["My Report.txt", "Project"])
        XCTAssertEqual(ls(trash + "/info"), ["My Report.txt.trashinfo", "Project.trashinfo"])
        let info = Posix.readText(trash + "/info/My Report.txt.trashinfo") ?? ""
        XCTAssertTrue(info.hasPrefix("[Trash Info]\nPath=SugoiApp/My%20Report.txt\nDeletionDate="), info)
        XCTAssertEqual(Posix.readText(trash + "/files/Project/src/main.c"), "code\n", "browsable in the trash")
        let listed = ubiquityfs(["trash", "list", "--store", storeDir]).stdout
        XCTAssertTrue(listed.contains("SugoiApp/My Report.txt") && listed.contains("SugoiApp/Project"), listed)
        // Restore as a file manager does, then empty the rest.
        assertShell("mv \(shellQuote(trash + "/files/My Report.txt")) \(shellQuote(dir + "/")) && rm -f \(shellQuote(trash + "/info/My Report.txt.trashinfo"))")
        XCTAssertEqual(Posix.readText(dir + "/My Report.txt"), "report\n")
        assertShell("rm -rf \(shellQuote(trash))/files/* \(shellQuote(trash))/info/*")
        XCTAssertEqual(ls(trash + "/files"), [])
        XCTAssertEqual(ubiquityfs(["trash", "list", "--store", storeDir]).stdout, "Recently Deleted is empty\n")
        // Nothing else can be made at the root, and the trash is not listed there.
        XCTAssertFalse(sh("mkdir \(shellQuote(mountPoint + "/.Trash"))").succeeded)
        XCTAssertFalse(ls(mountPoint).contains(".Trash-\(getuid())"))
    }

    /// GVfs's `trash://` (what a file manager's Trash view shows), on one D-Bus session, so one
    /// GVfs trash daemon watches throughout: it lists items trashed after it started, and items
    /// deleted with a plain `rm` (it lists `files/` again only when that folder's mtime moved);
    /// its Restore puts an item back; emptying it empties Recently Deleted.
    func testGVfsTrashListsRestoresAndEmpties() throws {
        try mount(extra: ["--cache-seconds", "600"])
        for name in ["a.txt", "b.txt", "c.txt"] { XCTAssertEqual(Posix.writeFile(dir + "/" + name, "\(name)\n"), 0) }
        let q = { (name: String) in shellQuote(self.dir + "/" + name) }
        let r = assertShell("""
            dbus-run-session -- sh -c '
                echo "before:"; gio trash --list
                gio trash \(q("a.txt")); rm \(q("b.txt"))
                echo "trashed:"; gio trash --list | sort
                gio trash --restore "$(gio trash --list | grep /a.txt | cut -f1)"
                echo "restored:"; gio trash --list
                gio trash \(q("c.txt")); gio trash --empty
                echo "emptied:"; gio trash --list' 2>/dev/null
            """, timeout: 120)
        let root = URL(fileURLWithPath: mountPoint).standardizedFileURL.path
        let uri = { (name: String) in
            "trash:///" + (root + "/.Trash-\(getuid())/files/" + name).replacingOccurrences(of: "/", with: "%5C")
        }
        XCTAssertEqual(r.stdout, """
            before:
            trashed:
            \(uri("a.txt"))\t\(dir)/a.txt
            \(uri("b.txt"))\t\(dir)/b.txt
            restored:
            \(uri("b.txt"))\t\(dir)/b.txt
            emptied:

            """)
        XCTAssertEqual(Posix.readText(dir + "/a.txt"), "a.txt\n", "restored")
        XCTAssertEqual(ls(dir), ["a.txt"])
        XCTAssertEqual(ubiquityfs(["trash", "list", "--store", storeDir]).stdout, "Recently Deleted is empty\n")
    }

    func testTarRoundTrip() throws {
        try mount()
        let source = scratchDir + "/tree"
        makeTree(at: source)
        // Archive into the mount, extract inside the mount. (POSIX format: it keeps sub-second times.)
        assertShell("""
            tar --format=posix -C \(shellQuote(source)) -cf \(shellQuote(dir + "/tree.tar")) .
            mkdir \(shellQuote(dir + "/extracted"))
            tar -C \(shellQuote(dir + "/extracted")) -xpf \(shellQuote(dir + "/tree.tar"))
            diff -r \(shellQuote(source)) \(shellQuote(dir + "/extracted"))
            """, timeout: 120)
        XCTAssertEqual(manifestOfTree(dir + "/extracted"), manifestOfTree(source))
        // Archive from the mount, extract outside.
        assertShell("""
            tar --format=posix -C \(shellQuote(dir + "/extracted")) -cf \(shellQuote(scratchDir + "/out.tar")) .
            mkdir \(shellQuote(scratchDir + "/out"))
            tar -C \(shellQuote(scratchDir + "/out")) -xpf \(shellQuote(scratchDir + "/out.tar"))
            diff -r \(shellQuote(source)) \(shellQuote(scratchDir + "/out"))
            """, timeout: 120)
        XCTAssertEqual(manifestOfTree(scratchDir + "/out"), manifestOfTree(source))
    }

    func testGitWorkflow() throws {
        try mount()
        let repo = dir + "/repo"
        let git = "git -c user.name=Tester -c user.email=tester@example.com -c init.defaultBranch=main"
        assertShell("""
            mkdir \(shellQuote(repo)) && cd \(shellQuote(repo))
            \(git) init -q
            echo 'first a' > a.txt
            echo 'first b' > b.txt
            mkdir -p src/deep && echo 'int main(void) { return 0; }' > src/deep/main.c
            \(git) add -A
            \(git) commit -q -m 'first commit'
            \(git) checkout -q -b feature
            echo 'feature a' > a.txt
            echo 'new d' > d.txt
            \(git) rm -q b.txt
            \(git) add -A
            \(git) commit -q -m 'feature commit'
            \(git) checkout -q main
            """, timeout: 120)
        XCTAssertEqual(Posix.readText(repo + "/a.txt"), "first a\n")
        XCTAssertEqual(Posix.readText(repo + "/b.txt"), "first b\n")
        XCTAssertFalse(Posix.exists(repo + "/d.txt"))
        assertShell("cd \(shellQuote(repo)) && \(git) checkout -q feature", timeout: 60)
        XCTAssertEqual(Posix.readText(repo + "/a.txt"), "feature a\n")
        XCTAssertEqual(Posix.readText(repo + "/d.txt"), "new d\n")
        XCTAssertFalse(Posix.exists(repo + "/b.txt"))
        let status = assertShell("cd \(shellQuote(repo)) && \(git) status --porcelain")
        XCTAssertEqual(status.stdout, "", "the work tree is clean")
        let log = assertShell("cd \(shellQuote(repo)) && \(git) log --format=%s")
        XCTAssertEqual(log.stdout, "feature commit\nfirst commit\n")
        assertShell("cd \(shellQuote(repo)) && \(git) gc -q && \(git) fsck --full --strict", timeout: 120)
        assertShell("cd \(shellQuote(repo)) && \(git) checkout -q main && \(git) fsck --full", timeout: 60)
        XCTAssertEqual(Posix.readText(repo + "/b.txt"), "first b\n")
    }

    func testSqliteDatabaseSurvivesRemount() throws {
        try mount()
        let sql = """
            PRAGMA journal_mode=%MODE%;
            CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);
            BEGIN; INSERT INTO t(v) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<1000) SELECT 'row ' || x FROM c; COMMIT;
            BEGIN; INSERT INTO t(v) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<1000) SELECT 'second ' || x FROM c; COMMIT;
            BEGIN; INSERT INTO t(v) VALUES ('rolled back'); ROLLBACK;
            BEGIN; UPDATE t SET v = 'updated' WHERE id % 10 = 0; DELETE FROM t WHERE id % 7 = 0; COMMIT;
            CREATE INDEX t_v ON t(v);

            """
        let query = "SELECT count(*), sum(length(v)), sum(v = 'updated'), sum(v = 'rolled back') FROM t; PRAGMA integrity_check;"
        // Rows: 2000 minus multiples of 7 (285) = 1715; 'updated' rows: multiples of 10 not of 7 = 200 - 28 = 172.
        var expected = ""
        for mode in ["DELETE", "WAL"] {
            let db = dir + "/\(mode.lowercased()).sqlite"
            let script = scratchDir + "/\(mode).sql"
            try sql.replacingOccurrences(of: "%MODE%", with: mode).write(toFile: script, atomically: false, encoding: .utf8)
            assertShell("sqlite3 -bail \(shellQuote(db)) < \(shellQuote(script)) > /dev/null", timeout: 60)
            let result = assertShell("sqlite3 \(shellQuote(db)) \(shellQuote(query))")
            XCTAssertTrue(result.stdout.hasPrefix("1715|"), "\(mode): \(result.stdout)")
            XCTAssertTrue(result.stdout.hasSuffix("|172|0\nok\n"), "\(mode): \(result.stdout)")
            if mode == "DELETE" { expected = result.stdout }
            XCTAssertEqual(result.stdout, expected, "both journal modes hold the same rows")
        }
        try remount()
        for mode in ["DELETE", "WAL"] {
            let db = dir + "/\(mode.lowercased()).sqlite"
            let result = assertShell("sqlite3 \(shellQuote(db)) \(shellQuote(query))")
            XCTAssertEqual(result.stdout, expected, "\(mode) database after remount")
        }
    }

    /// Several processes writing one SQLite database at once: SQLite's own locking (fcntl locks,
    /// taken and dropped many times a transaction) is what keeps the file whole, so every row of
    /// every writer is there and the database checks clean.
    func testSQLiteWritersInParallel() throws {
        try mount()
        let dir = docs("SugoiApp")
        let script = """
        import multiprocessing, sqlite3, sys
        def writer(path, n):
            db = sqlite3.connect(path, timeout=60)
            for i in range(100):
                with db:
                    db.execute("INSERT INTO t(writer, i) VALUES (?, ?)", (n, i))
            db.close()
        for mode in ("DELETE", "WAL"):
            path = sys.argv[1] + "." + mode
            db = sqlite3.connect(path)
            db.execute("PRAGMA journal_mode=" + mode)
            db.execute("CREATE TABLE t(writer INTEGER, i INTEGER)")
            db.commit(); db.close()
            p = [multiprocessing.Process(target=writer, args=(path, n)) for n in range(4)]
            for x in p: x.start()
            for x in p: x.join()
            db = sqlite3.connect(path)
            rows = db.execute("SELECT count(*), count(DISTINCT writer * 1000 + i) FROM t").fetchone()
            print(mode, rows[0], rows[1], db.execute("PRAGMA integrity_check").fetchone()[0])
            db.close()
        """
        let r = assertShell("python3 -c \(shellQuote(script)) \(shellQuote(dir + "/parallel.sqlite"))", timeout: 120)
        XCTAssertEqual(r.stdout, "DELETE 400 400 ok\nWAL 400 400 ok\n", r.stderr)
    }
}
