import Foundation
import XCTest
@testable import UbiquityManifests

/// Each bad input gives one clear line naming the file and the key, and the other manifests still load.
final class BadInputTests: XCTestCase {
    private let levelsKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerSupportedFolderLevels"
    private let nameKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerName"
    private let publicKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerIsDocumentScopePublic"

    /// Loads a bad manifest and asserts it gives exactly these lines (folder prefix removed).
    private func assertLines(_ bad: String, _ expected: [String], file: StaticString = #filePath, line: UInt = #line) {
        let (diagnostics, dir) = loadBad(bad, file: file, line: line)
        XCTAssertEqual(lines(diagnostics, in: dir), expected, file: file, line: line)
    }

    private func assertLines(_ bad: [UInt8], _ expected: [String], file: StaticString = #filePath, line: UInt = #line) {
        let (diagnostics, dir) = loadBad(bad, file: file, line: line)
        XCTAssertEqual(lines(diagnostics, in: dir), expected, file: file, line: line)
    }

    // MARK: Files that are not property lists

    func testMalformedXML() {
        let (diagnostics, _) = loadBad(plistXML("<key>CFBundleIdentifier</key><string>com.x.Foo</dict>"))
        XCTAssertEqual(diagnostics.count, 1)
        XCTAssertNil(diagnostics[0].key)
        XCTAssertTrue(diagnostics[0].message.hasPrefix("the file is not well-formed XML (syntax error at line "), diagnostics[0].message)
        XCTAssertTrue(diagnostics[0].fix.contains("xmllint"))
    }

    func testTruncatedXML() {
        let (diagnostics, _) = loadBad(String(appXML().prefix(200)))
        XCTAssertEqual(diagnostics.count, 1)
        XCTAssertNil(diagnostics[0].key)
        XCTAssertTrue(diagnostics[0].message.hasPrefix("the file is not well-formed XML"), diagnostics[0].message)
    }

    func testWellFormedXMLThatIsNotAPlist() {
        assertLines(plistXML("<key>A</key><string>x</string><key>B</key>"), [
            "Bad.plist: error: the file is not a valid XML property list: the key \"B\" has no value at line 6; fix it so it is an XML property list (<plist><dict>…</dict></plist>); xmllint --noout shows where the XML breaks",
        ])
        let (unknown, _) = loadBad(plistXML("<key>A</key><thing>x</thing>"))
        XCTAssertEqual(unknown.map(\.message), ["the file is not a valid XML property list: unknown element <thing> at line 5"])
        let (badInteger, _) = loadBad(plistXML("<key>A</key><integer>twelve</integer>"))
        XCTAssertEqual(badInteger.map(\.message), ["the file is not a valid XML property list: \"twelve\" is not an integer at line 5"])
    }

    func testEmptyAndGarbageFiles() {
        assertLines("", ["Bad.plist: error: the file is empty; fix it so it is an XML property list (<plist><dict>…</dict></plist>); xmllint --noout shows where the XML breaks"])
        let (garbage, _) = loadBad("CFBundleIdentifier = com.x.Foo")
        XCTAssertEqual(garbage.map(\.message), ["the file is neither an XML nor a binary (bplist00) property list"])
    }

    func testTopLevelNotADictionary() {
        assertLines("<?xml version=\"1.0\"?><plist version=\"1.0\"><array><string>x</string></array></plist>", [
            "Bad.plist: error: the top level is an array, not a dictionary; make the top-level value a <dict> with CFBundleIdentifier, CFBundleVersion and NSUbiquitousContainers",
        ])
    }

    func testBrokenSymbolicLink() throws {
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("Good.plist", goodManifest)
        try FileManager.default.createSymbolicLink(atPath: dir.file("Gone.plist"), withDestinationPath: dir.file("nowhere.plist"))
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.manifests.map(\.bundleIdentifier), ["com.x.Good"])
        XCTAssertEqual(lines(load.diagnostics, in: dir.path), [
            "Gone.plist: error: the file cannot be read: it is a broken symbolic link; point the link at a manifest or remove it",
        ])
    }

    func testFIFOIsNotOpened() throws {
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("Good.plist", goodManifest)
        XCTAssertEqual(mkfifo(dir.file("Pipe.plist"), 0o644), 0)
        let load = loadManifests(directory: dir.path)   // would block if it opened the FIFO
        XCTAssertEqual(load.manifests.map(\.bundleIdentifier), ["com.x.Good"])
        XCTAssertEqual(lines(load.diagnostics, in: dir.path), [
            "Pipe.plist: error: is not a regular file (a FIFO, socket or device); remove it from the manifests folder",
        ])
    }

    // MARK: Required keys and types

    func testMissingBundleIdentifier() {
        assertLines(appXML(id: nil), [
            "Bad.plist: error: CFBundleIdentifier: is missing; add the app's bundle identifier, e.g. <key>CFBundleIdentifier</key><string>com.example.App</string>",
        ])
    }

    func testBundleIdentifierWrongTypeAndInvalid() {
        assertLines(appXML(id: nil, extra: "<key>CFBundleIdentifier</key><integer>7</integer>"), [
            "Bad.plist: error: CFBundleIdentifier: is an integer, expected a string; write it as <string>com.example.App</string>",
        ])
        assertLines(appXML(id: "com x Foo"), [
            "Bad.plist: error: CFBundleIdentifier: \"com x Foo\" is not a valid bundle identifier; use letters, digits, hyphens and dots in reverse-DNS form, e.g. com.example.App",
        ])
    }

    func testBundleVersion() {
        assertLines(appXML(version: nil), [
            "Bad.plist: error: CFBundleVersion: is missing; add the build version, e.g. <key>CFBundleVersion</key><string>1</string>",
        ])
        assertLines(appXML(version: "1.0b3"), [
            "Bad.plist: error: CFBundleVersion: \"1.0b3\" is not a version of digits and dots; use digits and dots only, e.g. 1, 12 or 1.2.3",
        ])
        for bad in ["", ".1", "1.", "1..2", "v2", "1 "] {
            let (diagnostics, _) = loadBad(appXML(version: bad))
            XCTAssertEqual(diagnostics.map(\.key), ["CFBundleVersion"], bad)
        }
        assertLines(appXML(version: nil, extra: "<key>CFBundleVersion</key><integer>3</integer>"), [
            "Bad.plist: error: CFBundleVersion: is an integer, expected a string; write it as a string of digits and dots, e.g. <string>1</string>",
        ])
    }

    func testBundleNameWrongType() {
        assertLines(appXML(name: nil, extra: "<key>CFBundleName</key><real>2.5</real>"), [
            "Bad.plist: error: CFBundleName: is a real number, expected a string; write the app's name as a <string>",
        ])
    }

    func testContainersMissingEmptyOrWrongType() {
        assertLines(appXML(containers: nil), [
            "Bad.plist: error: NSUbiquitousContainers: is missing, so the app declares no container; add an NSUbiquitousContainers dictionary with the app's container, e.g. iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)",
        ])
        assertLines(appXML(containers: ""), [
            "Bad.plist: error: NSUbiquitousContainers: is empty, so the app declares no container; add the app's container, e.g. <key>iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)</key> with its settings",
        ])
        assertLines(appXML(containers: nil, extra: "<key>NSUbiquitousContainers</key><array/>"), [
            "Bad.plist: error: NSUbiquitousContainers: is an array, expected a dictionary of container identifier to settings; write it as <dict><key>iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)</key><dict>…</dict></dict>",
        ])
        assertLines(appXML(containers: "<key>iCloud.com.x.Foo</key><string>yes</string>"), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo: is a string, expected a dictionary of container settings; write it as <dict> with NSUbiquitousContainerIsDocumentScopePublic, NSUbiquitousContainerName and NSUbiquitousContainerSupportedFolderLevels",
        ])
    }

    func testPublicWrongType() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(isPublic: "<string>YES</string>"))), [
            "Bad.plist: error: \(publicKey): is a string (\"YES\"), expected a Boolean; write <true/> or <false/>",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(isPublic: "<integer>1</integer>"))), [
            "Bad.plist: error: \(publicKey): is an integer (1), expected a Boolean; write <true/> or <false/>",
        ])
    }

    func testNameWrongTypeAndMissing() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<integer>42</integer>"))), [
            "Bad.plist: error: \(nameKey): is an integer (42), expected a string; write the folder name as a <string>",
        ])
        assertLines(appXML(name: nil, containers: containerXML("iCloud.com.x.Foo", settingsXML(name: nil))), [
            "Bad.plist: error: \(nameKey): is missing and CFBundleName is not set, so the container has no name; add NSUbiquitousContainerName (the folder name shown in the drive view) or CFBundleName",
        ])
    }

    func testNamesThatCannotBeFolderNames() {
        func nameLine(_ xmlName: String) -> [String] {
            let (diagnostics, dir) = loadBad(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>\(xmlName)</string>"))))
            return lines(diagnostics, in: dir)
        }
        XCTAssertEqual(nameLine("Work/Notes"), ["Bad.plist: error: \(nameKey): \"Work/Notes\" contains \"/\", which cannot be in a folder name; choose a name without \"/\""])
        XCTAssertEqual(nameLine("."), ["Bad.plist: error: \(nameKey): \".\" cannot be a folder name; choose another name"])
        XCTAssertEqual(nameLine(".."), ["Bad.plist: error: \(nameKey): \"..\" cannot be a folder name; choose another name"])
        XCTAssertEqual(nameLine(""), ["Bad.plist: error: \(nameKey): is empty, which cannot be a folder name; give the container a name, e.g. the app's name"])
        XCTAssertEqual(nameLine(String(repeating: "a", count: 256)),
                       ["Bad.plist: error: \(nameKey): is 256 bytes long in UTF-8; a folder name holds at most 255; shorten it"])
        // 86 × "☕" is 86 characters but 258 UTF-8 bytes.
        XCTAssertEqual(nameLine(String(repeating: "☕", count: 86)),
                       ["Bad.plist: error: \(nameKey): is 258 bytes long in UTF-8; a folder name holds at most 255; shorten it"])

        // 255 bytes, "...", names with spaces and other Unicode are fine.
        for good in [String(repeating: "b", count: 255), "...", " My Notes ", "Café ☕", ".hidden"] {
            let load = loadOne(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>\(good)</string>"))))
            XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, good)
            XCTAssertEqual(load.diagnostics, [])
        }
    }

    func testDefaultNameFromBundleNameIsCheckedToo() {
        assertLines(appXML(name: "A/B", containers: containerXML("iCloud.com.x.Foo", settingsXML(name: nil))), [
            "Bad.plist: error: \(nameKey): is missing, and the default from CFBundleName \"A/B\" contains \"/\", which cannot be in a folder name; set NSUbiquitousContainerName to a valid folder name",
        ])
    }

    func testUnknownFolderLevel() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<string>Some</string>"))), [
            "Bad.plist: error: \(levelsKey): \"Some\" is not a folder level; use None, One or Any",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<string>any</string>"))), [
            "Bad.plist: error: \(levelsKey): \"any\" is not a folder level; use None, One or Any (write Any, with that capitalization)",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<integer>1</integer>"))), [
            "Bad.plist: error: \(levelsKey): is an integer (1), expected a string; write <string>None</string>, <string>One</string> or <string>Any</string>",
        ])
    }

    // MARK: Container identifiers

    func testContainerIdentifierMustMatchBundleIdentifier() {
        let fix = "use iCloud.com.x.Foo (write it as iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)) or iCloud.com.x.Foo.<suffix>"
        for bad in ["iCloud.com.other.App", "com.x.Foo", "icloud.com.x.Foo", "iCloud.com.x.FooBar", "iCloud.com.x"] {
            let (diagnostics, dir) = loadBad(appXML(containers: containerXML(bad)))
            XCTAssertEqual(lines(diagnostics, in: dir), [
                "Bad.plist: error: NSUbiquitousContainers.\(bad): \"\(bad)\" does not match the bundle identifier com.x.Foo; \(fix)",
            ])
        }
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo.")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo.: \"iCloud.com.x.Foo.\" has an invalid suffix after iCloud.com.x.Foo.; use letters, digits and hyphens in dot-separated parts, e.g. iCloud.com.x.Foo.Shared",
        ])
        // A suffix is fine.
        let load = loadOne(appXML(containers: containerXML("iCloud.com.x.Foo.Shared-2.docs")))
        XCTAssertEqual(load.manifests.first?.containers.map(\.identifier), ["iCloud.com.x.Foo.Shared-2.docs"])
    }

    func testContainerDeclaredTwiceInOneManifest() {
        // Literally twice.
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo") + containerXML("iCloud.com.x.Foo")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo: is declared more than once; keep one entry for each container",
        ])
        // Twice after expansion.
        assertLines(appXML(containers: containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)") + containerXML("iCloud.com.x.Foo")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo: is declared twice (as \"iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)\" and \"iCloud.com.x.Foo\"); keep one entry for each container",
        ])
    }

    func testDuplicateKeys() {
        assertLines(appXML(extra: "<key>CFBundleVersion</key><string>2</string>"), [
            "Bad.plist: error: CFBundleVersion: appears more than once at the top level; keep one",
        ])
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(extra: "<key>NSUbiquitousContainerName</key><string>Again</string>"))), [
            "Bad.plist: error: \(nameKey): appears more than once; keep one",
        ])
    }

    // MARK: Several problems

    func testEveryProblemOfAManifestIsReportedAndItIsLeftOut() {
        let containers = containerXML("iCloud.com.x.Foo", settingsXML(isPublic: "<string>true</string>", levels: "<string>Many</string>"))
            + containerXML("iCloud.com.y.Bar", settingsXML(name: "<string>Bar</string>"))
            + containerXML("iCloud.com.x.Foo.Docs", settingsXML(name: "<string>Docs</string>"))
        let (diagnostics, _) = loadBad(appXML(version: "one", containers: containers))
        XCTAssertEqual(diagnostics.map(\.key), [
            "CFBundleVersion",
            publicKey,
            levelsKey,
            "NSUbiquitousContainers.iCloud.com.y.Bar",
        ])
        XCTAssertTrue(diagnostics.allSatisfy { $0.severity == .error })
    }

    func testMessagesStayOnOneLine() {
        let (diagnostics, _) = loadBad(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(levels: "<string>No\nne</string>"))))
        XCTAssertEqual(diagnostics.map(\.message), ["\"No\\nne\" is not a folder level"])
        XCTAssertFalse(diagnostics[0].description.contains("\n"))
    }
}
