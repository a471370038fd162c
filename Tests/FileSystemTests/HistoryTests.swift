// A file's history as users work with it: conflict copies beside a file whose edit lost a
// race, resolving them, and restoring versions (in place or beside). Two models on one store
// stand for two devices.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class HistoryTests: XCTestCase {
    var store: BackingStore!
    var plan: FaultPlan!
    var one: UbiquityFileSystem!
    var two: UbiquityFileSystem!
    var docs: UInt64 = 0

    override func setUpWithError() throws {
        store = makeMemoryStore()
        plan = FaultPlan()
        one = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "A")
        two = try UbiquityFileSystem(store: faultInjecting(store, plan: plan), containers: Sample.all, view: .drive, device: "B")
        docs = try one.ino("SugoiApp")
    }

    override func tearDown() {
        one = nil
        two = nil
        store = nil
    }

    /// `Report.txt` holding "v2 from a" on one, and b's edit of v1, "v2 from b", published on two
    /// after it: a conflict. Returns the file.
    private func makeConflict(beforeThePublish: () -> Void = {}) throws -> UInt64 {
        let f = try one.makeFile(docs, "Report.txt", b("v1"))
        try two.catchUp()
        let hb = try two.open(f, flags: O_RDWR)
        try one.writeFile(f, b("v2 from a"))
        try two.put(hb, b("v2 from b"), at: 0)
        beforeThePublish()
        try two.release(handle: hb)
        return f
    }

    /// `makeConflict`, with the copy's making failing (its chunk cannot be read): owed.
    @discardableResult
    private func makeOwedConflict() throws -> UInt64 {
        let f = try makeConflict { plan.fail(.blobRead, errno: EIO) }
        plan.clearAll()
        return f
    }

    private func copyName(_ fs: UbiquityFileSystem) throws -> String? {
        try fs.names(docs).first { $0.hasPrefix("Report (conflict from B ") }
    }

    func testAConflictIsShownBesideTheFileUntilResolved() throws {
        let f = try makeConflict()
        let name = try XCTUnwrap(try copyName(two), "the copy is beside the file on the device that lost")
        XCTAssertTrue(name.hasSuffix(").txt"), name)
        XCTAssertNotNil(name.range(of: #"^Report \(conflict from B \d{4}-\d\d-\d\d \d\d\.\d\d\)\.txt$"#, options: .regularExpression), name)
        assertBytes(try two.contents("SugoiApp/" + name), b("v2 from b"))
        assertBytes(try two.contents(f), b("v2 from a"), "the other edit stays current")
        try one.catchUp()
        XCTAssertEqual(try copyName(one), name, "and on the other device")
        let conflicts = one.unresolvedConflicts()
        XCTAssertEqual(conflicts.count, 1)
        XCTAssertEqual(conflicts.first?.file, f)
        XCTAssertEqual(one.displayPath(of: f), "SugoiApp/Report.txt")
        XCTAssertEqual(conflicts.first?.copy.flatMap(one.displayPath(of:)), "SugoiApp/" + name)
        // The copy is the user's own file: it has the file's owner and mode.
        let a = try one.at("SugoiApp/" + name)
        XCTAssertEqual(a.mode & 0o7777, 0o644)
        XCTAssertEqual(a.uid, owner.uid)
    }

    func testKeepCurrentRemovesTheCopyAndKeepsItsContentInTheHistory() throws {
        let f = try makeConflict()
        let result = try one.resolve(f, keep: .current)
        XCTAssertEqual(result.removedCopies.count, 1)
        XCTAssertEqual(try one.names(docs), ["Report.txt"])
        XCTAssertEqual(one.unresolvedConflicts(), [])
        assertBytes(try one.contents(f), b("v2 from a"))
        let versions = try store.metadata.versions(of: f)
        XCTAssertEqual(versions.map(\.origin), [.published, .published, .conflict], "nothing lost")
        assertErrno(ENOENT, try one.resolve(f, keep: .current), "nothing left to resolve")
        try two.catchUp()
        XCTAssertEqual(try two.names(docs), ["Report.txt"])
        XCTAssertEqual(two.unresolvedConflicts(), [])
    }

    func testKeepAVersionMakesItCurrent() throws {
        let f = try makeConflict()
        let conflict = try XCTUnwrap(two.unresolvedConflicts().first)
        let result = try two.resolve(f, keep: .version(conflict.version))
        XCTAssertEqual(result.resolved, [conflict.version])
        assertBytes(try two.contents(f), b("v2 from b"))
        try one.catchUp()
        assertBytes(try one.contents(f), b("v2 from b"))
        XCTAssertEqual(try one.names(docs), ["Report.txt"])
        let versions = try store.metadata.versions(of: f)
        XCTAssertEqual(versions.last?.origin, .restored)
        XCTAssertEqual(versions.map(\.origin).filter { $0 == .published }.count, 2, "a's edit stays in the history")
    }

    func testKeepBothLeavesTheCopyAsAnOrdinaryFile() throws {
        let f = try makeConflict()
        let name = try XCTUnwrap(try copyName(two))
        _ = try two.resolve(f, keep: .both)
        XCTAssertEqual(two.unresolvedConflicts(), [])
        XCTAssertEqual(try two.names(docs).sorted(), [name, "Report.txt"].sorted())
        assertBytes(try two.contents("SugoiApp/" + name), b("v2 from b"))
    }

    func testDeletingTheCopyResolves() throws {
        _ = try makeConflict()
        let name = try XCTUnwrap(try copyName(two))
        try one.catchUp()
        try one.unlink(parent: docs, name: b(name))
        XCTAssertEqual(one.unresolvedConflicts(), [])
        try two.catchUp()
        XCTAssertEqual(two.unresolvedConflicts(), [])
    }

    func testAnEditedCopyIsNeverRemoved() throws {
        let f = try makeConflict()
        let name = try XCTUnwrap(try copyName(two))
        try two.writeFile(try two.ino("SugoiApp/" + name), b("merged by hand"))
        let result = try two.resolve(f, keep: .current)
        XCTAssertEqual(result.removedCopies, [])
        XCTAssertEqual(result.keptCopies.count, 1)
        assertBytes(try two.contents("SugoiApp/" + name), b("merged by hand"))
        XCTAssertEqual(two.unresolvedConflicts(), [])
    }

    func testAnAtomicSaveOverTheFileKeepsItsConflicts() throws {
        let f = try makeConflict()
        try one.catchUp()
        let tmp = try one.makeFile(docs, ".Report.txt.swp", b("saved"))
        try one.rename(parent: docs, name: b(".Report.txt.swp"), newParent: docs, newName: b("Report.txt"), flags: [])
        XCTAssertEqual(one.unresolvedConflicts().map(\.file), [tmp], "the history, conflicts with it, goes to the new file")
        XCTAssertNotEqual(tmp, f)
        _ = try one.resolve(tmp, keep: .current)
        XCTAssertEqual(try one.names(docs), ["Report.txt"])
    }

    /// An editor's atomic save over the copy is an edit of it: the conflict stays, and the
    /// saved copy is never removed by `resolve`.
    func testAnAtomicSaveOverTheCopyKeepsIt() throws {
        let f = try makeConflict()
        let name = try XCTUnwrap(try copyName(two))
        let saved = try two.makeFile(docs, ".swp", b("merged"))
        try two.rename(parent: docs, name: b(".swp"), newParent: docs, newName: b(name), flags: [])
        XCTAssertEqual(two.unresolvedConflicts().map(\.copy), [saved])
        let result = try two.resolve(f, keep: .current)
        XCTAssertEqual(result.keptCopies, [saved])
        assertBytes(try two.contents("SugoiApp/" + name), b("merged"))
    }

    /// `resolve` keeps a copy a program is still editing, and moves the others to Recently
    /// Deleted like any delete.
    func testResolveKeepsACopyBeingEdited() throws {
        let f = try makeConflict()
        let name = try XCTUnwrap(try copyName(two))
        let copy = try two.ino("SugoiApp/" + name)
        let h = try two.open(copy, flags: O_RDWR)
        try two.put(h, b("V2"), at: 0)
        XCTAssertEqual(try two.resolve(f, keep: .current).keptCopies, [copy])
        try two.release(handle: h)
        assertBytes(try two.contents("SugoiApp/" + name), b("V2 from b"))
        let g = try makeSecondConflict(on: f)
        let result = try two.resolve(f, keep: .current)
        XCTAssertEqual(result.removedCopies, [g])
        XCTAssertEqual(two.trashItems().map(\.ino), [g], "in Recently Deleted")
    }

    /// Another conflict on `f` (one publishes, two's edit of the older base loses); its copy.
    private func makeSecondConflict(on f: UInt64) throws -> UInt64 {
        try one.catchUp()
        try two.catchUp()
        let before = Set(try two.names(docs))
        let hb = try two.open(f, flags: O_RDWR)
        try one.writeFile(f, b("v9 from a"))
        try two.put(hb, b("v9 from b"), at: 0)
        try two.release(handle: hb)
        let name = try XCTUnwrap(Set(try two.names(docs)).subtracting(before).first)
        return try two.ino("SugoiApp/" + name)
    }

    /// Deleted on one device while the other edits an older version of it: the file comes back
    /// (with the newer version current) and the edit is a conflict copy beside it, not in
    /// Recently Deleted.
    func testAConflictOnAFileAnotherDeviceDeleted() throws {
        let f = try one.makeFile(docs, "Report.txt", b("v1"))
        try two.catchUp()
        let hb = try two.open(f, flags: O_RDWR)
        try two.put(hb, b("v2 from b"), at: 0)
        try one.writeFile(f, b("v2 from a"))
        try one.unlink(parent: docs, name: b("Report.txt"))
        try two.catchUp()
        try two.release(handle: hb)
        assertBytes(try two.contents("SugoiApp/Report.txt"), b("v2 from a"))
        let name = try XCTUnwrap(try copyName(two))
        assertBytes(try two.contents("SugoiApp/" + name), b("v2 from b"))
        XCTAssertEqual(two.trashItems(), [])
    }

    func testDeletingTheFileLeavesTheCopy() throws {
        _ = try makeConflict()
        let name = try XCTUnwrap(try copyName(two))
        try two.unlink(parent: docs, name: b("Report.txt"))
        XCTAssertEqual(two.unresolvedConflicts().count, 1, "the file, in Recently Deleted, keeps its history")
        XCTAssertEqual(try two.emptyTrash(), 1)
        XCTAssertEqual(two.unresolvedConflicts(), [], "gone for good: its conflicts go with its versions")
        assertBytes(try two.contents("SugoiApp/" + name), b("v2 from b"))
    }

    /// The daemon stops between recording the conflict and making its copy: the next start
    /// makes it.
    func testAnOwedCopyIsMadeAtTheNextStart() throws {
        try makeOwedConflict()
        XCTAssertNil(try copyName(two), "the copy could not be made")
        XCTAssertEqual(two.unresolvedConflicts().map(\.copy), [nil], "and is owed")
        two = nil
        let three = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "C")
        let name = try XCTUnwrap(try three.names(docs).first { $0.hasPrefix("Report (conflict from B ") })
        assertBytes(try three.contents("SugoiApp/" + name), b("v2 from b"))
        XCTAssertNotNil(three.unresolvedConflicts().first?.copy)
    }

    /// A copy that failed while both writers run is made by the next collection of either.
    func testAnOwedCopyIsMadeByTheHourlyCollection() throws {
        (store.work as! MemoryWorkArea).setOtherWritersAlive(true)
        try makeOwedConflict()
        try one.catchUp()
        XCTAssertEqual(one.unresolvedConflicts().map(\.copy), [nil])
        try one.collectGarbage()
        let name = try XCTUnwrap(try copyName(one))
        assertBytes(try one.contents("SugoiApp/" + name), b("v2 from b"))
        try two.catchUp()
        try two.collectGarbage()
        XCTAssertEqual(try two.names(docs).filter { $0.hasPrefix("Report (conflict") }.count, 1, "made once")
    }

    /// A conflict resolved on one writer while the other, not yet aware, makes its owed copy: the
    /// copy's commit expects the record as it read it, so it does not bring the conflict back.
    func testAnOwedCopyDoesNotUndoAResolveElsewhere() throws {
        let f = try makeOwedConflict()
        try one.catchUp()
        _ = try one.resolve(f, keep: .current)          // two has not seen this
        two.makeOwedConflictCopies()
        XCTAssertEqual(two.unresolvedConflicts(), [])
        XCTAssertNil(try copyName(two), "no copy of a resolved conflict")
        try one.catchUp()
        XCTAssertEqual(one.unresolvedConflicts(), [])
    }

    func testTwoConflictsOfOneMinuteGetDistinctNames() throws {
        let f = try makeConflict()
        let hb = try two.open(f, flags: O_RDWR)
        try one.catchUp()
        try one.writeFile(f, b("v3 from a"))
        try two.put(hb, b("v3 from b"), at: 0)
        try two.release(handle: hb)
        let copies = try two.names(docs).filter { $0.hasPrefix("Report (conflict") }
        XCTAssertEqual(copies.count, 2, "\(copies)")
        XCTAssertEqual(two.unresolvedConflicts().count, 2)
        _ = try two.resolve(f, keep: .current)
        XCTAssertEqual(try two.names(docs), ["Report.txt"])
    }

    func testRestoreInPlaceKeepsTheReplacedVersion() throws {
        let f = try one.makeFile(docs, "Report.txt", b("first"))
        try one.writeFile(f, b("second"))
        let first = try XCTUnwrap(try store.metadata.versions(of: f).first)
        try two.catchUp()
        let reader = try two.open(f, flags: O_RDONLY)
        try one.restore(f, version: first.id)
        assertBytes(try one.contents(f), b("first"))
        XCTAssertEqual(try one.getattr(f).size, 5)
        let versions = try store.metadata.versions(of: f)
        XCTAssertEqual(versions.map(\.origin), [.published, .published, .restored])
        try two.catchUp()
        assertBytes(try two.get(reader, at: 0, count: 10), b("first"), "an open reader follows")
        try two.release(handle: reader)
        assertErrno(EINVAL, try one.restore(f, version: 999_999))
        let other = try one.makeFile(docs, "Other.txt", b("x"))
        assertErrno(EINVAL, try one.restore(other, version: first.id), "not this file's version")
    }

    func testRestoreBesideCopiesTheContent() throws {
        let f = try one.makeFile(docs, "Report.txt", b("first"))
        try one.writeFile(f, b("second"))
        let first = try XCTUnwrap(try store.metadata.versions(of: f).first)
        let copy = try one.restore(f, version: first.id, as: b("Report (old).txt"))
        XCTAssertNotEqual(copy, f)
        assertBytes(try one.contents("SugoiApp/Report (old).txt"), b("first"))
        assertBytes(try one.contents(f), b("second"), "the file is left as it is")
        assertErrno(EEXIST, try one.restore(f, version: first.id, as: b("Report (old).txt")))
        // The copy has content of its own: deleting the file (and its history) leaves it whole.
        try one.unlink(parent: docs, name: b("Report.txt"))
        try one.collectGarbage()
        assertBytes(try one.contents(copy), b("first"))
        XCTAssertEqual(try store.metadata.versions(of: copy).map(\.origin), [.restored])
    }

    /// The version is there when close() returns (flush), not only after the release the
    /// kernel sends later; while another writer still has it open, the close publishes nothing.
    func testTheLastWritersClosePublishes() throws {
        let f = try one.makeFile(docs, "Report.txt", b("v1"))
        let w1 = try one.open(f, flags: O_RDWR), w2 = try one.open(f, flags: O_WRONLY)
        try one.put(w1, b("v"), at: 0)
        try one.put(w2, b("2"), at: 1)
        try one.flush(handle: w1)
        XCTAssertEqual(try store.metadata.versions(of: f).count, 1, "w2 has written and not closed")
        try one.flush(handle: w2)
        XCTAssertEqual(try store.metadata.versions(of: f).count, 2)
        try two.catchUp()
        assertBytes(try two.contents(f), b("v2"), "the other device reads it before any release")
        try one.release(handle: w1)
        try one.release(handle: w2)
        XCTAssertEqual(try store.metadata.versions(of: f).count, 2, "nothing more to publish")
    }

    /// `user.ubiquity.status`, `.version` and `.container`: read-only, computed, listed.
    func testStatusAttributes() throws {
        func attr(_ fs: UbiquityFileSystem, _ ino: UInt64, _ name: String) throws -> String {
            String(decoding: try fs.getxattr(ino, name: b("user.ubiquity." + name)), as: UTF8.self)
        }
        let f = try one.makeFile(docs, "Report.txt", b("v1"))
        XCTAssertEqual(try one.listxattr(f).prefix(3).map { String(decoding: $0, as: UTF8.self) },
                       ["user.ubiquity.container", "user.ubiquity.status", "user.ubiquity.version"])
        XCTAssertEqual(try one.listxattr(docs).map { String(decoding: $0, as: UTF8.self) }, ["user.ubiquity.container"])
        XCTAssertEqual(try attr(one, f, "container"), Sample.sugoi.identifier)
        XCTAssertEqual(try attr(one, f, "status"), "current")
        let v1 = try attr(one, f, "version")
        XCTAssertEqual(v1, String(try XCTUnwrap(try store.metadata.versions(of: f).last?.id)))
        assertErrno(ENODATA, try one.getxattr(docs, name: b("user.ubiquity.status")), "folders have no status")
        let h = try one.open(f, flags: O_RDWR)
        try one.put(h, b("v2"), at: 0)
        XCTAssertEqual(try attr(one, f, "status"), "pending")
        try one.release(handle: h)
        XCTAssertEqual(try attr(one, f, "status"), "current")
        XCTAssertNotEqual(try attr(one, f, "version"), v1)
        // cp -a and rsync -X between mounts write what they read: accepted, and nothing changes.
        try one.setxattr(f, name: b("user.ubiquity.status"), value: b("conflict"), flags: 0)
        try one.removexattr(f, name: b("user.ubiquity.version"))
        XCTAssertEqual(try attr(one, f, "status"), "current")
        XCTAssertNotEqual(try attr(one, f, "version"), v1)
        assertErrno(EEXIST, try one.setxattr(f, name: b("user.ubiquity.status"), value: b("x"), flags: xattrCreate))
        assertErrno(ENODATA, try one.setxattr(docs, name: b("user.ubiquity.status"), value: b("x"), flags: 0), "folders have none")
        // A conflict shows on the file and on its copy.
        try one.catchUp()
        try two.catchUp()
        let hb = try two.open(f, flags: O_RDWR)
        try one.writeFile(f, b("v3 from a"))
        try two.put(hb, b("v3 from b"), at: 0)
        try two.release(handle: hb)
        XCTAssertEqual(try attr(two, f, "status"), "conflict")
        XCTAssertEqual(try attr(two, try two.ino("SugoiApp/" + XCTUnwrap(try copyName(two))), "status"), "conflict")
        _ = try two.resolve(f, keep: .current)
        XCTAssertEqual(try attr(two, f, "status"), "current")
    }

    func testDeviceActivity() throws {
        let f = try makeConflict()
        XCTAssertEqual(try two.deviceActivity().map(\.device), ["B", "A"], "B's conflict version is the newest change")
        try one.catchUp()
        try one.unlink(parent: docs, name: b("Report.txt"))
        XCTAssertEqual(try one.deviceActivity().map(\.device), ["A", "B"])
        _ = f
    }

    func testConflictCopyNames() {
        let when: Int64 = 1_800_000_000 * 1_000_000_000
        func name(_ n: String, taken: Set<String> = []) -> String {
            String(decoding: conflictCopyName(b(n), device: "host", created: when) { taken.contains(String(decoding: $0, as: UTF8.self)) },
                   as: UTF8.self)
        }
        let stamp = name("x").dropFirst("x (conflict from host ".count).prefix(16)
        XCTAssertEqual(name("Report.txt"), "Report (conflict from host \(stamp)).txt")
        XCTAssertEqual(name("Makefile"), "Makefile (conflict from host \(stamp))")
        XCTAssertEqual(name(".bashrc"), ".bashrc (conflict from host \(stamp))")
        XCTAssertEqual(name("a.tar.gz"), "a.tar (conflict from host \(stamp)).gz")
        XCTAssertEqual(name("Report.txt", taken: ["Report (conflict from host \(stamp)).txt"]),
                       "Report (conflict from host \(stamp) 2).txt")
        let long = name(String(repeating: "é", count: 127) + ".txt")
        XCTAssertLessThanOrEqual(long.utf8.count, 255)
        XCTAssertTrue(long.hasSuffix(")).txt") || long.hasSuffix(").txt"))
        XCTAssertTrue(long.hasPrefix("éé"))
    }
}
