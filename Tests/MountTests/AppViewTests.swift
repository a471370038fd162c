// The app view (`--app BUNDLE_ID`) and how it shares a store with the drive view. A store is opened by
// one daemon at a time, so the two views are mounted one after the other.

import Foundation
import Glibc
import XCTest

final class AppViewTests: MountTestCase {
    func testPrivateAppSeesItsWholeContainer() throws {
        try mount(app: "com.example.Ledger")
        let container = mountPoint + "/iCloud.com.example.Ledger"
        XCTAssertEqual(ls(mountPoint), ["iCloud.com.example.Ledger"])
        XCTAssertEqual(ls(container), ["Documents"])
        // Documents with no level limit, and private data beside Documents.
        assertShell("""
            cd \(shellQuote(container))
            echo 'balance: 42' > Documents/ledger.txt
            mkdir -p Documents/2026/11/30 && echo entry > Documents/2026/11/30/entry.txt
            mkdir -p Library/Preferences && echo '<plist/>' > Library/Preferences/prefs.plist
            echo cache > cache.db
            """)
        XCTAssertEqual(ls(container), ["Documents", "Library", "cache.db"])
        try unmount()

        // The drive view shows nothing of a private container.
        try mount()
        XCTAssertEqual(ls(mountPoint), ["Notes", "SugoiApp", "TestDrive"])
        let find = assertShell("find \(shellQuote(mountPoint)) -mindepth 1")
        XCTAssertFalse(find.stdout.contains("ledger.txt") || find.stdout.contains("prefs.plist"),
                       "private data visible in the drive view:\n\(find.stdout)")
        try unmount()

        // And the app finds everything again.
        try mount(app: "com.example.Ledger")
        XCTAssertEqual(Posix.readText(container + "/Documents/ledger.txt"), "balance: 42\n")
        XCTAssertEqual(Posix.readText(container + "/Documents/2026/11/30/entry.txt"), "entry\n")
        XCTAssertEqual(Posix.readText(container + "/Library/Preferences/prefs.plist"), "<plist/>\n")
        XCTAssertEqual(Posix.readText(container + "/cache.db"), "cache\n")
    }

    func testPublicAppDocumentsShowInTheDriveView() throws {
        // Notes: public, levels One.
        try mount(app: "com.example.Notes")
        let container = mountPoint + "/iCloud.com.example.Notes"
        XCTAssertEqual(ls(mountPoint), ["iCloud.com.example.Notes"])
        assertShell("""
            cd \(shellQuote(container))
            echo 'from the app' > Documents/fromapp.txt
            mkdir -p Documents/a/b
            echo 'level one' > Documents/a/in-a.txt
            echo 'level two' > Documents/a/b/in-b.txt
            mkdir Caches && echo private > Caches/state
            """)
        try unmount()

        try mount()
        let notes = docs("Notes")
        XCTAssertEqual(ls(notes), ["a", "fromapp.txt"], "MOUNT/Notes is Documents; private data stays out")
        XCTAssertEqual(Posix.readText(notes + "/fromapp.txt"), "from the app\n")
        XCTAssertEqual(Posix.readText(notes + "/a/in-a.txt"), "level one\n")
        XCTAssertEqual(ls(notes + "/a"), ["in-a.txt"], "folders deeper than the limit are not shown in the drive view")
        XCTAssertEqual(Posix.writeFile(notes + "/fromdrive.txt", "from the drive\n"), 0)
        try unmount()

        try mount(app: "com.example.Notes")
        XCTAssertEqual(Posix.readText(container + "/Documents/fromdrive.txt"), "from the drive\n")
        XCTAssertEqual(Posix.readText(container + "/Documents/a/b/in-b.txt"), "level two\n")
        XCTAssertEqual(Posix.readText(container + "/Caches/state"), "private\n")
    }

    func testAppViewOfUnknownAppFails() throws {
        let result = ubiquityfs(mountArguments(app: "com.example.NoSuchApp"), timeout: 60)
        XCTAssertFalse(result.succeeded, "mounting an unknown app should fail: \(result)")
        XCTAssertFalse(result.stderr.isEmpty && result.stdout.isEmpty, "a failed mount should say why")
        XCTAssertFalse(isMounted(mountPoint))
    }
}
