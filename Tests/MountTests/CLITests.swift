// The command line: help, usage errors, `containers`, `check`, mount failures, mount options, and the
// CFBundleVersion registration rule end to end.

import Foundation
import Glibc
import XCTest

final class CLITests: MountTestCase {
    /// The whitespace/`|`/`,`-separated words of the `containers` line for a container identifier.
    private func containerRow(_ output: CommandResult, id: String,
                              file: StaticString = #filePath, line: UInt = #line) -> [String] {
        guard let row = output.lines.first(where: { words(of: $0).contains(id) }) else {
            XCTFail("`containers` has no line for \(id):\n\(output.stdout)", file: file, line: line)
            return []
        }
        return words(of: row)
    }

    private func words(of line: String) -> [String] {
        line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "|" || $0 == "," }).map(String.init)
    }

    private let truthy: Set<String> = ["yes", "true", "public"]
    private let falsy: Set<String> = ["no", "false", "private"]

    func testHelpOnEverySubcommand() throws {
        for args in [["--help"], ["mount", "--help"], ["unmount", "--help"], ["containers", "--help"], ["check", "--help"], ["versions", "--help"],
                     ["restore", "--help"], ["resolve", "--help"], ["status", "--help"], ["trash", "--help"]] {
            let r = ubiquityfs(args, timeout: 20)
            XCTAssertEqual(r.status, 0, "\(r)")
            XCTAssertTrue((r.stdout + r.stderr).lowercased().contains("usage"), "no usage text: \(r)")
        }
        XCTAssertTrue(ubiquityfs(["mount", "--help"]).stdout.contains("--apps"), "mount --help should list --apps")
    }

    /// The mount reads ahead as far as `--read-ahead` says (4 MiB by default), not the kernel's
    /// 128 KiB for a new FUSE mount; the disk under the mountpoint keeps its own. A file read in
    /// order reads whole.
    func testTheMountReadsAheadAsFarAsAsked() throws {
        func readAhead(_ path: String) -> String? {
            guard let dev = Posix.stat(path)?.st_dev else { return nil }
            let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & ~0xfff), minor = (dev & 0xff) | ((dev >> 12) & ~0xff)
            return Posix.readText("/sys/class/bdi/\(major):\(minor)/read_ahead_kb")?.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let under = readAhead(mountPoint)
        XCTAssertNotNil(under, "the disk under the mountpoint has a read-ahead")
        try mount()
        // Set by a thread of the daemon once the mount answers: wait for it a little.
        var shown: String?
        for _ in 0..<100 {
            shown = readAhead(mountPoint)
            if shown == "4096" { break }
            usleep(20_000)
        }
        XCTAssertEqual(shown, "4096")
        try unmount()
        XCTAssertEqual(readAhead(mountPoint), under, "the disk under the mountpoint is left alone")
        try mount(extra: ["--read-ahead", "512"])
        for _ in 0..<100 where readAhead(mountPoint) != "512" { usleep(20_000) }
        XCTAssertEqual(readAhead(mountPoint), "512")
        let path = docs("SugoiApp") + "/big.bin"
        let bytes = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) }
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data(bytes)))
        assertShell("echo 3 > /proc/sys/vm/drop_caches")
        XCTAssertEqual(FileManager.default.contents(atPath: path), Data(bytes))
        try unmount()
        XCTAssertEqual(ubiquityfs(["mount", "--read-ahead", "lots", mountPoint]).status, 64)
    }

    /// A name looked up and found missing is remembered by the kernel (a negative entry): asked
    /// again while the daemon is stopped, the kernel answers at once.
    func testTheKernelRemembersAMissingName() throws {
        try mount()
        let missing = docs("SugoiApp") + "/no-such-header.h"
        XCTAssertFalse(Posix.exists(missing))
        let pid = try daemonPID(of: mountPoint)
        XCTAssertEqual(kill(pid, SIGSTOP), 0)
        var stopped = true
        defer { if stopped { kill(pid, SIGCONT) } }
        let again = sh("timeout 10 stat \(shellQuote(missing))", timeout: 30)
        kill(pid, SIGCONT)
        stopped = false
        XCTAssertEqual(again.status, 1, "stat answered without the daemon (124: it waited): \(again)")
        XCTAssertTrue(again.stderr.contains("No such file"), again.stderr)
        try unmount()
    }

    /// The store holds the names and content of private containers: another user can read none of
    /// it, even when the store folder existed beforehand with mode 0755 (as this fixture makes it).
    func testAnotherUserCannotReadTheStore() throws {
        try mount(app: "com.example.Ledger")
        XCTAssertEqual(Posix.writeFile(mountPoint + "/iCloud.com.example.Ledger/Documents/salary-2026.txt", "secret\n"), 0)
        try unmount()
        try mount()
        XCTAssertEqual(chmod(workDir, 0o755), 0, "let nobody reach the store folder's parent")
        assertShell("runuser -u nobody -- test -x \(shellQuote(workDir))")
        for relative in try FileManager.default.subpathsOfDirectory(atPath: storeDir) + ["."] {
            guard let st = Posix.lstat(storeDir + "/" + relative) else { continue }
            let isFolder = Posix.fileType(st) == S_IFDIR
            XCTAssertEqual(String(st.st_mode & 0o777, radix: 8), isFolder ? "700" : "600", "STORE/\(relative)")
        }
        let db = storeDir + "/metadata.sqlite3"
        XCTAssertTrue(Posix.exists(db + "-wal"), "the daemon has the database open")
        let peek = sh("runuser -u nobody -- sqlite3 -readonly \(shellQuote(db)) 'select name from dirents'")
        XCTAssertFalse(peek.succeeded, "nobody could read the store: \(peek)")
        XCTAssertFalse(peek.stdout.contains("salary"), "a private container's file name leaked: \(peek)")
        for name in ["daemon.pid", "ubiquityfs.log", "metadata.sqlite3-wal"] {
            XCTAssertFalse(sh("runuser -u nobody -- cat \(shellQuote(storeDir + "/" + name))").succeeded, name)
        }
        XCTAssertTrue(daemonLogTail(lines: 1000).contains("made the store folder \(storeDir) private (mode 755 -> 700)"),
                      daemonLogTail())
    }

    /// `versions` lists a file's published versions, oldest first, by its path in the mount (while
    /// the daemon serves it) and by CONTAINER/PATH in the store (with nothing mounted).
    /// `fsck` finds a store made through the mount whole, and says what a damaged copy of it
    /// lacks: a wrong link count, a chunk gone, a chunk whose bytes changed (with --full).
    func testFsckFindsAStoreWholeAndSaysWhatIsDamaged() throws {
        try mount()
        let d = docs("SugoiApp")
        assertShell("""
            cd \(shellQuote(d)) && echo a > a.txt && ln a.txt a-link.txt && ln -s a.txt sym && mkdir -p x/y && echo z > x/y/z.txt \
              && head -c 3000000 /dev/urandom > big.bin && truncate -s 100 big.bin && truncate -s 5000000 big.bin \
              && rm a-link.txt && rm -rf x/y && mkfifo fifo && echo e > e.txt && rm e.txt
            """)
        try unmount()
        let clean = ubiquityfs(["fsck", "--store", storeDir, "--full"])
        XCTAssertEqual(clean.status, 0, "\(clean)")
        XCTAssertTrue(clean.stdout.contains(": checked ") && clean.stdout.contains("no problems"), clean.stdout)
        XCTAssertFalse(clean.stdout.contains("problem:"), clean.stdout)
        XCTAssertFalse(clean.stdout.contains("no version names"), "every chunk is some version's: \(clean.stdout)")

        assertShell("sqlite3 \(shellQuote(storeDir + "/metadata.sqlite3")) "
                    + "\"UPDATE nodes SET nlink = 5 WHERE ino = (SELECT child FROM dirents WHERE name = CAST('a.txt' AS BLOB))\"")
        // Chunks are found by their bytes: one version names a.txt's ("a\n"), one z.txt's ("z\n").
        // (Blob ids are not in write order, and a chunk may be shared by several versions.)
        func blob(holding content: String) -> String? {
            let all = sh("find \(shellQuote(storeDir + "/blobs")) -type f -not -path '*/.tmp/*'").stdout.split(separator: "\n")
            return all.map(String.init).first { (try? Data(contentsOf: URL(fileURLWithPath: $0))) == Data(content.utf8) }
        }
        let aBlob = try XCTUnwrap(blob(holding: "a\n"), "a.txt's chunk is a file of its own")
        let zBlob = try XCTUnwrap(blob(holding: "z\n"), "z.txt's chunk is a file of its own")
        XCTAssertEqual(unlink(aBlob), 0)
        assertShell("python3 -c 'import sys; b = bytearray(open(sys.argv[1], \"rb\").read()); b[0] ^= 0xff; "
                    + "open(sys.argv[1], \"wb\").write(b)' \(shellQuote(zBlob))")
        let damaged = ubiquityfs(["fsck", "--store", storeDir])
        XCTAssertEqual(damaged.status, 1, "\(damaged)")
        XCTAssertTrue(damaged.stdout.contains("has link count 5 and 1 name"), damaged.stdout)
        XCTAssertTrue(damaged.stdout.contains("is missing"), damaged.stdout)
        XCTAssertTrue(damaged.stdout.contains("2 problems"), damaged.stdout)
        let full = ubiquityfs(["fsck", "--store", storeDir, "--full"])
        XCTAssertTrue(full.stdout.contains("does not match its checksum"), full.stdout)
        XCTAssertTrue(full.stdout.contains("3 problems"), full.stdout)
    }

    /// `fsck --repair` mends a damaged store in one commit: names of nothing go, link counts and
    /// sizes follow the names and versions, and what lost its name (a file, a folder with what is
    /// in it, the versions of a file whose inode went) lands in lost+found in Recently Deleted,
    /// from where `trash restore` brings it back whole.
    func testFsckRepairKeepsWhatLostItsNameInLostAndFound() throws {
        try mount()
        let d = docs("SugoiApp")
        assertShell("""
            cd \(shellQuote(d)) && echo a > a.txt && ln a.txt a-link.txt && echo 'lost content' > lost.txt \
              && echo 'gone v1' > gone.txt && echo 'gone v2' > gone.txt && setfattr -n user.x -v 1 gone.txt \
              && mkdir Sub && echo inner > Sub/inner.txt
            """)
        try unmount()
        let db = shellQuote(storeDir + "/metadata.sqlite3")
        func ino(_ name: String) -> String {
            sh("sqlite3 \(db) \"SELECT child FROM dirents WHERE name = CAST('\(name)' AS BLOB)\"").stdout
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let lost = ino("lost.txt"), gone = ino("gone.txt"), sub = ino("Sub"), inner = ino("inner.txt")
        XCTAssertFalse(lost.isEmpty || gone.isEmpty || sub.isEmpty || inner.isEmpty)
        assertShell("""
            sqlite3 \(db) "UPDATE nodes SET nlink = 5 WHERE ino = \(ino("a.txt")); \
              DELETE FROM dirents WHERE child = \(lost); DELETE FROM nodes WHERE ino = \(gone); \
              DELETE FROM dirents WHERE child = \(sub); UPDATE nodes SET size = 999 WHERE ino = \(inner)"
            """)
        let damaged = ubiquityfs(["fsck", "--store", storeDir])
        XCTAssertEqual(damaged.status, 1, "\(damaged)")

        let repaired = ubiquityfs(["fsck", "--store", storeDir, "--repair", "--full"])
        XCTAssertEqual(repaired.status, 0, "\(repaired)")
        let done = repaired.lines.filter { $0.hasPrefix("repaired: ") }
        for expected in ["set the link count of inode \(ino("a.txt")) to 2", "moved inode \(lost), which had no name",
                         "moved inode \(sub), which had no name", "versions of inode \(gone), which does not exist",
                         "removed the name 'gone.txt'", "removed the extended attribute 'user.x' of inode \(gone)",
                         "set the size of inode \(inner) to 6"] {
            XCTAssertTrue(done.contains { $0.contains(expected) }, "no line saying \(expected): \(repaired.stdout)")
        }
        XCTAssertTrue(repaired.stdout.contains("after repair: checked") && repaired.stdout.contains("no problems"), repaired.stdout)
        let again = ubiquityfs(["fsck", "--store", storeDir, "--full"])
        XCTAssertEqual(again.status, 0, "\(again)")
        XCTAssertEqual(ubiquityfs(["fsck", "--store", storeDir, "--repair"]).stdout.filter { $0 == "\n" }.count, 1,
                       "a whole store needs no repair")

        try mount()
        XCTAssertEqual(ls(d), ["a-link.txt", "a.txt"])
        XCTAssertEqual(Posix.stat(d + "/a.txt")?.st_nlink, 2)
        let listed = ubiquityfs(["trash", "list", "SugoiApp", "--store", storeDir])
        let row = try XCTUnwrap(listed.lines.first { $0.hasSuffix("SugoiApp/lost+found") }, listed.stdout)
        let id = try XCTUnwrap(row.split(separator: " ").first.map(String.init))
        let restored = ubiquityfs(["trash", "restore", id, "--store", storeDir])
        XCTAssertTrue(restored.succeeded, "\(restored)")
        let found = d + "/lost+found"
        XCTAssertEqual(Set(ls(found)), ["file-\(lost)", "folder-\(sub)", "file-\(gone)"])
        XCTAssertEqual(Posix.readText(found + "/file-\(lost)"), "lost content\n")
        XCTAssertEqual(Posix.readText(found + "/folder-\(sub)/inner.txt"), "inner\n")
        XCTAssertEqual(Posix.readText(found + "/file-\(gone)"), "gone v2\n")
        let history = ubiquityfs(["versions", found + "/file-\(gone)"])
        XCTAssertEqual(history.lines.count, 3, "both versions came with it: \(history.stdout)")
        try unmount()
        assertStoreWhole()
    }

    func testVersionsOfAFileByMountPathAndByStorePath() throws {
        try mount()
        let path = docs("SugoiApp") + "/Report.txt"
        XCTAssertEqual(Posix.writeFile(path, "first\n"), 0)
        XCTAssertEqual(Posix.writeFile(path, "the second, longer\n"), 0)
        func rows(_ r: CommandResult) -> [[String]] {
            r.stdout.split(separator: "\n").dropFirst().map { $0.split(separator: " ", omittingEmptySubsequences: true).map(String.init) }
        }
        let mounted = ubiquityfs(["versions", path])
        XCTAssertTrue(mounted.succeeded, "\(mounted)")
        XCTAssertTrue(mounted.stdout.hasPrefix("ID  CREATED"), mounted.stdout)
        let seen = rows(mounted)
        XCTAssertEqual(seen.count, 2, mounted.stdout)
        // ID, date, time, SIZE, DEVICE, ORIGIN, [CURRENT]
        XCTAssertEqual(seen.map { $0[3] }, ["6", "19"])
        XCTAssertEqual(seen.map { $0[5] }, ["edit", "edit"])
        XCTAssertEqual(seen.map { $0.count > 6 ? $0[6] : "" }, ["", "yes"], "the newest is current")
        let folder = ubiquityfs(["versions", docs("SugoiApp")])
        XCTAssertEqual(folder.status, 64)
        XCTAssertTrue(folder.stderr.contains("is not a file"), folder.stderr)
        let outside = ubiquityfs(["versions", workDir])
        XCTAssertEqual(outside.status, 64)
        XCTAssertTrue(outside.stderr.contains("is not in a UbiquityFS mount"), outside.stderr)
        try unmount()
        let stored = ubiquityfs(["versions", "--store", storeDir, "SugoiApp/Report.txt"])
        XCTAssertTrue(stored.succeeded, "\(stored)")
        XCTAssertEqual(rows(stored).map { $0[3] }, ["6", "19"], "the same from the store")
        let missing = ubiquityfs(["versions", "--store", storeDir, "SugoiApp/Nope.txt"])
        XCTAssertEqual(missing.status, 64)
        XCTAssertTrue(missing.stderr.contains("no such file"), missing.stderr)
    }

    /// A shell's `echo x > f` opens with O_TRUNC and closes that first descriptor (after dup2)
    /// before `echo` writes: that close publishes no empty version between two whole ones. A
    /// file a program empties and closes (`: > f`) is still an empty version of its own.
    func testAShellRedirectionMakesOneVersionPerSave() throws {
        try mount()
        let path = docs("SugoiApp") + "/Saved.txt"
        assertShell("echo one > \(shellQuote(path)) && echo two > \(shellQuote(path)) && echo three > \(shellQuote(path)) && : > \(shellQuote(path))")
        let listed = ubiquityfs(["versions", path])
        let sizes = listed.lines.dropFirst().map { $0.split(separator: " ", omittingEmptySubsequences: true)[3] }
        XCTAssertEqual(sizes, ["4", "4", "6", "0"], listed.stdout)
        try unmount()
    }

    /// `restore` through the daemon shows in the mount at once (the kernel is told, even with a
    /// long cache), in place or beside; with nothing mounted it opens the store itself. The
    /// daemon's socket refuses another user.
    func testRestoreThroughTheDaemonAndWithoutIt() throws {
        try mount(extra: ["--cache-seconds", "600"])
        let path = docs("SugoiApp") + "/Report.txt"
        XCTAssertEqual(Posix.writeFile(path, "first\n"), 0)
        XCTAssertEqual(Posix.writeFile(path, "the second, longer\n"), 0)
        XCTAssertEqual(Posix.readText(path), "the second, longer\n")
        let listed = ubiquityfs(["versions", path])
        let first = try XCTUnwrap(listed.lines.dropFirst().first?.split(separator: " ").first.map(String.init))
        let restored = ubiquityfs(["restore", path, "--version", first])
        XCTAssertTrue(restored.succeeded, restored.description)
        XCTAssertEqual(restored.stdout, "SugoiApp/Report.txt: version \(first) restored as the current version\n")
        XCTAssertEqual(Posix.readText(path), "first\n", "the mount shows it at once")
        XCTAssertEqual(Posix.stat(path)?.st_size, 6)
        let origins = ubiquityfs(["versions", path]).lines.dropFirst().map { $0.split(separator: " ", omittingEmptySubsequences: true)[5] }
        XCTAssertEqual(origins, ["edit", "edit", "restored"], "the replaced version stays")
        XCTAssertFalse(Posix.exists(docs("SugoiApp") + "/Report (old).txt"), "looked up first: the kernel may remember it missing")
        let beside = ubiquityfs(["restore", path, "--version", first, "--as", "Report (old).txt"])
        XCTAssertTrue(beside.succeeded, beside.description)
        XCTAssertEqual(Posix.readText(docs("SugoiApp") + "/Report (old).txt"), "first\n")
        let taken = ubiquityfs(["restore", path, "--version", first, "--as", "Report (old).txt"])
        XCTAssertEqual(taken.status, 1)
        XCTAssertTrue(taken.stderr.contains("already exists"), taken.stderr)
        let wrong = ubiquityfs(["restore", path, "--version", "999999"])
        XCTAssertEqual(wrong.status, 1)
        XCTAssertTrue(wrong.stderr.contains("not one of this file's versions"), wrong.stderr)
        XCTAssertEqual(ubiquityfs(["restore", path]).status, 64, "--version is required")
        XCTAssertEqual(ubiquityfs(["resolve", path, "--keep", "sideways"]).status, 64)
        let none = ubiquityfs(["resolve", path, "--keep", "current"])
        XCTAssertEqual(none.status, 1)
        XCTAssertTrue(none.stderr.contains("no unresolved conflict"), none.stderr)
        // Only the store's user may talk to the daemon (the socket's folder is private too).
        let other = sh("runuser -u nobody -- \(shellQuote(Self.binary)) status --store \(shellQuote(storeDir))")
        XCTAssertFalse(other.succeeded, other.description)
        let status = ubiquityfs(["status", mountPoint])
        XCTAssertTrue(status.succeeded, status.description)
        XCTAssertEqual(Array(status.lines.prefix(5)), ["pending publishes: none", "unresolved conflicts: none",
                                                       "Recently Deleted: 0 items, 0 bytes", "recovered versions: none", "devices: 1"])
        XCTAssertEqual(status.lines.count, 7, status.stdout)
        XCTAssertTrue(status.lines.last?.hasPrefix("  \(ProcessInfo.processInfo.hostName)  ") ?? false, status.stdout)
        try unmount()
        XCTAssertEqual(ls(storeDir + "/control"), [], "the daemon removes its socket")
        let stored = ubiquityfs(["restore", "--store", storeDir, "SugoiApp/Report.txt", "--version", first])
        XCTAssertTrue(stored.succeeded, stored.description)
        XCTAssertTrue(ubiquityfs(["status", "--store", storeDir]).stdout.contains("no daemon serves this store"))
        try mount()
        XCTAssertEqual(Posix.readText(path), "first\n")
        XCTAssertEqual(ubiquityfs(["versions", path]).lines.count, 5, "header and four versions")
        try unmount()
    }

    /// `rm -rf` in a mount moves everything into Recently Deleted; `trash restore` brings the tree
    /// back and the mount shows it at once (even with a long kernel cache); `trash empty` deletes
    /// for good.
    func testRecentlyDeletedThroughTheMount() throws {
        try mount(extra: ["--cache-seconds", "600"])
        let sugoi = docs("SugoiApp")
        assertShell("mkdir -p \(shellQuote(sugoi))/Project/src && echo readme > \(shellQuote(sugoi))/Project/README "
                    + "&& echo code > \(shellQuote(sugoi))/Project/src/main.c && echo loose > \(shellQuote(sugoi))/loose.txt")
        XCTAssertEqual(ls(sugoi), ["Project", "loose.txt"])
        assertShell("rm -rf \(shellQuote(sugoi))/Project \(shellQuote(sugoi))/loose.txt")
        XCTAssertEqual(ls(sugoi), [])
        XCTAssertFalse(Posix.exists(sugoi + "/Project"), "looked up first: the kernel may remember it missing")
        let list = ubiquityfs(["trash", "list", "--store", storeDir])
        XCTAssertTrue(list.succeeded, list.description)
        XCTAssertEqual(list.lines.first?.split(separator: " ", omittingEmptySubsequences: true),
                       ["ID", "DELETED", "KIND", "SIZE", "DEVICE", "FROM"])
        XCTAssertEqual(Set(list.lines.dropFirst().compactMap { $0.split(separator: " ").last.map(String.init) }),
                       ["SugoiApp/Project", "SugoiApp/Project/src", "SugoiApp/Project/README", "SugoiApp/Project/src/main.c",
                        "SugoiApp/loose.txt"])
        XCTAssertEqual(ubiquityfs(["trash", "list", "TestDrive", "--store", storeDir]).stdout, "Recently Deleted is empty\n")
        XCTAssertTrue(ubiquityfs(["status", mountPoint]).stdout.contains("Recently Deleted: 5 items, 18 bytes"))
        let restored = ubiquityfs(["trash", "restore", "SugoiApp/Project", "--store", storeDir])
        XCTAssertTrue(restored.succeeded, restored.description)
        XCTAssertEqual(restored.stdout, "restored SugoiApp/Project\n")
        XCTAssertEqual(ls(sugoi), ["Project"], "shown at once")
        XCTAssertEqual(Posix.readText(sugoi + "/Project/src/main.c"), "code\n")
        XCTAssertEqual(Posix.readText(sugoi + "/Project/README"), "readme\n")
        let missing = ubiquityfs(["trash", "restore", "SugoiApp/Nope", "--store", storeDir])
        XCTAssertEqual(missing.status, 1)
        XCTAssertTrue(missing.stderr.contains("nothing deleted from SugoiApp/Nope"), missing.stderr)
        let emptied = ubiquityfs(["trash", "empty", "--store", storeDir])
        XCTAssertEqual(emptied.stdout, "deleted 1 item for good\n")
        try unmount()
        // Without a daemon, on the store itself.
        XCTAssertEqual(ubiquityfs(["trash", "list", "--store", storeDir]).stdout, "Recently Deleted is empty\n")
        XCTAssertEqual(ubiquityfs(["trash", "bogus", "--store", storeDir]).status, 64)
    }

    func testUsageErrorsExit64() throws {
        for args in [["mount"], ["no-such-subcommand"], ["mount", "--no-such-option", mountPoint],
                     ["unmount"], ["containers", "--apps"]] {
            let r = ubiquityfs(args, timeout: 20)
            XCTAssertEqual(r.status, 64, "usage error should exit 64: \(r)")
            XCTAssertFalse(r.stderr.isEmpty, "a usage error should say what is wrong on stderr: \(r)")
        }
        XCTAssertFalse(isMounted(mountPoint))
    }

    func testContainersListsTheSamples() throws {
        let r = ubiquityfs(["containers", "--apps", appsDir, "--store", storeDir])
        XCTAssertEqual(r.status, 0, "\(r)")
        let expected: [(id: String, name: String, isPublic: Bool, levels: String)] = [
            ("iCloud.com.example.TestDrive", "TestDrive", true, "None"),
            ("iCloud.com.example.SugoiApp", "SugoiApp", true, "Any"),
            ("iCloud.com.example.Notes", "Notes", true, "One"),
            ("iCloud.com.example.Ledger", "Ledger", false, "Any"),
        ]
        // The table's header names its columns; read the public flag from the PUBLIC column.
        let header = r.lines.first.map(words(of:)) ?? []
        guard let publicColumn = header.firstIndex(where: { $0.uppercased() == "PUBLIC" }) else {
            return XCTFail("`containers` has no PUBLIC column header:\n\(r.stdout)")
        }
        for e in expected {
            let row = containerRow(r, id: e.id)
            guard !row.isEmpty else { continue }
            XCTAssertTrue(row.contains(e.name), "\(e.id): name \(e.name) missing in \(row)")
            XCTAssertTrue(row.contains(e.levels), "\(e.id): levels \(e.levels) missing in \(row)")
            guard publicColumn < row.count else { XCTFail("\(e.id): short row \(row)"); continue }
            let flag = row[publicColumn].lowercased()
            XCTAssertTrue((e.isPublic ? truthy : falsy).contains(flag),
                          "\(e.id): public flag should read \(e.isPublic), got \(flag) in \(row)")
        }
    }

    func testCheckPassesOnTheSamples() throws {
        let r = ubiquityfs(["check", "--apps", appsDir])
        XCTAssertEqual(r.status, 0, "the sample manifests should be clean: \(r)")
    }

    func testCheckReportsBrokenManifests() throws {
        try writeManifest("Broken.plist", bundleID: "com.example.Broken", bundleName: "Broken", version: "1",
                          containers: [ContainerSpec(name: "Broken", levels: "Two")])
        try "this is not a property list\n".write(toFile: appsDir + "/Garbage.plist", atomically: false, encoding: .utf8)
        let r = ubiquityfs(["check", "--apps", appsDir])
        XCTAssertEqual(r.status, 1, "check should exit 1 when a manifest is broken: \(r)")
        XCTAssertTrue(r.allLines.contains { $0.contains("Broken.plist") && $0.contains("NSUbiquitousContainerSupportedFolderLevels") },
                      "one line should name Broken.plist and the key: \(r)")
        XCTAssertTrue(r.allLines.contains { $0.contains("Garbage.plist") }, "one line should name Garbage.plist: \(r)")
        for good in ["TestDrive.plist", "SugoiApp.plist", "Notes.plist", "Ledger.plist"] {
            XCTAssertFalse(r.allLines.contains { $0.contains(good) }, "\(good) is fine but was reported: \(r)")
        }
    }

    func testMountWithABrokenManifestMountsTheGoodOnes() throws {
        try writeManifest("Broken.plist", bundleID: "com.example.Broken", bundleName: "Broken", version: "1",
                          containers: [ContainerSpec(name: "Broken", levels: "Two")])
        try "<plist><dict><key>unterminated".write(toFile: appsDir + "/Garbage.plist", atomically: false, encoding: .utf8)
        try mount()
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/ok.txt", "ok"), 0)
    }

    /// One hostile manifest (nested 100,000 levels: deep enough to overflow the stack of a reader
    /// that recursed, even in a release build) must not take the other containers offline.
    func testDeeplyNestedManifestIsRefusedAndTheOthersMount() throws {
        let depth = 100_000
        let deep = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\"><dict>"
            + "<key>CFBundleIdentifier</key><string>com.example.Deep</string><key>Deep</key>"
            + String(repeating: "<array>", count: depth) + String(repeating: "</array>", count: depth) + "</dict></plist>\n"
        try deep.write(toFile: appsDir + "/Deep.plist", atomically: false, encoding: .utf8)
        let check = ubiquityfs(["check", "--apps", appsDir])
        XCTAssertEqual(check.status, 1, "\(check)")
        XCTAssertEqual(check.allLines.filter { $0.contains("Deep.plist") }.count, 1, "one line for Deep.plist: \(check)")
        XCTAssertTrue(check.allLines.contains { $0.contains("Deep.plist") && $0.contains("nested more than 512 levels") },
                      "\(check)")
        try mount()
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/ok.txt", "ok"), 0)
    }

    func testMountFailsClearlyOnAMissingMountPoint() throws {
        let missing = workDir + "/no-such-folder"
        let r = ubiquityfs(mountArguments(at: missing), timeout: 60)
        XCTAssertNotEqual(r.status, 0, "mount on a missing folder should fail: \(r)")
        XCTAssertFalse((r.stdout + r.stderr).isEmpty, "and say why")
        XCTAssertFalse(isMounted(missing))
        if let pid = readDaemonPID() {
            XCTAssertTrue(waitForExit(pid, seconds: 5), "no daemon may be left running after a failed mount")
        }
    }


    func testReadOnlyMountOption() throws {
        try mount()
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/before.txt", "written"), 0)
        try unmount()
        try mount(options: "ro")
        XCTAssertEqual(Posix.readText(docs("TestDrive") + "/before.txt"), "written")
        assertErrno(EROFS, "create on a read-only mount") { Posix.open(docs("TestDrive") + "/new.txt", O_WRONLY | O_CREAT) }
        assertErrno(EROFS, "write-open on a read-only mount") { Posix.open(docs("TestDrive") + "/before.txt", O_WRONLY) }
        assertErrno(EROFS, "unlink on a read-only mount") { unlink(docs("TestDrive") + "/before.txt") }
    }

    func testDefaultFoldersFollowXDG() throws {
        // No --apps, no --store: manifests from $XDG_CONFIG_HOME/ubiquityfs/apps, the store in
        // $XDG_DATA_HOME/ubiquityfs (the fixture points both into the test's own HOME).
        let xdgApps = homeDir + "/.config/ubiquityfs/apps"
        try FileManager.default.createDirectory(atPath: xdgApps, withIntermediateDirectories: true)
        for name in try FileManager.default.contentsOfDirectory(atPath: appsDir) {
            try FileManager.default.copyItem(atPath: appsDir + "/" + name, toPath: xdgApps + "/" + name)
        }
        let listed = ubiquityfs(["containers"])
        XCTAssertEqual(listed.status, 0, "\(listed)")
        XCTAssertFalse(containerRow(listed, id: "iCloud.com.example.Notes").isEmpty)
        storeDirOverride = defaultStoreDir
        try mount(defaultLocations: true)
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        XCTAssertNotNil(readDaemonPID(), "daemon.pid should be in $XDG_DATA_HOME/ubiquityfs")
        XCTAssertTrue(Posix.exists(defaultStoreDir + "/ubiquityfs.log"), "the log should be in $XDG_DATA_HOME/ubiquityfs")
        XCTAssertFalse(Posix.exists(workDir + "/store/daemon.pid"))
        try unmount()
    }

    // MARK: The CFBundleVersion rule

    private func writeVersioned(name: String, version: String) throws {
        try writeManifest("Versioned.plist", bundleID: "com.example.Versioned", bundleName: "Versioned",
                          version: version, containers: [ContainerSpec(name: name, levels: "Any")])
    }

    func testContainerSettingsChangeOnlyWhenTheVersionGrows() throws {
        let id = "iCloud.com.example.Versioned"
        try writeVersioned(name: "Alpha", version: "1.2")
        try mount()
        XCTAssertEqual(ls(mountPoint), ["Alpha", "Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(Posix.writeFile(docs("Alpha") + "/kept.txt", "kept across the rename\n"), 0)
        try unmount()

        // Renamed without raising the version: the registered name stays, with a warning.
        try writeVersioned(name: "Beta", version: "1.2")
        let stale = ubiquityfs(["containers", "--apps", appsDir, "--store", storeDir])
        XCTAssertEqual(stale.status, 0, "\(stale)")
        let row = containerRow(stale, id: id)
        XCTAssertTrue(row.contains("Alpha"), "the registered name should stay Alpha: \(row)")
        XCTAssertFalse(row.contains("Beta"), "the unregistered name must not show: \(row)")
        let warning = stale.allLines.first { $0.contains("NSUbiquitousContainerName") }
        XCTAssertNotNil(warning, "a warning should name the key NSUbiquitousContainerName: \(stale)")
        if let warning {
            XCTAssertTrue(warning.contains("Versioned"), "the warning should name the manifest: \(warning)")
            XCTAssertTrue(warning.contains("1.2"), "the warning should name the version: \(warning)")
        }
        try mount()
        XCTAssertEqual(ls(mountPoint), ["Alpha", "Notes", "SugoiApp", "TestDrive"])
        try unmount()

        // 1.10 > 1.2 (numeric, not string, comparison): the new name is registered, documents kept.
        try writeVersioned(name: "Beta", version: "1.10")
        let fresh = ubiquityfs(["containers", "--apps", appsDir, "--store", storeDir])
        XCTAssertEqual(fresh.status, 0, "\(fresh)")
        XCTAssertTrue(containerRow(fresh, id: id).contains("Beta"), "\(fresh)")
        XCTAssertFalse(fresh.allLines.contains { $0.contains("NSUbiquitousContainerName") },
                       "no warning once the version grew: \(fresh)")
        try mount()
        XCTAssertEqual(ls(mountPoint), ["Beta", "Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(Posix.readText(docs("Beta") + "/kept.txt"), "kept across the rename\n")
    }

    func testApplyManifestChangesFlag() throws {
        try writeVersioned(name: "Alpha", version: "3")
        try mount()
        XCTAssertEqual(Posix.writeFile(docs("Alpha") + "/doc.txt", "doc\n"), 0)
        try unmount()
        try writeVersioned(name: "Gamma", version: "3")
        try mount(extra: ["--apply-manifest-changes"])
        XCTAssertEqual(ls(mountPoint), ["Gamma", "Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(Posix.readText(docs("Gamma") + "/doc.txt"), "doc\n")
        try unmount()
        let r = ubiquityfs(["containers", "--apps", appsDir, "--store", storeDir])
        XCTAssertTrue(containerRow(r, id: "iCloud.com.example.Versioned").contains("Gamma"), "\(r)")
    }
}
