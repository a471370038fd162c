// Store failures (through `faultInjecting`): a failed metadata commit changes nothing, in memory
// or in the store; a failed blob write keeps the working copy and reports the error, and a later
// publish succeeds.

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class FaultTests: XCTestCase {
    var base: BackingStore!
    var plan: FaultPlan!
    var fs: UbiquityFileSystem!
    var docs: UInt64 = 0

    override func setUpWithError() throws {
        base = makeMemoryStore()
        plan = FaultPlan()
        fs = try UbiquityFileSystem(store: faultInjecting(base, plan: plan), containers: Sample.all, view: .drive)
        docs = try fs.ino("SugoiApp")
    }

    override func tearDown() {
        fs = nil
        plan = nil
        base = nil
    }

    /// Every path under SugoiApp's Documents with its kind, mode, link count and size.
    private func tree(_ fs: UbiquityFileSystem) throws -> [String] {
        var out: [String] = []
        func walk(_ ino: UInt64, _ prefix: String) throws {
            for name in try fs.names(ino) {
                let a = try fs.lookup(parent: ino, name: b(name))
                out.append("\(prefix)\(name) \(a.kind) \(String(a.mode, radix: 8)) n\(a.nlink) s\(a.kind == .directory ? 0 : a.size)")
                if a.kind == .directory { try walk(a.ino, prefix + name + "/") }
            }
        }
        try walk(try fs.ino("SugoiApp"), "")
        return out
    }

    func testFailedCommitChangesNothing() throws {
        let d = try fs.mkdir(parent: docs, name: b("d"), mode: 0o755, caller: owner).ino
        let f = try fs.makeFile(docs, "f", b("content"))
        try fs.makeFile(d, "inner", b("inner"))
        _ = try fs.mkdir(parent: docs, name: b("e"), mode: 0o755, caller: owner)
        try fs.setxattr(f, name: b("user.a"), value: b("1"), flags: 0)
        let before = try tree(fs)
        let mtimeBefore = try fs.getattr(docs).mtime

        plan.fail(.commit, errno: ENOSPC)
        assertErrno(ENOSPC, try fs.mkdir(parent: docs, name: b("new"), mode: 0o755, caller: owner), "mkdir")
        assertErrno(ENOSPC, try fs.create(parent: docs, name: b("new.txt"), mode: 0o644, flags: O_RDWR, caller: owner), "create")
        assertErrno(ENOSPC, try fs.rename(parent: docs, name: b("f"), newParent: d, newName: b("moved"), flags: []), "rename")
        assertErrno(ENOSPC, try fs.rename(parent: d, name: b("inner"), newParent: docs, newName: b("f"), flags: .exchange),
                    "rename exchange")
        assertErrno(ENOSPC, try fs.unlink(parent: docs, name: b("f")), "unlink")
        assertErrno(ENOSPC, try fs.rmdir(parent: docs, name: b("e")), "rmdir")
        assertErrno(ENOSPC, try fs.link(f, newParent: d, newName: b("hard")), "link")
        assertErrno(ENOSPC, try fs.symlink(parent: docs, name: b("l"), target: b("f"), caller: owner), "symlink")
        assertErrno(ENOSPC, try fs.mknod(parent: docs, name: b("p"), mode: UInt32(S_IFIFO) | 0o644, rdev: 0, caller: owner),
                    "mknod")
        assertErrno(ENOSPC, try fs.setattr(f, AttributeChanges(mode: 0o600), handle: nil, caller: owner), "chmod")
        assertErrno(ENOSPC, try fs.setxattr(f, name: b("user.b"), value: b("2"), flags: 0), "setxattr")
        assertErrno(ENOSPC, try fs.removexattr(f, name: b("user.a")), "removexattr")
        XCTAssertGreaterThan(plan.failureCount(.commit), 0)

        XCTAssertEqual(try tree(fs), before, "nothing changed in memory")
        XCTAssertEqual(try fs.getattr(docs).mtime, mtimeBefore)
        XCTAssertEqual(try fs.storedXattrs(f), [b("user.a")])
        assertBytes(try fs.contents(f), b("content"))

        plan.clearAll()
        let reopened = try UbiquityFileSystem(store: base, containers: Sample.all, view: .drive)
        XCTAssertEqual(try tree(reopened), before, "nothing changed in the store")
        XCTAssertEqual(try reopened.storedXattrs(f), [b("user.a")])

        // The same filesystem carries on normally once the disk has room again.
        let created = try fs.mkdir(parent: docs, name: b("new"), mode: 0o755, caller: owner).ino
        try fs.makeFile(created, "after.txt", b("ok"))
        try fs.rename(parent: docs, name: b("f"), newParent: d, newName: b("moved"), flags: [])
        XCTAssertTrue(fs.publishAll().isEmpty)
        let third = try UbiquityFileSystem(store: base, containers: Sample.all, view: .drive)
        XCTAssertEqual(try third.names("SugoiApp"), ["d", "e", "new"])
        assertBytes(try third.contents("SugoiApp/new/after.txt"), b("ok"))
        assertBytes(try third.contents("SugoiApp/d/moved"), b("content"))
    }

    func testFailedBlobWriteKeepsTheWorkingCopyUntilALaterPublish() throws {
        let (attrs, h) = try fs.create(parent: docs, name: b("doc.txt"), mode: 0o644, flags: O_RDWR, caller: owner)
        try fs.put(h, b("precious words"), at: 0)
        plan.fail(.blobWrite, errno: ENOSPC)
        assertErrno(ENOSPC, try fs.release(handle: h), "release reports the failed publish")
        XCTAssertEqual(try base.metadata.versions(of: attrs.ino), [])
        XCTAssertEqual(try base.work.leftovers().count, 1, "the working copy is kept")
        XCTAssertEqual(try fs.getattr(attrs.ino).size, 14)
        assertBytes(try fs.contents(attrs.ino), b("precious words"), "the working copy is still what readers see")
        XCTAssertEqual(fs.publishAll().count, 1, "publishAll reports it too")

        plan.clear(.blobWrite)
        // A later close publishes it.
        let r = try fs.open(attrs.ino, flags: O_RDONLY)
        try fs.release(handle: r)
        XCTAssertEqual(try base.metadata.versions(of: attrs.ino).count, 1)
        XCTAssertEqual(try base.work.leftovers().count, 0)
        assertBytes(try UbiquityFileSystem(store: base, containers: Sample.all, view: .drive)
            .contents("SugoiApp/doc.txt"), b("precious words"))
    }

    func testFailedBlobWriteThenPublishAll() throws {
        let ino = try fs.makeFile(docs, "report.txt", b("version one"))
        let h = try fs.open(ino, flags: O_RDWR)
        try fs.put(h, b("VERSION TWO"), at: 0)
        plan.fail(.blobWrite, errno: EIO)
        assertErrno(EIO, try fs.release(handle: h), "release")
        XCTAssertEqual(try base.metadata.versions(of: ino).count, 1)
        let current = try XCTUnwrap(try base.metadata.load().nodes.first { $0.ino == ino }?.currentVersion)
        let v1 = try XCTUnwrap(try base.metadata.version(current))
        var bytes = [UInt8](repeating: 0, count: Int(v1.size))
        _ = try bytes.withUnsafeMutableBytes { try base.blobs.read(v1.chunks[0].blob, at: 0, into: $0) }
        assertBytes(bytes, b("version one"), "the store still has the previous version as current")
        assertBytes(try fs.contents(ino), b("VERSION TWO"), "this mount still reads its working copy")
        plan.clearAll()
        XCTAssertEqual(fs.publishAll().map(\.errno), [])
        let versions = try base.metadata.versions(of: ino)
        XCTAssertEqual(versions.last?.origin, .published)
        assertBytes(try UbiquityFileSystem(store: base, containers: Sample.all, view: .drive)
            .contents("SugoiApp/report.txt"), b("VERSION TWO"))
    }

    func testFailedPublishCommitKeepsTheWorkingCopy() throws {
        let ino = try fs.makeFile(docs, "a", b("old"))
        let h = try fs.open(ino, flags: O_RDWR)
        try fs.put(h, b("new"), at: 0)
        plan.fail(.commit, errno: ENOSPC, .nthCall(1))
        assertErrno(ENOSPC, try fs.release(handle: h), "release")
        assertBytes(try fs.contents(ino), b("new"), "the working copy is kept (and this close publishes it)")
        XCTAssertEqual(try base.metadata.versions(of: ino).count, 2)
        assertBytes(try UbiquityFileSystem(store: base, containers: Sample.all, view: .drive)
            .contents("SugoiApp/a"), b("new"))
    }

    func testFailedWorkingCopyCreationFailsTheWrite() throws {
        let ino = try fs.makeFile(docs, "a", b("old"))
        let h = try fs.open(ino, flags: O_RDWR)
        plan.fail(.workCreate, errno: ENOSPC)
        assertErrno(ENOSPC, try b("new").withUnsafeBytes { try fs.write(handle: h, offset: 0, bytes: $0) }, "write")
        plan.clearAll()
        assertBytes(try fs.get(h, at: 0, count: 10), b("old"))
        try fs.put(h, b("NEW"), at: 0)
        try fs.release(handle: h)
        assertBytes(try fs.contents(ino), b("NEW"))
    }

    /// Errors.swift: "Every failure of an operation is one of these [FSError]". A failing store
    /// call must reach the caller as an FSError carrying the store's errno.
    func testStoreFailuresReachCallersAsFSError() throws {
        func check(_ what: String, _ body: () throws -> Void, line: UInt = #line) {
            do {
                try body()
                XCTFail("\(what): succeeded despite the injected fault", line: line)
            } catch let e as FSError {
                XCTAssertEqual(errnoName(e.errno), "ENOSPC", what, line: line)
            } catch {
                XCTFail("\(what): threw \(type(of: error)) instead of FSError: \(error)", line: line)
            }
        }
        let ino = try fs.makeFile(docs, "a", b("old"))
        plan.fail(.commit, errno: ENOSPC)
        check("mkdir with a failing commit") { _ = try fs.mkdir(parent: docs, name: b("x"), mode: 0o755, caller: owner) }
        plan.clearAll()
        let h = try fs.open(ino, flags: O_RDWR)
        plan.fail(.workCreate, errno: ENOSPC)
        check("write with a failing working-copy creation") { try fs.put(h, b("new"), at: 0) }
        plan.clearAll()
        try fs.put(h, b("new"), at: 0)
        plan.fail(.blobWrite, errno: ENOSPC)
        check("release with a failing blob write") { try fs.release(handle: h) }
        XCTAssertEqual(fs.publishAll().map { errnoName($0.errno) }, ["ENOSPC"], "publishAll keeps the store's errno")
    }

    /// Marking a closed working copy finished is best effort (a failure is logged, the close
    /// succeeds, recovery keeps a side version); clearing the mark is not: a write that cannot
    /// clear it fails, so a marked copy never holds a half-made change.
    func testFinishedMarkFaults() throws {
        fs.publishesOnClose = false   // the mark as a killed daemon leaves it
        let ino = try fs.makeFile(docs, "f.txt", b("published"))
        let h = try fs.open(ino, flags: O_RDWR)
        try fs.put(h, b("PUBLISHED"), at: 0)
        plan.fail(.workSetFinished, errno: EIO, .nthCall(1))
        XCTAssertNoThrow(try fs.flush(handle: h), "a failed mark does not fail the close")
        XCTAssertEqual(try base.work.leftovers().first?.finished, false)
        try fs.flush(handle: h)   // marks now
        XCTAssertEqual(try base.work.leftovers().first?.finished, true)
        plan.fail(.workSetFinished, errno: EIO, .nthCall(1))
        assertErrno(EIO, try fs.put(h, b("x"), at: 0), "a write that cannot clear the mark")
        XCTAssertEqual(try base.work.leftovers().first?.finished, true, "still marked, with the closed content")
        assertBytes(try fs.get(h, at: 0, count: 20), b("PUBLISHED"), "the failed write changed nothing")
        try fs.put(h, b("y"), at: 0)
        XCTAssertEqual(try base.work.leftovers().first?.finished, false)
        try fs.release(handle: h)
        assertBytes(try fs.contents(ino), b("yUBLISHED"))
    }
}
