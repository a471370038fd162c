// `import` and `export` (moving documents in and out of a container): checked first, nothing
// copied if anything does not fit; through the user's mount or a private one; verified; resumed
// after a kill -9 by running the same command again; progress on a terminal and off it.

import Foundation
import Glibc
import XCTest

final class TransferTests: MountTestCase {
    private var local: String { scratchDir + "/Project" }

    /// `count` files of `size` random bytes in `root`, and a nested folder.
    private func makeProject(_ root: String, count: Int = 20, size: Int = 3000) {
        assertShell("""
            mkdir -p \(shellQuote(root))/notes/old
            for i in $(seq 1 \(count)); do head -c \(size) /dev/urandom > \(shellQuote(root))/f$i.bin; done
            echo "read me" > \(shellQuote(root))/notes/README.txt
            echo "older" > \(shellQuote(root))/notes/old/2025.txt
            ln -s README.txt \(shellQuote(root))/notes/latest
            """)
    }

    /// Runs `argv` in the background and kill -9s it once `folder()` lists `count` entries
    /// (`whileRunning` runs just before the kill); returns once it is gone. The command is found
    /// by `words` of its own arguments.
    private func killHalfway(_ argv: [String], words: [String], once folder: () -> String, holds count: Int,
                             whileRunning: () -> Void = {}) {
        let done = DispatchSemaphore(value: 0)
        let env = environment
        DispatchQueue.global().async {
            _ = Command.run(argv, timeout: 300, environment: env)
            done.signal()
        }
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, ((try? FileManager.default.contentsOfDirectory(atPath: folder()))?.count ?? 0) < count { usleep(20_000) }
        guard let pid = ubiquityfsPID(withArguments: words) else { return XCTFail("\(words) is not running") }
        whileRunning()
        kill(pid, SIGKILL)
        XCTAssertEqual(done.wait(timeout: .now() + 60), .success)
    }

    func testImportIsCheckedFirstThenCopiedWithAndWithoutAMount() throws {
        makeProject(local)
        try mount()
        let before = ls(docs("Notes"))
        try unmount()
        // Notes allows one folder level: notes/old does not fit, and nothing is copied.
        let refused = ubiquityfs(["import", local, "Notes", "--store", storeDir, "--apps", appsDir])
        XCTAssertEqual(refused.status, 1)
        XCTAssertEqual(refused.stderr, """
            ubiquityfs import: nothing was copied; 1 item does not fit:
              notes/old: Notes allows one level of folders (NSUbiquitousContainerSupportedFolderLevels One)

            """)
        // No mount: the command mounts the store privately for its length.
        let copied = ubiquityfs(["import", local, "SugoiApp/Project", "--store", storeDir, "--apps", appsDir])
        XCTAssertEqual(copied.status, 0, "\(copied)")
        XCTAssertTrue(copied.stderr.contains("import: 22 of 22 files (58.6 KiB) in "), copied.stderr)
        XCTAssertEqual(fuseMounts(under: storeDir), [], "the private mount is gone")
        try mount()
        XCTAssertEqual(ls(docs("Notes")), before)
        assertShell("diff -r \(shellQuote(local)) \(shellQuote(docs("SugoiApp") + "/Project"))")
        XCTAssertEqual(Posix.readlink(docs("SugoiApp") + "/Project/notes/latest"), "README.txt")
        // Through the user's mount, --move: the local folder goes once all is verified.
        let other = scratchDir + "/Other"
        makeProject(other, count: 3)
        let moved = ubiquityfs(["import", other, "SugoiApp/Other", "--move", "--store", storeDir])
        XCTAssertEqual(moved.status, 0, "\(moved)")
        XCTAssertFalse(Posix.exists(other))
        XCTAssertEqual(ls(docs("SugoiApp") + "/Other"), ["f1.bin", "f2.bin", "f3.bin", "notes"])
        // Something of another content under a name: refused, nothing copied.
        makeProject(other, count: 3)
        XCTAssertEqual(Posix.writeFile(other + "/f2.bin", "changed"), 0)
        let clash = ubiquityfs(["import", other, "SugoiApp/Other", "--store", storeDir])
        XCTAssertEqual(clash.status, 1)
        XCTAssertTrue(clash.stderr.contains("f2.bin: the container's copy exists with other content"), clash.stderr)
        try unmount()
    }

    /// kill -9 halfway through; the same command again finishes, skipping what is there, and no
    /// file in the container is ever half of its original.
    func testAnImportKilledHalfwayResumes() throws {
        makeProject(local, count: 300, size: 20_000)
        try mount()
        try unmount()
        let argv = [Self.binary, "import", local, "SugoiApp/Project", "--store", storeDir, "--apps", appsDir]
        var target = ""
        killHalfway(argv, words: ["import", local], once: {
            if let m = fuseMounts(under: storeDir).first { target = m + "/SugoiApp/Project" }
            return target
        }, holds: 100, whileRunning: {
            // One transfer per store at a time.
            let second = ubiquityfs(["export", "SugoiApp", scratchDir + "/elsewhere", "--store", storeDir, "--apps", appsDir])
            XCTAssertEqual(second.status, 1)
            XCTAssertTrue(second.stderr.contains("another import or export is running on the store"), second.stderr)
        })
        let cut = (try? FileManager.default.contentsOfDirectory(atPath: target))?.count ?? 0
        XCTAssertTrue(cut > 0 && cut < 302, "the kill landed halfway: \(cut) items there")
        // Every file already under its name is whole.
        for name in (try? FileManager.default.contentsOfDirectory(atPath: target)) ?? [] where name.hasSuffix(".bin") {
            XCTAssertTrue(sh("cmp -s \(shellQuote(local + "/" + name)) \(shellQuote(target + "/" + name))").succeeded, name)
        }
        let again = Command.run(argv, timeout: 300, environment: environment)
        XCTAssertEqual(again.status, 0, "\(again)")
        XCTAssertTrue(again.stderr.contains("already there"), again.stderr)
        XCTAssertEqual(fuseMounts(under: storeDir), [], "the killed run's private mount and this one's are gone")
        try mount()
        assertShell("diff -r \(shellQuote(local)) \(shellQuote(docs("SugoiApp") + "/Project"))")
        XCTAssertEqual(sh("find \(shellQuote(docs("SugoiApp"))) -name '.ubiquityfs-partial-*'").stdout, "", "no partial file left")
        try unmount()
    }

    /// What must never happen: a path out of the container, both ends one tree (a move would
    /// delete the only copy), a FIFO where a file goes.
    func testWhatATransferRefuses() throws {
        makeProject(local, count: 2)
        try mount()
        for remote in ["SugoiApp/../TestDrive", "SugoiApp/./x", "SugoiApp/a/../.."] {
            let r = ubiquityfs(["export", remote, scratchDir + "/out", "--remove-from-cloud", "--store", storeDir])
            XCTAssertEqual(r.status, 64, "\(remote): \(r)")
        }
        assertShell("cp -a \(shellQuote(local)) \(shellQuote(docs("SugoiApp") + "/Project"))")
        for args in [["import", docs("SugoiApp") + "/Project", "SugoiApp/Project", "--move"],
                     ["export", "SugoiApp/Project", docs("SugoiApp") + "/Project/inner", "--remove-from-cloud"]] {
            let r = ubiquityfs(args + ["--store", storeDir])
            XCTAssertEqual(r.status, 1, "\(r)")
            XCTAssertTrue(r.stderr.contains("are the same files, or one holds the other"), r.stderr)
        }
        assertShell("diff -r \(shellQuote(local)) \(shellQuote(docs("SugoiApp") + "/Project"))")
        let out = scratchDir + "/out"
        assertShell("mkdir -p \(shellQuote(out)) && mkfifo \(shellQuote(out + "/f1.bin"))")
        let fifo = ubiquityfs(["export", "SugoiApp/Project", out, "--store", storeDir], timeout: 30)
        XCTAssertEqual(fifo.status, 1, "\(fifo)")
        XCTAssertTrue(fifo.stderr.contains("f1.bin: the destination has something else of that name (a FIFO, socket or device, not a file)"), fifo.stderr)
        try unmount()
    }

    /// The same for an export with --remove-from-cloud: killed halfway, run again, everything
    /// ends up local and whole, and out of the container.
    func testAnExportKilledHalfwayResumes() throws {
        makeProject(local, count: 300, size: 20_000)
        try mount()
        assertShell("cp -a \(shellQuote(local)) \(shellQuote(docs("SugoiApp") + "/Project"))")
        try unmount()
        let out = scratchDir + "/out"
        let argv = [Self.binary, "export", "SugoiApp/Project", out, "--remove-from-cloud", "--store", storeDir, "--apps", appsDir]
        killHalfway(argv, words: ["export", out], once: { out }, holds: 100)
        for name in (try? FileManager.default.contentsOfDirectory(atPath: out)) ?? [] where name.hasSuffix(".bin") {
            XCTAssertTrue(sh("cmp -s \(shellQuote(local + "/" + name)) \(shellQuote(out + "/" + name))").succeeded, "\(name) is whole")
        }
        let again = Command.run(argv, timeout: 300, environment: environment)
        XCTAssertEqual(again.status, 0, "\(again)")
        assertShell("diff -r \(shellQuote(local)) \(shellQuote(out))")
        XCTAssertEqual(fuseMounts(under: storeDir), [])
        try mount()
        XCTAssertFalse(Posix.exists(docs("SugoiApp") + "/Project"), "all of it moved out")
        try unmount()
    }

    /// A copy that fails midway (an immutable folder refuses the files meant for it): the rest
    /// is copied, every failed item is named, the exit is 1, and what failed stays in the cloud.
    func testFailedItemsAreNamedAndKept() throws {
        makeProject(local, count: 3)
        try mount()
        assertShell("cp -a \(shellQuote(local)) \(shellQuote(docs("SugoiApp") + "/Project"))")
        let out = scratchDir + "/out"
        assertShell("mkdir -p \(shellQuote(out + "/notes")) && chattr +i \(shellQuote(out + "/notes"))")
        defer { _ = sh("chattr -i \(shellQuote(out + "/notes"))") }
        let r = ubiquityfs(["export", "SugoiApp/Project", out, "--remove-from-cloud", "--store", storeDir])
        XCTAssertEqual(r.status, 1, "\(r)")
        XCTAssertTrue(r.stderr.contains("export: 3 of 5 files (8.8 KiB) in "), r.stderr)
        XCTAssertTrue(r.stderr.contains("4 items failed; run the same command again to retry:"), r.stderr)
        for name in ["notes/README.txt", "notes/latest", "notes/old", "notes/old/2025.txt"] {
            XCTAssertTrue(r.stderr.contains("\n  " + name + ":"), name)
        }
        for name in ["f1.bin", "f2.bin", "f3.bin"] {
            XCTAssertTrue(sh("cmp -s \(shellQuote(local + "/" + name)) \(shellQuote(out + "/" + name))").succeeded, name)
            XCTAssertFalse(Posix.exists(docs("SugoiApp") + "/Project/" + name), "\(name) moved out")
        }
        XCTAssertEqual(Posix.readText(docs("SugoiApp") + "/Project/notes/README.txt"), "read me\n", "what failed stays in the cloud")
        XCTAssertTrue(Posix.exists(docs("SugoiApp") + "/Project/notes/old/2025.txt"))
        try unmount()
    }

    func testExportWithAndWithoutAMountAndRemoveFromCloud() throws {
        makeProject(local, count: 5)
        try mount()
        assertShell("cp -a \(shellQuote(local)) \(shellQuote(docs("SugoiApp") + "/Project"))")
        // Through the mount: keeps the documents in the container.
        let out = scratchDir + "/out"
        let kept = ubiquityfs(["export", "SugoiApp/Project", out, "--store", storeDir])
        XCTAssertEqual(kept.status, 0, "\(kept)")
        assertShell("diff -r \(shellQuote(local)) \(shellQuote(out))")
        XCTAssertTrue(Posix.exists(docs("SugoiApp") + "/Project/f1.bin"))
        // A local file of other content under a name: refused, nothing copied.
        XCTAssertEqual(Posix.writeFile(out + "/f3.bin", "mine"), 0)
        let refused = ubiquityfs(["export", "SugoiApp/Project", out, "--store", storeDir])
        XCTAssertEqual(refused.status, 1)
        XCTAssertTrue(refused.stderr.contains("f3.bin: the local copy exists with other content"), refused.stderr)
        XCTAssertEqual(Posix.readText(out + "/f3.bin"), "mine")
        try unmount()
        // Without a mount, and out of the cloud: the documents go to Recently Deleted.
        let away = scratchDir + "/away"
        let removed = ubiquityfs(["export", "SugoiApp/Project", away, "--remove-from-cloud", "--store", storeDir, "--apps", appsDir])
        XCTAssertEqual(removed.status, 0, "\(removed)")
        assertShell("diff -r \(shellQuote(local)) \(shellQuote(away))")
        try mount()
        XCTAssertFalse(Posix.exists(docs("SugoiApp") + "/Project"))
        XCTAssertTrue(ubiquityfs(["trash", "list", "--store", storeDir]).stdout.contains("SugoiApp/Project/f1.bin"))
        try unmount()
    }

    /// On a terminal a bar redrawn in place; elsewhere plain lines (as the other tests see).
    func testProgressOnATerminal() throws {
        makeProject(local, count: 50)
        try mount()
        let r = assertShell("script -qec \(shellQuote([Self.binary, "import", local, "SugoiApp/Project", "--store", storeDir].map(shellQuote).joined(separator: " "))) /dev/null")
        XCTAssertTrue(r.stdout.contains("\r[########################] import: 52/52 files"), r.stdout)
        XCTAssertTrue(r.stdout.contains("import: 52 of 52 files"), r.stdout)
        try unmount()
    }
}
