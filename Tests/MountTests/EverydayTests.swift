// Everyday Linux use: the mount's name in df, mount and findmnt; the checks of a mount point;
// fstab and mount(8) through mount.fuse3, a user's own fstab mount; `install` (binary, man page, completions loaded in
// bash, zsh and fish); the systemd user unit; and what a newcomer types after scripts/demo.

import Foundation
import Glibc
import XCTest

final class EverydayTests: MountTestCase {
    func testTheMountIsNamedUbiquityFSEverywhere() throws {
        // A comma in the store's path survives libfuse's option parsing.
        storeDirOverride = workDir + "/my,store"
        try mount()
        let found = assertShell("findmnt -n -o SOURCE,FSTYPE \(shellQuote(mountPoint))").stdout
        XCTAssertEqual(found.split(whereSeparator: \.isWhitespace).map(String.init), ["ubiquityfs:" + storeDir, "fuse.ubiquityfs"])
        XCTAssertEqual(assertShell("df --output=source \(shellQuote(mountPoint))").lines.last, "ubiquityfs:" + storeDir)
        XCTAssertTrue(assertShell("mount").lines.contains("ubiquityfs:\(storeDir) on \(mountPoint) type fuse.ubiquityfs (rw,nosuid,nodev,relatime,user_id=0,group_id=0,default_permissions)"))
        try unmount()
    }

    /// ~/UbiquityDrive is a mount the desktop shows (GIO's volume monitor, which file managers'
    /// sidebars list), and its free space is the store's disk's.
    func testTheDefaultMountPointIsShownWithTrueFreeSpace() throws {
        let drive = homeDir + "/UbiquityDrive"
        try FileManager.default.createDirectory(atPath: drive, withIntermediateDirectories: true)
        try mount(at: drive)
        let listed = sh("dbus-run-session -- gio mount -l 2>/dev/null")
        XCTAssertTrue(listed.lines.contains("Mount(0): UbiquityDrive -> file://\(drive)"), "\(listed)")
        let df = { (path: String) in self.sh("df -B1 --output=size \(shellQuote(path))").lines.last ?? "" }
        XCTAssertEqual(df(drive), df(storeDir), "the size of the disk that holds the store")
        try unmount(at: drive)
    }

    func testAMountPointMustBeEmptyAndNotAMount() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: mountPoint + "/left.txt", contents: Data("mine\n".utf8)))
        let refused = ubiquityfs(mountArguments())
        XCTAssertEqual(refused.status, 1)
        XCTAssertEqual(refused.stderr, "ubiquityfs mount: \(mountPoint) is not empty (1 item); a mount would hide what is there until it is unmounted. Choose an empty folder, or pass --allow-non-empty (allow_non_empty in fstab)\n")
        XCTAssertFalse(isMounted(mountPoint))
        try mount(extra: ["--allow-non-empty"])
        XCTAssertFalse(Posix.exists(mountPoint + "/left.txt"), "hidden while mounted")
        let twice = ubiquityfs(mountArguments(extra: ["--allow-non-empty"]))
        XCTAssertEqual(twice.status, 1)
        XCTAssertEqual(twice.stderr, "ubiquityfs mount: \(mountPoint) is already a mount point (fuse.ubiquityfs); unmount it first with 'ubiquityfs unmount \(mountPoint)', or choose another folder\n")
        // A mount whose daemon died says how to clear it.
        guard let pid = readDaemonPID() else { return XCTFail("no daemon pid") }
        kill(pid, SIGKILL)
        XCTAssertTrue(waitForExit(pid, seconds: 10))
        let dead = ubiquityfs(mountArguments())
        XCTAssertEqual(dead.stderr, "ubiquityfs mount: \(mountPoint) is a mount whose daemon is gone; clear it with 'fusermount3 -u \(mountPoint)', then mount again\n")
        assertShell("fusermount3 -u \(shellQuote(mountPoint))")
        XCTAssertEqual(Posix.readText(mountPoint + "/left.txt"), "mine\n", "what was there is back")
    }

    /// `/usr/local/bin/ubiquityfs` (where `install` puts it, on mount.fuse3's PATH) for the length
    /// of `body`; a binary that was there before is put back.
    private func withInstalledBinary(_ body: () throws -> Void) throws {
        let target = "/usr/local/bin/ubiquityfs"
        let saved = target + ".saved-by-ubiquityfs-tests"
        // A run killed before it put one back left it here.
        if Posix.lstat(saved) != nil { XCTAssertEqual(rename(saved, target), 0, "restore \(saved)") }
        let hadOne = Posix.lstat(target) != nil
        // A second name first: the one there is never lost, whatever happens after.
        if hadOne, link(target, saved) != 0 {
            throw FixtureError("cannot keep \(target) aside as \(saved): \(Posix.describe(errno))")
        }
        defer {
            if hadOne { rename(saved, target) } else { unlink(target) }
        }
        assertShell("install -m 0755 \(shellQuote(Self.binary)) \(target)")
        try body()
    }

    func testFstabAndMountThroughMountFuse3() throws {
        // mount.fuse3's own form, with the program named in the source.
        assertShell("mount -t fuse \(shellQuote(Self.binary + "#" + storeDir)) \(shellQuote(mountPoint)) -o apps=\(shellQuote(appsDir)),cache_seconds=5,_netdev,nofail,x-gvfs-show")
        adoptMount(at: mountPoint)
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        try unmount()
        try withInstalledBinary {
            // An fstab line with the usual options, mounted by its mount point.
            let fstab = workDir + "/fstab"
            try "\(storeDir) \(mountPoint) fuse.ubiquityfs noauto,user,ro,allow_other,_netdev,apps=\(appsDir),x-systemd.automount 0 0\n"
                .write(toFile: fstab, atomically: true, encoding: .utf8)
            assertShell("mount -T \(shellQuote(fstab)) \(shellQuote(mountPoint))")
            adoptMount(at: mountPoint)
            XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
            XCTAssertEqual(assertShell("findmnt -n -o FSTYPE \(shellQuote(mountPoint))").stdout, "fuse.ubiquityfs\n")
            let options = assertShell("findmnt -n -o OPTIONS \(shellQuote(mountPoint))").stdout
            XCTAssertTrue(options.hasPrefix("ro,nosuid,nodev,") && options.contains("allow_other"), "kept nosuid,nodev, took ro and allow_other: \(options)")
            assertErrno(EROFS, "ro from fstab") { Posix.open(docs("TestDrive") + "/new.txt", O_WRONLY | O_CREAT) }
            assertShell("umount \(shellQuote(mountPoint))")
            XCTAssertFalse(isMounted(mountPoint))
            // mount -t fuse.ubiquityfs; an option it does not know gets one clear line.
            let bad = sh("mount -t fuse.ubiquityfs -o apps=\(shellQuote(appsDir)),colour=blue \(shellQuote(storeDir)) \(shellQuote(mountPoint))")
            XCTAssertFalse(bad.succeeded)
            XCTAssertTrue(bad.stderr.contains("ubiquityfs: unknown mount option 'colour=blue'"), bad.stderr)
            XCTAssertFalse(isMounted(mountPoint))
            assertShell("mount -t fuse.ubiquityfs -o apps=\(shellQuote(appsDir)) \(shellQuote(storeDir)) \(shellQuote(mountPoint))")
            adoptMount(at: mountPoint)
            XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/x.txt", "x"), 0)
            try unmount()
        }
    }

    /// A user's own mount from /etc/fstab (`user`): mount(8) lets a user mount that line, runs
    /// mount.fuse3 as the user, and the daemon mounts through fusermount3; the mount is the
    /// user's alone, and `umount` by the same user stops it cleanly.
    func testAUserMountFromFstab() throws {
        let user = "nobody", uid: uid_t = 65534, gid: gid_t = 65534
        // The user needs a way in to the test's folder, and its own store and mount point.
        XCTAssertEqual(chmod(workDir, 0o755), 0)
        for dir in [storeDir, mountPoint, appsDir] { XCTAssertEqual(chown(dir, uid, gid), 0, dir) }
        let asUser = "setpriv --reuid=\(uid) --regid=\(gid) --clear-groups "
        let line = "\(storeDir) \(mountPoint) fuse.ubiquityfs noauto,user,_netdev,apps=\(appsDir) 0 0"
        let fstab = "/etc/fstab"
        let before = try String(contentsOfFile: fstab, encoding: .utf8)
        try (before + (before.hasSuffix("\n") || before.isEmpty ? "" : "\n") + line + "\n").write(toFile: fstab, atomically: true, encoding: .utf8)
        defer {
            // Only this line goes: anything else written there meanwhile stays.
            if let now = try? String(contentsOfFile: fstab, encoding: .utf8) {
                let kept = now.split(separator: "\n", omittingEmptySubsequences: false).filter { $0 != line }
                try? kept.joined(separator: "\n").write(toFile: fstab, atomically: true, encoding: .utf8)
            }
        }
        try withInstalledBinary {
            assertShell(asUser + "mount \(shellQuote(mountPoint))")
            adoptMount(at: mountPoint)
            let shown = assertShell("findmnt -n -o FSTYPE,OPTIONS \(shellQuote(mountPoint))").stdout
            XCTAssertTrue(shown.hasPrefix("fuse.ubiquityfs ") && shown.contains("user_id=\(uid)"), shown)
            XCTAssertEqual(assertShell(asUser + "ls \(shellQuote(mountPoint))").lines, ["Notes", "SugoiApp", "TestDrive"])
            assertShell(asUser + "sh -c 'echo mine > \(mountPoint)/TestDrive/mine.txt'")
            XCTAssertEqual(assertShell(asUser + "stat -c %U \(shellQuote(docs("TestDrive") + "/mine.txt"))").stdout, "\(user)\n")
            // Without allow_other, not even root gets in.
            assertErrno(EACCES, "root on a user's mount") { Posix.open(docs("TestDrive"), O_RDONLY) }
            let pid = try XCTUnwrap(readDaemonPID(), "the user's daemon")
            assertShell(asUser + "umount \(shellQuote(mountPoint))")
            XCTAssertFalse(isMounted(mountPoint))
            XCTAssertTrue(waitForExit(pid, seconds: 10), "the daemon stops at umount")
            XCTAssertTrue(Posix.readText(storeDir + "/ubiquityfs.log")?.contains("stopped cleanly") ?? false, daemonLogTail())
            // Mounted again by the user, the file is there.
            assertShell(asUser + "mount \(shellQuote(mountPoint))")
            adoptMount(at: mountPoint)
            XCTAssertEqual(assertShell(asUser + "cat \(shellQuote(docs("TestDrive") + "/mine.txt"))").stdout, "mine\n")
            assertShell(asUser + "umount \(shellQuote(mountPoint))")
            XCTAssertFalse(isMounted(mountPoint))
        }
    }

    func testInstallPutsTheBinaryManPageAndCompletions() throws {
        let prefix = workDir + "/prefix"
        let installed = ubiquityfs(["install", "--prefix", prefix])
        XCTAssertEqual(installed.status, 0, "\(installed)")
        XCTAssertTrue(FileManager.default.isExecutableFile(atPath: prefix + "/bin/ubiquityfs"))
        XCTAssertEqual(Command.run([prefix + "/bin/ubiquityfs", "--help"], environment: environment).status, 0)
        // The man page renders without a warning and has every command.
        let man = sh("MANWIDTH=100 man --warnings -l \(shellQuote(prefix + "/share/man/man1/ubiquityfs.1"))")
        XCTAssertTrue(man.succeeded, "\(man)")
        XCTAssertEqual(man.stderr, "")
        for word in ["install-service", "FSTAB", "allow_non_empty", "keep-deleted-days"] { XCTAssertTrue(man.stdout.contains(word), word) }
        // Each shell loads its completion and completes commands and options.
        let bash = sh("""
            source \(shellQuote(prefix + "/share/bash-completion/completions/ubiquityfs"))
            COMP_WORDS=(ubiquityfs ins); COMP_CWORD=1; _ubiquityfs; echo "${COMPREPLY[*]}"
            COMP_WORDS=(ubiquityfs mount --allow); COMP_CWORD=2; _ubiquityfs; echo "${COMPREPLY[*]}"
            """)
        XCTAssertEqual(bash.stdout, "install install-service\n--allow-non-empty\n", "\(bash)")
        let fish = sh("fish -c 'source \(prefix)/share/fish/vendor_completions.d/ubiquityfs.fish; complete -C \"ubiquityfs tr\"; complete -C \"ubiquityfs trash --old\"'")
        XCTAssertEqual(fish.stdout.split(separator: "\n").map { String($0.split(separator: "\t").first ?? "") }, ["trash", "--older-than"], "\(fish)")
        let zsh = sh("""
            zsh -n \(shellQuote(prefix + "/share/zsh/site-functions/_ubiquityfs"))
            zsh -fc 'fpath=(\(prefix)/share/zsh/site-functions $fpath); autoload -Uz compinit; compinit -u -d \(workDir)/zcompdump; print -r -- ${_comps[ubiquityfs]}'
            """)
        XCTAssertEqual(zsh.stdout, "_ubiquityfs\n", "\(zsh)")
        let removed = ubiquityfs(["uninstall", "--prefix", prefix])
        XCTAssertEqual(removed.lines.count, 5, "\(removed)")
        XCTAssertFalse(Posix.exists(prefix + "/bin/ubiquityfs"))
    }

    func testTheUserUnitIsValid() throws {
        let drive = workDir + "/My Drive"
        let written = ubiquityfs(["install-service", "--no-enable", "--mountpoint", drive])
        XCTAssertEqual(written.status, 0, "\(written)")
        let unit = homeDir + "/.config/systemd/user/ubiquityfs.service"
        let text = try String(contentsOfFile: unit, encoding: .utf8)
        XCTAssertTrue(text.contains("ExecStart=\"\(URL(fileURLWithPath: Self.binary).resolvingSymlinksInPath().path)\" \"mount\" \"--foreground\" \"--store\" \"\(defaultStoreDir)\""), text)
        XCTAssertTrue(text.contains("\"\(drive)\"\n"), "a mount point with a space is one word")
        XCTAssertTrue(text.contains("ExecStartPre=\"\(URL(fileURLWithPath: Self.binary).resolvingSymlinksInPath().path)\" unmount --if-dead"), text)
        // systemd's % and $ are written so that they stay themselves.
        let odd = ubiquityfs(["install-service", "--no-enable", "--mountpoint", workDir + "/100% $HOME"])
        XCTAssertEqual(odd.status, 0, "\(odd)")
        let oddText = try String(contentsOfFile: unit, encoding: .utf8)
        XCTAssertTrue(oddText.contains("\"\(workDir)/100%% $$HOME\"\n"), oddText)
        XCTAssertTrue(sh("systemd-analyze verify --man=no \(shellQuote(unit))").succeeded)
        let verified = sh("systemd-analyze verify --man=no \(shellQuote(unit))")
        XCTAssertTrue(verified.succeeded && verified.stderr.isEmpty, "\(verified)")
        XCTAssertEqual(ubiquityfs(["uninstall-service", "--no-disable"]).stdout, "removed \(unit)\n")
        XCTAssertFalse(Posix.exists(unit))
    }

    /// scripts/demo, then what a newcomer types next, with no flags at all.
    func testTheDemoThenTheNewcomersNextCommands() throws {
        let prefix = workDir + "/prefix"
        // A manifest of the user's own under a sample's name is kept.
        let apps = homeDir + "/.config/ubiquityfs/apps"
        try FileManager.default.createDirectory(atPath: apps, withIntermediateDirectories: true)
        let own = try String(contentsOfFile: appsDir + "/Notes.plist", encoding: .utf8) + "<!-- mine -->\n"
        try own.write(toFile: apps + "/Notes.plist", atomically: true, encoding: .utf8)
        var env = environment
        env["UBIQUITYFS_BIN"] = Self.binary
        env["UBIQUITYFS_PREFIX"] = prefix
        storeDirOverride = defaultStoreDir
        let drive = homeDir + "/UbiquityDrive"
        let demo = Command.run(["bash", Self.packageRoot + "/scripts/demo"], timeout: 300, environment: env)
        adoptMount(at: drive)
        XCTAssertEqual(demo.status, 0, "\(demo)")
        XCTAssertTrue(demo.stdout.contains("kept your \(apps)/Notes.plist"), demo.stdout)
        XCTAssertEqual(try String(contentsOfFile: apps + "/Notes.plist", encoding: .utf8), own)
        let next = { (command: String) in
            self.sh("export PATH=\(shellQuote(prefix + "/bin")):$PATH; cd; \(command)")
        }
        let containers = next("ubiquityfs containers")
        XCTAssertTrue(containers.succeeded && containers.stdout.contains("iCloud.com.example.TestDrive"), "\(containers)")
        let versions = next("ubiquityfs versions ~/UbiquityDrive/TestDrive/MyTextFile.txt")
        XCTAssertTrue(versions.succeeded && versions.lines.count == 2 && versions.lines[1].hasSuffix("yes"), "\(versions)")
        XCTAssertTrue(next("ubiquityfs status ~/UbiquityDrive").succeeded)
        let unmounted = next("ubiquityfs unmount ~/UbiquityDrive")
        XCTAssertTrue(unmounted.succeeded, "\(unmounted)")
        XCTAssertFalse(isMounted(drive))
    }
}
