// Isolation: with `-o allow_other` the kernel enforces each file's permissions for every user;
// another user reaches neither the store's own files nor, by path, symlink or `..`, a private
// container; and a file handle (`open_by_handle_at`) made up for a private container's file
// opens nothing.

import Foundation
import Glibc
import XCTest

final class IsolationTests: MountTestCase {
    /// Runs `script` with sh as user nobody (uid and gid 65534, no other groups).
    private func asNobody(_ script: String) -> CommandResult {
        Command.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script],
                    timeout: 60, environment: environment)
    }

    func testOtherUsersGetWhatTheModesAllowAndNothingOfTheStore() throws {
        // The test's folder is 0700 (mkdtemp): open it so that another user can reach the
        // mount point at all. The store folder in it stays the daemon's own (0700).
        XCTAssertEqual(chmod(workDir, 0o755), 0)
        try mount(options: "allow_other")
        let d = docs("SugoiApp")
        XCTAssertEqual(Posix.writeFile(d + "/public.txt", "for all\n", mode: 0o644), 0)
        XCTAssertEqual(Posix.writeFile(d + "/secret.txt", "for root\n", mode: 0o600), 0)
        XCTAssertEqual(chmod(d + "/secret.txt", 0o600), 0)
        XCTAssertEqual(mkdir(d + "/Shared", 0o777), 0)
        XCTAssertEqual(chmod(d + "/Shared", 0o1777), 0)   // sticky, like /tmp
        XCTAssertEqual(Posix.writeFile(d + "/Shared/roots.txt", "root's\n", mode: 0o666), 0)
        XCTAssertEqual(chmod(d + "/Shared/roots.txt", 0o666), 0)
        // The folder hides nothing, but the file is root's alone.
        let q = shellQuote(d)
        XCTAssertEqual(asNobody("cat \(q)/public.txt").stdout, "for all\n")
        let secret = asNobody("cat \(q)/secret.txt")
        XCTAssertNotEqual(secret.status, 0)
        XCTAssertTrue(secret.stderr.contains("Permission denied"), secret.stderr)
        XCTAssertNotEqual(asNobody("echo x >> \(q)/public.txt").status, 0, "nobody may not write root's 0644 file")
        XCTAssertNotEqual(asNobody("touch \(q)/mine.txt").status, 0, "nor create in root's 0755 folder")
        XCTAssertEqual(Posix.readText(d + "/public.txt"), "for all\n")
        // In a sticky folder open to all: nobody makes its own file, and cannot remove root's.
        XCTAssertTrue(asNobody("echo mine > \(q)/Shared/nobodys.txt").succeeded)
        XCTAssertEqual(Posix.stat(d + "/Shared/nobodys.txt")?.st_uid, 65534, "owned by its maker")
        let removed = asNobody("rm -f \(q)/Shared/roots.txt")
        XCTAssertNotEqual(removed.status, 0, "sticky: only the owner removes")
        XCTAssertTrue(Posix.exists(d + "/Shared/roots.txt"))
        XCTAssertTrue(asNobody("echo more >> \(q)/Shared/roots.txt").succeeded, "0666 lets anyone write")
        // The store's files, and private containers, by any path.
        let store = asNobody("ls \(shellQuote(storeDir)); cat \(shellQuote(storeDir + "/metadata.sqlite3")) > /dev/null")
        XCTAssertNotEqual(store.status, 0)
        XCTAssertTrue(store.stderr.contains("Permission denied"), store.stderr)
        XCTAssertEqual(symlink("../Ledger", d + "/to-ledger"), 0)
        XCTAssertEqual(symlink("../../Ledger/Documents", d + "/Shared/deeper"), 0)
        for path in [mountPoint + "/Ledger", d + "/to-ledger", d + "/Shared/deeper", d + "/../Ledger",
                     mountPoint + "/iCloud.com.example.Ledger", mountPoint + "/SugoiApp/../../" + (mountPoint as NSString).lastPathComponent + "/Ledger"] {
            XCTAssertNil(Posix.stat(path), "\(path) reaches nothing")
            XCTAssertNotEqual(asNobody("stat -L \(shellQuote(path))").status, 0, path)
        }
        try unmount()
    }

    /// The desktop trash at the root (`.Trash-0`, Recently Deleted) is the store user's: another
    /// user lists, reads, restores and deletes nothing in it, and makes no trash of its own.
    func testAnotherUserReachesNothingOfTheDesktopTrash() throws {
        XCTAssertEqual(chmod(workDir, 0o755), 0)
        try mount(options: "allow_other")
        let d = docs("SugoiApp")
        XCTAssertEqual(Posix.writeFile(d + "/gone.txt", "deleted by root\n", mode: 0o644), 0)
        XCTAssertEqual(unlink(d + "/gone.txt"), 0)
        let trash = mountPoint + "/.Trash-0"
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: trash + "/files"), ["gone.txt"])
        let mode = try XCTUnwrap(Posix.stat(trash)).st_mode
        XCTAssertEqual(mode & 0o077, 0, "the trash folder is its owner's alone: \(String(mode, radix: 8))")
        let t = shellQuote(trash)
        for (script, what) in [("ls \(t)", "list the trash"), ("ls \(t)/files", "list its files"),
                               ("cat \(t)/files/gone.txt", "read a deleted file"),
                               ("cat \(t)/info/gone.txt.trashinfo", "read where it was"),
                               ("mv \(t)/files/gone.txt \(shellQuote(d))/back.txt", "restore it"),
                               ("rm -f \(t)/files/gone.txt", "delete it for good"),
                               ("mkdir \(shellQuote(mountPoint))/.Trash-65534", "make a trash of its own")] {
            let r = asNobody(script)
            XCTAssertNotEqual(r.status, 0, "nobody may not \(what): \(r)")
            XCTAssertFalse(r.stdout.contains("gone") || r.stdout.contains("deleted by root"), "\(what): \(r.stdout)")
        }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: trash + "/files"), ["gone.txt"], "still there")
        XCTAssertFalse(Posix.exists(d + "/back.txt"))
        XCTAssertEqual(Posix.readText(trash + "/files/gone.txt"), "deleted by root\n")
        try unmount()
    }

    /// A chunk file of the store replaced by a symlink (someone with access to the store's
    /// folder) is not followed: the read fails with EIO and nothing of the link's target shows.
    func testASymlinkPlantedInTheStoreIsNotFollowed() throws {
        try mount()
        let path = docs("SugoiApp") + "/doc.txt"
        XCTAssertEqual(Posix.writeFile(path, "the document\n"), 0)
        try unmount()
        let all = sh("find \(shellQuote(storeDir + "/blobs")) -type f -not -path '*/.tmp/*'").lines
        let blob = try XCTUnwrap(all.first { (try? Data(contentsOf: URL(fileURLWithPath: $0))) == Data("the document\n".utf8) })
        let outside = workDir + "/outside.txt"
        XCTAssertEqual(Posix.writeFile(outside, "not the store's\n"), 0)
        XCTAssertEqual(unlink(blob), 0)
        XCTAssertEqual(symlink(outside, blob), 0)
        try mount()
        let fd = Posix.open(path, O_RDONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        let read = Posix.pread(fd, count: 100, at: 0)
        let code = errno
        close(fd)
        XCTAssertNil(read, "read \(read.map { String(decoding: $0, as: UTF8.self) } ?? "")")
        XCTAssertEqual(code, EIO)
        try unmount()
    }

    /// A folder of the store replaced by a symlink (O_NOFOLLOW guards only a path's last
    /// component): the mount is refused with one clear line, and nothing is written where the
    /// link points.
    func testASymlinkedFolderInTheStoreIsRefused() throws {
        try mount()
        XCTAssertEqual(Posix.writeFile(docs("SugoiApp") + "/doc.txt", "the document\n"), 0)
        try unmount()
        let blobs = storeDir + "/blobs"
        let folder = try XCTUnwrap(try FileManager.default.contentsOfDirectory(atPath: blobs)
            .sorted().first { $0.count == 2 })
        let elsewhere = workDir + "/elsewhere"
        XCTAssertEqual(rename(blobs + "/" + folder, elsewhere), 0)
        XCTAssertEqual(symlink(elsewhere, blobs + "/" + folder), 0)
        let before = try FileManager.default.contentsOfDirectory(atPath: elsewhere).sorted()
        let r = ubiquityfs(mountArguments())
        XCTAssertNotEqual(r.status, 0, "\(r)")
        XCTAssertTrue(r.stderr.contains("holds a symbolic link, \(blobs)/\(folder)"), r.stderr)
        XCTAssertEqual(r.stderr.split(separator: "\n").count, 1, r.stderr)
        XCTAssertFalse(isMounted(mountPoint))
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: elsewhere).sorted(), before)
        let fsck = ubiquityfs(["fsck", "--store", storeDir])
        XCTAssertNotEqual(fsck.status, 0, "fsck refuses it too: \(fsck)")
        // Put back in place, the store opens whole.
        XCTAssertEqual(unlink(blobs + "/" + folder), 0)
        XCTAssertEqual(rename(elsewhere, blobs + "/" + folder), 0)
        try mount()
        XCTAssertEqual(Posix.readText(docs("SugoiApp") + "/doc.txt"), "the document\n")
        try unmount()
        assertStoreWhole()
    }

    /// A handle names a node by its number; the drive view's kernel never holds a private
    /// container's nodes, so a handle made up for one opens nothing, while a real handle of a
    /// shown file opens it.
    func testAMadeUpFileHandleReachesNoPrivateContainer() throws {
        try mount(app: "com.example.Ledger")
        let ledgerFile = mountPoint + "/iCloud.com.example.Ledger/Documents/ledger.txt"
        XCTAssertEqual(Posix.writeFile(ledgerFile, "private\n"), 0)
        let privateIno = try XCTUnwrap(Posix.stat(ledgerFile)).st_ino
        try unmount()
        try mount()
        let shown = docs("SugoiApp") + "/shown.txt"
        XCTAssertEqual(Posix.writeFile(shown, "shown\n"), 0)
        let r = Command.run(["python3", "-c", """
            import ctypes, os, struct, sys, errno
            libc = ctypes.CDLL(None, use_errno=True)
            class Handle(ctypes.Structure):
                _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
            mount, shown, private_ino = sys.argv[1], sys.argv[2], int(sys.argv[3])
            h = Handle(); h.bytes = 128
            mid = ctypes.c_int()
            if libc.name_to_handle_at(-100, shown.encode(), ctypes.byref(h), ctypes.byref(mid), 0) != 0:
                print("name_to_handle_at", errno.errorcode[ctypes.get_errno()]); sys.exit(0)
            mfd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
            def try_open(handle):
                fd = libc.open_by_handle_at(mfd, ctypes.byref(handle), os.O_RDONLY)
                if fd < 0:
                    return errno.errorcode[ctypes.get_errno()]
                data = os.read(fd, 100); os.close(fd)
                return data.decode()
            print("real", try_open(h))
            # The same handle (a node id as two native 32-bit words, then a generation) with the
            # private file's node number, for the first few generations.
            raw = bytes(h.f[:h.bytes])
            results = set()
            for gen in range(4):
                forged = Handle(); forged.bytes = h.bytes; forged.type = h.type
                body = bytearray(raw)
                body[0:8] = struct.pack("<II", private_ino >> 32, private_ino & 0xffffffff)
                if h.bytes >= 12: body[8:12] = struct.pack("<I", gen)
                for i, b in enumerate(body): forged.f[i] = b
                results.add(try_open(forged))
            print("forged", sorted(results))
            """, mountPoint, shown, String(privateIno)], timeout: 60, environment: environment)
        XCTAssertTrue(r.succeeded, "\(r)")
        print("file handles: \(r.stdout)")
        if r.stdout.hasPrefix("name_to_handle_at") {
            // No handles at all: nothing to forge either.
            XCTAssertTrue(r.stdout.contains("EOPNOTSUPP"), r.stdout)
        } else {
            XCTAssertTrue(r.stdout.contains("real shown"), "a real handle opens its file: \(r.stdout)")
            XCTAssertFalse(r.stdout.contains("private"), "a made-up handle read the private file: \(r.stdout)")
            XCTAssertTrue(r.stdout.contains("forged ['ESTALE']"), r.stdout)
        }
        try unmount()
    }
}
