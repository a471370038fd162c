import XCTest
import UbiquityManifests

/// iCloud's registration rule: settings are read when a container is first seen and re-read only when
/// CFBundleVersion grows.
final class RegistrationTests: XCTestCase {
    private func settings(_ name: String, isPublic: Bool = true, levels: FolderLevels = .none) -> ContainerSettings {
        ContainerSettings(isPublic: isPublic, name: name, folderLevels: levels)
    }

    private func app(_ path: String, _ bundle: String, version: String, _ containers: [(String, ContainerSettings)]) -> AppManifest {
        AppManifest(path: path, bundleIdentifier: bundle, bundleName: bundle, bundleVersion: version,
                    containers: containers.map { ContainerDeclaration(identifier: $0.0, settings: $0.1, levelsDefaulted: false) })
    }

    private func notes(version: String, _ s: ContainerSettings) -> AppManifest {
        app("apps/Notes.plist", "com.x.Notes", version: version, [("iCloud.com.x.Notes", s)])
    }

    private let nameKey = "NSUbiquitousContainers.iCloud.com.x.Notes.NSUbiquitousContainerName"

    func testNewContainersAreRegisteredInOrder() {
        let result = register(previous: [], manifests: [
            app("apps/A.plist", "com.x.A", version: "2", [("iCloud.com.x.A", settings("A")), ("iCloud.com.x.A.Private", settings("A private", isPublic: false))]),
            app("apps/B.plist", "com.x.B", version: "1.5", [("iCloud.com.x.B", settings("B", levels: .any))]),
        ], applyChanges: false)
        XCTAssertEqual(result.diagnostics, [])
        XCTAssertEqual(result.registrations, [
            Registration(identifier: "iCloud.com.x.A", bundleIdentifier: "com.x.A", settings: settings("A"),
                         registeredVersion: "2", manifestPath: "apps/A.plist", active: true),
            Registration(identifier: "iCloud.com.x.A.Private", bundleIdentifier: "com.x.A", settings: settings("A private", isPublic: false),
                         registeredVersion: "2", manifestPath: "apps/A.plist", active: true),
            Registration(identifier: "iCloud.com.x.B", bundleIdentifier: "com.x.B", settings: settings("B", levels: .any),
                         registeredVersion: "1.5", manifestPath: "apps/B.plist", active: true),
        ])
    }

    func testUnchangedManifestChangesNothing() {
        let first = register(previous: [], manifests: [notes(version: "3", settings("Notes"))], applyChanges: false)
        let again = register(previous: first.registrations, manifests: [notes(version: "3", settings("Notes"))], applyChanges: false)
        XCTAssertEqual(again.registrations, first.registrations)
        XCTAssertEqual(again.diagnostics, [])
    }

    func testSameVersionChangeKeepsRegisteredSettingsAndWarns() {
        let first = register(previous: [], manifests: [notes(version: "3", settings("A"))], applyChanges: false)
        let result = register(previous: first.registrations, manifests: [notes(version: "3", settings("B"))], applyChanges: false)
        XCTAssertEqual(result.registrations, first.registrations, "the registered settings stay")
        XCTAssertEqual(result.diagnostics.map(\.description), [
            "apps/Notes.plist: warning: \(nameKey): changed from \"A\" to \"B\" but CFBundleVersion is still 3; raise CFBundleVersion above 3 (or pass --apply-manifest-changes)",
        ])
        XCTAssertEqual(result.diagnostics.first?.severity, .warning)
    }

    func testEverySettingChangeIsNamed() {
        let first = register(previous: [], manifests: [notes(version: "1.2", settings("Notes", isPublic: true, levels: .one))], applyChanges: false)
        let result = register(previous: first.registrations,
                              manifests: [notes(version: "1.2", settings("Notes", isPublic: false, levels: .any))], applyChanges: false)
        XCTAssertEqual(result.registrations, first.registrations)
        XCTAssertEqual(result.diagnostics.map(\.description), [
            "apps/Notes.plist: warning: NSUbiquitousContainers.iCloud.com.x.Notes.NSUbiquitousContainerIsDocumentScopePublic: changed from true to false but CFBundleVersion is still 1.2; raise CFBundleVersion above 1.2 (or pass --apply-manifest-changes)",
            "apps/Notes.plist: warning: NSUbiquitousContainers.iCloud.com.x.Notes.NSUbiquitousContainerSupportedFolderLevels: changed from \"One\" to \"Any\" but CFBundleVersion is still 1.2; raise CFBundleVersion above 1.2 (or pass --apply-manifest-changes)",
        ])
    }

    func testNumericallyEqualVersionIsNotAnIncrease() {
        let first = register(previous: [], manifests: [notes(version: "2", settings("A"))], applyChanges: false)
        let result = register(previous: first.registrations, manifests: [notes(version: "2.0", settings("B"))], applyChanges: false)
        XCTAssertEqual(result.registrations.map(\.settings.name), ["A"])
        XCTAssertEqual(result.registrations.map(\.registeredVersion), ["2"])
        XCTAssertEqual(result.diagnostics.count, 1)
    }

    func testHigherVersionAppliesTheChange() {
        let first = register(previous: [], manifests: [notes(version: "1.9", settings("A"))], applyChanges: false)
        let result = register(previous: first.registrations, manifests: [notes(version: "1.10", settings("B", levels: .one))], applyChanges: false)
        XCTAssertEqual(result.diagnostics, [])
        XCTAssertEqual(result.registrations, [
            Registration(identifier: "iCloud.com.x.Notes", bundleIdentifier: "com.x.Notes", settings: settings("B", levels: .one),
                         registeredVersion: "1.10", manifestPath: "apps/Notes.plist", active: true),
        ])
    }

    func testHigherVersionWithoutChangeUpdatesTheRegisteredVersion() {
        let first = register(previous: [], manifests: [notes(version: "1", settings("A"))], applyChanges: false)
        let second = register(previous: first.registrations, manifests: [notes(version: "2", settings("A"))], applyChanges: false)
        XCTAssertEqual(second.registrations.map(\.registeredVersion), ["2"])
        // So a later edit at version 2 is held back.
        let third = register(previous: second.registrations, manifests: [notes(version: "2", settings("B"))], applyChanges: false)
        XCTAssertEqual(third.registrations.map(\.settings.name), ["A"])
        XCTAssertEqual(third.diagnostics.count, 1)
    }

    func testLowerVersionKeepsRegisteredSettingsAndVersion() {
        let first = register(previous: [], manifests: [notes(version: "3", settings("A"))], applyChanges: false)
        let unchanged = register(previous: first.registrations, manifests: [notes(version: "2", settings("A"))], applyChanges: false)
        XCTAssertEqual(unchanged.registrations, first.registrations)
        XCTAssertEqual(unchanged.diagnostics, [])

        let changed = register(previous: first.registrations, manifests: [notes(version: "2", settings("B"))], applyChanges: false)
        XCTAssertEqual(changed.registrations, first.registrations)
        XCTAssertEqual(changed.diagnostics.map(\.description), [
            "apps/Notes.plist: warning: \(nameKey): changed from \"A\" to \"B\" but CFBundleVersion 2 is lower than the registered 3; raise CFBundleVersion above 3 (or pass --apply-manifest-changes)",
        ])
    }

    func testApplyChangesAppliesTheEditAnyway() {
        let first = register(previous: [], manifests: [notes(version: "3", settings("A"))], applyChanges: false)
        let same = register(previous: first.registrations, manifests: [notes(version: "3", settings("B", levels: .any))], applyChanges: true)
        XCTAssertEqual(same.diagnostics, [])
        XCTAssertEqual(same.registrations.map(\.settings), [settings("B", levels: .any)])
        XCTAssertEqual(same.registrations.map(\.registeredVersion), ["3"])

        let lower = register(previous: first.registrations, manifests: [notes(version: "2", settings("C"))], applyChanges: true)
        XCTAssertEqual(lower.diagnostics, [])
        XCTAssertEqual(lower.registrations.map(\.settings.name), ["C"])
        XCTAssertEqual(lower.registrations.map(\.registeredVersion), ["2"], "registeredVersion becomes the manifest's")
    }

    func testRenameKeepsTheContainerIdentity() {
        let first = register(previous: [], manifests: [notes(version: "1", settings("Notes"))], applyChanges: false)
        let renamed = register(previous: first.registrations, manifests: [notes(version: "2", settings("My Notes"))], applyChanges: false)
        XCTAssertEqual(renamed.registrations.count, 1, "no second container")
        XCTAssertEqual(renamed.registrations.first?.identifier, "iCloud.com.x.Notes")
        XCTAssertEqual(renamed.registrations.first?.settings.name, "My Notes")
        XCTAssertEqual(renamed.registrations.first?.active, true)
    }

    func testRemovedManifestLeavesAnInactiveRegistration() {
        let first = register(previous: [], manifests: [
            notes(version: "1", settings("Notes")),
            app("apps/Ledger.plist", "com.x.Ledger", version: "1", [("iCloud.com.x.Ledger", settings("Ledger", isPublic: false))]),
        ], applyChanges: false)
        let removed = register(previous: first.registrations, manifests: [notes(version: "1", settings("Notes"))], applyChanges: false)
        XCTAssertEqual(removed.diagnostics, [])
        XCTAssertEqual(removed.registrations.map(\.identifier), ["iCloud.com.x.Notes", "iCloud.com.x.Ledger"], "kept, same order")
        XCTAssertEqual(removed.registrations.map(\.active), [true, false])
        XCTAssertEqual(removed.registrations[1].settings, first.registrations[1].settings)

        // It comes back when the manifest does.
        let back = register(previous: removed.registrations, manifests: [
            notes(version: "1", settings("Notes")),
            app("apps/Ledger.plist", "com.x.Ledger", version: "1", [("iCloud.com.x.Ledger", settings("Ledger", isPublic: false))]),
        ], applyChanges: false)
        XCTAssertEqual(back.registrations.map(\.active), [true, true])
    }

    func testNameClashBetweenNewContainers() {
        // Both new: the one whose manifest path sorts first keeps the name, whatever the input order.
        let a = app("apps/A.plist", "com.x.A", version: "1", [("iCloud.com.x.A", settings("Docs"))])
        let b = app("apps/B.plist", "com.x.B", version: "1", [("iCloud.com.x.B", settings("Docs"))])
        for manifests in [[a, b], [b, a]] {
            let result = register(previous: [], manifests: manifests, applyChanges: false)
            XCTAssertEqual(result.registrations.first { $0.identifier == "iCloud.com.x.A" }?.active, true)
            XCTAssertEqual(result.registrations.first { $0.identifier == "iCloud.com.x.B" }?.active, false)
            XCTAssertEqual(result.diagnostics.map(\.description), [
                "apps/B.plist: error: NSUbiquitousContainers.iCloud.com.x.B.NSUbiquitousContainerName: \"Docs\" is already the name of iCloud.com.x.A from apps/A.plist, which keeps it; iCloud.com.x.B is not mounted; give one of them another NSUbiquitousContainerName and raise that manifest's CFBundleVersion (here above 1)",
            ])
        }
    }

    func testNameClashEarlierRegistrationWins() {
        let first = register(previous: [], manifests: [app("apps/Z.plist", "com.x.Z", version: "1", [("iCloud.com.x.Z", settings("Docs"))])],
                             applyChanges: false)
        let result = register(previous: first.registrations, manifests: [
            app("apps/A.plist", "com.x.A", version: "1", [("iCloud.com.x.A", settings("Docs"))]),
            app("apps/Z.plist", "com.x.Z", version: "1", [("iCloud.com.x.Z", settings("Docs"))]),
        ], applyChanges: false)
        XCTAssertEqual(result.registrations.map(\.identifier), ["iCloud.com.x.Z", "iCloud.com.x.A"])
        XCTAssertEqual(result.registrations.map(\.active), [true, false])
        XCTAssertEqual(result.diagnostics.count, 1)
        XCTAssertEqual(result.diagnostics.first?.file, "apps/A.plist")
        XCTAssertTrue(result.diagnostics.first?.message.contains("apps/Z.plist") ?? false)

        // Renaming the loser (with a version increase) resolves the clash.
        let fixed = register(previous: result.registrations, manifests: [
            app("apps/A.plist", "com.x.A", version: "2", [("iCloud.com.x.A", settings("A Docs"))]),
            app("apps/Z.plist", "com.x.Z", version: "1", [("iCloud.com.x.Z", settings("Docs"))]),
        ], applyChanges: false)
        XCTAssertEqual(fixed.diagnostics, [])
        XCTAssertEqual(fixed.registrations.map(\.active), [true, true])
    }

    func testNoClashForPrivateInactiveOrDifferentBytes() {
        let first = register(previous: [], manifests: [app("apps/Old.plist", "com.x.Old", version: "1", [("iCloud.com.x.Old", settings("Docs"))])],
                             applyChanges: false)
        let result = register(previous: first.registrations, manifests: [
            app("apps/A.plist", "com.x.A", version: "1", [("iCloud.com.x.A", settings("Docs"))]),              // Old is gone: inactive
            app("apps/B.plist", "com.x.B", version: "1", [("iCloud.com.x.B", settings("Docs", isPublic: false))]), // private
            app("apps/C.plist", "com.x.C", version: "1", [("iCloud.com.x.C", settings("docs"))]),              // other bytes
            app("apps/D.plist", "com.x.D", version: "1", [("iCloud.com.x.D", settings("Caf\u{E9}"))]),
            app("apps/E.plist", "com.x.E", version: "1", [("iCloud.com.x.E", settings("Cafe\u{301}"))]),       // NFD ≠ NFC bytes
        ], applyChanges: false)
        XCTAssertEqual(result.diagnostics, [])
        XCTAssertEqual(result.registrations.map(\.active), [false, true, true, true, true, true])
    }

    func testClashUsesRegisteredNotPendingSettings() {
        // B's manifest renames it away from the clash without raising the version: the clash stays.
        let first = register(previous: [], manifests: [
            app("apps/A.plist", "com.x.A", version: "1", [("iCloud.com.x.A", settings("Docs"))]),
            app("apps/B.plist", "com.x.B", version: "1", [("iCloud.com.x.B", settings("Docs"))]),
        ], applyChanges: false)
        let result = register(previous: first.registrations, manifests: [
            app("apps/A.plist", "com.x.A", version: "1", [("iCloud.com.x.A", settings("Docs"))]),
            app("apps/B.plist", "com.x.B", version: "1", [("iCloud.com.x.B", settings("B Docs"))]),
        ], applyChanges: false)
        XCTAssertEqual(result.registrations.map(\.active), [true, false])
        XCTAssertEqual(result.diagnostics.map(\.severity), [.warning, .error])
    }

    func testSameContainerFromTwoManifestsKeepsTheFirst() {
        let result = register(previous: [], manifests: [
            app("apps/A.plist", "com.x.A", version: "1", [("iCloud.com.x.A.Shared", settings("Shared"))]),
            app("apps/B.plist", "com.x.A.Shared", version: "1", [("iCloud.com.x.A.Shared", settings("Other"))]),
        ], applyChanges: false)
        XCTAssertEqual(result.registrations.map(\.manifestPath), ["apps/A.plist"])
        XCTAssertEqual(result.diagnostics.map(\.description), [
            "apps/B.plist: error: NSUbiquitousContainers.iCloud.com.x.A.Shared: iCloud.com.x.A.Shared is also declared by apps/A.plist, which keeps it; this declaration is ignored; declare each container in one manifest only",
        ])
    }

    func testManifestMovesFollow() {
        let first = register(previous: [], manifests: [notes(version: "1", settings("Notes"))], applyChanges: false)
        let moved = register(previous: first.registrations,
                             manifests: [app("apps/Notes/Info.plist", "com.x.Notes", version: "1", [("iCloud.com.x.Notes", settings("Notes"))])],
                             applyChanges: false)
        XCTAssertEqual(moved.registrations.map(\.manifestPath), ["apps/Notes/Info.plist"])
    }

    func testEndToEndWithLoadedSamples() {
        let load = loadManifests(directory: samplesAppsPath)
        let result = register(previous: [], manifests: load.manifests, applyChanges: false)
        XCTAssertEqual(result.diagnostics, [])
        XCTAssertEqual(result.registrations.map(\.identifier),
                       ["iCloud.com.example.Ledger", "iCloud.com.example.Notes", "iCloud.com.example.SugoiApp", "iCloud.com.example.TestDrive"])
        XCTAssertEqual(result.registrations.filter { $0.active && $0.settings.isPublic }.map(\.settings.name),
                       ["Notes", "SugoiApp", "TestDrive"])
    }
}
