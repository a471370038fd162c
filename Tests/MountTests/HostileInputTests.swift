// Hostile input through the mount and to the commands: names that are not UTF-8 or hold
// control characters, attribute sizes past every limit, calls on files unlinked while open, a
// busy mount point at unmount, and store folders that are damaged or from a newer version
// (refused with one clear line, left as they were).

import Foundation
import Glibc
import XCTest

final class HostileInputTests: MountTestCase {
    private var dir: String { docs("SugoiApp") }

    /// Runs a Python snippet (bytes paths, raw errnos) with `D` the folder under test; its
    /// output's lines.
    @discardableResult
    private func python(_ code: String, file: StaticString = #filePath, line: UInt = #line) -> [String] {
        let r = Command.run(["python3", "-c", "import os, errno, sys\nD = os.fsencode(sys.argv[1])\n" + code, dir],
                            timeout: 120, environment: environment)
        XCTAssertTrue(r.succeeded, "\(r)", file: file, line: line)
        return r.lines
    }

    func testNamesThatAreNotUTF8OrHoldControlCharacters() throws {
        try mount()
        let names = #"[b"\xff\xfe.txt", b"caf\xe9.txt", b"a\x01b", b"tab\there", b"new\nline", b"-rf", b" lead", b"trail ", b"...", b"\xe2\x80\xae-rtl", b"n" * 255]"#
        let made = python("""
            names = \(names)
            for n in names:
                p = os.path.join(D, n)
                with open(p, "wb") as f: f.write(n)
                os.setxattr(p, "user.n", n)
            got = sorted(os.listdir(D))
            print("listed", got == sorted(names))
            print("read", all(open(os.path.join(D, n), "rb").read() == n for n in names))
            print("xattr", all(os.getxattr(os.path.join(D, n), "user.n") == n for n in names))
            for n in names[:-1]:
                os.rename(os.path.join(D, n), os.path.join(D, n + b".2"))
            try:
                os.rename(os.path.join(D, b"n" * 255), os.path.join(D, b"n" * 255 + b".2"))
            except OSError as e:
                print("255+2", errno.errorcode[e.errno])
            print("renamed", sorted(os.listdir(D)) == sorted([n + b".2" for n in names[:-1]] + [b"n" * 255]))
            try:
                open(os.path.join(D, b"n" * 256), "wb")
            except OSError as e:
                print("256", errno.errorcode[e.errno])
            try:
                open(os.path.join(D, b"bad\\x00"), "wb")
            except ValueError:
                print("nul refused by the caller")
            """)
        // Every name but the 255-byte one takes a 2-byte suffix; that one's rename gets
        // ENAMETOOLONG and it stays as it was.
        XCTAssertEqual(made.prefix(3), ["listed True", "read True", "xattr True"])
        XCTAssertTrue(made.contains("255+2 ENAMETOOLONG") && made.contains("renamed True"), "\(made)")
        XCTAssertTrue(made.contains("256 ENAMETOOLONG"), "\(made)")
        XCTAssertTrue(made.contains("nul refused by the caller"), "\(made)")
        // Deleted into Recently Deleted, listed one item a line, restored under its own name.
        python("""
            os.unlink(os.path.join(D, b"new\\nline.2"))
            os.unlink(os.path.join(D, b"\\xff\\xfe.txt.2"))
            """)
        let trash = ubiquityfs(["trash", "list", "SugoiApp", "--store", storeDir])
        XCTAssertTrue(trash.succeeded, "\(trash)")
        XCTAssertEqual(trash.lines.count, 3, "a header and one line per item, whatever the names: \(trash.stdout)")
        XCTAssertTrue(trash.stdout.contains("SugoiApp/new\\nline.2"), "a newline shown escaped: \(trash.stdout)")
        for line in trash.lines.dropFirst() {
            let id = String(line.split(separator: " ").first ?? "")
            let restored = ubiquityfs(["trash", "restore", id, "--store", storeDir])
            XCTAssertTrue(restored.succeeded, "\(restored)")
        }
        try unmount()
        assertStoreWhole()
        try mount()
        let after = python("""
            names = \(names)
            want = sorted(n + b".2" for n in names[:-1]) + [b"n" * 255]
            got = sorted(os.listdir(D))
            print("kept", got == sorted(want), got if got != sorted(want) else "")
            print("read", all(open(os.path.join(D, n + b".2" if len(n) < 255 else n), "rb").read() == n for n in names))
            """)
        XCTAssertEqual(after.first.map { $0.hasPrefix("kept True") }, true, "\(after)")
        XCTAssertEqual(after.last, "read True")
        try unmount()
    }

    func testExtendedAttributeSizeLimits() throws {
        try mount()
        let out = python("""
            p = os.path.join(D, b"tagged")
            open(p, "wb").close()
            def tryset(name, value):
                try:
                    os.setxattr(p, name, value)
                    return "ok"
                except OSError as e:
                    return errno.errorcode[e.errno]
            print("name 255", tryset(b"user." + b"n" * 250, b"v"))
            print("name 256", tryset(b"user." + b"n" * 251, b"v"))
            print("value 64K", tryset(b"user.big", b"v" * 65536))
            print("value 64K+1", tryset(b"user.bigger", b"v" * 65537))
            print("big read back", len(os.getxattr(p, b"user.big")) == 65536)
            # Many attributes: their names fill the 64 KiB a listxattr can return.
            n = 0
            while True:
                r = tryset(b"user.many-%05d-" % n + b"x" * 200, b"")
                if r != "ok":
                    print("many", r, n > 200)
                    break
                n += 1
            print("listed", len(os.listxattr(p)) == n + 2 + 3)
            # Values: at most 1 MiB per file.
            q = os.path.join(D, b"heavy")
            open(q, "wb").close()
            k = 0
            while True:
                try:
                    os.setxattr(q, b"user.v%d" % k, b"w" * 65536)
                except OSError as e:
                    print("values", errno.errorcode[e.errno], k)
                    break
                k += 1
            print("replace in place", tryset(b"user.big", b"small"))
            """)
        XCTAssertEqual(out, ["name 255 ok", "name 256 ERANGE", "value 64K ok", "value 64K+1 E2BIG", "big read back True",
                             "many ENOSPC True", "listed True", "values ENOSPC 16", "replace in place ok"])
        // The tools a user reaches for still read every attribute.
        XCTAssertTrue(sh("getfattr -d \(shellQuote(dir + "/tagged")) | grep -c user.many").succeeded)
        try unmount()
        assertStoreWhole()
    }

    func testCallsOnAFileUnlinkedWhileOpen() throws {
        try mount()
        let out = python("""
            import mmap
            p = os.path.join(D, b"open-then-unlinked")
            fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
            os.write(fd, b"0123456789" * 1000)
            os.unlink(p)
            print("gone", not os.path.exists(p))
            os.pwrite(fd, b"after", 5)
            os.ftruncate(fd, 5000)
            os.fchmod(fd, 0o600)
            os.setxattr(fd, "user.k", b"v")
            os.utime(fd, ns=(1_000_000_000, 2_000_000_000))
            os.fsync(fd)
            st = os.fstat(fd)
            print("stat", st.st_size, oct(st.st_mode & 0o777), st.st_mtime_ns, st.st_nlink)
            print("xattr", os.getxattr(fd, "user.k"))
            m = mmap.mmap(fd, 5000)
            print("mapped", m[:12])
            m[0:1] = b"X"
            m.flush(); m.close()
            print("read", os.pread(fd, 12, 0))
            os.close(fd)
            print("left", sorted(os.listdir(D)))
            """)
        XCTAssertEqual(out, ["gone True", "stat 5000 0o600 2000000000 0", "xattr b'v'", "mapped b'01234after01'",
                             "read b'X1234after01'", "left []"])
        try unmount()
        assertStoreWhole()
    }

    func testABusyMountPointIsNotUnmountedAndStillWorks() throws {
        try mount()
        let holder = try BackgroundProcess(["sh", "-c", "cd \(shellQuote(dir)) && exec sleep 120"], environment: environment,
                                           log: workDir + "/holder.out")
        defer { holder.stop() }
        eventually("the holder is in the mount") {
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(holder.pid)/cwd")) == dir
        }
        let busy = ubiquityfs(["unmount", mountPoint])
        XCTAssertNotEqual(busy.status, 0, "\(busy)")
        XCTAssertEqual(busy.stderr.split(separator: "\n").count, 1, "one line says why: \(busy.stderr)")
        XCTAssertTrue(busy.stderr.contains("is busy") && busy.stderr.contains("fuser -m"), busy.stderr)
        XCTAssertTrue(isMounted(mountPoint), "still mounted")
        XCTAssertEqual(Posix.writeFile(dir + "/still.txt", "works\n"), 0)
        XCTAssertEqual(Posix.readText(dir + "/still.txt"), "works\n")
        holder.stop()
        try unmount()
        try mount()
        XCTAssertEqual(Posix.readText(dir + "/still.txt"), "works\n")
        try unmount()
    }

    /// A store from a newer ubiquityfs, and one whose database is damaged: the mount and the
    /// commands refuse with one clear line, and the folder is left byte for byte as it was.
    func testANewerOrDamagedStoreIsRefusedAndLeftAlone() throws {
        try mount()
        XCTAssertEqual(Posix.writeFile(dir + "/kept.txt", "kept\n"), 0)
        try unmount()
        let db = storeDir + "/metadata.sqlite3"
        func fingerprint() -> String {
            sh("cd \(shellQuote(storeDir)) && find . -type f -not -name ubiquityfs.log -print0 | sort -z | xargs -0 sha256sum").stdout
        }
        assertShell("sqlite3 \(shellQuote(db)) \"UPDATE store_meta SET value = 99 WHERE key = 'schema_version'\"")
        var before = fingerprint()
        for args in [mountArguments(), ["fsck", "--store", storeDir], ["trash", "list", "--store", storeDir]] {
            let r = ubiquityfs(args)
            XCTAssertNotEqual(r.status, 0, "\(args): \(r)")
            XCTAssertTrue(r.stderr.contains("schema version 99") && r.stderr.contains("newer ubiquityfs"), "\(args): \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, "one line: \(r.stderr)")
            XCTAssertFalse(isMounted(mountPoint))
            XCTAssertEqual(fingerprint(), before, "\(args) changed the store")
        }
        assertShell("sqlite3 \(shellQuote(db)) \"UPDATE store_meta SET value = 1 WHERE key = 'schema_version'\"")

        // Damaged: the database file's header overwritten.
        assertShell("printf 'this is not a database at all, not at all' | dd of=\(shellQuote(db)) conv=notrunc 2>/dev/null")
        before = fingerprint()
        for args in [mountArguments(), ["fsck", "--store", storeDir]] {
            let r = ubiquityfs(args)
            XCTAssertNotEqual(r.status, 0, "\(args): \(r)")
            XCTAssertTrue(r.stderr.contains(db), "\(args) names the file: \(r.stderr)")
            XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, "one line: \(r.stderr)")
            XCTAssertFalse(isMounted(mountPoint))
            XCTAssertEqual(fingerprint(), before, "\(args) changed the store")
        }
    }
}
