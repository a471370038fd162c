// Two daemons on one store at once, as two devices: a drive view and an app view (or two drive
// views) of the same containers. A change through either shows through the other without a
// remount, an exclusive race on one name gives the loser EEXIST (a plain one puts the second
// beside as `Name 2.ext`), and a kill -9 of one leaves the other serving.

import Foundation
import Glibc
import XCTest

final class TwoMountsTests: MountTestCase {
    /// Locks through mount B against mount A, as small Python programs see them: one line per
    /// step. Arguments: A's path, B's path, B's daemon pid, how long a dead daemon's locks may last.
    /// What `lockScript` prints when every lock behaves.
    static let lockScriptExpected = [
        "holder on B: held",
        "probe on A: flock busy, lockf busy, getlk write 0+10 pid 0",
        "probe on B: flock busy, lockf busy, getlk write 0+10 pid holder",
        "lockf waiter on A before the unlock: waiting",
        "holder on B: unlocked",
        "lockf waiter on A: taken within 5 s",
        "flock waiter on A, signalled: interrupted",
        "flock waiter on A when B's daemon dies: taken in time",
    ]
    static let lockScript = #"""
    import fcntl, os, struct, subprocess, sys, time
    a, b, pid_b, grace = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    HOLD = """
    import fcntl, sys
    f = open(sys.argv[1], "r+")
    fcntl.flock(f, fcntl.LOCK_EX)
    fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)
    print("held", flush=True)
    sys.stdin.readline()
    fcntl.lockf(f, fcntl.LOCK_UN, 10, 0)
    print("unlocked", flush=True)
    sys.stdin.readline()
    """
    PROBE = """
    import fcntl, struct, sys
    f = open(sys.argv[1], "r+")
    out = []
    try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB); out.append("flock taken")
    except BlockingIOError:
        out.append("flock busy")
    try:
        fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 5); out.append("lockf taken")
    except OSError:
        out.append("lockf busy")
    got = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 0, 0, 0))
    t, _, start, length, pid = struct.unpack("hhqqi4x", got)
    kind = {fcntl.F_WRLCK: "write", fcntl.F_RDLCK: "read", fcntl.F_UNLCK: "none"}[t]
    out.append(f"getlk {kind} {start}+{length} pid {'holder' if pid == int(sys.argv[2]) else pid}")
    print(", ".join(out))
    """
    WAIT = """
    import fcntl, signal, sys
    f = open(sys.argv[1], "r+")
    def alarm(*_): raise TimeoutError()
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(int(sys.argv[3]))
    print("waiting", flush=True)
    try:
        if sys.argv[2] == "flock": fcntl.flock(f, fcntl.LOCK_EX)
        else: fcntl.lockf(f, fcntl.LOCK_EX, 1, 5)
        signal.alarm(0)
        print("taken", flush=True)
    except TimeoutError:
        print("interrupted", flush=True)
    """
    def run(code, *args, **kw):
        return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw)
    def line(p):
        return p.stdout.readline().strip()
    open(b, "w").write("x" * 100)
    deadline = time.time() + 10
    while not (os.path.exists(a) and os.path.getsize(a) == 100) and time.time() < deadline:
        time.sleep(0.05)
    holder = run(HOLD, b)
    print("holder on B:", line(holder))
    print("probe on A:", run(PROBE, a, holder.pid).communicate()[0].strip())
    print("probe on B:", run(PROBE, b, holder.pid).communicate()[0].strip())
    waiter = run(WAIT, a, "lockf", 20)
    line(waiter)
    time.sleep(0.5)
    print("lockf waiter on A before the unlock:", "waiting" if waiter.poll() is None else "done")
    holder.stdin.write("go\n"); holder.stdin.flush()
    print("holder on B:", line(holder))
    started = time.time()
    print("lockf waiter on A:", line(waiter), "within 5 s" if time.time() - started < 5 else "late")
    waiter.wait()
    waiter = run(WAIT, a, "flock", 1)
    line(waiter)
    print("flock waiter on A, signalled:", line(waiter))
    waiter.wait()
    waiter = run(WAIT, a, "flock", grace + 20)
    line(waiter)
    time.sleep(0.3)
    os.kill(pid_b, 9)
    started = time.time()
    print("flock waiter on A when B's daemon dies:", line(waiter), "in time" if time.time() - started < grace else "late")
    waiter.wait()
    holder.kill()
    holder.wait()
    """#

    private var second: String { workDir + "/mnt2" }
    /// Far longer than any wait here: what the other mount shows must come from the daemon
    /// telling the kernel, never from the kernel's cache running out.
    static let longCache = ["--cache-seconds", "600"]

    private func mountSecond(app: String? = nil) throws {
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(app: app, extra: Self.longCache, at: second)
    }


    func testEveryKindOfChangeShowsThroughTheOtherMount() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        changeEveryKind(from: docs("SugoiApp"), seenThrough: second + "/SugoiApp")
        try unmount(at: second)
        try unmount()
    }

    /// A file big enough that its versions share a chunk list in the store: appends through A
    /// show through B (whose change feed reads each version as the list it names and what it
    /// changed), each append is a version, the first comes back whole, and after both stop the
    /// store checks whole and the file reads the same.
    func testABigFilesAppendsShowThroughTheOtherMount() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("Notes") + "/big.bin", b = second + "/Notes/big.bin"
        let first = [UInt8](try XCTUnwrap(FileHandle(forReadingAtPath: "/dev/urandom")?.readData(ofLength: 66 * 1024 * 1024 + 17)))
        XCTAssertEqual(Posix.writeFile(a, first), 0)
        var content = first
        for i in 0..<4 {
            let line = Array("line \(i)\n".utf8)
            let fd = open(a, O_WRONLY | O_APPEND)
            XCTAssertGreaterThanOrEqual(fd, 0)
            XCTAssertEqual(line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }, line.count)
            XCTAssertEqual(close(fd), 0)
            content += line
        }
        eventually("the appended file on B") { Posix.readFile(b) == content }
        let listed = ubiquityfs(["versions", a])
        let rows = listed.lines.dropFirst().map { $0.split(separator: " ", omittingEmptySubsequences: true).map(String.init) }
        XCTAssertEqual(rows.map { $0[3] }, [first.count, first.count + 7, first.count + 14, first.count + 21, first.count + 28].map(String.init),
                       listed.stdout)
        let restored = ubiquityfs(["restore", a, "--version", try XCTUnwrap(rows.first?.first)])
        XCTAssertTrue(restored.succeeded, "\(restored)")
        XCTAssertEqual(Posix.readFile(a), first)
        eventually("the restored file on B") { Posix.readFile(b) == first }
        try unmount(at: second)
        try unmount()
        assertStoreWhole()
        try mount()
        XCTAssertEqual(Posix.readFile(a), first)
        try unmount()
    }

    /// Close-to-open even while a program here keeps the file open: a new open after the other
    /// mount published reads the new content.
    func testANewOpenReadsTheOtherMountsPublishWhileTheFileIsHeldOpen() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("Notes") + "/held.txt", b = second + "/Notes/held.txt"
        XCTAssertEqual(Posix.writeFile(a, "version one\n"), 0)
        eventually("the file on B") { Posix.readText(b) == "version one\n" }
        let held = Posix.open(b, O_RDONLY)
        XCTAssertGreaterThanOrEqual(held, 0)
        XCTAssertEqual(Posix.writeFile(a, "version two, longer\n"), 0)
        eventually("the new content through a new open on B") { Posix.readText(b) == "version two, longer\n" }
        close(held)
        try unmount(at: second)
        try unmount()
    }

    /// The kernel keeps a file's pages from one open to the next while the file's version stays
    /// (keep_cache), and drops them at the first open after the version changed. Shown with the
    /// file's chunk changed behind the daemons' backs (same length, other bytes): B, whose kernel
    /// cached the file, reads it as it was without asking its daemon; A, whose kernel last saw
    /// the file before its publish, drops its pages and reads what the store now holds.
    func testTheKernelKeepsAnUnchangedFilesPagesAcrossOpens() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("Notes") + "/cached.txt", b = second + "/Notes/cached.txt"
        let original = "the first version\n", altered = "THE FIRST VERSION\n"
        XCTAssertEqual(Posix.writeFile(a, original), 0)
        eventually("the file on B") { Posix.readText(b) == original }
        XCTAssertEqual(Posix.readText(b), original)
        let chunk = try XCTUnwrap(blobFiles().first { FileManager.default.contents(atPath: $0) == Data(original.utf8) },
                                  "the file's chunk in \(storeDir)/blobs")
        XCTAssertEqual(Posix.writeFile(chunk, altered, mode: 0o600), 0)
        defer { _ = Posix.writeFile(chunk, original, mode: 0o600) }
        XCTAssertEqual(Posix.readText(b), original, "B's kernel kept its pages: the daemon was not asked")
        XCTAssertEqual(Posix.readText(a), altered, "A's kernel dropped its pages at its first open since the publish")
        XCTAssertEqual(Posix.writeFile(chunk, original, mode: 0o600), 0)
        // A new version: B's next open drops what B's kernel holds, even before B's daemon has
        // told it (its cache times are long).
        XCTAssertEqual(Posix.writeFile(a, "the second version, longer\n"), 0)
        eventually("the second version on B") { Posix.readText(b) == "the second version, longer\n" }
        try unmount(at: second)
        try unmount()
    }

    /// Every chunk file of the store.
    private func blobFiles() -> [String] {
        let blobs = storeDir + "/blobs"
        return ((try? FileManager.default.contentsOfDirectory(atPath: blobs)) ?? []).filter { $0.count == 2 }.flatMap { folder in
            ((try? FileManager.default.contentsOfDirectory(atPath: blobs + "/" + folder)) ?? []).map { blobs + "/" + folder + "/" + $0 }
        }
    }

    /// An edit saved on a base the other mount replaced meanwhile never overwrites the other's
    /// content: that stays the file's, on both mounts (the edit is kept as a conflict version and
    /// shown beside it as a conflict copy), and the editing mount's kernel does not go on showing
    /// the edit's size. `resolve` through one mount shows on both.
    func testAnEditOnAStaleBaseLeavesTheOthersContentShowing() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("Notes") + "/shared.txt", b = second + "/Notes/shared.txt"
        XCTAssertEqual(Posix.writeFile(a, "original\n"), 0)
        eventually("the file on B") { Posix.readText(b) == "original\n" }
        let fd = Posix.open(b, O_WRONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        let edit = "B's edit, which is longer than the other one\n"
        XCTAssertEqual(write(fd, edit, edit.utf8.count), edit.utf8.count)
        XCTAssertEqual(Posix.writeFile(a, "A wins\n"), 0)
        usleep(300_000)   // B's change feed has seen A's publish
        close(fd)
        eventually("A's content on B after B's stale save") { Posix.readText(b) == "A wins\n" }
        XCTAssertEqual(Posix.readText(a), "A wins\n")
        XCTAssertEqual(Posix.stat(b)?.st_size, 7)
        // B's edit is shown beside the file, on both mounts, until resolved.
        let isCopy: (String) -> Bool = { $0.hasPrefix("shared (conflict from ") && $0.hasSuffix(").txt") }
        eventually("the conflict copy on B") { ls(second + "/Notes").contains(where: isCopy) }
        eventually("the conflict copy on A") { ls(docs("Notes")).contains(where: isCopy) }
        let copy = try XCTUnwrap(ls(docs("Notes")).first(where: isCopy))
        XCTAssertEqual(Posix.readText(docs("Notes") + "/" + copy), edit)
        let status = ubiquityfs(["status", mountPoint])
        XCTAssertTrue(status.succeeded, status.description)
        XCTAssertTrue(status.stdout.contains("unresolved conflicts: 1"), status.stdout)
        XCTAssertTrue(status.stdout.contains("Notes/" + copy), status.stdout)
        // Keep B's edit: it becomes the file on both mounts, and the copy goes.
        let conflictVersion = try XCTUnwrap(ubiquityfs(["versions", b]).lines.first { $0.contains("conflict") }?
            .split(separator: " ").first.map(String.init))
        let resolved = ubiquityfs(["resolve", b, "--keep", conflictVersion])
        XCTAssertTrue(resolved.succeeded, resolved.description)
        eventually("B's edit current on A") { Posix.readText(a) == edit }
        eventually("B's edit current on B") { Posix.readText(b) == edit }
        eventually("no copy on A") { !ls(docs("Notes")).contains(where: isCopy) }
        eventually("no copy on B") { !ls(second + "/Notes").contains(where: isCopy) }
        XCTAssertTrue(ubiquityfs(["status", second]).stdout.contains("unresolved conflicts: none"))
        try unmount(at: second)
        try unmount()
    }

    /// POSIX checks in the manner of pjdfstest run on both mounts at once (each in a folder of
    /// its own, both in one container): the second daemon changes nothing of what either mount
    /// promises.
    func testPOSIXChecksPassOnEachMountAtOnce() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let script = #"""
        import errno, os, stat, sys
        base = sys.argv[1]
        os.mkdir(base)
        os.chdir(base)
        def fails(code, f, *a):
            try:
                f(*a)
            except OSError as e:
                assert e.errno == code, (f.__name__, a, errno.errorcode[e.errno], errno.errorcode[code])
                return
            raise AssertionError((f.__name__, a, "succeeded"))
        for round in range(20):
            os.mkdir("d"); fails(errno.EEXIST, os.mkdir, "d")
            os.mkdir("d/sub"); fails(errno.ENOTEMPTY, os.rmdir, "d"); fails(errno.EINVAL, os.rename, "d", "d/sub/x")
            fd = os.open("f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
            os.write(fd, b"x" * 100); os.close(fd)
            fails(errno.EEXIST, os.open, "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            assert stat.S_IMODE(os.stat("f").st_mode) == 0o640
            os.chmod("f", 0o600); assert stat.S_IMODE(os.stat("f").st_mode) == 0o600
            os.truncate("f", 10); assert os.stat("f").st_size == 10
            os.utime("f", (1000000000, 1000000000)); assert os.stat("f").st_mtime == 1000000000
            os.link("f", "g"); assert os.stat("f").st_nlink == 2 and os.stat("f").st_ino == os.stat("g").st_ino
            os.symlink("f", "s"); assert os.readlink("s") == "f"
            fails(errno.EISDIR, os.unlink, "d"); fails(errno.ENOTDIR, os.rmdir, "f")
            fails(errno.ENOENT, os.stat, "missing"); fails(errno.ENOTDIR, os.stat, "f/x")
            os.rename("f", "d/moved"); assert os.stat("g").st_nlink == 2
            fails(errno.ENOENT, os.stat, "f")
            for p in ("d/moved", "g", "s"): os.unlink(p)
            os.rmdir("d/sub"); os.rmdir("d")
            assert os.listdir(".") == [], os.listdir(".")
        print("ok")
        """#
        let first = docs("SugoiApp") + "/on-first", secondDir = second + "/SugoiApp/on-second"
        let r = assertShell("python3 -c \(shellQuote(script)) \(shellQuote(first)) & "
                            + "python3 -c \(shellQuote(script)) \(shellQuote(secondDir)); wait $!; wait", timeout: 120)
        XCTAssertEqual(r.stdout, "ok\nok\n", r.stderr)
        try unmount(at: second)
        try unmount()
    }

    func testTheDriveViewAndTheAppViewAtOnce() throws {
        try mount(extra: Self.longCache)
        try mountSecond(app: "com.example.TestDrive")
        let app = second + "/iCloud.com.example.TestDrive"
        XCTAssertEqual(Posix.writeFile(app + "/Documents/MyTextFile.txt", "Hello from the app\n"), 0)
        eventually("the app's file in the drive view") {
            Posix.readText(docs("TestDrive") + "/MyTextFile.txt") == "Hello from the app\n"
        }
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/FromLinux.txt", "hi\n"), 0)
        eventually("the drive view's file in the app view") { Posix.readText(app + "/Documents/FromLinux.txt") == "hi\n" }
        try unmount(at: second)
        try unmount()
    }

    /// Exclusive creates of one name from both: one gets EEXIST. Plain creates from both, each
    /// mount's writer racing the other's change feed: no error, and each name ends as one file
    /// (the second opened the first's) or two (the second, made before its mount had seen the
    /// first, lands beside it as `Name 2.ext`) or a file and a conflict copy (both wrote the one
    /// file at once), each with one writer's content.
    func testTheSameNewNameOnBoth() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("Notes"), b = second + "/Notes"
        // Exclusive creates from both at once: exactly one wins.
        let r = assertShell("""
            ( python3 -c 'import os,sys; os.close(os.open(sys.argv[1], os.O_CREAT|os.O_EXCL|os.O_WRONLY)); print("A")' \(shellQuote(a + "/same.txt")) 2>/dev/null || echo "A lost" ) &
            ( python3 -c 'import os,sys; os.close(os.open(sys.argv[1], os.O_CREAT|os.O_EXCL|os.O_WRONLY)); print("B")' \(shellQuote(b + "/same.txt")) 2>/dev/null || echo "B lost" ) &
            wait
            """)
        let outcome = Set(r.stdout.split(separator: "\n").map(String.init))
        XCTAssertTrue(outcome == ["A", "B lost"] || outcome == ["B", "A lost"], "one wins, one gets EEXIST: \(outcome)")
        assertSucceeds("mkdir on A") { mkdir(a + "/Folder", 0o755) }
        eventually("the folder on B") { Posix.exists(b + "/Folder") }
        assertErrno(EEXIST, "mkdir of the same folder on B") { mkdir(b + "/Folder", 0o755) }

        let writer = """
            import os, sys
            for i in range(40):
                try:
                    fd = os.open(os.path.join(sys.argv[1], "n%d.txt" % i), os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
                    os.write(fd, sys.argv[2].encode()); os.close(fd)
                except OSError as e:
                    print("%s: n%d.txt: %s" % (sys.argv[2], i, e))
            """
        let errors = assertShell("""
            python3 -c \(shellQuote(writer)) \(shellQuote(a + "/Folder")) A &
            python3 -c \(shellQuote(writer)) \(shellQuote(b + "/Folder")) B &
            wait
            """).stdout
        XCTAssertEqual(errors, "", "no create failed")
        var beside = 0, conflicts = 0
        eventually("both mounts list the same") { ls(a + "/Folder") == ls(b + "/Folder") }
        let names = ls(b + "/Folder")
        for i in 0..<40 {
            // Or one file that both wrote at once: the second publish is a conflict copy.
            let group = names.filter { $0 == "n\(i).txt" || $0 == "n\(i) 2.txt" || $0.hasPrefix("n\(i) (conflict from ") }
            XCTAssertTrue(group.contains("n\(i).txt"), "n\(i).txt")
            let contents = group.map { Posix.readText(a + "/Folder/" + $0) ?? "unreadable" }
            XCTAssertTrue(Set(contents).isSubset(of: ["A", "B"]) && Set(contents).count == contents.count, "\(group): \(contents)")
            if group.contains("n\(i) 2.txt") { beside += 1 }
            if group.contains(where: { $0.contains("(conflict from ") }) { conflicts += 1 }
        }
        XCTAssertEqual(names.count, 40 + beside + conflicts, "nothing else: \(names)")
        print("same new names from both mounts: \(beside) of 40 landed beside as Name 2, \(conflicts) as conflict copies")

        // Made on A, then at once on B, before B's change feed (ten times a second) has seen it:
        // B's file lands beside. B's kernel, answered for the name it asked, is told to drop it,
        // so B then shows A's file under the name, as A does.
        let sequential = """
            import os, sys
            for i in range(10):
                for folder, text in ((sys.argv[1], "A"), (sys.argv[2], "B")):
                    fd = os.open(os.path.join(folder, "s%d.txt" % i), os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
                    os.write(fd, text.encode()); os.close(fd)
            """
        assertShell("python3 -c \(shellQuote(sequential)) \(shellQuote(a + "/Folder")) \(shellQuote(b + "/Folder"))")
        usleep(500_000)
        var landedBeside = 0
        for i in 0..<10 {
            let name = "/Folder/s\(i).txt", second = "/Folder/s\(i) 2.txt"
            XCTAssertEqual(Posix.stat(b + name)?.st_ino, Posix.stat(a + name)?.st_ino, name)
            XCTAssertEqual(Posix.readText(b + name), Posix.readText(a + name), name)
            if Posix.exists(b + second) {
                landedBeside += 1
                XCTAssertEqual(Posix.readText(b + name), "A", name)
                XCTAssertEqual(Posix.readText(a + second), "B", second)
            }
        }
        XCTAssertGreaterThan(landedBeside, 0, "B made at least one before its feed had seen A's")
        print("made on A, then at once on B: \(landedBeside) of 10 landed beside")
        try unmount(at: second)
        try unmount()
    }

    /// A folder renamed through one mount while a program writes a file inside it through the
    /// other: the writes land in the file, which is now under the new name.
    func testRenameOfAFolderOnOneWhileTheOtherWritesInside() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("SugoiApp"), b = second + "/SugoiApp"
        assertSucceeds("mkdir") { mkdir(a + "/Project", 0o755) }
        eventually("the folder on B") { Posix.exists(b + "/Project") }
        let fd = Posix.open(b + "/Project/notes.txt", O_WRONLY | O_CREAT, 0o644)
        XCTAssertGreaterThanOrEqual(fd, 0)
        XCTAssertEqual(write(fd, "one ", 4), 4)
        assertSucceeds("rename the folder on A") { rename(a + "/Project", a + "/Renamed") }
        XCTAssertEqual(write(fd, "two", 3), 3)
        close(fd)
        eventually("the file, whole, under the new name on A") { Posix.readText(a + "/Renamed/notes.txt") == "one two" }
        eventually("and on B") { Posix.readText(b + "/Renamed/notes.txt") == "one two" && !Posix.exists(b + "/Project") }
        try unmount(at: second)
        try unmount()
    }

    /// Deleted on A while B edits it: B's save brings it back, with B's edit, on both mounts.
    /// Renamed on A while B edits it: B's save lands in the renamed file.
    func testDeleteOrRenameOnOneWhileTheOtherEdits() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("Notes"), b = second + "/Notes"
        XCTAssertEqual(Posix.writeFile(a + "/draft.txt", "draft\n"), 0)
        eventually("the file on B") { Posix.readText(b + "/draft.txt") == "draft\n" }
        var fd = Posix.open(b + "/draft.txt", O_WRONLY | O_TRUNC)
        XCTAssertGreaterThanOrEqual(fd, 0)
        assertSucceeds("rm on A") { unlink(a + "/draft.txt") }
        eventually("gone on B") { !Posix.exists(b + "/draft.txt") }
        XCTAssertEqual(write(fd, "B's edit\n", 9), 9)
        close(fd)
        eventually("back on B with B's edit") { Posix.readText(b + "/draft.txt") == "B's edit\n" }
        eventually("back on A with B's edit") { Posix.readText(a + "/draft.txt") == "B's edit\n" }
        XCTAssertEqual(ubiquityfs(["trash", "list", "--store", storeDir]).stdout, "Recently Deleted is empty\n")

        fd = Posix.open(b + "/draft.txt", O_WRONLY | O_APPEND)
        XCTAssertGreaterThanOrEqual(fd, 0)
        assertSucceeds("mv on A") { rename(a + "/draft.txt", a + "/final.txt") }
        eventually("renamed on B") { Posix.exists(b + "/final.txt") }
        XCTAssertEqual(write(fd, "more\n", 5), 5)
        close(fd)
        eventually("the edit in the renamed file on A") { Posix.readText(a + "/final.txt") == "B's edit\nmore\n" }
        XCTAssertFalse(Posix.exists(a + "/draft.txt"))
        XCTAssertEqual(ls(a), ["final.txt"], "no conflict copy: nobody else changed the content")
        try unmount(at: second)
        try unmount()
    }

    func testKillingOneDaemonLeavesTheOtherServing() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("SugoiApp"), b = second + "/SugoiApp"
        // Saved with fsync, so B has published it before it dies (a file only closed may still
        // be B's working copy, which the next daemon to start on the store recovers).
        let saved = Posix.open(b + "/kept.txt", O_WRONLY | O_CREAT, 0o644)
        XCTAssertEqual(write(saved, "kept\n", 5), 5)
        XCTAssertEqual(fsync(saved), 0)
        close(saved)
        let pid = try daemonPID(of: second)
        // B is writing one file when it dies, and has just saved and closed another.
        let fd = Posix.open(b + "/open.txt", O_WRONLY | O_CREAT, 0o644)
        XCTAssertEqual(write(fd, "unsaved", 7), 7)
        XCTAssertEqual(Posix.writeFile(b + "/closed.txt", "saved a moment ago\n"), 0)
        kill(pid, SIGKILL)
        XCTAssertTrue(waitForExit(pid, seconds: 10))
        close(fd)
        clearDeadMount(second)
        // A never blocks or errors, and sees what B committed.
        XCTAssertEqual(Posix.writeFile(a + "/after.txt", "A goes on\n"), 0)
        eventually("B's file on A") { Posix.readText(a + "/kept.txt") == "kept\n" }
        XCTAssertEqual(Posix.readText(a + "/after.txt"), "A goes on\n")
        // The file B closed but may not have published: A takes over B's working copies.
        eventually("B's last saved file on A, without B coming back", seconds: 15) {
            Posix.readText(a + "/closed.txt") == "saved a moment ago\n"
        }
        // B comes back and recovers its own working copy (not A's).
        let fdA = Posix.open(a + "/busy.txt", O_WRONLY | O_CREAT, 0o644)
        XCTAssertEqual(write(fdA, "A's work", 8), 8)
        try mountSecond()
        eventually("B's recovered file") { Posix.exists(b + "/open.txt") }
        XCTAssertEqual(write(fdA, " goes on", 8), 8, "A's open file is untouched by B's recovery")
        close(fdA)
        eventually("A's file on B") { Posix.readText(b + "/busy.txt") == "A's work goes on" }
        try unmount(at: second)
        try unmount()
    }

    /// flock and fcntl locks taken through one mount block conflicting ones through the other;
    /// F_GETLK names a holder on this mount and gives pid 0 for one on the other; a waiter wakes
    /// when the holder unlocks, gives up with EINTR on a signal, and gets the lock when the other
    /// daemon is killed while its holder still holds it.
    func testLocksAcrossTheMounts() throws {
        try mount(extra: Self.longCache)
        try mountSecond()
        let a = docs("SugoiApp") + "/shared.db", b = second + "/SugoiApp/shared.db"
        let pidB = try daemonPID(of: second)
        let r = assertShell("python3 -c \(shellQuote(Self.lockScript)) \(shellQuote(a)) \(shellQuote(b)) \(pidB) 10", timeout: 90)
        XCTAssertEqual(r.stdout.split(separator: "\n").map(String.init), Self.lockScriptExpected, r.stderr)
        XCTAssertTrue(waitForExit(pidB, seconds: 10))
        clearDeadMount(second)
        try unmount()
    }
}
