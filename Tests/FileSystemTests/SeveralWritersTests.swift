// Two models on one store, as two daemons (views, devices) will be: ids come from the store, a
// batch states what it read, a conflict makes the model catch up from the change log and stage
// again, and a publish on a stale base is kept as a conflict version, never over the other's.
// (The change feed that calls `catchUp` by itself, and two mounts at once, come next.)

import Foundation
import XCTest
@testable import UbiquityFileSystem
import UbiquityStore

final class SeveralWritersTests: TwoWritersTestCase {

    /// Every path under SugoiApp with kind, mode, owner, link count, size, content and xattrs.
    private func tree(_ fs: UbiquityFileSystem) throws -> [String] {
        var out: [String] = []
        func walk(_ ino: UInt64, _ path: String) throws {
            for name in try fs.names(ino) {
                let attrs = try fs.lookup(parent: ino, name: b(name))
                var line = "\(path)/\(name) \(attrs.kind) \(String(attrs.mode & 0o7777, radix: 8)) uid \(attrs.uid) "
                    + "nlink \(attrs.nlink) size \(attrs.size)"
                switch attrs.kind {
                case .regular: line += " \(String(decoding: try fs.contents(attrs.ino), as: UTF8.self))"
                case .symlink: line += " -> \(String(decoding: try fs.readlink(attrs.ino), as: UTF8.self))"
                default: break
                }
                for x in try fs.listxattr(attrs.ino) {
                    line += " \(String(decoding: x, as: UTF8.self))=\(String(decoding: try fs.getxattr(attrs.ino, name: x), as: UTF8.self))"
                }
                out.append(line)
                if attrs.kind == .directory { try walk(attrs.ino, path + "/" + name) }
            }
        }
        try walk(try fs.ino("SugoiApp"), "")
        return out
    }

    func testEveryKindOfChangeOfOneWriterReachesTheOther() throws {
        let docs = try one.ino("SugoiApp")
        let d = try one.mkdir(parent: docs, name: b("Drafts"), mode: 0o750, caller: alice).ino
        let f = try one.makeFile(d, "report.txt", b("first draft"))
        try one.writeFile(f, b("FIRST"))
        try one.rename(parent: d, name: b("report.txt"), newParent: docs, newName: b("Report.txt"), flags: [])
        _ = try one.setattr(f, AttributeChanges(mode: 0o600), handle: nil, caller: owner)
        try one.setxattr(f, name: b("user.tag"), value: b("blue"), flags: 0)
        _ = try one.symlink(parent: docs, name: b("latest"), target: b("Report.txt"), caller: owner)
        _ = try one.link(f, newParent: d, newName: b("hard.txt"))
        try one.makeFile(docs, "gone.txt", b("x"))
        try one.unlink(parent: docs, name: b("gone.txt"))

        XCTAssertNotEqual(try tree(two), try tree(one), "two has not looked yet")
        let changes = try two.catchUp()
        XCTAssertEqual(try tree(two), try tree(one))
        XCTAssertEqual(try two.catchUp(), [], "nothing new")
        // What the kernel must drop: the names that changed, and the nodes.
        for expected: KernelInvalidation in [.entry(parent: docs, name: b("Report.txt")), .entry(parent: d, name: b("report.txt")),
                                             .entry(parent: docs, name: b("gone.txt")), .node(f), .node(docs), .node(d)] {
            XCTAssertTrue(changes.contains(expected), "\(expected) in \(changes)")
        }
        XCTAssertEqual(changes.count, Set(changes).count, "each once")
        // And back.
        try two.writeFile(f, b("from b"))
        try two.unlink(parent: try two.ino("SugoiApp/Drafts"), name: b("hard.txt"))
        try one.catchUp()
        XCTAssertEqual(try tree(one), try tree(two))
        assertBytes(try one.contents("SugoiApp/Report.txt"), b("from bdraft"), "written over from offset 0")
    }

    /// The kernel may keep a file's pages at an open only while the file's version is the one of
    /// its last open there: another writer's publish, a restore, or a forget (the kernel's pages
    /// went with its inode) make the next open drop them; a truncating open never keeps them.
    func testTheKernelKeepsItsCacheOnlyWhileTheVersionStays() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "cached.txt", b("first"))
        try two.catchUp()
        func reopen(_ fs: UbiquityFileSystem, truncating: Bool = false) throws -> Bool {
            let h = try fs.open(f, flags: O_RDONLY)
            defer { try? fs.release(handle: h) }
            return fs.keepsKernelCache(f, truncating: truncating)
        }
        XCTAssertFalse(try reopen(two), "not held by the kernel: nothing to keep")
        two.remember(f)
        XCTAssertFalse(try reopen(two), "the first open the kernel made")
        XCTAssertTrue(try reopen(two), "nothing changed since")
        XCTAssertFalse(try reopen(two, truncating: true))
        XCTAssertTrue(try reopen(two))
        try one.writeFile(f, b("second"))
        XCTAssertTrue(try reopen(two), "two has not applied the other's publish yet: its pages are what it serves")
        try two.catchUp()
        XCTAssertFalse(try reopen(two), "another writer published")
        XCTAssertTrue(try reopen(two))
        let first = try XCTUnwrap(try store.metadata.versions(of: f).first?.id)
        _ = try two.restore(f, version: first)
        XCTAssertFalse(try reopen(two), "a restore")
        XCTAssertTrue(try reopen(two))
        two.forget(f, count: 1)
        two.remember(f)
        XCTAssertFalse(try reopen(two), "the kernel forgot the file, and its pages")
    }

    /// A reply the kernel is still to make an inode from can predate another writer's change and
    /// outlive its invalidation: what another writer changed a moment ago is answered with
    /// attributes the kernel is to keep for no time; a writer's own changes, and what settled,
    /// are cached as usual.
    func testAttributesOfWhatAnotherWriterJustChangedAreNotToBeCached() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "new.txt", b(""))
        XCTAssertFalse(try one.getattr(f).changingElsewhere, "its own writer's")
        try two.catchUp()
        XCTAssertTrue(try two.getattr(f).changingElsewhere, "made by the other writer a moment ago")
        XCTAssertTrue(try two.lookup(parent: docs, name: b("new.txt")).changingElsewhere)
        XCTAssertFalse(try two.getattr(docs).changingElsewhere, "its folder changed too, but a folder's attributes decide no read")
        let other = try two.makeFile(docs, "mine.txt", b("x"))
        try two.catchUp()
        XCTAssertFalse(try two.getattr(other).changingElsewhere)

        var recent = RecentRemoteChanges()
        recent.note(f, now: 10_000_000_000)
        recent.note(other, now: 11_000_000_000)
        recent.prune(now: 11_500_000_000)
        XCTAssertTrue(recent.contains(f) && recent.contains(other))
        recent.prune(now: 12_000_000_000)
        XCTAssertFalse(recent.contains(f), "past the window")
        XCTAssertTrue(recent.contains(other))
        recent.note(other, now: 12_500_000_000)
        recent.prune(now: 13_000_000_000)
        XCTAssertTrue(recent.contains(other), "its later change counts")
        recent.prune(now: 14_500_000_000)
        XCTAssertTrue(recent.isEmpty)
    }

    /// A lookup answered to the kernel counts its node as held before the namespace can change,
    /// so another writer's change applied while the answer is on its way is invalidated.
    func testALookupForTheKernelHoldsItsNodeFromWhenItsAttributesAreRead() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "seen.txt", b("one"))
        try two.catchUp()
        _ = try two.lookup(parent: docs, name: b("seen.txt"))
        XCTAssertEqual(two.heldByKernel([.node(f)]), [], "a plain lookup gives the kernel nothing")
        XCTAssertEqual(try two.lookup(parent: docs, name: b("seen.txt"), forKernel: true).size, 3)
        try one.writeFile(f, b("three"))
        XCTAssertEqual(two.heldByKernel(try two.catchUp()).filter { $0 == .node(f) }, [.node(f)])
        two.forget(f, count: 1)
        XCTAssertEqual(two.heldByKernel([.node(f)]), [], "one reference, taken back")
    }

    /// The other writer publishes a big file's version and deletes the file for good before this
    /// one looks again: the version is left out (its chunk list went with the file), and the
    /// file this kernel still holds is, to it, the file as this writer last had it: its size
    /// goes with its chunks (not the new size over the old chunks).
    func testAGhostOfABigFileWhoseLastVersionWentWithItIsTheFileAsItWas() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fstests-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try openEmbeddedStore(directory: dir)
        let one = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "A")
        let two = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, device: "B")
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "big.bin", b("head"))
        // 65 chunks, most of them holes: a list long enough to be shared between versions.
        try one.writeFile(f, b("tail"), at: UInt64(64 * chunkSize))
        let before = try one.getattr(f).size
        try two.catchUp()
        two.remember(f, parent: docs, name: b("big.bin"))
        try one.writeFile(f, b("more"), at: UInt64(65 * chunkSize))
        try one.unlink(parent: docs, name: b("big.bin"))
        XCTAssertEqual(try one.emptyTrash(f), 1)
        try two.catchUp()
        // (Its content is gone here: both writers are in this process, so one freed the blobs
        // at once; a daemon leaves them while others run, see the test of a ghost's content.)
        let ghost = try two.getattr(f)
        XCTAssertEqual(ghost.size, before, "the ghost is the file as two last had it")
        XCTAssertEqual(ghost.nlink, 0)
    }

    /// A writer that fell further behind than the trimmed change log (a daemon stopped for long)
    /// loads the namespace again and still tells the kernel what changed, and an open document
    /// with no changes of its own follows the other's publish.
    func testAWriterBehindATrimmedLogReloads() throws {
        let docs = try one.ino("SugoiApp")
        let keep = try one.makeFile(docs, "keep.txt", b("old"))
        try one.makeFile(docs, "gone.txt", b("x"))
        try two.catchUp()
        let held = try two.open(keep, flags: O_RDONLY)
        try one.writeFile(keep, b("new content"))
        try one.unlink(parent: docs, name: b("gone.txt"))
        let d = try one.mkdir(parent: docs, name: b("Drafts"), mode: 0o755, caller: alice).ino
        try one.makeFile(d, "inside.txt", b("in"))
        try store.metadata.trimChanges(keepingLast: 1)

        let changes = try two.catchUp()
        XCTAssertEqual(try tree(two), try tree(one), "reloaded whole")
        // New names too: the kernel may remember them as missing.
        for expected: KernelInvalidation in [.entry(parent: docs, name: b("gone.txt")), .entry(parent: docs, name: b("Drafts")),
                                             .entry(parent: d, name: b("inside.txt")), .node(docs), .node(keep)] {
            XCTAssertTrue(changes.contains(expected), "\(expected) in \(changes)")
        }
        var out = [UInt8](repeating: 0, count: 32)
        let n = try out.withUnsafeMutableBytes { try two.read(handle: held, offset: 0, into: $0) }
        XCTAssertEqual(Array(out[0..<n]), b("new content"), "the open document followed")
        try two.release(handle: held)
        // And it goes on from there with the log as usual.
        try one.makeFile(docs, "after.txt", b("a"))
        try two.catchUp()
        XCTAssertEqual(try tree(two), try tree(one))
        try two.makeFile(docs, "from-two.txt", b("b"))
        try one.catchUp()
        XCTAssertEqual(try tree(one), try tree(two))
    }

    func testTheSameNewNameMadeByBothPutsTheSecondBesideAsName2() throws {
        let docs = try one.ino("SugoiApp")
        let mine = try one.makeFile(docs, "Report.txt", b("from a"))
        // b has not seen it: its create conflicts, it catches up, and the name is taken.
        let (attrs, h) = try two.create(parent: docs, name: b("Report.txt"), mode: 0o644, flags: O_RDWR | O_CREAT | O_TRUNC, caller: owner)
        XCTAssertNotEqual(attrs.ino, mine)
        try two.put(h, b("from b"), at: 0)
        try two.release(handle: h)
        assertBytes(try two.contents("SugoiApp/Report.txt"), b("from a"), "a's file is untouched")
        assertBytes(try two.contents("SugoiApp/Report 2.txt"), b("from b"))
        XCTAssertEqual(try two.ino("SugoiApp/Report 2.txt"), attrs.ino)
        try one.catchUp()
        XCTAssertEqual(try tree(one), try tree(two))
        // A third goes to `Name 3`; names without an extension and dot files too.
        _ = try one.makeFile(docs, "notes", b("a"))
        _ = try one.makeFile(docs, ".hidden", b("a"))
        for name in ["Report.txt", "notes", ".hidden"] {
            let (_, h) = try two.create(parent: docs, name: b(name), mode: 0o644, flags: O_RDWR | O_CREAT, caller: owner)
            try two.release(handle: h)
        }
        XCTAssertEqual(Set(try two.names(docs)), ["Report.txt", "Report 2.txt", "Report 3.txt", "notes", "notes 2", ".hidden", ".hidden 2"])

        // The kernel was answered for the name it asked: it is told to drop both names (its
        // own lock on the folder holds the notification until the answer is applied).
        let told = try two.catchUp()
        for name in ["Report.txt", "Report 3.txt", "notes", "notes 2"] {
            XCTAssertTrue(told.contains(.entry(parent: docs, name: b(name))), "\(name) in \(told)")
        }
        XCTAssertEqual(try two.catchUp(), [], "sent once")
    }

    /// `x` in two containers; writer one deletes its own. Returns the desktop trash's `files`
    /// folder (as writer one sees it) and the other writer's delete of its `x`, to run before
    /// writer one has seen it.
    private func twoAlikeFilesOneDeleted() throws -> (files: UInt64, twoDeletes: () throws -> Void) {
        let sugoi = try one.ino("SugoiApp"), drive = try one.ino("TestDrive")
        try one.makeFile(sugoi, "x", b("1"))
        try one.makeFile(drive, "x", b("2"))
        _ = try two.catchUp()
        try one.unlink(parent: sugoi, name: b("x"))
        let top = try one.lookup(parent: UbiquityFileSystem.rootID, name: b(".Trash-\(getuid())")).ino
        let files = try one.lookup(parent: top, name: b("files")).ino
        return (files, { [two] in try two!.unlink(parent: drive, name: b("x")) })
    }

    /// Two writers deleting alike names in two containers at once both keep the trash name; the
    /// desktop trash shows the later as `x.2`. When one leaves, the other's shown name shifts,
    /// and the kernel is told of both names.
    func testTheDesktopTrashIsToldOfNamesThatShift() throws {
        let (files, twoDeletes) = try twoAlikeFilesOneDeleted()
        try twoDeletes()
        _ = try one.catchUp()
        XCTAssertEqual(Set(try one.names(files)), ["x", "x.2"])
        _ = try one.restoreFromTrash(one.trashItems().last!.ino)
        let told = try one.catchUp()
        for name in ["x", "x.2"] { XCTAssertTrue(told.contains(.entry(parent: files, name: b(name))), "\(name) in \(told)") }
        XCTAssertEqual(try one.names(files), ["x"])
    }

    /// Only what the kernel holds is invalidated: a folder it never looked at (the desktop
    /// trash's, here) gets nothing until it is looked up, then what changes in it does.
    func testOnlyWhatTheKernelHoldsIsInvalidated() throws {
        let (files, twoDeletes) = try twoAlikeFilesOneDeleted()
        try twoDeletes()
        let told = try one.catchUp()
        XCTAssertTrue(told.contains(.node(files)), "\(told)")
        func inFiles(_ c: KernelInvalidation) -> Bool {
            if case .entry(let parent, _) = c { return parent == files }
            return c == .node(files)
        }
        XCTAssertTrue(told.contains { inFiles($0) && $0 != .node(files) }, "\(told)")
        XCTAssertEqual(one.heldByKernel(told).filter(inFiles), [], "the kernel never looked at the trash's files folder")
        let docs = try one.ino("SugoiApp")
        one.remember(files)
        one.remember(docs)
        _ = try one.restoreFromTrash(one.trashItems().last!.ino)
        let held = one.heldByKernel(try one.catchUp())
        for name in ["x", "x.2"] { XCTAssertTrue(held.contains(.entry(parent: files, name: b(name))), "\(name) in \(held)") }
        XCTAssertTrue(held.contains(.node(files)))
        one.forget(files, count: 1)
        XCTAssertEqual(one.heldByKernel([.node(files), .entry(parent: files, name: b("x"))]), [], "forgotten")
        XCTAssertEqual(one.heldByKernel([.node(UbiquityFileSystem.rootID)]), [.node(UbiquityFileSystem.rootID)], "the root is always held")
        one.forget(docs, count: 1)
    }

    /// Another writer's item wanting the name of one that leaves before the next listing: the
    /// names the listing shows are those worked out from scratch (the arrival does not keep a
    /// `name.2` the departure freed).
    func testATrashNameFreedBeforeTheNextListingGoesToTheItemThatWantedIt() throws {
        let (files, twoDeletes) = try twoAlikeFilesOneDeleted()
        XCTAssertEqual(try one.names(files), ["x"])
        let mine = try XCTUnwrap(one.trashItems().first).ino
        try twoDeletes()
        _ = try one.restoreFromTrash(mine)   // catches up with two's delete first
        XCTAssertEqual(try one.names(files), ["x"])
        XCTAssertNotEqual(try one.lookup(parent: files, name: b("x")).ino, mine)
    }

    func testExclusiveCreatesAndOtherMakersStillGetEEXIST() throws {
        let docs = try one.ino("SugoiApp")
        let mine = try one.makeFile(docs, "x.txt", b("from a"))
        // Lock files and mkstemp depend on O_EXCL failing.
        assertErrno(EEXIST, try two.create(parent: docs, name: b("x.txt"), mode: 0o644, flags: O_RDWR | O_CREAT | O_EXCL, caller: owner),
                    "exclusive create of a name the other writer just made")
        assertBytes(try two.contents("SugoiApp/x.txt"), b("from a"))
        XCTAssertEqual(try two.ino("SugoiApp/x.txt"), mine)
        _ = try one.mkdir(parent: docs, name: b("dir"), mode: 0o755, caller: owner)
        assertErrno(EEXIST, try two.mkdir(parent: docs, name: b("dir"), mode: 0o755, caller: owner), "mkdir")
        _ = try one.mknod(parent: docs, name: b("fifo"), mode: UInt32(S_IFIFO) | 0o644, rdev: 0, caller: owner)
        assertErrno(EEXIST, try two.mknod(parent: docs, name: b("fifo"), mode: UInt32(S_IFREG) | 0o644, rdev: 0, caller: owner), "mknod")
        _ = try one.symlink(parent: docs, name: b("link"), target: b("x.txt"), caller: owner)
        assertErrno(EEXIST, try two.symlink(parent: docs, name: b("link"), target: b("y"), caller: owner), "symlink")
        XCTAssertEqual(try two.names(docs).count, 4)
    }

    func testARenameOntoANameTheOtherJustTookLandsBeside() throws {
        let docs = try one.ino("SugoiApp")
        // b saves a new document the way GIO does: a temporary file renamed onto the name.
        try two.makeFile(docs, ".goutputstream-1", b("from b"))
        try two.makeFile(docs, ".goutputstream-2", b("b again"))
        try two.makeFile(docs, "old.txt", b("old"))
        try one.catchUp()
        try one.makeFile(docs, "Report.txt", b("from a"))
        try two.rename(parent: docs, name: b(".goutputstream-1"), newParent: docs, newName: b("Report.txt"), flags: [])
        assertBytes(try two.contents("SugoiApp/Report.txt"), b("from a"))
        assertBytes(try two.contents("SugoiApp/Report 2.txt"), b("from b"))
        // Once b has seen the file, a rename onto it replaces it as POSIX says (its history
        // goes on in the new file).
        try two.rename(parent: docs, name: b(".goutputstream-2"), newParent: docs, newName: b("Report.txt"), flags: [])
        assertBytes(try two.contents("SugoiApp/Report.txt"), b("b again"))
        // RENAME_NOREPLACE still refuses a name the other just took.
        try one.makeFile(docs, "new.txt", b("a"))
        assertErrno(EEXIST, try two.rename(parent: docs, name: b("old.txt"), newParent: docs, newName: b("new.txt"), flags: .noReplace))
        try one.catchUp()
        XCTAssertEqual(try tree(one), try tree(two))
        XCTAssertEqual(Set(try one.names(docs)), ["Report.txt", "Report 2.txt", "old.txt", "new.txt"])
    }

    func testRacesGiveTheErrnoOfALocalRace() throws {
        let docs = try one.ino("SugoiApp")
        let dir = try one.mkdir(parent: docs, name: b("dir"), mode: 0o755, caller: owner).ino
        try one.makeFile(docs, "f.txt", b("f"))
        XCTAssertFalse(try two.catchUp().isEmpty)
        // a fills the folder and removes the file; b, not looking, tries the opposite.
        try one.makeFile(dir, "inside.txt", b("i"))
        try one.unlink(parent: docs, name: b("f.txt"))
        assertErrno(ENOTEMPTY, try two.rmdir(parent: docs, name: b("dir")), "rmdir of a folder the other filled")
        assertErrno(ENOENT, try two.rename(parent: docs, name: b("f.txt"), newParent: docs, newName: b("g.txt"), flags: []),
                    "rename of a file the other removed")
        assertErrno(ENOENT, try two.unlink(parent: docs, name: b("f.txt")), "unlink of a file the other removed")
        XCTAssertEqual(try tree(two), try tree(one))
    }

    func testInterleavedCreatesByBothAllLandWithDistinctInodes() throws {
        let docs = try one.ino("SugoiApp")
        var inos: Set<UInt64> = []
        for i in 0..<50 {
            inos.insert(try one.makeFile(docs, "a\(i)", b("a")))
            inos.insert(try two.makeFile(docs, "b\(i)", b("b")))   // conflicts on the folder, stages again
        }
        XCTAssertEqual(inos.count, 100, "no inode handed out twice")
        try one.catchUp()
        XCTAssertEqual(try one.names(docs).count, 100)
        XCTAssertEqual(try tree(one), try tree(two))
        XCTAssertEqual(try one.getattr(docs).nlink, 2)
    }

    func testPublishOnAStaleBaseIsKeptAsAConflictVersion() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "Report.txt", b("v1"))
        try two.catchUp()
        let hb = try two.open(f, flags: O_RDWR)            // b starts editing v1
        try one.writeFile(f, b("v2 from a"))               // a publishes v2
        try two.put(hb, b("v2 from b"), at: 0)
        try two.release(handle: hb)                        // b's publish finds v1 no longer current
        assertBytes(try one.contents(f), b("v2 from a"), "the other edit stays current")
        let versions = try store.metadata.versions(of: f)
        XCTAssertEqual(versions.map(\.origin), [.published, .published, .conflict])
        XCTAssertEqual(versions.map(\.device), ["A", "A", "B"])
        let conflict = try XCTUnwrap(versions.last)
        var bytes = [UInt8](repeating: 0, count: Int(conflict.size))
        _ = try bytes.withUnsafeMutableBytes { try store.blobs.read(conflict.chunks[0].blob, at: 0, into: $0) }
        XCTAssertEqual(bytes, b("v2 from b"), "b's edit is kept, not lost")
        try two.catchUp()
        assertBytes(try two.contents(f), b("v2 from a"))
    }

    /// Start-up garbage collection deletes only unreferenced blobs older than the grace period:
    /// a young one may be another writer's, written for a commit it has not made yet.
    func testGarbageCollectionLeavesYoungBlobsAlone() throws {
        let blobs = store.blobs as! MemoryBlobStore
        let young = try writeBlob(store.blobs, b("another writer's, not committed yet"))
        let old = try writeBlob(store.blobs, b("a failed publish's, long ago"))
        blobs.backdate(old.blob, by: 11 * 60 * 1_000_000_000)
        _ = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive)
        XCTAssertTrue(blobs.blobIDs.contains(young.blob))
        XCTAssertFalse(blobs.blobIDs.contains(old.blob))
    }

    /// While another writer runs, an unreferenced blob is freed only once it was unreferenced at
    /// two collections in a row (an hour apart in a daemon): the other may still be reading the
    /// file it belonged to. A writer alone frees it at once.
    func testWhileOthersRunGarbageWaitsForASecondCollection() throws {
        let blobs = store.blobs as! MemoryBlobStore
        let work = store.work as! MemoryWorkArea
        let old = try writeBlob(store.blobs, b("a deleted file's, maybe still read elsewhere"))
        blobs.backdate(old.blob, by: 11 * 60 * 1_000_000_000)
        work.setOtherWritersAlive(true)
        try one.collectGarbage()
        XCTAssertTrue(blobs.blobIDs.contains(old.blob), "kept at the first collection")
        try two.collectGarbage()
        XCTAssertTrue(blobs.blobIDs.contains(old.blob), "each writer counts its own collections")
        try one.collectGarbage()
        XCTAssertFalse(blobs.blobIDs.contains(old.blob), "freed at the second")
        let another = try writeBlob(store.blobs, b("another"))
        blobs.backdate(another.blob, by: 11 * 60 * 1_000_000_000)
        work.setOtherWritersAlive(false)
        try two.collectGarbage()
        XCTAssertFalse(blobs.blobIDs.contains(another.blob), "alone, at once")
    }

    /// A writer's collection keeps the content of a file it has open, even once another writer
    /// deleted the file and the content is unreferenced in the store.
    func testGarbageCollectionKeepsWhatAnOpenFileHereReads() throws {
        let blobs = store.blobs as! MemoryBlobStore
        (store.work as! MemoryWorkArea).setOtherWritersAlive(true)
        let docs = try one.ino("SugoiApp")
        let content = pattern(3000, seed: 7)
        let f = try one.makeFile(docs, "read.txt", content)
        try two.catchUp()
        let h = try two.open(f, flags: O_RDONLY)
        try one.unlink(parent: docs, name: b("read.txt"))
        try one.emptyTrash()   // deleted for good, not just into Recently Deleted
        try two.catchUp()
        for id in blobs.blobIDs { blobs.backdate(id, by: 11 * 60 * 1_000_000_000) }
        try two.collectGarbage()
        try two.collectGarbage()
        var out = [UInt8](repeating: 0, count: 4000)
        let n = try out.withUnsafeMutableBytes { try two.read(handle: h, offset: 0, into: $0) }
        XCTAssertEqual(Array(out[0..<n]), content, "still readable here")
        try two.release(handle: h)
        try two.collectGarbage()
        try two.collectGarbage()
        XCTAssertTrue(blobs.blobIDs.isEmpty, "freed once nobody reads it")
    }

    /// One writer stops cleanly while the other still runs; then the machine loses power. The
    /// next start must still check what the other published without a sync (its running mark is
    /// of the boot that ended), and fall back where content did not reach the disk.
    func testAPowerCutIsCaughtAfterAnotherWriterStoppedCleanly() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "Report.txt", b("v1"))
        XCTAssertTrue(one.stop().isEmpty)          // clean, synced
        try two.catchUp()
        try two.writeFile(f, b("v2"))              // published, content not synced
        try two.fsyncDirectory()                   // the metadata is durable, the content is not
        try XCTUnwrap(store.metadata as? MemoryMetadataStore).simulatePowerCut()
        try XCTUnwrap(store.blobs as? MemoryBlobStore).simulatePowerCut()
        try XCTUnwrap(store.work as? MemoryWorkArea).simulatePowerCut()
        one = nil
        two = nil
        let messages = LogBox()
        let after = try UbiquityFileSystem(store: store, containers: Sample.all, view: .drive, log: { messages.append($0) })
        assertBytes(try after.contents(f), b("v1"), "back to the last whole version")
        XCTAssertTrue(messages.lines.contains { $0.contains("did not reach the disk") }, "\(messages.lines)")
        XCTAssertFalse(try store.metadata.load().meta.keys.contains { $0.hasPrefix("running/") && !$0.hasSuffix(after.writerID) },
                       "the writers of the ended boot are forgotten")
    }

    /// Two writers moving folders into each other at once must not make a cycle: the second
    /// move is staged again over the first and refused as a move into itself.
    func testCrossedFolderMovesCannotMakeACycle() throws {
        let docs = try one.ino("SugoiApp")
        let p = try one.mkdir(parent: docs, name: b("p"), mode: 0o755, caller: owner).ino
        let q = try one.mkdir(parent: docs, name: b("q"), mode: 0o755, caller: owner).ino
        let x = try one.mkdir(parent: p, name: b("X"), mode: 0o755, caller: owner).ino
        let w = try one.mkdir(parent: x, name: b("W"), mode: 0o755, caller: owner).ino
        let y = try one.mkdir(parent: q, name: b("Y"), mode: 0o755, caller: owner).ino
        let z = try one.mkdir(parent: y, name: b("Z"), mode: 0o755, caller: owner).ino
        try two.catchUp()
        try one.rename(parent: p, name: b("X"), newParent: z, newName: b("X"), flags: [])     // X under Y/Z
        assertErrno(EINVAL, try two.rename(parent: q, name: b("Y"), newParent: w, newName: b("Y"), flags: []),
                    "Y under X/W, which is now under Y")
        try two.catchUp()
        XCTAssertEqual(try tree(two), try tree(one))
        XCTAssertNoThrow(try two.at("SugoiApp/q/Y/Z/X/W"), "every folder still reachable from the top")
    }

    /// Close-to-open while a program still holds the file open here: once the other writer's
    /// publish is caught up, a new open reads the new content (the open document, holding no
    /// change of its own, follows it).
    func testAnOpenCleanDocumentFollowsTheOtherWritersPublish() throws {
        let docs = try one.ino("SugoiApp")
        let f = try one.makeFile(docs, "Report.txt", b("v1"))
        try two.catchUp()
        let held = try two.open(f, flags: O_RDONLY)            // a reader keeps it open on two
        assertBytes(try two.get(held, at: 0, count: 10), b("v1"))
        try one.writeFile(f, b("v2, longer"))
        XCTAssertTrue(try two.catchUp().contains(.node(f)))
        let again = try two.open(f, flags: O_RDONLY)
        assertBytes(try two.get(again, at: 0, count: 20), b("v2, longer"))
        XCTAssertEqual(try two.getattr(f).size, 10)
        try two.release(handle: again)
        try two.release(handle: held)
        // A document with changes of its own does not follow: its publish is a conflict version.
        let editing = try two.open(f, flags: O_RDWR)
        try two.put(editing, b("mine"), at: 0)
        try one.writeFile(f, b("v3"))
        try two.catchUp()
        assertBytes(try two.get(editing, at: 0, count: 20), b("minelonger"))
        try two.release(handle: editing)
        XCTAssertEqual(try store.metadata.versions(of: f).last?.origin, .conflict)
        assertBytes(try one.contents(f), b("v3, longer"))
    }
}

/// A file another writer replaced or deleted while this model's kernel still held it by its
/// old name: an open racing with that change reads the file as it was (its ghost), read-only,
/// until the kernel forgets it; a folder is ESTALE, so the kernel looks its path up again.
final class GhostTests: TwoWritersTestCase {
    func testAFileAnotherWriterReplacedReadsAsItWasUntilForgotten() throws {
        let docs = try one.ino("SugoiApp")
        let old = try one.makeFile(docs, "doc.txt", b("the old text"))
        _ = try two.catchUp()
        two.remember(old, parent: docs, name: b("doc.txt"))   // two's kernel holds it
        let folder = try one.mkdir(parent: docs, name: b("Folder"), mode: 0o755, caller: owner).ino
        _ = try two.catchUp()
        two.remember(folder, parent: docs, name: b("Folder"))

        // An atomic save on one: a new file renamed over the old, which one's kernel never held.
        let new = try one.makeFile(docs, "doc.txt.tmp", b("the new text"))
        try one.rename(parent: docs, name: b("doc.txt.tmp"), newParent: docs, newName: b("doc.txt"), flags: [])
        try one.rmdir(parent: docs, name: b("Folder"))
        try one.emptyTrash()
        _ = try two.catchUp()

        XCTAssertEqual(try two.contents("SugoiApp/doc.txt"), b("the new text"), "the name is the new file")
        XCTAssertEqual(try two.lookup(parent: docs, name: b("doc.txt")).ino, new)
        XCTAssertEqual(try two.getattr(old).nlink, 0, "the old file has no name")
        XCTAssertEqual(try two.contents(old), b("the old text"), "and reads as it was")
        assertErrno(ESTALE, try two.open(old, flags: O_WRONLY), "read-only")
        assertErrno(ESTALE, try two.open(old, flags: O_RDONLY | O_TRUNC), "read-only")
        assertErrno(ESTALE, try two.setattr(old, AttributeChanges(mode: 0o600), handle: nil, caller: owner), "no change brings it back")
        assertErrno(ESTALE, try two.setxattr(old, name: b("user.x"), value: b("1"), flags: 0), "no change brings it back")
        assertErrno(ESTALE, try two.link(old, newParent: docs, newName: b("again.txt")), "no change brings it back")
        _ = try one.catchUp()
        XCTAssertNil(try? one.getattr(old), "the deleted node stays deleted in the store")
        assertErrno(ESTALE, try two.getattr(folder), "a folder the other writer removed")
        two.forget(old, count: 1)
        assertErrno(ENOENT, try two.getattr(old), "forgotten")
        two.forget(folder, count: 1)
        assertErrno(ENOENT, try two.getattr(folder), "forgotten")
    }

    /// A ghost's content is no one's in the store, but the kernel may still open and read it:
    /// garbage collection keeps it until the kernel forgets the ghost, however many collections
    /// (an hour apart) come first.
    func testGarbageCollectionKeepsAGhostsContent() throws {
        let blobs = try XCTUnwrap(store.blobs as? MemoryBlobStore)
        (store.work as! MemoryWorkArea).setOtherWritersAlive(true)
        let docs = try one.ino("SugoiApp")
        let old = try one.makeFile(docs, "doc.txt", b("the old text"))
        _ = try two.catchUp()
        two.remember(old, parent: docs, name: b("doc.txt"))
        try one.unlink(parent: docs, name: b("doc.txt"))
        try one.emptyTrash()
        _ = try two.catchUp()
        let before = blobs.blobIDs
        for blob in before { blobs.backdate(blob, by: 3_600_000_000_000) }
        for _ in 1...3 { try two.collectGarbage() }
        XCTAssertEqual(blobs.blobIDs, before, "the ghost's chunk is kept")
        XCTAssertEqual(try two.contents(old), b("the old text"))
        two.forget(old, count: 1)
        for _ in 1...2 { try two.collectGarbage() }
        XCTAssertEqual(blobs.blobIDs.count, before.count - 1, "forgotten: its chunk is freed")
    }
}
