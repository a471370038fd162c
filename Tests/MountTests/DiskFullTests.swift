// A really full disk: the store on a small ext4 filesystem made for the test (a loop-mounted
// image). Writes fail with ENOSPC (never EIO), what was there stays whole and readable, deletes
// and emptying Recently Deleted still work on the full disk, and once space is freed the mount
// takes new content again with no restart. The store is whole afterwards.

import Foundation
import Glibc
import XCTest

final class DiskFullTests: MountTestCase {
    private var diskRoot = ""
    private var disk: String { diskRoot + "/disk" }

    override func setUpWithError() throws {
        try super.setUpWithError()
        var template = Array("/tmp/ubiquityfs-disk-XXXXXX".utf8CString)
        guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else {
            throw FixtureError("mkdtemp failed: \(Posix.describe(errno))")
        }
        diskRoot = stringFromCBuffer(template)
        try FileManager.default.createDirectory(atPath: disk, withIntermediateDirectories: false)
        // 48 MiB, no blocks kept for root (the daemon runs as root here): full is full.
        assertShell("truncate -s 48M \(shellQuote(diskRoot + "/image")) && mkfs.ext4 -q -m 0 \(shellQuote(diskRoot + "/image")) "
                    + "&& mount -o loop \(shellQuote(diskRoot + "/image")) \(shellQuote(disk))")
        storeDirOverride = disk + "/store"
    }

    override func tearDown() {
        super.tearDown()   // unmounts the FUSE mount and stops the daemon first
        guard !diskRoot.isEmpty else { return }
        if isMounted(disk), !Command.run(["umount", disk], timeout: 30).succeeded {
            _ = Command.run(["umount", "-l", disk], timeout: 30)
        }
        _ = Command.run(["rm", "-rf", "--one-file-system", diskRoot], timeout: 60)
    }

    /// Writes 1 MiB blocks of random bytes to `path` until something fails; the errno and where.
    private func fill(_ path: String) -> (errno: Int32, at: String) {
        let fd = Posix.open(path, O_WRONLY | O_CREAT | O_TRUNC)
        guard fd >= 0 else { return (errno, "open") }
        var block = [UInt8](repeating: 0, count: 1 << 20)
        for _ in 0..<200 {
            for i in block.indices { block[i] = UInt8.random(in: 0...255) }
            if Posix.write(fd, block) != block.count {
                let e = errno
                close(fd)
                return (e, "write")
            }
        }
        return close(fd) == 0 ? (0, "none") : (errno, "close")
    }

    /// Writes `bytes` as `cp` does, going on after a short write; 0 or the errno of what failed.
    private func writeAll(_ path: String, _ bytes: [UInt8]) -> Int32 {
        let fd = Posix.open(path, O_WRONLY | O_CREAT | O_TRUNC)
        guard fd >= 0 else { return errno }
        var done = 0
        while done < bytes.count {
            let n = Posix.write(fd, Array(bytes[done...]))
            if n <= 0 {
                let e = n < 0 ? errno : EIO
                close(fd)
                return e
            }
            done += n
        }
        return close(fd) == 0 ? 0 : errno
    }

    func testAFullDiskRefusesNewContentKeepsEverythingAndRecovers() throws {
        try mount()
        let d = docs("SugoiApp")
        XCTAssertEqual(Posix.writeFile(d + "/keep.txt", "kept\n"), 0)
        var keep = (0..<3_000_000).map { _ in UInt8.random(in: 0...255) }
        XCTAssertEqual(Posix.writeFile(d + "/keep.bin", keep), 0)

        // Filled through the mount, first with big files, then with small ones until one finds
        // no room: each write or close that fails says ENOSPC.
        var fills: [String] = []
        for i in 1...4 {
            let r = fill(d + "/fill-\(i).bin")
            XCTAssertEqual(r.errno, ENOSPC, "fill-\(i).bin: \(r.at) failed with \(Posix.describe(r.errno)), not ENOSPC")
            fills.append("fill-\(i).bin")
            if r.errno != 0 && i > 1 { break }
        }
        var refused: Int32 = 0
        for i in 1...200 where refused == 0 {
            fills.append("small-\(i).bin")
            refused = Posix.writeFile(d + "/small-\(i).bin", (0..<65_536).map { _ in UInt8.random(in: 0...255) })
        }
        XCTAssertEqual(refused, ENOSPC, "a small file on a full disk: \(Posix.describe(refused))")
        XCTAssertTrue(ls(d).contains("keep.bin"))
        // A small change to an existing file has no room either: its 1 MiB chunk has to be
        // copied into a working copy, at the write or, once the write is kept in the page log
        // (while a few pages still fit), at the close. A write that was taken is kept.
        let fd = Posix.open(d + "/keep.bin", O_WRONLY)
        XCTAssertGreaterThanOrEqual(fd, 0)
        let wrote = Posix.pwrite(fd, [1, 2, 3], at: 1_500_000)
        let writeErrno = errno
        let closed = close(fd) == 0 ? 0 : errno
        XCTAssertTrue(wrote < 0 || closed != 0, "a change needing a chunk copied succeeded on a full disk")
        XCTAssertEqual(wrote < 0 ? writeErrno : closed, ENOSPC, "the chunk copy that has no room")
        if wrote == 3 { keep.replaceSubrange(1_500_000 ..< 1_500_003, with: [1, 2, 3]) }

        // What was there is whole, and names still change on the full disk.
        XCTAssertEqual(Posix.readText(d + "/keep.txt"), "kept\n")
        XCTAssertTrue(Posix.readFile(d + "/keep.bin") == keep, "keep.bin is whole")
        assertShell("echo 3 > /proc/sys/vm/drop_caches")
        XCTAssertTrue(Posix.readFile(d + "/keep.bin") == keep, "keep.bin is whole, read from the store")
        assertSucceeds("rename") { rename(d + "/keep.txt", d + "/kept.txt") }
        assertSucceeds("mkdir") { mkdir(d + "/Folder", 0o755) }
        for name in fills where Posix.exists(d + "/" + name) {
            assertSucceeds("rm \(name)") { unlink(d + "/" + name) }
        }
        // Deleted files are in Recently Deleted, still taking their space: emptying it frees it.
        let emptied = ubiquityfs(["trash", "empty", "--store", storeDir])
        XCTAssertTrue(emptied.succeeded, "\(emptied)")

        // The freed space takes new content again, with no restart.
        var again: Int32 = -1
        eventually("a write after space was freed") {
            again = Posix.writeFile(d + "/after.bin", Array(repeating: 0x62, count: 2_000_000))
            return again == 0
        }
        XCTAssertEqual(again, 0, Posix.describe(again))
        XCTAssertEqual(Posix.readFile(d + "/after.bin")?.count, 2_000_000)
        eventually("after.bin is published") {
            (try? Posix.getxattr(d + "/after.bin", "user.ubiquity.status").get()) == "current"
        }

        // Filled from outside the store: a file of another program takes the last blocks.
        let filler = disk + "/filler"
        _ = sh("dd if=/dev/zero of=\(shellQuote(filler)) bs=1M count=100 2>/dev/null; sync")
        let outside = writeAll(d + "/outside.bin", Array(repeating: 0x63, count: 3_000_000))
        XCTAssertEqual(outside, ENOSPC, "a write with the disk filled from outside: \(Posix.describe(outside))")
        XCTAssertEqual(Posix.readFile(d + "/after.bin")?.count, 2_000_000, "after.bin is whole")
        XCTAssertEqual(unlink(filler), 0)
        eventually("a write after the other program's file went") {
            Posix.writeFile(d + "/outside.bin", Array(repeating: 0x63, count: 3_000_000)) == 0
        }
        eventually("outside.bin is published") {
            (try? Posix.getxattr(d + "/outside.bin", "user.ubiquity.status").get()) == "current"
        }

        try unmount()
        assertStoreWhole()
        try mount()
        XCTAssertTrue(Posix.readFile(d + "/keep.bin") == keep, "keep.bin is whole after a remount")
        XCTAssertEqual(Posix.readText(d + "/kept.txt"), "kept\n")
        XCTAssertEqual(Posix.readFile(d + "/outside.bin")?.count, 3_000_000)
        try unmount()
    }
}
