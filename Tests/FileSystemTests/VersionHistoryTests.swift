// An editor's atomic save (write a new file, rename it over the old one) must not lose the
// document's earlier versions: they go on with the file that replaced it.

import Foundation
import XCTest
import UbiquityFileSystem
import UbiquityStore

final class VersionHistoryTests: XCTestCase {
    func testAtomicSaveKeepsTheDocumentsVersions() throws {
        let store = makeMemoryStore()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        let docs = try fs.ino("SugoiApp/Documents")
        let first = try fs.makeFile(docs, "report.txt", b("draft one"))
        try fs.writeFile(first, b("draft two"))
        XCTAssertEqual(try store.metadata.versions(of: first).count, 2)

        // Save as an editor does: new file beside it, renamed over it.
        let replacement = try fs.makeFile(docs, ".report.txt.tmp", b("draft three"))
        try fs.rename(parent: docs, name: b(".report.txt.tmp"), newParent: docs, newName: b("report.txt"), flags: [])

        XCTAssertEqual(try fs.ino("SugoiApp/Documents/report.txt"), replacement)
        assertBytes(try fs.contents("SugoiApp/Documents/report.txt"), b("draft three"))
        let history = try store.metadata.versions(of: replacement)
        XCTAssertEqual(history.count, 3, "the replaced file's two versions plus the new one")
        XCTAssertEqual(try store.metadata.versions(of: first).count, 0)

        // Reopening (and its garbage collection) keeps the old versions' content.
        let again = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        assertBytes(try again.contents("SugoiApp/Documents/report.txt"), b("draft three"))
        for v in try store.metadata.versions(of: replacement) {
            XCTAssertTrue(v.chunks.allSatisfy { store.blobs.verify($0) }, "version \(v.id) content is still stored")
        }
    }

    func testRenameOverAFileStillOpenKeepsItsVersionsWithIt() throws {
        let store = makeMemoryStore()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        let docs = try fs.ino("SugoiApp/Documents")
        let old = try fs.makeFile(docs, "a", b("old"))
        let h = try fs.open(old, flags: O_RDONLY)
        try fs.makeFile(docs, "b", b("new"))
        try fs.rename(parent: docs, name: b("b"), newParent: docs, newName: b("a"), flags: [])
        // The old file is still open: it keeps its own history until it is gone.
        XCTAssertEqual(try store.metadata.versions(of: old).count, 1)
        assertBytes(try fs.get(h, at: 0, count: 3), b("old"))
        try fs.release(handle: h)
    }
}
