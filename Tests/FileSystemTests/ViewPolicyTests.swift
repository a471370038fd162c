// ViewPolicy is a pure value: its rules are checked here over a hand-built namespace, with no
// store and no locks.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class ViewPolicyTests: XCTestCase {
    private func record(_ c: ContainerInfo, root: InodeNumber) -> ContainerRecord {
        ContainerRecord(identifier: c.identifier, bundleIdentifier: c.bundleIdentifier, name: c.name, isPublic: c.isPublic,
                        folderLevels: c.folderLevels, registeredVersion: c.registeredVersion,
                        manifestPath: c.manifestPath, rootIno: root)
    }

    private func folder(_ ino: InodeNumber, _ container: ContainerInfo) -> NodeRecord {
        NodeRecord(ino: ino, container: container.identifier, kind: .directory, mode: 0o755, uid: 0, gid: 0, nlink: 2,
                   size: 0, atime: 0, mtime: 0, ctime: 0, btime: 0, rdev: 0, target: [], currentVersion: nil)
    }

    /// Notes (levels One): root 10, Documents 11, Documents/A 12, Documents/A/B 13 (made by the
    /// app past the limit), and a folder 14 beside Documents.
    private func notes() -> Namespace {
        let ns = Namespace()
        ns.containers[Sample.notes.identifier] = record(Sample.notes, root: 10)
        ns.containers[Sample.secret.identifier] = record(Sample.secret, root: 20)
        for ino: InodeNumber in [10, 11, 12, 13, 14] { ns.nodes.put(folder(ino, Sample.notes), change: 0) }
        ns.nodes.put(folder(20, Sample.secret), change: 0)
        ns.children[10] = [documentsName: 11, Array("Caches".utf8): 14]
        ns.children[11] = [Array("A".utf8): 12]
        ns.children[12] = [Array("B".utf8): 13]
        ns.parent = [11: 10, 12: 11, 13: 12, 14: 10]
        return ns
    }

    func testTheDriveViewShowsPublicContainersByNameAndOnlyDocuments() throws {
        let ns = notes()
        let drive = ViewPolicy(view: .drive, active: [Sample.notes.identifier: Sample.notes, Sample.secret.identifier: Sample.secret])
        XCTAssertEqual(drive.shownContainers(in: ns).map(\.name), ["Notes"], "a private container is not in the drive view")
        XCTAssertEqual(drive.containerFolderName(ns.containers[Sample.notes.identifier]!), Array("Notes".utf8))
        XCTAssertEqual(drive.containerFolderIno(ns.containers[Sample.notes.identifier]!, in: ns), 11, "the folder is Documents")
        XCTAssertEqual(drive.depth(of: 13, in: ns.containers[Sample.notes.identifier]!, ns), 2)
        XCTAssertThrowsError(try drive.target(14, in: ns), "a folder beside Documents does not resolve")
        XCTAssertThrowsError(try drive.target(20, in: ns), "nor does a private container's")
        XCTAssertTrue(drive.visible(ns.nodes[12]!, in: ns))
        XCTAssertFalse(drive.visible(ns.nodes[13]!, in: ns), "a folder past the level limit is not shown")
        XCTAssertThrowsError(try drive.checkLevels(moving: ns.nodes[12]!, into: ns.nodes[12]!, in: ns)) { error in
            XCTAssertEqual((error as? FSError)?.errno, EPERM)
        }
        XCTAssertNoThrow(try drive.checkLevels(moving: ns.nodes[13]!, into: ns.nodes[11]!, in: ns), "moving up is allowed")

        let inactive = ViewPolicy(view: .drive, active: [:])
        XCTAssertEqual(inactive.shownContainers(in: ns).count, 0, "an inactive registration is not shown")
    }

    func testTheAppViewShowsItsAppsContainersWhole() throws {
        let ns = notes()
        let app = ViewPolicy(view: .app(bundleIdentifier: Sample.notes.bundleIdentifier), active: [Sample.notes.identifier: Sample.notes])
        XCTAssertEqual(app.containerFolderName(ns.containers[Sample.notes.identifier]!), Array(Sample.notes.identifier.utf8))
        XCTAssertEqual(app.containerFolderIno(ns.containers[Sample.notes.identifier]!, in: ns), 10, "the whole container")
        XCTAssertNoThrow(try app.target(14, in: ns), "everything in the container resolves")
        XCTAssertTrue(app.visible(ns.nodes[13]!, in: ns), "levels are the drive view's rule")
    }

    func testNames() {
        for (name, errno) in [("", EINVAL), (".", EINVAL), ("..", EINVAL), ("a/b", EINVAL), ("a\u{0}b", EINVAL),
                              (String(repeating: "x", count: 256), ENAMETOOLONG)] {
            XCTAssertThrowsError(try ViewPolicy.check(name: Array(name.utf8))) { error in
                XCTAssertEqual((error as? FSError)?.errno, errno, name)
            }
        }
        XCTAssertNoThrow(try ViewPolicy.check(name: Array(String(repeating: "x", count: 255).utf8)))
        XCTAssertNoThrow(try ViewPolicy.check(name: [0xff, 0xfe]), "names are bytes, not UTF-8")
    }
}
