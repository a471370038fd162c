import Foundation
import XCTest
@testable import UbiquityManifests

/// `$(NAME)` build-setting references in container identifiers and string values.
final class ExpansionTests: XCTestCase {
    private let nameKey = "NSUbiquitousContainers.iCloud.com.x.Foo.NSUbiquitousContainerName"

    private func assertLines(_ bad: String, _ expected: [String], file: StaticString = #filePath, line: UInt = #line) {
        let (diagnostics, dir) = loadBad(bad, file: file, line: line)
        XCTAssertEqual(lines(diagnostics, in: dir), expected, file: file, line: line)
    }

    func testProductBundleIdentifierAndProductName() throws {
        let containers = containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER)", settingsXML(name: "<string>$(PRODUCT_NAME) Docs</string>"))
            + containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER).$(PRODUCT_NAME)", settingsXML(name: "<string>Shared</string>"))
        let load = loadOne(appXML(name: "FooApp", containers: containers))
        XCTAssertEqual(load.diagnostics, [])
        let manifest = try XCTUnwrap(load.manifests.first)
        XCTAssertEqual(manifest.containers.map(\.identifier), ["iCloud.com.x.Foo", "iCloud.com.x.Foo.FooApp"])
        XCTAssertEqual(manifest.containers.map(\.settings.name), ["FooApp Docs", "Shared"])
    }

    func testAnyTopLevelStringKey() throws {
        let extra = "<key>TEAM_SUFFIX</key><string>Team</string><key>LEVELS</key><string>One</string><key>CURRENT_PROJECT_VERSION</key><string>4.1</string>"
        let settings = settingsXML(name: "<string>$(CFBundleName) for $(TEAM_SUFFIX)</string>", levels: "<string>$(LEVELS)</string>")
        let load = loadOne(appXML(version: "$(CURRENT_PROJECT_VERSION)",
                                  containers: containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER).$(TEAM_SUFFIX)", settings), extra: extra))
        XCTAssertEqual(load.diagnostics, [])
        let manifest = try XCTUnwrap(load.manifests.first)
        XCTAssertEqual(manifest.bundleVersion, "4.1")
        XCTAssertEqual(manifest.containers, [ContainerDeclaration(
            identifier: "iCloud.com.x.Foo.Team", settings: ContainerSettings(isPublic: true, name: "Foo for Team", folderLevels: .one),
            levelsDefaulted: false)])
    }

    func testNestedReferencesInTopLevelValues() throws {
        let extra = "<key>BASE</key><string>$(PRODUCT_NAME)</string><key>SHOWN</key><string>$(BASE) Files</string>"
        let load = loadOne(appXML(name: "$(EXECUTABLE)",
                                  containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$(SHOWN)</string>")),
                                  extra: extra + "<key>EXECUTABLE</key><string>Foo</string>"))
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.first?.bundleName, "Foo")
        XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, "Foo Files")
    }

    func testModifiers() throws {
        let settings = settingsXML(name: "<string>$(PRODUCT_NAME:upper) $(PRODUCT_NAME:lower)</string>")
        let load = loadOne(appXML(name: "My App", containers: containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER).$(PRODUCT_NAME:rfc1034identifier)", settings)))
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.first?.containers.first?.identifier, "iCloud.com.x.Foo.My-App")
        XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, "MY APP my app")

        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$(PRODUCT_NAME:shout)</string>"))), [
            "Bad.plist: error: \(nameKey): \"$(PRODUCT_NAME:shout)\" uses the unsupported modifier :shout in $(PRODUCT_NAME:shout); use one of :rfc1034identifier, :c99extidentifier, :identifier, :lower, :upper, or write the value literally",
        ])
    }

    func testTextWithoutReferencesIsLiteral() throws {
        let load = loadOne(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$5 (cheap) $ notes)</string>"))))
        XCTAssertEqual(load.diagnostics, [])
        XCTAssertEqual(load.manifests.first?.containers.first?.settings.name, "$5 (cheap) $ notes)")
    }

    func testUnknownVariableInContainerIdentifier() {
        assertLines(appXML(containers: containerXML("iCloud.$(BUNDLE_ID)")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.$(BUNDLE_ID): \"iCloud.$(BUNDLE_ID)\" uses the unknown build setting $(BUNDLE_ID); use $(PRODUCT_BUNDLE_IDENTIFIER) or $(PRODUCT_NAME), add a top-level string key BUNDLE_ID, or write the value literally",
        ])
    }

    func testUnknownVariableInName() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$(DISPLAY_NAME)</string>"))), [
            "Bad.plist: error: \(nameKey): \"$(DISPLAY_NAME)\" uses the unknown build setting $(DISPLAY_NAME); use $(PRODUCT_BUNDLE_IDENTIFIER) or $(PRODUCT_NAME), add a top-level string key DISPLAY_NAME, or write the value literally",
        ])
    }

    func testUnknownVariableInTopLevelValueIsReportedAtThatKey() {
        assertLines(appXML(version: "$(CURRENT_PROJECT_VERSION)"), [
            "Bad.plist: error: CFBundleVersion: \"$(CURRENT_PROJECT_VERSION)\" uses the unknown build setting $(CURRENT_PROJECT_VERSION); use $(PRODUCT_BUNDLE_IDENTIFIER) or $(PRODUCT_NAME), add a top-level string key CURRENT_PROJECT_VERSION, or write the value literally",
        ])
    }

    func testUnterminatedReference() {
        assertLines(appXML(containers: containerXML("iCloud.$(PRODUCT_BUNDLE_IDENTIFIER")), [
            "Bad.plist: error: NSUbiquitousContainers.iCloud.$(PRODUCT_BUNDLE_IDENTIFIER: \"iCloud.$(PRODUCT_BUNDLE_IDENTIFIER\" has \"$(\" without a closing \")\"; close the reference, e.g. $(PRODUCT_BUNDLE_IDENTIFIER), or remove it",
        ])
    }

    func testInvalidReferenceName() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$()</string>"))), [
            "Bad.plist: error: \(nameKey): \"$()\" has $(), which is not a build-setting reference; write $(NAME) with a name of letters, digits and underscores, e.g. $(PRODUCT_BUNDLE_IDENTIFIER)",
        ])
    }

    func testProductNameWithoutBundleName() {
        assertLines(appXML(name: nil, containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$(PRODUCT_NAME)</string>"))), [
            "Bad.plist: error: \(nameKey): \"$(PRODUCT_NAME)\" uses $(PRODUCT_NAME), but the manifest has no CFBundleName; add CFBundleName or write the value literally",
        ])
    }

    func testVariableThatIsNotAString() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$(COUNT)</string>")),
                           extra: "<key>COUNT</key><integer>3</integer>"), [
            "Bad.plist: error: \(nameKey): \"$(COUNT)\" uses $(COUNT), but the top-level COUNT is an integer, not a string; make COUNT a string or write the value literally",
        ])
    }

    func testBundleIdentifierThatRefersToItself() {
        // An Xcode *source* Info.plist; a built app's has the literal identifier.
        assertLines(appXML(id: "$(PRODUCT_BUNDLE_IDENTIFIER)"), [
            "Bad.plist: error: CFBundleIdentifier: \"$(PRODUCT_BUNDLE_IDENTIFIER)\" refers to itself through $(PRODUCT_BUNDLE_IDENTIFIER) (PRODUCT_BUNDLE_IDENTIFIER is CFBundleIdentifier); write the literal bundle identifier, as a built app's Info.plist has it, e.g. com.example.App",
        ])
    }

    func testReferenceCycle() {
        assertLines(appXML(containers: containerXML("iCloud.com.x.Foo", settingsXML(name: "<string>$(A)</string>")),
                           extra: "<key>A</key><string>x$(B)</string><key>B</key><string>$(A)y</string>"), [
            "Bad.plist: error: B: \"$(A)y\" refers back to itself: A → B → A; write one of these values literally",
        ])
    }
}
