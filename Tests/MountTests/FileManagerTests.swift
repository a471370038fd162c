// Real file managers on the mount: PCManFM and Nautilus under Xvfb, on a D-Bus session of their
// own (for GVfs's trash), driven from the keyboard with xdotool, every result checked on the
// filesystem, screenshots kept in .build/test-artifacts/. What a file manager shows is read
// back from what it copies of the folder (select all, copy, the clipboard's URIs).

import Foundation
import Glibc
import XCTest

final class FileManagerTests: MountTestCase {
    private var processes: [BackgroundProcess] = []
    private var display = ""
    private var desktop: [String: String] = [:]

    override func tearDown() {
        for p in processes.reversed() { p.stop() }
        processes = []
        super.tearDown()
    }

    /// Xvfb on a free display, a D-Bus session, and the file manager (`pcmanfm` or `nautilus`)
    /// opened on `folder`.
    private func startDesktop(_ folder: String, program: String = "pcmanfm") throws {
        var number = 90 + Int(getpid() % 100)
        while Posix.exists("/tmp/.X11-unix/X\(number)") || Posix.exists("/tmp/.X\(number)-lock") { number += 1 }
        display = ":\(number)"
        processes.append(try BackgroundProcess(["Xvfb", display, "-screen", "0", "1024x700x24", "-nolisten", "tcp"],
                                               environment: environment, log: workDir + "/xvfb.log"))
        var probe = environment
        probe["DISPLAY"] = display
        // Up when it answers, not when its socket appears.
        try waitFor("the X server", seconds: 30) {
            Posix.exists("/tmp/.X11-unix/X\(number)")
                && Command.run(["xdotool", "getdisplaygeometry"], timeout: 10, environment: probe).succeeded
        }
        let bus = workDir + "/bus"
        processes.append(try BackgroundProcess(["dbus-daemon", "--nofork", "--config-file=" + (try sessionBusConfig(bus))],
                                               environment: environment, log: workDir + "/dbus.log"))
        try waitFor("the D-Bus session", seconds: 20) { Posix.exists(bus) }
        desktop = environment
        desktop["DISPLAY"] = display
        desktop["DBUS_SESSION_BUS_ADDRESS"] = "unix:path=" + bus
        // No confirmation before a move to the trash: the keys below are the whole conversation.
        let libfm = homeDir + "/.config/libfm"
        try FileManager.default.createDirectory(atPath: libfm, withIntermediateDirectories: true)
        try "[config]\nconfirm_del=0\nconfirm_trash=0\n".write(toFile: libfm + "/libfm.conf", atomically: true, encoding: .utf8)
        // (A first GTK start in the test's fresh HOME builds its font cache: it can take a while.
        // One that could not open the display is started again, once.)
        let argv = program == "nautilus" ? ["nautilus", "--new-window", folder] : [program, folder]
        let log = workDir + "/\(program).log"
        var env = desktop
        // GTK 4 draws with GL by default, here Mesa's llvmpipe, whose threads now and then
        // deadlock under Xvfb (Nautilus's window then stays "Loading…" for good): Cairo draws
        // the same without them.
        env["GSK_RENDERER"] = "cairo"
        if ProcessInfo.processInfo.environment["UBIQUITYFS_FM_DEBUG"] != nil { env["G_MESSAGES_DEBUG"] = "all"; env["NAUTILUS_DEBUG"] = "All" }
        var manager = try BackgroundProcess(argv, environment: env, log: log)
        processes.append(manager)
        var window = ""
        do {
            try waitFor("\(program)'s window", seconds: 90) {
                if !manager.isRunning, processes.filter({ $0.argv[0] == program }).count < 2,
                   let again = try? BackgroundProcess(argv, environment: desktop, log: log) {
                    manager = again
                    processes.append(again)
                }
                window = (try? waitForWindow(named: (folder as NSString).lastPathComponent, seconds: 1)) ?? ""
                return !window.isEmpty
            }
        } catch {
            throw FixtureError("\(error)\n--- \(program):\n\(Posix.readText(log) ?? "")\n--- Xvfb:\n\(Posix.readText(workDir + "/xvfb.log") ?? "")")
        }
        x("windowsize \(window) 900 600 windowmove \(window) 0 0 windowfocus --sync \(window)")
        usleep(500_000)
        self.window = window
        self.program = program
    }
    private var window = ""
    private var program = ""

    /// A session bus that starts the desktop's services (GVfs, dconf, the file managers) but
    /// none that need what this machine lacks: GVfs's UDisks2 volume monitor waits on a system
    /// bus (and Nautilus shows a mount point's folder only once it has answered where its mount
    /// is), Tracker's miners index the test's home, systemd's user manager cannot start here.
    private func sessionBusConfig(_ bus: String) throws -> String {
        let services = workDir + "/dbus-services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        let system = "/usr/share/dbus-1/services"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: system)) ?? []
        where !name.contains("UDisks2") && !name.contains("Tracker") && !name.contains("systemd1") {
            try FileManager.default.createSymbolicLink(atPath: services + "/" + name, withDestinationPath: system + "/" + name)
        }
        let config = workDir + "/dbus-session.conf"
        try """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>session</type>
          <listen>unix:path=\(bus)</listen>
          <auth>EXTERNAL</auth>
          <servicedir>\(services)</servicedir>
          <policy context="default">
            <allow send_destination="*" eavesdrop="true"/>
            <allow eavesdrop="true"/>
            <allow own="*"/>
          </policy>
        </busconfig>

        """.write(toFile: config, atomically: true, encoding: .utf8)
        return config
    }

    private func waitFor(_ what: String, seconds: Double, _ check: () -> Bool) throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if check() { return }
            usleep(50_000)
        }
        throw FixtureError("\(what) did not come within \(seconds) s")
    }

    /// Runs `xdotool ARGS` on the test's display.
    @discardableResult
    private func x(_ args: String) -> CommandResult {
        Command.run(["bash", "-c", "xdotool " + args], timeout: 30, environment: desktop)
    }

    private func windowNames() -> Set<String> {
        Set(x("search --onlyvisible --name '' getwindowname %@").lines)
    }

    private func waitForWindow(named name: String, seconds: Double = 20) throws -> String {
        var id = ""
        try waitFor("a window named \(name)", seconds: seconds) {
            id = x("search --onlyvisible --name \(shellQuote("^" + NSRegularExpression.escapedPattern(for: name) + "$"))").lines.first ?? ""
            return !id.isEmpty
        }
        return id
    }

    private func keys(_ keys: String) {
        x("key --delay 60 \(keys)")
        usleep(300_000)
    }

    private func type(_ text: String) {
        x("type --delay 40 \(shellQuote(text))")
    }

    /// Opens `location` through the location bar (Ctrl+L).
    private func go(_ location: String) throws {
        keys("ctrl+l")
        type(location)
        keys("Return")
        usleep(700_000)
    }

    private func screenshot(_ name: String) {
        let artifacts = Self.packageRoot + "/.build/test-artifacts"
        try? FileManager.default.createDirectory(atPath: artifacts, withIntermediateDirectories: true)
        let shot = Command.run(["import", "-window", "root", artifacts + "/" + name], timeout: 30, environment: desktop)
        XCTAssertTrue(shot.succeeded, "screenshot \(name): \(shot)")
    }

    /// The names the file manager's view of the current folder holds: select all, copy, read
    /// the clipboard. (Nautilus takes keys in its view once clicked there, on an empty spot.)
    private func namesShown() -> Set<String> {
        if program == "nautilus" { x("mousemove --window \(window) 800 450 click 1") }
        keys("ctrl+a ctrl+c")
        let copied = Command.run(["xclip", "-o", "-selection", "clipboard", "-t", "x-special/gnome-copied-files"],
                                 timeout: 10, environment: desktop)
        // "copy", then one URI a line; the last ends in a NUL.
        return Set(copied.lines.dropFirst().compactMap { URL(string: $0.trimmingCharacters(in: ["\0"]))?.lastPathComponent })
    }

    /// A change through another mount of the store shows in PCManFM with no refresh: the
    /// daemon replays it through this mount, so GIO's inotify monitor sees it.
    func testPCManFMShowsAnotherMountsChangesWithoutARefresh() throws {
        let other = workDir + "/mnt2"
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        try mount(extra: TwoMountsTests.longCache, at: other)
        try mount(extra: TwoMountsTests.longCache)
        XCTAssertEqual(Posix.writeFile(other + "/TestDrive/MyTextFile.txt", "Hello from iCloud Drive\n"), 0)
        try startDesktop(docs("TestDrive"))
        eventually("the first file shown") { self.namesShown() == ["MyTextFile.txt"] }

        XCTAssertEqual(Posix.writeFile(other + "/TestDrive/From the phone.txt", "sent from another device\n"), 0)
        eventually("the other mount's new file shown") { self.namesShown() == ["MyTextFile.txt", "From the phone.txt"] }
        screenshot("pcmanfm-other-mount.png")
        assertSucceeds("rename on the other mount") {
            rename(other + "/TestDrive/From the phone.txt", other + "/TestDrive/Phone notes.txt")
        }
        eventually("the rename shown") { self.namesShown() == ["MyTextFile.txt", "Phone notes.txt"] }
        assertSucceeds("unlink on the other mount") { unlink(other + "/TestDrive/Phone notes.txt") }
        eventually("the delete shown") { self.namesShown() == ["MyTextFile.txt"] }
        XCTAssertEqual(ls(docs("TestDrive")), ["MyTextFile.txt"])
        for p in processes.reversed() { p.stop() }
        processes = []
        try unmount()
        try unmount(at: other)
    }

    /// Nautilus (GTK 4) on the mount: the containers by name, a file in one, another mount's
    /// changes with no refresh, a rename, the folder levels, the trash; nothing it keeps lands
    /// in the containers.
    func testNautilusOnTheMount() throws {
        let other = workDir + "/mnt2"
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        try mount(extra: TwoMountsTests.longCache, at: other)
        try mount(extra: TwoMountsTests.longCache)
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/MyTextFile.txt", "Hello from iCloud Drive\n"), 0)
        try startDesktop(mountPoint, program: "nautilus")
        eventually("the containers shown", seconds: 20) { self.namesShown() == ["Notes", "SugoiApp", "TestDrive"] }
        screenshot("nautilus-containers.png")
        // A container in a window of its own, as `nautilus FOLDER` opens one in the running
        // Nautilus (typing into its location bar under Xvfb now and then goes nowhere).
        processes.append(try BackgroundProcess(["nautilus", "--new-window", docs("TestDrive")], environment: desktop,
                                               log: workDir + "/nautilus-second.log"))
        window = try waitForWindow(named: "TestDrive")
        x("windowsize \(window) 900 600 windowmove \(window) 0 0 windowfocus --sync \(window)")
        eventually("TestDrive's file shown", seconds: 20) { self.namesShown() == ["MyTextFile.txt"] }

        XCTAssertEqual(Posix.writeFile(other + "/TestDrive/From the phone.txt", "sent from another device\n"), 0)
        eventually("the other mount's new file shown", seconds: 20) { self.namesShown() == ["MyTextFile.txt", "From the phone.txt"] }
        screenshot("nautilus-other-mount.png")
        assertSucceeds("unlink on the other mount") { unlink(other + "/TestDrive/From the phone.txt") }
        eventually("the other mount's delete shown") { self.namesShown() == ["MyTextFile.txt"] }

        // Rename (F2): Nautilus selects the name without its extension.
        keys("ctrl+a F2")
        type("Report")
        keys("Return")
        eventually("renamed") { Posix.readText(docs("TestDrive") + "/Report.txt") == "Hello from iCloud Drive\n" }

        // A folder where the container allows none: refused, nothing made. (Its dialogs are
        // windows of their own, given the keyboard here, with no window manager to.)
        let windowsBefore = Set(x("search --onlyvisible --name ''").lines)
        keys("ctrl+shift+n")
        let dialog = try waitForWindow(named: "New Folder")
        x("windowfocus --sync \(dialog)")
        type("Nope")
        keys("Return")
        usleep(1_500_000)
        screenshot("nautilus-folder-levels.png")
        // Its error is a window too (one of those that came since): "Skip", the default, closes it.
        for id in Set(x("search --onlyvisible --name ''").lines).subtracting(windowsBefore) where id != dialog {
            x("windowfocus --sync \(id)")
            keys("Return")
        }
        XCTAssertEqual(Set(x("search --onlyvisible --name ''").lines), windowsBefore, "the dialogs closed")
        XCTAssertFalse(Posix.exists(docs("TestDrive") + "/Nope"), "TestDrive allows no folders")
        x("windowfocus --sync \(window)")

        // To the trash (Delete): into Recently Deleted.
        // (GTK 4 takes a Delete in the same xdotool call as a Ctrl chord as part of it.)
        x("mousemove --window \(window) 800 450 click 1")
        keys("ctrl+a")
        keys("Delete")
        eventually("moved to the trash") { !Posix.exists(docs("TestDrive") + "/Report.txt") }
        screenshot("nautilus-trash.png")
        XCTAssertTrue(ubiquityfs(["trash", "list", "--store", storeDir]).stdout.contains("TestDrive/Report.txt"))

        XCTAssertEqual(ls(docs("TestDrive")), [])
        XCTAssertEqual(ls(docs("SugoiApp")), [])
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        let nautilus = processes.first { $0.argv[0] == "nautilus" }
        XCTAssertTrue(nautilus?.isRunning ?? false, "Nautilus is still running: \(Posix.readText(workDir + "/nautilus.log") ?? "")")
        for p in processes.reversed() { p.stop() }
        processes = []
        try unmount()
        try unmount(at: other)
    }

    func testPCManFMOnTheMount() throws {
        try mount()
        XCTAssertEqual(Posix.writeFile(docs("TestDrive") + "/MyTextFile.txt", "Hello from iCloud Drive\n"), 0)
        try startDesktop(mountPoint)
        screenshot("pcmanfm-containers.png")
        XCTAssertTrue(windowNames().contains((mountPoint as NSString).lastPathComponent))

        // A folder where the container allows one, a clear refusal where it does not.
        try go(docs("SugoiApp"))
        keys("ctrl+shift+n")
        _ = try waitForWindow(named: "Creating New Folder")
        type("Reports")
        keys("Return")
        eventually("SugoiApp/Reports made") { Posix.isDirectory(docs("SugoiApp") + "/Reports") }
        try go(docs("TestDrive"))
        keys("ctrl+shift+n")
        _ = try waitForWindow(named: "Creating New Folder")
        type("Nope")
        keys("Return")
        _ = try waitForWindow(named: "Error")
        screenshot("pcmanfm-folder-levels.png")
        keys("Return")
        XCTAssertFalse(Posix.exists(docs("TestDrive") + "/Nope"), "TestDrive allows no folders")

        // Rename (F2), then to the trash (Delete): it lands in Recently Deleted. The name is
        // this test's own: the Trash view shows every mount's trash, and only this one's item
        // is picked there.
        let report = "Report " + String((workDir as NSString).lastPathComponent.suffix(6))
        keys("ctrl+a F2")
        _ = try waitForWindow(named: "Rename File")
        type(report)
        keys("Return")
        eventually("renamed") { Posix.readText(docs("TestDrive") + "/\(report).txt") == "Hello from iCloud Drive\n" }
        keys("ctrl+a Delete")
        eventually("moved to the trash") { !Posix.exists(docs("TestDrive") + "/\(report).txt") }
        XCTAssertTrue(ubiquityfs(["trash", "list", "--store", storeDir]).stdout.contains("TestDrive/\(report).txt"))

        // A file copied in by paste, from the clipboard as GTK file managers put it there.
        let local = scratchDir + "/Notes from home.txt"
        XCTAssertEqual(Posix.writeFile(local, "pasted\n"), 0)
        let uri = "file://" + (local.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? local)
        try "copy\n\(uri)".write(toFile: workDir + "/clipboard", atomically: true, encoding: .utf8)
        processes.append(try BackgroundProcess(["xclip", "-selection", "clipboard", "-t", "x-special/gnome-copied-files",
                                                "-i", workDir + "/clipboard", "-quiet"], environment: desktop, log: workDir + "/xclip.log"))
        usleep(500_000)
        keys("ctrl+v")
        eventually("pasted in") { Posix.readText(docs("TestDrive") + "/Notes from home.txt") == "pasted\n" }

        // The Trash view lists it; its Restore puts it back.
        try go("trash:///")
        eventually("the trash view opens") { self.windowNames().contains { $0.lowercased().contains("trash") } }
        usleep(700_000)
        screenshot("pcmanfm-trash.png")
        // Picked by typing its name; its context menu is a window of its own: "r" once it is up.
        type(report)
        keys("Escape")
        let before = Set(x("search --onlyvisible --name ''").lines)
        keys("shift+F10")
        try? waitFor("the context menu", seconds: 5) { !Set(self.x("search --onlyvisible --name ''").lines).subtracting(before).isEmpty }
        keys("r")
        eventually("restored") { Posix.readText(docs("TestDrive") + "/\(report).txt") == "Hello from iCloud Drive\n" }
        XCTAssertEqual(ubiquityfs(["trash", "list", "--store", storeDir]).stdout, "Recently Deleted is empty\n")

        // Nothing the file manager keeps litters the containers.
        XCTAssertEqual(ls(docs("TestDrive")), ["Notes from home.txt", report + ".txt"])
        XCTAssertEqual(ls(docs("SugoiApp")), ["Reports"])
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        let pcmanfm = processes.first { $0.argv[0] == "pcmanfm" }
        XCTAssertTrue(pcmanfm?.isRunning ?? false, "PCManFM is still running: \(Posix.readText(workDir + "/pcmanfm.log") ?? "")")
        for p in processes.reversed() { p.stop() }
        processes = []
        try unmount()
    }
}
