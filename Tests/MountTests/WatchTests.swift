// Programs watching one mount (inotify: file managers, editors, `tail -f`) see what another
// mount of the same store changed, as the events a local change raises; and the replays that
// raise them change nothing in the store.

import Foundation
import Glibc
import XCTest

/// An inotify instance, read without blocking.
final class Watcher {
    struct Event: CustomStringConvertible {
        let watch: Int32
        let mask: UInt32
        let cookie: UInt32
        let name: String
        var description: String { "\(name.isEmpty ? "(self)" : name) 0x\(String(mask, radix: 16))" }
    }
    private let fd: Int32
    private(set) var seen: [Event] = []

    init() { fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC)) }
    deinit { close(fd) }

    func watch(_ path: String) -> Int32 { inotify_add_watch(fd, path, 0xfff /* IN_ALL_EVENTS */) }

    /// Read what has come, keep it in `seen`.
    func drain() {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { return }
            var at = 0
            while at + 16 <= n {
                let (wd, mask, cookie, length) = buffer.withUnsafeBytes { p in
                    (p.load(fromByteOffset: at, as: Int32.self), p.load(fromByteOffset: at + 4, as: UInt32.self),
                     p.load(fromByteOffset: at + 8, as: UInt32.self), Int(p.load(fromByteOffset: at + 12, as: UInt32.self)))
                }
                let name = String(decoding: buffer[(at + 16)..<(at + 16 + length)].prefix { $0 != 0 }, as: UTF8.self)
                seen.append(Event(watch: wd, mask: mask, cookie: cookie, name: name))
                at += 16 + length
            }
        }
    }

    /// The first event seen on `watch` for `name` with every bit of `mask`, waiting up to `seconds`.
    func first(_ watch: Int32, _ name: String, _ mask: Int32, seconds: Double = 10) -> Event? {
        let deadline = Date().addingTimeInterval(seconds)
        repeat {
            drain()
            if let e = seen.first(where: { $0.watch == watch && $0.name == name && $0.mask & UInt32(mask) == UInt32(mask) }) {
                return e
            }
            usleep(20_000)
        } while Date() < deadline
        return nil
    }
}

final class WatchTests: MountTestCase {
    private var second: String { workDir + "/mnt2" }

    /// How many changes the store's log holds from the daemon with `pid`.
    private func commits(by pid: pid_t) -> Int {
        let out = Command.run(["sqlite3", storeDir + "/metadata.sqlite3",
                               "select count(*) from changes where writer like '% pid \(pid) %'"]).stdout
        return Int(out.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
    }

    func testAWatcherOnOneMountSeesWhatTheOtherChanged() throws {
        try mount(extra: TwoMountsTests.longCache)
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(extra: TwoMountsTests.longCache, at: second)
        let bPID = try XCTUnwrap(ubiquityfsPID(withArguments: [second]), "the second daemon")
        let a = docs("SugoiApp"), b = second + "/SugoiApp"
        let watcher = Watcher()
        let folder = watcher.watch(b)
        XCTAssertGreaterThan(folder, 0)
        let before = commits(by: bPID)
        XCTAssertGreaterThanOrEqual(before, 0)

        func expect(_ watch: Int32, _ name: String, _ mask: Int32, _ what: String,
                    file: StaticString = #filePath, line: UInt = #line) -> Watcher.Event? {
            let e = watcher.first(watch, name, mask)
            XCTAssertNotNil(e, "\(what): no event 0x\(String(mask, radix: 16)) for \(name); seen: \(watcher.seen)", file: file, line: line)
            return e
        }

        XCTAssertEqual(Posix.writeFile(a + "/Report.txt", "from A\n"), 0)
        _ = expect(folder, "Report.txt", IN_CREATE, "a new file")
        _ = expect(folder, "Report.txt", IN_MODIFY, "its content")
        XCTAssertEqual(Posix.readText(b + "/Report.txt"), "from A\n")

        assertSucceeds("mkdir") { mkdir(a + "/Drafts", 0o755) }
        _ = expect(folder, "Drafts", IN_CREATE | IN_ISDIR, "a new folder")
        let drafts = watcher.watch(b + "/Drafts")
        XCTAssertGreaterThan(drafts, 0)

        assertSucceeds("chmod") { chmod(a + "/Report.txt", 0o600) }
        _ = expect(folder, "Report.txt", IN_ATTRIB, "a chmod")
        XCTAssertEqual(Posix.stat(b + "/Report.txt").map { $0.st_mode & 0o777 }, 0o600)

        assertSucceeds("rename") { rename(a + "/Report.txt", a + "/Drafts/Final.txt") }
        let from = expect(folder, "Report.txt", IN_MOVED_FROM, "a rename, from")
        let to = expect(drafts, "Final.txt", IN_MOVED_TO, "a rename, to")
        XCTAssertEqual(from?.cookie, to?.cookie, "one rename")
        XCTAssertEqual(Posix.readText(b + "/Drafts/Final.txt"), "from A\n")

        XCTAssertEqual(Posix.writeFile(a + "/Drafts/Final.txt", "edited on A\n"), 0)
        _ = expect(drafts, "Final.txt", IN_MODIFY, "new content")
        XCTAssertEqual(Posix.readText(b + "/Drafts/Final.txt"), "edited on A\n")

        assertSucceeds("unlink") { unlink(a + "/Drafts/Final.txt") }
        _ = expect(drafts, "Final.txt", IN_DELETE, "a delete")
        assertSucceeds("rmdir") { rmdir(a + "/Drafts") }
        _ = expect(folder, "Drafts", IN_DELETE | IN_ISDIR, "a folder removed")
        XCTAssertEqual(ls(b), [])

        // A folder nobody here looked into: its new file reads as written all the same.
        assertSucceeds("mkdir") { mkdir(a + "/Unseen", 0o755) }
        _ = expect(folder, "Unseen", IN_CREATE, "another folder")
        XCTAssertEqual(Posix.writeFile(a + "/Unseen/quiet.txt", "x"), 0)
        let until = Date().addingTimeInterval(10)
        while Posix.readText(b + "/Unseen/quiet.txt") != "x" && Date() < until { usleep(20_000) }
        XCTAssertEqual(Posix.readText(b + "/Unseen/quiet.txt"), "x")

        // The replays went through B's daemon and changed nothing: B wrote no change.
        XCTAssertEqual(commits(by: bPID), before, "the second mount committed nothing")
        XCTAssertFalse(Posix.readText(storeDir + "/ubiquityfs.log")?.contains("internal error") ?? true,
                       daemonLogTail())
        XCTAssertEqual(ls(a), ["Unseen"])
        try unmount(at: second)
        try unmount()
    }

    /// Removed and restored from Recently Deleted on one mount while the other watched it go
    /// and held it (as a shell's working folder holds it): the other lists it again, whole,
    /// and takes new files in it. (Had the kernel been told to remove the folder's own node, it
    /// would hold that node as dead until let go, and the folder would list as empty.)
    func testAFolderRemovedAndRestoredWhileTheOtherHeldIt() throws {
        try mount(extra: TwoMountsTests.longCache)
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        try mount(extra: TwoMountsTests.longCache, at: second)
        let a = docs("SugoiApp"), b = second + "/SugoiApp"
        assertSucceeds("mkdir") { mkdir(a + "/Album", 0o755) }
        XCTAssertEqual(Posix.writeFile(a + "/Album/photo.txt", "photo\n"), 0)
        let watcher = Watcher()
        let folder = watcher.watch(b)
        var held: Int32 = -1
        let deadline = Date().addingTimeInterval(10)
        while held < 0 && Date() < deadline {
            held = Posix.open(b + "/Album", O_RDONLY | O_DIRECTORY)
            if held < 0 { usleep(20_000) }
        }
        XCTAssertGreaterThanOrEqual(held, 0, "Album on the second mount")
        XCTAssertEqual(sh("rm -rf \(shellQuote(a + "/Album"))").status, 0)
        XCTAssertNotNil(watcher.first(folder, "Album", IN_DELETE | IN_ISDIR), "seen: \(watcher.seen)")
        let restored = ubiquityfs(["trash", "restore", "--store", storeDir, "SugoiApp/Album"])
        XCTAssertEqual(restored.status, 0, "\(restored)")
        XCTAssertNotNil(watcher.first(folder, "Album", IN_CREATE | IN_ISDIR), "seen: \(watcher.seen)")
        let until = Date().addingTimeInterval(10)
        while Posix.readText(b + "/Album/photo.txt") == nil && Date() < until { usleep(20_000) }
        XCTAssertEqual(Posix.readText(b + "/Album/photo.txt"), "photo\n")
        XCTAssertEqual(ls(b + "/Album"), ["photo.txt"])
        XCTAssertEqual(Posix.writeFile(b + "/Album/new.txt", "new\n"), 0, "a new file in the restored folder")
        close(held)
        try unmount(at: second)
        try unmount()
    }

    /// A daemon told to stop (SIGTERM) while the other mount keeps changing a folder it replays
    /// for a watcher stops cleanly and leaves no mount behind: a replay in flight never holds
    /// up the stop (nothing answers it once the session stops serving).
    func testStopWhileReplayingOtherWritersChanges() throws {
        try mount(extra: TwoMountsTests.longCache)
        let a = docs("SugoiApp")
        for round in 1...3 {
            try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
            try mount(extra: TwoMountsTests.longCache, at: second)
            let pid = try XCTUnwrap(ubiquityfsPID(withArguments: [second]), "the second daemon")
            let watcher = Watcher()
            XCTAssertGreaterThan(watcher.watch(second + "/SugoiApp"), 0)
            let writer = Thread {
                for i in 0..<200 { _ = Posix.writeFile(a + "/r\(round)-\(i).txt", "x") }
            }
            writer.start()
            XCTAssertNotNil(watcher.first(1, "r\(round)-0.txt", IN_CREATE), "round \(round): replays under way")
            kill(pid, SIGTERM)
            XCTAssertTrue(waitForExit(pid, seconds: 20), "round \(round): the daemon stops while replays come in")
            XCTAssertFalse(isMounted(second), "round \(round): no mount left behind")
            while !writer.isFinished { usleep(10_000) }
        }
        XCTAssertEqual(ls(a).count, 600)
        try unmount()
    }
}
