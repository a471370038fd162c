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
        let docs = try fs.ino("SugoiApp")
        let first = try fs.makeFile(docs, "report.txt", b("draft one"))
        try fs.writeFile(first, b("draft two"))
        XCTAssertEqual(try store.metadata.versions(of: first).count, 2)

        // Save as an editor does: new file beside it, renamed over it.
        let replacement = try fs.makeFile(docs, ".report.txt.tmp", b("draft three"))
        try fs.rename(parent: docs, name: b(".report.txt.tmp"), newParent: docs, newName: b("report.txt"), flags: [])

        XCTAssertEqual(try fs.ino("SugoiApp/report.txt"), replacement)
        assertBytes(try fs.contents("SugoiApp/report.txt"), b("draft three"))
        let history = try store.metadata.versions(of: replacement)
        XCTAssertEqual(history.count, 3, "the replaced file's two versions plus the new one")
        XCTAssertEqual(try store.metadata.versions(of: first).count, 0)

        // Reopening (and its garbage collection) keeps the old versions' content.
        let again = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        assertBytes(try again.contents("SugoiApp/report.txt"), b("draft three"))
        for v in try store.metadata.versions(of: replacement) {
            XCTAssertTrue(v.chunks.allSatisfy { store.blobs.verify($0) }, "version \(v.id) content is still stored")
        }
    }

    func testRenameOverAFileStillOpenKeepsItsVersionsWithIt() throws {
        let store = makeMemoryStore()
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        let docs = try fs.ino("SugoiApp")
        let old = try fs.makeFile(docs, "a", b("old"))
        let h = try fs.open(old, flags: O_RDONLY)
        try fs.makeFile(docs, "b", b("new"))
        try fs.rename(parent: docs, name: b("b"), newParent: docs, newName: b("a"), flags: [])
        // The old file is still open: it keeps its own history until it is gone.
        XCTAssertEqual(try store.metadata.versions(of: old).count, 1)
        assertBytes(try fs.get(h, at: 0, count: 3), b("old"))
        try fs.release(handle: h)
    }

    func testRetentionKeepsTheNewestVersionsAndFreesOnlyUnusedContent() throws {
        let store = makeMemoryStore()
        let blobs = store.blobs as! MemoryBlobStore
        let fs = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        fs.versionsToKeep = 4
        let docs = try fs.ino("SugoiApp")
        // Two chunks: the first never changes (shared by every version), the second always does.
        let shared = pattern(chunkSize, seed: 3)
        let file = try fs.makeFile(docs, "log.bin", shared + b("v0"))
        for i in 1...20 { try fs.writeFile(file, b("v\(i)"), at: UInt64(chunkSize)) }

        let versions = try store.metadata.versions(of: file)
        XCTAssertGreaterThanOrEqual(versions.count, 4)
        XCTAssertLessThanOrEqual(versions.count, 6, "pruned down to the limit plus its slack")
        for v in versions {
            XCTAssertTrue(v.chunks.allSatisfy { blobs.verify($0) }, "version \(v.id) lost content that it still uses")
        }
        // Only the kept versions' chunks are stored: the shared first chunk once, plus one per version.
        XCTAssertEqual(blobs.blobIDs.count, 1 + versions.count)
        assertBytes(try fs.contents(file), shared + b("v20"))

        // Deleting the file keeps it in Recently Deleted; emptying that frees its content at once.
        try fs.unlink(parent: docs, name: b("log.bin"))
        XCTAssertEqual(blobs.blobIDs.count, 1 + versions.count)
        XCTAssertEqual(try fs.emptyTrash(), 1)
        XCTAssertEqual(blobs.blobIDs.count, 0)
    }
}
