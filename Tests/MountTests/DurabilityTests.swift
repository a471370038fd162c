// What survives an unmount, a signal, and a kill -9 of the daemon.

import Foundation
import Glibc
import XCTest

final class DurabilityTests: MountTestCase {
    func testRemountKeepsDataAndEmptyFolders() throws {
        try mount()
        let sugoi = docs("SugoiApp"), notes = docs("Notes"), drive = docs("TestDrive")
        XCTAssertEqual(Posix.writeFile(drive + "/MyTextFile.txt", "This is a test file\n"), 0)
        assertShell("""
            cd \(shellQuote(sugoi))
            mkdir -p deep/er/still empty/nested
            printf 'nested\\n' > deep/er/still/file.txt
            head -c 1048579 /dev/urandom > deep/random.bin
            cp deep/random.bin \(shellQuote(scratchDir))/random.bin
            ln -s deep/er/still/file.txt link
            chmod 0751 deep/er
            """)
        assertSucceeds("mkdir an empty folder in Notes") { mkdir(notes + "/Empty", 0o755) }
        assertSucceeds("setxattr") { Posix.setxattr(sugoi + "/deep/er/still/file.txt", "user.kept", "yes") }

        try remount()

        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        XCTAssertEqual(Posix.readText(drive + "/MyTextFile.txt"), "This is a test file\n")
        XCTAssertEqual(ls(sugoi), ["deep", "empty", "link"])
        XCTAssertEqual(ls(sugoi + "/empty"), ["nested"], "empty folders persist")
        XCTAssertEqual(ls(sugoi + "/empty/nested"), [])
        XCTAssertEqual(ls(notes), ["Empty"])
        XCTAssertEqual(Posix.readText(sugoi + "/deep/er/still/file.txt"), "nested\n")
        assertShell("cmp \(shellQuote(sugoi + "/deep/random.bin")) \(shellQuote(scratchDir + "/random.bin"))")
        XCTAssertEqual(Posix.readlink(sugoi + "/link"), "deep/er/still/file.txt")
        XCTAssertEqual(Posix.stat(sugoi + "/deep/er").map { $0.st_mode & 0o7777 }, 0o751)
        XCTAssertEqual(try Posix.getxattr(sugoi + "/deep/er/still/file.txt", "user.kept").get(), "yes")

        // A second round: deletions and renames persist too.
        assertShell("cd \(shellQuote(sugoi)) && rm -r empty && mv deep renamed")
        try remount()
        XCTAssertEqual(ls(sugoi), ["link", "renamed"])
        XCTAssertEqual(Posix.readText(sugoi + "/renamed/er/still/file.txt"), "nested\n")
    }

    /// "Saved, closed, then the daemon died": a kill -9 right after close(2) returns must leave
    /// the new content as the file, both for a new file and for an existing one rewritten in
    /// place. (The last writer's close publishes before it returns; a kill inside that publish
    /// leaves a closed working copy, which the next start publishes.)
    func testKillRightAfterCloseKeepsTheClosedContent() throws {
        try mount()
        let dir = docs("SugoiApp")
        XCTAssertEqual(Posix.writeFile(dir + "/existing.txt", "version 0\n"), 0)
        try remount()
        for round in 1...20 {
            guard let pid = readDaemonPID(), isOurDaemon(pid) else { throw FixtureError("no daemon in round \(round)") }
            XCTAssertEqual(Posix.writeFile(dir + "/new-\(round).txt", "new file \(round)\n"), 0)
            // As `cp -p` does: write, set the times, close.
            let fd = Posix.open(dir + "/stamped.txt", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            XCTAssertGreaterThanOrEqual(fd, 0)
            XCTAssertEqual(write(fd, "stamp \(round)\n", "stamp \(round)\n".utf8.count), "stamp \(round)\n".utf8.count)
            var times = [timespec(tv_sec: 1_000_000_000 + round, tv_nsec: 0), timespec(tv_sec: 1_000_000_000 + round, tv_nsec: 0)]
            XCTAssertEqual(futimens(fd, &times), 0)
            close(fd)
            XCTAssertEqual(Posix.writeFile(dir + "/existing.txt", "version \(round)\n"), 0)
            kill(pid, SIGKILL)   // a few microseconds after the last close returned
            guard waitForExit(pid, seconds: 10) else { throw FixtureError("daemon \(pid) survived SIGKILL") }
            if !Command.run(["fusermount3", "-u", mountPoint], timeout: 20).succeeded {
                _ = Command.run(["fusermount3", "-uz", mountPoint], timeout: 20)
            }
            try mount()
            for earlier in 1...round {
                XCTAssertEqual(Posix.readText(dir + "/new-\(earlier).txt"), "new file \(earlier)\n", "round \(round)")
            }
            XCTAssertEqual(Posix.readText(dir + "/existing.txt"), "version \(round)\n", "round \(round)")
            XCTAssertEqual(Posix.readText(dir + "/stamped.txt"), "stamp \(round)\n", "round \(round)")
            XCTAssertEqual(Posix.stat(dir + "/stamped.txt").map { Int($0.st_mtim.tv_sec) }, 1_000_000_000 + round,
                           "round \(round): the time set before the close")
        }
    }

    /// A save whose publish waits for the release (a close within a second of the file's last
    /// publish while a reader keeps it open; or an O_TRUNC descriptor closed without a write, as
    /// `: > f` does), then, before that release, an O_TRUNC open and a write that the daemon's
    /// death interrupts: the saved content is the file's after the restart, not the one before
    /// it. A descriptor duplicated before the close holds the release back, as a busy kernel's
    /// late release does.
    func testKillDuringARewriteKeepsTheSaveBeforeIt() throws {
        try mount()
        let limited = docs("SugoiApp") + "/rewritten.txt", emptied = docs("SugoiApp") + "/emptied.txt"
        var descriptors: [Int32] = []
        defer { for fd in descriptors { close(fd) } }
        func rewrite(_ path: String, saving text: String) {
            let saved = Posix.open(path, O_WRONLY | O_TRUNC)
            XCTAssertGreaterThanOrEqual(saved, 0)
            XCTAssertEqual(write(saved, text, text.utf8.count), text.utf8.count)
            descriptors.append(dup(saved))
            XCTAssertEqual(close(saved), 0)
            let next = Posix.open(path, O_WRONLY | O_TRUNC)
            XCTAssertGreaterThanOrEqual(next, 0)
            XCTAssertEqual(write(next, "half", 4), 4)
            descriptors.append(next)
        }
        XCTAssertEqual(Posix.writeFile(emptied, "first\n"), 0)
        rewrite(emptied, saving: "")
        descriptors.append(Posix.open(limited, O_RDONLY | O_CREAT))
        XCTAssertEqual(Posix.writeFile(limited, "first\n"), 0)   // published at its close
        rewrite(limited, saving: "saved\n")
        guard let pid = readDaemonPID() else { throw FixtureError("no daemon pid") }
        kill(pid, SIGKILL)
        XCTAssertTrue(waitForExit(pid, seconds: 10), "the daemon survived SIGKILL")
        for fd in descriptors { close(fd) }
        descriptors = []
        clearDeadMount(mountPoint)
        try mount()
        XCTAssertEqual(Posix.readText(limited), "saved\n")
        XCTAssertEqual(Posix.readText(emptied), "")
        // What the interrupted writes had done is kept as a version beside each.
        for path in [limited, emptied] {
            let versions = ubiquityfs(["versions", path])
            XCTAssertTrue(versions.stdout.contains("recovered"), "\(versions)")
        }
    }

    /// A `kill -9` of the daemon while it empties Recently Deleted: what it deleted is gone
    /// whole, what it had not reached is still there and still readable, and emptying again
    /// finishes the job.
    func testKillWhileEmptyingRecentlyDeleted() throws {
        try mount()
        let dir = docs("SugoiApp")
        assertShell("mkdir -p \(shellQuote(dir))/tree && cd \(shellQuote(dir))/tree && for i in $(seq 1 1500); do echo \"content $i\" > f$i; done")
        assertShell("rm -rf \(shellQuote(dir))/tree")
        let done = DispatchSemaphore(value: 0)
        let argv = [Self.binary, "trash", "empty", "--store", storeDir]
        let env = environment
        DispatchQueue.global().async {
            _ = Command.run(argv, timeout: 120, environment: env)
            done.signal()
        }
        // Kill once the emptying has begun (the store's own count of items, read beside it).
        let count = "sqlite3 -readonly \(shellQuote(storeDir + "/metadata.sqlite3")) \"select count(*) from meta where key like 'deleted.%'\""
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, (Int(sh(count).stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 1501) >= 1501 { usleep(20_000) }
        try killDaemonHard()
        XCTAssertEqual(done.wait(timeout: .now() + 60), .success, "the command returns when the daemon dies")
        try mount()
        let left = ubiquityfs(["trash", "list", "--store", storeDir]).lines.dropFirst()
        XCTAssertTrue(left.count > 0 && left.count < 1501, "\(left.count) of 1501 items left: the kill did not land mid-way")
        XCTAssertTrue(ubiquityfs(["trash", "restore", "SugoiApp/tree", "--store", storeDir]).succeeded || left.isEmpty,
                      "the folder is the last item emptied")
        // Whatever is left reads whole.
        for name in ls(dir + "/tree") {
            let n = Int(name.dropFirst()) ?? 0
            XCTAssertEqual(Posix.readText(dir + "/tree/" + name), "content \(n)\n", name)
        }
        assertShell("rm -rf \(shellQuote(dir))/tree")
        XCTAssertTrue(ubiquityfs(["trash", "empty", "--store", storeDir], timeout: 120).succeeded)
        XCTAssertEqual(ubiquityfs(["trash", "list", "--store", storeDir]).stdout, "Recently Deleted is empty\n")
        try unmount()
        assertStoreWhole()
    }

    /// A `kill -9` of the daemon in its garbage collection (the one it runs at start-up, the
    /// same as the hourly one), while it deletes expired Recently Deleted items for good: the
    /// store opens again, what was left restores and reads whole, and a later collection frees
    /// every chunk the killed one left behind and no other.
    func testKillDuringGarbageCollection() throws {
        let blobs = storeDir + "/blobs"
        func blobFiles() -> Set<String> { Set(sh("cd \(shellQuote(blobs)) && find . -type f").lines) }
        try mount()
        let before = blobFiles()
        let dir = docs("SugoiApp")
        assertShell("mkdir -p \(shellQuote(dir))/tree && cd \(shellQuote(dir))/tree && for i in $(seq 1 1500); do echo \"content $i\" > f$i; done")
        assertShell("rm -rf \(shellQuote(dir))/tree")
        try unmount()
        XCTAssertEqual(blobFiles().count, before.count + 1500, "the deleted files' content is kept")

        // Start with nothing kept in Recently Deleted: the start-up collection deletes it all.
        let done = DispatchSemaphore(value: 0)
        let argv = [Self.binary] + mountArguments(extra: ["--keep-deleted-days", "0"])
        let env = environment
        DispatchQueue.global().async {
            _ = Command.run(argv, timeout: 120, environment: env)
            done.signal()
        }
        let pid = startingDaemonPID()
        XCTAssertNotNil(pid, "the daemon started")
        let count = "sqlite3 -readonly \(shellQuote(storeDir + "/metadata.sqlite3")) \"select count(*) from meta where key like 'deleted.%'\""
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, (Int(sh(count).stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 1501) >= 1501 { usleep(5_000) }
        if let pid { kill(pid, SIGKILL) }
        XCTAssertEqual(done.wait(timeout: .now() + 60), .success, "the mount command returns when its daemon dies")
        XCTAssertFalse(isMounted(mountPoint), "killed before it mounted")

        // (The retention given is the store's setting, for every later start too.)
        try mount(extra: ["--keep-deleted-days", "30"])
        let left = ubiquityfs(["trash", "list", "--store", storeDir]).lines.dropFirst()
        XCTAssertTrue(left.count > 0 && left.count < 1501, "\(left.count) of 1501 items left: the kill did not land mid-way")
        if left.count > 0 { XCTAssertTrue(ubiquityfs(["trash", "restore", "SugoiApp/tree", "--store", storeDir]).succeeded) }
        for name in ls(dir + "/tree") {
            XCTAssertEqual(Posix.readText(dir + "/tree/" + name), "content \(Int(name.dropFirst()) ?? 0)\n", name)
        }
        assertShell("rm -rf \(shellQuote(dir))/tree")
        try unmount()

        // Chunks the kill left unreferenced are freed once older than the grace period (made
        // so here), and nothing else is.
        assertShell("find \(shellQuote(blobs)) -type f -exec touch -d '2 hours ago' {} +")
        try mount(extra: ["--keep-deleted-days", "0"])
        XCTAssertEqual(ubiquityfs(["trash", "list", "--store", storeDir]).stdout, "Recently Deleted is empty\n")
        try unmount()
        XCTAssertEqual(blobFiles(), before, "exactly the content from before the deleted tree is left")
        assertStoreWhole()
    }

    func testFusermountUnmountStopsTheDaemon() throws {
        try mount()
        XCTAssertEqual(Posix.writeFile(docs("Notes") + "/note.txt", "kept\n"), 0)
        let pid = readDaemonPID()
        let r = Command.run(["fusermount3", "-u", mountPoint], timeout: 30)
        XCTAssertTrue(r.succeeded, "\(r)")
        XCTAssertFalse(isMounted(mountPoint))
        if let pid { XCTAssertTrue(waitForExit(pid, seconds: 10), "the daemon should exit after fusermount3 -u") }
        try mount()
        XCTAssertEqual(Posix.readText(docs("Notes") + "/note.txt"), "kept\n")
    }

    func testSigtermPublishesAndUnmounts() throws {
        try signalTest(SIGTERM)
    }

    func testSigintPublishesAndUnmounts() throws {
        try signalTest(SIGINT)
    }

    private func signalTest(_ signal: Int32, file: StaticString = #filePath, line: UInt = #line) throws {
        try mount()
        // Written and closed just before the signal: the daemon must publish it before it exits.
        XCTAssertEqual(Posix.writeFile(docs("SugoiApp") + "/last-minute.txt", "published\n"), 0)
        guard let pid = readDaemonPID() else { return XCTFail("no daemon.pid", file: file, line: line) }
        kill(pid, signal)
        XCTAssertTrue(waitForExit(pid, seconds: 20), "the daemon should exit on signal \(signal)", file: file, line: line)
        XCTAssertFalse(isMounted(mountPoint), "the daemon should unmount on signal \(signal)", file: file, line: line)
        try mount()
        XCTAssertEqual(Posix.readText(docs("SugoiApp") + "/last-minute.txt"), "published\n", file: file, line: line)
    }

    func testKillMinus9KeepsFsyncedDataAndWholeFiles() throws {
        try mount()
        let d = docs("SugoiApp")
        let oldSmall = "old small content\n"
        let oldBig = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        XCTAssertEqual(Posix.writeFile(d + "/small.txt", oldSmall), 0)
        XCTAssertEqual(Posix.writeFile(d + "/big.bin", oldBig), 0)
        XCTAssertEqual(Posix.writeFile(d + "/fsynced-existing.txt", "previous\n"), 0)
        try remount() // everything above is published

        // 1. A new file, written and fsync'ed, held open at the kill.
        let journalHead = "fsync'ed line 1\nfsync'ed line 2\n"
        let journal = assertSucceeds("open journal") { Posix.open(d + "/journal.txt", O_RDWR | O_CREAT) }
        XCTAssertEqual(Posix.write(journal, journalHead), journalHead.utf8.count)
        assertSucceeds("fsync journal") { fsync(journal) }
        Posix.write(journal, "not fsync'ed\n")

        // 2. An existing file, truncated and rewritten, fsync'ed, held open.
        let existing = assertSucceeds("open existing") { Posix.open(d + "/fsynced-existing.txt", O_RDWR | O_TRUNC) }
        Posix.write(existing, "replacement, fsync'ed\n")
        assertSucceeds("fsync existing") { fsync(existing) }

        // 3. An existing small file rewritten and closed, not fsync'ed.
        let newSmall = "a new and longer version of the small file\n"
        XCTAssertEqual(Posix.writeFile(d + "/small.txt", newSmall), 0)

        // 4. A big file changed in place, held open, not fsync'ed.
        var newBig = oldBig
        let patch = [UInt8](repeating: 0xAB, count: 70_000)
        newBig.replaceSubrange((1 << 20)..<((1 << 20) + patch.count), with: patch)
        let big = assertSucceeds("open big") { Posix.open(d + "/big.bin", O_RDWR) }
        XCTAssertEqual(Posix.pwrite(big, patch, at: 1 << 20), patch.count)

        try killDaemonHard()
        close(journal)
        close(existing)
        close(big)
        try mount()

        let journalNow = Posix.readText(d + "/journal.txt")
        XCTAssertTrue(journalNow == journalHead || journalNow == journalHead + "not fsync'ed\n",
                      "fsync'ed data must survive kill -9; got \(String(describing: journalNow))")
        XCTAssertEqual(Posix.readText(d + "/fsynced-existing.txt"), "replacement, fsync'ed\n",
                       "an fsync'ed rewrite must survive kill -9")
        let smallNow = Posix.readText(d + "/small.txt")
        XCTAssertTrue(smallNow == oldSmall || smallNow == newSmall,
                      "small.txt must be its old or its new version, got \(String(describing: smallNow))")
        let bigNow = Posix.readFile(d + "/big.bin")
        XCTAssertTrue(bigNow == oldBig || bigNow == newBig,
                      "big.bin must be its old or its new version (size \(bigNow?.count ?? -1))")
        XCTAssertEqual(ls(d), ["big.bin", "fsynced-existing.txt", "journal.txt", "small.txt"])

        // The store still works after recovery.
        XCTAssertEqual(Posix.writeFile(d + "/after.txt", "after\n"), 0)
        try remount()
        XCTAssertEqual(Posix.readText(d + "/after.txt"), "after\n")
        XCTAssertEqual(Posix.readText(d + "/fsynced-existing.txt"), "replacement, fsync'ed\n")
        try unmount()
        assertStoreWhole()
    }
}
