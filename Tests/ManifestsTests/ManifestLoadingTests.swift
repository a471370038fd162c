import Foundation
import XCTest
@testable import UbiquityManifests

/// Loading manifests: samples, XML, folder layout, declaration order, defaults, cross-manifest rules.
final class ManifestLoadingTests: XCTestCase {

    func testSamplesLoadWithoutDiagnostics() throws {
        let load = loadManifests(directory: samplesAppsPath)
        XCTAssertEqual(load.diagnostics.map(\.description), [])
        XCTAssertEqual(load.manifests.map { ($0.path as NSString).lastPathComponent },
                       ["Ledger.plist", "Notes.plist", "SugoiApp.plist", "TestDrive.plist"])
        let byID = Dictionary(uniqueKeysWithValues: load.manifests.map { ($0.bundleIdentifier, $0) })

        let testDrive = try XCTUnwrap(byID["com.example.TestDrive"])
        XCTAssertEqual(testDrive.path, samplesAppsPath + "/TestDrive.plist")
        XCTAssertEqual(testDrive.bundleName, "TestDrive")
        XCTAssertEqual(testDrive.bundleVersion, "1")
        XCTAssertEqual(testDrive.containers, [ContainerDeclaration(
            identifier: "iCloud.com.example.TestDrive",
            settings: ContainerSettings(isPublic: true, name: "TestDrive", folderLevels: .none), levelsDefaulted: false)])

        let sugoi = try XCTUnwrap(byID["com.example.SugoiApp"])
        XCTAssertEqual(sugoi.bundleVersion, "1")
        XCTAssertEqual(sugoi.containers, [ContainerDeclaration(
            identifier: "iCloud.com.example.SugoiApp",
            settings: ContainerSettings(isPublic: true, name: "SugoiApp", folderLevels: .any), levelsDefaulted: false)])

        let notes = try XCTUnwrap(byID["com.example.Notes"])
        XCTAssertEqual(notes.bundleVersion, "1.2")
        XCTAssertEqual(notes.containers.map(\.settings), [ContainerSettings(isPublic: true, name: "Notes", folderLevels: .one)])
        XCTAssertEqual(notes.containers.map(\.identifier), ["iCloud.com.example.Notes"])

        let ledger = try XCTUnwrap(byID["com.example.Ledger"])
        XCTAssertEqual(ledger.containers.map(\.settings), [ContainerSettings(isPublic: false, name: "Ledger", folderLevels: .any)])
    }

    func testSampleFormats() throws {
        let sugoi = try XCTUnwrap(FileManager.default.contents(atPath: samplesAppsPath + "/SugoiApp.plist"))
        XCTAssertTrue(sugoi.starts(with: Array("bplist00".utf8)), "SugoiApp.plist is a binary plist")
        let testDrive = try XCTUnwrap(FileManager.default.contents(atPath: samplesAppsPath + "/TestDrive.plist"))
        let text = String(decoding: testDrive, as: UTF8.self)
        XCTAssertTrue(text.contains("<key>iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)</key>"))
    }

    func testFolderLevelsMaxDepth() {
        XCTAssertEqual(FolderLevels.none.maxDepth, 0)
        XCTAssertEqual(FolderLevels.one.maxDepth, 1)
        XCTAssertNil(FolderLevels.any.maxDepth)
        XCTAssertEqual(FolderLevels.allCases.map(\.rawValue), ["None", "One", "Any"])
    }

    func testXMLDeclarationOrderIsKept() throws {
        let containers = containerXML("iCloud.com.x.Foo.Zeta", settingsXML(name: "<string>Z</string>"))
            + containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>Main</string>"))
            + containerXML("iCloud.com.x.Foo.Alpha", settingsXML(name: "<string>A</string>"))
            + containerXML("iCloud.com.x.Foo.Mid", settingsXML(name: "<string>M</string>"))
        let load = loadOne(appXML(containers: containers))
        XCTAssertEqual(load.diagnostics, [])
        let manifest = try XCTUnwrap(load.manifests.first)
        XCTAssertEqual(manifest.containers.map(\.identifier),
                       ["iCloud.com.x.Foo.Zeta", "iCloud.com.x.Foo", "iCloud.com.x.Foo.Alpha", "iCloud.com.x.Foo.Mid"])
        XCTAssertEqual(manifest.containers[0].settings.name, "Z", "containers[0] is the first declared")
    }

    func testDefaults() throws {
        // Public missing → false; name missing → CFBundleName; levels missing → None with a warning.
        let load = loadOne(appXML(name: "Foo App", containers: containerXML("iCloud.com.x.Foo",
                                                                           settingsXML(isPublic: nil, name: nil, levels: nil))))
        let manifest = try XCTUnwrap(load.manifests.first)
        XCTAssertEqual(manifest.containers, [ContainerDeclaration(
            identifier: "iCloud.com.x.Foo", settings: ContainerSettings(isPublic: false, name: "Foo App", folderLevels: .none),
            levelsDefaulted: true)])
        XCTAssertEqual(load.diagnostics.count, 1)
        let warning = try XCTUnwrap(load.diagnostics.first)
        XCTAssertEqual(warning.severity, .warning)
        XCTAssertEqual(warning.key, "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerSupportedFolderLevels")
        XCTAssertTrue(warning.description.hasSuffix(
            ": warning: NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerSupportedFolderLevels: is missing; assumed None (no folders can be created in Documents); add <key>NSUbiquitousContainerSupportedFolderLevels</key><string>None</string> (or One or Any) to say so"),
            warning.description)
    }

    func testBundleNameIsEmptyWhenMissing() throws {
        let load = loadOne(appXML(name: nil))
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.first?.bundleName, "")
        XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, "Foo")
    }

    func testXMLEntitiesCDATAAndComments() throws {
        let settings = settingsXML(name: "<string>Tom &amp; Jerry&#39;s <![CDATA[<Notes>]]></string><!-- a comment -->")
        let load = loadOne(appXML(containers: containerXML("iCloud.com.x.Foo", settings)))
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, "Tom & Jerry's <Notes>")
    }

    func testOtherKeysAndValueTypesAreIgnored() throws {
        let extra = """
            <key>UIApplicationSceneManifest</key><dict><key>UISceneConfigurations</key><array><dict>
            <key>UISceneStoryboardFile</key><string>Main</string></dict></array></dict>
            <key>LSRequiresIPhoneOS</key><true/>
            <key>Number</key><integer>-42</integer><key>Real</key><real>1.5</real>
            <key>Blob</key><data>aGVsbG8=</data><key>When</key><date>2024-01-01T00:00:00Z</date>
            """
        let load = loadOne(appXML(extra: extra))
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.count, 1)
    }

    func testFolderLayoutSortingAndInfoPlistOneLevelDown() throws {
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("b.plist", appXML(id: "com.x.B", containers: containerXML("iCloud.com.x.B", settingsXML(name: "<string>B</string>"))))
        dir.write("A/Info.plist", appXML(id: "com.x.A", containers: containerXML("iCloud.com.x.A", settingsXML(name: "<string>A</string>"))))
        dir.write("C.plist", appXML(id: "com.x.C", containers: containerXML("iCloud.com.x.C", settingsXML(name: "<string>C</string>"))))
        dir.write("README.txt", "not a manifest")
        dir.write(".hidden.plist", "ignored")
        dir.write("deeper/more/Info.plist", "ignored: two levels down")
        dir.write("Empty/Other.plist", "ignored: not Info.plist")
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.map(\.path), [dir.file("A/Info.plist"), dir.file("C.plist"), dir.file("b.plist")])
        XCTAssertEqual(load.manifests.map(\.bundleIdentifier), ["com.x.A", "com.x.C", "com.x.B"])

        // A trailing slash on the folder does not double the separator.
        XCTAssertEqual(loadManifests(directory: dir.path + "/").manifests.first?.path, dir.file("A/Info.plist"))
    }

    func testEmptyFolderLoadsNothing() {
        let dir = TempDir()
        defer { dir.remove() }
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.manifests, [])
        XCTAssertEqual(load.diagnostics, [])
    }

    func testMissingFolder() {
        let path = NSTemporaryDirectory() + "no-such-folder-" + UUID().uuidString
        let load = loadManifests(directory: path)
        XCTAssertEqual(load.manifests, [])
        XCTAssertEqual(load.diagnostics.map(\.description),
                       ["\(path): error: the manifests folder does not exist; create it and put the apps' Info.plist files in it, or name another folder"])
    }

    func testWarningsDoNotExcludeAManifest() throws {
        let settings = settingsXML(levels: nil, extra: "<key>NSUbiquitousContainerIsDocumentScopePublik</key><true/>\n")
        let load = loadOne(appXML(containers: containerXML("iCloud.com.x.Foo", settings)))
        XCTAssertEqual(load.manifests.count, 1)
        XCTAssertEqual(load.diagnostics.map(\.severity), [.warning, .warning])
        XCTAssertEqual(load.diagnostics.map(\.key), [
            "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerIsDocumentScopePublik",
            "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerSupportedFolderLevels",
        ])
        XCTAssertTrue(load.diagnostics[0].description.contains("is not a container setting and is ignored; remove it or correct the spelling"))
    }

    func testDuplicateBundleIdentifierLeavesOutTheLaterManifest() {
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("A.plist", appXML())
        dir.write("B.plist", appXML(containers: containerXML("iCloud.com.x.Foo.Other", settingsXML(name: "<string>Other</string>"))))
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.manifests.map(\.path), [dir.file("A.plist")])
        XCTAssertEqual(lines(load.diagnostics, in: dir.path), [
            "B.plist: error: CFBundleIdentifier: com.x.Foo is already declared by \(dir.file("A.plist")), so this manifest is left out; give each app its own bundle identifier, or remove one of the two manifests",
        ])
    }

    func testDuplicateContainerAcrossManifestsLeavesOutTheLaterManifest() {
        // com.x.Foo may declare iCloud.com.x.Foo.Bar, which is also com.x.Foo.Bar's own container.
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("A.plist", appXML(containers: containerXML("iCloud.com.x.Foo.Bar")))
        dir.write("B.plist", appXML(id: "com.x.Foo.Bar", containers: containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)", settingsXML(name: "<string>Bar</string>"))))
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.manifests.map(\.path), [dir.file("A.plist")])
        XCTAssertEqual(lines(load.diagnostics, in: dir.path), [
            "B.plist: error: NSUbiquitousContainers.iCloud.com.x.Foo.Bar: iCloud.com.x.Foo.Bar is already declared by \(dir.file("A.plist")), so this manifest is left out; declare each container in one manifest only",
        ])
    }

    func testAManifestWithErrorsDoesNotClaimItsIdentifiers() {
        // The first file has an error and is left out, so the second (same bundle id) loads.
        let dir = TempDir()
        defer { dir.remove() }
        dir.write("A.plist", appXML(version: "x"))
        dir.write("B.plist", appXML())
        let load = loadManifests(directory: dir.path)
        XCTAssertEqual(load.manifests.map(\.path), [dir.file("B.plist")])
        XCTAssertEqual(load.diagnostics.map(\.key), ["CFBundleVersion"])
    }

    func testDiagnosticDescription() {
        let withKey = Diagnostic(severity: .error, file: "apps/Foo.plist", key: "CFBundleVersion", message: "is missing", fix: "add it")
        XCTAssertEqual(withKey.description, "apps/Foo.plist: error: CFBundleVersion: is missing; add it")
        let withoutKey = Diagnostic(severity: .warning, file: "apps/Foo.plist", key: nil, message: "odd", fix: "look")
        XCTAssertEqual(withoutKey.description, "apps/Foo.plist: warning: odd; look")
        XCTAssertEqual("\(withoutKey)", withoutKey.description)
    }
}
