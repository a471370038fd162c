// Two machines on one shared store (PostgreSQL): two mounts with local folders of their own, so
// nothing passes between them but the server. Changes, content, versions, locks and a killed
// machine, as a user of each would see them.

import Foundation
import Glibc
import XCTest

final class SharedStoreMountTests: SharedStoreTestCase {

    func testEveryKindOfChangeShowsOnTheOtherMachine() throws {
        try mountBoth()
        changeEveryKind(from: docs("SugoiApp"), seenThrough: second + "/SugoiApp")
        // Deleted items are in Recently Deleted, for both machines.
        let trash = ubiquityfs(["trash", "list", "--store", storeURL])
        XCTAssertTrue(trash.succeeded, "\(trash)")
        XCTAssertTrue(trash.stdout.contains("Final.txt"), trash.stdout)
        try unmount(at: second)
        try unmount()
    }

    /// Content goes through the server whole: a large random file written on A reads back the
    /// same on B; B's edit is a new version, listed from either machine and by the store's URL;
    /// an older version restored on B is A's content again.
    func testContentAndVersionsAcrossMachines() throws {
        try mountBoth()
        let a = docs("TestDrive") + "/photo.raw", b = second + "/TestDrive/photo.raw"
        assertShell("head -c 5000000 /dev/urandom > \(shellQuote(scratchDir + "/photo.raw")) && cp \(shellQuote(scratchDir + "/photo.raw")) \(shellQuote(a))")
        eventually("the whole file on B") { Posix.stat(b)?.st_size == 5_000_000 }
        assertShell("cmp \(shellQuote(scratchDir + "/photo.raw")) \(shellQuote(b))")
        let fd = Posix.open(b, O_WRONLY)
        XCTAssertEqual(Posix.pwrite(fd, Array("edited on B".utf8), at: 1_234_567), 11)
        XCTAssertEqual(fsync(fd), 0)
        close(fd)
        eventually("B's edit on A") { Posix.readFile(a).map { Array($0[1_234_567..<1_234_578]) } == Array("edited on B".utf8) }
        let fromA = ubiquityfs(["versions", a])
        let byURL = ubiquityfs(["versions", "--store", storeURL, "TestDrive/photo.raw"])
        XCTAssertTrue(fromA.succeeded && byURL.succeeded, "\(fromA)\n\(byURL)")
        XCTAssertEqual(fromA.stdout, byURL.stdout)
        let ids = fromA.stdout.split(separator: "\n").dropFirst().compactMap { $0.split(separator: " ").first.map(String.init) }
        XCTAssertEqual(ids.count, 2, fromA.stdout)
        guard let first = ids.first else { return }
        let restored = ubiquityfs(["restore", b, "--version", first])
        XCTAssertTrue(restored.succeeded, "\(restored)")
        eventually("A's content again on A") { Posix.readFile(a) == Posix.readFile(scratchDir + "/photo.raw") }
        assertShell("cmp \(shellQuote(scratchDir + "/photo.raw")) \(shellQuote(b))")
        try unmount(at: second)
        try unmount()
    }

    /// flock and fcntl locks hold between machines through the server; a killed machine's locks
    /// go when its lease runs out.
    func testLocksHoldAcrossMachines() throws {
        try mountBoth(extra: ["--lock-lease", "3"])
        let a = docs("SugoiApp") + "/shared.db", b = second + "/SugoiApp/shared.db"
        let pidB = try daemonPID(of: second)
        let r = assertShell("python3 -c \(shellQuote(TwoMountsTests.lockScript)) \(shellQuote(a)) \(shellQuote(b)) \(pidB) 10",
                            timeout: 90)
        XCTAssertEqual(r.stdout.split(separator: "\n").map(String.init), TwoMountsTests.lockScriptExpected, r.stderr)
        XCTAssertTrue(waitForExit(pidB, seconds: 10))
        clearDeadMount(second)
        try unmount()
    }

    /// A machine killed while writing loses nothing it wrote: the other goes on serving, and the
    /// killed one, mounted again, publishes what it had not (its working copies are on its own
    /// disk, so only it can).
    func testAKilledMachineLosesNothingItWrote() throws {
        try mountBoth()
        let a = docs("Notes"), b = second + "/Notes"
        let pid = try daemonPID(of: second)
        let fd = Posix.open(b + "/open.txt", O_WRONLY | O_CREAT, 0o644)
        XCTAssertEqual(Posix.write(fd, "unsaved but written"), 19)
        XCTAssertEqual(Posix.writeFile(b + "/closed.txt", "saved a moment ago\n"), 0)
        kill(pid, SIGKILL)
        XCTAssertTrue(waitForExit(pid, seconds: 10))
        close(fd)
        clearDeadMount(second)
        XCTAssertEqual(Posix.writeFile(a + "/after.txt", "A goes on\n"), 0)
        XCTAssertEqual(Posix.readText(a + "/after.txt"), "A goes on\n")
        try mount(extra: TwoMountsTests.longCache, at: second)
        eventually("B's closed file, published by B's next start, on A") { Posix.readText(a + "/closed.txt") == "saved a moment ago\n" }
        // The file open at the kill is kept as a recovered version beside the current one.
        eventually("B's open file on A") { Posix.exists(a + "/open.txt") }
        let versions = ubiquityfs(["versions", a + "/open.txt"])
        XCTAssertTrue(versions.stdout.contains("recovered"), "\(versions)")
        XCTAssertEqual(Posix.readText(b + "/after.txt"), "A goes on\n")
        try unmount(at: second)
        try unmount()
    }

    /// What goes wrong with the store's address is said clearly, and a password never goes on a
    /// command line.
    func testBadStoreAddressesAreClearErrors() throws {
        let withPassword = storeURL.replacingOccurrences(of: "://ubiquityfs@", with: "://ubiquityfs:hunter2@")
        var r = ubiquityfs(["mount", "--apps", appsDir, "--store", withPassword, "--local", storeDir, mountPoint])
        XCTAssertFalse(r.succeeded)
        XCTAssertTrue(r.stderr.contains("holds a password"), r.stderr)
        XCTAssertFalse(r.stderr.contains("hunter2"), r.stderr)
        XCTAssertFalse(isMounted(mountPoint))

        let empty = database + "_none"
        XCTAssertTrue(psql("CREATE DATABASE \(empty)").succeeded)
        defer { _ = psql("DROP DATABASE IF EXISTS \(empty) WITH (FORCE)") }
        r = ubiquityfs(["mount", "--apps", appsDir, "--store", storeURL + "_none", "--local", storeDir + "-none", mountPoint])
        XCTAssertFalse(r.succeeded)
        XCTAssertTrue(r.stderr.contains("holds no UbiquityFS store yet") && r.stderr.contains("ubiquityfs init-store --store"), r.stderr)

        // A local folder belongs to one store: its queue, cached chunks and copy of the
        // namespace name that store's nodes and chunks. Here the store at the same address is
        // made anew.
        try mount()
        try unmount()
        XCTAssertTrue(psql("DROP SCHEMA ubiquityfs CASCADE", database: database).succeeded)
        XCTAssertTrue(ubiquityfs(["init-store", "--store", storeURL]).succeeded)
        r = ubiquityfs(["mount", "--apps", appsDir, "--store", storeURL, "--local", storeDir, mountPoint])
        XCTAssertFalse(r.succeeded)
        XCTAssertTrue(r.stderr.contains("is this machine's folder for another store"), r.stderr)
        XCTAssertFalse(isMounted(mountPoint))

        r = ubiquityfs(["mount", "--apps", appsDir, "--store", storeURL, "--chunks", "tape", "--local", storeDir, mountPoint])
        XCTAssertFalse(r.succeeded)
        XCTAssertTrue(r.stderr.contains("--chunks takes"), r.stderr)

        XCTAssertTrue(psql("UPDATE ubiquityfs.store SET value = 7 WHERE key = 'schema_version'", database: database).succeeded)
        r = ubiquityfs(["mount", "--apps", appsDir, "--store", storeURL, "--local", storeDir, mountPoint])
        XCTAssertFalse(r.succeeded)
        XCTAssertTrue(r.stderr.contains("schema version 7") && r.stderr.contains("newer ubiquityfs"), r.stderr)
        XCTAssertFalse(isMounted(mountPoint))
        XCTAssertTrue(ubiquityfs(["init-store", "--store", storeURL]).stderr.contains("schema version 7"))
    }

    /// The commands that take --store work with the URL too, mounted or not.
    func testCommandsByURL() throws {
        try mount()
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/a.txt", "one\n"), 0)
        let containers = ubiquityfs(["containers", "--apps", appsDir, "--store", storeURL])
        XCTAssertTrue(containers.succeeded && containers.stdout.contains("iCloud.com.example.TestDrive"), "\(containers)")
        let status = ubiquityfs(["status", mountPoint])
        XCTAssertTrue(status.succeeded && status.stdout.contains("pending publishes: none"), "\(status)")
        let source = (try? String(contentsOfFile: "/proc/mounts", encoding: .utf8))?.split(separator: "\n")
            .first { $0.contains(" \(mountPoint) ") }.map(String.init) ?? ""
        XCTAssertTrue(source.hasPrefix("ubiquityfs:" + storeURL + " "), source)
        try unmount()
        let versions = ubiquityfs(["versions", "--store", storeURL, "TestDrive/a.txt"])
        XCTAssertTrue(versions.succeeded && versions.stdout.contains("yes"), "\(versions)")
        let deleted = ubiquityfs(["trash", "list", "--store", storeURL])
        XCTAssertTrue(deleted.succeeded, "\(deleted)")
        let checked = ubiquityfs(["fsck", "--store", storeURL, "--full"])
        XCTAssertEqual(checked.status, 0, "\(checked)")
        XCTAssertTrue(checked.stdout.contains("no problems"), checked.stdout)
    }
}

/// Chunks in S3-compatible storage, and this machine's copies of them: what is downloaded, what
/// `evict` and `pin` do, the cache's size limit, read-ahead.
final class SharedStoreCacheTests: SharedStoreTestCase {
    override var chunksOption: String? { bucketOption() }

    private func status(_ path: String) -> String? { try? Posix.getxattr(path, "user.ubiquity.status").get() }

    func testEvictPinAndTheCacheLimit() throws {
        try mount(extra: TwoMountsTests.longCache)
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        // B keeps at most 8 MiB of content.
        try mount(extra: TwoMountsTests.longCache + ["--cache-size", "8M"], at: second)
        let a = docs("TestDrive"), b = second + "/TestDrive"
        for name in ["one", "two", "three", "four"] {
            assertShell("head -c 3000000 /dev/urandom > \(shellQuote(scratchDir + "/" + name)) && cp \(shellQuote(scratchDir + "/" + name)) \(shellQuote(a + "/" + name + ".bin"))")
        }
        eventually("the files on B") { Posix.stat(b + "/four.bin")?.st_size == 3_000_000 }
        XCTAssertEqual(status(a + "/one.bin"), "downloaded", "A wrote it: its copy stays on A")
        XCTAssertEqual(status(b + "/one.bin"), "not-downloaded", "B never read it")
        XCTAssertEqual(Posix.stat(b + "/one.bin")?.st_size, 3_000_000, "true size before any download")
        assertShell("cmp \(shellQuote(scratchDir + "/one")) \(shellQuote(b + "/one.bin"))")
        XCTAssertEqual(status(b + "/one.bin"), "downloaded")

        // Evict: the size stays, the content comes back on the next read.
        let evicted = ubiquityfs(["evict", b + "/one.bin"])
        XCTAssertTrue(evicted.succeeded && evicted.stdout.contains("evicted"), "\(evicted)")
        XCTAssertEqual(status(b + "/one.bin"), "not-downloaded")
        XCTAssertEqual(Posix.stat(b + "/one.bin")?.st_size, 3_000_000)
        assertShell("cmp \(shellQuote(scratchDir + "/one")) \(shellQuote(b + "/one.bin"))")

        // Pin a file, then read more than the cache holds: the pinned one stays, older ones go.
        let pinned = ubiquityfs(["pin", b + "/two.bin"])
        XCTAssertTrue(pinned.succeeded, "\(pinned)")
        XCTAssertEqual(status(b + "/two.bin"), "downloaded")
        for name in ["three", "four"] {
            assertShell("cmp \(shellQuote(scratchDir + "/" + name)) \(shellQuote(b + "/" + name + ".bin"))")
        }
        XCTAssertEqual(status(b + "/two.bin"), "downloaded", "pinned")
        XCTAssertEqual(status(b + "/one.bin"), "not-downloaded", "the least recently used went")
        let cached = sh("du -sb \(shellQuote(localFolder(at: second) + "/cache/blobs")) | cut -f1")
        XCTAssertLessThanOrEqual(Int(cached.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? .max, 8 << 20 + 3_000_000,
                                 "within the limit, apart from the pinned file")
        // A folder at once, by the store's URL with no mount path.
        let folder = ubiquityfs(["evict", "--store", storeURL, "--local", localFolder(at: second), "TestDrive/two.bin"])
        XCTAssertTrue(folder.succeeded, "\(folder)")
        XCTAssertEqual(status(b + "/two.bin"), "not-downloaded")
        for name in ["one", "two", "three", "four"] {
            assertShell("cmp \(shellQuote(scratchDir + "/" + name)) \(shellQuote(b + "/" + name + ".bin"))")
        }
        try unmount(at: second)
        try unmount()
    }

    /// A pin keeps a file's content on this machine as other machines change it, and a pinned
    /// folder's files, new ones too; evicting lets them go again.
    func testPinnedContentFollowsNewVersions() throws {
        try mountBoth()
        let a = docs("Notes"), b = second + "/Notes"
        assertShell("mkdir \(shellQuote(a + "/Kept")) && head -c 1500000 /dev/urandom > \(shellQuote(a + "/kept.bin"))"
                    + " && head -c 1000 /dev/urandom > \(shellQuote(a + "/Kept/x.bin")) && head -c 1000 /dev/urandom > \(shellQuote(a + "/other.bin"))")
        eventually("A's files on B") { Posix.exists(b + "/other.bin") && Posix.exists(b + "/Kept/x.bin") && Posix.exists(b + "/kept.bin") }
        XCTAssertTrue(ubiquityfs(["pin", b + "/kept.bin"]).succeeded)
        XCTAssertTrue(ubiquityfs(["pin", b + "/Kept"]).succeeded)
        XCTAssertEqual(status(b + "/Kept/x.bin"), "downloaded")
        // A changes them all and adds a file to the pinned folder.
        assertShell("head -c 2500000 /dev/urandom > \(shellQuote(scratchDir + "/kept2")) && cp \(shellQuote(scratchDir + "/kept2")) \(shellQuote(a + "/kept.bin"))"
                    + " && head -c 3000 /dev/urandom > \(shellQuote(a + "/Kept/new.bin")) && head -c 2000 /dev/urandom > \(shellQuote(a + "/other.bin"))")
        eventually("the new content of what B pinned, on B without a read", seconds: 20) {
            Posix.stat(b + "/kept.bin")?.st_size == 2_500_000 && self.status(b + "/kept.bin") == "downloaded"
                && self.status(b + "/Kept/new.bin") == "downloaded"
        }
        eventually("B has A's new other.bin") { Posix.stat(b + "/other.bin")?.st_size == 2000 }
        XCTAssertEqual(status(b + "/other.bin"), "not-downloaded", "not pinned")
        assertShell("cmp \(shellQuote(scratchDir + "/kept2")) \(shellQuote(b + "/kept.bin"))")
        // Evicting the folder ends its pin: A's next change stays on the servers until read.
        XCTAssertTrue(ubiquityfs(["evict", b + "/Kept"]).succeeded)
        XCTAssertEqual(status(b + "/Kept/new.bin"), "not-downloaded")
        assertShell("head -c 4000 /dev/urandom > \(shellQuote(a + "/Kept/new.bin"))")
        eventually("A's change on B") { Posix.stat(b + "/Kept/new.bin")?.st_size == 4000 }
        usleep(1_000_000)
        XCTAssertEqual(status(b + "/Kept/new.bin"), "not-downloaded", "no longer pinned")
        try unmount(at: second)
        try unmount()
    }

    /// A sequential read downloads ahead of the reader: after reading the first chunks of a big
    /// evicted file, the next ones are already here.
    func testSequentialReadsDownloadAhead() throws {
        try mount(extra: TwoMountsTests.longCache)
        let file = docs("TestDrive") + "/big.bin"
        assertShell("head -c 6291456 /dev/urandom > \(shellQuote(file))")
        XCTAssertTrue(ubiquityfs(["evict", file]).succeeded)
        XCTAssertEqual(status(file), "not-downloaded")
        // Read the first 2 MiB only (bypassing the page cache).
        assertShell("dd if=\(shellQuote(file)) of=/dev/null bs=1M count=2 iflag=direct status=none")
        let cacheDir = storeDir + "/cache/blobs"
        eventually("the chunks after the read one, fetched ahead") {
            let n = Int(sh("find \(shellQuote(cacheDir)) -type f -not -path '*/.tmp/*' | wc -l").stdout
                .trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
            return n >= 4
        }
        try unmount()
    }

    /// On the embedded store, content is all local: evict and pin say so.
    func testEvictOnTheEmbeddedStoreSaysThereIsNothingToEvict() throws {
        let dir = workDir + "/embedded"
        let mnt = workDir + "/mnt-embedded"
        try FileManager.default.createDirectory(atPath: mnt, withIntermediateDirectories: true)
        let r = ubiquityfs(["mount", "--apps", appsDir, "--store", dir, mnt])
        XCTAssertTrue(r.succeeded, "\(r)")
        adoptMount(at: mnt)
        XCTAssertEqual(Posix.writeFile(mnt + "/TestDrive/x.txt", "x\n"), 0)
        XCTAssertEqual(try? Posix.getxattr(mnt + "/TestDrive/x.txt", "user.ubiquity.status").get(), "current")
        let e = ubiquityfs(["evict", mnt + "/TestDrive/x.txt"])
        XCTAssertFalse(e.succeeded)
        XCTAssertTrue(e.stderr.contains("nothing to download or evict"), e.stderr)
        try unmount(at: mnt)
    }
}

/// One machine cut off from the servers: machine A's daemon runs in a network namespace of the
/// test's own, reaching the servers over a bridge (scripts/services --bridge), and the test takes
/// its link down. What A already has keeps working, what needs the servers fails within the
/// timeout instead of hanging, and once the link is back A catches up with what B did meanwhile.
class SharedStoreOfflineTests: SharedStoreTestCase {
    fileprivate var namespace = ""
    fileprivate var hostEnd = ""
    fileprivate let inside = "ubq0"

    override func setUpWithError() throws {
        try super.setUpWithError()
        guard let bridge = ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_BRIDGE"], !bridge.isEmpty else {
            throw FixtureError("UBIQUITYFS_TEST_BRIDGE is not set: the servers must be started with scripts/services --bridge")
        }
        // Namespaces and links an earlier run left when it was killed (one test run at a time).
        for name in Command.run(["ip", "netns", "list"], timeout: 20).stdout.split(separator: "\n")
            .compactMap({ $0.split(separator: " ").first.map(String.init) }) where name.hasPrefix("ubq-") {
            _ = Command.run(["ip", "netns", "del", name], timeout: 20)
        }
        let tag = String(UInt32.random(in: 0...UInt32.max), radix: 16)
        namespace = "ubq-" + tag
        hostEnd = "ubqh" + tag.prefix(8)
        let address = "10.231.0.\(Int.random(in: 10...250))/24"
        for step in [["ip", "netns", "add", namespace],
                     ["ip", "link", "add", hostEnd, "type", "veth", "peer", "name", inside, "netns", namespace],
                     ["ip", "link", "set", hostEnd, "master", bridge, "up"],
                     ["ip", "-n", namespace, "addr", "add", address, "dev", inside],
                     ["ip", "-n", namespace, "link", "set", inside, "up"],
                     ["ip", "-n", namespace, "link", "set", "lo", "up"]] {
            let r = Command.run(step, timeout: 20)
            guard r.succeeded else { throw FixtureError("\(step.joined(separator: " ")): \(r)") }
        }
    }

    override func tearDown() {
        super.tearDown()   // unmounts and stops the daemons first
        if !namespace.isEmpty {
            _ = Command.run(["ip", "link", "del", hostEnd], timeout: 20)
            _ = Command.run(["ip", "netns", "del", namespace], timeout: 20)
        }
    }

    /// Machine A (the first mount) runs in the namespace and reaches the servers over the bridge.
    override func launcher(at mnt: String) -> [String] {
        mnt == mountPoint ? ["nsenter", "--net=/run/netns/" + namespace] : []
    }

    override func storeArguments(at mnt: String) -> [String] {
        guard mnt == mountPoint, let host = ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_BRIDGE_HOST"] else {
            return super.storeArguments(at: mnt)
        }
        return ["--store", storeURL.replacingOccurrences(of: "@127.0.0.1:", with: "@\(host):"),
                "--local", localFolder(at: mnt), "--timeout", "3"]
    }

    fileprivate func link(_ state: String) {
        let r = Command.run(["ip", "-n", namespace, "link", "set", inside, state], timeout: 20)
        XCTAssertTrue(r.succeeded, "\(r)")
    }

    /// The errno of opening `path` and reading its start (0: it read).
    fileprivate func readError(_ path: String) -> Int32 {
        let fd = Posix.open(path, O_RDONLY)
        guard fd >= 0 else { return errno }
        defer { close(fd) }
        return Posix.pread(fd, count: 4096, at: 0) == nil ? errno : 0
    }

    fileprivate func timed<T>(_ body: () -> T) -> (T, Double) {
        let start = Date()
        let result = body()
        return (result, Date().timeIntervalSince(start))
    }

    func testACutOffMachineKeepsWorkingQueuesItsChangesAndCatchesUp() throws {
        try mountBoth()
        let pidA = (try? Posix.getxattr(mountPoint, "user.ubiquityfs.daemon-pid").get()) ?? "?"
        XCTAssertEqual(Command.run(["ip", "netns", "identify", pidA], timeout: 20).stdout.trimmingCharacters(in: .whitespacesAndNewlines),
                       namespace, "A's daemon runs in the test's namespace")
        let a = docs("TestDrive"), b = second + "/TestDrive"
        XCTAssertEqual(Posix.writeFile(b + "/near.txt", "read on A before the cut\n"), 0)
        assertShell("head -c 3000000 /dev/urandom > \(shellQuote(b + "/far.bin"))")
        eventually("B's files on A") { Posix.readText(a + "/near.txt") == "read on A before the cut\n" && Posix.exists(a + "/far.bin") }

        link("down")
        // What A has: names, attributes, content it read.
        XCTAssertEqual(Set(ls(a)), ["near.txt", "far.bin"])
        XCTAssertEqual(Posix.stat(a + "/far.bin")?.st_size, 3_000_000, "true size while cut off")
        XCTAssertEqual(Posix.readText(a + "/near.txt"), "read on A before the cut\n")
        // Content A never had: EIO, soon, and the log names the file.
        let (read, readTime) = timed { readError(a + "/far.bin") }
        XCTAssertEqual(read, EIO)
        XCTAssertLessThan(readTime, 15, "no hang beyond the timeout (3 s, and a retry)")
        eventually("the log line naming the file") {
            ((try? String(contentsOfFile: storeDir + "/ubiquityfs.log", encoding: .utf8)) ?? "").contains("TestDrive/far.bin")
        }
        // Changes are queued on A, at once (the link is down), and read back as made.
        let (made, makeTime) = timed { Posix.writeFile(a + "/while-cut.txt", "made while cut off\n") }
        XCTAssertEqual(made, 0, "queued: \(Posix.describe(made))")
        XCTAssertLessThan(makeTime, 15, "no hang beyond the timeout")
        XCTAssertEqual(Posix.readText(a + "/while-cut.txt"), "made while cut off\n")
        let notesA = docs("Notes"), notesB = second + "/Notes"
        assertShell("mkdir \(shellQuote(notesA + "/Offline")) && printf 'inside\\n' > \(shellQuote(notesA + "/Offline/inner.txt"))")
        XCTAssertEqual(Posix.writeFile(a + "/near.txt", "A's edit while cut off\n"), 0)
        XCTAssertEqual(Posix.writeFile(a + "/both.txt", "A's both.txt\n"), 0)
        XCTAssertEqual(Posix.readText(notesA + "/Offline/inner.txt"), "inside\n")
        // `status` says so, and what is queued, without waiting long for the servers.
        let (offline, statusTime) = timed { ubiquityfs(["status", mountPoint]) }
        XCTAssertTrue(offline.succeeded, "\(offline)")
        XCTAssertTrue(offline.stdout.hasPrefix("store: offline since "), offline.stdout)
        XCTAssertNotNil(offline.stdout.range(of: #"queued: [1-9][0-9]* changes, [1-9][0-9]* chunks"#, options: .regularExpression),
                        offline.stdout)
        XCTAssertTrue(offline.stdout.contains("recovered versions: unknown"), offline.stdout)
        XCTAssertLessThan(statusTime, 15)
        // B goes on meanwhile, editing a file A edits too and making a name A makes too.
        XCTAssertEqual(Posix.writeFile(b + "/from-b.txt", "made while A was cut off\n"), 0)
        XCTAssertEqual(Posix.writeFile(b + "/near.txt", "B's edit while A was cut off\n"), 0)
        XCTAssertEqual(Posix.writeFile(b + "/both.txt", "B's both.txt\n"), 0)
        XCTAssertFalse(Posix.exists(b + "/while-cut.txt"), "A's queued change is not on the servers yet")

        link("up")
        eventually("B's change on A once the link is back", seconds: 30) {
            Posix.readText(a + "/from-b.txt") == "made while A was cut off\n"
        }
        // A's queued changes land, in order; where B changed the same things first, both are kept.
        for (m, notes) in [(a, notesA), (b, notesB)] {
            eventually("A's queued changes in \(m)", seconds: 30) {
                Posix.readText(m + "/while-cut.txt") == "made while cut off\n" && Posix.readText(notes + "/Offline/inner.txt") == "inside\n"
                    && Posix.readText(m + "/both 2.txt") == "A's both.txt\n"
                    && ls(m).contains { $0.hasPrefix("near (conflict from ") }
            }
            XCTAssertEqual(Posix.readText(m + "/both.txt"), "B's both.txt\n", "B's came first and stays")
            XCTAssertEqual(Posix.readText(m + "/near.txt"), "B's edit while A was cut off\n", "B's came first and stays current")
            let copy = try XCTUnwrap(ls(m).first { $0.hasPrefix("near (conflict from ") })
            XCTAssertEqual(Posix.readText(m + "/" + copy), "A's edit while cut off\n", "A's edit is kept beside it")
        }
        let online = ubiquityfs(["status", mountPoint])
        XCTAssertTrue(online.stdout.hasPrefix("store: online since "), online.stdout)
        XCTAssertTrue(online.stdout.contains("queued: none"), online.stdout)
        XCTAssertTrue(online.stdout.contains("recovered versions: none"), online.stdout)
        XCTAssertEqual(Posix.writeFile(a + "/after.txt", "A is back\n"), 0)
        eventually("A's change on B") { Posix.readText(b + "/after.txt") == "A is back\n" }
        assertShell("cmp \(shellQuote(a + "/far.bin")) \(shellQuote(b + "/far.bin"))")

        // A link that drops every packet, rather than one that is down: the first change waits
        // out the timeout (3 s) and is queued; the next ones queue at once.
        XCTAssertEqual(Posix.writeFile(b + "/unread.txt", "A sees the name, not the content\n"), 0)
        eventually("B's unread file's name on A") { Posix.exists(a + "/unread.txt") }
        let drop = ["ip", "netns", "exec", namespace, "iptables", "-I", "OUTPUT", "-o", inside, "-j", "DROP"]
        XCTAssertTrue(Command.run(drop, timeout: 20).succeeded)
        // A read the servers never answer fails after one timeout, not one per try.
        let (unread, unreadTime) = timed { readError(a + "/unread.txt") }
        XCTAssertEqual(unread, EIO)
        XCTAssertLessThan(unreadTime, 6, "one timeout (3 s) of silence, not two")
        let (dropped, dropTime) = timed { Posix.writeFile(a + "/into-the-void.txt", "x\n") }
        XCTAssertEqual(dropped, 0, "queued: \(Posix.describe(dropped))")
        XCTAssertLessThan(dropTime, 20, "the timeout (3 s) ends the wait for an answer that never comes")
        XCTAssertGreaterThanOrEqual(dropTime, 2.5, "it was the timeout that ended it, not another failure")
        let (next, nextTime) = timed { Posix.writeFile(a + "/next.txt", "y\n") }
        XCTAssertEqual(next, 0)
        XCTAssertLessThan(nextTime, 2.5, "behind a queued change, no wait for the servers")
        XCTAssertTrue(Command.run(["ip", "netns", "exec", namespace, "iptables", "-D", "OUTPUT", "-o", inside, "-j", "DROP"],
                                  timeout: 20).succeeded)
        eventually("A's queued changes on B once packets flow", seconds: 30) {
            Posix.readText(b + "/into-the-void.txt") == "x\n" && Posix.readText(b + "/next.txt") == "y\n"
        }
        XCTAssertEqual(Posix.writeFile(a + "/last.txt", "z\n"), 0)
        eventually("and B sees a change made after") { Posix.readText(b + "/last.txt") == "z\n" }
        try unmount(at: second)
        try unmount()
    }

    /// Cut off, A's programs still lock against each other (decided on A alone, at once); back
    /// in reach, A's locks are held on the servers again, so B's programs wait for them.
    func testLocksWhileCutOffHoldOnTheMachineAndAreHeldOnTheServersAgain() throws {
        try mountBoth(extra: ["--lock-lease", "3"])
        let a = docs("SugoiApp") + "/shared.db", b = second + "/SugoiApp/shared.db"
        XCTAssertEqual(Posix.writeFile(b, "rows\n"), 0)
        eventually("the file on A") { Posix.readText(a) == "rows\n" }
        link("down")
        // A holder on A: a POSIX write lock on the whole file, and a shared flock.
        let ready = workDir + "/holder.ready"
        let holderLog = workDir + "/holder.log"
        let holder = try BackgroundProcess(["python3", "-c", """
            import fcntl, sys, time
            f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            g = open(sys.argv[1], 'r'); fcntl.flock(g, fcntl.LOCK_SH | fcntl.LOCK_NB)
            open(sys.argv[2], 'w').write('held')
            time.sleep(300)
            """, a, ready], environment: environment, log: holderLog)
        defer { holder.stop() }
        let start = Date()
        eventually("the holder's locks, taken while cut off", seconds: 20) { Posix.readText(ready) == "held" }
        XCTAssertLessThan(Date().timeIntervalSince(start), 8, "no wait beyond the timeout (3 s): \(Posix.readText(holderLog) ?? "")")
        // Another program on A is refused what conflicts, and given what does not.
        let probe = """
            import errno, fcntl, os, struct, sys
            def attempt(f, how):
                try:
                    how(f); return 'got'
                except OSError as e:
                    return errno.errorcode[e.errno]
            f = open(sys.argv[1], 'r+')
            print(attempt(f, lambda f: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)))
            g = open(sys.argv[1], 'r')
            print(attempt(g, lambda g: fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)))
            print(attempt(g, lambda g: fcntl.flock(g, fcntl.LOCK_SH | fcntl.LOCK_NB)))
            held = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))
            print('getlk', 'locked' if struct.unpack('hhqqi', held)[0] != fcntl.F_UNLCK else 'free')
            """
        let onA = assertShell("python3 -c \(shellQuote(probe)) \(shellQuote(a))")
        XCTAssertEqual(onA.stdout.split(separator: "\n").map(String.init), ["EAGAIN", "EAGAIN", "got", "getlk locked"],
                       "A's own programs exclude each other while cut off: \(onA.stderr)")
        link("up")
        // A's locks go back to the servers: B's programs find them there.
        var seenOnB = ""
        eventually("A's locks held on the servers again", seconds: 30) {
            let r = Command.run(["python3", "-c", probe, b], timeout: 10)
            seenOnB = "\(r)"
            return r.stdout.split(separator: "\n").map(String.init) == ["EAGAIN", "EAGAIN", "got", "getlk locked"]
        }
        XCTAssertTrue(seenOnB.contains("EAGAIN\nEAGAIN\ngot\ngetlk locked"), seenOnB)
        holder.stop()
        eventually("B gets them once A's program lets go", seconds: 30) {
            let r = Command.run(["python3", "-c", probe, b], timeout: 30)
            return r.stdout.split(separator: "\n").map(String.init) == ["got", "got", "got", "getlk free"]
        }

        // Locks taken in reach, then a cut longer than the lease (3 s): A says the lease ran out,
        // and puts them back once the servers answer.
        try? FileManager.default.removeItem(atPath: ready)
        let holder2 = try BackgroundProcess(holder.argv, environment: environment, log: holderLog)
        defer { holder2.stop() }
        eventually("the second holder's locks", seconds: 20) { Posix.readText(ready) == "held" }
        eventually("B sees them", seconds: 20) {
            Command.run(["python3", "-c", probe, b], timeout: 10).stdout.hasPrefix("EAGAIN\nEAGAIN")
        }
        link("down")
        eventually("the lapse in A's log", seconds: 20) {
            ((try? String(contentsOfFile: storeDir + "/ubiquityfs.log", encoding: .utf8)) ?? "").contains("lease of this machine's locks ran out")
        }
        link("up")
        eventually("A's locks held on the servers again after the lapse", seconds: 30) {
            Command.run(["python3", "-c", probe, b], timeout: 10).stdout.hasPrefix("EAGAIN\nEAGAIN\ngot\ngetlk locked")
        }
        holder2.stop()
        try unmount(at: second)
        try unmount()
    }

    /// A store made anew at the same address while A was away is not A's store: A, started from
    /// its copy while cut off, sends it nothing once it answers, and says why; its queue stays.
    func testAStoreMadeAnewWhileAWayGetsNothingFromThisMachine() throws {
        try mountBoth()
        let a = docs("TestDrive")
        link("down")
        XCTAssertEqual(Posix.writeFile(a + "/for-the-old-store.txt", "queued\n"), 0)
        try unmount()
        try unmount(at: second)
        XCTAssertTrue(psql("DROP SCHEMA ubiquityfs CASCADE", database: database).succeeded)
        // (Chunks in the database: the bucket is the old store's, and says so.)
        let made = ubiquityfs(["init-store", "--store", storeURL, "--chunks", "postgres"])
        XCTAssertTrue(made.succeeded, "\(made)")
        try mount(extra: TwoMountsTests.longCache)
        XCTAssertEqual(Posix.readText(a + "/for-the-old-store.txt"), "queued\n")
        link("up")
        eventually("the refusal in A's log", seconds: 30) {
            ((try? String(contentsOfFile: storeDir + "/ubiquityfs.log", encoding: .utf8)) ?? "").contains("now holds another store")
        }
        usleep(1_500_000)
        let status = ubiquityfs(["status", mountPoint]).stdout
        XCTAssertNotNil(status.range(of: #"queued: [1-9][0-9]* change"#, options: .regularExpression), status)
        XCTAssertEqual(psql("SELECT count(*) FROM ubiquityfs.changes", database: database).stdout
                        .trimmingCharacters(in: .whitespacesAndNewlines), "0", "nothing of A's reached the new store")
        try unmount()
    }

    /// The queue is on A's disk: a change queued while cut off, then the daemon killed, stays.
    /// Mounted again while still cut off, A starts from its own copy of the namespace: what it
    /// knew, its queued change, and new changes queued behind it. All of it lands once the
    /// servers answer, beside what B did meanwhile.
    func testQueuedChangesSurviveAKilledDaemon() throws {
        try mountBoth()
        let a = docs("TestDrive"), b = second + "/TestDrive"
        XCTAssertEqual(Posix.writeFile(b + "/known.txt", "A read this before the cut\n"), 0)
        XCTAssertEqual(Posix.writeFile(b + "/unread.txt", "A never read this\n"), 0)
        eventually("B's files on A") { Posix.readText(a + "/known.txt") == "A read this before the cut\n" && Posix.exists(a + "/unread.txt") }
        link("down")
        XCTAssertEqual(Posix.writeFile(a + "/queued.txt", "queued, then the daemon was killed\n"), 0)
        let queued = ubiquityfs(["status", mountPoint])
        XCTAssertNotNil(queued.stdout.range(of: #"queued: [1-9][0-9]* changes?, 1 chunk"#, options: .regularExpression), queued.stdout)
        let pid = try daemonPID(of: mountPoint)
        kill(pid, SIGKILL)
        XCTAssertTrue(waitForExit(pid, seconds: 10))
        clearDeadMount(mountPoint)
        XCTAssertFalse(Posix.exists(b + "/queued.txt"))

        // Started while cut off, twice (a clean stop between): the second start finds what the
        // first queued.
        for round in 1...2 {
            let (started, startTime) = timed { Result { try mount(extra: TwoMountsTests.longCache) } }
            XCTAssertNoThrow(try started.get(), "round \(round)")
            XCTAssertLessThan(startTime, 30, "the start waits the timeout (3 s) for the servers, not more")
            XCTAssertEqual(Posix.readText(a + "/known.txt"),
                           round == 1 ? "A read this before the cut\n" : "A's edit after an offline start\n", "round \(round)")
            XCTAssertEqual(Posix.readText(a + "/queued.txt"), "queued, then the daemon was killed\n", "round \(round)")
            XCTAssertEqual(Posix.stat(a + "/unread.txt")?.st_size, 18, "true size of content never downloaded")
            XCTAssertEqual(readError(a + "/unread.txt"), EIO, "content A never had cannot be read while cut off")
            let status = ubiquityfs(["status", mountPoint])
            XCTAssertTrue(status.stdout.hasPrefix("store: offline since "), status.stdout)
            XCTAssertTrue(status.stdout.contains("started from this machine's copy of the namespace"), status.stdout)
            if round == 1 {
                XCTAssertEqual(Posix.writeFile(a + "/started-cut-off.txt", "made by a daemon started while cut off\n"), 0)
                assertShell("mkdir \(shellQuote(docs("Notes") + "/Made offline")) && echo deep > \(shellQuote(docs("Notes") + "/Made offline/deep.txt"))")
                XCTAssertEqual(Posix.writeFile(a + "/known.txt", "A's edit after an offline start\n"), 0)
                try unmount()
            }
        }
        XCTAssertEqual(Posix.readText(a + "/started-cut-off.txt"), "made by a daemon started while cut off\n")
        XCTAssertEqual(Posix.readText(docs("Notes") + "/Made offline/deep.txt"), "deep\n")
        XCTAssertEqual(Posix.readText(a + "/known.txt"), "A's edit after an offline start\n")
        XCTAssertEqual(Posix.writeFile(b + "/meanwhile.txt", "B wrote this while A was away\n"), 0)

        link("up")
        eventually("A's changes on B", seconds: 30) {
            Posix.readText(b + "/queued.txt") == "queued, then the daemon was killed\n"
                && Posix.readText(b + "/started-cut-off.txt") == "made by a daemon started while cut off\n"
                && Posix.readText(self.second + "/Notes/Made offline/deep.txt") == "deep\n"
                && Posix.readText(b + "/known.txt") == "A's edit after an offline start\n"
        }
        eventually("B's change on A", seconds: 30) { Posix.readText(a + "/meanwhile.txt") == "B wrote this while A was away\n" }
        XCTAssertEqual(Posix.readText(a + "/unread.txt"), "A never read this\n", "downloaded once in reach")
        eventually("nothing queued, and the servers answer") {
            let out = self.ubiquityfs(["status", self.mountPoint]).stdout
            return out.contains("queued: none") && out.hasPrefix("store: online") && !out.contains("copy of the namespace")
        }
        XCTAssertEqual(Posix.writeFile(a + "/after.txt", "A is back\n"), 0)
        eventually("A's next change on B") { Posix.readText(b + "/after.txt") == "A is back\n" }
        try unmount(at: second)
        try unmount()
    }
}

/// The same cut-off machine with its chunks in the object store (every test above runs again so),
/// and the object store alone out of reach while PostgreSQL answers.
final class SharedStoreObjectStoreOfflineTests: SharedStoreOfflineTests {
    override var chunksOption: String? { bucketOption() }

    override func storeArguments(at mnt: String) -> [String] {
        var arguments = super.storeArguments(at: mnt)
        // Machine A reaches the bucket through the bridge: its own endpoint for it.
        if mnt == mountPoint, let host = ProcessInfo.processInfo.environment["UBIQUITYFS_TEST_BRIDGE_HOST"] {
            arguments += ["--chunks", bucketOption().replacingOccurrences(of: "127.0.0.1", with: host)]
        }
        return arguments
    }

    /// A save whose chunks cannot be uploaded is queued, not committed naming chunks no other
    /// machine can read: B never reads anything but what A saved, once it can.
    func testASaveWaitsForItsChunksWhenOnlyTheObjectStoreIsOutOfReach() throws {
        try mountBoth()
        let a = docs("TestDrive"), b = second + "/TestDrive"
        let rule = ["OUTPUT", "-o", inside, "-p", "tcp", "--dport", "57480", "-j", "DROP"]
        XCTAssertTrue(Command.run(["ip", "netns", "exec", namespace, "iptables", "-I"] + rule, timeout: 20).succeeded)
        XCTAssertEqual(Posix.writeFile(a + "/saved.txt", "saved while the object store was away\n"), 0)
        XCTAssertEqual(Posix.readText(a + "/saved.txt"), "saved while the object store was away\n")
        let queued = ubiquityfs(["status", mountPoint])
        XCTAssertNotNil(queued.stdout.range(of: #"queued: [1-9][0-9]* changes?, 1 chunk"#, options: .regularExpression), queued.stdout)
        // B may see the name (made before the content), never content it cannot read.
        usleep(500_000)
        if let seen = Posix.readText(b + "/saved.txt") { XCTAssertEqual(seen, "", "only the empty file made first") }
        XCTAssertTrue(Command.run(["ip", "netns", "exec", namespace, "iptables", "-D"] + rule, timeout: 20).succeeded)
        eventually("the save on B once the object store answers", seconds: 30) {
            Posix.readText(b + "/saved.txt") == "saved while the object store was away\n"
        }
        eventually("nothing queued") { self.ubiquityfs(["status", self.mountPoint]).stdout.contains("queued: none") }
        try unmount(at: second)
        try unmount()
    }
}
